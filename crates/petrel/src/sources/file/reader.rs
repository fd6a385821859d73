//! Reading one file for one source: large blocks, SIMD line splitting, and
//! batches whose events are spans of the block just read.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use petrel_core::plugin::Emitter;
use petrel_core::LazyCounter;
use petrel_core::{BatchAck, Event, EventBatch, Origin, PipelineBudget, SourceInfo, Span};
use prometheus_client::metrics::counter::Counter;

use super::decode::{Decoded, LineDecoder, Stream};
use super::identity::{stream_identity, FileId, Fingerprint, FINGERPRINT_BYTES};
use super::multiline::Multiline;
use super::tracker::OffsetTracker;

thread_local! {
    /// The raw read buffer of decoded files, reused across reads.
    static RAW_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Larger raw buffers (a long carried chain) are not kept.
const MAX_RAW_SCRATCH: usize = 4 << 20;

/// Settings and handles shared by all readers of one source.
pub struct ReadContext {
    /// Block size of one read.
    pub block_bytes: usize,
    /// Lines longer than this are split into pieces.
    pub max_line_bytes: usize,
    /// A last line without newline is emitted after the file stopped
    /// growing for this long; so is an unfinished decoded message (a
    /// container line's first parts) of a file rotated away or deleted.
    pub partial_line_timeout: std::time::Duration,
    /// How long an unfinished decoded message waits for its last part in
    /// a file that is still at its path (the runtime writes the rest
    /// there) once the file stopped growing.
    pub unfinished_line_timeout: std::time::Duration,
    /// Where batches go.
    pub emitter: Arc<dyn Emitter>,
    /// Memory budget of the pipeline.
    pub budget: Arc<PipelineBudget>,
    /// Events emitted.
    pub sent_events: Counter,
    /// Bytes read (lines with their newlines).
    pub sent_bytes: Counter,
    /// Lines split because they exceeded `max_line_bytes`.
    pub split_lines: LazyCounter,
    /// Pauses because the memory budget was full.
    pub pauses: Counter,
    /// Read errors.
    pub read_errors: LazyCounter,
    /// Files found truncated (copytruncate) and re-read from 0.
    pub truncations: LazyCounter,
    /// Metadata fields of every batch (`host`, ...).
    pub meta: Arc<[(petrel_core::Key, Arc<str>)]>,
    /// Joins lines into multiline events, when configured.
    pub multiline: Option<Arc<Multiline>>,
    /// Multiline events cut at `max_lines`/`max_bytes`.
    pub multiline_cut: LazyCounter,
}

/// Why a read turn ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Turn {
    /// Read something and may have more.
    More,
    /// Reached the end of the file.
    Eof,
    /// The memory budget is full; try again later.
    Paused,
    /// The file could not be read.
    Failed,
    /// A delivery failed and the re-read waits for its backoff.
    Backoff,
}

/// First wait before re-reading after a failed delivery; doubled per
/// failure in a row up to [`MAX_RETRY_BACKOFF`], so a dead sink does not
/// turn into a hot re-read loop.
/// Bytes per event assumed for a file's first block: short lines, so that
/// the first batch rarely grows its event vector.
const FIRST_BYTES_PER_EVENT: usize = 64;
/// Floor of the estimate: a block of empty lines must not make the next
/// reservation absurd.
const MIN_BYTES_PER_EVENT: usize = 8;

const MIN_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest wait before re-reading after failed deliveries.
const MAX_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);

/// State of one open file.
pub struct FileReader {
    /// Identity.
    pub id: FileId,
    /// Where the file was last seen.
    pub path: PathBuf,
    /// Fingerprint of its first bytes.
    pub fingerprint: Fingerprint,
    source: Arc<SourceInfo>,
    file: Option<File>,
    /// Next byte to read.
    offset: u64,
    /// Bytes after the last newline read so far; they start at
    /// `offset - carry.len()`.
    carry: Vec<u8>,
    /// Last size seen.
    pub size: u64,
    last_growth: Instant,
    /// Delivery tracking.
    pub tracker: Arc<OffsetTracker>,
    /// Worth reading (inotify said modified, or not at EOF yet).
    pub dirty: bool,
    /// No longer at a path that matches (renamed away or deleted) since.
    pub detached_since: Option<Instant>,
    /// True once the file was found with no links left.
    pub deleted: bool,
    /// Pieces of an over-long line were emitted and the line has not ended
    /// yet: its remaining bytes are not counted as another split line.
    in_long_line: bool,
    /// Bytes per event of the last block, to size the next block's event
    /// vector: a fixed guess reserved 4,097 descriptors (295 KB) per
    /// 256 KiB block whatever the lines, most of it unused for long lines
    /// and all of it charged to the memory budget.
    bytes_per_event: usize,
    /// Current wait after a failed delivery (zero while deliveries work).
    retry_backoff: std::time::Duration,
    /// When the re-read after a failed delivery may start.
    retry_at: Option<Instant>,
    /// Committed offset at the last failure: progress since resets the
    /// backoff.
    committed_at_failure: u64,
    /// When [`FileReader::refresh`] last looked at the file.
    pub last_refresh: Instant,
    /// (read offset, committed offset, size) last published as gauges, so
    /// that idle files cost no metric updates.
    pub gauged: Option<(u64, u64, u64)>,
    /// Turns the file's records into messages (container logs).
    decoder: Option<Box<dyn LineDecoder>>,
    /// The generation of the metadata this reader's events carry.
    pub meta_generation: u64,
    /// The carry of a decoded file was decoded at its end since the file
    /// last grew and what stays is an unfinished message still waiting:
    /// not worth decoding again every round until something changes.
    held_checked: bool,
    /// `source` with a `stream` field, for stdout and stderr events, and
    /// the `source` they were made from.
    stream_sources: Option<(Arc<SourceInfo>, [Arc<SourceInfo>; 2])>,
    /// The stream identity of this file's content (see [`stream_identity`]),
    /// once its first line is complete.
    origin_stream: Option<u128>,
}

