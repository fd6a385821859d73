//! Certificates that follow their files: the one TLS loader of every
//! server (the receiving sources, the API) and client (the sinks) that
//! speaks rustls.
//!
//! A [`ReloadingKey`] holds a certificate chain and its key read from two
//! PEM files, and a [`ReloadingRoots`] the authorities of a CA file; rustls
//! asks them for the current value at each handshake (as the server's
//! certificate resolver, the client's certificate resolver, or inside the
//! verifiers of [`server_config`] and [`client_config`]). One thread
//! (`petrel-tls-watch`) looks at the files of all of them every
//! [`WATCH_INTERVAL`]: when a file changed (another inode behind the path,
//! as a Kubernetes Secret mount's `..data` symlink swap makes, or a new
//! size or modification time), it is read again, and the new value is used
//! by the next handshakes; established connections go on with the one they
//! started with. The TLS sessions kept for resumption are forgotten then:
//! a resumed session skips the certificates, and would go on presenting
//! (or trusting) the old ones. A new pair that cannot be used (unreadable, a key that is
//! not the certificate's, a certificate already expired) is refused with an
//! error in the log, and the previous one stays in use.
//!
//! Each certificate presented is reported as
//! `petrel_tls_certificate_expiry_seconds{component}`: the Unix time of its
//! `notAfter`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petrel_core::Metrics;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// How often the watched files are looked at.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// What identifies a file's content without reading it: device, inode,
/// size and modification time of what the path leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp(u64, u64, u64, i64, i64);

