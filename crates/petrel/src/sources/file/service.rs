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

/// How often a file with nothing going on (read to its end, nothing in
/// flight, not renamed away) is looked at while inotify works: inotify
/// reports its writes, truncation and deletion, so this is only a
/// backstop. A stat and a fingerprint read every 250 ms per file cost 10 %
/// of a core with 10,000 idle files (BENCHMARKS.md).
const IDLE_REFRESH: Duration = Duration::from_secs(5);

/// A checkpoint is written early, at most every [`EARLY_CHECKPOINT_GAP`],
/// once this many bytes were committed since the last one: at full speed
/// one checkpoint interval is hundreds of megabytes, all of which a crash
/// would deliver again.
const EARLY_CHECKPOINT_BYTES: u64 = 4 << 20;
const EARLY_CHECKPOINT_GAP: Duration = Duration::from_millis(100);

/// Set when a file could not be opened for lack of descriptors (EMFILE,
/// ENFILE): idle files are then closed at once instead of after
/// `close_inactive`, and files are read in waves rather than not at all.
static FD_PRESSURE: AtomicBool = AtomicBool::new(false);

/// One file source of one pipeline, registered with the input thread.
pub struct SourceSpec {
    /// `pipeline/source id`, the checkpoint key.
    pub key: String,
    /// Pipeline name, for metric labels.
    pub pipeline: String,
    /// Files this agent writes that this source must never read, checked
    /// by identity at each scan (globs alone miss hard links and mounts).
    pub own_outputs: Arc<Vec<PathBuf>>,
    /// The source's settings.
    pub config: FileSourceConfig,
    /// Read settings and handles.
    pub ctx: ReadContext,
    /// Per-file choice, metadata and decoding, for sources that read other
    /// programs' log files (container logs); `None`: every matched file,
    /// read line by line with the source's metadata.
    pub select: Option<Arc<dyn FileSelector>>,
    /// The `source_type` of the events.
    pub source_type: &'static str,
}

/// What a source with a [`FileSelector`] does with one file.
pub struct Selected {
    /// Metadata fields of the file's events.
    pub meta: Arc<[(petrel_core::Key, Arc<str>)]>,
    /// How its lines become messages.
    pub decoder: Option<Box<dyn super::decode::LineDecoder>>,
}

/// Decides which matched files a source reads and what their events carry.
/// Asked when a file is about to be opened (so once per file, not per
/// event), and again for open files when [`FileSelector::generation`]
/// changes.
pub trait FileSelector: Send + Sync {
    /// `None`: not read, for now (asked again at the next scan).
    fn select(&self, path: &std::path::Path) -> Option<Selected>;
    /// Changes whenever `select` may answer differently (new metadata).
    fn generation(&self) -> u64;
    /// Include globs that follow the metadata (files inside running
    /// containers, under `/proc/<pid>/root`): asked when the generation
    /// changes; `None` keeps the configured ones.
    fn include(&self) -> Option<Vec<String>> {
        None
    }
}

struct SourceState {
    spec: SourceSpec,
    /// Scanned at least once (checkpoint and `read_from` applied).
    scanned: bool,
    /// The checkpoint had entries for this source at its first scan.
    had_checkpoint: bool,
    /// Being removed: reading stopped, waiting for in-flight batches.
    stopping: Option<(Instant, std::sync::mpsc::Sender<bool>)>,
    /// The selector's generation the open readers' metadata is from.
    select_generation: u64,
    readers: HashMap<FileId, FileReader>,
    /// Checkpointed files not open now: not seen yet since the start (a
    /// directory mounted late, briefly unreadable), or closed while idle.
    /// Each resumes at its offset when its file is seen again, and is
    /// forgotten after `checkpoint_ttl`.
    pending: HashMap<FileId, Entry>,
    /// Readers closed while batches were in flight: kept until answered so
    /// their offsets still reach the checkpoint.
    closing: Vec<(
        FileId,
        Fingerprint,
        String,
        Arc<super::tracker::OffsetTracker>,
    )>,
    /// The pipeline's `petrel_files_open` gauge, once looked up.
    files_open: Option<prometheus_client::metrics::gauge::Gauge>,
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
    /// A file at its end that did not grow for this long is closed (its
    /// offset kept) and reopened when it grows, so that many idle files do
    /// not hold a descriptor each.
    pub close_inactive: Duration,
    /// How long the offsets of a file that is not seen are kept.
    pub checkpoint_ttl: Duration,
    /// Once every file is read to its end, how long to let new writes
    /// accumulate after being woken before reading them.
    pub idle_read_delay: Duration,
}

