//! The S3 calls the sink makes (PutObject and the multipart upload),
//! signed with SigV4 by `rusty-s3` and sent through the agent's own HTTP
//! client, and what their answers mean to the driver ([`Answer`]).
//!
//! Answers: 2xx done (a CompleteMultipartUpload answered 200 with an
//! `<Error>` body is retried, as S3 documents); no answer, 408, 429, 5xx
//! (503 `SlowDown` included) and S3's 400 `RequestTimeout` are retried with
//! backoff and `Retry-After`; 401, 403 (wrong keys, a denied bucket, a
//! KMS key the role may not use) and 404 (no such bucket) hold the data;
//! any other answer (400 `InvalidStorageClass`, ...) holds it too: an
//! object cannot be split, an operator must fix the sink.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rusty_s3::actions::S3Action;
use rusty_s3::{Bucket, Credentials};

use super::auth::Provider;
use crate::sinks::client::{answer_text, retry_after, unanswered, usually_transient};
use crate::sinks::driver::Answer;

/// How long a signed URL stays valid: longer than any request takes.
const SIGNED_FOR: Duration = Duration::from_secs(3600);

/// A bucket as the sink writes to it.
pub struct Store {
    bucket: Bucket,
    client: reqwest::Client,
    creds: Provider,
    /// Signed headers of the object-creating calls: content type and
    /// encoding, storage class, server-side encryption.
    headers: Vec<(&'static str, String)>,
    timeout: Duration,
}

impl Store {
    /// Calls to `bucket` through `client` (whose timeout is `timeout`),
    /// creating objects with `headers`.
    pub fn new(
        bucket: Bucket,
        client: reqwest::Client,
        creds: Provider,
        headers: Vec<(&'static str, String)>,
        timeout: Duration,
    ) -> Self {
        Self {
            bucket,
            client,
            creds,
            headers,
            timeout,
        }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        self.bucket.name()
    }

    async fn creds(&self) -> Result<Arc<Credentials>, Answer> {
        self.creds.get(&self.client, self.timeout).await
    }

    /// Sends a signed request; `Ok` holds the answer's ETag and body.
    async fn send(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        headers: &[(&'static str, String)],
        body: Option<Bytes>,
        key: &str,
    ) -> Result<(Option<String>, String), Answer> {
        let mut rb = self.client.request(method, url.clone());
        for (k, v) in headers {
            rb = rb.header(*k, v);
        }
        if let Some(b) = body {
            rb = rb.body(b);
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => {
                // The URL carries the signature: log the object, not it.
                let what = format!("s3://{}/{key}", self.bucket.name());
                return Err(unanswered(&e, &what, self.timeout));
            }
        };
        let status = resp.status().as_u16();
        let after = retry_after(&resp);
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = answer_text(resp).await;
        let failed = !(200..300).contains(&status) || text.contains("<Error>");
        if !failed {
            return Ok((etag, text));
        }
        let where_ = format!("bucket {}, key {key}", self.bucket.name());
        Err(classify(status, &text, after, where_))
    }

    /// Stores `body` as `key` in one request.
    pub async fn put(&self, key: &str, body: Bytes) -> Result<(), Answer> {
        let creds = self.creds().await?;
        let mut action = self.bucket.put_object(Some(&creds), key);
        for (k, v) in &self.headers {
            action.headers_mut().insert(*k, v.clone());
        }
        let url = action.sign(SIGNED_FOR);
        self.send(reqwest::Method::PUT, url, &self.headers, Some(body), key)
            .await
            .map(drop)
    }

    /// Starts a multipart upload of `key`; its upload id.
    pub async fn create(&self, key: &str) -> Result<String, Answer> {
        let creds = self.creds().await?;
        let mut action = self.bucket.create_multipart_upload(Some(&creds), key);
        for (k, v) in &self.headers {
            action.headers_mut().insert(*k, v.clone());
        }
        let url = action.sign(SIGNED_FOR);
        let (_, text) = self
            .send(reqwest::Method::POST, url, &self.headers, None, key)
            .await?;
        rusty_s3::actions::CreateMultipartUpload::parse_response(&text)
            .map(|r| r.upload_id().to_string())
            .map_err(|e| Answer::Retry {
                after: None,
                error_type: "request_failed",
                why: format!("cannot read the answer to CreateMultipartUpload of {key}: {e}"),
            })
    }

    /// Uploads part `number` (from 1) of upload `id`; its ETag.
    pub async fn upload_part(
        &self,
        key: &str,
        id: &str,
        number: u16,
        body: Bytes,
    ) -> Result<String, Answer> {
        let creds = self.creds().await?;
        let url = self
            .bucket
            .upload_part(Some(&creds), key, number, id)
            .sign(SIGNED_FOR);
        let (etag, _) = self
            .send(reqwest::Method::PUT, url, &[], Some(body), key)
            .await?;
        etag.ok_or_else(|| Answer::Retry {
            after: None,
            error_type: "request_failed",
            why: format!("part {number} of {key} was answered without an ETag"),
        })
    }

    /// Completes upload `id` of `key` from its parts' ETags, in order.
    pub async fn complete(&self, key: &str, id: &str, etags: &[String]) -> Result<(), Answer> {
        let creds = self.creds().await?;
        let action = self.bucket.complete_multipart_upload(
            Some(&creds),
            key,
            id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(SIGNED_FOR);
        let body = action.body();
        self.send(reqwest::Method::POST, url, &[], Some(body.into()), key)
            .await
            .map(drop)
    }

    /// Aborts upload `id` of `key`, so that its parts are not kept (and
    /// billed); a failure is only logged: a lifecycle rule for incomplete
    /// uploads removes what is left.
    pub async fn abort(&self, key: &str, id: &str) {
        let Ok(creds) = self.creds().await else {
            return;
        };
        let url = self
            .bucket
            .abort_multipart_upload(Some(&creds), key, id)
            .sign(SIGNED_FOR);
        if let Err(e) = self
            .send(reqwest::Method::DELETE, url, &[], None, key)
            .await
        {
            tracing::warn!(bucket = %self.bucket.name(), key, answer = ?e, "s3 sink: cannot abort a multipart upload; its parts stay until a lifecycle rule removes them");
        }
    }
}

/// What a failed answer (`status`, body `text`) to a call on `where_`
/// means to the driver.
fn classify(status: u16, text: &str, after: Option<Duration>, where_: String) -> Answer {
    let code = element(text, "Code").unwrap_or("");
    if usually_transient(status)
        || code == "RequestTimeout"
        || code == "SlowDown"
        || code == "InternalError"
    {
        return Answer::Retry {
            after,
            error_type: "request_failed",
            why: format!("{where_}: answered {status} {code}"),
        };
    }
    let message = element(text, "Message").unwrap_or(text);
    Answer::Hold {
        status,
        text: format!("{where_}: {code} {message}"),
    }
}

/// The text of the first `<tag>` element of `xml`.
fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(&xml[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_retried_or_held_by_status_and_code() {
        let w = || "bucket b, key k".to_string();
        let slow = "<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>";
        assert!(matches!(
            classify(503, slow, None, w()),
            Answer::Retry { .. }
        ));
        let timeout = "<Error><Code>RequestTimeout</Code></Error>";
        assert!(matches!(
            classify(400, timeout, None, w()),
            Answer::Retry { .. }
        ));
        assert!(matches!(
            classify(200, "<Error><Code>InternalError</Code></Error>", None, w()),
            Answer::Retry { .. }
        ));
        let denied = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
        match classify(403, denied, None, w()) {
            Answer::Hold { status, text } => {
                assert_eq!(status, 403);
                assert!(
                    text.contains("bucket b, key k") && text.contains("AccessDenied"),
                    "{text}"
                );
            }
            other => panic!("held expected, got {other:?}"),
        }
        assert!(matches!(
            classify(
                400,
                "<Error><Code>InvalidStorageClass</Code></Error>",
                None,
                w()
            ),
            Answer::Hold { status: 400, .. }
        ));
    }
}