impl FileReader {
    /// Opens `path` at `offset`.
    pub fn open(
        path: PathBuf,
        offset: u64,
        fingerprint: Fingerprint,
        file: File,
        id: FileId,
        meta: Arc<[(petrel_core::Key, Arc<str>)]>,
    ) -> Self {
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let source = Arc::new(SourceInfo::file(path.to_string_lossy(), meta));
        let mut r = Self {
            id,
            path,
            fingerprint,
            source,
            file: Some(file),
            offset,
            carry: Vec::new(),
            size,
            last_growth: Instant::now(),
            tracker: Arc::new(OffsetTracker::new(offset)),
            dirty: true,
            detached_since: None,
            deleted: false,
            in_long_line: false,
            bytes_per_event: FIRST_BYTES_PER_EVENT,
            retry_backoff: std::time::Duration::ZERO,
            retry_at: None,
            committed_at_failure: 0,
            last_refresh: Instant::now(),
            gauged: None,
            decoder: None,
            meta_generation: 0,
            held_checked: false,
            stream_sources: None,
            origin_stream: None,
        };
        r.seek(offset);
        r
    }

    /// Decodes the file's lines with `decoder` instead of taking each line
    /// as a message.
    pub fn with_decoder(mut self, decoder: Option<Box<dyn LineDecoder>>) -> Self {
        self.decoder = decoder;
        self
    }

    /// Replaces the metadata fields of the events read from now on.
    pub fn set_meta(&mut self, meta: Arc<[(petrel_core::Key, Arc<str>)]>, generation: u64) {
        let mut info = SourceInfo::file(self.path.to_string_lossy(), meta);
        info.source_type = self.source.source_type;
        self.source = Arc::new(info);
        self.meta_generation = generation;
    }

    /// Sets the `source_type` of the events read from now on.
    pub fn set_source_type(&mut self, source_type: &'static str) {
        let mut info = SourceInfo::file(self.path.to_string_lossy(), self.source.meta.clone());
        info.source_type = source_type;
        self.source = Arc::new(info);
    }

    fn seek(&mut self, offset: u64) {
        if let Some(f) = self.file.as_mut() {
            if f.seek(SeekFrom::Start(offset)).is_err() {
                self.file = None;
            }
        }
        self.offset = offset;
        self.carry.clear();
        self.in_long_line = false;
        if let Some(d) = self.decoder.as_mut() {
            d.reset();
        }
    }

    /// Next byte to read.
    pub fn read_offset(&self) -> u64 {
        self.offset
    }

    /// How long since the file last grew (or was opened).
    pub fn idle_for(&self) -> std::time::Duration {
        self.last_growth.elapsed()
    }

    /// True while the file is open.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Closes the file; its tracker lives on until in-flight batches answer.
    pub fn close(&mut self) {
        self.file = None;
    }

    /// Updates the path after a rename within the matched set.
    pub fn set_path(&mut self, path: PathBuf) {
        if path != self.path {
            let mut info = SourceInfo::file(path.to_string_lossy(), self.source.meta.clone());
            info.source_type = self.source.source_type;
            self.source = Arc::new(info);
            self.path = path;
            self.gauged = None;
        }
    }

    /// Checks size, links and fingerprint; handles truncation and rewrites
    /// (copytruncate) by starting over from offset 0.
    pub fn refresh(&mut self, ctx: &ReadContext) {
        self.last_refresh = Instant::now();
        let Some(f) = self.file.as_ref() else { return };
        let Ok(meta) = f.metadata() else {
            ctx.read_errors.inc();
            return;
        };
        if meta.nlink() == 0 {
            self.deleted = true;
        }
        let size = meta.len();
        if self.restart_if_rewritten(ctx, size) {
            return;
        }
        if self.fingerprint.is_partial() && size > self.fingerprint.len as u64 {
            if let Some(Ok(fp)) = self.file.as_ref().map(|f| Fingerprint::read(f, size)) {
                self.fingerprint = fp;
            }
        }
        if size != self.size {
            self.size = size;
            self.dirty = true;
        }
    }

    /// Detects a truncated (size below the read offset) or rewritten (first
    /// bytes changed) file and starts over from offset 0; returns true when
    /// it did.
    fn restart_if_rewritten(&mut self, ctx: &ReadContext, size: u64) -> bool {
        let Some(f) = self.file.as_ref() else {
            return false;
        };
        let truncated = size < self.offset
            || (self.fingerprint.len > 0 && !self.fingerprint.matches(f).unwrap_or(true));
        if !truncated {
            return false;
        }
        tracing::info!(path = %self.path.display(), old_offset = self.offset, size,
            "file truncated or rewritten (copytruncate?); reading it again from the start");
        ctx.truncations.inc();
        // Batches of the old content still in flight must not move the new
        // content's committed offset: start a fresh tracker.
        self.tracker = Arc::new(OffsetTracker::new(0));
        self.origin_stream = None;
        self.fingerprint = Fingerprint::read(f, size).unwrap_or_default();
        self.seek(0);
        self.size = size;
        self.dirty = true;
        true
    }

