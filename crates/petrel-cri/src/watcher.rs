//! The node-wide metadata cache and the thread that refreshes it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tonic::transport::Channel;

use crate::api::{self, runtime_service_client::RuntimeServiceClient};

/// Kubelet's label on containers naming their pod's UID; used when a container's
/// sandbox is not (yet) in the cache.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

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

/// Which runtime to ask, and where its socket is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// containerd (or any CRI runtime) through the CRI `runtime.v1` gRPC API.
    Containerd(PathBuf),
    /// Docker Engine API (`/var/run/docker.sock`); pods from kubelet's
    /// `io.kubernetes.*` container labels where present.
    Docker(PathBuf),
}

/// How the watcher talks to the runtime.
#[derive(Debug, Clone)]
pub struct WatcherOptions {
    /// The runtime and its socket.
    pub runtime: Runtime,
    /// Time between periodic refreshes.
    pub refresh_interval: Duration,
    /// How long vanished pods and containers stay in the snapshot, so that the
    /// last lines of a removed pod's logs still get its metadata.
    pub grace: Duration,
    /// Bound on each call to the runtime (and on connecting).
    pub call_timeout: Duration,
}

impl Default for WatcherOptions {
    /// containerd at its usual socket, `/run/containerd/containerd.sock`, with [`WatcherOptions::new`]'s timings.
    fn default() -> Self {
        WatcherOptions::new(Runtime::Containerd(PathBuf::from(
            "/run/containerd/containerd.sock",
        )))
    }
}

impl WatcherOptions {
    /// Defaults: refresh every 10 s, keep vanished entries 5 min, 2 s per call.
    pub fn new(runtime: Runtime) -> Self {
        WatcherOptions {
            runtime,
            refresh_interval: Duration::from_secs(10),
            grace: Duration::from_secs(300),
            call_timeout: Duration::from_secs(2),
        }
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

struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    generation: AtomicU64,
    stats: WatcherStats,
    refresh: Notify,
    stop: Notify,
    stopping: AtomicBool,
}

/// The node-wide metadata cache: one per agent, shared by every pipeline.
///
/// Refreshing happens on a dedicated thread; [`RuntimeWatcher::snapshot`] only
/// clones an `Arc`, so a slow, hung or absent runtime never blocks a reader.
pub struct RuntimeWatcher {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for RuntimeWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeWatcher")
            .field("generation", &self.generation())
            .field("stats", &self.shared.stats)
            .finish()
    }
}

