//! A small blocking CRI client that plays kubelet's part for tests: it runs
//! pods and containers in a private containerd (`scripts/cri-lab.sh start`),
//! with the same sandbox and container configs `kubelet` would send, so that
//! containerd writes log files and reports metadata exactly as on a node.
//!
//! Pods use the host network (no CNI needed), a per-container PID namespace and
//! a per-pod IPC namespace (kubelet's defaults), and the cgroup parent given to
//! [`Lab::connect`].
//!
//! [`Containerd`] and [`Dockerd`] start and stop private daemons through
//! `scripts/cri-lab.sh` and `scripts/docker-lab.sh` for a test's lifetime.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tonic::transport::Channel;

use crate::api::{self, runtime_service_client::RuntimeServiceClient};

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited with this code.
    Exited(i32),
    /// The runtime does not know.
    Unknown,
}

/// A host directory or file mounted into a container (a `hostPath` volume
/// and its `volumeMount`, as kubelet hands them to the runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path on the host.
    pub host_path: PathBuf,
    /// Where it appears in the container.
    pub container_path: String,
    /// Mounted read-only.
    pub readonly: bool,
}

/// Pod-level settings of [`Lab::run_pod_sandbox_with`] beyond the defaults
/// (host network, the container's own PID namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodOptions {
    /// `hostPID: true`: the pod's containers see the node's processes.
    pub host_pid: bool,
}

/// A container as a pod spec describes it, in CRI terms: what
/// [`Lab::run_container`] creates and starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// An image imported into the `k8s.io` namespace (`localhost/x:1`).
    pub image: String,
    /// The entrypoint (`command:`); empty: the image's.
    pub command: Vec<String>,
    /// Its arguments (`args:`); empty: the image's `Cmd` when `command` is empty too.
    pub args: Vec<String>,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    /// Host paths mounted into the container.
    pub mounts: Vec<Mount>,
    /// `readOnlyRootFilesystem: true`.
    pub readonly_rootfs: bool,
    /// `capabilities.add` (`SYS_PTRACE`, without `CAP_`).
    pub add_capabilities: Vec<String>,
    /// `capabilities.drop` (`ALL` drops every one).
    pub drop_capabilities: Vec<String>,
    /// `runAsUser`; `None`: the image's user.
    pub run_as_user: Option<i64>,
    /// `runAsGroup`; `None`: the image's group.
    pub run_as_group: Option<i64>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    /// `seccompProfile: {type: RuntimeDefault}`: the runtime's default filter.
    pub seccomp_runtime_default: bool,
}

/// A blocking CRI client for tests.
pub struct Lab {
    rt: tokio::runtime::Runtime,
    client: Mutex<RuntimeServiceClient<Channel>>,
    cgroup_parent: String,
    timeout: Duration,
    /// CreateContainer needs the sandbox's config again, as kubelet keeps it.
    pods: Mutex<HashMap<String, api::PodSandboxConfig>>,
}

fn err(what: &str, s: tonic::Status) -> std::io::Error {
    std::io::Error::other(crate::status_error(what, &s))
}

