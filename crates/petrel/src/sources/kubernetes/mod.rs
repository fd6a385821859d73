//! `type: kubernetes_logs` — container stdout and stderr as the runtime
//! writes them on the node (kubelet's `/var/log/pods`, Docker's json-file
//! logs), with partial lines merged and each event tagged with its pod and
//! container.
//!
//! Files are read by the shared file input thread (rotation, checkpoints
//! committed after delivery, multiline all as for `type: file`); this
//! module decides which container files a source reads
//! ([`select::Selector`]), what metadata their events carry, and decodes
//! their records ([`format`]).
//!
//! Metadata comes from the path alone, from the local container runtime
//! over its socket when there is one, and from the Kubernetes API server
//! when credentials are there ([`api`]): node-wide caches ([`Catalog`])
//! that every pipeline shares, refreshed in the background. Neither is
//! ever waited on while reading: a container they do not know (yet) is
//! read with what is known after `metadata_wait`, and the miss is counted;
//! when they learn more later, the open files' events carry it from then
//! on.

pub mod api;
pub mod files;
pub mod format;
pub mod path;
pub mod runtime;
pub mod select;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::Key;
use petrel_core::LazyCounter;

use super::file::service::{FileSelector, Selected};
use super::file::{FileSourceConfig, ReadFrom};
use format::{ContainerDecoder, FormatCounters, Streams};
use path::LogPath;
use select::{Facts, Selector};

/// Keys accepted by the source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "pods_dir",
    "docker_dir",
    "runtime",
    "containerd_socket",
    "docker_socket",
    "include",
    "exclude",
    "streams",
    "max_merged_line_bytes",
    "annotation_fields",
    "read_from",
    "multiline",
    "partial_line_timeout_ms",
    "unfinished_line_timeout_ms",
    "metadata_wait_ms",
    "api",
    "kubeconfig",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Container stdout and stderr as the runtime writes them on the node: kubelet's CRI logs and Docker's json-file logs, partial lines joined, with pod and container metadata from the path, the node's own container runtime and (when credentials are there) the Kubernetes API server: namespace and node labels, the owning workload, the pod IP."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "pods_dir",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"/var/log/pods"#),
        doc: r#"kubelet's CRI log directory (`<ns>_<pod>_<uid>/<container>/<n>.log`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "docker_dir",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"/var/lib/docker/containers"#),
        doc: r#"Docker's json-file log directory (`<id>/<id>-json.log`)."#,
    },
    RUNTIME_DOC,
    CONTAINERD_SOCKET_DOC,
    DOCKER_SOCKET_DOC,
    crate::sources::kubernetes::select::INCLUDE_DOC,
    crate::sources::kubernetes::select::EXCLUDE_DOC,
    petrel_core::plugin::KeyDoc {
        name: "streams",
        kind: petrel_core::plugin::KeyKind::List,
        default: Some(r#"[stdout, stderr]"#),
        doc: r#"The streams read: `stdout`, `stderr` or both."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_merged_line_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"1MiB"#),
        doc: r#"A line merged from partial records that reaches this size is cut there (counted `container_line_cut`)."#,
    },
    ANNOTATION_FIELDS_DOC,
    READ_FROM_DOC,
    crate::sources::file::multiline::MULTILINE_DOC,
    petrel_core::plugin::KeyDoc {
        name: "partial_line_timeout_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"5000"#),
        doc: r#"The unfinished line of a rotated or deleted file goes out once the file stopped growing for this long; as for `type: file` otherwise."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "unfinished_line_timeout_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"300000"#),
        doc: r#"A live file's unfinished line waits for its last part up to this long after the file stopped growing (at least `partial_line_timeout_ms`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "metadata_wait_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"5000"#),
        doc: r#"A container the runtime (or, with `api`, the API server) does not know yet waits this long for its metadata, then is read with what is known (counted `metadata_missing`); later events get the rest once it is known."#,
    },
    api::API_DOC,
    api::KUBECONFIG_DOC,
];

/// The `runtime` key, documented once for every plugin that reads it.
pub const RUNTIME_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "runtime",
    kind: petrel_core::plugin::KeyKind::OneOf(&["auto", "containerd", "docker", "none"]),
    default: Some(r#"auto"#),
    doc: r#"Where pod and container metadata comes from: containerd's CRI API, the Docker engine API, or `none` (path metadata only). `auto` uses containerd's socket if it exists, else Docker's, else none."#,
};

