//! The file sink with a templated path (`path: /var/log/{{ host }}/app.log`,
//! rsyslog's dynaFile, syslog-ng's `file("/var/log/$HOST/...")`): each
//! event goes to the file its fields name, created with the sink's
//! `owner`, `group` and `mode`, at most `max_open_files` open at once.
//!
//! Encoding renders each event's path with its record; the writer groups
//! a payload's records by file and appends each group in one write. A
//! payload is acknowledged once every one of its groups is written (and
//! synced with `fsync`); a group that fails is cut back to where it began
//! and written again, the groups already written are not. Files are kept
//! open in least-recently-used order and closed beyond the bound, so a
//! thousand hosts through a sink bounded to 64 files keep 64 descriptors.
//!
//! A field value cannot add directories to the path: `/` and NUL in it
//! become `_`, and a value that is `.` or `..` becomes `_` too; a missing
//! field is written `unknown` (counted, `error_type="template_field_missing"`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, Payload, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::template::Template;

/// Most payloads written per blocking call.
const MAX_PAYLOADS_PER_WRITE: usize = 64;

/// What a templated file sink needs besides its encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// Permission bits of the files it creates (`None`: 0666 less the
    /// umask, as any program's).
    pub mode: Option<u32>,
    /// Owner of files it creates (`chown`), when set.
    pub uid: Option<u32>,
    /// Group of files it creates, when set.
    pub gid: Option<u32>,
}

/// The file of each record of a payload: distinct paths, and an index
/// into them per record (the payload's attachment).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PathRoutes {
    /// Distinct paths of the payload.
    pub paths: Vec<PathBuf>,
    /// Index into `paths` per record.
    pub path_of: Vec<u32>,
}

impl PathRoutes {
    /// Writes the routes for a disk buffer.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.paths.len() as u32).to_le_bytes());
        for p in &self.paths {
            let b = p.as_os_str().as_encoded_bytes();
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        out.extend_from_slice(&(self.path_of.len() as u32).to_le_bytes());
        for i in &self.path_of {
            out.extend_from_slice(&i.to_le_bytes());
        }
    }

    /// Reads what [`PathRoutes::write`] wrote; `None` when `b` is not that.
    pub fn read(mut b: &[u8]) -> Option<Self> {
        use petrel_core::le::{take, take_u32 as u32_};
        let n = u32_(&mut b)? as usize;
        let mut paths = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let len = u32_(&mut b)? as usize;
            let raw = take(&mut b, len)?;
            paths.push(PathBuf::from(std::str::from_utf8(raw).ok()?));
        }
        let n = u32_(&mut b)? as usize;
        let mut path_of = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let i = u32_(&mut b)?;
            if i as usize >= paths.len() {
                return None;
            }
            path_of.push(i);
        }
        b.is_empty().then_some(Self { paths, path_of })
    }
}

/// Appends the path-safe form of a field value: `/` and NUL become `_`,
/// `.` and `..` become `_`, a missing value `unknown`.
fn path_value(v: Option<&str>, out: &mut String) {
    match v {
        None => out.push_str("unknown"),
        Some(".") | Some("..") => out.push('_'),
        Some(v) => out.extend(
            v.chars()
                .map(|c| if c == '/' || c == '\0' { '_' } else { c }),
        ),
    }
}

/// The running templated file sink.
pub struct TemplatedFileSink {
    path: Template,
    encoding: Encoding,
    fsync: bool,
    ownership: Ownership,
    max_open_files: usize,
    metrics: ComponentMetrics,
}

impl TemplatedFileSink {
    /// A sink writing events to the files `path` renders.
    pub fn new(
        path: Template,
        encoding: Encoding,
        fsync: bool,
        ownership: Ownership,
        max_open_files: usize,
        metrics: ComponentMetrics,
    ) -> Self {
        Self {
            path,
            encoding,
            fsync,
            ownership,
            max_open_files: max_open_files.max(1),
            metrics,
        }
    }
}

