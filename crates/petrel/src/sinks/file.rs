//! `type: file` — appends encoded events to a local file.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::encode::Encoding;
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::writer::{self, Target};

/// Keys accepted by the file sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "path",
    "encoding",
    "fsync",
    "read_back",
    "owner",
    "group",
    "mode",
    "max_open_files",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Appends events to a file and acknowledges after the write (and the fsync, if set); a failed write is retried with backoff and a torn group is cut back before the retry."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "path",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: the output file, appended to; parent directories are created. FIFOs, sockets and directories are refused. A template (`/var/log/remote/{{ host }}/{{ app_name }}.log`, rsyslog's dynaFile) writes each event to the file its fields name: `/` in a value becomes `_` (a value cannot add directories), a missing field `unknown` (counted, `template_field_missing`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "owner",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"User (name or number) that files the sink creates belong to (the agent must be allowed to `chown`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "group",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Group (name or number) of the files the sink creates."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "mode",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Permission bits of the files the sink creates, in octal (`"0640"`); default 0666 less the umask."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_open_files",
        kind: petrel_core::plugin::KeyKind::Int,
        default: Some(r#"256"#),
        doc: r#"With a templated `path`: files kept open at once; beyond it the least recently written is closed (and opened again when an event goes there)."#,
    },
    ENCODING_DOC,
    petrel_core::plugin::KeyDoc {
        name: "fsync",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"`true`: fdatasync after each write, before acknowledging."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "read_back",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"`true`: file sources of other pipelines may read this file (chaining pipelines through a file); a source of the same pipeline never reads it."#,
    },
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// The `encoding` key, documented once for every plugin that reads it.
pub use super::ENCODING_DOC;

/// Configuration of the file sink.
#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// Output path; parent directories are created.
    pub path: PathBuf,
    /// `text`, `ndjson` or a line template.
    pub encoding: Encoding,
    /// fdatasync after every write, before acknowledging.
    pub fsync: bool,
    /// Other pipelines' file sources may read this file (chaining
    /// pipelines through a file). Without it every file source skips it.
    pub read_back: bool,
    /// `path` as a template, when it names fields: each event to the
    /// file they name.
    pub template: Option<super::template::Template>,
    /// Owner, group and mode of the files the sink creates.
    pub ownership: super::files::Ownership,
    /// Files open at once with a templated path.
    pub max_open_files: usize,
}

impl FileSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let path = map.required("path", "/var/tmp/out/app.log")?.as_str()?;
        if path.is_empty() {
            map.node().error("`path` must not be empty");
            return None;
        }
        let resolved = crate::paths::resolve_path(map.node(), path);
        let what = if petrel_core::config::host_checks() && !path.contains("{{") {
            refuse_kind(&resolved)
        } else {
            None
        };
        if let Some(what) = what {
            if let Some(n) = map.get("path") {
                n.error(format!(
                    "`{path}` is {what}; the file sink writes regular files (or devices such as /dev/null)"
                ));
            }
            return None;
        }
        let template = if path.contains("{{") {
            let node = map.get("path")?;
            let abs = resolved.to_string_lossy().into_owned();
            Some(super::template::Template::parse(&abs, node)?)
        } else {
            None
        };
        let mut ok = true;
        let mode = match map.get("mode") {
            None => None,
            Some(n) => {
                let text = n.as_str()?;
                match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
                    Ok(m) if m <= 0o7777 => Some(m),
                    _ => {
                        n.error(format!(
                            "`mode` is permission bits in octal, such as `\"0640\"`; found `{text}`"
                        ));
                        ok = false;
                        None
                    }
                }
            }
        };
        let mut id_of = |key: &str, look: fn(&str) -> Option<u32>| -> Option<u32> {
            let n = map.get(key)?;
            let name = n.as_str()?;
            // Names are the host's: not checked with `validate --offline`.
            if !petrel_core::config::host_checks() {
                return name.parse().ok();
            }
            let id = look(name);
            if id.is_none() {
                n.error(format!(
                    "no {key} `{name}` on this host; give a name the host knows, or a number"
                ));
                ok = false;
            }
            id
        };
        let uid = id_of("owner", super::files::user_id);
        let gid = id_of("group", super::files::group_id);
        let max_open_files = map.u64("max_open_files", false).unwrap_or(256);
        if max_open_files == 0 || max_open_files > 1 << 20 {
            if let Some(n) = map.get("max_open_files") {
                n.error("`max_open_files` must be between 1 and 1048576");
            }
            ok = false;
        }
        if template.is_none() && map.get("max_open_files").is_some() {
            if let Some(n) = map.get("max_open_files") {
                n.error("`max_open_files` applies to a templated `path` (with `{{ field }}`)");
            }
            ok = false;
        }
        let encoding = super::parse_encoding(&map)?;
        if !ok {
            return None;
        }
        Some(Self {
            path: resolved,
            encoding,
            fsync: map.bool("fsync").unwrap_or(false),
            read_back: map.bool("read_back").unwrap_or(false),
            template,
            ownership: super::files::Ownership { mode, uid, gid },
            max_open_files: max_open_files as usize,
        })
    }
}

/// The running file sink.
pub struct FileSink {
    encoding: Encoding,
    fsync: bool,
    file: Mutex<Option<OutFile>>,
    metrics: ComponentMetrics,
}