/// The `containerd_socket` key, documented once for every plugin that reads it.
pub const CONTAINERD_SOCKET_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "containerd_socket",
    kind: petrel_core::plugin::KeyKind::String,
    default: Some(r#"/run/containerd/containerd.sock"#),
    doc: r#"containerd's CRI socket."#,
};

/// The `docker_socket` key, documented once for every plugin that reads it.
pub const DOCKER_SOCKET_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "docker_socket",
    kind: petrel_core::plugin::KeyKind::String,
    default: Some(r#"/var/run/docker.sock"#),
    doc: r#"The Docker engine's socket."#,
};

/// The `annotation_fields` key, documented once for every plugin that reads it.
pub const ANNOTATION_FIELDS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "annotation_fields",
    kind: petrel_core::plugin::KeyKind::List,
    default: Some(r#"[]"#),
    doc: r#"Annotations copied into events: the pod's as `k8s.annotations.<key>`, its namespace's as `k8s.namespace_annotations.<key>` (with `api`)."#,
};

/// The `read_from` key, documented once for every plugin that reads it.
pub const READ_FROM_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "read_from",
    kind: petrel_core::plugin::KeyKind::OneOf(&["beginning", "end"]),
    default: Some(r#"beginning"#),
    doc: r#"Where to start in a file present at the source's first start (no checkpoint yet); files that appear later are always read from their beginning."#,
};

/// Which runtime metadata comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeChoice {
    /// containerd's socket if it exists, else Docker's, else none.
    Auto,
    /// containerd's CRI API.
    Containerd,
    /// Docker's engine API.
    Docker,
    /// Path metadata only.
    None,
}

/// Which runtime, at which socket.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// The runtime chosen.
    pub choice: RuntimeChoice,
    /// containerd's socket.
    pub containerd_socket: PathBuf,
    /// Docker's socket.
    pub docker_socket: PathBuf,
}

/// The path at key `k` (relative to the configuration file), or `default`.
fn path_or(map: &Map<'_>, k: &str, default: &str) -> PathBuf {
    match map.get(k) {
        Some(n) => n
            .as_str()
            .map(|s| crate::paths::resolve_path(n, s))
            .unwrap_or_default(),
        None => PathBuf::from(default),
    }
}

/// The keys `kubernetes_logs` and `container_files` share: where metadata
/// comes from, which containers are read, and which annotations are
/// copied.
struct SharedKeys {
    runtime: RuntimeSettings,
    api: api::ApiSettings,
    include: Selector,
    exclude: Selector,
    annotation_fields: Vec<String>,
}

impl SharedKeys {
    fn parse(map: &Map<'_>) -> Option<Self> {
        let selector = |k: &str| {
            map.get(k)
                .map_or(Some(Selector::default()), Selector::parse)
        };
        let (include, exclude) = (selector("include"), selector("exclude"));
        let annotation_fields = map
            .get("annotation_fields")
            .map(|n| {
                n.as_str_list()
                    .into_iter()
                    .map(|(s, _)| s.to_string())
                    .collect()
            })
            .unwrap_or_default();
        let api = api::ApiSettings::parse(map);
        let (include, exclude) = (include?, exclude?);
        if api.choice == api::ApiChoice::Off && (include.needs_api() || exclude.needs_api()) {
            if let Some(n) = map.get("api") {
                n.error("selecting by `namespace_labels` needs the Kubernetes API server; remove `api: false`");
            }
        }
        Some(Self {
            runtime: RuntimeSettings::parse(map),
            api,
            include,
            exclude,
            annotation_fields,
        })
    }

    /// Every annotation key events or selectors use: what the API cache
    /// keeps of each object.
    fn annotation_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.annotation_fields.iter().map(|s| s.as_str()).collect();
        for sel in [&self.include, &self.exclude] {
            keys.extend(sel.pod_annotations.iter().map(|(k, _)| k.as_str()));
        }
        keys
    }
}

