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

use std::path::Path;
use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::Key;

use super::select::{Facts, Selector};
use super::{
    container_fields, reading, Catalog, RuntimeChoice, RuntimeInfo, RuntimeMeta, RuntimeSettings,
    SharedKeys,
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
];

/// Configuration of `type: container_files`.
#[derive(Debug, Clone)]
pub struct ContainerFilesConfig {
    /// Globs inside the containers, absolute (`/var/log/app/*.log`).
    pub paths: Vec<String>,
    /// Where the container list comes from.
    pub runtime: RuntimeSettings,
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
        let SharedKeys {
            runtime,
            include,
            exclude,
            annotation_fields,
        } = shared?;
        Some(Self {
            paths,
            runtime,
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
        let selector = Arc::new(FilesSelector {
            config: Arc::new(self.clone()),
            runtime,
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
    node_name: Option<Arc<str>>,
    base_meta: Arc<[(Key, Arc<str>)]>,
}

impl FilesSelector {
    fn selected(&self, rt: &RuntimeInfo) -> bool {
        let facts = Facts::of_runtime(rt);
        self.config.include.matches_all(&facts) && !self.config.exclude.matches_any(&facts)
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
        if !self.selected(&rt) {
            return None;
        }
        Some(Selected {
            meta: container_fields(
                &self.base_meta,
                None,
                Some(&rt),
                &self.config.annotation_fields,
                self.node_name.as_ref(),
            ),
            decoder: None,
        })
    }

    fn generation(&self) -> u64 {
        self.runtime.as_ref().map_or(0, |r| r.generation())
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
