//! `tls:` of a receiving source: rustls with PEM files, optional client
//! certificates (mutual TLS).

use std::path::PathBuf;
use std::sync::Arc;

use petrel_core::config::Map;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Keys of `tls:`.
pub const TLS_KEYS: &[&str] = &["cert_file", "key_file", "ca_file"];

/// The `tls` key, documented once for every plugin that reads it.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Serve TLS (rustls) on a TCP address: `{cert_file, key_file, ca_file}` (PEM). With `ca_file`, clients must present a certificate signed by that CA (mutual TLS). A failed handshake is counted `tls_handshake_failed`."#,
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
        if let Err(e) = opts.server_config() {
            node.error(format!("{e:#}"));
            return None;
        }
        Some(Some(opts))
    }

    /// The rustls server configuration.
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert_file)
            .and_then(|it| it.collect())
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot read certificates from `cert_file` {}: {e}",
                    self.cert_file.display()
                )
            })?;
        if certs.is_empty() {
            anyhow::bail!(
                "`cert_file` {} holds no PEM certificate",
                self.cert_file.display()
            );
        }
        let key = PrivateKeyDer::from_pem_file(&self.key_file).map_err(|e| {
            anyhow::anyhow!(
                "cannot read a private key from `key_file` {}: {e}",
                self.key_file.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.ca_file {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca)
                    .map_err(|e| anyhow::anyhow!("cannot read `ca_file` {}: {e}", ca.display()))?
                {
                    let c = c.map_err(|e| {
                        anyhow::anyhow!("cannot read `ca_file` {}: {e}", ca.display())
                    })?;
                    roots.add(c).map_err(|e| {
                        anyhow::anyhow!("invalid CA certificate in {}: {e}", ca.display())
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let cfg = builder.with_single_cert(certs, key).map_err(|e| {
            anyhow::anyhow!(
                "`cert_file` {} and `key_file` {} do not form a usable pair: {e}",
                self.cert_file.display(),
                self.key_file.display()
            )
        })?;
        Ok(Arc::new(cfg))
    }
}