/// The file input's settings of a container source: `read_from` (from the
/// beginning by default: a new container's first lines matter),
/// `multiline`, `partial_line_timeout_ms`.
fn reading(
    map: &Map<'_>,
    include: Vec<String>,
    max_line_bytes: usize,
    multiline_max_bytes: usize,
) -> Option<FileSourceConfig> {
    let read_from = match map.choice("read_from", &["beginning", "end"]) {
        Some("end") => ReadFrom::End,
        _ => ReadFrom::Beginning,
    };
    let multiline = match map.get("multiline") {
        Some(n) => Some(super::file::multiline::Multiline::parse(
            n,
            multiline_max_bytes,
        )?),
        None => None,
    };
    let partial_line_timeout =
        Duration::from_millis(map.u64("partial_line_timeout_ms", false).unwrap_or(5000));
    Some(FileSourceConfig {
        include,
        exclude: Vec::new(),
        read_from,
        max_line_bytes,
        partial_line_timeout,
        // `kubernetes_logs` sets its own (its files have decoded lines).
        unfinished_line_timeout: partial_line_timeout,
        read_block_bytes: 256 << 10,
        multiline,
        close_inactive: None,
        ignore_older: None,
    })
}

impl RuntimeSettings {
    /// Reads `runtime`, `containerd_socket` and `docker_socket`.
    pub fn parse(map: &Map<'_>) -> Self {
        let path = |k: &str, default: &str| path_or(map, k, default);
        let choice = match map.choice("runtime", &["auto", "containerd", "docker", "none"]) {
            Some("containerd") => RuntimeChoice::Containerd,
            Some("docker") => RuntimeChoice::Docker,
            Some("none") => RuntimeChoice::None,
            _ => RuntimeChoice::Auto,
        };
        Self {
            choice,
            containerd_socket: path("containerd_socket", "/run/containerd/containerd.sock"),
            docker_socket: path("docker_socket", "/var/run/docker.sock"),
        }
    }
}

/// Configuration of `type: kubernetes_logs`.
#[derive(Debug, Clone)]
pub struct KubernetesLogsConfig {
    /// kubelet's pod log directory.
    pub pods_dir: PathBuf,
    /// Docker's container directory (json-file logs).
    pub docker_dir: PathBuf,
    /// Where metadata comes from.
    pub runtime: RuntimeSettings,
    /// Whether (and how) the API server is asked.
    pub api: api::ApiSettings,
    /// Annotation keys kept from the API (events and selectors).
    pub api_annotations: Vec<String>,
    /// Containers read (empty: all).
    pub include: Selector,
    /// Containers skipped.
    pub exclude: Selector,
    /// Streams kept.
    pub streams: Streams,
    /// Merged partials longer than this are cut (counted).
    pub max_merged_line_bytes: usize,
    /// Pod annotations copied into events as `k8s.annotations.<key>`.
    pub annotation_fields: Vec<String>,
    /// How long a container the runtime does not know yet waits for its
    /// metadata before it is read with its path's metadata only.
    pub metadata_wait: Duration,
    /// Reading settings shared with `type: file`.
    pub file: FileSourceConfig,
}

