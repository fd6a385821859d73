//! The container runtime behind the catalog: containerd's CRI API or
//! Docker's engine API over the node's socket, through `petrel-cri`'s
//! background watcher.

use std::sync::Arc;

use petrel_cri::{ContainerInfo, PodInfo, Runtime, RuntimeWatcher, Snapshot, WatcherOptions};

use super::path::LogPath;
use super::{RuntimeChoice, RuntimeInfo, RuntimeMeta, RuntimeSettings};

/// Connects to the runtime `config` names (or finds one, with `auto`).
/// Returns at once: the connection is made and kept in the background.
pub fn connect(config: &RuntimeSettings) -> Option<Arc<dyn RuntimeMeta>> {
    let runtime = match config.choice {
        RuntimeChoice::None => return None,
        RuntimeChoice::Containerd => Runtime::Containerd(config.containerd_socket.clone()),
        RuntimeChoice::Docker => Runtime::Docker(config.docker_socket.clone()),
        RuntimeChoice::Auto => {
            if config.containerd_socket.exists() {
                Runtime::Containerd(config.containerd_socket.clone())
            } else if config.docker_socket.exists() {
                Runtime::Docker(config.docker_socket.clone())
            } else {
                tracing::info!(
                    containerd = %config.containerd_socket.display(),
                    docker = %config.docker_socket.display(),
                    "no container runtime socket found: container metadata comes from the log paths only"
                );
                return None;
            }
        }
    };
    tracing::info!(runtime = ?runtime, "container metadata from the runtime");
    match RuntimeWatcher::start(WatcherOptions::new(runtime)) {
        Ok(watcher) => Some(Arc::new(Watched { watcher })),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the container runtime watcher; metadata comes from the log paths only");
            None
        }
    }
}

struct Watched {
    watcher: Arc<RuntimeWatcher>,
}

/// Labels kubelet puts on every sandbox for its own bookkeeping: not the
/// pod's labels as users wrote them.
fn is_kubelet_label(k: &str) -> bool {
    k.starts_with("io.kubernetes.pod.") || k.starts_with("io.kubernetes.container.")
}

fn info(pod: Option<&PodInfo>, c: Option<&ContainerInfo>) -> RuntimeInfo {
    let label = |k: &str| c.and_then(|c| c.labels.get(k)).cloned();
    RuntimeInfo {
        namespace: pod
            .map(|p| p.namespace.clone())
            .or_else(|| label("io.kubernetes.pod.namespace")),
        pod_name: pod
            .map(|p| p.name.clone())
            .or_else(|| label("io.kubernetes.pod.name")),
        pod_uid: pod
            .map(|p| p.uid.clone())
            .or_else(|| c.map(|c| c.pod_uid.clone()).filter(|u| !u.is_empty())),
        container_name: c.map(|c| c.name.clone()),
        container_id: c.map(|c| c.id.clone()),
        image: c.map(|c| c.image.clone()).filter(|i| !i.is_empty()),
        labels: pod
            .map(|p| {
                p.labels
                    .iter()
                    .filter(|(k, _)| !is_kubelet_label(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        annotations: pod
            .map(|p| {
                p.annotations
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        pid: c.filter(|c| c.running).and_then(|c| c.pid),
    }
}

fn lookup(snap: &Snapshot, p: &LogPath) -> Option<RuntimeInfo> {
    match p {
        LogPath::Cri {
            uid,
            container,
            restart,
            ..
        } => {
            let pod = snap.pod(uid);
            let c = snap.container(uid, container, *restart);
            if pod.is_none() && c.is_none() {
                return None;
            }
            Some(info(pod.map(|p| &**p), c.map(|c| &**c)))
        }
        LogPath::Docker { id } => {
            let c = snap.container_by_id(id)?;
            let pod = snap.pod(&c.pod_uid);
            Some(info(pod.map(|p| &**p), Some(c)))
        }
    }
}

impl RuntimeMeta for Watched {
    fn generation(&self) -> u64 {
        self.watcher.generation()
    }

    fn lookup(&self, p: &LogPath) -> Option<Arc<RuntimeInfo>> {
        lookup(&self.watcher.snapshot(), p).map(Arc::new)
    }

    fn request_refresh(&self) {
        self.watcher.request_refresh();
    }

    fn running(&self) -> Vec<Arc<RuntimeInfo>> {
        let snap = self.watcher.snapshot();
        snap.containers()
            .filter(|c| c.running && c.pid.is_some())
            .map(|c| Arc::new(info(snap.pod(&c.pod_uid).map(|p| &**p), Some(c))))
            .collect()
    }
}
