//! The DaemonSet of `deploy/kubernetes/` run for real: the image of
//! `scripts/image.sh` imported into a private containerd
//! (`scripts/cri-lab.sh`, whose `setup` the test command runs first), and
//! the Petrel container run through CRI with the manifest's own args, env,
//! securityContext and volume mounts, the host paths pointed at the lab
//! (its `pods/` plays `/var/log/pods`, its socket containerd's), and the
//! ConfigMap's pipelines mounted where the manifest mounts them. Other pods
//! print numbered lines; every one arrives with its pod's metadata, also
//! across a `kill -9` of the agent (a new container resumes from the
//! checkpoints on the same host path). Then the overlay
//! `deploy/kubernetes-overlays/container-files` (hostPID, SYS_PTRACE, a `container_files`
//! pipeline) the same way, with a pod writing a file inside its container.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use marked_yaml::types::MarkedMappingNode;
use marked_yaml::Node;
use petrel_cri::lab::{ContainerSpec, ContainerState, Containerd, Lab, Mount, PodOptions};

const BUSYBOX: &str = "localhost/crilab/busybox:1";
/// The node name the downward API would give (`spec.nodeName`).
const NODE: &str = "lab-node-1";
/// The annotation the overlay's `container_files` pipeline selects on.
const FILES_ANNOTATION: (&str, &str) = ("petrel.io/container-files", "true");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// ------------------------------------------------------------ the manifests

fn parse(path: &Path) -> Node {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    marked_yaml::parse_yaml(0, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The node at `path` under `m`, or `None`.
fn at<'a>(m: &'a MarkedMappingNode, path: &[&str]) -> Option<&'a Node> {
    let (first, rest) = path.split_first()?;
    let n = m.get_node(first)?;
    if rest.is_empty() {
        Some(n)
    } else {
        at(n.as_mapping()?, rest)
    }
}

fn map<'a>(m: &'a MarkedMappingNode, path: &[&str]) -> &'a MarkedMappingNode {
    at(m, path)
        .and_then(Node::as_mapping)
        .unwrap_or_else(|| panic!("the manifest has no mapping at {path:?}"))
}

fn str_at(m: &MarkedMappingNode, path: &[&str]) -> Option<String> {
    at(m, path)
        .and_then(Node::as_scalar)
        .map(|s| s.as_str().to_string())
}

