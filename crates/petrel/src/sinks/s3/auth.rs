//! Credentials of the s3 sink: static keys from the config, the
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`), or a web identity token file exchanged at STS
//! (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`: IAM roles for
//! Kubernetes service accounts, "IRSA").
//!
//! The STS exchange (`AssumeRoleWithWebIdentity`) is an unsigned form POST
//! whose answer holds temporary keys and their expiry; they are fetched
//! again five minutes before they expire (the token file is read again
//! each time: the kubelet rotates it). Only the request built and the
//! answer parsed are unit-tested here: no real STS is reachable from the
//! tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusty_s3::Credentials;

use crate::sinks::client::{answer_text, unanswered, usually_transient};
use crate::sinks::driver::Answer;

/// Fetch temporary keys again this long before they expire.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// Where the keys come from.
#[derive(Clone)]
pub enum CredentialSource {
    /// Fixed keys (`auth:` in the config, or the environment at start).
    Static(Arc<Credentials>),
    /// A web identity token exchanged at STS for a role's keys.
    WebIdentity(WebIdentity),
}

impl std::fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        match self {
            CredentialSource::Static(c) => write!(f, "Static({}, ..)", c.key()),
            CredentialSource::WebIdentity(w) => f
                .debug_struct("WebIdentity")
                .field("token_file", &w.token_file)
                .field("role_arn", &w.role_arn)
                .finish(),
        }
    }
}

/// `AssumeRoleWithWebIdentity` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebIdentity {
    /// The token file (`AWS_WEB_IDENTITY_TOKEN_FILE`).
    pub token_file: PathBuf,
    /// The role to assume (`AWS_ROLE_ARN`).
    pub role_arn: String,
    /// `AWS_ROLE_SESSION_NAME`, else `petrel`.
    pub session_name: String,
    /// `AWS_ENDPOINT_URL_STS`, else the region's STS endpoint.
    pub sts_endpoint: String,
}