impl RuntimeWatcher {
    /// Starts the refresh thread and returns at once, whether or not the runtime
    /// answers; the first refresh runs immediately.
    pub fn start(opts: WatcherOptions) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            generation: AtomicU64::new(0),
            stats: WatcherStats::default(),
            refresh: Notify::new(),
            stop: Notify::new(),
            stopping: AtomicBool::new(false),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("petrel-cri".into())
            .spawn(move || rt.block_on(run(thread_shared, opts)))?;
        Ok(Arc::new(RuntimeWatcher {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The latest snapshot (a pointer clone).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.read().clone()
    }

    /// Bumps each time a refresh changes the snapshot's content.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Asks for a refresh as soon as possible (e.g. a new pod log directory
    /// appeared). Requests made while one is pending coalesce into one refresh.
    pub fn request_refresh(&self) {
        self.shared.refresh.notify_one();
    }

    /// The watcher's counters.
    pub fn stats(&self) -> &WatcherStats {
        &self.shared.stats
    }

    /// Stops the refresh thread (cancelling a call in flight) and waits for it.
    /// The last snapshot stays readable.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop.notify_one();
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for RuntimeWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The open connection to the runtime, if any.
enum Conn {
    Cri(Option<RuntimeServiceClient<Channel>>),
    Docker(Option<crate::docker::DockerConn>),
}

async fn refresh_any(
    conn: &mut Conn,
    cache: &mut Cache,
    opts: &WatcherOptions,
    stats: &WatcherStats,
) -> Result<(), String> {
    match (conn, &opts.runtime) {
        (Conn::Cri(client), Runtime::Containerd(socket)) => {
            refresh(client, cache, socket, opts, stats).await
        }
        (Conn::Docker(slot), Runtime::Docker(socket)) => {
            let c = match slot {
                Some(c) => c,
                None => slot
                    .insert(crate::docker::DockerConn::connect(socket, opts.call_timeout).await?),
            };
            crate::docker::refresh(c, cache, opts.call_timeout, stats).await
        }
        _ => Err("runtime and connection kinds differ".into()),
    }
}

async fn run(shared: Arc<Shared>, opts: WatcherOptions) {
    let fresh_conn = || match opts.runtime {
        Runtime::Containerd(_) => Conn::Cri(None),
        Runtime::Docker(_) => Conn::Docker(None),
    };
    let mut conn = fresh_conn();
    let mut cache = Cache::default();
    loop {
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let result = tokio::select! {
            r = refresh_any(&mut conn, &mut cache, &opts, &shared.stats) => r,
            _ = shared.stop.notified() => return,
        };
        let stats = &shared.stats;
        match result {
            Ok(()) => {
                stats.refreshes.fetch_add(1, Ordering::Relaxed);
                stats.connected.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                // Reconnect next time: the connection may be to a runtime that restarted.
                conn = fresh_conn();
                let first = stats.failures.fetch_add(1, Ordering::Relaxed) == 0;
                // Warn once per outage, not once per retry.
                if stats.connected.swap(false, Ordering::Relaxed) || first {
                    tracing::warn!(error = %e, "container runtime metadata unavailable; events keep path metadata only");
                } else {
                    tracing::debug!(error = %e, "container runtime refresh failed");
                }
                *stats.last_error.lock() = Some(e);
            }
        }
        // Only a successful list marks entries gone; while the runtime is
        // unreachable the last known set is kept as is (it cannot grow).
        cache.expire(Instant::now(), opts.grace);
        if cache.dirty {
            cache.dirty = false;
            *shared.snapshot.write() = Arc::new(cache.snapshot());
            shared.generation.fetch_add(1, Ordering::AcqRel);
        }
        tokio::select! {
            _ = tokio::time::sleep(opts.refresh_interval) => {}
            _ = shared.refresh.notified() => {}
            _ = shared.stop.notified() => return,
        }
    }
}

async fn call<T>(
    what: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        // tonic's own deadline (the endpoint's timeout) usually fires first.
        Ok(Err(s)) if s.code() == tonic::Code::Cancelled && s.message().contains("Timeout") => {
            Err(format!("{what}: no answer within {timeout:?}"))
        }
        Ok(Err(s)) => Err(crate::status_error(what, &s)),
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
    }
}

async fn refresh(
    client: &mut Option<RuntimeServiceClient<Channel>>,
    cache: &mut Cache,
    socket: &std::path::Path,
    opts: &WatcherOptions,
    stats: &WatcherStats,
) -> Result<(), String> {
    let t = opts.call_timeout;
    let c = match client {
        Some(c) => c,
        None => {
            let c = crate::connect(socket, t)
                .await
                .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
            client.insert(c)
        }
    };

    stats.list_calls.fetch_add(1, Ordering::Relaxed);
    let sandboxes = call(
        "ListPodSandbox",
        t,
        c.list_pod_sandbox(api::ListPodSandboxRequest::default()),
    )
    .await?
    .items;
    let mut pod_status = HashMap::new();
    for sb in cache.stale_pods(&sandboxes) {
        stats.status_calls.fetch_add(1, Ordering::Relaxed);
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: sb.id.clone(),
            verbose: true,
        };
        match call("PodSandboxStatus", t, c.pod_sandbox_status(req)).await {
            Ok(r) => {
                pod_status.insert(sb.id.clone(), pod_info(sb, &r));
            }
            // Removed between the list and this call: the next list says so.
            Err(e) if e.contains("NotFound") => {}
            Err(e) => return Err(e),
        }
    }
    cache.update_pods(&sandboxes, pod_status, Instant::now());

    stats.list_calls.fetch_add(1, Ordering::Relaxed);
    let containers = call(
        "ListContainers",
        t,
        c.list_containers(api::ListContainersRequest::default()),
    )
    .await?
    .containers;
    let mut ctr_status = HashMap::new();
    for ct in cache.stale_containers(&containers) {
        stats.status_calls.fetch_add(1, Ordering::Relaxed);
        let req = api::ContainerStatusRequest {
            container_id: ct.id.clone(),
            verbose: true,
        };
        match call("ContainerStatus", t, c.container_status(req)).await {
            Ok(r) => {
                let pod_uid = cache.pod_uid_of(ct);
                if let Some(info) = container_info(ct, &r, pod_uid) {
                    ctr_status.insert(ct.id.clone(), info);
                }
            }
            Err(e) if e.contains("NotFound") => {}
            Err(e) => return Err(e),
        }
    }
    cache.update_containers(&containers, ctr_status, Instant::now());
    Ok(())
}

/// Parses a verbose status' `info` JSON (containerd puts everything under the key "info").
fn verbose_info(info: &BTreeMap<String, String>) -> Option<serde_json::Value> {
    serde_json::from_str(info.get("info")?).ok()
}

fn pod_info(sb: &api::PodSandbox, r: &api::PodSandboxStatusResponse) -> PodInfo {
    let status = r.status.as_ref();
    let meta = status
        .and_then(|s| s.metadata.as_ref())
        .or(sb.metadata.as_ref());
    let info = verbose_info(&r.info);
    let log_directory = info
        .as_ref()
        .and_then(|v| v.pointer("/config/log_directory"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let labels = match status {
        Some(s) if !s.labels.is_empty() => s.labels.clone(),
        _ => sb.labels.clone(),
    };
    let annotations = match status {
        Some(s) if !s.annotations.is_empty() => s.annotations.clone(),
        _ => sb.annotations.clone(),
    };
    PodInfo {
        uid: meta.map(|m| m.uid.clone()).unwrap_or_default(),
        namespace: meta.map(|m| m.namespace.clone()).unwrap_or_default(),
        name: meta.map(|m| m.name.clone()).unwrap_or_default(),
        attempt: meta.map(|m| m.attempt).unwrap_or_default(),
        labels,
        annotations,
        log_directory,
        ready: sb.state == api::PodSandboxState::SandboxReady as i32,
    }
}

fn container_info(
    ct: &api::Container,
    r: &api::ContainerStatusResponse,
    pod_uid: Option<String>,
) -> Option<ContainerInfo> {
    let status = r.status.as_ref();
    let meta = status
        .and_then(|s| s.metadata.as_ref())
        .or(ct.metadata.as_ref());
    let running = ct.state == api::ContainerState::ContainerRunning as i32;
    let pid = if running {
        verbose_info(&r.info)
            .as_ref()
            .and_then(|v| v.get("pid"))
            .and_then(|v| v.as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
    } else {
        None
    };
    // ListContainers gives the image ID; the status has the name the spec used.
    let image = status
        .and_then(|s| s.image.as_ref())
        .map(|i| i.image.clone())
        .filter(|i| !i.is_empty())
        .or_else(|| ct.image.as_ref().map(|i| i.image.clone()))
        .unwrap_or_default();
    let labels = match status {
        Some(s) if !s.labels.is_empty() => s.labels.clone(),
        _ => ct.labels.clone(),
    };
    Some(ContainerInfo {
        id: ct.id.clone(),
        pod_uid: pod_uid.or_else(|| labels.get(POD_UID_LABEL).cloned())?,
        name: meta.map(|m| m.name.clone()).unwrap_or_default(),
        attempt: meta.map(|m| m.attempt).unwrap_or_default(),
        image,
        log_path: status.map(|s| s.log_path.clone()).unwrap_or_default(),
        pid,
        running,
        labels,
    })
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
    dirty: bool,
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

    fn pod_uid_of(&self, ct: &api::Container) -> Option<String> {
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

    /// Drops entries gone for longer than `grace`.
    fn expire(&mut self, now: Instant, grace: Duration) {
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

    fn snapshot(&self) -> Snapshot {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            metadata: Some(api::PodSandboxMetadata {
                name: format!("pod-{id}"),
                uid: format!("uid-{id}"),
                namespace: "ns".into(),
                attempt: 0,
            }),
            state: api::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }
    }

    fn container(id: &str, sb: &str) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: sb.into(),
            metadata: Some(api::ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            }),
            state: api::ContainerState::ContainerRunning as i32,
            ..Default::default()
        }
    }

    /// One refresh as `refresh` does it, with statuses answered from the list entries.
    fn apply(
        cache: &mut Cache,
        sbs: &[api::PodSandbox],
        cts: &[api::Container],
        now: Instant,
    ) -> usize {
        let mut calls = 0;
        let mut ps = HashMap::new();
        for sb in cache.stale_pods(sbs) {
            calls += 1;
            let r = api::PodSandboxStatusResponse::default();
            ps.insert(sb.id.clone(), pod_info(sb, &r));
        }
        cache.update_pods(sbs, ps, now);
        let mut cs = HashMap::new();
        for ct in cache.stale_containers(cts) {
            calls += 1;
            let r = api::ContainerStatusResponse {
                info: [("info".to_string(), r#"{"pid":4242}"#.to_string())].into(),
                ..Default::default()
            };
            let uid = cache.pod_uid_of(ct);
            if let Some(i) = container_info(ct, &r, uid) {
                cs.insert(ct.id.clone(), i);
            }
        }
        cache.update_containers(cts, cs, now);
        calls
    }

    #[test]
    fn many_short_lived_pods_do_not_grow_the_cache() {
        let grace = Duration::from_secs(30);
        let mut cache = Cache::default();
        let t0 = Instant::now();
        // Every second a new pod with one container starts and the previous one
        // vanishes: 5000 pods over time, at most grace/1s + 1 of them kept.
        for i in 0..5000u64 {
            let now = t0 + Duration::from_secs(i);
            let sb = sandbox(&format!("s{i}"));
            let ct = container(&format!("c{i}"), &sb.id);
            apply(&mut cache, &[sb], &[ct], now);
            cache.expire(now, grace);
            assert!(cache.pods.len() <= 31, "pods kept: {}", cache.pods.len());
            assert!(
                cache.containers.len() <= 31,
                "containers kept: {}",
                cache.containers.len()
            );
        }
        let snap = cache.snapshot();
        assert_eq!(snap.pods().count(), 31);
        // The newest is present and running; one that vanished is kept, not ready.
        assert!(snap.pod("uid-s4999").is_some_and(|p| p.ready));
        let old = snap.pod("uid-s4980").expect("within grace");
        assert!(!old.ready);
        let c = snap
            .container("uid-s4980", "main", 0)
            .expect("within grace");
        assert!(!c.running && c.pid.is_none());
        assert_eq!(
            snap.container("uid-s4999", "main", 0).and_then(|c| c.pid),
            Some(4242)
        );
        assert!(snap.pod("uid-s4960").is_none());
        assert!(snap.container_by_id("c4960").is_none());
    }

    #[test]
    fn steady_node_needs_no_status_calls_and_keeps_the_snapshot() {
        let mut cache = Cache::default();
        let now = Instant::now();
        let sbs = [sandbox("a"), sandbox("b")];
        let cts = [container("x", "a"), container("y", "b")];
        assert_eq!(apply(&mut cache, &sbs, &cts, now), 4);
        assert!(cache.dirty);
        cache.dirty = false;
        assert_eq!(apply(&mut cache, &sbs, &cts, now), 0);
        assert!(!cache.dirty);
        // A state change is re-queried and changes the content.
        let mut exited = cts.clone();
        exited[0].state = api::ContainerState::ContainerExited as i32;
        assert_eq!(apply(&mut cache, &sbs, &exited, now), 1);
        assert!(cache.dirty);
        let snap = cache.snapshot();
        let x = snap.container_by_id("x").expect("x");
        assert!(!x.running && x.pid.is_none());
        assert_eq!(x.pod_uid, "uid-a");
    }
}