fn strs(n: Option<&Node>) -> Vec<String> {
    n.and_then(Node::as_sequence)
        .map(|s| {
            s.iter()
                .map(|n| {
                    n.as_scalar()
                        .unwrap_or_else(|| panic!("a list of strings expected: {n:?}"))
                        .as_str()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn bool_at(m: &MarkedMappingNode, path: &[&str]) -> Option<bool> {
    at(m, path)
        .and_then(Node::as_scalar)
        .and_then(|s| s.as_bool())
}

/// A volume of the pod spec.
#[derive(Debug, Clone)]
enum Volume {
    HostPath(String),
    ConfigMap(String),
}

/// What the DaemonSet's pod template asks of the runtime for its container.
#[derive(Debug, Clone)]
struct PodTemplate {
    container: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// (volume name, mount path, read-only)
    mounts: Vec<(String, String, bool)>,
    volumes: HashMap<String, Volume>,
    host_pid: bool,
    run_as_user: Option<i64>,
    run_as_group: Option<i64>,
    no_new_privs: bool,
    readonly_rootfs: bool,
    caps_add: Vec<String>,
    caps_drop: Vec<String>,
    seccomp_runtime_default: bool,
    readiness_path: String,
    grace_seconds: i64,
}

/// Downward-API values as the kubelet would fill them, for this test.
fn field_ref(path: &str) -> String {
    match path {
        "spec.nodeName" => NODE.into(),
        "metadata.name" => "petrel-lab".into(),
        "metadata.namespace" => "petrel".into(),
        "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
        other => panic!("the DaemonSet uses fieldRef {other}, which this test does not fill"),
    }
}

fn pod_template(daemonset: &Path) -> PodTemplate {
    let doc = parse(daemonset);
    let root = doc.as_mapping().expect("a mapping");
    assert_eq!(str_at(root, &["kind"]).as_deref(), Some("DaemonSet"));
    let spec = map(root, &["spec", "template", "spec"]);
    let containers = at(spec, &["containers"])
        .and_then(Node::as_sequence)
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container expected");
    let c = containers[0].as_mapping().expect("a container");
    assert!(
        at(c, &["command"]).is_none(),
        "the manifest sets no command: the image's entrypoint runs"
    );
    let mut env = Vec::new();
    for e in at(c, &["env"])
        .and_then(Node::as_sequence)
        .map(|s| s.to_vec())
        .unwrap_or_default()
    {
        let e = e.as_mapping().expect("an env entry");
        let name = str_at(e, &["name"]).expect("env name");
        let value = match str_at(e, &["value"]) {
            Some(v) => v,
            None => field_ref(
                &str_at(e, &["valueFrom", "fieldRef", "fieldPath"])
                    .unwrap_or_else(|| panic!("env {name}: only value and fieldRef are handled")),
            ),
        };
        env.push((name, value));
    }
    let mounts = at(c, &["volumeMounts"])
        .and_then(Node::as_sequence)
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let m = m.as_mapping().expect("a volumeMount");
            (
                str_at(m, &["name"]).expect("mount name"),
                str_at(m, &["mountPath"]).expect("mountPath"),
                bool_at(m, &["readOnly"]).unwrap_or(false),
            )
        })
        .collect();
    let mut volumes = HashMap::new();
    for v in at(spec, &["volumes"])
        .and_then(Node::as_sequence)
        .expect("volumes")
        .iter()
    {
        let v = v.as_mapping().expect("a volume");
        let name = str_at(v, &["name"]).expect("volume name");
        let vol = if let Some(p) = str_at(v, &["hostPath", "path"]) {
            Volume::HostPath(p)
        } else if let Some(cm) = str_at(v, &["configMap", "name"]) {
            Volume::ConfigMap(cm)
        } else {
            panic!("volume {name}: only hostPath and configMap are handled")
        };
        volumes.insert(name, vol);
    }
    let sc = map(c, &["securityContext"]);
    assert_ne!(
        bool_at(sc, &["privileged"]),
        Some(true),
        "a privileged container"
    );
    let int = |p: &[&str]| {
        str_at(sc, p).map(|s| {
            s.parse::<i64>()
                .unwrap_or_else(|e| panic!("{p:?}: `{s}`: {e}"))
        })
    };
    PodTemplate {
        container: str_at(c, &["name"]).expect("container name"),
        args: strs(at(c, &["args"])),
        env,
        mounts,
        volumes,
        host_pid: bool_at(spec, &["hostPID"]).unwrap_or(false),
        run_as_user: int(&["runAsUser"]),
        run_as_group: int(&["runAsGroup"]),
        no_new_privs: bool_at(sc, &["allowPrivilegeEscalation"]) == Some(false),
        readonly_rootfs: bool_at(sc, &["readOnlyRootFilesystem"]).unwrap_or(false),
        caps_add: strs(at(sc, &["capabilities", "add"])),
        caps_drop: strs(at(sc, &["capabilities", "drop"])),
        seccomp_runtime_default: str_at(sc, &["seccompProfile", "type"])
            .or_else(|| str_at(spec, &["securityContext", "seccompProfile", "type"]))
            .as_deref()
            == Some("RuntimeDefault"),
        readiness_path: str_at(c, &["readinessProbe", "httpGet", "path"])
            .expect("readinessProbe.httpGet.path"),
        grace_seconds: str_at(spec, &["terminationGracePeriodSeconds"])
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    }
}

/// The overlay's strategic merge patches, applied the way kustomize does
/// for the fields they set (scripts/check-kubernetes.sh checks kustomize's
/// build changes exactly these): hostPID, added capabilities, added
/// pipelines.
fn apply_overlay(
    base: &PodTemplate,
    pipelines: &BTreeMap<String, String>,
    overlay: &Path,
) -> (PodTemplate, BTreeMap<String, String>) {
    let mut t = base.clone();
    let ds = parse(&overlay.join("daemonset.yaml"));
    let ds = ds.as_mapping().expect("a mapping");
    let spec = map(ds, &["spec", "template", "spec"]);
    if let Some(h) = bool_at(spec, &["hostPID"]) {
        t.host_pid = h;
    }
    for c in at(spec, &["containers"])
        .and_then(Node::as_sequence)
        .map(|s| s.to_vec())
        .unwrap_or_default()
    {
        let c = c.as_mapping().expect("a container");
        assert_eq!(str_at(c, &["name"]), Some(t.container.clone()));
        for cap in strs(at(c, &["securityContext", "capabilities", "add"])) {
            if !t.caps_add.contains(&cap) {
                t.caps_add.push(cap);
            }
        }
    }
    let mut p = pipelines.clone();
    p.extend(configmap_data(&overlay.join("configmap.yaml")));
    (t, p)
}

fn configmap_data(path: &Path) -> BTreeMap<String, String> {
    let doc = parse(path);
    let root = doc.as_mapping().expect("a mapping");
    assert_eq!(str_at(root, &["kind"]).as_deref(), Some("ConfigMap"));
    map(root, &["data"])
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.as_scalar().expect("a text value").as_str().to_string(),
            )
        })
        .collect()
}