impl Sink for TemplatedFileSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        let stats = encode_batch(
            &self.encoding,
            batch,
            &mut out.bytes,
            Some(&mut out.record_ends),
        );
        super::count_encode_stats(&self.metrics, &stats);
        out.invalid_utf8 = stats.invalid_utf8;
        let mut routes = PathRoutes::default();
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut text = String::new();
        let mut missing = 0u64;
        for ev in &batch.events {
            missing += u64::from(self.path.render_values(ev, batch, &mut text, path_value));
            let i = match index.get(&text) {
                Some(&i) => i,
                None => {
                    let i = routes.paths.len() as u32;
                    routes.paths.push(PathBuf::from(&text));
                    index.insert(text.clone(), i);
                    i
                }
            };
            routes.path_of.push(i);
        }
        if missing > 0 {
            self.metrics.error("template_field_missing", missing);
        }
        out.attachment = Some(Box::new(routes));
    }

    fn write_attachment(
        &self,
        attachment: &(dyn std::any::Any + Send + Sync),
        out: &mut Vec<u8>,
    ) -> bool {
        match attachment.downcast_ref::<PathRoutes>() {
            Some(r) => {
                r.write(out);
                true
            }
            None => false,
        }
    }

    fn read_attachment(&self, bytes: &[u8]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        PathRoutes::read(bytes).map(|r| Box::new(r) as _)
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(run(self, rx))
    }
}

/// One open output file.
struct Open {
    file: File,
    /// Device and inode, to notice a file deleted or replaced.
    id: (u64, u64),
    /// Use order: the smallest is closed first.
    used: u64,
}

/// The open files, at most `max` of them.
struct Files {
    open: HashMap<PathBuf, Open>,
    max: usize,
    clock: u64,
    ownership: Ownership,
}

impl Files {
    /// The open file of `path`, opened (and created, with the sink's
    /// ownership) when needed; the least recently used file is closed
    /// first when `max` are open.
    fn get(&mut self, path: &Path) -> std::io::Result<&mut Open> {
        self.clock += 1;
        let clock = self.clock;
        let stale = match self.open.get(path) {
            Some(o) => std::fs::metadata(path)
                .map(|m| (m.dev(), m.ino()) != o.id)
                .unwrap_or(true),
            None => false,
        };
        if stale {
            // Deleted or replaced (logrotate): the path is opened again.
            self.open.remove(path);
        }
        if !self.open.contains_key(path) {
            while self.open.len() >= self.max {
                let Some(oldest) = self
                    .open
                    .iter()
                    .min_by_key(|(_, o)| o.used)
                    .map(|(p, _)| p.clone())
                else {
                    break;
                };
                self.open.remove(&oldest);
            }
            let file = open_created(path, &self.ownership)?;
            let m = file.metadata()?;
            self.open.insert(
                path.to_path_buf(),
                Open {
                    file,
                    id: (m.dev(), m.ino()),
                    used: clock,
                },
            );
        }
        let o = self
            .open
            .get_mut(path)
            .ok_or_else(|| std::io::Error::other("file vanished from the open set"))?;
        o.used = clock;
        Ok(o)
    }
}

/// Opens `path` for appending, creating it (and its directories) with
/// `ownership` when it does not exist.
pub(super) fn open_created(path: &Path, ownership: &Ownership) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let existed = path.exists();
    let mut opts = OpenOptions::new();
    opts.create(true).append(true);
    if let Some(mode) = ownership.mode {
        opts.mode(mode);
    }
    let file = opts.open(path)?;
    if !existed {
        if let Some(mode) = ownership.mode {
            // The mode given to open is filtered by the umask: set it as
            // asked.
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        if ownership.uid.is_some() || ownership.gid.is_some() {
            std::os::unix::fs::fchown(&file, ownership.uid, ownership.gid)?;
        }
    }
    Ok(file)
}