fn stamp(p: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .ok()
        .map(|m| Stamp(m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Something the watcher looks after.
trait Watched: Send + Sync {
    /// Reads the files again if they changed.
    fn check(&self);
}

fn watch(w: Weak<dyn Watched>) {
    static LIST: OnceLock<Mutex<Vec<Weak<dyn Watched>>>> = OnceLock::new();
    let list = LIST.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("petrel-tls-watch".into())
            .spawn(|| loop {
                std::thread::sleep(WATCH_INTERVAL);
                let items: Vec<Arc<dyn Watched>> = match LIST.get() {
                    Some(l) => {
                        let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
                        l.retain(|w| w.strong_count() > 0);
                        l.iter().filter_map(Weak::upgrade).collect()
                    }
                    None => Vec::new(),
                };
                for i in items {
                    i.check();
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the TLS file watcher: certificates will not be reloaded");
        }
        Mutex::new(Vec::new())
    });
    list.lock().unwrap_or_else(|e| e.into_inner()).push(w);
}

/// The serial number (hex) and the `notAfter` (Unix seconds) of a DER
/// certificate; `None` when it cannot be read that far.
pub fn serial_and_expiry(der: &[u8]) -> Option<(String, i64)> {
    /// One DER element: (tag, content, rest).
    fn next(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&l0, mut b) = b.split_first()?;
        let len = if l0 < 0x80 {
            l0 as usize
        } else {
            let n = (l0 & 0x7f) as usize;
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let mut len = 0usize;
            for &x in &b[..n] {
                len = (len << 8) | x as usize;
            }
            b = &b[n..];
            len
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }
    let (_, cert, _) = next(der)?;
    let (_, tbs, _) = next(cert)?;
    let (mut tag, mut item, mut rest) = next(tbs)?;
    if tag == 0xa0 {
        // [0] version
        (tag, item, rest) = next(rest)?;
    }
    if tag != 0x02 {
        return None;
    }
    let serial: String = item.iter().map(|b| format!("{b:02x}")).collect();
    let (_, _sig, rest) = next(rest)?;
    let (_, _issuer, rest) = next(rest)?;
    let (_, validity, _) = next(rest)?;
    let (_, _not_before, rest) = next(validity)?;
    let (tag, not_after, _) = next(rest)?;
    Some((serial, der_time(tag, not_after)?))
}

/// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) as
/// Unix seconds.
fn der_time(tag: u8, b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    let s = s.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 if s.len() == 12 => {
            let y: i64 = s[..2].parse().ok()?;
            (if y < 50 { 2000 + y } else { 1900 + y }, &s[2..])
        }
        0x18 if s.len() == 14 => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    if !rest.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n = |i: usize| -> i64 { rest[i..i + 2].parse().unwrap_or(0) };
    let (mo, d, h, mi, se) = (n(0), n(2), n(4), n(6), n(8));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { year - 1 } else { year };
    let era = (if y >= 0 { y } else { y - 399 }) / 400;
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + h * 3600 + mi * 60 + se)
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// How many live holders report the expiry of each component: its gauge
/// goes when the last one does (a reload briefly runs two).
fn expiry_holders() -> &'static Mutex<HashMap<String, usize>> {
    static H: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// Reports a certificate's expiry as `petrel_tls_certificate_expiry_seconds`
/// while it is held.
pub struct ExpiryGauge {
    metrics: Arc<Metrics>,
    labels: Vec<(String, String)>,
}

impl ExpiryGauge {
    fn new(metrics: &Arc<Metrics>, component: &str) -> ExpiryGauge {
        *expiry_holders()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(component.to_string())
            .or_default() += 1;
        ExpiryGauge {
            metrics: metrics.clone(),
            labels: vec![("component".into(), component.into())],
        }
    }

    fn set(&self, expiry: i64) {
        self.metrics
            .tls_certificate_expiry
            .get_or_create(&self.labels)
            .set(expiry);
    }
}

impl Drop for ExpiryGauge {
    fn drop(&mut self) {
        let mut h = expiry_holders().lock().unwrap_or_else(|e| e.into_inner());
        let component = &self.labels[0].1;
        if let Some(n) = h.get_mut(component) {
            *n -= 1;
            if *n == 0 {
                h.remove(component);
                self.metrics.tls_certificate_expiry.remove(&self.labels);
            }
        }
    }
}

/// A certificate chain and its key as loaded: the value and what it says.
struct LoadedKey {
    key: Arc<CertifiedKey>,
    serial: String,
    expiry: i64,
}

fn load_key(cert: &Path, key: &Path) -> anyhow::Result<LoadedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect())
        .map_err(|e| anyhow::anyhow!("cannot read certificates from {}: {e}", cert.display()))?;
    let Some(first) = chain.first() else {
        anyhow::bail!("{} holds no PEM certificate", cert.display());
    };
    let (serial, expiry) = serial_and_expiry(first).ok_or_else(|| {
        anyhow::anyhow!("{}: the first certificate cannot be read", cert.display())
    })?;
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("cannot read a private key from {}: {e}", key.display()))?;
    let ck = CertifiedKey::from_der(chain, der, &provider()).map_err(|e| {
        // rustls reads the certificate's key with webpki, which knows only
        // X.509 v3 (the version with extensions).
        let hint = if format!("{e:?}").contains("UnsupportedCertVersion") {
            " (an X.509 v1 certificate: only v3 is accepted; issue it with extensions, e.g. `extendedKeyUsage`)"
        } else {
            ""
        };
        anyhow::anyhow!(
            "{} and {} do not form a usable pair: {e}{hint}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(LoadedKey {
        key: Arc::new(ck),
        serial,
        expiry,
    })
}

/// A certificate and its key from two files, read again when they change
/// (see the module documentation). Serves as rustls' certificate resolver
/// on both sides.
pub struct ReloadingKey {
    component: String,
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' stamps at the last look, and the serial in use.
    state: Mutex<(Option<Stamp>, Option<Stamp>, String)>,
    gauge: Option<ExpiryGauge>,
    /// Run after a new pair is taken (the TLS sessions to forget).
    on_reload: Mutex<Vec<Arc<dyn Forget>>>,
}

impl std::fmt::Debug for ReloadingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingKey")
            .field("component", &self.component)
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

impl ReloadingKey {
    /// Loads `cert_file` and `key_file` (an error names what is wrong with
    /// them) and watches them; `component` names them in the logs and in
    /// the expiry gauge of `metrics`.
    pub fn new(
        cert_file: &Path,
        key_file: &Path,
        component: &str,
        metrics: Option<&Arc<Metrics>>,
    ) -> anyhow::Result<Arc<ReloadingKey>> {
        let stamps = (stamp(cert_file), stamp(key_file));
        let l = load_key(cert_file, key_file)?;
        let gauge = metrics.map(|m| ExpiryGauge::new(m, component));
        if let Some(g) = &gauge {
            g.set(l.expiry);
        }
        if l.expiry < now_secs() {
            tracing::warn!(component, cert = %cert_file.display(), serial = %l.serial,
                "{component}: the TLS certificate has expired: peers will refuse it; renew it (it is read again when the file changes)");
        }
        let k = Arc::new(ReloadingKey {
            component: component.to_string(),
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current: RwLock::new(l.key),
            state: Mutex::new((stamps.0, stamps.1, l.serial)),
            gauge,
            on_reload: Mutex::default(),
        });
        let w: Arc<dyn Watched> = k.clone();
        watch(Arc::downgrade(&w));
        Ok(k)
    }

    /// The certificate in use.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The serial number (hex) of the certificate in use.
    pub fn serial(&self) -> String {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .2
            .clone()
    }

    /// Forgets the sessions of `store` whenever a new pair is taken.
    fn forget_on_reload(&self, store: Arc<dyn Forget>) {
        self.on_reload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store);
    }
}

