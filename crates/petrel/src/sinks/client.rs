//! What the sinks that speak HTTP to a store share: credentials, the
//! client built with the TLS settings (`super::tls`), answer helpers.

use std::time::Duration;

use petrel_core::config::Node;
use reqwest::header::AUTHORIZATION;

pub use super::tls::{parse_tls, Tls};

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

/// An HTTP client with the TLS settings `tls` and the request timeout.
pub fn build_client(tls: &Tls, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(tls
        .apply(reqwest::Client::builder().timeout(timeout))?
        .build()?)
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