/// The pipeline with its `http` sink's URL pointed at the test's server
/// (the only change: sources, processors, encoding and compression are
/// the manifest's). A sink of another type fails the test, so a changed
/// ConfigMap is looked at rather than silently bypassed.
fn with_sink_url(text: &str, url: &str) -> String {
    let doc = marked_yaml::parse_yaml(0, text).expect("the pipeline parses");
    let sinks = at(doc.as_mapping().expect("a mapping"), &["sinks"])
        .and_then(Node::as_sequence)
        .expect("sinks");
    assert_eq!(sinks.len(), 1, "one sink expected");
    let sink = sinks[0].as_mapping().expect("a sink");
    assert_eq!(str_at(sink, &["type"]).as_deref(), Some("http"));
    let old = str_at(sink, &["url"]).expect("the sink's url");
    assert_eq!(text.matches(old.as_str()).count(), 1, "`{old}` once");
    text.replace(old.as_str(), url)
}

// ------------------------------------------------------------ the collector

/// One event the collector received.
#[derive(Debug, Clone)]
struct Received {
    event: serde_json::Value,
    at: Instant,
}

/// An HTTP server on 127.0.0.1 taking the sink's gzip ndjson (the lab's
/// pods use the host network, so the agent reaches it there).
fn serve(seen: Arc<Mutex<Vec<Received>>>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the collector");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let app = Router::new().route(
                "/ingest",
                post(move |headers: HeaderMap, body: Bytes| {
                    let seen = seen.clone();
                    async move {
                        let gzip = headers
                            .get("content-encoding")
                            .is_some_and(|v| v.as_bytes() == b"gzip");
                        let mut plain = Vec::new();
                        if gzip {
                            if flate2::read::GzDecoder::new(&body[..])
                                .read_to_end(&mut plain)
                                .is_err()
                            {
                                return StatusCode::BAD_REQUEST;
                            }
                        } else {
                            plain = body.to_vec();
                        }
                        let now = Instant::now();
                        let mut events = Vec::new();
                        for line in plain.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                            match serde_json::from_slice(line) {
                                Ok(event) => events.push(Received { event, at: now }),
                                Err(_) => return StatusCode::BAD_REQUEST,
                            }
                        }
                        seen.lock().expect("lock").extend(events);
                        StatusCode::OK
                    }
                }),
            );
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            axum::serve(l, app).await.expect("serve");
        });
    });
    addr
}

fn s<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

/// Events whose message is `<prefix>-<n>`: n -> how many times, plus the
/// first arrival of each.
fn tally(seen: &Mutex<Vec<Received>>, prefix: &str) -> BTreeMap<u32, (usize, Instant)> {
    let mut t: BTreeMap<u32, (usize, Instant)> = BTreeMap::new();
    for r in seen.lock().expect("lock").iter() {
        let n = s(&r.event, "message")
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse().ok());
        if let Some(n) = n {
            let e = t.entry(n).or_insert((0, r.at));
            e.0 += 1;
            e.1 = e.1.min(r.at);
        }
    }
    t
}

