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
use crate::model::{Cache, ContainerInfo, PodInfo, Snapshot, WatcherStats};

/// Kubelet's label on containers naming their pod's UID; used when a container's
/// sandbox is not (yet) in the cache.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

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
            let (pods, containers) = cache.tracked();
            assert!(pods <= 31, "pods kept: {pods}");
            assert!(containers <= 31, "containers kept: {containers}");
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
