//! The input thread: one thread that discovers and reads files for every
//! file source of every pipeline, commits checkpoints, and drains on
//! shutdown.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::metrics::Labels;
use petrel_core::Metrics;

use super::checkpoint::{CheckpointStore, Entry, Snapshot};
use super::discovery::{Discovery, Found, Patterns};
use super::identity::{FileId, Fingerprint};
use super::reader::{FileReader, ReadContext, Turn};
use super::{FileSourceConfig, ReadFrom};

/// Blocks read from one file before moving to the next, for fairness.
const BLOCKS_PER_TURN: usize = 4;

/// One file source of one pipeline, registered with the input thread.
pub struct SourceSpec {
    /// `pipeline/source id`, the checkpoint key.
    pub key: String,
    /// Pipeline name, for metric labels.
    pub pipeline: String,
    /// The source's settings.
    pub config: FileSourceConfig,
    /// Read settings and handles.
    pub ctx: ReadContext,
}

struct SourceState {
    spec: SourceSpec,
    readers: HashMap<FileId, FileReader>,
    /// Readers closed while batches were in flight: kept until answered so
    /// their offsets still reach the checkpoint.
    closing: Vec<(
        FileId,
        Fingerprint,
        String,
        Arc<super::tracker::OffsetTracker>,
    )>,
}

/// Settings of the input thread.
pub struct ServiceOptions {
    /// Where checkpoints live.
    pub data_dir: PathBuf,
    /// Full rescan period while inotify works.
    pub rescan_interval: Duration,
    /// Full rescan period when inotify is unavailable or over its limits.
    pub poll_interval: Duration,
    /// Checkpoint write period.
    pub checkpoint_interval: Duration,
    /// A file that was deleted while open is closed at its end, or after
    /// this long even if it could not be read to its end (the unread rest
    /// is counted as discarded), so its disk space is released.
    pub deleted_file_timeout: Duration,
    /// A file renamed away from the matched paths is closed after it has
    /// been at its end, not growing, for this long.
    pub rotated_file_idle: Duration,
    /// Upper bound on waiting for in-flight data at shutdown.
    pub shutdown_timeout: Duration,
    /// Once every file is read to its end, how long to let new writes
    /// accumulate after being woken before reading them.
    pub idle_read_delay: Duration,
}

/// The running input thread.
pub struct FileService {
    handle: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl FileService {
    /// Loads checkpoints and starts the thread.
    pub fn start(
        specs: Vec<SourceSpec>,
        opts: ServiceOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let store = CheckpointStore::open(&opts.data_dir)
            .map_err(|e| anyhow::anyhow!("data dir {}: {e}", opts.data_dir.display()))?;
        let saved = store.load()?;
        let patterns: Vec<Patterns> = specs
            .iter()
            .map(|s| Patterns {
                include: s.config.include.clone(),
                exclude: s.config.exclude.clone(),
            })
            .collect();
        let discovery = Discovery::new(&patterns)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut state = Input {
            sources: specs
                .into_iter()
                .map(|spec| SourceState {
                    spec,
                    readers: HashMap::new(),
                    closing: Vec::new(),
                })
                .collect(),
            discovery,
            store,
            saved,
            opts,
            metrics,
            first_scan: true,
            stop: stop.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("petrel-input".into())
            .spawn(move || state.run())?;
        Ok(Self {
            handle: Some(handle),
            stop,
        })
    }

    /// False once the input thread ended without being asked to (a panic).
    pub fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Stops reading, waits for in-flight data to be acknowledged (bounded),
    /// and writes the final checkpoint.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Input {
    sources: Vec<SourceState>,
    discovery: Discovery,
    store: CheckpointStore,
    saved: Snapshot,
    opts: ServiceOptions,
    metrics: Arc<Metrics>,
    first_scan: bool,
    stop: Arc<AtomicBool>,
}

impl Input {
    fn run(&mut self) {
        let mut next_scan = Instant::now();
        let mut next_checkpoint = Instant::now() + self.opts.checkpoint_interval;
        let mut next_refresh = Instant::now();
        // inotify asks for a rescan on every create or delete; a directory
        // where files come and go all the time must not turn the loop into
        // back-to-back scans.
        const MIN_RESCAN_GAP: Duration = Duration::from_millis(50);
        let mut last_scan = Instant::now() - MIN_RESCAN_GAP;
        let mut rescan_wanted = false;
        while !self.stop.load(Ordering::SeqCst) {
            let changes = self.discovery.changes();
            let now = Instant::now();
            if !changes.renamed.is_empty() {
                self.follow_renames(&changes.renamed);
            }
            rescan_wanted |= changes.rescan;
            let rescan_due = rescan_wanted && now >= last_scan + MIN_RESCAN_GAP;
            if rescan_due || now >= next_scan {
                rescan_wanted = false;
                last_scan = now;
                self.scan();
                let period = if self.discovery.degraded {
                    self.opts.poll_interval
                } else {
                    self.opts.rescan_interval
                };
                next_scan = Instant::now() + period;
            }
            if !changes.modified.is_empty() {
                self.mark_modified(&changes.modified);
            }
            if now >= next_refresh {
                self.refresh_all();
                next_refresh = now + Duration::from_millis(250);
            }
            let (progress, paused) = self.read_round();
            if now >= next_checkpoint {
                self.checkpoint();
                self.update_gauges();
                next_checkpoint = now + self.opts.checkpoint_interval;
            }
            if !progress {
                let wait = if paused {
                    Duration::from_millis(5)
                } else {
                    let mut until = next_refresh.min(next_scan).min(next_checkpoint);
                    if rescan_wanted {
                        until = until.min(last_scan + MIN_RESCAN_GAP);
                    }
                    until
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(250))
                };
                let slept = Instant::now();
                self.wait(wait);
                if !paused && slept.elapsed() < wait {
                    // Woken by a write after catching up. A logger that
                    // writes every few milliseconds (or every line) would
                    // otherwise cost a read, a batch and a hand-off through
                    // every stage per write; waiting a little reads those
                    // writes together.
                    std::thread::sleep(self.opts.idle_read_delay);
                }
            }
        }
        self.drain();
    }

    /// Sleeps until inotify has news or `d` passed.
    fn wait(&self, d: Duration) {
        let ms = d.as_millis().min(i32::MAX as u128) as i32;
        match self.discovery.fd() {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe {
                    libc::poll(&mut pfd, 1, ms);
                }
            }
            None => std::thread::sleep(d),
        }
    }