fn wait_all(seen: &Mutex<Vec<Received>>, prefix: &str, n: u32, timeout: Duration) {
    wait_for(
        timeout,
        &format!("{prefix}-1..{prefix}-{n} received"),
        || {
            let t = tally(seen, prefix);
            let missing: Vec<u32> = (1..=n).filter(|i| !t.contains_key(i)).collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} missing, first {:?}",
                    missing.len(),
                    &missing[..missing.len().min(5)]
                ))
            }
        },
    );
}

/// Every `<prefix>-<n>` event carries the pod's metadata.
fn assert_metadata(seen: &Mutex<Vec<Received>>, prefix: &str, pod: &str, ns: &str, c: &str) {
    let want = format!("{prefix}-");
    let all = seen.lock().expect("lock").clone();
    let mine: Vec<_> = all
        .iter()
        .filter(|r| s(&r.event, "message").starts_with(&want))
        .collect();
    assert!(!mine.is_empty(), "no {prefix} event");
    for r in mine {
        let e = &r.event;
        assert_eq!(
            (
                s(e, "k8s.pod_name"),
                s(e, "k8s.namespace"),
                s(e, "k8s.container_name"),
                s(e, "k8s.node_name")
            ),
            (pod, ns, c, NODE),
            "{e}"
        );
        assert_eq!(s(e, "container.image"), BUSYBOX, "{e}");
    }
}

// ------------------------------------------------------------ the agent's pod

/// The host side of each of the manifest's volumes, in the lab.
struct HostPaths {
    pods: PathBuf,
    socket: PathBuf,
    data: PathBuf,
    docker: PathBuf,
    pipelines: PathBuf,
}

fn spec_for(t: &PodTemplate, image: &str, api_port: u16, hp: &HostPaths) -> ContainerSpec {
    // The manifest binds the API on 0.0.0.0:8686 in the pod's own network
    // namespace; lab pods share the host's, where the test keeps to
    // 127.0.0.1 and a free port. The only argument changed.
    let mut args = t.args.clone();
    let api = args
        .iter_mut()
        .find(|a| a.starts_with("--api-addr="))
        .expect("the DaemonSet passes --api-addr=");
    *api = format!("--api-addr=127.0.0.1:{api_port}");
    let mounts = t
        .mounts
        .iter()
        .map(|(vol, path, ro)| {
            let host = match t.volumes.get(vol) {
                Some(Volume::ConfigMap(name)) => {
                    assert_eq!(name, "petrel-pipelines");
                    hp.pipelines.clone()
                }
                Some(Volume::HostPath(p)) => match p.as_str() {
                    "/var/log/pods" => hp.pods.clone(),
                    "/var/lib/petrel" => hp.data.clone(),
                    "/var/lib/docker/containers" => hp.docker.clone(),
                    "/run/containerd/containerd.sock" => hp.socket.clone(),
                    // The node's journal (for a journald source): empty
                    // stand-ins, mounted read-only as the manifest says.
                    "/var/log/journal" | "/run/log/journal" => {
                        let d = hp
                            .data
                            .with_file_name(format!("journal{}", p.replace('/', "-")));
                        std::fs::create_dir_all(&d).expect("journal stand-in");
                        d
                    }
                    "/etc/machine-id" => {
                        let f = hp.data.with_file_name("machine-id");
                        std::fs::write(&f, "0123456789abcdef0123456789abcdef\n")
                            .expect("machine-id stand-in");
                        f
                    }
                    other => panic!("hostPath {other}: not mapped to the lab by this test"),
                },
                None => panic!("volumeMount of an undeclared volume {vol}"),
            };
            Mount {
                host_path: host,
                container_path: path.clone(),
                readonly: *ro,
            }
        })
        .collect();
    ContainerSpec {
        image: image.into(),
        command: Vec::new(),
        args,
        env: t.env.clone(),
        mounts,
        readonly_rootfs: t.readonly_rootfs,
        add_capabilities: t.caps_add.clone(),
        drop_capabilities: t.caps_drop.clone(),
        run_as_user: t.run_as_user,
        run_as_group: t.run_as_group,
        no_new_privs: t.no_new_privs,
        seccomp_runtime_default: t.seccomp_runtime_default,
    }
}