async fn run(sink: Arc<TemplatedFileSink>, mut rx: PayloadReceiver) {
    let m = sink.metrics.clone();
    let errors = m.error_counter("write_failed");
    let mut files = Some(Files {
        open: HashMap::new(),
        max: sink.max_open_files,
        clock: 0,
        ownership: sink.ownership.clone(),
    });
    let mut batch: Vec<Payload> = Vec::new();
    loop {
        if rx.recv_many(&mut batch, MAX_PAYLOADS_PER_WRITE).await == 0 {
            return;
        }
        // Per file, the bytes of this group's records, in order; groups
        // written are removed, so a retry writes only the others.
        let mut groups = group_by_file(&batch);
        let mut backoff = Duration::from_millis(100);
        loop {
            let Some(mut f) = files.take() else { return };
            let fsync = sink.fsync;
            let work = std::mem::take(&mut groups);
            let joined = tokio::task::spawn_blocking(move || {
                let rest = write_groups(&mut f, work, fsync);
                (f, rest)
            })
            .await;
            let Ok((f, rest)) = joined else {
                tracing::error!("templated file sink: writer task panicked");
                return;
            };
            files = Some(f);
            match rest {
                Ok(()) => break,
                Err((left, e)) => {
                    groups = left;
                    errors.inc();
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "file sink write failed; retrying the files not written");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        for p in batch.drain(..) {
            m.sent_events.inc_by(p.events);
            m.sent_bytes.inc_by(p.data.data().len() as u64);
            p.ack.ack();
        }
    }
}

/// The records of `batch` by file, in order of first appearance.
fn group_by_file(batch: &[Payload]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut groups: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let mut at: HashMap<PathBuf, usize> = HashMap::new();
    for p in batch {
        let Some(routes) = p
            .data
            .attachment
            .as_ref()
            .and_then(|a| a.downcast_ref::<PathRoutes>())
        else {
            continue;
        };
        let data = p.data.data();
        let mut start = 0usize;
        for (rec, &end) in p.data.record_ends.iter().enumerate() {
            let end = end as usize;
            let bytes = data.get(start..end).unwrap_or_default();
            start = end;
            let Some(path) = routes
                .path_of
                .get(rec)
                .and_then(|&i| routes.paths.get(i as usize))
            else {
                continue;
            };
            let g = match at.get(path) {
                Some(&g) => g,
                None => {
                    groups.push((path.clone(), Vec::new()));
                    at.insert(path.clone(), groups.len() - 1);
                    groups.len() - 1
                }
            };
            groups[g].1.extend_from_slice(bytes);
        }
    }
    groups
}

/// Writes each group to its file; on the first failure, that group is cut
/// back and it and the ones after it are returned with the error.
#[allow(clippy::type_complexity)]
fn write_groups(
    files: &mut Files,
    groups: Vec<(PathBuf, Vec<u8>)>,
    fsync: bool,
) -> Result<(), (Vec<(PathBuf, Vec<u8>)>, std::io::Error)> {
    let mut iter = groups.into_iter();
    while let Some((path, bytes)) = iter.next() {
        let res = (|| {
            let o = files.get(&path)?;
            let mark = o.file.metadata()?.len();
            let written =
                o.file
                    .write_all(&bytes)
                    .and_then(|()| if fsync { o.file.sync_data() } else { Ok(()) });
            if let Err(e) = written {
                // A torn group would be followed by its retry: cut it.
                let _ = o.file.set_len(mark);
                files.open.remove(&path);
                return Err(e);
            }
            Ok(())
        })();
        if let Err(e) = res {
            let mut left = vec![(path, bytes)];
            left.extend(iter);
            return Err((left, e));
        }
    }
    Ok(())
}

/// Resolves a user name or number for `owner`.
pub fn user_id(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam with a NUL-terminated name; the result is read at
    // once, before any other call that could reuse its buffer.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    // SAFETY: non-null results point at a valid passwd entry.
    (!pw.is_null()).then(|| unsafe { (*pw).pw_uid })
}

/// Resolves a group name or number for `group`.
pub fn group_id(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: as in `user_id`, for getgrnam.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    // SAFETY: non-null results point at a valid group entry.
    (!gr.is_null()).then(|| unsafe { (*gr).gr_gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cannot_add_directories() {
        let mut s = String::new();
        path_value(Some("a/b"), &mut s);
        path_value(Some(".."), &mut s);
        path_value(None, &mut s);
        assert_eq!(s, "a_b_unknown");
    }

    #[test]
    fn routes_round_trip_and_refuse_garbage() {
        let r = PathRoutes {
            paths: vec!["/a/x.log".into(), "/b/y.log".into()],
            path_of: vec![0, 1, 1, 0],
        };
        let mut b = Vec::new();
        r.write(&mut b);
        assert_eq!(PathRoutes::read(&b), Some(r));
        assert_eq!(PathRoutes::read(&b[..b.len() - 1]), None);
        assert_eq!(PathRoutes::read(b"\x01\0\0\0"), None);
    }

    #[test]
    fn the_least_recently_used_file_is_closed_beyond_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files {
            open: HashMap::new(),
            max: 2,
            clock: 0,
            ownership: Ownership {
                mode: Some(0o640),
                uid: None,
                gid: None,
            },
        };
        let groups: Vec<(PathBuf, Vec<u8>)> = ["a", "b", "a", "c", "a"]
            .iter()
            .map(|n| {
                (
                    dir.path().join(n).join("out.log"),
                    format!("{n}\n").into_bytes(),
                )
            })
            .collect();
        assert!(write_groups(&mut files, groups, false).is_ok());
        assert_eq!(files.open.len(), 2);
        assert!(files.open.contains_key(&dir.path().join("a/out.log")));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/out.log")).unwrap(),
            "a\na\na\n"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("c/out.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
    }
}