/// Changes to the set of sources, sent to the input thread.
enum Command {
    /// Start reading for a new source.
    Add(Box<SourceSpec>),
    /// Stop reading for the source with this key; answer once its
    /// in-flight batches are answered (or `deadline` passed) and its
    /// offsets are in a written checkpoint (`true`) or not (`false`).
    Remove {
        key: String,
        deadline: Instant,
        done: std::sync::mpsc::Sender<bool>,
    },
}

/// The running input thread, shared by every file source of every
/// pipeline. Sources join and leave while it runs (configuration reload),
/// without disturbing the others.
pub struct FileService {
    handle: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
    commands: crossbeam_channel::Sender<Command>,
    wake: Arc<Wake>,
}

/// An eventfd the input thread polls beside inotify, so that a command
/// (a source added or stopped by a reload) is seen at once rather than
/// after the thread's idle sleep.
struct Wake(std::os::fd::OwnedFd);

impl Wake {
    fn new() -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn raw(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our (non-blocking) eventfd.
        unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl FileService {
    /// Loads checkpoints and starts the thread, with no sources yet.
    pub fn start(opts: ServiceOptions, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let store = CheckpointStore::open(&opts.data_dir)
            .map_err(|e| anyhow::anyhow!("data dir {}: {e}", opts.data_dir.display()))?;
        let saved = store.load()?;
        let discovery = Discovery::new(&[])?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::unbounded();
        let wake = Arc::new(Wake::new()?);
        let mut state = Input {
            sources: Vec::new(),
            discovery,
            store,
            saved,
            opts,
            metrics,
            stop: stop.clone(),
            commands: rx,
            checkpoint_failing: false,
            last_signature: 0,
            wake: wake.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("petrel-input".into())
            .spawn(move || state.run())?;
        Ok(Self {
            handle: parking_lot::Mutex::new(Some(handle)),
            stop,
            commands: tx,
            wake,
        })
    }

    /// Starts reading for `spec`.
    pub fn add(&self, spec: SourceSpec) {
        // Fails only when the thread is gone, which `is_alive` reports.
        let _ = self.commands.send(Command::Add(Box::new(spec)));
        self.wake.notify();
    }

    /// Stops reading for source `key`; the answer says whether its final
    /// offsets were checkpointed.
    pub fn remove(&self, key: &str, deadline: Instant) -> std::sync::mpsc::Receiver<bool> {
        let (done, rx) = std::sync::mpsc::channel();
        let _ = self.commands.send(Command::Remove {
            key: key.to_string(),
            deadline,
            done,
        });
        self.wake.notify();
        rx
    }

    /// False once the input thread ended without being asked to (a panic).
    pub fn is_alive(&self) -> bool {
        self.handle
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Stops the thread after draining what is left.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        if let Some(h) = self.handle.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for FileService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Input {
    sources: Vec<SourceState>,
    discovery: Discovery,
    store: CheckpointStore,
    saved: Snapshot,
    opts: ServiceOptions,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    commands: crossbeam_channel::Receiver<Command>,
    checkpoint_failing: bool,
    /// [`Input::signature`] of the last checkpoint written.
    last_signature: u64,
    wake: Arc<Wake>,
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
        let mut committed_at_checkpoint = super::tracker::COMMITTED_BYTES.load(Ordering::Relaxed);
        let mut last_checkpoint = Instant::now();
        let mut rescan_wanted = false;
        while !self.stop.load(Ordering::SeqCst) {
            if self.handle_commands() {
                rescan_wanted = true;
                last_scan = Instant::now() - MIN_RESCAN_GAP;
            }
            self.finish_stopping();
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
            if !changes.modified.is_empty() && self.mark_modified(&changes.modified) {
                rescan_wanted = true;
            }
            if now >= next_refresh {
                rescan_wanted |= self.refresh_all();
                next_refresh = now + Duration::from_millis(250);
            }
            let budget = self
                .sources
                .first()
                .map(|s| s.spec.ctx.budget.global().clone());
            let epoch = budget.as_ref().map_or(0, |b| b.release_epoch());
            let (progress, paused) = self.read_round();
            let committed = super::tracker::COMMITTED_BYTES.load(Ordering::Relaxed);
            let early = committed.saturating_sub(committed_at_checkpoint) >= EARLY_CHECKPOINT_BYTES
                && now >= last_checkpoint + EARLY_CHECKPOINT_GAP;
            if now >= next_checkpoint || early {
                committed_at_checkpoint = committed;
                last_checkpoint = now;
                self.checkpoint();
                if now >= next_checkpoint {
                    self.update_gauges();
                    next_checkpoint = now + self.opts.checkpoint_interval;
                }
            }
            if !progress {
                if let (true, Some(budget)) = (paused, &budget) {
                    // Woken as soon as a sink's acknowledgement frees
                    // memory; the bound keeps inotify and commands served.
                    budget.wait_for_release(epoch, Duration::from_millis(50));
                    continue;
                }
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
                let written = self.wait(wait);
                if !paused && written && slept.elapsed() < wait {
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

    /// Sleeps until inotify has news, a command arrives, or `d` passed;
    /// true when inotify has news (a command, such as a source added, is
    /// no write to let accumulate).
    fn wait(&self, d: Duration) -> bool {
        let ms = d.as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [
            libc::pollfd {
                fd: self.wake.raw(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.discovery.fd().unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for the duration of the call; a
        // negative fd is ignored by poll.
        unsafe {
            libc::poll(fds.as_mut_ptr(), 2, ms);
        }
        if fds[0].revents != 0 {
            self.wake.clear();
        }
        fds[1].revents != 0
    }

    fn scan(&mut self) {
        let (found, failed) = self.discovery.scan();
        self.metrics.list_errors.inc_by(failed.len() as u64);
        let under_failed = |p: &std::path::Path| failed.iter().any(|d| p.starts_with(d));
        for (src, files) in self.sources.iter_mut().zip(found) {
            if src.stopping.is_some() {
                continue;
            }
            let first = !std::mem::replace(&mut src.scanned, true);
            if first {
                if let Some(saved) = self.saved.remove(&src.spec.key) {
                    src.pending = saved;
                    src.had_checkpoint = true;
                }
            }
            // `read_from: end` is for a source's very first start: once it
            // has a checkpoint, a file it does not know appeared while the
            // agent was down (a rotation) and is read from its beginning.
            let may_start_at_end = first && !src.had_checkpoint;
            let own = own_output_ids(&src.spec.own_outputs);
            let present: HashMap<FileId, &Found> = files.iter().map(|f| (f.id, f)).collect();
            for f in &files {
                if let Some(r) = src.readers.get_mut(&f.id) {
                    r.set_path(f.path.clone());
                    r.detached_since = None;
                    continue;
                }
                if own.contains(&f.id) {
                    continue;
                }
                // Read to its end and idle: opened again once it grows.
                if src.pending.get(&f.id).is_some_and(|e| e.offset == f.size) {
                    continue;
                }
                if let Some(r) = open_reader(&src.spec, f, &src.pending, may_start_at_end) {
                    src.pending.remove(&f.id);
                    src.readers.insert(f.id, r);
                }
            }
            let now = Instant::now();
            if first {
                resume_unmatched(src, &present, now);
            }
            for r in src.readers.values_mut() {
                // A directory that could not be listed keeps its files:
                // failing to list is not the files being gone.
                if !present.contains_key(&r.id)
                    && r.detached_since.is_none()
                    && !under_failed(&r.path)
                {
                    tracing::debug!(path = %r.path.display(), "file left the matched paths (rotated or deleted); reading it to its end");
                    r.detached_since = Some(now);
                    r.dirty = true;
                }
            }
            let ttl = self.opts.checkpoint_ttl.as_secs();
            let now_s = unix_now();
            src.pending
                .retain(|_, e| now_s.saturating_sub(e.seen) <= ttl);
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

    /// Marks readers of modified files; true when a matching file that is
    /// not open changed (an idle file closed by `close_inactive` grew), so
    /// a scan should reopen it.
    fn mark_modified(&mut self, paths: &[PathBuf]) -> bool {
        let mut unknown: std::collections::HashSet<&PathBuf> = paths.iter().collect();
        for src in &mut self.sources {
            for r in src.readers.values_mut() {
                if unknown.contains(&r.path) {
                    r.dirty = true;
                }
            }
        }
        for src in &self.sources {
            for r in src.readers.values() {
                unknown.remove(&r.path);
            }
        }
        unknown.iter().any(|p| self.discovery.may_match(p))
    }

    /// Refreshes sizes and closes what is done; true when files were
    /// closed for lack of descriptors or a selector has new metadata (a
    /// scan should open the next ones).
    fn refresh_all(&mut self) -> bool {
        let now = Instant::now();
        let pressure = FD_PRESSURE.swap(false, Ordering::Relaxed);
        let mut closed_for_fds = false;
        let mut new_metadata = false;
        let mut new_globs = false;
        let polling = self.discovery.degraded || self.discovery.fd().is_none();
        for src in &mut self.sources {
            if let Some(sel) = &src.spec.select {
                let g = sel.generation();
                if g != src.select_generation {
                    src.select_generation = g;
                    for r in src.readers.values_mut() {
                        if let Some(s) = sel.select(&r.path) {
                            r.set_meta(s.meta, g);
                        }
                    }
                    // Files waiting for their metadata may be selected now.
                    new_metadata = true;
                    if let Some(include) = sel.include() {
                        if include != src.spec.config.include {
                            src.spec.config.include = include;
                            new_globs = true;
                        }
                    }
                }
            }
            let mut close = Vec::new();
            let mut inactive = Vec::new();
            for r in src.readers.values_mut() {
                // Cheapest tests first: this runs for every open file four
                // times a second.
                let busy = r.dirty || r.detached_since.is_some() || r.has_partial();
                if busy
                    || pressure
                    || polling
                    || now.saturating_duration_since(r.last_refresh) >= IDLE_REFRESH
                {
                    r.refresh(&src.spec.ctx);
                }
                if r.deleted && r.detached_since.is_none() {
                    r.detached_since = Some(now);
                }
                let Some(since) = r.detached_since else {
                    if !r.deleted
                        && r.read_offset() >= r.size
                        && !r.has_partial()
                        && (pressure || r.idle_for() >= close_inactive(&src.spec, &self.opts))
                        && r.tracker.in_flight() == 0
                        && !r.tracker.failed()
                    {
                        inactive.push(r.id);
                    }
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
            closed_for_fds |= pressure && !inactive.is_empty();
            for id in inactive {
                if let Some(mut r) = src.readers.remove(&id) {
                    tracing::debug!(path = %r.path.display(), "closing idle file; it is reopened when it grows");
                    r.close();
                    remove_file_gauges(&self.metrics, &src.spec.pipeline, &r.path);
                    src.pending.insert(
                        id,
                        Entry {
                            id,
                            fingerprint: r.fingerprint,
                            offset: r.tracker.committed(),
                            path: r.path.to_string_lossy().into_owned(),
                            seen: seen_stamp(),
                        },
                    );
                }
            }
            src.closing.retain(|c| c.3.in_flight() > 0);
        }
        if pressure && !closed_for_fds {
            // Nothing could be closed yet (batches in flight): keep the
            // pressure for the next round.
            FD_PRESSURE.store(true, Ordering::Relaxed);
        }
        if new_globs {
            self.rebuild_discovery();
        }
        closed_for_fds || new_metadata
    }

    /// One pass over readers with work; returns (progress made, paused).
    fn read_round(&mut self) -> (bool, bool) {
        let mut progress = false;
        let mut paused = false;
        for src in &mut self.sources {
            if src.stopping.is_some() {
                continue;
            }
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
                    Turn::Backoff => {}
                }
            }
        }
        (progress, paused)
    }

    /// Applies queued source changes; true when the set of sources changed.
    fn handle_commands(&mut self) -> bool {
        let mut changed = false;
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Add(spec) => {
                    self.sources.push(SourceState {
                        spec: *spec,
                        scanned: false,
                        had_checkpoint: false,
                        pending: HashMap::new(),
                        stopping: None,
                        select_generation: u64::MAX,
                        readers: HashMap::new(),
                        closing: Vec::new(),
                        files_open: None,
                    });
                    changed = true;
                }
                Command::Remove {
                    key,
                    deadline,
                    done,
                } => match self.sources.iter_mut().find(|s| s.spec.key == key) {
                    Some(src) => src.stopping = Some((deadline, done)),
                    None => {
                        let _ = done.send(true);
                    }
                },
            }
        }
        if changed {
            self.rebuild_discovery();
        }
        changed
    }

    fn rebuild_discovery(&mut self) {
        let patterns: Vec<Patterns> = self
            .sources
            .iter()
            .map(|s| Patterns {
                include: s.spec.config.include.clone(),
                exclude: s.spec.config.exclude.clone(),
            })
            .collect();
        match Discovery::new(&patterns) {
            Ok(d) => {
                self.discovery = d;
                // The events queued in the old inotify instance went with
                // it: a write to an open file is read now rather than at
                // the next refresh (the other sources' lines were held up
                // to half a second while a fleet apply added 1,000 file
                // sources).
                for src in &mut self.sources {
                    for r in src.readers.values_mut() {
                        r.dirty = true;
                    }
                }
            }
            // Globs were compiled when the configuration was validated.
            Err(e) => tracing::error!(error = %e, "cannot watch the new set of file sources"),
        }
    }

    /// Removes the stopping sources whose batches were all answered (or
    /// whose deadline passed): their committed offsets are kept in the
    /// checkpoint for a source that takes the same key later.
    fn finish_stopping(&mut self) {
        let now = Instant::now();
        let ready: Vec<usize> = (0..self.sources.len())
            .filter(|&i| {
                let src = &self.sources[i];
                src.stopping
                    .as_ref()
                    .is_some_and(|(deadline, _)| now >= *deadline || source_in_flight(src) == 0)
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        // The snapshot still holds the leaving sources' offsets.
        let snap = self.snapshot();
        let mut answers = Vec::new();
        for &i in ready.iter().rev() {
            let mut src = self.sources.remove(i);
            if source_in_flight(&src) > 0 {
                tracing::warn!(source = %src.spec.key, "stop deadline reached with batches in flight; they will be read again");
            }
            for r in src.readers.values_mut() {
                r.close();
                remove_file_gauges(&self.metrics, &src.spec.pipeline, &r.path);
            }
            if let Some(entries) = snap.get(&src.spec.key) {
                self.saved.insert(src.spec.key.clone(), entries.clone());
            }
            if let Some((_, done)) = src.stopping.take() {
                answers.push(done);
            }
        }
        self.rebuild_discovery();
        let ok = self.checkpoint();
        for done in answers {
            let _ = done.send(ok);
        }
    }

    fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::new();
        let seen = seen_stamp();
        for src in &self.sources {
            if !src.scanned {
                // Its checkpoint entries are still in `saved`.
                continue;
            }
            if src.readers.is_empty() && src.closing.is_empty() && src.pending.is_empty() {
                // Nothing to resume: written as absent, the same on load.
                // A thousand pipelines whose selectors match no container
                // otherwise cost a thousand keys in every checkpoint
                // written while others read (BENCHMARKS.md section 7).
                continue;
            }
            let m = snap.entry(src.spec.key.clone()).or_default();
            for r in src.readers.values() {
                m.insert(
                    r.id,
                    Entry {
                        id: r.id,
                        fingerprint: r.fingerprint,
                        offset: r.tracker.committed(),
                        path: r.path.to_string_lossy().into_owned(),
                        seen,
                    },
                );
            }
            for (id, fp, path, t) in &src.closing {
                m.entry(*id).or_insert_with(|| Entry {
                    id: *id,
                    fingerprint: *fp,
                    offset: t.committed(),
                    path: path.clone(),
                    seen,
                });
            }
            for (id, e) in &src.pending {
                m.entry(*id).or_insert_with(|| e.clone());
            }
        }
        // Entries of sources whose files were not seen yet stay as loaded.
        for (k, v) in &self.saved {
            snap.entry(k.clone()).or_insert_with(|| v.clone());
        }
        snap
    }

    /// Writes the checkpoint; false when that failed.
    fn checkpoint(&mut self) -> bool {
        let ttl = self.opts.checkpoint_ttl.as_secs();
        let now = unix_now();
        for entries in self.saved.values_mut() {
            entries.retain(|_, e| now.saturating_sub(e.seen) <= ttl);
        }
        self.saved.retain(|_, e| !e.is_empty());
        // Building and serialising the snapshot of 10,000 idle files every
        // second is most of an idle agent's work: skip it when nothing it
        // holds changed.
        let sig = self.signature();
        if sig == self.last_signature && !self.checkpoint_failing {
            return true;
        }
        let snap = self.snapshot();
        match self.store.save(&snap) {
            Ok(true) => {
                self.metrics.checkpoint_writes.inc();
            }
            Ok(false) => {}
            Err(e) => {
                self.metrics.checkpoint_errors.inc();
                // Not ready, but live: a restart does not free a full or
                // read-only disk, and would re-read what the unwritten
                // offsets cover.
                self.metrics.health.fatal(
                    "checkpoint",
                    format!("cannot write {}: {e}", self.store.path().display()),
                );
                tracing::error!(path = %self.store.path().display(), error = %e, "cannot write checkpoint; retrying every second, offsets are kept in memory");
                self.checkpoint_failing = true;
                return false;
            }
        }
        self.last_signature = sig;
        if std::mem::take(&mut self.checkpoint_failing) {
            tracing::info!(path = %self.store.path().display(), "checkpoint written again");
            self.metrics.health.recovered("checkpoint");
        }
        true
    }

    /// A hash of everything the checkpoint holds (offsets, identities,
    /// paths, entries waiting to be seen, and the hour stamp).
    fn signature(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seen_stamp().hash(&mut h);
        for src in &self.sources {
            src.spec.key.hash(&mut h);
            src.scanned.hash(&mut h);
            src.pending.len().hash(&mut h);
            for r in src.readers.values() {
                (r.id.dev, r.id.ino, r.tracker.committed()).hash(&mut h);
                r.path.hash(&mut h);
            }
            for (id, _, _, t) in &src.closing {
                (id.dev, id.ino, t.committed()).hash(&mut h);
            }
        }
        for (k, v) in &self.saved {
            (k, v.len()).hash(&mut h);
        }
        h.finish()
    }

    fn update_gauges(&mut self) {
        for src in &mut self.sources {
            let p = &src.spec.pipeline;
            // The handle is kept: looking the series up builds its labels
            // and hashes them, every second for every source (issue 33).
            src.files_open
                .get_or_insert_with(|| {
                    self.metrics
                        .files_open
                        .get_or_create(&vec![("pipeline".to_string(), p.clone())])
                        .clone()
                })
                .set(src.readers.len() as i64);
            for r in src.readers.values_mut() {
                let committed = r.tracker.committed();
                let now = (r.read_offset(), committed, r.size);
                if r.gauged == Some(now) {
                    continue;
                }
                r.gauged = Some(now);
                let l = file_labels(p, &r.path);
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
        self.sources.iter().map(source_in_flight).sum()
    }

    /// Writes the final checkpoint. Sources were stopped (and waited
    /// for) one by one before; anything still in flight now is read again
    /// at the next start.
    fn drain(&mut self) {
        let n = self.in_flight();
        if n > 0 {
            tracing::warn!(
                batches = n,
                "stopping with batches in flight; they will be read again at next start"
            );
        }
        if self.checkpoint() {
            tracing::info!(path = %self.store.path().display(), "final checkpoint written");
        } else {
            self.metrics
                .health
                .fatal("checkpoint", "the final checkpoint could not be written");
        }
        self.update_gauges();
    }
}

/// The source's `close_inactive`, or the service default.
fn close_inactive(spec: &SourceSpec, opts: &ServiceOptions) -> Duration {
    spec.config.close_inactive.unwrap_or(opts.close_inactive)
}

/// Batches of `src` not answered yet.
fn source_in_flight(src: &SourceState) -> usize {
    src.readers
        .values()
        .map(|r| r.tracker.in_flight())
        .sum::<usize>()
        + src.closing.iter().map(|c| c.3.in_flight()).sum::<usize>()
}

/// Files the checkpoint still has unread data of but that no include
/// pattern matches any more: rotated to a name outside the globs while the
/// agent was down (`app.log` → `app.log.1`). Each is looked up at its last
/// known path, then by identity in that directory, and read to its end
/// like any rotated file. One that is gone is reported, since its unread
/// tail is lost.
fn resume_unmatched(src: &mut SourceState, present: &HashMap<FileId, &Found>, now: Instant) {
    let mut dirs: HashMap<PathBuf, Vec<(FileId, PathBuf)>> = HashMap::new();
    let mut resumed = Vec::new();
    for (id, e) in &src.pending {
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
            // Kept for `checkpoint_ttl`: its directory may be mounted late.
            tracing::info!(path = %e.path, offset = e.offset,
                "a checkpointed file is not there (yet); it resumes at its offset if it appears");
            continue;
        };
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if e.offset >= size {
            continue;
        }
        let found = Found {
            path,
            id: *id,
            size,
        };
        match open_reader(&src.spec, &found, &src.pending, false) {
            // Only where the checkpoint's fingerprint still matches: an
            // inode reused by an unrelated file would be read from 0.
            Some(mut r) if r.read_offset() == e.offset => {
                tracing::info!(path = %found.path.display(), offset = e.offset,
                    "finishing a file rotated away while the agent was down");
                r.detached_since = Some(now);
                r.dirty = true;
                resumed.push(r);
            }
            _ => {}
        }
    }
    for r in resumed {
        src.pending.remove(&r.id);
        src.readers.insert(r.id, r);
    }
}

/// Identities of the files at `paths` (those that exist).
fn own_output_ids(paths: &[PathBuf]) -> std::collections::HashSet<FileId> {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| FileId::of(&m))
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// When an entry was last seen, to the hour: fine enough for a TTL of
/// days, and an idle checkpoint does not change (and is not rewritten)
/// every second.
fn seen_stamp() -> u64 {
    unix_now() / 3600 * 3600
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
    let selected = match &spec.select {
        Some(sel) => Some(sel.select(&f.path)?),
        None => None,
    };
    let file = match std::fs::File::open(&f.path) {
        Ok(file) => file,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            if !FD_PRESSURE.swap(true, Ordering::Relaxed) {
                tracing::warn!(path = %f.path.display(), error = %e,
                    "out of file descriptors: closing files read to their end early and reading the rest in turn; raise the limit (LimitNOFILE=, ulimit -n) for speed");
            }
            return None;
        }
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
    // Not changed for longer than `ignore_older`: what it holds is not
    // read, what is appended to it later is.
    let too_old = spec.config.ignore_older.is_some_and(|limit| {
        meta.modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > limit)
    });
    let offset = match resumed {
        Some(o) => o,
        None if may_start_at_end && spec.config.read_from == ReadFrom::End => size,
        None if too_old => {
            tracing::debug!(path = %f.path.display(), "older than ignore_older: watched from its end");
            size
        }
        None => 0,
    };
    tracing::debug!(path = %f.path.display(), offset, resumed = resumed.is_some(), "watching file");
    let (meta, decoder) = match selected {
        Some(s) => (s.meta, s.decoder),
        None => (spec.ctx.meta.clone(), None),
    };
    let mut r = FileReader::open(f.path.clone(), offset, fp, file, id, meta).with_decoder(decoder);
    if spec.source_type != "file" {
        r.set_source_type(spec.source_type);
    }
    Some(r)
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