fn http_status(port: u16, path: &str) -> std::io::Result<u16> {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = String::new();
    c.read_to_string(&mut head)?;
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in `{head}`")))
}

/// One value of `/proc/<pid>/status` (`CapEff`, `NoNewPrivs`...).
fn proc_status(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// The agent's container as the kernel sees it: the manifest's uid, no
/// capability but those added, no_new_privs, a seccomp filter, and a
/// read-only root, so that the run proves the manifest's settings are
/// enough, not the lab's defaults.
fn assert_confined(lab: &Lab, id: &str, t: &PodTemplate) {
    let pid = lab.container_pid(id).expect("the agent's pid");
    let uid = proc_status(pid, "Uid");
    assert!(
        uid.split_whitespace()
            .all(|u| Some(u) == t.run_as_user.map(|u| u.to_string()).as_deref()),
        "Uid {uid}"
    );
    // CAP_SYS_PTRACE is bit 19; nothing else may be left.
    let want: u64 = t
        .caps_add
        .iter()
        .map(|c| match c.as_str() {
            "SYS_PTRACE" => 1 << 19,
            other => panic!("capability {other}: its bit is not known to this test"),
        })
        .sum();
    for key in ["CapEff", "CapPrm", "CapBnd"] {
        let v = u64::from_str_radix(&proc_status(pid, key), 16).expect("hex caps");
        assert_eq!(v, want, "{key} {v:#x}, want {want:#x}");
    }
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(proc_status(pid, "Seccomp"), "2", "seccomp filter mode");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let root = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .expect("the root mount");
    assert!(
        root.split(' ')
            .nth(5)
            .is_some_and(|o| o.split(',').any(|x| x == "ro")),
        "root mounted read-write: {root}"
    );
}

struct AgentPod<'a> {
    lab: &'a Lab,
    pod: String,
    template: PodTemplate,
    spec: ContainerSpec,
    port: u16,
    attempt: u32,
    id: Option<String>,
}

impl<'a> AgentPod<'a> {
    fn start(
        lab: &'a Lab,
        cd: &Containerd,
        name: &str,
        template: PodTemplate,
        spec: ContainerSpec,
        port: u16,
    ) -> Self {
        let uid = format!("0e0d0c0b-0000-4000-8000-{:012}", port);
        let pod = lab
            .run_pod_sandbox_with(
                name,
                "petrel",
                &uid,
                &BTreeMap::from([("app.kubernetes.io/name".into(), "petrel".into())]),
                &BTreeMap::new(),
                &cd.pods_dir().join(format!("petrel_{name}_{uid}")),
                &PodOptions {
                    host_pid: template.host_pid,
                },
            )
            .expect("run the agent's pod");
        let mut me = AgentPod {
            lab,
            pod,
            template,
            spec,
            port,
            attempt: 0,
            id: None,
        };
        me.start_container();
        me
    }

