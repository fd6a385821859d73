//! Docker Engine API over its unix socket: the same cache, fed from
//! `GET /containers/json?all=1` (one call per refresh) and
//! `GET /containers/{id}/json` (only for containers new or changed).
//!
//! Pods exist only where kubelet's labels say so (cri-dockerd / dockershim):
//! a container labelled `io.kubernetes.docker.type=podsandbox` is a pod, with
//! `io.kubernetes.pod.{uid,name,namespace}`, its pod labels as plain labels and
//! its annotations as `annotation.<key>` labels. Other containers get the pod
//! UID from `io.kubernetes.pod.uid` (empty for plain Docker containers), the
//! name from `io.kubernetes.container.name` (else the Docker name) and the
//! attempt from `annotation.io.kubernetes.container.restartCount`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::api;
use crate::model::{Cache, ContainerInfo, PodInfo, WatcherStats};

const SANDBOX_TYPE_LABEL: &str = "io.kubernetes.docker.type";
const ANNOTATION_PREFIX: &str = "annotation.";

/// One HTTP/1.1 connection to the Docker daemon, reused across requests.
pub(crate) struct DockerConn {
    sender: SendRequest<Empty<Bytes>>,
}

impl DockerConn {
    pub(crate) async fn connect(path: &Path, timeout: Duration) -> Result<Self, String> {
        let what = || format!("connecting to {}", path.display());
        let stream = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path))
            .await
            .map_err(|_| format!("{}: no answer within {timeout:?}", what()))?
            .map_err(|e| format!("{}: {e}", what()))?;
        let (sender, conn) = tokio::time::timeout(
            timeout,
            hyper::client::conn::http1::handshake(TokioIo::new(stream)),
        )
        .await
        .map_err(|_| format!("{}: no answer within {timeout:?}", what()))?
        .map_err(|e| format!("{}: {}", what(), crate::error_chain(&e)))?;
        // Drives the connection; it ends when `sender` is dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(DockerConn { sender })
    }

    async fn get(&mut self, path: &str, timeout: Duration) -> Result<Option<Value>, String> {
        let fut = async {
            self.sender
                .ready()
                .await
                .map_err(|e| crate::error_chain(&e))?;
            let req = hyper::Request::get(path)
                .header(hyper::header::HOST, "docker")
                .body(Empty::<Bytes>::new())
                .map_err(|e| e.to_string())?;
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| crate::error_chain(&e))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| crate::error_chain(&e))?
                .to_bytes();
            if status == hyper::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !status.is_success() {
                return Err(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                ));
            }
            serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| format!("bad JSON: {e}"))
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r.map_err(|e| format!("GET {path}: {e}")),
            Err(_) => Err(format!("GET {path}: no answer within {timeout:?}")),
        }
    }
}

fn labels_of(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn state_of(s: &str) -> i32 {
    (match s {
        "running" => api::ContainerState::ContainerRunning,
        "created" => api::ContainerState::ContainerCreated,
        "exited" | "dead" => api::ContainerState::ContainerExited,
        _ => api::ContainerState::ContainerUnknown,
    }) as i32
}

/// A sandbox container's labels as the pod's labels and annotations.
fn pod_info(labels: &BTreeMap<String, String>, ready: bool) -> PodInfo {
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    let mut pod_labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    for (k, v) in labels {
        if let Some(a) = k.strip_prefix(ANNOTATION_PREFIX) {
            annotations.insert(a.to_string(), v.clone());
        } else if k != SANDBOX_TYPE_LABEL && k != "io.kubernetes.container.name" {
            pod_labels.insert(k.clone(), v.clone());
        }
    }
    PodInfo {
        uid: get("io.kubernetes.pod.uid"),
        namespace: get("io.kubernetes.pod.namespace"),
        name: get("io.kubernetes.pod.name"),
        attempt: 0,
        labels: pod_labels,
        annotations,
        log_directory: String::new(),
        ready,
    }
}

fn container_info(id: &str, inspect: &Value) -> ContainerInfo {
    let labels = labels_of(inspect.pointer("/Config/Labels"));
    let running = inspect
        .pointer("/State/Running")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let pid = inspect
        .pointer("/State/Pid")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| running && p > 0);
    let str_at = |p: &str| {
        inspect
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let name = labels
        .get("io.kubernetes.container.name")
        .cloned()
        .unwrap_or_else(|| str_at("/Name").trim_start_matches('/').to_string());
    ContainerInfo {
        id: id.to_string(),
        pod_uid: labels
            .get("io.kubernetes.pod.uid")
            .cloned()
            .unwrap_or_default(),
        name,
        attempt: labels
            .get("annotation.io.kubernetes.container.restartCount")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
        image: str_at("/Config/Image"),
        log_path: str_at("/LogPath"),
        pid,
        running,
        labels,
    }
}

/// One refresh: the list call, then an inspect call per new or changed container.
pub(crate) async fn refresh(
    conn: &mut DockerConn,
    cache: &mut Cache,
    timeout: Duration,
    stats: &WatcherStats,
) -> Result<(), String> {
    use std::sync::atomic::Ordering::Relaxed;
    stats.list_calls.fetch_add(1, Relaxed);
    let list = conn
        .get("/containers/json?all=1", timeout)
        .await?
        .ok_or("GET /containers/json: 404")?;
    let list = list
        .as_array()
        .ok_or("GET /containers/json: not an array")?;

    // The Docker list in CRI terms, so that the cache's change detection applies as is.
    let mut sandboxes = Vec::new();
    let mut containers = Vec::new();
    for c in list {
        let Some(id) = c.get("Id").and_then(Value::as_str) else {
            continue;
        };
        let labels = labels_of(c.get("Labels"));
        let state = c.get("State").and_then(Value::as_str).unwrap_or_default();
        if labels.get(SANDBOX_TYPE_LABEL).map(String::as_str) == Some("podsandbox") {
            let ready = state == "running";
            sandboxes.push(api::PodSandbox {
                id: id.to_string(),
                state: if ready {
                    api::PodSandboxState::SandboxReady
                } else {
                    api::PodSandboxState::SandboxNotready
                } as i32,
                labels,
                ..Default::default()
            });
        } else {
            containers.push(api::Container {
                id: id.to_string(),
                state: state_of(state),
                labels,
                ..Default::default()
            });
        }
    }

    let mut pods = HashMap::new();
    for sb in cache.stale_pods(&sandboxes) {
        let ready = sb.state == api::PodSandboxState::SandboxReady as i32;
        pods.insert(sb.id.clone(), pod_info(&sb.labels, ready));
    }
    cache.update_pods(&sandboxes, pods, std::time::Instant::now());

    let mut fresh = HashMap::new();
    for ct in cache.stale_containers(&containers) {
        stats.status_calls.fetch_add(1, Relaxed);
        // Removed since the list: the next list says so.
        if let Some(v) = conn
            .get(&format!("/containers/{}/json", ct.id), timeout)
            .await?
        {
            fresh.insert(ct.id.clone(), container_info(&ct.id, &v));
        }
    }
    cache.update_containers(&containers, fresh, std::time::Instant::now());
    Ok(())
}
