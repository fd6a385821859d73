//! What the sinks that speak HTTP to a store share: credentials, TLS
//! settings and the client built from them.

use std::time::Duration;

use petrel_core::config::Node;
use reqwest::header::AUTHORIZATION;

/// Credentials sent with every request.
#[derive(Clone)]
pub enum Auth {
    /// No `Authorization` header.
    None,
    /// HTTP basic authentication.
    Basic {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// `Authorization: ApiKey <key>` (the encoded key the server returns).
    ApiKey(String),
    /// `Authorization: Bearer <token>`.
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets (config dumps, error messages).
        f.write_str(match self {
            Auth::None => "None",
            Auth::Basic { .. } => "Basic(..)",
            Auth::ApiKey(_) => "ApiKey(..)",
            Auth::Bearer(_) => "Bearer(..)",
        })
    }
}

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

impl Auth {
    /// Adds the credentials to a request.
    pub fn apply(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Auth::None => rb,
            Auth::Basic { user, password } => rb.basic_auth(user, Some(password)),
            Auth::ApiKey(k) => rb.header(AUTHORIZATION, format!("ApiKey {k}")),
            Auth::Bearer(t) => rb.header(AUTHORIZATION, format!("Bearer {t}")),
        }
    }
}

pub(super) fn env_str(n: Node<'_>, what: &str) -> Option<String> {
    let raw = n.as_str()?;
    match petrel_core::config::expand_env(raw, |name| std::env::var(name).ok()) {
        Ok(s) => Some(s.into_owned()),
        Err(e) => {
            n.error(format!("`{what}`: {e}"));
            None
        }
    }
}

/// Reads `auth: { strategy: basic | api_key | bearer, ... }`.
pub fn parse_auth(n: Node<'_>) -> Option<Auth> {
    let m = n.as_map(&["strategy", "user", "password", "api_key", "token"])?;
    let strategy = m
        .required("strategy", "basic")?
        .as_choice(&["basic", "api_key", "bearer"])?;
    let need = |key: &str, example: &str| -> Option<String> {
        let node = m.required(key, example)?;
        env_str(node, key)
    };
    Some(match strategy {
        "basic" => Auth::Basic {
            user: need("user", "elastic")?,
            password: need("password", "\"${ES_PASSWORD}\"")?,
        },
        "api_key" => Auth::ApiKey(need("api_key", "\"${ES_API_KEY}\"")?),
        _ => Auth::Bearer(need("token", "\"${ES_TOKEN}\"")?),
    })
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

/// An HTTP client with the TLS settings `tls` and the request timeout.
pub fn build_client(tls: &Tls, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder().timeout(timeout);
    if let Some(ca) = &tls.ca_file {
        let pem =
            std::fs::read(ca).map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        let mut pem = std::fs::read(cert)
            .map_err(|e| anyhow::anyhow!("tls.cert_file {}: {e}", cert.display()))?;
        pem.push(b'\n');
        pem.extend(
            std::fs::read(key)
                .map_err(|e| anyhow::anyhow!("tls.key_file {}: {e}", key.display()))?,
        );
        b = b.identity(
            reqwest::Identity::from_pem(&pem)
                .map_err(|e| anyhow::anyhow!("tls client certificate: {e}"))?,
        );
    }
    if !tls.verify {
        b = b.danger_accept_invalid_certs(true);
    }
    Ok(b.build()?)
}

/// The `Retry-After` delay of an answer, in seconds (at most 5 minutes).
pub fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.min(300)))
}

/// The first 1024 characters of an answer's body, for logs and dead letters.
pub async fn answer_text(resp: reqwest::Response) -> String {
    resp.text()
        .await
        .unwrap_or_default()
        .chars()
        .take(1024)
        .collect()
}
