//! `type: container_files` — log files inside running containers, read
//! through the container's root as the host sees it
//! (`/proc/<init pid>/root/<path>`), so no hostPath mount of the
//! application's log directory is needed.
//!
//! The runtime cache says which containers run and their init pids; the
//! source's include globs follow it (one glob per selected container and
//! configured path), and the shared file input thread reads the files with
//! everything `type: file` does. A file keeps its identity (device and
//! inode of the container's filesystem) when the container's pid changes
//! on a restart, so its checkpoint carries over.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::Key;

use super::select::{Facts, Selector};
use super::{
    api, container_fields, reading, Catalog, RuntimeChoice, RuntimeInfo, RuntimeMeta,
    RuntimeSettings, SharedKeys,
};
use crate::sources::file::service::{FileSelector, Selected};
use crate::sources::file::FileSourceConfig;

/// Keys accepted by the source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "paths",
    "runtime",
    "containerd_socket",
    "docker_socket",
    "include",
    "exclude",
    "annotation_fields",
    "read_from",
    "multiline",
    "max_line_bytes",
    "partial_line_timeout_ms",
    "metadata_wait_ms",
    "api",
    "kubeconfig",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Log files inside running containers, read through the container's root as the host sees it (`/proc/<pid>/root/...`), with the metadata of `kubernetes_logs`; needs containerd or Docker, `hostPID` and `CAP_SYS_PTRACE`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "paths",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Globs of files inside the container (required), e.g. `["/var/log/app/*.log"]`."#,
    },
    crate::sources::kubernetes::RUNTIME_DOC,
    crate::sources::kubernetes::CONTAINERD_SOCKET_DOC,
    crate::sources::kubernetes::DOCKER_SOCKET_DOC,
    crate::sources::kubernetes::select::INCLUDE_DOC,
    crate::sources::kubernetes::select::EXCLUDE_DOC,
    crate::sources::kubernetes::ANNOTATION_FIELDS_DOC,
    crate::sources::kubernetes::READ_FROM_DOC,
    crate::sources::file::multiline::MULTILINE_DOC,
    petrel_core::plugin::KeyDoc {
        name: "max_line_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"1MiB"#),
        doc: r#"Longer lines are split into pieces of this size, each an event; counted as `line_too_long`."#,
    },
    crate::sources::file::PARTIAL_LINE_TIMEOUT_DOC,
    petrel_core::plugin::KeyDoc {
        name: "metadata_wait_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"5000"#),
        doc: r#"With `api`, a container whose pod the API server does not know yet waits this long, then is read with the runtime's metadata (counted `metadata_missing`); later events get the rest once it is known."#,
    },
    crate::sources::kubernetes::api::API_DOC,
    crate::sources::kubernetes::api::KUBECONFIG_DOC,
];

/// Configuration of `type: container_files`.
#[derive(Debug, Clone)]
pub struct ContainerFilesConfig {
    /// Globs inside the containers, absolute (`/var/log/app/*.log`).
    pub paths: Vec<String>,
    /// Where the container list comes from.
    pub runtime: RuntimeSettings,
    /// Whether (and how) the API server is asked.
    pub api: api::ApiSettings,
    /// Annotation keys kept from the API (events and selectors).
    pub api_annotations: Vec<String>,
    /// How long a container whose pod the API does not know waits.
    pub metadata_wait: Duration,
    /// Containers read (empty: all).
    pub include: Selector,
    /// Containers skipped.
    pub exclude: Selector,
    /// Pod annotations copied into events.
    pub annotation_fields: Vec<String>,
    /// Reading settings shared with `type: file` (its include globs are
    /// set from the running containers).
    pub file: FileSourceConfig,
}

impl ContainerFilesConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let mut paths = Vec::new();
        if let Some(n) = map.required("paths", "[\"/var/log/app/*.log\"]") {
            for (p, pn) in n.as_str_list() {
                if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
                    pn.error(format!(
                        "`{p}` must be an absolute path inside the container without `..`, e.g. `/var/log/app/*.log`"
                    ));
                } else if super::super::file::discovery::compile_glob(p).is_err() {
                    pn.error(format!("invalid glob `{p}`; check brackets and braces"));
                } else {
                    paths.push(p.to_string());
                }
            }
        }
        let shared = SharedKeys::parse(&map);
        if let Some(n) = map.get("runtime") {
            if shared
                .as_ref()
                .is_some_and(|k| k.runtime.choice == RuntimeChoice::None)
            {
                n.error("`container_files` finds containers through the runtime; set `runtime: auto`, `containerd` or `docker`");
            }
        }
        let max_line_bytes = map.u64("max_line_bytes", true).unwrap_or(1 << 20) as usize;
        let file = reading(
            &map,
            Vec::new(),
            max_line_bytes.clamp(64, 1 << 30),
            max_line_bytes,
        );
        if paths.is_empty() {
            return None;
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
        Some(Self {
            paths,
            runtime,
            api,
            api_annotations,
            metadata_wait: Duration::from_millis(
                map.u64("metadata_wait_ms", false).unwrap_or(5000),
            ),
            include,
            exclude,
            annotation_fields,
            file: file?,
        })
    }
}

