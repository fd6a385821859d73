//! `tls:` of a receiving source: rustls with PEM files, optional client
//! certificates (mutual TLS).

use std::path::PathBuf;
use std::sync::Arc;

use petrel_core::config::Map;

/// Keys of `tls:`.
pub const TLS_KEYS: &[&str] = &["cert_file", "key_file", "ca_file"];

/// The `tls` key, documented once for every plugin that reads it.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Serve TLS (rustls) on a TCP address: `{cert_file, key_file, ca_file}` (PEM). With `ca_file`, clients must present a certificate signed by that CA (mutual TLS). A failed handshake is counted `tls_handshake_failed`. The files are read again when they change (a Kubernetes Secret's symlink swap included): new connections get the new certificate, established ones go on; a new pair that cannot be used is refused with an error in the log and the previous one stays. `petrel_tls_certificate_expiry_seconds` reports when the certificate expires."#,
};

/// Paths of the server's certificate chain and key, and of the CA that
/// client certificates must chain to (then required).
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// PEM certificate chain, the server's first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate.
    pub ca_file: Option<PathBuf>,
}

impl TlsOptions {
    /// Reads `tls:` of `map`: `Some(None)` when absent, `None` when
    /// invalid (reported).
    pub fn parse(map: &Map<'_>) -> Option<Option<Self>> {
        let Some(node) = map.get("tls") else {
            return Some(None);
        };
        let m = node.as_map(TLS_KEYS)?;
        let cert = m.required("cert_file", "/etc/petrel/tls/server.crt");
        let key = m.required("key_file", "/etc/petrel/tls/server.key");
        let (Some(cert), Some(key)) = (cert.and_then(|n| n.as_str()), key.and_then(|n| n.as_str()))
        else {
            return None;
        };
        let opts = Self {
            cert_file: cert.into(),
            key_file: key.into(),
            ca_file: m.str("ca_file").map(PathBuf::from),
        };
        // Loaded now so a wrong path or file fails `validate`, naming it
        // (not with `--offline`: the files are on the host).
        if !petrel_core::config::host_checks() {
            return Some(Some(opts));
        }
        if let Err(e) = opts.check() {
            node.error(format!("{e:#}"));
            return None;
        }
        Some(Some(opts))
    }

    /// Reads the files once, as [`TlsOptions::server_config`] will: an
    /// error says what is wrong with which.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::tls::check_files(&self.cert_file, &self.key_file, self.ca_file.as_deref())
    }

    /// The rustls server configuration, its files followed as they change
    /// (`crate::tls`); `owner` names it in the logs and the expiry gauge.
    pub fn server_config(
        &self,
        owner: &crate::tls::Owner,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        Ok(Arc::new(crate::tls::server_config(
            &self.cert_file,
            &self.key_file,
            self.ca_file.as_deref(),
            owner,
        )?))
    }

    /// [`TlsOptions::server_config`] for a protocol whose senders never
    /// read (syslog, tcp): no TLS 1.3 session tickets. A ticket the sender
    /// never reads sits in its socket's receive buffer, and closing a
    /// socket with unread data sends a reset instead of an orderly close,
    /// which makes the receiving kernel throw away what it had not yet
    /// handed to Petrel: the sender's last lines were lost.
    pub fn one_way_server_config(
        &self,
        owner: &crate::tls::Owner,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let mut cfg = crate::tls::server_config(
            &self.cert_file,
            &self.key_file,
            self.ca_file.as_deref(),
            owner,
        )?;
        cfg.send_tls13_tickets = 0;
        Ok(Arc::new(cfg))
    }
}
