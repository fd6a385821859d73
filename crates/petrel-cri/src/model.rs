//! What the watcher knows of pods and containers, and the cache that the
//! runtime clients (CRI in `watcher`, Docker in `docker`) fill: kept apart
//! from both so that neither client imports the other's module for them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::api;

/// A pod sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// Kubernetes pod UID.
    pub uid: String,
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Sandbox attempt (bumped when kubelet recreates the sandbox).
    pub attempt: u32,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// The pod's log directory (`/var/log/pods/<ns>_<name>_<uid>` under kubelet);
    /// empty when the runtime did not say.
    pub log_directory: String,
    /// The sandbox is ready; false once it is stopped or gone from the runtime.
    pub ready: bool,
}

/// A container as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerInfo {
    /// Runtime container ID.
    pub id: String,
    /// UID of the pod the container belongs to.
    pub pod_uid: String,
    /// Container name in the pod spec.
    pub name: String,
    /// Restart count (kubelet's attempt number; the log file is `<attempt>.log`).
    pub attempt: u32,
    /// Image as the pod spec names it (`nginx:1.27`), or the image ID when the
    /// runtime knows no name.
    pub image: String,
    /// Absolute path of the container's log file.
    pub log_path: String,
    /// Host PID of the container's init process while it runs: its files are
    /// under `/proc/<pid>/root`.
    pub pid: Option<u32>,
    /// The container is running; false once it exited or is gone from the runtime.
    pub running: bool,
    /// Container labels (kubelet's `io.kubernetes.*` among them).
    pub labels: BTreeMap<String, String>,
}

/// An immutable view of every known pod and container, including those that
/// vanished less than [`WatcherOptions::grace`] ago.
#[derive(Debug, Default)]
pub struct Snapshot {
    pods: HashMap<String, Arc<PodInfo>>,
    containers: HashMap<String, Arc<ContainerInfo>>,
    by_pod: HashMap<String, Vec<Arc<ContainerInfo>>>,
}

impl Snapshot {
    /// The pod with this UID.
    pub fn pod(&self, uid: &str) -> Option<&Arc<PodInfo>> {
        self.pods.get(uid)
    }

    /// The container `name`, restart `attempt`, of the pod `pod_uid` — the three
    /// things a CRI log path (`<ns>_<pod>_<uid>/<name>/<attempt>.log`) names.
    pub fn container(
        &self,
        pod_uid: &str,
        name: &str,
        attempt: u32,
    ) -> Option<&Arc<ContainerInfo>> {
        self.by_pod
            .get(pod_uid)?
            .iter()
            .find(|c| c.name == name && c.attempt == attempt)
    }

    /// The container with this runtime ID.
    pub fn container_by_id(&self, id: &str) -> Option<&Arc<ContainerInfo>> {
        self.containers.get(id)
    }

    /// Every container.
    pub fn containers(&self) -> impl Iterator<Item = &Arc<ContainerInfo>> {
        self.containers.values()
    }

    /// Every pod.
    pub fn pods(&self) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods.values()
    }
}

/// Counters of the watcher's work, readable at any time.
#[derive(Debug, Default)]
pub struct WatcherStats {
    /// Refreshes that completed.
    pub refreshes: AtomicU64,
    /// Refreshes that failed (runtime absent, hung, or answered an error).
    pub failures: AtomicU64,
    /// The last refresh succeeded.
    pub connected: AtomicBool,
    /// The last failure's message.
    pub last_error: Mutex<Option<String>>,
    /// List calls made (two per refresh).
    pub list_calls: AtomicU64,
    /// Status calls made (only for sandboxes and containers new or changed
    /// since the previous refresh).
    pub status_calls: AtomicU64,
}

struct Tracked<T> {
    info: Arc<T>,
    /// The runtime's state value when `info` was built; a change triggers a status call.
    state: i32,
    gone_since: Option<Instant>,
}

/// The refresh thread's working state, keyed by runtime IDs.
#[derive(Default)]
pub(crate) struct Cache {
    pods: HashMap<String, Tracked<PodInfo>>,
    containers: HashMap<String, Tracked<ContainerInfo>>,
    /// The content changed since the last published snapshot.
    pub(crate) dirty: bool,
}