impl Watched for ReloadingKey {
    fn check(&self) {
        let now = (stamp(&self.cert_file), stamp(&self.key_file));
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if (st.0, st.1) == now {
            return;
        }
        // Whatever comes of it, these files were looked at: a refused
        // pair is not refused again every second, and the next change
        // (the key written after the certificate) is tried.
        (st.0, st.1) = now;
        match load_key(&self.cert_file, &self.key_file) {
            Ok(l) if l.expiry < now_secs() => {
                tracing::error!(component = %self.component, cert = %self.cert_file.display(), new_serial = %l.serial, serial = %st.2,
                    "{}: the new TLS certificate has already expired; still using the previous one", self.component);
            }
            Ok(l) => {
                tracing::info!(component = %self.component, cert = %self.cert_file.display(), serial = %l.serial, previous = %st.2,
                    expires = l.expiry, "{}: TLS certificate reloaded", self.component);
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = l.key;
                st.2 = l.serial;
                if let Some(g) = &self.gauge {
                    g.set(l.expiry);
                }
                for f in self
                    .on_reload
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                {
                    f.forget();
                }
            }
            Err(e) => {
                tracing::error!(component = %self.component, cert = %self.cert_file.display(), key = %self.key_file.display(), serial = %st.2,
                    "{}: the new TLS certificate and key cannot be used ({e:#}); still using the previous one", self.component);
            }
        }
    }
}

impl ResolvesServerCert for ReloadingKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingKey {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn load_roots(ca: &Path, mozilla: bool) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    if mozilla {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .and_then(|it| it.collect())
        .map_err(|e| anyhow::anyhow!("cannot read CA certificates from {}: {e}", ca.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", ca.display());
    }
    for c in certs {
        roots
            .add(c)
            .map_err(|e| anyhow::anyhow!("invalid CA certificate in {}: {e}", ca.display()))?;
    }
    Ok(roots)
}

/// A verifier built from a CA file, built again when the file changes.
struct ReloadingVerifier<V: ?Sized> {
    component: String,
    ca_file: PathBuf,
    mozilla: bool,
    build: fn(rustls::RootCertStore) -> anyhow::Result<Arc<V>>,
    current: RwLock<Arc<V>>,
    stamp: Mutex<Option<Stamp>>,
    /// Run after new authorities are taken (the TLS sessions to forget).
    on_reload: Mutex<Vec<Arc<dyn Forget>>>,
}

impl<V: ?Sized + Send + Sync> ReloadingVerifier<V> {
    fn new(
        ca_file: &Path,
        mozilla: bool,
        component: &str,
        build: fn(rustls::RootCertStore) -> anyhow::Result<Arc<V>>,
    ) -> anyhow::Result<Arc<Self>>
    where
        Self: Watched + 'static,
    {
        let st = stamp(ca_file);
        let v = build(load_roots(ca_file, mozilla)?)?;
        let r = Arc::new(ReloadingVerifier {
            component: component.to_string(),
            ca_file: ca_file.to_path_buf(),
            mozilla,
            build,
            current: RwLock::new(v),
            stamp: Mutex::new(st),
            on_reload: Mutex::default(),
        });
        let w: Arc<dyn Watched> = r.clone();
        watch(Arc::downgrade(&w));
        Ok(r)
    }

