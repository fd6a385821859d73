//! One list+watch loop per kind, all on one thread: list (in pages of
//! [`PAGE`]), then watch from the list's resourceVersion, resuming from the
//! last version seen after a disconnect and listing again on `410 Gone`.
//!
//! Nothing here blocks a reader: the loops only fill the [`Store`], and
//! when the API server cannot be reached events go on with what the
//! runtime knows (the store keeps what it had).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::store::{Kind, Object};
use super::Shared;

/// Objects per list page: bounds what one answer holds in memory.
const PAGE: usize = 500;
/// The server ends a watch after this long (it is resumed at once): a
/// connection that died silently is noticed within it.
const WATCH_SECONDS: u64 = 290;
/// No byte for this long on a watch (bookmarks come about every minute):
/// the connection is taken as dead.
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_SECONDS + 40);
/// A list that takes longer fails (and is tried again).
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// A watch event larger than this is not an object the agent can use.
const MAX_EVENT_BYTES: usize = 16 << 20;
/// Retry delays after a failure: from MIN, doubling, up to MAX.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The `Accept` of a metadata-only list: the server sends each object's
/// `metadata` only, whatever else the object holds.
const PARTIAL_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
/// The `Accept` of a metadata-only watch.
const PARTIAL_WATCH: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// Why a request failed.
#[derive(Debug)]
pub enum Failure {
    /// No answer (connection refused, reset, timeout).
    Unreachable(String),
    /// An HTTP status other than success, with the server's message.
    Status(u16, String),
    /// `410 Gone` (or an ERROR watch event with code 410): the version
    /// asked for is too old; list again.
    Expired,
    /// An answer that could not be read.
    Invalid(String),
}

impl Failure {
    /// The `reason` label of `petrel_kubernetes_api_errors_total`.
    pub fn reason(&self) -> String {
        match self {
            Failure::Unreachable(_) => "unreachable".into(),
            Failure::Status(c, _) => format!("http_{c}"),
            Failure::Expired => "expired".into(),
            Failure::Invalid(_) => "invalid".into(),
        }
    }
}

/// `{kind, apiVersion, metadata: {resourceVersion, continue}, items}`.
#[derive(Deserialize)]
struct List {
    #[serde(default)]
    metadata: ListMeta,
    /// `null` when empty.
    #[serde(default)]
    items: Option<Vec<Object>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(default, rename = "continue")]
    cont: Option<String>,
}

/// One line of a watch.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// A `Status` (errors, and ERROR watch events).
#[derive(Deserialize, Default)]
struct ApiStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// What one kind asks for.
struct Query {
    path: &'static str,
    field_selector: Option<String>,
    metadata_only: bool,
}

fn query(kind: Kind, node: &str) -> Query {
    let (path, field_selector, metadata_only) = match kind {
        Kind::Pods => ("/api/v1/pods", Some(format!("spec.nodeName={node}")), false),
        Kind::Namespaces => ("/api/v1/namespaces", None, false),
        Kind::Node => (
            "/api/v1/nodes",
            Some(format!("metadata.name={node}")),
            false,
        ),
        Kind::ReplicaSets => ("/apis/apps/v1/replicasets", None, true),
        Kind::Jobs => ("/apis/batch/v1/jobs", None, true),
    };
    Query {
        path,
        field_selector,
        metadata_only,
    }
}