    fn scan(&mut self) {
        let found = self.discovery.scan();
        let first = std::mem::replace(&mut self.first_scan, false);
        for (src, files) in self.sources.iter_mut().zip(found) {
            let saved = self.saved.remove(&src.spec.key);
            // `read_from: end` is for a source's very first start: once it
            // has a checkpoint, a file it does not know appeared while the
            // agent was down (a rotation) and is read from its beginning.
            let may_start_at_end = first && saved.is_none();
            let saved = saved.unwrap_or_default();
            let present: HashMap<FileId, &Found> = files.iter().map(|f| (f.id, f)).collect();
            for f in &files {
                if let Some(r) = src.readers.get_mut(&f.id) {
                    r.set_path(f.path.clone());
                    r.detached_since = None;
                    continue;
                }
                if let Some(r) = open_reader(&src.spec, f, &saved, may_start_at_end) {
                    src.readers.insert(f.id, r);
                }
            }
            let now = Instant::now();
            if first {
                resume_unmatched(src, &saved, &present, now);
            }
            for r in src.readers.values_mut() {
                if !present.contains_key(&r.id) && r.detached_since.is_none() {
                    tracing::debug!(path = %r.path.display(), "file left the matched paths (rotated or deleted); reading it to its end");
                    r.detached_since = Some(now);
                    r.dirty = true;
                }
            }
        }
    }

    /// Opens files that were renamed away from a matched path before any
    /// scan saw them there; they are read from the start (they are new to
    /// this source) and closed like any rotated file once read.
    fn follow_renames(&mut self, renames: &[(PathBuf, PathBuf)]) {
        let now = Instant::now();
        for (src_idx, f) in self.discovery.renamed_files(renames) {
            let Some(src) = self.sources.get_mut(src_idx) else {
                continue;
            };
            if let Some(r) = src.readers.get_mut(&f.id) {
                r.set_path(f.path.clone());
                r.dirty = true;
                continue;
            }
            if let Some(mut r) = open_reader(&src.spec, &f, &HashMap::new(), false) {
                tracing::debug!(path = %f.path.display(), "following a file rotated before it was seen");
                r.detached_since = Some(now);
                src.readers.insert(f.id, r);
            }
        }
    }

    fn mark_modified(&mut self, paths: &[PathBuf]) {
        let paths: std::collections::HashSet<&PathBuf> = paths.iter().collect();
        for src in &mut self.sources {
            for r in src.readers.values_mut() {
                if paths.contains(&r.path) {
                    r.dirty = true;
                }
            }
        }
    }