impl KubernetesLogsConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let pods_dir = path_or(&map, "pods_dir", "/var/log/pods");
        let docker_dir = path_or(&map, "docker_dir", "/var/lib/docker/containers");
        let shared = SharedKeys::parse(&map);
        let mut streams = Streams {
            stdout: true,
            stderr: true,
        };
        if let Some(n) = map.get("streams") {
            streams = Streams {
                stdout: false,
                stderr: false,
            };
            for (s, sn) in n.as_str_list() {
                match s {
                    "stdout" => streams.stdout = true,
                    "stderr" => streams.stderr = true,
                    _ => sn.error(format!(
                        "unknown stream `{s}`; write `streams: [stdout, stderr]` or one of them"
                    )),
                }
            }
            if !streams.stdout && !streams.stderr {
                n.error("`streams` needs `stdout`, `stderr` or both");
            }
        }
        let max_merged = map.u64("max_merged_line_bytes", true).unwrap_or(1 << 20) as usize;
        if max_merged < 1024 {
            if let Some(n) = map.get("max_merged_line_bytes") {
                n.error("`max_merged_line_bytes` must be at least 1KiB");
            }
        }
        let shared = shared?;
        let api_annotations = shared
            .annotation_keys()
            .into_iter()
            .map(String::from)
            .collect();
        let SharedKeys {
            runtime,
            api,
            include,
            exclude,
            annotation_fields,
        } = shared;
        // With `api: auto` the API server may be absent: labels would then
        // be unknown and the selection silently match nothing.
        if runtime.choice == RuntimeChoice::None
            && api.choice != api::ApiChoice::On
            && (include.needs_runtime() || exclude.needs_runtime())
        {
            if let Some(n) = map.get("runtime") {
                n.error("selecting by `pod_labels` or `pod_annotations` needs metadata from the container runtime or the API server; set `runtime: auto` (or containerd/docker), or `api: true`, or select by namespaces, pods and containers");
            }
        }
        let mut include_globs = Vec::new();
        for (d, pat) in [(&pods_dir, "*/*/*.log"), (&docker_dir, "*/*-json.log")] {
            let g = format!("{}/{}", globset::escape(&d.to_string_lossy()), pat);
            if super::file::discovery::compile_glob(&g).is_err() {
                return None;
            }
            include_globs.push(g);
        }
        // A raw record is at most a runtime's split size plus its prefix;
        // anything longer is not a record.
        let file = reading(&map, include_globs, max_merged.max(64 << 10), max_merged);
        let unfinished_line_timeout = unfinished_line_timeout(
            &map,
            file.as_ref()
                .map_or(Duration::from_secs(5), |f| f.partial_line_timeout),
        );
        Some(Self {
            pods_dir,
            docker_dir,
            runtime,
            api,
            api_annotations,
            include,
            exclude,
            streams,
            max_merged_line_bytes: max_merged.max(1024),
            annotation_fields,
            metadata_wait: Duration::from_millis(
                map.u64("metadata_wait_ms", false).unwrap_or(5000),
            ),
            file: FileSourceConfig {
                unfinished_line_timeout,
                ..file?
            },
        })
    }
}

/// How long a line's first parts wait for the last one in a log file the
/// runtime still writes to: `unfinished_line_timeout_ms`, 5 minutes by
/// default. Not for ever: a container whose last output has no newline
/// ends its log with a partial record (containerd, CRI-O, Docker), and
/// that line must come out while the file stays. Never below `partial`
/// (`partial_line_timeout_ms`, the wait of a rotated file's line).
fn unfinished_line_timeout(map: &Map<'_>, partial: Duration) -> Duration {
    let default = Duration::from_secs(300);
    match map.get("unfinished_line_timeout_ms") {
        None => default.max(partial),
        Some(n) => {
            let v = n.as_u64(false).map_or(default, Duration::from_millis);
            if v < partial {
                n.error(format!(
                    "`unfinished_line_timeout_ms` must be at least `partial_line_timeout_ms` ({} ms): a line in a live file waits at least as long as one cut by rotation",
                    partial.as_millis()
                ));
            }
            v.max(partial)
        }
    }
}

/// Registration of `type: kubernetes_logs`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "kubernetes_logs",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| KubernetesLogsConfig::parse(m).map(|c| Arc::new(SharedConfig(Arc::new(c))) as _),
};

/// A parsed `kubernetes_logs` source: the configuration behind an `Arc`
/// that each start shares with its [`KubeSelector`], where a clone of the
/// whole configuration per source cost about 800 bytes (issue 22).
struct SharedConfig(Arc<KubernetesLogsConfig>);

impl std::fmt::Debug for SharedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl petrel_core::plugin::SourceConfig for SharedConfig {
    fn type_name(&self) -> &'static str {
        "kubernetes_logs"
    }

    fn read_globs(&self) -> Option<(&[String], &[String])> {
        Some((&self.0.file.include, &self.0.file.exclude))
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let c = &self.0;
        let catalog = ctx.shared.get_or_try_init(|| Ok(Catalog::default()))?;
        let m = &ctx.metrics;
        let api = catalog.api(&c.api, m.metrics())?;
        if let Some(api) = &api {
            api.want_annotations(c.api_annotations.iter().map(|s| s.as_str()));
        } else if c.include.needs_api() || c.exclude.needs_api() {
            tracing::warn!(source = %ctx.key, "`namespace_labels` in `include`/`exclude` but no Kubernetes API server credentials (api: auto found none): namespace labels are unknown, so the condition never holds");
        }
        let selector = Arc::new(KubeSelector {
            config: c.clone(),
            runtime: catalog.runtime(&c.runtime),
            api,
            node_name: node_name(),
            base_meta: ctx.meta.clone(),
            counters: FormatCounters {
                invalid: m.error_counter("container_record_invalid"),
                cut: m.error_counter("container_line_cut"),
                unfinished: m.error_counter("container_partial_unfinished"),
            },
            metadata_missing: m.error_counter("metadata_missing"),
            waiting: parking_lot::Mutex::new(HashMap::new()),
            rejected: parking_lot::Mutex::new(HashMap::new()),
        });
        super::file::start_reading(ctx, c.file.clone(), Some(selector), "kubernetes_logs")
    }
}