impl Lab {
    /// Connects to the CRI socket; pods go under `cgroup_parent` (e.g. `/crilab`).
    /// Each call is bounded by `timeout`.
    pub fn connect(socket: &Path, cgroup_parent: &str, timeout: Duration) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(crate::connect(socket, timeout))?;
        Ok(Lab {
            rt,
            client: Mutex::new(client),
            cgroup_parent: cgroup_parent.to_string(),
            timeout,
            pods: Mutex::new(HashMap::new()),
        })
    }

    fn call<T, F>(
        &self,
        what: &str,
        f: impl FnOnce(RuntimeServiceClient<Channel>) -> F,
    ) -> std::io::Result<T>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client.lock().clone();
        let timeout = self.timeout;
        self.rt.block_on(async move {
            match tokio::time::timeout(timeout, f(client)).await {
                Ok(Ok(r)) => Ok(r.into_inner()),
                Ok(Err(s)) => Err(err(what, s)),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {timeout:?}"),
                )),
            }
        })
    }

    /// The runtime's name and version ("containerd 1.6.20~ds1"): proves the CRI plugin answers.
    pub fn version(&self) -> std::io::Result<String> {
        let v = self.call("Version", |mut c| async move {
            c.version(api::VersionRequest::default()).await
        })?;
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    /// Runs a pod sandbox as kubelet would; returns the sandbox ID.
    pub fn run_pod_sandbox(
        &self,
        name: &str,
        namespace: &str,
        uid: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        log_dir: &Path,
    ) -> std::io::Result<String> {
        self.run_pod_sandbox_with(
            name,
            namespace,
            uid,
            labels,
            annotations,
            log_dir,
            &PodOptions::default(),
        )
    }

    /// [`Lab::run_pod_sandbox`] with pod-level options (`hostPID`).
    #[allow(clippy::too_many_arguments)] // kubelet's sandbox config, field by field
    pub fn run_pod_sandbox_with(
        &self,
        name: &str,
        namespace: &str,
        uid: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        log_dir: &Path,
        options: &PodOptions,
    ) -> std::io::Result<String> {
        let mut labels = labels.clone();
        labels.insert("io.kubernetes.pod.name".into(), name.into());
        labels.insert("io.kubernetes.pod.namespace".into(), namespace.into());
        labels.insert("io.kubernetes.pod.uid".into(), uid.into());
        let mut annotations = annotations.clone();
        annotations
            .entry("kubernetes.io/config.source".into())
            .or_insert_with(|| "petrel-cri-lab".into());
        std::fs::create_dir_all(log_dir)?;
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            // Unset: with the host network the UTS namespace is the host's.
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels,
            annotations,
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(pod_namespaces(options)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let r = self.call("RunPodSandbox", |mut c| async move {
            c.run_pod_sandbox(req).await
        })?;
        self.pods.lock().insert(r.pod_sandbox_id.clone(), config);
        Ok(r.pod_sandbox_id)
    }

    /// Creates and starts a container in a pod made by [`Lab::run_pod_sandbox`];
    /// `log_path` is relative to the pod's log directory (kubelet: `<name>/<attempt>.log`).
    /// Returns the container ID.
    pub fn create_and_start_container(
        &self,
        pod_id: &str,
        name: &str,
        image: &str,
        command: &[&str],
        log_path: &str,
        attempt: u32,
    ) -> std::io::Result<String> {
        let spec = ContainerSpec {
            image: image.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        self.run_container(pod_id, name, &spec, log_path, attempt)
    }

    /// Creates and starts a container described by `spec` in a pod made by
    /// [`Lab::run_pod_sandbox`] or [`Lab::run_pod_sandbox_with`] (it shares
    /// the pod's PID namespace mode, as kubelet does); `log_path` is relative
    /// to the pod's log directory. Returns the container ID.
    pub fn run_container(
        &self,
        pod_id: &str,
        name: &str,
        spec: &ContainerSpec,
        log_path: &str,
        attempt: u32,
    ) -> std::io::Result<String> {
        let sandbox = self.pods.lock().get(pod_id).cloned().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("pod {pod_id} not run by this lab"),
            )
        })?;
        let meta = sandbox.metadata.clone().unwrap_or_default();
        let labels: BTreeMap<String, String> = [
            ("io.kubernetes.pod.name", meta.name.as_str()),
            ("io.kubernetes.pod.namespace", meta.namespace.as_str()),
            ("io.kubernetes.pod.uid", meta.uid.as_str()),
            ("io.kubernetes.container.name", name),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let annotations: BTreeMap<String, String> = [
            ("io.kubernetes.container.restartCount", attempt.to_string()),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log".into(),
            ),
            ("io.kubernetes.pod.terminationGracePeriod", "30".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        // The container joins the pod's namespaces as the sandbox set them.
        let namespaces = sandbox
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(api::ImageSpec {
                image: spec.image.clone(),
                ..Default::default()
            }),
            command: spec.command.clone(),
            args: spec.args.clone(),
            envs: spec
                .env
                .iter()
                .map(|(k, v)| api::KeyValue {
                    key: k.clone(),
                    value: v.clone().into_bytes(),
                })
                .collect(),
            mounts: spec
                .mounts
                .iter()
                .map(|m| api::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.to_string_lossy().into_owned(),
                    readonly: m.readonly,
                    ..Default::default()
                })
                .collect(),
            log_path: log_path.into(),
            labels,
            annotations,
            linux: Some(api::LinuxContainerConfig {
                security_context: Some(api::LinuxContainerSecurityContext {
                    capabilities: Some(api::Capability {
                        add_capabilities: spec.add_capabilities.clone(),
                        drop_capabilities: spec.drop_capabilities.clone(),
                        ..Default::default()
                    }),
                    namespace_options: namespaces,
                    run_as_user: spec.run_as_user.map(|value| api::Int64Value { value }),
                    run_as_group: spec.run_as_group.map(|value| api::Int64Value { value }),
                    readonly_rootfs: spec.readonly_rootfs,
                    no_new_privs: spec.no_new_privs,
                    seccomp: spec.seccomp_runtime_default.then(|| api::SecurityProfile {
                        profile_type: api::security_profile::ProfileType::RuntimeDefault as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        };
        let id = self
            .call("CreateContainer", |mut c| async move {
                c.create_container(req).await
            })?
            .container_id;
        let req = api::StartContainerRequest {
            container_id: id.clone(),
        };
        self.call("StartContainer", |mut c| async move {
            c.start_container(req).await
        })?;
        Ok(id)
    }

    /// The PID of a running container's first process, as the host sees it
    /// (from the runtime's verbose status), to signal it or read its `/proc`.
    pub fn container_pid(&self, id: &str) -> std::io::Result<u32> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let r = self.call("ContainerStatus", |mut c| async move {
            c.container_status(req).await
        })?;
        r.info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| v.get("pid")?.as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
            .ok_or_else(|| std::io::Error::other(format!("no pid for container {id}")))
    }

    /// The container's state.
    pub fn container_state(&self, id: &str) -> std::io::Result<ContainerState> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self.call("ContainerStatus", |mut c| async move {
            c.container_status(req).await
        })?;
        let s = r.status.unwrap_or_default();
        Ok(match api::ContainerState::try_from(s.state) {
            Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
            Ok(api::ContainerState::ContainerRunning) => ContainerState::Running,
            Ok(api::ContainerState::ContainerExited) => ContainerState::Exited(s.exit_code),
            _ => ContainerState::Unknown,
        })
    }

    /// Stops a container, killing it after `timeout_s` seconds (0: at once).
    pub fn stop_container(&self, id: &str, timeout_s: i64) -> std::io::Result<()> {
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout: timeout_s,
        };
        self.call("StopContainer", |mut c| async move {
            c.stop_container(req).await
        })?;
        Ok(())
    }

    /// Stops every container of the pod and the sandbox.
    pub fn stop_pod(&self, pod_id: &str) -> std::io::Result<()> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: pod_id.into(),
        };
        self.call("StopPodSandbox", |mut c| async move {
            c.stop_pod_sandbox(req).await
        })?;
        Ok(())
    }

    /// Removes a stopped pod and its containers from the runtime (log files stay).
    pub fn remove_pod(&self, pod_id: &str) -> std::io::Result<()> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod_id.into(),
        };
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(req).await
        })?;
        self.pods.lock().remove(pod_id);
        Ok(())
    }

    /// IDs of every pod sandbox the runtime knows.
    pub fn list_pods(&self) -> std::io::Result<Vec<String>> {
        let r = self.call("ListPodSandbox", |mut c| async move {
            c.list_pod_sandbox(api::ListPodSandboxRequest::default())
                .await
        })?;
        Ok(r.items.into_iter().map(|p| p.id).collect())
    }
}