    /// Reads up to `max_blocks` blocks and emits their complete lines.
    pub fn read_turn(&mut self, ctx: &ReadContext, max_blocks: usize) -> Turn {
        if self.tracker.failed() {
            // A sink refused a batch: read again from the last delivered
            // offset (at-least-once), after a backoff.
            let at = self.tracker.committed();
            match self.retry_at {
                None => {
                    self.retry_backoff = if at > self.committed_at_failure {
                        MIN_RETRY_BACKOFF
                    } else {
                        (self.retry_backoff * 2).clamp(MIN_RETRY_BACKOFF, MAX_RETRY_BACKOFF)
                    };
                    self.committed_at_failure = at;
                    self.retry_at = Some(Instant::now() + self.retry_backoff);
                    tracing::warn!(path = %self.path.display(), offset = at,
                        retry_in_ms = self.retry_backoff.as_millis() as u64,
                        "delivery failed; re-reading after a backoff");
                    return Turn::Backoff;
                }
                Some(t) if Instant::now() < t => return Turn::Backoff,
                Some(_) => {
                    self.retry_at = None;
                    self.tracker.rewound();
                    self.seek(at);
                }
            }
        }
        for _ in 0..max_blocks {
            let Some(file) = self.file.as_mut() else {
                return Turn::Failed;
            };
            let size = match file.metadata() {
                Ok(m) => m.len(),
                Err(_) => {
                    ctx.read_errors.inc();
                    return Turn::Failed;
                }
            };
            if size < self.offset {
                // Truncated (copytruncate): start over at once rather than
                // spinning until the next refresh().
                self.restart_if_rewritten(ctx, size);
                return Turn::More;
            }
            if size > self.size {
                self.size = size;
            }
            let avail = size - self.offset;
            if avail == 0 {
                return self.at_eof(ctx);
            }
            let want = (avail as usize)
                .min(ctx.block_bytes)
                .min(ctx.budget.largest_read());
            let total = self.carry.len() + want;
            let Some(mut charge) = ctx.budget.try_charge(ctx.budget.reservation(total)) else {
                ctx.pauses.inc();
                return Turn::Paused;
            };
            // Decoded files copy their messages into a new buffer, so their
            // raw reads reuse the input thread's one buffer: a fresh block
            // per read cost a page fault per 4 KiB, the largest cost of
            // container logs at a few MB/s (BENCHMARKS.md section 7).
            let mut buf = if self.decoder.is_some() {
                let mut b = RAW_SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
                b.clear();
                b.reserve(total);
                b
            } else {
                Vec::with_capacity(total)
            };
            buf.extend_from_slice(&self.carry);
            let carry_len = self.carry.len();
            let n = match read_into_spare(file, &mut buf, want) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "read failed");
                    ctx.read_errors.inc();
                    return Turn::Failed;
                }
            };
            if n == 0 {
                return self.at_eof(ctx);
            }
            // A file truncated and written again past our offset (copytruncate)
            // since we last looked was just read from the old offset: a torn
            // line, and the new start skipped. Its first bytes tell; checked
            // after the read so that no rewrite can slip in between.
            if self.offset > 0
                && self.fingerprint.len > 0
                && !self.fingerprint.matches(file).unwrap_or(true)
            {
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                self.restart_if_rewritten(ctx, size);
                return Turn::More;
            }
            // Keep the fingerprint equal to the first bytes *we read*, so
            // that a file that started empty or short cannot be rewritten
            // unnoticed before the next refresh().
            let fp_len = self.fingerprint.len as u64;
            if fp_len >= self.offset && fp_len < self.offset + n as u64 {
                let from = carry_len + (fp_len - self.offset) as usize;
                self.fingerprint.extend(&buf[from..]);
            }
            self.offset += n as u64;
            self.last_growth = Instant::now();
            self.held_checked = false;
            self.carry.clear();
            let start_offset = self.offset - buf.len() as u64;
            if self.decoder.is_some() {
                self.read_decoded(ctx, buf, carry_len, start_offset, charge);
                continue;
            }
            let complete = match memchr::memrchr(b'\n', &buf[carry_len..]) {
                Some(i) => carry_len + i + 1,
                None if buf.len() > ctx.max_line_bytes => {
                    // A line longer than the limit with no end in sight: emit
                    // whole pieces now and keep the remainder, at least one
                    // byte of it, so that the newline ending the line later
                    // does not make an empty event of its own (and a line of
                    // exactly `max_line_bytes` is not split at all).
                    (buf.len() - 1) / ctx.max_line_bytes * ctx.max_line_bytes
                }
                None => 0,
            };
            // With multiline, the open event at the end stays in the carry,
            // uncommitted, until the next line shows where it ends.
            let (upto, spans) = match &ctx.multiline {
                Some(ml) if complete > 0 && buf[complete - 1] == b'\n' => {
                    let mut spans = Vec::with_capacity(complete / 1024 + 1);
                    let (held, cut) = ml.group(&buf[..complete], &mut spans);
                    if cut > 0 {
                        ctx.multiline_cut.inc_by(cut);
                    }
                    (held, Some(spans))
                }
                _ => (complete, None),
            };
            self.carry.extend_from_slice(&buf[upto..]);
            buf.truncate(upto);
            if upto == 0 {
                continue;
            }
            charge.shrink_to(ctx.budget.reservation(buf.capacity()));
            self.emit(ctx, buf, start_offset, charge, false, spans);
        }
        Turn::More
    }

    /// The decoding half of a read: complete lines go through the decoder,
    /// what it holds back (an unfinished message) stays in the carry.
    fn read_decoded(
        &mut self,
        ctx: &ReadContext,
        mut buf: Vec<u8>,
        carry_len: usize,
        start_offset: u64,
        charge: petrel_core::MemoryCharge,
    ) {
        let end = match memchr::memrchr(b'\n', &buf[carry_len..]) {
            Some(i) => carry_len + i + 1,
            None if buf.len() > ctx.max_line_bytes => {
                // No record is this long: pass the piece on (the decoder
                // counts it as invalid) rather than hold it without bound.
                ctx.split_lines.inc();
                let n = buf.len();
                buf.push(b'\n');
                let used = self.decode_and_emit(ctx, &buf, n, start_offset, false, false, charge);
                buf.truncate(n);
                self.carry.extend_from_slice(&buf[used..]);
                return;
            }
            None => 0,
        };
        let used = if end > 0 {
            self.decode_and_emit(ctx, &buf[..end], end, start_offset, false, false, charge)
        } else {
            0
        };
        self.carry.extend_from_slice(&buf[used..]);
        if buf.capacity() <= MAX_RAW_SCRATCH {
            RAW_SCRATCH.with(|s| *s.borrow_mut() = buf);
        }
    }

    /// Decodes `raw` (whose first `raw_len` bytes are file content starting
    /// at `start_offset`), groups multiline events, emits them, and returns
    /// the raw bytes consumed. `flush_unfinished` emits unfinished
    /// messages as they are; `flush_groups` the open multiline event.
    #[allow(clippy::too_many_arguments)]
    fn decode_and_emit(
        &mut self,
        ctx: &ReadContext,
        raw: &[u8],
        raw_len: usize,
        start_offset: u64,
        flush_unfinished: bool,
        flush_groups: bool,
        mut charge: petrel_core::MemoryCharge,
    ) -> usize {
        let Some(dec) = self.decoder.as_mut() else {
            return 0;
        };
        let mut d = Decoded::default();
        dec.decode(raw, start_offset, flush_unfinished, &mut d);
        let mut used = d.held.min(raw_len);
        let Decoded {
            mut out, mut msgs, ..
        } = d;
        let mut spans: Vec<Span> = Vec::new();
        if let Some(ml) = &ctx.multiline {
            if !out.is_empty() {
                let (held, cut) = ml.group(&out, &mut spans);
                if cut > 0 {
                    ctx.multiline_cut.inc_by(cut);
                }
                if held < out.len() {
                    if flush_groups {
                        spans.push(Span::new(held, out.len() - 1 - held));
                    } else {
                        // The open event's messages are decoded again with
                        // the next block. The decoder forgets which records
                        // it already emitted past that point, so a message
                        // of the other stream completed in between may come
                        // twice; none is lost.
                        if let Some(r) = msgs
                            .iter()
                            .filter(|m| m.start >= held)
                            .map(|m| m.raw_start)
                            .min()
                        {
                            used = used.min(r);
                        }
                        dec.reset();
                        out.truncate(held);
                        msgs.retain(|m| m.start < held);
                    }
                }
            }
        } else {
            spans = msgs.iter().map(|m| Span::new(m.start, m.len)).collect();
        }
        if used == 0 && spans.is_empty() {
            return 0;
        }
        let mut events = Vec::with_capacity(spans.len());
        let mut streams = Vec::with_capacity(spans.len());
        for span in spans {
            let first = msgs
                .binary_search_by_key(&(span.start as usize), |m| m.start)
                .ok()
                .and_then(|i| msgs.get(i));
            let mut ev = Event::from_span(span);
            ev.time_ns = first.and_then(|m| m.time_ns);
            streams.push(first.map_or(Stream::None, |m| m.stream));
            events.push(ev);
        }
        charge.shrink_to(ctx.budget.reservation(out.capacity()));
        let origin = self.origin_stream().map(|stream| Origin {
            stream,
            base: start_offset,
            starts: Some(message_positions(&msgs)),
            per_record: false,
        });
        self.emit_by_stream(
            ctx,
            out,
            start_offset,
            used,
            charge,
            events,
            &streams,
            origin,
        );
        used
    }

    /// Emits decoded events in one batch per run of one stream, the
    /// `stream` field being the batch's metadata rather than a field of
    /// each event (an allocation per event, 13 % of the agent's CPU on
    /// container logs). Runs share the buffer; the batches before the last
    /// commit nothing, the last one the whole read.
    #[allow(clippy::too_many_arguments)]
    fn emit_by_stream(
        &mut self,
        ctx: &ReadContext,
        out: Vec<u8>,
        start_offset: u64,
        used: usize,
        mut charge: petrel_core::MemoryCharge,
        events: Vec<Event>,
        streams: &[Stream],
        origin: Option<Origin>,
    ) {
        let buf = Bytes::from(out);
        let total = streams.len().max(1);
        let mut events = events.into_iter();
        let mut i = 0;
        loop {
            let stream = streams.get(i).copied().unwrap_or(Stream::None);
            let run = streams[i.min(streams.len())..]
                .iter()
                .take_while(|s| **s == stream)
                .count();
            let last = i + run >= streams.len();
            let run_events: Vec<Event> = events.by_ref().take(run).collect();
            let (part, end, len) = if last {
                let rest = std::mem::replace(&mut charge, petrel_core::MemoryCharge::none());
                (rest, start_offset + used as u64, used)
            } else {
                (charge.split(charge.bytes() * run / total), start_offset, 0)
            };
            let source = self.stream_source(stream);
            self.emit_batch(
                ctx,
                buf.clone(),
                source,
                run_events,
                end,
                len,
                part,
                origin.clone(),
                false,
            );
            if last {
                break;
            }
            i += run;
        }
    }

    /// The batch origin for events of `stream`: this file's, with a
    /// `stream` metadata field.
    fn stream_source(&mut self, stream: Stream) -> Arc<SourceInfo> {
        let idx = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
            Stream::None => return self.source.clone(),
        };
        if let Some((base, built)) = &self.stream_sources {
            if Arc::ptr_eq(base, &self.source) {
                return built[idx].clone();
            }
        }
        let make = |name: &str| {
            let mut meta: Vec<(petrel_core::Key, Arc<str>)> = self.source.meta.to_vec();
            meta.push(("stream".into(), Arc::from(name)));
            let mut info = SourceInfo::file(self.source.path.clone(), meta.into());
            info.source_type = self.source.source_type;
            Arc::new(info)
        };
        let built = [make("stdout"), make("stderr")];
        let r = built[idx].clone();
        self.stream_sources = Some((self.source.clone(), built));
        r
    }

    fn at_eof(&mut self, ctx: &ReadContext) -> Turn {
        if self.decoder.is_some() {
            let wait = match &ctx.multiline {
                Some(ml) => ml.timeout.min(ctx.partial_line_timeout),
                None => ctx.partial_line_timeout,
            };
            let idle = self.last_growth.elapsed();
            if !self.carry.is_empty() && idle >= wait {
                // A file rotated away or deleted gets nothing more: what it
                // holds goes out as it is. One still at its path may yet
                // get the rest of a line its writer is slow to finish
                // (issue 19), so an unfinished message waits longer there;
                // the open multiline event and a last record without
                // newline go out now either way.
                let live = self.detached_since.is_none() && !self.deleted;
                let give_up = !live || idle >= ctx.unfinished_line_timeout;
                if give_up || !self.held_checked {
                    let mut raw = std::mem::take(&mut self.carry);
                    let n = raw.len();
                    let start = self.offset - n as u64;
                    if raw.last() != Some(&b'\n') {
                        raw.push(b'\n');
                    }
                    let charge = ctx.budget.charge_held(ctx.budget.reservation(raw.len()));
                    let used = self.decode_and_emit(ctx, &raw, n, start, give_up, true, charge);
                    self.carry.extend_from_slice(&raw[used.min(n)..n]);
                    self.held_checked = !give_up;
                }
            }
            return Turn::Eof;
        }
        if let Some(ml) = &ctx.multiline {
            // The open event's last line arrived a while ago: it is done.
            if let Some(i) = memchr::memrchr(b'\n', &self.carry) {
                if self.last_growth.elapsed() >= ml.timeout {
                    let start = self.offset - self.carry.len() as u64;
                    let buf: Vec<u8> = self.carry.drain(..=i).collect();
                    let charge = ctx.budget.charge_held(ctx.budget.reservation(buf.len()));
                    let span = vec![petrel_core::Span::new(0, i)];
                    self.emit(ctx, buf, start, charge, true, Some(span));
                }
            }
        }
        if !self.carry.is_empty()
            && !self.carry.contains(&b'\n')
            && self.last_growth.elapsed() >= ctx.partial_line_timeout
        {
            // The writer left a last line without newline and stopped.
            let buf = std::mem::take(&mut self.carry);
            let start = self.offset - buf.len() as u64;
            let charge = ctx.budget.charge_held(ctx.budget.reservation(buf.len()));
            self.emit(ctx, buf, start, charge, true, None);
        }
        Turn::Eof
    }

    /// True when a partial last line is waiting for its newline.
    pub fn has_partial(&self) -> bool {
        !self.carry.is_empty()
    }

    fn emit(
        &mut self,
        ctx: &ReadContext,
        buf: Vec<u8>,
        start_offset: u64,
        charge: petrel_core::MemoryCharge,
        unterminated: bool,
        spans: Option<Vec<Span>>,
    ) {
        let len = buf.len();
        if let Some(spans) = spans {
            let events: Vec<Event> = spans.into_iter().map(Event::from_span).collect();
            self.in_long_line = false;
            let len = buf.len();
            self.emit_events(ctx, buf, start_offset, len, charge, events, 0, false);
            return;
        }
        // An eighth more than the last block's lines suggest: lengths vary
        // a little from block to block, and a shortfall costs a realloc.
        let estimate = len / self.bytes_per_event.max(1);
        let mut events = Vec::with_capacity(estimate + estimate / 8 + 1);
        let mut split = 0u64;
        let mut all_lines = true;
        let max = ctx.max_line_bytes;
        // The first line of this buffer may be the end of an over-long line
        // whose first pieces went out earlier (and were counted then).
        let mut continues_long_line = self.in_long_line;
        let push_pieces = |s: usize, e: usize, events: &mut Vec<Event>| {
            let mut p = s;
            while p < e {
                let q = (p + max).min(e);
                events.push(Event::from_span(Span::new(p, q - p)));
                p = q;
            }
        };
        let mut s = 0;
        for nl in memchr::memchr_iter(b'\n', &buf) {
            if nl - s <= max {
                events.push(Event::from_span(Span::new(s, nl - s)));
            } else {
                if !continues_long_line {
                    split += 1;
                }
                all_lines = false;
                push_pieces(s, nl, &mut events);
            }
            continues_long_line = false;
            s = nl + 1;
        }
        if s < len {
            // Pieces of an over-long line, or a timed-out partial line.
            if !unterminated && !continues_long_line {
                split += 1;
            }
            continues_long_line = !unterminated;
            push_pieces(s, len, &mut events);
        }
        let verbatim = all_lines && s == len;
        self.in_long_line = continues_long_line;
        if !events.is_empty() {
            self.bytes_per_event = (len / events.len()).max(MIN_BYTES_PER_EVENT);
        }
        self.emit_events(ctx, buf, start_offset, len, charge, events, split, verbatim);
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_events(
        &mut self,
        ctx: &ReadContext,
        buf: Vec<u8>,
        start_offset: u64,
        len: usize,
        charge: petrel_core::MemoryCharge,
        events: Vec<Event>,
        split: u64,
        verbatim: bool,
    ) {
        if split > 0 {
            ctx.split_lines.inc_by(split);
        }
        let end = start_offset + len as u64;
        let source = self.source.clone();
        // The buffer is the file's own bytes: positions are file offsets.
        let origin = self.origin_stream().map(|stream| Origin {
            stream,
            base: start_offset,
            starts: None,
            per_record: false,
        });
        self.emit_batch(
            ctx,
            Bytes::from(buf),
            source,
            events,
            end,
            len,
            charge,
            origin,
            verbatim,
        );
    }

    /// The file's stream identity, read once its first line is complete
    /// (a first line still being written gives a provisional one).
    fn origin_stream(&mut self) -> Option<u128> {
        if let Some(s) = self.origin_stream {
            return Some(s);
        }
        let f = self.file.as_ref()?;
        let mut head = [0u8; FINGERPRINT_BYTES];
        let mut got = 0;
        while got < head.len() {
            match f.read_at(&mut head[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(_) => return None,
            }
        }
        let (id, complete) = stream_identity(self.id, &head[..got]);
        if complete {
            self.origin_stream = Some(id);
        }
        Some(id)
    }

    /// Sends one batch that commits up to `end` once delivered.
    #[allow(clippy::too_many_arguments)]
    fn emit_batch(
        &mut self,
        ctx: &ReadContext,
        buf: Bytes,
        source: Arc<SourceInfo>,
        events: Vec<Event>,
        end: u64,
        len: usize,
        charge: petrel_core::MemoryCharge,
        origin: Option<Origin>,
        verbatim: bool,
    ) {
        let seq = self.tracker.register(end);
        let n = events.len() as u64;
        // Event descriptors (about half the data for short lines) are
        // covered by the reservation taken before reading, like the
        // encoded copies the sinks make of the batch.
        let mut batch = EventBatch::new(buf, source);
        batch.events = events;
        batch.input_bytes = len as u64;
        batch.ack = Some(BatchAck::start(self.tracker.clone(), seq));
        batch.charge = charge;
        batch.origin = origin;
        batch.verbatim_lines = verbatim;
        ctx.sent_events.inc_by(n);
        ctx.sent_bytes.inc_by(len as u64);
        ctx.emitter.emit(batch);
    }
}

/// Where each decoded message stands in the raw read: its first record,
/// plus, for the pieces of a message cut at `max_merged_line_bytes`
/// (consecutive, all from the same first record), the length of the pieces
/// before it. A message is never longer than its records, so positions
/// within one stdout (or stderr) message never reach the next message of
/// that stream; the record's stream is the tag, since records of the two
/// streams interleave.
fn message_positions(msgs: &[super::decode::DecodedMsg]) -> Arc<[(u32, u32, u8)]> {
    let mut v = Vec::with_capacity(msgs.len());
    let mut prev: Option<&super::decode::DecodedMsg> = None;
    let mut rel = 0usize;
    for m in msgs {
        rel = match prev {
            Some(p) if p.raw_start == m.raw_start && p.stream == m.stream => rel + p.len,
            _ => 0,
        };
        let tag = match m.stream {
            Stream::None => 0,
            Stream::Stdout => 1,
            Stream::Stderr => 2,
        };
        v.push((m.start as u32, (m.raw_start + rel) as u32, tag));
        prev = Some(m);
    }
    v.into()
}

/// Appends up to `want` bytes read from the file's position to `buf`, in
/// as few `read()` calls as the kernel allows (one for a page-cached file),
/// and returns how many were read (fewer only at end of file).
///
/// `Read::take(..).read_to_end` was measured issuing six reads per 256 KiB
/// block (8, 16, 32, 64, 128 KiB and a last probe: std grows its read size
/// step by step when it is given no size hint), 25.7 k syscalls per GiB;
/// `Read::read` would need the spare capacity zeroed first. So the bytes go
/// straight into the vector's spare capacity.
fn read_into_spare(file: &File, buf: &mut Vec<u8>, want: usize) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.reserve(want);
    let start = buf.len();
    let fd = file.as_raw_fd();
    while buf.len() - start < want {
        let left = want - (buf.len() - start);
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory of at least `left` bytes owned
        // by `buf` (reserved above, and `left` only shrinks); read(2) writes
        // at most that many bytes and returns how many, which are then the
        // only bytes marked initialised.
        let n = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), left) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        // SAFETY: the kernel initialised the first `n` (≤ `left`) bytes of
        // the spare capacity.
        unsafe { buf.set_len(buf.len() + n as usize) };
    }
    Ok(buf.len() - start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::time::Duration;

    #[test]
    fn spare_capacity_reads_stop_at_want_and_at_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let mut buf = b"carry".to_vec();
        assert_eq!(read_into_spare(&f, &mut buf, 262_144).unwrap(), 262_144);
        assert_eq!(&buf[..5], b"carry");
        assert_eq!(&buf[5..], &data[..262_144]);
        let mut rest = Vec::new();
        assert_eq!(
            read_into_spare(&f, &mut rest, 262_144).unwrap(),
            300_000 - 262_144
        );
        assert_eq!(rest, &data[262_144..]);
        assert_eq!(
            read_into_spare(&f, &mut rest, 10).unwrap(),
            0,
            "at end of file"
        );
    }

    #[derive(Default)]
    struct Collect(Mutex<Vec<EventBatch>>);

    impl Emitter for Collect {
        fn emit(&self, batch: EventBatch) {
            self.0.lock().push(batch);
        }
    }

    fn context(emitter: Arc<Collect>) -> ReadContext {
        let budget =
            petrel_core::PipelineBudget::new(petrel_core::MemoryBudget::new(1 << 24), 1 << 24);
        ReadContext {
            block_bytes: 4096,
            max_line_bytes: 1024,
            partial_line_timeout: Duration::from_secs(5),
            unfinished_line_timeout: Duration::from_secs(300),
            emitter,
            budget,
            sent_events: Counter::default(),
            sent_bytes: Counter::default(),
            split_lines: LazyCounter::default(),
            pauses: Counter::default(),
            read_errors: LazyCounter::default(),
            truncations: LazyCounter::default(),
            meta: Arc::new([]),
            multiline: None,
            multiline_cut: LazyCounter::default(),
        }
    }

    /// The messages of the batches emitted so far, taken out and
    /// acknowledged (a batch dropped unanswered counts as failed).
    fn messages(out: &Collect) -> Vec<String> {
        out.0
            .lock()
            .drain(..)
            .flat_map(|mut b| {
                if let Some(a) = b.ack.take() {
                    a.ack();
                }
                b.events
                    .iter()
                    .map(|e| {
                        String::from_utf8_lossy(b.field_bytes(e, "message").unwrap_or_default())
                            .into_owned()
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A reader of `path` decoding CRI records, with the unfinished
    /// counter.
    fn cri_reader(path: &std::path::Path) -> (FileReader, LazyCounter) {
        use crate::sources::kubernetes::format::{ContainerDecoder, FormatCounters, Streams};
        let file = File::open(path).unwrap();
        let meta = file.metadata().unwrap();
        let fp = Fingerprint::read(&file, meta.len()).unwrap();
        let counters = FormatCounters::default();
        let unfinished = counters.unfinished.clone();
        let streams = Streams {
            stdout: true,
            stderr: true,
        };
        let r = FileReader::open(path.into(), 0, fp, file, FileId::of(&meta), Arc::new([]))
            .with_decoder(Some(Box::new(ContainerDecoder::new(
                1 << 20,
                streams,
                counters,
            ))));
        (r, unfinished)
    }

    const T: &str = "2024-03-01T10:20:30.000000001Z";

    fn append(path: &std::path::Path, data: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(data.as_bytes()).unwrap();
    }

    #[test]
    fn a_live_files_unfinished_line_waits_for_its_end_past_the_partial_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, format!("{T} stdout P slow-a|\n")).unwrap();
        let (mut r, unfinished) = cri_reader(&path);
        let out = Arc::new(Collect::default());
        let mut ctx = context(out.clone());
        // Every idle moment is past the partial timeout; the live file's
        // own bound is far away.
        ctx.partial_line_timeout = Duration::ZERO;
        ctx.unfinished_line_timeout = Duration::from_secs(3600);
        for _ in 0..3 {
            r.read_turn(&ctx, 4);
        }
        assert_eq!(messages(&out), Vec::<String>::new(), "still waiting");
        assert!(r.has_partial());
        append(&path, &format!("{T} stdout P slow-b|\n"));
        r.refresh(&ctx);
        for _ in 0..3 {
            r.read_turn(&ctx, 4);
        }
        assert_eq!(messages(&out), Vec::<String>::new(), "still waiting");
        append(&path, &format!("{T} stdout F slow-c\n{T} stdout F next\n"));
        r.refresh(&ctx);
        r.read_turn(&ctx, 4);
        assert_eq!(messages(&out), ["slow-a|slow-b|slow-c", "next"]);
        assert_eq!(unfinished.get(), 0);
    }

    #[test]
    fn an_unfinished_line_goes_out_once_its_file_is_rotated_or_its_wait_is_over() {
        let dir = tempfile::tempdir().unwrap();
        let out = Arc::new(Collect::default());
        let mut ctx = context(out.clone());
        ctx.partial_line_timeout = Duration::ZERO;
        ctx.unfinished_line_timeout = Duration::from_secs(3600);
        // Rotated away: nothing more comes to this file.
        let path = dir.path().join("0.log");
        std::fs::write(&path, format!("{T} stdout F one\n{T} stdout P cut-a|\n")).unwrap();
        let (mut r, unfinished) = cri_reader(&path);
        r.read_turn(&ctx, 4);
        r.read_turn(&ctx, 4);
        assert_eq!(messages(&out), ["one"]);
        r.detached_since = Some(Instant::now());
        r.read_turn(&ctx, 4);
        assert_eq!(messages(&out), ["cut-a|"]);
        assert_eq!(unfinished.get(), 1);
        assert!(!r.has_partial());
        // Still at its path, but idle for `unfinished_line_timeout`: a
        // container's last output without newline.
        let path = dir.path().join("1.log");
        std::fs::write(&path, format!("{T} stdout P last words\n")).unwrap();
        let (mut r, unfinished) = cri_reader(&path);
        r.read_turn(&ctx, 4);
        r.read_turn(&ctx, 4);
        assert_eq!(messages(&out), Vec::<String>::new());
        ctx.unfinished_line_timeout = Duration::ZERO;
        r.read_turn(&ctx, 4);
        assert_eq!(messages(&out), ["last words"]);
        assert_eq!(unfinished.get(), 1);
    }

    #[test]
    fn a_failed_delivery_is_read_again_after_a_growing_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        std::fs::write(&path, b"one\ntwo\n").unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let fp = Fingerprint::read(&file, meta.len()).unwrap();
        let mut r = FileReader::open(path, 0, fp, file, FileId::of(&meta), Arc::new([]));
        let out = Arc::new(Collect::default());
        let ctx = context(out.clone());
        let nack_all = |out: &Collect| {
            for mut b in out.0.lock().drain(..) {
                if let Some(a) = b.ack.take() {
                    a.nack();
                }
            }
        };
        r.read_turn(&ctx, 4);
        assert_eq!(out.0.lock().len(), 1);
        let failed_at = Instant::now();
        nack_all(&out);
        // No hot re-read loop: the re-read waits for the backoff.
        assert_eq!(r.read_turn(&ctx, 4), Turn::Backoff);
        assert!(out.0.lock().is_empty());
        assert_eq!(r.retry_backoff, MIN_RETRY_BACKOFF);
        let retry_at = r.retry_at.expect("a retry is scheduled");
        assert!(retry_at >= failed_at + MIN_RETRY_BACKOFF);
        std::thread::sleep(retry_at.saturating_duration_since(Instant::now()));
        r.read_turn(&ctx, 4);
        assert_eq!(out.0.lock().len(), 1, "read again after the backoff");
        // A second failure in a row (nothing committed since) waits longer.
        nack_all(&out);
        assert_eq!(r.read_turn(&ctx, 4), Turn::Backoff);
        assert_eq!(r.retry_backoff, MIN_RETRY_BACKOFF * 2);
    }

    /// The text encoder copies a verbatim batch's buffer whole, so the flag
    /// must be set only when every event is one whole line: not for the
    /// pieces of an over-long line, nor for the end of one.
    #[test]
    fn only_batches_of_whole_lines_are_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let long = "x".repeat(1500);
        std::fs::write(&path, format!("one\ntwo\n{long}\nthree\n")).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let fp = Fingerprint::read(&file, meta.len()).unwrap();
        let mut r = FileReader::open(path, 0, fp, file, FileId::of(&meta), Arc::new([]));
        let out = Arc::new(Collect::default());
        let mut ctx = context(out.clone());
        ctx.block_bytes = 8;
        r.read_turn(&ctx, 1);
        ctx.block_bytes = 4096;
        r.read_turn(&ctx, 1);
        let batches: Vec<EventBatch> = out.0.lock().drain(..).collect();
        let flags: Vec<(usize, bool)> = batches
            .iter()
            .map(|b| (b.events.len(), b.verbatim_lines))
            .collect();
        // "one\ntwo\n" whole; then the long line's two pieces and "three".
        assert_eq!(flags, [(2, true), (3, false)]);
        for mut b in batches {
            let mut text = Vec::new();
            petrel_core::encode::encode_batch(
                &petrel_core::encode::Encoding::Text,
                &b,
                &mut text,
                None,
            );
            let mut walked = Vec::new();
            b.verbatim_lines = false;
            petrel_core::encode::encode_batch(
                &petrel_core::encode::Encoding::Text,
                &b,
                &mut walked,
                None,
            );
            assert_eq!(text, walked, "the copy is what the walk writes");
            if let Some(a) = b.ack.take() {
                a.ack();
            }
        }
    }

    /// (stream, offset, line) of every event `path` gives when read from
    /// `offset` in blocks of `block` bytes.
    fn positions(path: &std::path::Path, offset: u64, block: usize) -> Vec<(u128, u64, String)> {
        positions_with(path, offset, block, None)
    }

    fn positions_with(
        path: &std::path::Path,
        offset: u64,
        block: usize,
        decoder: Option<Box<dyn LineDecoder>>,
    ) -> Vec<(u128, u64, String)> {
        let file = File::open(path).unwrap();
        let meta = file.metadata().unwrap();
        let fp = Fingerprint::read(&file, meta.len()).unwrap();
        let mut r = FileReader::open(
            path.into(),
            offset,
            fp,
            file,
            FileId::of(&meta),
            Arc::new([]),
        )
        .with_decoder(decoder);
        let out = Arc::new(Collect::default());
        let mut ctx = context(out.clone());
        ctx.block_bytes = block;
        while r.read_turn(&ctx, 4) == Turn::More {}
        let batches = out.0.lock();
        let mut v = Vec::new();
        for b in batches.iter() {
            for ev in &b.events {
                let (stream, at) = b.event_origin(ev).expect("file batches carry an origin");
                let line = String::from_utf8_lossy(b.bytes_of(&ev.message).unwrap()).into_owned();
                v.push((stream, at, line));
            }
        }
        v
    }

    #[test]
    fn events_keep_their_file_offsets_however_the_reads_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let text: String = (0..500)
            .map(|i| format!("line {i} {}\n", "x".repeat(i % 37)))
            .collect();
        std::fs::write(&path, &text).unwrap();
        let whole = positions(&path, 0, 4096);
        assert_eq!(whole.len(), 500);
        let mut at = 0u64;
        for (i, (_, off, line)) in whole.iter().enumerate() {
            assert_eq!(*off, at, "line {i} starts at its file offset");
            at += line.len() as u64 + 1;
        }
        // Read again from a committed offset (a restart) in other blocks.
        let from = whole[200].1;
        let again = positions(&path, from, 777);
        assert_eq!(again[..], whole[200..]);
        // The same inode rewritten with another first line is a new stream.
        std::fs::write(&path, text.replacen("line 0", "LINE 0", 1)).unwrap();
        assert_ne!(positions(&path, 0, 4096)[0].0, whole[0].0);
    }

    #[test]
    fn decoded_container_messages_get_distinct_positions_that_survive_a_re_read() {
        use crate::sources::kubernetes::format::{ContainerDecoder, FormatCounters, Streams};
        let decoder = || -> Option<Box<dyn LineDecoder>> {
            let streams = Streams {
                stdout: true,
                stderr: true,
            };
            // Merged messages are cut into pieces of 12 bytes.
            Some(Box::new(ContainerDecoder::new(
                12,
                streams,
                FormatCounters::default(),
            )))
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        let mut text = String::new();
        let mut resume = Vec::new();
        for i in 0..200 {
            // A stdout line in two partial records with a stderr record
            // between them, then a whole stdout record.
            let t = format!("2024-01-01T00:00:{:02}.{i:09}Z", i % 60);
            text.push_str(&format!("{t} stdout P first half {i} and \n"));
            text.push_str(&format!("{t} stderr F error {i}\n"));
            text.push_str(&format!("{t} stdout F second half {i}\n"));
            resume.push(text.len() as u64);
            text.push_str(&format!("{t} stdout F whole {i}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let whole = positions_with(&path, 0, 4096, decoder());
        assert!(whole.len() > 600, "{} messages", whole.len());
        let ids: std::collections::HashSet<(u128, u64)> =
            whole.iter().map(|(s, o, _)| (*s, *o)).collect();
        assert_eq!(ids.len(), whole.len(), "every message has its own position");
        let cut = positions_with(&path, 0, 1000, decoder());
        assert_eq!(cut, whole, "the same positions whatever the block size");
        // A restart at a committed record boundary.
        let from = resume[120];
        let again = positions_with(&path, from, 333, decoder());
        let tail: Vec<_> = whole
            .iter()
            .filter(|(_, o, _)| *o >= from)
            .cloned()
            .collect();
        assert_eq!(again, tail);
    }
}