/// What the runtime knows of one container and its pod.
#[derive(Debug, Clone, Default)]
pub struct RuntimeInfo {
    /// Pod namespace (Docker: from the container's kubelet labels).
    pub namespace: Option<String>,
    /// Pod name.
    pub pod_name: Option<String>,
    /// Pod uid.
    pub pod_uid: Option<String>,
    /// Container name.
    pub container_name: Option<String>,
    /// Container id.
    pub container_id: Option<String>,
    /// Image reference.
    pub image: Option<String>,
    /// Pod labels.
    pub labels: Vec<(String, String)>,
    /// Pod annotations.
    pub annotations: Vec<(String, String)>,
    /// The container's init process as the host sees it, while it runs.
    pub pid: Option<u32>,
}

/// A node's container runtime, seen through a cache that never blocks.
pub trait RuntimeMeta: Send + Sync {
    /// Changes whenever the cache's content does.
    fn generation(&self) -> u64;
    /// What the cache knows of the container writing this file.
    fn lookup(&self, p: &LogPath) -> Option<Arc<RuntimeInfo>>;
    /// Asks for a refresh soon (a new container appeared).
    fn request_refresh(&self);
    /// The running containers (those with an init pid).
    fn running(&self) -> Vec<Arc<RuntimeInfo>>;
}

/// The node-wide container catalog shared by every `kubernetes_logs` and
/// `container_files` source of every pipeline: one runtime connection and
/// cache per runtime socket, however many pipelines use it.
#[derive(Default)]
pub struct Catalog {
    runtimes: parking_lot::Mutex<HashMap<String, Option<Arc<dyn RuntimeMeta>>>>,
    /// One API client per set of credentials (almost always one).
    apis: parking_lot::Mutex<HashMap<String, Option<Arc<api::KubeApi>>>>,
}

impl Catalog {
    /// The cache of the runtime `settings` name, connected on first use.
    fn runtime(&self, settings: &RuntimeSettings) -> Option<Arc<dyn RuntimeMeta>> {
        let key = format!(
            "{:?} {} {}",
            settings.choice,
            settings.containerd_socket.display(),
            settings.docker_socket.display()
        );
        self.runtimes
            .lock()
            .entry(key)
            .or_insert_with(|| runtime::connect(settings))
            .clone()
    }

    /// The API client `settings` name, started on first use; `None` when
    /// the API is off. An error (the source does not start) when `api:
    /// true` or a named kubeconfig cannot be used.
    fn api(
        &self,
        settings: &api::ApiSettings,
        metrics: &Arc<petrel_core::Metrics>,
    ) -> anyhow::Result<Option<Arc<api::KubeApi>>> {
        let key = settings.share_key();
        let mut apis = self.apis.lock();
        if let Some(a) = apis.get(&key) {
            if a.is_some() || settings.choice != api::ApiChoice::On {
                return Ok(a.clone());
            }
        }
        let a = api::connect(settings, node_name().as_deref(), metrics)?;
        apis.insert(key, a.clone());
        Ok(a)
    }
}

/// The node's name, from `$NODE_NAME` (the DaemonSet sets it from the
/// downward API).
fn node_name() -> Option<Arc<str>> {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .map(Arc::from)
}

