//! A small blocking CRI client that plays kubelet's part for tests: it runs
//! pods and containers in a private containerd (`scripts/cri-lab.sh start`),
//! with the same sandbox and container configs `kubelet` would send, so that
//! containerd writes log files and reports metadata exactly as on a node.
//!
//! Pods use the host network (no CNI needed), a per-container PID namespace and
//! a per-pod IPC namespace (kubelet's defaults), and the cgroup parent given to
//! [`Lab::connect`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
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
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Node as i32,
                        pid: api::NamespaceMode::Container as i32,
                        ipc: api::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
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
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: log_path.into(),
            labels,
            annotations,
            linux: Some(api::LinuxContainerConfig::default()),
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