    fn get(&self) -> Arc<V> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the sessions of `store` whenever new authorities are taken.
    fn forget_on_reload(&self, store: Arc<dyn Forget>) {
        self.on_reload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store);
    }
}

impl<V: ?Sized + Send + Sync> Watched for ReloadingVerifier<V> {
    fn check(&self) {
        let now = stamp(&self.ca_file);
        let mut st = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
        if *st == now {
            return;
        }
        *st = now;
        match load_roots(&self.ca_file, self.mozilla).and_then(self.build) {
            Ok(v) => {
                tracing::info!(component = %self.component, ca = %self.ca_file.display(),
                    "{}: TLS authorities reloaded", self.component);
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = v;
                for f in self
                    .on_reload
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                {
                    f.forget();
                }
            }
            Err(e) => tracing::error!(component = %self.component, ca = %self.ca_file.display(),
                "{}: the new CA file cannot be used ({e:#}); still using the previous authorities", self.component),
        }
    }
}

/// A TLS session cache that can be emptied.
trait Forget: Send + Sync {
    /// Drops every session kept so far.
    fn forget(&self);
}

/// How many sessions a cache keeps (rustls' default).
const SESSIONS: usize = 256;

/// The sessions a client keeps to resume them, forgotten when its
/// certificate or authorities are reloaded: a resumed session carries the
/// identity of the full handshake that made it, so the server would go on
/// seeing the old client certificate on every new connection (and a
/// session verified by a dropped authority would go on being trusted).
#[derive(Debug)]
struct ClientSessions(RwLock<Arc<rustls::client::ClientSessionMemoryCache>>);

impl ClientSessions {
    fn new() -> Arc<ClientSessions> {
        Arc::new(ClientSessions(RwLock::new(Arc::new(
            rustls::client::ClientSessionMemoryCache::new(SESSIONS),
        ))))
    }

    fn inner(&self) -> Arc<rustls::client::ClientSessionMemoryCache> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Forget for ClientSessions {
    fn forget(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(rustls::client::ClientSessionMemoryCache::new(SESSIONS));
    }
}

impl rustls::client::ClientSessionStore for ClientSessions {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.inner().set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner().kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner().set_tls12_session(server_name, value)
    }

    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner().tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner().remove_tls12_session(server_name)
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.inner().insert_tls13_ticket(server_name, value)
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner().take_tls13_ticket(server_name)
    }
}

/// The sessions a server keeps for its clients to resume, forgotten when
/// its certificate or client authorities are reloaded: a resumed session
/// skips the certificates, so a client would go on with a session made
/// with the old server certificate (or a client certificate verified by
/// a dropped authority).
#[derive(Debug)]
struct ServerSessions(RwLock<Arc<dyn rustls::server::StoresServerSessions>>);

impl ServerSessions {
    fn new() -> Arc<ServerSessions> {
        Arc::new(ServerSessions(RwLock::new(
            rustls::server::ServerSessionMemoryCache::new(SESSIONS),
        )))
    }

    fn inner(&self) -> Arc<dyn rustls::server::StoresServerSessions> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Forget for ServerSessions {
    fn forget(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) =
            rustls::server::ServerSessionMemoryCache::new(SESSIONS);
    }
}

impl rustls::server::StoresServerSessions for ServerSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner().put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner().get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner().take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// Client certificates checked against a CA file that may change.
struct ClientVerifier(Arc<ReloadingVerifier<dyn ClientCertVerifier>>);

impl std::fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientVerifier({})", self.0.ca_file.display())
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The hints would have to outlive a reload; none means "any
        // certificate you have", which clients with one certificate (all
        // log shippers) send anyway.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.get().supported_verify_schemes()
    }
}

/// Server certificates checked against Mozilla's roots and a CA file that
/// may change.
struct ServerVerifier(Arc<ReloadingVerifier<dyn ServerCertVerifier>>);

impl std::fmt::Debug for ServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerVerifier({})", self.0.ca_file.display())
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .get()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.get().supported_verify_schemes()
    }
}

/// Accepts any server certificate (`verify: false`), still checking the
/// handshake signatures.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Who a TLS configuration is for: its name in the logs and in the
/// expiry gauge, and the agent's metrics (none in `validate`).
#[derive(Clone, Default)]
pub struct Owner {
    /// The component (`pipeline/source/id`, `api`).
    pub component: String,
    /// Where the expiry gauge goes.
    pub metrics: Option<Arc<Metrics>>,
}

impl Owner {
    /// The owner of a component: named by its health key
    /// (`pipeline/kind/id`), its gauge among the agent's metrics.
    pub fn of(m: &petrel_core::ComponentMetrics) -> Owner {
        Owner {
            component: m.health_key().to_string(),
            metrics: Some(m.metrics().clone()),
        }
    }

    /// An owner without metrics (a check of the files, a test).
    pub fn named(component: &str) -> Owner {
        Owner {
            component: component.to_string(),
            metrics: None,
        }
    }
}

