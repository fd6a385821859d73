//! The `tls:` key of the sinks that connect to servers: those that speak
//! HTTP (elasticsearch, opentelemetry) through reqwest, and the socket
//! sinks (syslog, tcp) through rustls: trusted authorities, a client
//! certificate, and whether the server's certificate is verified.

use std::sync::Arc;

use petrel_core::config::Node;

/// TLS settings for https endpoints.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// PEM file of the certificate authorities to trust (beside the
    /// Mozilla roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate (with `key_file`).
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<std::path::PathBuf>,
    /// Verify the server's certificate (default true).
    pub verify: bool,
    /// The name the server's certificate must carry, when it is not the
    /// host being connected to (socket sinks only).
    pub server_name: Option<String>,
}

/// Reads `tls: { ca_file, cert_file, key_file, verify }`.
pub fn parse_tls(n: Node<'_>) -> Option<Tls> {
    parse_tls_keys(n, false)
}

/// Reads `tls:`; with `server_name`, also that key (socket sinks).
pub fn parse_tls_keys(n: Node<'_>, server_name: bool) -> Option<Tls> {
    let keys: &[&str] = if server_name {
        &["ca_file", "cert_file", "key_file", "verify", "server_name"]
    } else {
        &["ca_file", "cert_file", "key_file", "verify"]
    };
    let m = n.as_map(keys)?;
    let path = |key: &str| {
        m.get(key)
            .and_then(|k| k.as_str().map(|p| crate::paths::resolve_path(k, p)))
    };
    let tls = Tls {
        ca_file: path("ca_file"),
        cert_file: path("cert_file"),
        key_file: path("key_file"),
        verify: m.bool("verify").unwrap_or(true),
        server_name: m.str("server_name").map(str::to_string),
    };
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        n.error("`tls`: `cert_file` and `key_file` go together (a client certificate and its key)");
        return None;
    }
    Some(tls)
}

impl Tls {
    /// Applies these settings to an HTTP client being built.
    pub fn apply(&self, mut b: reqwest::ClientBuilder) -> anyhow::Result<reqwest::ClientBuilder> {
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some(pem) = self.identity_pem()? {
            b = b.identity(
                reqwest::Identity::from_pem(&pem)
                    .map_err(|e| anyhow::anyhow!("tls client certificate: {e}"))?,
            );
        }
        if !self.verify {
            b = b.danger_accept_invalid_certs(true);
        }
        Ok(b)
    }

    /// A rustls client configuration (socket sinks): Mozilla's roots and
    /// `ca_file`, the client certificate if any, and no verification when
    /// `verify` is false.
    pub fn rustls_client_config(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if self.verify {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            if let Some(ca) = &self.ca_file {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                    .and_then(|it| it.collect())
                    .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?;
                if certs.is_empty() {
                    anyhow::bail!("tls.ca_file {} holds no PEM certificate", ca.display());
                }
                for c in certs {
                    roots
                        .add(c)
                        .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?;
                }
            }
            builder.with_root_certificates(roots)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        };
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .and_then(|it| it.collect())
                    .map_err(|e| anyhow::anyhow!("tls.cert_file {}: {e}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| anyhow::anyhow!("tls.key_file {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| anyhow::anyhow!("tls client certificate: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The client certificate followed by its key, as one PEM text.
    pub fn identity_pem(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) else {
            return Ok(None);
        };
        let mut pem = std::fs::read(cert)
            .map_err(|e| anyhow::anyhow!("tls.cert_file {}: {e}", cert.display()))?;
        pem.push(b'\n');
        pem.extend(
            std::fs::read(key)
                .map_err(|e| anyhow::anyhow!("tls.key_file {}: {e}", key.display()))?,
        );
        Ok(Some(pem))
    }
}

/// Accepts any server certificate (`verify: false`), still checking the
/// handshake signatures.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The `tls` key, documented once for every plugin that reads it.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Servers are verified against Mozilla's roots; `{ca_file, cert_file, key_file, verify}`: `ca_file` (PEM) is added to the roots, `cert_file` + `key_file` present a client certificate, `verify: false` skips verification (tests only)."#,
};