    fn refresh_all(&mut self) {
        let now = Instant::now();
        for src in &mut self.sources {
            let mut close = Vec::new();
            for r in src.readers.values_mut() {
                r.refresh(&src.spec.ctx);
                if r.deleted && r.detached_since.is_none() {
                    r.detached_since = Some(now);
                }
                let Some(since) = r.detached_since else {
                    continue;
                };
                let at_end = r.read_offset() >= r.size && !r.has_partial();
                if r.deleted {
                    if at_end {
                        close.push(r.id);
                    } else if since.elapsed() >= self.opts.deleted_file_timeout {
                        let unread = r.size.saturating_sub(r.read_offset());
                        tracing::warn!(path = %r.path.display(), unread_bytes = unread,
                            "deleted file not read to its end within deleted_file_timeout; closing it to release disk space");
                        src.spec.ctx.read_errors.inc();
                        close.push(r.id);
                    }
                } else if at_end && since.elapsed() >= self.opts.rotated_file_idle {
                    close.push(r.id);
                }
            }
            for id in close {
                if let Some(mut r) = src.readers.remove(&id) {
                    r.close();
                    remove_file_gauges(&self.metrics, &src.spec.pipeline, &r.path);
                    src.closing.push((
                        r.id,
                        r.fingerprint,
                        r.path.to_string_lossy().into_owned(),
                        r.tracker.clone(),
                    ));
                }
            }
            src.closing.retain(|c| c.3.in_flight() > 0);
        }
    }

    /// One pass over readers with work; returns (progress made, paused).
    fn read_round(&mut self) -> (bool, bool) {
        let mut progress = false;
        let mut paused = false;
        for src in &mut self.sources {
            for r in src.readers.values_mut() {
                // A failed delivery must be read again even when the file
                // does not grow any more.
                if !r.dirty && !r.has_partial() && !r.tracker.failed() {
                    continue;
                }
                match r.read_turn(&src.spec.ctx, BLOCKS_PER_TURN) {
                    Turn::More => progress = true,
                    Turn::Eof => r.dirty = false,
                    Turn::Paused => paused = true,
                    Turn::Failed => r.dirty = false,
                }
            }
        }
        (progress, paused)
    }

    fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::new();
        for src in &self.sources {
            let m = snap.entry(src.spec.key.clone()).or_default();
            for r in src.readers.values() {
                m.insert(
                    r.id,
                    Entry {
                        id: r.id,
                        fingerprint: r.fingerprint,
                        offset: r.tracker.committed(),
                        path: r.path.to_string_lossy().into_owned(),
                    },
                );
            }
            for (id, fp, path, t) in &src.closing {
                m.entry(*id).or_insert_with(|| Entry {
                    id: *id,
                    fingerprint: *fp,
                    offset: t.committed(),
                    path: path.clone(),
                });
            }
        }
        // Entries of sources whose files were not seen yet stay as loaded.
        for (k, v) in &self.saved {
            snap.entry(k.clone()).or_insert_with(|| v.clone());
        }
        snap
    }

    fn checkpoint(&mut self) {
        let snap = self.snapshot();
        match self.store.save(&snap) {
            Ok(true) => {
                self.metrics.checkpoint_writes.inc();
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(path = %self.store.path().display(), error = %e, "cannot write checkpoint")
            }
        }
    }

    fn update_gauges(&self) {
        for src in &self.sources {
            let p = &src.spec.pipeline;
            self.metrics
                .files_open
                .get_or_create(&vec![("pipeline".to_string(), p.clone())])
                .set(src.readers.len() as i64);
            for r in src.readers.values() {
                let l = file_labels(p, &r.path);
                let committed = r.tracker.committed();
                self.metrics
                    .file_read_offset
                    .get_or_create(&l)
                    .set(r.read_offset() as i64);
                self.metrics
                    .file_committed_offset
                    .get_or_create(&l)
                    .set(committed as i64);
                self.metrics.file_size.get_or_create(&l).set(r.size as i64);
                self.metrics
                    .file_lag
                    .get_or_create(&l)
                    .set(r.size.saturating_sub(committed) as i64);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.sources
            .iter()
            .map(|s| {
                s.readers
                    .values()
                    .map(|r| r.tracker.in_flight())
                    .sum::<usize>()
                    + s.closing.iter().map(|c| c.3.in_flight()).sum::<usize>()
            })
            .sum()
    }

    /// Waits (bounded) until every emitted batch was answered, then writes
    /// the final checkpoint.
    fn drain(&mut self) {
        let deadline = Instant::now() + self.opts.shutdown_timeout;
        loop {
            let n = self.in_flight();
            if n == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    batches = n,
                    "shutdown timeout: batches still in flight will be read again at next start"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.checkpoint();
        self.update_gauges();
        tracing::info!(path = %self.store.path().display(), "final checkpoint written");
    }
}

/// Files the checkpoint still has unread data of but that no include
/// pattern matches any more: rotated to a name outside the globs while the
/// agent was down (`app.log` → `app.log.1`). Each is looked up at its last
/// known path, then by identity in that directory, and read to its end
/// like any rotated file. One that is gone is reported, since its unread
/// tail is lost.
fn resume_unmatched(
    src: &mut SourceState,
    saved: &HashMap<FileId, Entry>,
    present: &HashMap<FileId, &Found>,
    now: Instant,
) {
    let mut dirs: HashMap<PathBuf, Vec<(FileId, PathBuf)>> = HashMap::new();
    for (id, e) in saved {
        if present.contains_key(id) || src.readers.contains_key(id) {
            continue;
        }
        let last = PathBuf::from(&e.path);
        let at_last = std::fs::metadata(&last)
            .ok()
            .filter(|m| FileId::of(m) == *id)
            .map(|_| last.clone());
        let path = at_last.or_else(|| {
            let dir = last.parent()?.to_path_buf();
            dirs.entry(dir.clone())
                .or_insert_with(|| files_in(&dir))
                .iter()
                .find(|(i, _)| i == id)
                .map(|(_, p)| p.clone())
        });
        let Some(path) = path else {
            tracing::warn!(path = %e.path, offset = e.offset,
                "a checkpointed file is gone: anything written to it after this offset was not read");
            continue;
        };
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if e.offset >= size {
            continue;
        }
        let found = Found { path, id: *id };
        match open_reader(&src.spec, &found, saved, false) {
            // Only where the checkpoint's fingerprint still matches: an
            // inode reused by an unrelated file would be read from 0.
            Some(mut r) if r.read_offset() == e.offset => {
                tracing::info!(path = %found.path.display(), offset = e.offset,
                    "finishing a file rotated away while the agent was down");
                r.detached_since = Some(now);
                r.dirty = true;
                src.readers.insert(*id, r);
            }
            _ => {}
        }
    }
}

/// Regular files directly in `dir`, with their identities (bounded).
fn files_in(dir: &std::path::Path) -> Vec<(FileId, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .take(100_000)
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file().then(|| (FileId::of(&m), e.path()))
        })
        .collect()
}

fn open_reader(
    spec: &SourceSpec,
    f: &Found,
    saved: &HashMap<FileId, Entry>,
    may_start_at_end: bool,
) -> Option<FileReader> {
    let file = match std::fs::File::open(&f.path) {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(path = %f.path.display(), error = %e, "cannot open file");
            spec.ctx.read_errors.inc();
            return None;
        }
    };
    let meta = file.metadata().ok()?;
    let id = FileId::of(&meta);
    if id != f.id {
        return None; // replaced between scan and open; the next scan sees it
    }
    let size = meta.len();
    let fp = Fingerprint::read(&file, size).ok()?;
    let resumed = saved.get(&id).and_then(|e| {
        let same = e.fingerprint.len <= fp.len
            && Fingerprint::read_len(&file, e.fingerprint.len as usize).ok() == Some(e.fingerprint);
        (same && e.offset <= size).then_some(e.offset)
    });
    let offset = match resumed {
        Some(o) => o,
        None if may_start_at_end && spec.config.read_from == ReadFrom::End => size,
        None => 0,
    };
    tracing::debug!(path = %f.path.display(), offset, resumed = resumed.is_some(), "watching file");
    Some(FileReader::open(f.path.clone(), offset, fp, file, id))
}

fn file_labels(pipeline: &str, path: &std::path::Path) -> Labels {
    vec![
        ("pipeline".to_string(), pipeline.to_string()),
        ("path".to_string(), path.to_string_lossy().into_owned()),
    ]
}

fn remove_file_gauges(m: &Metrics, pipeline: &str, path: &std::path::Path) {
    let l = file_labels(pipeline, path);
    m.file_read_offset.remove(&l);
    m.file_committed_offset.remove(&l);
    m.file_size.remove(&l);
    m.file_lag.remove(&l);
}