/// The output file, reopened when its path stops naming it.
struct OutFile {
    path: PathBuf,
    file: File,
    /// Device and inode of `file`.
    id: (u64, u64),
    /// A regular file (not a device such as /dev/null): it can be
    /// truncated back after a failed write.
    regular: bool,
    /// Length before the group being written.
    mark: u64,
}

/// Why a path cannot be a file sink's output, if it cannot.
fn refuse_kind(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let ft = std::fs::metadata(path).ok()?.file_type();
    if ft.is_fifo() {
        Some("a FIFO (opening it would block until a reader appears)")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_dir() {
        Some("a directory")
    } else {
        None
    }
}

impl OutFile {
    fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        if let Some(what) = refuse_kind(path) {
            return Err(std::io::Error::other(format!(
                "{} is {what}; the file sink writes regular files (or devices such as /dev/null)",
                path.display()
            )));
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        // O_NONBLOCK: a FIFO created after the check above must not hang
        // the open; it is refused below.
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let meta = file.metadata()?;
        if refuse_kind(path).is_some() || !(meta.is_file() || is_char_device(&meta)) {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file or a character device",
                path.display()
            )));
        }
        // Regular files and devices: blocking writes, as usual.
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
        unsafe {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
        let mut len = meta.len();
        if meta.is_file() && len > 0 && !ends_with_newline(path, len) {
            // A line cut by a crash (kill -9 mid-write): end it, so that
            // the next event starts a line of its own instead of being
            // glued to the fragment.
            std::io::Write::write_all(&mut &file, b"\n")?;
            len += 1;
            tracing::warn!(path = %path.display(), "the output ended inside a line (a crash while writing); it was ended with a newline");
        }
        Ok(Self {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
            regular: meta.is_file(),
            mark: len,
            file,
        })
    }
}

/// True when the last of `len` bytes of `path` is a newline (or it cannot
/// be read: then nothing is added).
fn ends_with_newline(path: &Path, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut last = [0u8; 1];
    match File::open(path).and_then(|f| f.read_exact_at(&mut last, len - 1)) {
        Ok(()) => last[0] == b'\n',
        Err(_) => true,
    }
}

fn is_char_device(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    meta.file_type().is_char_device()
}

impl std::io::Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Target for OutFile {
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn begin(&mut self) -> std::io::Result<()> {
        if self.regular {
            self.mark = self.file.metadata()?.len();
        }
        Ok(())
    }

    fn rollback(&mut self) {
        if !self.regular {
            return;
        }
        // Appends land at the end, so a failed group is exactly what lies
        // past the mark.
        if let Err(e) = self.file.set_len(self.mark) {
            tracing::warn!(path = %self.path.display(), error = %e,
                "cannot cut a partly written group back; the retry may follow a torn record");
        }
    }

    fn verify(&mut self) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let named = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if named == Some(self.id) {
            return Ok(true);
        }
        tracing::warn!(path = %self.path.display(),
            "the output file was deleted, replaced or repointed; reopening its path");
        *self = OutFile::open(&self.path)?;
        Ok(false)
    }
}

impl FileSink {
    /// Opens (creating if needed) the output file for appending.
    pub fn new(c: &FileSinkConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let o = &c.ownership;
        if (o.mode.is_some() || o.uid.is_some() || o.gid.is_some()) && !c.path.exists() {
            // Created with the sink's ownership; kept as they are after.
            drop(super::files::open_created(&c.path, o).map_err(|e| {
                anyhow::anyhow!("file sink: cannot create {}: {e}", c.path.display())
            })?);
        }
        let file = OutFile::open(&c.path)
            .map_err(|e| anyhow::anyhow!("file sink: cannot open {}: {e}", c.path.display()))?;
        Ok(Self {
            encoding: c.encoding.clone(),
            fsync: c.fsync,
            file: Mutex::new(Some(file)),
            metrics,
        })
    }
}

impl Sink for FileSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        writer::encode(&self.encoding, batch, out, &self.metrics);
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(async move {
            let Some(file) = self.file.lock().take() else {
                return;
            };
            writer::run(file, rx, self.fsync, self.metrics.clone()).await;
        })
    }
}

/// Registration of `type: file`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "file",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| FileSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for FileSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    fn type_name(&self) -> &'static str {
        "file"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        if let Some(t) = &self.template {
            return Ok(std::sync::Arc::new(super::files::TemplatedFileSink::new(
                t.clone(),
                self.encoding.clone(),
                self.fsync,
                self.ownership.clone(),
                self.max_open_files,
                metrics,
            )));
        }
        Ok(std::sync::Arc::new(FileSink::new(self, metrics)?))
    }

    fn output_file(&self) -> Option<petrel_core::plugin::OutputFile<'_>> {
        Some(petrel_core::plugin::OutputFile {
            path: &self.path,
            key: "path",
            read_back: self.read_back,
        })
    }
}

#[cfg(test)]
mod torn_tail_tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_line_cut_by_a_crash_is_ended_before_new_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.log");
        std::fs::write(&p, b"whole\ncut in th").unwrap();
        let mut f = OutFile::open(&p).unwrap();
        f.write_all(b"next\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"whole\ncut in th\nnext\n");
        // A file ending with a newline is left as it is.
        drop(f);
        let mut f = OutFile::open(&p).unwrap();
        f.write_all(b"more\n").unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"whole\ncut in th\nnext\nmore\n"
        );
    }
}