/// The per-source [`FileSelector`]: selection and metadata from the
/// shared catalog.
struct KubeSelector {
    config: Arc<KubernetesLogsConfig>,
    runtime: Option<Arc<dyn RuntimeMeta>>,
    api: Option<Arc<api::KubeApi>>,
    node_name: Option<Arc<str>>,
    base_meta: Arc<[(Key, Arc<str>)]>,
    counters: FormatCounters,
    metadata_missing: LazyCounter,
    /// Containers the runtime did not know when first seen: since when,
    /// and whether the miss was counted.
    waiting: parking_lot::Mutex<HashMap<String, (Instant, bool)>>,
    /// Files this source's selectors turned down, with the metadata
    /// generation they were judged at: every scan offers every container
    /// file to every source again, and with a thousand pipelines the
    /// answers are worth keeping.
    rejected: parking_lot::Mutex<HashMap<PathBuf, u64>>,
}

/// The metadata fields of a container's events: the source's own
/// (`host`), then what the path says, then what the runtime knows, then
/// what the API server adds (namespace and node labels, the workload, the
/// pod IP; the pod's labels and annotations when the runtime has none).
pub(crate) fn container_fields(
    base: &[(Key, Arc<str>)],
    p: Option<&LogPath>,
    rt: Option<&RuntimeInfo>,
    api: Option<&api::ApiView>,
    annotation_fields: &[String],
    node: Option<&Arc<str>>,
) -> Arc<[(Key, Arc<str>)]> {
    let mut v: Vec<(Key, Arc<str>)> = base.to_vec();
    let mut put = |k: &str, val: &str| v.push((Key::from(k.to_string()), Arc::from(val)));
    match p {
        Some(LogPath::Cri {
            namespace,
            pod,
            uid,
            container,
            restart,
        }) => {
            put("k8s.namespace", namespace);
            put("k8s.pod_name", pod);
            put("k8s.pod_uid", uid);
            put("k8s.container_name", container);
            put("k8s.restart_count", &restart.to_string());
        }
        // Docker's path and files inside containers tell no pod: the
        // runtime does (from the labels kubelet sets on containers).
        _ => {
            if let Some(LogPath::Docker { id }) = p {
                put("container.id", id);
            }
            if let Some(rt) = rt {
                for (k, val) in [
                    ("k8s.namespace", &rt.namespace),
                    ("k8s.pod_name", &rt.pod_name),
                    ("k8s.pod_uid", &rt.pod_uid),
                    ("k8s.container_name", &rt.container_name),
                ] {
                    if let Some(val) = val {
                        put(k, val);
                    }
                }
            }
        }
    }
    let named = |k: &str| annotation_fields.iter().any(|f| f == k);
    if let Some(rt) = rt {
        if !matches!(p, Some(LogPath::Docker { .. })) {
            if let Some(id) = &rt.container_id {
                put("container.id", id);
            }
        }
        if let Some(image) = &rt.image {
            put("container.image", image);
        }
        for (k, val) in &rt.labels {
            put(&format!("k8s.labels.{k}"), val);
        }
        for (k, val) in &rt.annotations {
            if named(k) {
                put(&format!("k8s.annotations.{k}"), val);
            }
        }
    }
    if let Some(a) = api {
        if let Some(pod) = &a.pod {
            // The runtime's copy wins: it is what the container was
            // started with; the API's fills in where it has none.
            if rt.is_none_or(|r| r.labels.is_empty()) {
                for (k, val) in pod.labels.iter() {
                    put(&format!("k8s.labels.{k}"), val);
                }
            }
            if rt.is_none_or(|r| r.annotations.is_empty()) {
                for (k, val) in pod.annotations.iter() {
                    if named(k) {
                        put(&format!("k8s.annotations.{k}"), val);
                    }
                }
            }
            if let Some(ip) = &pod.pod_ip {
                put("k8s.pod_ip", ip);
            }
        }
        for o in &a.owners {
            put(o.kind.field(), &o.name);
        }
        if let Some(ns) = &a.namespace {
            for (k, val) in ns.labels.iter() {
                put(&format!("k8s.namespace_labels.{k}"), val);
            }
            for (k, val) in ns.annotations.iter() {
                if named(k) {
                    put(&format!("k8s.namespace_annotations.{k}"), val);
                }
            }
        }
        if let Some(n) = &a.node {
            for (k, val) in n.labels.iter() {
                put(&format!("k8s.node_labels.{k}"), val);
            }
        }
    }
    if let Some(node) = node {
        v.push(("k8s.node_name".into(), node.clone()));
    }
    v.into()
}