    /// A new container in the pod (kubelet's restart: the next attempt,
    /// the same mounts), running until its readiness probe answers 200.
    fn start_container(&mut self) {
        let log = format!("{}/{}.log", self.template.container, self.attempt);
        let id = self
            .lab
            .run_container(
                &self.pod,
                &self.template.container,
                &self.spec,
                &log,
                self.attempt,
            )
            .unwrap_or_else(|e| panic!("start the agent's container: {e}"));
        self.attempt += 1;
        let path = self.template.readiness_path.clone();
        wait_for(LONG, "the agent's readiness probe", || {
            if let Ok(ContainerState::Exited(code)) = self.lab.container_state(&id) {
                panic!("the agent exited with {code}");
            }
            match http_status(self.port, &path) {
                Ok(200) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        assert_confined(self.lab, &id, &self.template);
        self.id = Some(id);
    }

    /// kill -9 (a StopContainer with no grace period).
    fn kill(&mut self) {
        let id = self.id.take().expect("a running agent");
        self.lab.stop_container(&id, 0).expect("kill the agent");
        let state = self.lab.container_state(&id).expect("state");
        assert!(
            matches!(state, ContainerState::Exited(c) if c != 0),
            "killed: {state:?}"
        );
    }

    /// SIGTERM with the manifest's grace period; the agent must exit 0 in it.
    fn stop(&mut self) {
        let id = self.id.take().expect("a running agent");
        let t0 = Instant::now();
        self.lab
            .stop_container(&id, self.template.grace_seconds)
            .expect("stop the agent");
        assert_eq!(
            self.lab.container_state(&id).expect("state"),
            ContainerState::Exited(0),
            "a clean stop exits 0 (after {:?})",
            t0.elapsed()
        );
        self.lab.stop_pod(&self.pod).expect("stop the agent's pod");
    }
}

/// A busybox pod `name` in `ns`, container `app`, running `script`.
fn writer(
    lab: &Lab,
    cd: &Containerd,
    name: &str,
    ns: &str,
    uid: &str,
    annotations: &[(&str, &str)],
    script: &str,
) -> String {
    let annotations: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let pod = lab
        .run_pod_sandbox(
            name,
            ns,
            uid,
            &BTreeMap::new(),
            &annotations,
            &cd.pods_dir().join(format!("{ns}_{name}_{uid}")),
        )
        .unwrap_or_else(|e| panic!("run pod {name}: {e}"));
    lab.create_and_start_container(&pod, "app", BUSYBOX, &["sh", "-c", script], "app/0.log", 0)
        .unwrap_or_else(|e| panic!("start {name}/app: {e}"))
}

/// Prints (or appends to `file`) `<prefix>-1..<prefix>-n`, `usleep` µs
/// apart, then stays up.
fn numbered(prefix: &str, n: u32, usleep: u32, file: Option<&str>) -> String {
    let to = file.map(|f| format!(" >> {f}")).unwrap_or_default();
    format!(
        "i=1; while [ $i -le {n} ]; do echo {prefix}-$i{to}; i=$((i+1)); usleep {usleep}; done; exec sleep 600"
    )
}

/// The lines `<prefix>-<n>` that lie wholly below the offset the agent
/// had checkpointed for the file it read them from, read after its kill -9:
/// the README's bound is that only what was delivered after the last
/// checkpoint write may be sent again. `hp` maps the agent's paths (its
/// `file` field) to the host's.
fn checkpointed(seen: &Mutex<Vec<Received>>, prefix: &str, hp: &HostPaths) -> BTreeSet<u32> {
    let file = seen
        .lock()
        .expect("lock")
        .iter()
        .find(|r| s(&r.event, "message").starts_with(&format!("{prefix}-")))
        .map(|r| s(&r.event, "file").to_string())
        .expect("a delivered line");
    let text = std::fs::read_to_string(hp.data.join("checkpoints.json")).expect("checkpoints.json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("checkpoints.json is JSON");
    let offset = doc["sources"]
        .as_object()
        .expect("sources")
        .values()
        .flat_map(|entries| entries.as_array().into_iter().flatten())
        .filter(|e| e["path"].as_str() == Some(file.as_str()))
        .filter_map(|e| e["offset"].as_u64())
        .max()
        .unwrap_or(0);
    // The container log directory is a host path of the pod; files inside
    // containers are read through /proc/<pid>/root, the host's own /proc.
    let on_host = match file.strip_prefix("/var/log/pods/") {
        Some(rest) => hp.pods.join(rest),
        None => PathBuf::from(&file),
    };
    let data = std::fs::read(&on_host).unwrap_or_else(|e| panic!("{}: {e}", on_host.display()));
    let mut below = BTreeSet::new();
    let mut end = 0u64;
    for line in data.split_inclusive(|&b| b == b'\n') {
        end += line.len() as u64;
        if end > offset {
            break;
        }
        // A CRI record ("<time> stdout F <text>") or a plain line.
        let text = String::from_utf8_lossy(line);
        let message = text.trim_end().rsplit(' ').next().unwrap_or_default();
        if let Some(n) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse().ok())
        {
            below.insert(n);
        }
    }
    below
}

/// Kills the agent while `prefix` lines are being written, starts its
/// next container a second later, and checks that every line arrives;
/// duplicates only of lines past the offset checkpointed before the kill,
/// each at most twice.
fn kill_while_writing(
    agent: &mut AgentPod<'_>,
    lab: &Lab,
    writer_id: &str,
    seen: &Mutex<Vec<Received>>,
    prefix: &str,
    n: u32,
    hp: &HostPaths,
) {
    // Killed once lines were delivered for a few checkpoint writes (one a
    // second), so that the bound below excludes some (it would check
    // nothing otherwise; asserted below).
    wait_for(
        LONG,
        &format!("{prefix} lines delivered for a while"),
        || {
            let t = tally(seen, prefix);
            let oldest = t.values().map(|v| v.1).min();
            match oldest {
                Some(o) if t.len() >= 200 && o.elapsed() > Duration::from_secs(4) => Ok(()),
                _ => Err(format!("{} so far", t.len())),
            }
        },
    );
    agent.kill();
    let at_kill = tally(seen, prefix).len();
    let below = checkpointed(seen, prefix, hp);
    assert!(
        at_kill < n as usize,
        "all {n} delivered before the kill: write more or slower"
    );
    assert_eq!(
        lab.container_state(writer_id).expect("writer state"),
        ContainerState::Running,
        "lines keep being written while the agent is down"
    );
    std::thread::sleep(Duration::from_secs(1));
    agent.start_container();
    wait_all(seen, prefix, n, Duration::from_secs(120));
    let t = tally(seen, prefix);
    let dups: Vec<(u32, usize)> = t
        .iter()
        .filter(|(_, (c, _))| *c > 1)
        .map(|(i, (c, _))| (*i, *c))
        .collect();
    assert!(!below.is_empty(), "nothing checkpointed before the kill");
    eprintln!(
        "{prefix}: {n} lines, {at_kill} delivered before the kill -9 ({} of them below the \
         checkpointed offset), {} delivered twice",
        below.len(),
        dups.len()
    );
    for (i, c) in &dups {
        assert_eq!(*c, 2, "{prefix}-{i} delivered {c} times");
        assert!(
            !below.contains(i),
            "{prefix}-{i} lay below the checkpointed offset, yet was sent again"
        );
    }
}

fn import_image(cd: &Containerd, dir: &Path) -> String {
    let tar = dir.join("petrel-oci.tar");
    let out = Command::new("bash")
        .arg(repo().join("scripts/image.sh"))
        .env("PETREL", bin())
        .env("OUT", &tar)
        .output()
        .expect("run scripts/image.sh");
    assert!(
        out.status.success(),
        "scripts/image.sh failed (umoci comes with `scripts/cri-lab.sh setup`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let size = std::fs::metadata(&tar).expect("the archive").len();
    assert!(size <= 30_000_000, "{size} bytes");
    let base = "localhost/petrel";
    cd.ctr(&[
        "images",
        "import",
        "--base-name",
        base,
        &tar.to_string_lossy(),
    ])
    .unwrap_or_else(|e| panic!("ctr images import: {e}"));
    let image = format!("{base}:{}", env!("CARGO_PKG_VERSION"));
    let list = cd.ctr(&["images", "ls", "-q"]).expect("ctr images ls");
    assert!(
        list.lines().any(|l| l == image),
        "{image} not among the imported images:\n{list}"
    );
    image
}

#[test]
fn the_daemonset_and_its_container_files_overlay_in_a_real_containerd() {
    let cd = Containerd::start().expect("start containerd (scripts/cri-lab.sh setup first)");
    let lab = cd.client().expect("CRI client");
    let dir = tempdir();
    let image = import_image(&cd, dir.path());

    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = format!("http://{}/ingest", serve(seen.clone()));
    let manifests = repo().join("deploy/kubernetes");
    let base = pod_template(&manifests.join("daemonset.yaml"));
    let base_pipelines = configmap_data(&manifests.join("configmap.yaml"));
    let mk = |name: &str| {
        let p = dir.path().join(name);
        std::fs::create_dir_all(&p).expect("mkdir");
        p
    };
    let write_pipelines = |to: &Path, pipelines: &BTreeMap<String, String>| {
        for (key, text) in pipelines {
            std::fs::write(to.join(key), with_sink_url(text, &url)).expect("write pipeline");
        }
    };
    let hp = HostPaths {
        pods: cd.pods_dir(),
        socket: cd.socket(),
        data: mk("var-lib-petrel"),
        docker: mk("var-lib-docker-containers"),
        pipelines: mk("pipelines"),
    };
    write_pipelines(&hp.pipelines, &base_pipelines);

    // The base DaemonSet.
    let port = free_port();
    let mut agent = AgentPod::start(
        &lab,
        &cd,
        "petrel-base",
        base.clone(),
        spec_for(&base, &image, port, &hp),
        port,
    );
    let n_a = 3000;
    let writer_a = writer(
        &lab,
        &cd,
        "shop-web-1",
        "shop",
        "6b1f0c2e-0000-4000-8000-0000000000a1",
        &[],
        &numbered("line-a", n_a, 5000, None),
    );
    kill_while_writing(&mut agent, &lab, &writer_a, &seen, "line-a", n_a, &hp);
    assert_metadata(&seen, "line-a", "shop-web-1", "shop", "app");
    let a_before = tally(&seen, "line-a");
    agent.stop();

    // The overlay: a new agent pod (hostPID, SYS_PTRACE, the added
    // pipeline) on the same data directory, as after `kubectl apply -k`.
    let (cf, cf_pipelines) = apply_overlay(
        &base,
        &base_pipelines,
        &repo().join("deploy/kubernetes-overlays/container-files"),
    );
    assert!(cf.host_pid && cf.caps_add == ["SYS_PTRACE"], "{cf:?}");
    assert!(cf_pipelines.len() > base_pipelines.len());
    let cf_hp = HostPaths {
        pipelines: mk("pipelines-container-files"),
        ..hp
    };
    write_pipelines(&cf_hp.pipelines, &cf_pipelines);
    let port = free_port();
    let mut agent = AgentPod::start(
        &lab,
        &cd,
        "petrel-container-files",
        cf.clone(),
        spec_for(&cf, &image, port, &cf_hp),
        port,
    );
    // At least 25 s of writing: the agent must still be catching up when
    // it is killed, even when its container (the second agent of this
    // test) is slow to find the pod on a loaded machine.
    let n_f = 5000;
    let files_script = format!(
        "mkdir -p /var/log/app; echo line-b-1; {}",
        numbered("line-f", n_f, 5000, Some("/var/log/app/app.log"))
    );
    let writer_f = writer(
        &lab,
        &cd,
        "shop-files-1",
        "shop",
        "6b1f0c2e-0000-4000-8000-0000000000f1",
        &[FILES_ANNOTATION],
        &files_script,
    );
    kill_while_writing(&mut agent, &lab, &writer_f, &seen, "line-f", n_f, &cf_hp);
    assert_metadata(&seen, "line-f", "shop-files-1", "shop", "app");
    let files: Vec<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|r| s(&r.event, "message").starts_with("line-f-"))
        .map(|r| s(&r.event, "file").to_string())
        .collect();
    assert!(
        files
            .iter()
            .all(|f| f.starts_with("/proc/") && f.ends_with("/root/var/log/app/app.log")),
        "read through /proc/<pid>/root: {:?}",
        files.first()
    );
    // The base pipeline runs beside it and resumed from the clean stop's
    // checkpoint: the new pod's stdout line came, nothing of the first
    // writer twice.
    wait_all(&seen, "line-b", 1, LONG);
    assert_metadata(&seen, "line-b", "shop-files-1", "shop", "app");
    let a_after = tally(&seen, "line-a");
    assert_eq!(
        a_before.values().map(|v| v.0).sum::<usize>(),
        a_after.values().map(|v| v.0).sum::<usize>(),
        "line-a events sent again after a clean stop"
    );
    agent.stop();
    drop(lab);
    drop(cd);
}