/// kubelet's namespace choice: the node's network (no CNI in the lab), the
/// pod's IPC, the node's or the container's own PIDs.
fn pod_namespaces(options: &PodOptions) -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Node as i32,
        pid: if options.host_pid {
            api::NamespaceMode::Node
        } else {
            api::NamespaceMode::Container
        } as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// This repository's `scripts/` directory (the lab feature is for this workspace's tests).
fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Distinguishes daemons started by one test process.
static SEQ: AtomicUsize = AtomicUsize::new(0);

fn run_script(script: &str, args: &[&str], env: &[(&str, &OsStr)]) -> std::io::Result<Output> {
    let mut cmd = Command::new("bash");
    cmd.arg(scripts_dir().join(script)).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A private containerd with its CRI plugin, started by `scripts/cri-lab.sh start`
/// in a temp dir of its own (root, state, socket, pod logs under `pods/`) with its
/// own cgroup parent; `scripts/cri-lab.sh stop` runs on drop, also when a test
/// panics, so no containerd, shim, container, mount or cgroup is left behind.
/// Images come from `$CRILAB_CACHE` (default `<repo>/.cache/crilab`), built once
/// by `scripts/cri-lab.sh setup`.
pub struct Containerd {
    dir: tempfile::TempDir,
    cgroup: String,
    cache: PathBuf,
}

impl Containerd {
    /// Starts it; returns when the CRI plugin answers (the script waits at most 60 s).
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("petrel-cri-").tempdir()?;
        let cache = std::env::var_os("CRILAB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| scripts_dir().join("../.cache/crilab"));
        let me = Containerd {
            dir,
            cgroup: format!(
                "petrel-cri-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ),
            cache,
        };
        let out = me.script(&["start"])?;
        if !out.status.success() {
            // `me` drops here and stops whatever did start.
            return Err(std::io::Error::other(format!(
                "scripts/cri-lab.sh start failed (run `scripts/cri-lab.sh setup` once first): {}\ncontainerd.log:\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                me.log_tail(20)
            )));
        }
        Ok(me)
    }

    fn script(&self, args: &[&str]) -> std::io::Result<Output> {
        run_script(
            "cri-lab.sh",
            args,
            &[
                ("CRILAB_DIR", self.dir.path().as_os_str()),
                ("CRILAB_CACHE", self.cache.as_os_str()),
                ("CRILAB_CGROUP", OsStr::new(&self.cgroup)),
            ],
        )
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// Where pods' log directories go (kubelet's `/var/log/pods`).
    pub fn pods_dir(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    /// The cgroup parent pods must use (`/petrel-cri-<pid>-<n>`).
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.cgroup)
    }

    /// A client that runs pods in this containerd (60 s per call).
    pub fn client(&self) -> std::io::Result<Lab> {
        Lab::connect(
            &self.socket(),
            &self.cgroup_parent(),
            Duration::from_secs(60),
        )
    }

    /// Runs `ctr` against this containerd in the `k8s.io` namespace (the
    /// CRI plugin's), e.g. `images import` of an OCI archive; returns its
    /// trimmed stdout, or an error with its stderr.
    pub fn ctr(&self, args: &[&str]) -> std::io::Result<String> {
        let mut all = vec!["ctr"];
        all.extend_from_slice(args);
        let out = self.script(&all)?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "ctr {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// containerd's PID (to freeze it with SIGSTOP, say).
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join("containerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The last `n` lines of containerd's log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.dir.path().join("containerd.log"), n)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("containerd.log (tail):\n{}", self.log_tail(20));
        }
        match self.script(&["stop"]) {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("cri-lab.sh stop: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cri-lab.sh stop: {e}"),
        }
    }
}

/// A private Docker daemon (Debian's docker.io) started by `scripts/docker-lab.sh start`
/// in a temp dir of its own, with a busybox image `localhost/dockerlab/busybox:1`;
/// `scripts/docker-lab.sh stop` runs on drop. `scripts/docker-lab.sh setup` installs it.
pub struct Dockerd {
    dir: tempfile::TempDir,
}

impl Dockerd {
    /// The image every lab daemon has.
    pub const IMAGE: &'static str = "localhost/dockerlab/busybox:1";

    /// Starts it; returns when it answers (the script waits at most 60 s).
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("petrel-docker-")
            .tempdir()?;
        let me = Dockerd { dir };
        let out = me.script(&["start"])?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "scripts/docker-lab.sh start failed (run `scripts/docker-lab.sh setup` once first): {}\ndockerd.log:\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                me.log_tail(20)
            )));
        }
        Ok(me)
    }

    fn script(&self, args: &[&str]) -> std::io::Result<Output> {
        run_script(
            "docker-lab.sh",
            args,
            &[("DOCKERLAB_DIR", self.dir.path().as_os_str())],
        )
    }

    /// The Engine API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// Runs the docker CLI against this daemon; returns its trimmed stdout.
    pub fn docker(&self, args: &[&str]) -> std::io::Result<String> {
        let mut all = vec!["docker"];
        all.extend_from_slice(args);
        let out = self.script(&all)?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "docker {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The last `n` lines of dockerd's log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.dir.path().join("dockerd.log"), n)
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("dockerd.log (tail):\n{}", self.log_tail(20));
        }
        match self.script(&["stop"]) {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("docker-lab.sh stop: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("docker-lab.sh stop: {e}"),
        }
    }
}