impl CredentialSource {
    /// The keys of the environment `var`: a web identity when
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` are set, else
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (with
    /// `AWS_SESSION_TOKEN`); `None` without either.
    pub fn from_env(region: &str, var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        if let (Some(file), Some(role)) = (set("AWS_WEB_IDENTITY_TOKEN_FILE"), set("AWS_ROLE_ARN"))
        {
            return Some(CredentialSource::WebIdentity(WebIdentity {
                token_file: file.into(),
                role_arn: role,
                session_name: set("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "petrel".into()),
                sts_endpoint: set("AWS_ENDPOINT_URL_STS")
                    .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com")),
            }));
        }
        let key = set("AWS_ACCESS_KEY_ID")?;
        let secret = set("AWS_SECRET_ACCESS_KEY")?;
        Some(CredentialSource::Static(Arc::new(
            match set("AWS_SESSION_TOKEN") {
                Some(t) => Credentials::new_with_token(key, secret, t),
                None => Credentials::new(key, secret),
            },
        )))
    }
}

/// Keys and when they expire (unix seconds; `None`: never).
struct Current {
    creds: Arc<Credentials>,
    expires: Option<u64>,
}

/// Gives the keys to sign with, fetching temporary ones again before
/// they expire.
pub struct Provider {
    source: CredentialSource,
    current: tokio::sync::Mutex<Option<Current>>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Provider {
    /// A provider of `source`'s keys.
    pub fn new(source: CredentialSource) -> Self {
        Self {
            source,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The keys to sign the next request with; an STS failure is an
    /// answer like a store's (retried, or held on 403).
    pub async fn get(
        &self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> Result<Arc<Credentials>, Answer> {
        let w = match &self.source {
            CredentialSource::Static(c) => return Ok(c.clone()),
            CredentialSource::WebIdentity(w) => w,
        };
        let mut cur = self.current.lock().await;
        if let Some(c) = cur.as_ref() {
            if c.expires
                .is_none_or(|e| unix_now() + REFRESH_BEFORE.as_secs() < e)
            {
                return Ok(c.creds.clone());
            }
        }
        let token = std::fs::read_to_string(&w.token_file).map_err(|e| Answer::Hold {
            status: 403,
            text: format!(
                "cannot read the web identity token file {}: {e}",
                w.token_file.display()
            ),
        })?;
        let (url, body) = sts_request(w, token.trim());
        let resp = client
            .post(&url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| unanswered(&e, &url, timeout))?;
        let status = resp.status().as_u16();
        let text = answer_text(resp).await;
        if !(200..300).contains(&status) {
            return Err(if usually_transient(status) {
                Answer::Retry {
                    after: None,
                    error_type: "credentials",
                    why: format!("STS answered {status}: {text}"),
                }
            } else {
                Answer::Hold {
                    status,
                    text: format!("STS AssumeRoleWithWebIdentity for {}: {text}", w.role_arn),
                }
            });
        }
        let got = parse_sts_answer(&text).ok_or_else(|| Answer::Retry {
            after: None,
            error_type: "credentials",
            why: format!("cannot read the STS answer: {text}"),
        })?;
        let creds = got.creds.clone();
        *cur = Some(got);
        Ok(creds)
    }
}

/// The URL and form body of `AssumeRoleWithWebIdentity` for `token`.
fn sts_request(w: &WebIdentity, token: &str) -> (String, String) {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("Action", "AssumeRoleWithWebIdentity")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", &w.role_arn)
        .append_pair("RoleSessionName", &w.session_name)
        .append_pair("WebIdentityToken", token)
        .finish();
    let mut url = w.sts_endpoint.clone();
    if !url.ends_with('/') {
        url.push('/');
    }
    (url, body)
}

/// The text of the first `<tag>` element of `xml`.
fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(xml[start..end].trim())
}

/// The keys of an `AssumeRoleWithWebIdentityResponse`.
fn parse_sts_answer(xml: &str) -> Option<Current> {
    let creds = element(xml, "Credentials")?;
    let key = element(creds, "AccessKeyId")?;
    let secret = element(creds, "SecretAccessKey")?;
    let token = element(creds, "SessionToken")?;
    let expires = element(creds, "Expiration")
        .and_then(|e| petrel_time::parse_any_prefix(e.as_bytes()))
        .map(|(ns, _)| (ns / 1_000_000_000).max(0) as u64);
    Some(Current {
        creds: Arc::new(Credentials::new_with_token(key, secret, token)),
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web_identity() -> WebIdentity {
        let env = |k: &str| {
            match k {
                "AWS_WEB_IDENTITY_TOKEN_FILE" => Some("/var/run/secrets/eks/token"),
                "AWS_ROLE_ARN" => Some("arn:aws:iam::123456789012:role/petrel"),
                "AWS_ACCESS_KEY_ID" => Some("ignored"),
                _ => None,
            }
            .map(String::from)
        };
        match CredentialSource::from_env("eu-west-1", env) {
            Some(CredentialSource::WebIdentity(w)) => w,
            other => panic!("expected a web identity, got {other:?}"),
        }
    }

    #[test]
    fn the_environment_chooses_web_identity_over_keys() {
        let w = web_identity();
        assert_eq!(w.sts_endpoint, "https://sts.eu-west-1.amazonaws.com");
        assert_eq!(w.session_name, "petrel");
        let keys = |k: &str| {
            match k {
                "AWS_ACCESS_KEY_ID" => Some("AKID"),
                "AWS_SECRET_ACCESS_KEY" => Some("SECRET"),
                "AWS_SESSION_TOKEN" => Some("TOKEN"),
                _ => None,
            }
            .map(String::from)
        };
        match CredentialSource::from_env("us-east-1", keys) {
            Some(CredentialSource::Static(c)) => {
                assert_eq!(
                    (c.key(), c.secret(), c.token()),
                    ("AKID", "SECRET", Some("TOKEN"))
                );
            }
            other => panic!("expected static keys, got {other:?}"),
        }
        assert!(CredentialSource::from_env("us-east-1", |_| None).is_none());
    }

    #[test]
    fn the_sts_request_carries_role_session_and_token() {
        let (url, body) = sts_request(&web_identity(), "eyJ.a+b/c=");
        assert_eq!(url, "https://sts.eu-west-1.amazonaws.com/");
        let pairs: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("Action"), Some("AssumeRoleWithWebIdentity"));
        assert_eq!(get("Version"), Some("2011-06-15"));
        assert_eq!(
            get("RoleArn"),
            Some("arn:aws:iam::123456789012:role/petrel")
        );
        assert_eq!(get("RoleSessionName"), Some("petrel"));
        assert_eq!(get("WebIdentityToken"), Some("eyJ.a+b/c="));
        assert!(body.contains("WebIdentityToken=eyJ.a%2Bb%2Fc%3D"), "{body}");
    }

    #[test]
    fn the_sts_answer_gives_keys_and_expiry() {
        let xml = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
      <SecretAccessKey>wJalrXUtnFEMI</SecretAccessKey>
      <SessionToken>FwoGZXIvYXdzE</SessionToken>
      <Expiration>2026-05-01T12:00:00Z</Expiration>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>"#;
        let c = parse_sts_answer(xml).expect("parsed");
        assert_eq!(c.creds.key(), "ASIAEXAMPLE");
        assert_eq!(c.creds.secret(), "wJalrXUtnFEMI");
        assert_eq!(c.creds.token(), Some("FwoGZXIvYXdzE"));
        assert_eq!(c.expires, Some(1_777_636_800));
        assert!(parse_sts_answer("<Error><Code>AccessDenied</Code></Error>").is_none());
    }
}
