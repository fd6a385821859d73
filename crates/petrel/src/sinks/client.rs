//! What the sinks that speak HTTP to a store share: credentials, the
//! client built with the TLS settings (`super::tls`), answer helpers.

use std::time::Duration;

use petrel_core::config::Node;
use reqwest::header::AUTHORIZATION;

use super::driver::Answer;

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

/// A credential's text (`${VAR}` was expanded when the file was loaded).
pub(super) fn env_str(n: Node<'_>, _what: &str) -> Option<String> {
    n.as_str().map(str::to_string)
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

/// An HTTP client with the TLS settings `tls` and the request timeout;
/// `owner` names its certificate in the logs and the expiry gauge.
pub fn build_client(
    tls: &Tls,
    timeout: Duration,
    owner: &crate::tls::Owner,
) -> anyhow::Result<reqwest::Client> {
    Ok(tls
        .apply(reqwest::Client::builder().timeout(timeout), owner)?
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

/// 408, 429 and 5xx: the statuses most servers mean as "try again".
pub fn usually_transient(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// The answer to a request that got no answer: sent again (the failure
/// classified by [`send_failure`]).
pub fn unanswered(e: &reqwest::Error, url: &str, timeout: Duration) -> Answer {
    let f = send_failure(e, url, timeout);
    Answer::Retry {
        after: None,
        error_type: f.error_type,
        why: f.message,
    }
}

/// The common reading of an answer that is not a success: the statuses
/// `retryable` accepts are sent again (after the `Retry-After` the server
/// asked for); 401, 403 and 404 hold the data until an operator acts; any
/// other status refuses some item of the request, which is halved until
/// the refused items are alone.
pub async fn failed_answer(resp: reqwest::Response, retryable: fn(u16) -> bool) -> Answer {
    let status = resp.status().as_u16();
    if retryable(status) {
        return Answer::Retry {
            after: retry_after(&resp),
            error_type: "request_failed",
            why: format!("answered {status}"),
        };
    }
    let text = answer_text(resp).await;
    match status {
        401 | 403 | 404 => Answer::Hold { status, text },
        _ => Answer::Refused {
            status,
            text,
            split: true,
        },
    }
}

/// Why a request got no answer, as `error_type` and as a log text that
/// names it: an operator must tell a dead store (refused) from a slow one
/// (timeout), a certificate problem (tls) and a wrong host name (dns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// `timeout`, `connection_refused`, `tls`, `dns` or `connection_failed`.
    pub error_type: &'static str,
    /// What happened, with the address and, for a timeout, the timeout.
    pub message: String,
}

/// Texts of TLS failures as rustls words them (lower case), for errors
/// whose chain does not carry the `rustls::Error` itself.
const TLS_TEXTS: &[&str] = &[
    "certificate",
    "handshake",
    "invalid peer",
    "received corrupt message",
    "received fatal alert",
    "peer is incompatible",
    "peer misbehaved",
    "tls",
];

/// Classifies an error of `reqwest` for a request to `url` made with the
/// request timeout `timeout`.
pub fn send_failure(e: &reqwest::Error, url: &str, timeout: Duration) -> SendFailure {
    classify_failure(
        e.is_timeout(),
        e.is_connect(),
        e as &(dyn std::error::Error + 'static),
        url,
        timeout,
    )
}

/// [`send_failure`] for any error chain (the gRPC client's transport
/// errors too): `timed_out` and `connecting` say what the client knows.
pub fn classify_failure(
    timed_out: bool,
    connecting: bool,
    e: &(dyn std::error::Error + 'static),
    url: &str,
    timeout: Duration,
) -> SendFailure {
    let mut kind = None;
    let mut texts = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        texts.push(err.to_string());
        if kind.is_none() {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                kind = match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => Some("connection_refused"),
                    std::io::ErrorKind::TimedOut => Some("timeout"),
                    _ => io
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                        .map(|_| "tls"),
                };
            } else if err.downcast_ref::<rustls::Error>().is_some() {
                kind = Some("tls");
            }
        }
        cur = err.source();
    }
    let all = texts.join(": ").to_ascii_lowercase();
    let kind = kind.unwrap_or(
        if timed_out || all.contains("timed out") || all.contains("timeout expired") {
            "timeout"
        } else if all.contains("dns error") || all.contains("failed to lookup address") {
            "dns"
        } else if all.contains("connection refused") {
            "connection_refused"
        } else if TLS_TEXTS.iter().any(|t| all.contains(t)) {
            "tls"
        } else {
            "connection_failed"
        },
    );
    let detail = texts.last().cloned().unwrap_or_default();
    let message = match kind {
        "timeout" if connecting => format!(
            "timeout: no connection to {url} within the {} ms timeout (`timeout_ms`): the address does not answer",
            timeout.as_millis()
        ),
        "timeout" => format!(
            "timeout: {url} accepted the request but did not answer within the {} ms timeout (`timeout_ms`): a slow or stalled server",
            timeout.as_millis()
        ),
        "connection_refused" => format!(
            "connection refused by {url}: nothing listens there (the server is down or the port is wrong)"
        ),
        "tls" => format!("TLS failure with {url}: {detail} (check `tls`: ca_file, the server's certificate and name)"),
        "dns" => format!("DNS failure for {url}: {detail} (check the host name)"),
        _ => format!("connection to {url} failed: {}", texts.join(": ")),
    };
    SendFailure {
        error_type: kind,
        message,
    }
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    fn failure(url: &str, timeout: Duration) -> SendFailure {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = reqwest::Client::builder().timeout(timeout).build().unwrap();
            let e = client.get(url).send().await.expect_err("must fail");
            send_failure(&e, url, timeout)
        })
    }

    #[test]
    fn a_closed_port_is_connection_refused() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/");
        let f = failure(&url, Duration::from_secs(5));
        assert_eq!(f.error_type, "connection_refused", "{f:?}");
        assert!(f.message.contains(&url), "{f:?}");
    }

    #[test]
    fn a_server_that_never_answers_is_a_timeout_naming_the_timeout() {
        // Accepts (the kernel's backlog does) and never answers.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        let f = failure(&url, Duration::from_millis(300));
        assert_eq!(f.error_type, "timeout", "{f:?}");
        assert!(f.message.contains("300 ms"), "{f:?}");
        assert!(f.message.contains("did not answer"), "{f:?}");
        drop(l);
    }

    #[test]
    fn a_server_that_is_not_tls_is_a_tls_failure() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\n\r\nnot tls");
            }
        });
        let url = format!("https://{addr}/");
        let f = failure(&url, Duration::from_secs(5));
        assert_eq!(f.error_type, "tls", "{f:?}");
    }

    #[test]
    fn an_unknown_host_is_a_dns_failure() {
        let url = "http://petrel-no-such-host.invalid:9/";
        let f = failure(url, Duration::from_secs(10));
        assert_eq!(f.error_type, "dns", "{f:?}");
        assert!(f.message.contains("DNS"), "{f:?}");
    }
}