/// Registration of `type: container_files`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "container_files",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| ContainerFilesConfig::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::SourceConfig for ContainerFilesConfig {
    fn local_paths(&self) -> Vec<String> {
        // Files inside containers, through the runtime's socket.
        vec![
            self.runtime
                .containerd_socket
                .to_string_lossy()
                .into_owned(),
            self.runtime.docker_socket.to_string_lossy().into_owned(),
        ]
    }

    fn type_name(&self) -> &'static str {
        "container_files"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let catalog = ctx.shared.get_or_try_init(|| Ok(Catalog::default()))?;
        let runtime = catalog.runtime(&self.runtime);
        if runtime.is_none() {
            anyhow::bail!(
                "source {}: no container runtime answers at {} or {}; `container_files` needs one to find the containers",
                ctx.key,
                self.runtime.containerd_socket.display(),
                self.runtime.docker_socket.display()
            );
        }
        let api = catalog.api(&self.api, ctx.metrics.metrics())?;
        if let Some(api) = &api {
            api.want_annotations(self.api_annotations.iter().map(|s| s.as_str()));
        }
        let selector = Arc::new(FilesSelector {
            config: Arc::new(self.clone()),
            runtime,
            api,
            metadata_missing: ctx.metrics.error_counter("metadata_missing"),
            waiting: parking_lot::Mutex::new(HashMap::new()),
            node_name: super::node_name(),
            base_meta: ctx.meta.clone(),
        });
        crate::sources::file::start_reading(
            ctx,
            self.file.clone(),
            Some(selector),
            "container_files",
        )
    }
}

struct FilesSelector {
    config: Arc<ContainerFilesConfig>,
    runtime: Option<Arc<dyn RuntimeMeta>>,
    api: Option<Arc<api::KubeApi>>,
    metadata_missing: petrel_core::LazyCounter,
    /// Containers whose pod the API server did not know when first seen:
    /// since when, and whether the miss was counted.
    waiting: parking_lot::Mutex<HashMap<String, (Instant, bool)>>,
    node_name: Option<Arc<str>>,
    base_meta: Arc<[(Key, Arc<str>)]>,
}

impl FilesSelector {
    fn view(&self, rt: &RuntimeInfo) -> Option<api::ApiView> {
        self.api.as_ref().map(|a| {
            a.view(
                rt.namespace.as_deref(),
                rt.pod_uid.as_deref(),
                rt.pod_name.as_deref(),
            )
        })
    }

    fn selected(&self, rt: &RuntimeInfo) -> bool {
        let view = self.view(rt);
        let facts = Facts::of_runtime(rt, view.as_ref());
        self.config.include.matches_all(&facts) && !self.config.exclude.matches_any(&facts)
    }

    /// True while the API server does not know the pod of `rt` and
    /// `metadata_wait` has not passed since it was first seen.
    fn wait_for_api(&self, rt: &RuntimeInfo, view: Option<&api::ApiView>, path: &Path) -> bool {
        if view.is_none_or(|v| v.pod.is_some()) {
            return false;
        }
        let key = rt.container_id.clone().unwrap_or_default();
        let mut waiting = self.waiting.lock();
        if waiting.len() >= 4096 {
            waiting.retain(|_, (since, _)| since.elapsed() < Duration::from_secs(600));
        }
        let e = waiting
            .entry(key)
            .or_insert_with(|| (Instant::now(), false));
        if e.0.elapsed() < self.config.metadata_wait {
            return true;
        }
        if !e.1 {
            e.1 = true;
            self.metadata_missing.inc();
            tracing::warn!(path = %path.display(), "the Kubernetes API server does not know this container's pod (yet); reading it with the runtime's metadata, and its events get the rest once it is known");
        }
        false
    }

    fn running(&self) -> Vec<Arc<RuntimeInfo>> {
        self.runtime
            .as_ref()
            .map(|r| r.running())
            .unwrap_or_default()
    }
}

/// The pid of a `/proc/<pid>/root/...` path.
fn pid_of(path: &Path) -> Option<u32> {
    let mut it = path.components().skip(1);
    match (it.next(), it.next(), it.next()) {
        (Some(a), Some(pid), Some(b)) if a.as_os_str() == "proc" && b.as_os_str() == "root" => {
            pid.as_os_str().to_str()?.parse().ok()
        }
        _ => None,
    }
}

impl FileSelector for FilesSelector {
    fn select(&self, path: &Path) -> Option<Selected> {
        let pid = pid_of(path)?;
        let rt = self.running().into_iter().find(|c| c.pid == Some(pid))?;
        let view = self.view(&rt);
        if self.wait_for_api(&rt, view.as_ref(), path) {
            return None;
        }
        let facts = Facts::of_runtime(&rt, view.as_ref());
        if !self.config.include.matches_all(&facts) || self.config.exclude.matches_any(&facts) {
            return None;
        }
        Some(Selected {
            meta: container_fields(
                &self.base_meta,
                None,
                Some(&rt),
                view.as_ref(),
                &self.config.annotation_fields,
                self.node_name.as_ref(),
            ),
            decoder: None,
        })
    }

    fn generation(&self) -> u64 {
        // Both only grow: their sum moves whenever either does.
        self.runtime.as_ref().map_or(0, |r| r.generation())
            + self.api.as_ref().map_or(0, |a| a.generation())
    }

    fn include(&self) -> Option<Vec<String>> {
        let mut globs = Vec::new();
        for c in self.running() {
            let Some(pid) = c.pid else { continue };
            if !self.selected(&c) {
                continue;
            }
            for p in &self.config.paths {
                globs.push(format!("/proc/{pid}/root{p}"));
            }
        }
        globs.sort();
        Some(globs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_of_proc_root_paths() {
        assert_eq!(pid_of(Path::new("/proc/123/root/var/log/a.log")), Some(123));
        assert_eq!(pid_of(Path::new("/proc/self/root/var/log/a.log")), None);
        assert_eq!(pid_of(Path::new("/var/log/a.log")), None);
    }
}
