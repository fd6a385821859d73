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
    /// The files of these settings, for [`crate::tls::client_config`].
    fn files(&self) -> crate::tls::ClientFiles {
        crate::tls::ClientFiles {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            verify: self.verify,
        }
    }

    /// Applies these settings to an HTTP client being built: reqwest's own
    /// TLS (Mozilla's roots) when nothing is set, else a rustls
    /// configuration whose files are followed as they change; `owner`
    /// names it in the logs and the expiry gauge.
    pub fn apply(
        &self,
        b: reqwest::ClientBuilder,
        owner: &crate::tls::Owner,
    ) -> anyhow::Result<reqwest::ClientBuilder> {
        if self.ca_file.is_none() && self.cert_file.is_none() && self.verify {
            return Ok(b);
        }
        let mut cfg = crate::tls::client_config(&self.files(), owner)?;
        // reqwest speaks HTTP/1.1 here (no http2 feature).
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(b.use_preconfigured_tls(cfg))
    }

    /// A rustls client configuration (socket sinks): Mozilla's roots and
    /// `ca_file`, the client certificate if any, and no verification when
    /// `verify` is false; the files are followed as they change.
    pub fn rustls_client_config(
        &self,
        owner: &crate::tls::Owner,
    ) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        Ok(Arc::new(crate::tls::client_config(&self.files(), owner)?))
    }
}

/// The `tls` key, documented once for every plugin that reads it.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Servers are verified against Mozilla's roots; `{ca_file, cert_file, key_file, verify}`: `ca_file` (PEM) is added to the roots, `cert_file` + `key_file` present a client certificate, `verify: false` skips verification (tests only). The files are read again when they change (a Kubernetes Secret's symlink swap included): new connections use the new certificate, established ones go on; a new pair that cannot be used is refused with an error in the log and the previous one stays. `petrel_tls_certificate_expiry_seconds` reports when the client certificate expires."#,
};