/// What the API server knows of a container's pod, found by the
/// namespace, uid and name of its path, else of the runtime.
fn api_view(api: &api::KubeApi, p: &LogPath, rt: Option<&RuntimeInfo>) -> api::ApiView {
    match p {
        LogPath::Cri {
            namespace,
            uid,
            pod,
            ..
        } => api.view(Some(namespace), Some(uid), Some(pod)),
        LogPath::Docker { .. } => api.view(
            rt.and_then(|r| r.namespace.as_deref()),
            rt.and_then(|r| r.pod_uid.as_deref()),
            rt.and_then(|r| r.pod_name.as_deref()),
        ),
    }
}

impl FileSelector for KubeSelector {
    fn select(&self, path: &Path) -> Option<Selected> {
        let c = &self.config;
        let generation = self.generation();
        if self.rejected.lock().get(path) == Some(&generation) {
            return None;
        }
        let p = LogPath::parse(path, &c.pods_dir, &c.docker_dir)?;
        let rt = self.runtime.as_ref().and_then(|r| r.lookup(&p));
        let view = self.api.as_ref().map(|a| api_view(a, &p, rt.as_deref()));
        let runtime_missing = self.runtime.is_some() && rt.is_none();
        // The node's labels too: a container read before the node was
        // listed would have its first events without them (the layouts
        // suite saw it under load).
        let api_missing = view
            .as_ref()
            .is_some_and(|v| v.pod.is_none() || !v.node_listed);
        if runtime_missing || api_missing {
            let mut waiting = self.waiting.lock();
            if waiting.len() >= 4096 {
                // Containers that came and went before the runtime
                // answered: forget them after a while.
                waiting.retain(|_, (since, _)| since.elapsed() < Duration::from_secs(600));
            }
            // Bounded by the containers on the node; entries go once
            // the metadata is known.
            let e = waiting
                .entry(p.container_key())
                .or_insert_with(|| (Instant::now(), false));
            if e.0.elapsed() < c.metadata_wait {
                if runtime_missing {
                    if let Some(runtime) = &self.runtime {
                        runtime.request_refresh();
                    }
                }
                return None;
            }
            if !e.1 {
                e.1 = true;
                self.metadata_missing.inc();
                let who = match (runtime_missing, api_missing) {
                    (true, true) => "neither the container runtime nor the Kubernetes API server knows this container",
                    (true, false) => "the container runtime does not know this container",
                    _ if view.as_ref().is_some_and(|v| v.pod.is_some()) => "this node was not listed from the Kubernetes API server yet (no node labels)",
                    _ => "the Kubernetes API server does not know this container's pod (yet)",
                };
                tracing::warn!(path = %path.display(), "{who}; reading it with what is known, and its events get the rest once it is known");
            }
        } else if !self.waiting.lock().is_empty() {
            self.waiting.lock().remove(&p.container_key());
        }
        let facts = Facts::of(&p, rt.as_deref(), view.as_ref());
        if !c.include.matches_all(&facts) || c.exclude.matches_any(&facts) {
            let mut rejected = self.rejected.lock();
            // Judged again at the next generation; gone files go then, or
            // (no runtime: the generation never changes) when the map is
            // full, so short-lived pods cannot make it grow without bound.
            rejected.retain(|_, g| *g == generation);
            if rejected.len() >= 8192 {
                rejected.clear();
            }
            rejected.insert(path.to_path_buf(), generation);
            return None;
        }
        Some(Selected {
            meta: container_fields(
                &self.base_meta,
                Some(&p),
                rt.as_deref(),
                view.as_ref(),
                &c.annotation_fields,
                self.node_name.as_ref(),
            ),
            decoder: Some(Box::new(ContainerDecoder::new(
                c.max_merged_line_bytes,
                c.streams,
                self.counters.clone(),
            ))),
        })
    }

    fn generation(&self) -> u64 {
        // Both only grow: their sum moves whenever either does.
        self.runtime.as_ref().map_or(0, |r| r.generation())
            + self.api.as_ref().map_or(0, |a| a.generation())
    }
}