impl Cache {
    /// Sandboxes never seen, or whose state changed, or that were marked gone.
    pub(crate) fn stale_pods<'a>(&self, listed: &'a [api::PodSandbox]) -> Vec<&'a api::PodSandbox> {
        listed
            .iter()
            .filter(|sb| match self.pods.get(&sb.id) {
                Some(t) => t.state != sb.state || t.gone_since.is_some(),
                None => true,
            })
            .collect()
    }

    pub(crate) fn update_pods(
        &mut self,
        listed: &[api::PodSandbox],
        mut fresh: HashMap<String, PodInfo>,
        now: Instant,
    ) {
        for sb in listed {
            if let Some(info) = fresh.remove(&sb.id) {
                let changed = self
                    .pods
                    .get(&sb.id)
                    .is_none_or(|t| *t.info != info || t.gone_since.is_some());
                self.dirty |= changed;
                self.pods.insert(
                    sb.id.clone(),
                    Tracked {
                        info: Arc::new(info),
                        state: sb.state,
                        gone_since: None,
                    },
                );
            }
        }
        let present: std::collections::HashSet<&str> =
            listed.iter().map(|sb| sb.id.as_str()).collect();
        for (id, t) in &mut self.pods {
            if !present.contains(id.as_str()) && t.gone_since.is_none() {
                t.gone_since = Some(now);
                if t.info.ready {
                    let mut info = (*t.info).clone();
                    info.ready = false;
                    t.info = Arc::new(info);
                    self.dirty = true;
                }
            }
        }
    }

    pub(crate) fn pod_uid_of(&self, ct: &api::Container) -> Option<String> {
        self.pods
            .get(&ct.pod_sandbox_id)
            .map(|t| t.info.uid.clone())
            .filter(|u| !u.is_empty())
    }

    pub(crate) fn stale_containers<'a>(
        &self,
        listed: &'a [api::Container],
    ) -> Vec<&'a api::Container> {
        listed
            .iter()
            .filter(|ct| match self.containers.get(&ct.id) {
                Some(t) => t.state != ct.state || t.gone_since.is_some(),
                None => true,
            })
            .collect()
    }

    pub(crate) fn update_containers(
        &mut self,
        listed: &[api::Container],
        mut fresh: HashMap<String, ContainerInfo>,
        now: Instant,
    ) {
        for ct in listed {
            if let Some(info) = fresh.remove(&ct.id) {
                let changed = self
                    .containers
                    .get(&ct.id)
                    .is_none_or(|t| *t.info != info || t.gone_since.is_some());
                self.dirty |= changed;
                self.containers.insert(
                    ct.id.clone(),
                    Tracked {
                        info: Arc::new(info),
                        state: ct.state,
                        gone_since: None,
                    },
                );
            }
        }
        let present: std::collections::HashSet<&str> =
            listed.iter().map(|ct| ct.id.as_str()).collect();
        for (id, t) in &mut self.containers {
            if !present.contains(id.as_str()) && t.gone_since.is_none() {
                t.gone_since = Some(now);
                if t.info.running {
                    let mut info = (*t.info).clone();
                    info.running = false;
                    info.pid = None;
                    t.info = Arc::new(info);
                    self.dirty = true;
                }
            }
        }
    }

    /// How many pods and containers are tracked, vanished ones included
    /// (for tests of the cache's bound).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> (usize, usize) {
        (self.pods.len(), self.containers.len())
    }

    /// Drops entries gone for longer than `grace`.
    pub(crate) fn expire(&mut self, now: Instant, grace: Duration) {
        fn keep<T>(t: &Tracked<T>, now: Instant, grace: Duration) -> bool {
            t.gone_since.is_none_or(|g| now.duration_since(g) < grace)
        }
        let (np, nc) = (self.pods.len(), self.containers.len());
        self.pods.retain(|_, t| keep(t, now, grace));
        self.containers.retain(|_, t| keep(t, now, grace));
        if np != self.pods.len() || nc != self.containers.len() {
            self.dirty = true;
        }
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        for t in self.pods.values() {
            let uid = &t.info.uid;
            // A pod whose sandbox was recreated has several: the ready one, else the latest, wins.
            let better = match snap.pods.get(uid) {
                None => true,
                Some(old) => (t.info.ready, t.info.attempt) > (old.ready, old.attempt),
            };
            if better {
                snap.pods.insert(uid.clone(), t.info.clone());
            }
        }
        for t in self.containers.values() {
            snap.containers.insert(t.info.id.clone(), t.info.clone());
            let list = snap.by_pod.entry(t.info.pod_uid.clone()).or_default();
            match list
                .iter_mut()
                .find(|c| c.name == t.info.name && c.attempt == t.info.attempt)
            {
                Some(c) if t.info.running && !c.running => *c = t.info.clone(),
                Some(_) => {}
                None => list.push(t.info.clone()),
            }
        }
        snap
    }
}