/// Reports the expiry of a certificate file that another library reads
/// (librdkafka's OpenSSL, at its client's start): the gauge while the
/// result is held, and an error in the log when it has expired already.
pub fn report_certificate_file(owner: &Owner, cert_file: &Path) -> Option<ExpiryGauge> {
    let first = CertificateDer::pem_file_iter(cert_file)
        .ok()?
        .next()?
        .ok()?;
    let (serial, expiry) = serial_and_expiry(&first)?;
    if expiry < now_secs() {
        tracing::error!(component = %owner.component, cert = %cert_file.display(), serial = %serial,
            "{}: the TLS client certificate {} has expired: the server will refuse it; renew it", owner.component, cert_file.display());
    }
    let g = ExpiryGauge::new(owner.metrics.as_ref()?, &owner.component);
    g.set(expiry);
    Some(g)
}

/// Reads a server's files once, as [`server_config`] would, without
/// watching them (`validate`, the config's check).
pub fn check_files(cert_file: &Path, key_file: &Path, ca: Option<&Path>) -> anyhow::Result<()> {
    let l = load_key(cert_file, key_file)?;
    if let Some(ca) = ca {
        let roots = load_roots(ca, false)?;
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
    }
    drop(l);
    Ok(())
}

/// A rustls server configuration presenting `cert_file`/`key_file`, and,
/// with `client_ca`, requiring client certificates signed by it; all three
/// files followed as they change.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    owner: &Owner,
) -> anyhow::Result<rustls::ServerConfig> {
    let key = ReloadingKey::new(
        cert_file,
        key_file,
        &owner.component,
        owner.metrics.as_ref(),
    )?;
    let sessions = ServerSessions::new();
    key.forget_on_reload(sessions.clone());
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let v = ReloadingVerifier::<dyn ClientCertVerifier>::new(
                ca,
                false,
                &owner.component,
                |roots| {
                    let v: Arc<dyn ClientCertVerifier> =
                        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                            .build()?;
                    Ok(v)
                },
            )?;
            v.forget_on_reload(sessions.clone());
            builder.with_client_cert_verifier(Arc::new(ClientVerifier(v)))
        }
    };
    let mut cfg = builder.with_cert_resolver(key);
    cfg.session_storage = sessions;
    Ok(cfg)
}

/// Settings of a TLS client.
#[derive(Debug, Clone, Default)]
pub struct ClientFiles {
    /// PEM authorities trusted beside Mozilla's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    pub key_file: Option<PathBuf>,
    /// Verify the server's certificate.
    pub verify: bool,
}

/// A rustls client configuration: Mozilla's roots and `ca_file`, the
/// client certificate if any, no verification when `verify` is false; the
/// files followed as they change.
pub fn client_config(files: &ClientFiles, owner: &Owner) -> anyhow::Result<rustls::ClientConfig> {
    let sessions = ClientSessions::new();
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = if !files.verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    } else if let Some(ca) = &files.ca_file {
        let v = ReloadingVerifier::<dyn ServerCertVerifier>::new(
            ca,
            true,
            &owner.component,
            |roots| {
                let v: Arc<dyn ServerCertVerifier> =
                    rustls::client::WebPkiServerVerifier::builder_with_provider(
                        Arc::new(roots),
                        provider(),
                    )
                    .build()?;
                Ok(v)
            },
        )?;
        v.forget_on_reload(sessions.clone());
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServerVerifier(v)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        builder.with_root_certificates(roots)
    };
    let mut cfg = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let key = ReloadingKey::new(cert, key, &owner.component, owner.metrics.as_ref())?;
            key.forget_on_reload(sessions.clone());
            builder.with_client_cert_resolver(key)
        }
        _ => builder.with_no_client_auth(),
    };
    cfg.resumption = rustls::client::Resumption::store(sessions);
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_times_are_unix_seconds() {
        assert_eq!(der_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(der_time(0x17, b"491231235959Z"), Some(2524607999));
        assert_eq!(der_time(0x18, b"20380119031408Z"), Some(2147483648));
        assert_eq!(der_time(0x18, b"2038011903140Z"), None);
        assert_eq!(der_time(0x17, b"70010100000xZ"), None);
        assert_eq!(der_time(0x17, b"700101000000"), None);
    }

    #[test]
    fn truncated_certificates_are_not_read() {
        assert_eq!(serial_and_expiry(&[]), None);
        assert_eq!(
            serial_and_expiry(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(serial_and_expiry(&[0x30, 0x03, 0x30, 0x01, 0x02]), None);
    }
}