/// Percent-encodes a query value.
fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl Shared {
    fn url(&self, q: &Query, params: &[(&str, &str)]) -> String {
        let mut u = format!("{}{}?", self.creds.server, q.path);
        let mut first = true;
        let mut push = |k: &str, v: &str| {
            if !first {
                u.push('&');
            }
            first = false;
            u.push_str(k);
            u.push('=');
            u.push_str(&enc(v));
        };
        if let Some(fs) = &q.field_selector {
            push("fieldSelector", fs);
        }
        for (k, v) in params {
            push(k, v);
        }
        u
    }

    async fn get(
        &self,
        url: &str,
        accept: &str,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, Failure> {
        let mut rb = self.client.get(url).header("Accept", accept);
        // Read again for each request: kubelet rewrites the projected
        // token before it expires.
        match self.creds.token.header() {
            Ok(Some(h)) => rb = rb.header("Authorization", h),
            Ok(None) => {}
            Err(e) => return Err(Failure::Unreachable(e)),
        }
        if let Some(t) = timeout {
            rb = rb.timeout(t);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| Failure::Unreachable(error_chain(&e)))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        if status == 410 {
            return Err(Failure::Expired);
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ApiStatus>(&body)
            .map(|s| s.message)
            .unwrap_or_else(|_| body.chars().take(300).collect());
        Err(Failure::Status(status, message))
    }

    /// Lists every object of `kind`, page by page; the version to watch
    /// from.
    async fn list(&self, kind: Kind) -> Result<String, Failure> {
        let q = query(kind, &self.node);
        let accept = if q.metadata_only {
            PARTIAL_LIST
        } else {
            "application/json"
        };
        let limit = PAGE.to_string();
        let mut cont: Option<String> = None;
        let mut kept = Vec::new();
        loop {
            let mut params = vec![("limit", limit.as_str())];
            if let Some(c) = &cont {
                params.push(("continue", c.as_str()));
            }
            let url = self.url(&q, &params);
            let resp = self.get(&url, accept, Some(LIST_TIMEOUT)).await?;
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| Failure::Unreachable(error_chain(&e)))?;
            let list: List = serde_json::from_slice(&bytes)
                .map_err(|e| Failure::Invalid(format!("list of {}: {e}", kind.resource())))?;
            drop(bytes);
            for o in list.items.unwrap_or_default() {
                kept.extend(self.store.keep(kind, o));
            }
            match list.metadata.cont.filter(|c| !c.is_empty()) {
                Some(c) => cont = Some(c),
                None => {
                    self.store.replace(kind, kept);
                    return Ok(list.metadata.resource_version);
                }
            }
        }
    }

    /// Watches `kind` from version `rv` until the connection ends; keeps
    /// `rv` at the last version seen, so the next watch resumes there.
    async fn watch(
        &self,
        kind: Kind,
        rv: &mut String,
        relist: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<WatchEnd, Failure> {
        let q = query(kind, &self.node);
        let accept = if q.metadata_only {
            PARTIAL_WATCH
        } else {
            "application/json"
        };
        let secs = WATCH_SECONDS.to_string();
        let url = self.url(
            &q,
            &[
                ("watch", "1"),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", &secs),
                ("resourceVersion", rv),
            ],
        );
        let mut resp = self.get(&url, accept, None).await?;
        // The watch is up: this kind's data is current again.
        self.ok(kind);
        let mut buf: Vec<u8> = Vec::new();
        // Only the kinds whose annotations are kept list again for new
        // annotation keys.
        let keeps_annotations = matches!(kind, Kind::Pods | Kind::Namespaces | Kind::Node);
        loop {
            let relisted = async {
                if keeps_annotations {
                    let _ = relist.changed().await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let chunk = tokio::select! {
                c = tokio::time::timeout(WATCH_IDLE, resp.chunk()) => c,
                _ = relisted => return Ok(WatchEnd::Relist),
            };
            let chunk = match chunk {
                Err(_) => {
                    return Err(Failure::Unreachable(format!(
                        "no data on the watch for {WATCH_IDLE:?}"
                    )))
                }
                Ok(Err(e)) => return Err(Failure::Unreachable(error_chain(&e))),
                Ok(Ok(None)) => return Ok(WatchEnd::Closed),
                Ok(Ok(Some(c))) => c,
            };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = memchr::memchr(b'\n', &buf) {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                self.event(kind, &line, rv)?;
            }
            if buf.len() > MAX_EVENT_BYTES {
                return Err(Failure::Invalid(format!(
                    "a watch event of {} is larger than {MAX_EVENT_BYTES} bytes",
                    kind.resource()
                )));
            }
        }
    }

    /// Applies one watch line.
    fn event(&self, kind: Kind, line: &[u8], rv: &mut String) -> Result<(), Failure> {
        let line = line.trim_ascii();
        if line.is_empty() {
            return Ok(());
        }
        let ev: Event<'_> = serde_json::from_slice(line)
            .map_err(|e| Failure::Invalid(format!("watch of {}: {e}", kind.resource())))?;
        match ev.kind {
            "ERROR" => {
                let st: ApiStatus = serde_json::from_str(ev.object.get()).unwrap_or_default();
                if st.code == 410 {
                    return Err(Failure::Expired);
                }
                Err(Failure::Status(st.code, st.message))
            }
            "BOOKMARK" | "ADDED" | "MODIFIED" | "DELETED" => {
                let o: Object = serde_json::from_str(ev.object.get())
                    .map_err(|e| Failure::Invalid(format!("watch of {}: {e}", kind.resource())))?;
                if !o.metadata.resource_version.is_empty() {
                    rv.clone_from(&o.metadata.resource_version);
                }
                if ev.kind != "BOOKMARK" {
                    if let Some(k) = self.store.keep(kind, o) {
                        self.store.apply(k, ev.kind == "DELETED");
                        self.update_gauges();
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// How a watch ended without an error.
pub enum WatchEnd {
    /// The server closed it (its timeout): resume from the last version.
    Closed,
    /// What is kept changed (new annotation keys): list again.
    Relist,
}

/// An error with its causes (`error sending request: connection refused`).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The loop of one kind, until the runtime is dropped.
pub async fn run(shared: Arc<Shared>, kind: Kind, mut relist: tokio::sync::watch::Receiver<u64>) {
    let mut backoff = BACKOFF_MIN;
    let mut rv: Option<String> = None;
    loop {
        let current = match rv.take() {
            Some(v) => Ok(v),
            None => {
                relist.mark_unchanged();
                shared.list(kind).await
            }
        };
        let result = match current {
            Ok(mut v) => {
                shared.update_gauges();
                let r = shared.watch(kind, &mut v, &mut relist).await;
                // Resume from the last version seen, whatever ended it.
                rv = Some(v);
                r
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(WatchEnd::Closed) => {
                backoff = BACKOFF_MIN;
                continue;
            }
            Ok(WatchEnd::Relist) | Err(Failure::Expired) => {
                if matches!(result, Err(Failure::Expired)) {
                    tracing::info!(
                        resource = kind.resource(),
                        "Kubernetes API: the watched version expired (410 Gone); listing again"
                    );
                    shared.count(kind, "expired");
                }
                rv = None;
                backoff = BACKOFF_MIN;
                continue;
            }
            Err(e) => {
                if matches!(e, Failure::Invalid(_)) {
                    // An answer we cannot follow: start over from a list.
                    rv = None;
                }
                if matches!(kind, Kind::Node) && matches!(e, Failure::Status(..)) {
                    // Refused (no RBAC for nodes, or no such node): no
                    // labels will come, so nothing waits for them.
                    shared.store.mark_node_listed();
                }
                let started = Instant::now();
                shared.failed(kind, &e);
                tokio::time::sleep(backoff.saturating_sub(started.elapsed())).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines_apply_resume_and_expire() {
        let s = Shared::for_tests();
        let mut rv = String::from("10");
        let added = br#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"11","labels":{"app":"x"}},"status":{"podIP":"192.0.2.1"}}}"#;
        s.event(Kind::Pods, added, &mut rv).unwrap();
        assert_eq!(rv, "11");
        assert_eq!(
            s.store.pod("u1").and_then(|p| p.pod_ip.clone()).as_deref(),
            Some("192.0.2.1")
        );
        // A bookmark moves the version only.
        let g = s.store.generation();
        s.event(
            Kind::Pods,
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"15"}}}"#,
            &mut rv,
        )
        .unwrap();
        assert_eq!((rv.as_str(), s.store.generation()), ("15", g));
        s.event(
            Kind::Pods,
            br#"{"type":"DELETED","object":{"kind":"Pod","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"16"}}}"#,
            &mut rv,
        )
        .unwrap();
        assert!(s.store.pod("u1").is_none());
        // 410 as an ERROR event: list again.
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 5 (16)","reason":"Expired","code":410}}"#;
        assert!(matches!(
            s.event(Kind::Pods, gone, &mut rv),
            Err(Failure::Expired)
        ));
        assert!(matches!(
            s.event(Kind::Pods, b"{not json", &mut rv),
            Err(Failure::Invalid(_))
        ));
        // A metadata-only ReplicaSet event keeps the controller.
        let rs = br#"{"type":"ADDED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"web-1","namespace":"ns","resourceVersion":"17","ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":"web","uid":"d","controller":true}]}}}"#;
        s.event(Kind::ReplicaSets, rs, &mut rv).unwrap();
        let chain = s.store.owners(
            "ns",
            &super::super::store::Owner {
                kind: super::super::store::OwnerKind::ReplicaSet,
                name: "web-1".into(),
            },
        );
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].name, "web");
    }
}
