//! The `tls:` key of the sinks that speak HTTP (elasticsearch,
//! opentelemetry): trusted authorities, a client certificate, and whether
//! the server's certificate is verified.

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
}

/// Reads `tls: { ca_file, cert_file, key_file, verify }`.
pub fn parse_tls(n: Node<'_>) -> Option<Tls> {
    let m = n.as_map(&["ca_file", "cert_file", "key_file", "verify"])?;
    let path = |key: &str| {
        m.get(key)
            .and_then(|k| k.as_str().map(|p| crate::paths::resolve_path(k, p)))
    };
    let tls = Tls {
        ca_file: path("ca_file"),
        cert_file: path("cert_file"),
        key_file: path("key_file"),
        verify: m.bool("verify").unwrap_or(true),
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

/// The `tls` key, documented once for every plugin that reads it.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Servers are verified against Mozilla's roots; `{ca_file, cert_file, key_file, verify}`: `ca_file` (PEM) is added to the roots, `cert_file` + `key_file` present a client certificate, `verify: false` skips verification (tests only)."#,
};
