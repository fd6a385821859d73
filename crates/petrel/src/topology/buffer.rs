//! A sink's disk buffer (`buffer: {type: disk}`): the sink's encoded
//! payloads are written to a spool of its own, and a batch counts as
//! delivered for that sink once it is durable there. The sink then drains
//! the spool at its own pace, so one stalled destination no longer holds
//! back the other sinks of its pipeline while its buffer has room.
//!
//! Two halves share the spool directory (`<data_dir>/buffers/<pipeline>/<sink
//! id>`, built on `petrel-spool`):
//! * the **ingest** thread takes the payloads the processing pool encoded
//!   for the sink, appends each as one record, makes every record of a
//!   burst durable with one `fdatasync` (group commit), and only then
//!   acknowledges them to the source. A full buffer either waits for room
//!   (`when_full: block`: the payloads stay charged to the pipeline's
//!   memory budget, which stops the source as a memory buffer would) or
//!   drops and counts them (`drop_newest`). A disk that cannot be written
//!   holds the payloads, unacknowledged, with the agent unhealthy.
//! * the **reader** task, on the sink runtime, reads records back into
//!   payloads, hands them to the sink, and commits a chunk of records in
//!   the spool once the sink acknowledged every payload in it. What was
//!   read ahead is bounded ([`READ_AHEAD`]), not charged to the budget.
//!
//! The payloads are stored encoded: the sink's `encode` ran once, on the
//! processing pool, as without a buffer, so a buffer costs one write and
//! one read of the encoded bytes. They are delivered as encoded when they
//! were written, by the sink's configuration of the time: the directory
//! records the sink's type, and another type under the same id is refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use petrel_core::le::{take, take_u32, take_u64};
use petrel_core::plugin::{Encoded, Payload, PayloadReceiver, PayloadSender, Sink};
use petrel_core::{
    AckReceiver, BatchAck, BufferGauges, ComponentMetrics, MemoryCharge, SourceInfo,
};
use petrel_spool::{AppendError, Reader, Writer, WriterOptions};
use tokio::sync::{mpsc, Notify};

use crate::config::WhenFull;

/// Bytes of payloads read back and handed to the sink, not yet
/// acknowledged: enough to keep a sink's requests full, small next to
/// the memory limit.
pub const READ_AHEAD: usize = 8 << 20;

/// At most this many bytes are read from the spool at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// Payloads appended before one sync makes them durable together.
const BURST_BYTES: usize = 8 << 20;

/// How long a blocked writer waits before it looks for room again.
const FULL_RETRY: Duration = Duration::from_millis(50);

/// Version byte of a record's layout.
const RECORD_VERSION: u8 = 1;

/// Bytes at the start of a record that say when it was written and how
/// many events it holds: version (1), time (8), events (8).
const RECORD_META: usize = 17;

/// The file naming the sink type that wrote a buffer.
const TYPE_FILE: &str = "sink.type";

/// Share of `max_size` above which `/health` reports the buffer degraded.
const DEGRADED_SHARE: f64 = 0.8;

/// The directory of `pipeline`'s sink `id`.
pub fn buffer_dir(data_dir: &Path, pipeline: &str, id: &str) -> PathBuf {
    data_dir.join("buffers").join(pipeline).join(id)
}

/// State shared by the two halves and the metrics.
struct Shared {
    /// New records are durable: the reader looks again.
    written: Notify,
    /// The ingest thread ended (its queue closed): the reader hands out
    /// nothing more and ends once the sink answered what it holds.
    closed: AtomicBool,
    /// Events written and not yet delivered, since this start.
    events: AtomicI64,
    /// The last append found the buffer full (and waits, blocking).
    full: AtomicBool,
    /// The reader task ended (or was aborted at the shutdown deadline):
    /// nothing will make room any more, so a blocked append gives up and
    /// leaves its payload unacknowledged (the source reads it again).
    reader_gone: AtomicBool,
    gauges: BufferGauges,
    metrics: ComponentMetrics,
    max_size: u64,
}

impl Shared {
    fn health_key(&self) -> String {
        format!("{}/buffer", self.metrics.health_key())
    }

    /// Publishes the buffer's size, and says in `/health` when it is
    /// over [`DEGRADED_SHARE`] of its room.
    fn report_size(&self, bytes: u64) {
        self.gauges.bytes.set(bytes as i64);
        self.gauges
            .events
            .set(self.events.load(Ordering::Relaxed).max(0));
        let health = self.metrics.health();
        let key = self.health_key();
        if self.full.load(Ordering::Relaxed) {
            health.degraded(
                &key,
                format!(
                    "disk buffer full ({bytes} of {} bytes): the source waits for the sink (`when_full: block`)",
                    self.max_size
                ),
            );
        } else if bytes as f64 > self.max_size as f64 * DEGRADED_SHARE {
            health.degraded(
                &key,
                format!(
                    "disk buffer {:.0}% full ({bytes} of {} bytes): the sink delivers slower than data arrives",
                    bytes as f64 * 100.0 / self.max_size as f64,
                    self.max_size
                ),
            );
        } else {
            health.recovered(&key);
        }
    }
}

/// What a disk buffer is for and how big.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The sink's `type:`, recorded in the directory.
    pub sink_type: &'static str,
    /// Undelivered bytes it may hold.
    pub max_size: u64,
    /// What a full buffer does.
    pub when_full: WhenFull,
}

/// A started disk buffer.
pub struct DiskBuffer {
    /// Where the processing pool sends the sink's payloads.
    pub tx: PayloadSender,
    /// The reader task, to join with the sink's own.
    pub reader: tokio::task::JoinHandle<()>,
}

/// Opens the buffer in `dir` for `sink` (whose delivery task takes
/// `sink_tx`'s payloads), starts its ingest thread and its reader task on
/// `rt`.
pub fn start(
    dir: &Path,
    settings: Settings,
    sink: Arc<dyn Sink>,
    sink_tx: PayloadSender,
    metrics: ComponentMetrics,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<DiskBuffer> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("disk buffer {}: {e}", dir.display()))?;
    let Settings {
        sink_type,
        max_size,
        when_full,
    } = settings;
    check_type(dir, sink_type)?;
    let reader = Reader::open(dir).map_err(|e| {
        anyhow::anyhow!(
            "disk buffer {}: {e} (is another agent using the same data directory?)",
            dir.display()
        )
    })?;
    // A batch larger than `max_size` is written once the buffer is empty
    // (it then holds more than `max_size` by that batch): under `block`
    // it waits for that, never dropped; under `drop_newest` it is
    // dropped and counted while the buffer holds data.
    let writer = Writer::open(
        dir,
        WriterOptions {
            allow_oversized: true,
            ..WriterOptions::for_cap(max_size)
        },
    )
    .map_err(|e| anyhow::anyhow!("disk buffer {}: {e}", dir.display()))?;
    let gauges = metrics.buffer_gauges();
    gauges.max_bytes.set(max_size as i64);
    // The events the buffer holds from an earlier run, so that the gauge
    // says what is on disk from the start.
    let mut held = 0u64;
    let _ = reader.for_each_unread_prefix(RECORD_META, |b| held += record_events(b));
    let shared = Arc::new(Shared {
        written: Notify::new(),
        closed: AtomicBool::new(false),
        events: AtomicI64::new(held as i64),
        full: AtomicBool::new(false),
        reader_gone: AtomicBool::new(false),
        gauges,
        metrics,
        max_size,
    });
    shared.report_size(writer.usage());
    let (tx, rx) = petrel_core::plugin::payload_channel();
    let ingest = Ingest {
        writer,
        when_full,
        shared: shared.clone(),
        sink: sink.clone(),
        dropped: shared.metrics.discarded_counter("buffer_full"),
    };
    std::thread::Builder::new()
        .name("petrel-buffer".into())
        .spawn(move || ingest.run(rx))?;
    let reader = rt.spawn(drain(reader, sink, sink_tx, shared));
    Ok(DiskBuffer { tx, reader })
}

/// Refuses, without writing anything, a buffer directory that another
/// sink type wrote: checked when a pipeline is built, so a reload that
/// would fail on it refuses before the running pipeline is stopped.
pub fn precheck(dir: &Path, sink_type: &str) -> anyhow::Result<()> {
    match std::fs::read_to_string(dir.join(TYPE_FILE)) {
        Ok(t) if t.trim() != sink_type => anyhow::bail!(
            "disk buffer {} holds data encoded for a `{}` sink, not `{sink_type}`: give this sink another `id`, or deliver that data with the old sink first (or delete the directory to discard it)",
            dir.display(),
            t.trim()
        ),
        _ => Ok(()),
    }
}

/// Records which sink type writes `dir`, and refuses a buffer that
/// another type wrote: its payloads are encoded for that type.
fn check_type(dir: &Path, sink_type: &str) -> anyhow::Result<()> {
    let file = dir.join(TYPE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(t) if t.trim() == sink_type => Ok(()),
        Ok(t) => anyhow::bail!(
            "disk buffer {} holds data encoded for a `{}` sink, not `{sink_type}`: give this sink another `id`, or deliver that data with the old sink first (or delete the directory to discard it)",
            dir.display(),
            t.trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&file, sink_type)
                .map_err(|e| anyhow::anyhow!("disk buffer {}: {e}", file.display()))
        }
        Err(e) => anyhow::bail!("disk buffer {}: {e}", file.display()),
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `p` as one record: version, time written, events, input bytes,
/// record ends, attachment, then the encoded bytes.
fn write_record(p: &Payload, attachment: &[u8], out: &mut Vec<u8>) {
    out.push(RECORD_VERSION);
    out.extend_from_slice(&now_millis().to_le_bytes());
    out.extend_from_slice(&p.events.to_le_bytes());
    out.extend_from_slice(&p.input_bytes.to_le_bytes());
    out.extend_from_slice(&(p.data.record_ends.len() as u32).to_le_bytes());
    for e in &p.data.record_ends {
        out.extend_from_slice(&e.to_le_bytes());
    }
    out.extend_from_slice(&(attachment.len() as u32).to_le_bytes());
    out.extend_from_slice(attachment);
    out.extend_from_slice(p.data.data());
}

/// The events of a record from its first [`RECORD_META`] bytes (0 when
/// they are not a record of this version).
fn record_events(b: &[u8]) -> u64 {
    match (
        b.first(),
        b.get(9..17).and_then(|e| <[u8; 8]>::try_from(e).ok()),
    ) {
        (Some(&RECORD_VERSION), Some(n)) => u64::from_le_bytes(n),
        _ => 0,
    }
}

/// A record read back.
struct Record {
    written_ms: u64,
    events: u64,
    input_bytes: u64,
    data: Encoded,
}

/// When a record was written and its events, without copying its data;
/// `None` as for [`read_record`].
fn record_meta(b: &[u8], sink: &dyn Sink) -> Option<(u64, u64)> {
    parse_record(b, sink, false).map(|r| (r.written_ms, r.events))
}

/// Reads a record; `None` when it is not one this version wrote (the
/// spool's checksum passed, so only another version's layout gets here).
fn read_record(b: &[u8], sink: &dyn Sink) -> Option<Record> {
    parse_record(b, sink, true)
}

/// Parses a record; its encoded bytes are copied only when `copy`.
fn parse_record(mut b: &[u8], sink: &dyn Sink, copy: bool) -> Option<Record> {
    if take(&mut b, 1)? != [RECORD_VERSION] {
        return None;
    }
    let written_ms = take_u64(&mut b)?;
    let events = take_u64(&mut b)?;
    let input_bytes = take_u64(&mut b)?;
    let n = take_u32(&mut b)? as usize;
    let ends = take(&mut b, n.checked_mul(4)?)?;
    let record_ends: Vec<u32> = ends
        .chunks_exact(4)
        .filter_map(|c| c.try_into().ok().map(u32::from_le_bytes))
        .collect();
    let alen = take_u32(&mut b)? as usize;
    let a = take(&mut b, alen)?;
    let attachment = if alen == 0 {
        None
    } else {
        Some(sink.read_attachment(a)?)
    };
    if record_ends.last().is_some_and(|&e| e as usize > b.len()) {
        return None;
    }
    Some(Record {
        written_ms,
        events,
        input_bytes,
        data: Encoded {
            bytes: if copy { b.to_vec() } else { Vec::new() },
            record_ends,
            attachment,
            invalid_utf8: 0,
            shared: None,
        },
    })
}

/// The writing half, on its own thread: blocking on the disk never holds
/// a processing worker or the sink runtime.
struct Ingest {
    writer: Writer,
    when_full: WhenFull,
    shared: Arc<Shared>,
    sink: Arc<dyn Sink>,
    dropped: petrel_core::LazyCounter,
}

impl Ingest {
    fn run(mut self, mut rx: PayloadReceiver) {
        let mut burst: Vec<Payload> = Vec::new();
        let mut scratch = Vec::new();
        let mut last_error: Option<Instant> = None;
        while let Some(first) = rx.blocking_recv() {
            let mut bytes = first.data.data().len();
            burst.push(first);
            while bytes < BURST_BYTES {
                match rx.try_recv() {
                    Ok(p) => {
                        bytes += p.data.data().len();
                        burst.push(p);
                    }
                    Err(_) => break,
                }
            }
            let mut written = Vec::with_capacity(burst.len());
            for p in burst.drain(..) {
                if let Some(p) = self.append(p, &mut scratch, &mut written, &mut last_error) {
                    written.push(p);
                }
            }
            self.make_durable(written, &mut last_error);
        }
        self.shared.closed.store(true, Ordering::Release);
        self.shared.written.notify_one();
    }

    /// Appends `p`; returns it when it is in the spool (to acknowledge once
    /// durable). Waits for room when full and blocking, and while the
    /// disk refuses writes; the records of `written` are made durable and
    /// acknowledged first, so a wait never holds what is already safe.
    fn append(
        &mut self,
        p: Payload,
        scratch: &mut Vec<u8>,
        written: &mut Vec<Payload>,
        last_error: &mut Option<Instant>,
    ) -> Option<Payload> {
        scratch.clear();
        if let Some(a) = &p.data.attachment {
            if !self.sink.write_attachment(a.as_ref(), scratch) {
                // A sink that attaches data it cannot write is a bug of the
                // sink; the payload is not lost: its source reads it again.
                tracing::error!(sink = %self.shared.metrics.health_key(),
                    "this sink's payloads cannot be written to a disk buffer; use `buffer: {{type: memory}}`");
                self.shared.metrics.error("buffer_unsupported", 1);
                return None;
            }
        }
        let mut waited = false;
        loop {
            match self
                .writer
                .append_with(|out| write_record(&p, scratch, out))
            {
                Ok(()) => {
                    self.shared.full.store(false, Ordering::Relaxed);
                    if waited {
                        self.shared
                            .metrics
                            .health()
                            .recovered(&format!("{}/write", self.shared.health_key()));
                    }
                    self.shared
                        .events
                        .fetch_add(p.events as i64, Ordering::Relaxed);
                    return Some(p);
                }
                Err(AppendError::Full) if self.when_full == WhenFull::DropNewest => {
                    self.dropped.inc_by(p.events);
                    // Counted as dropped: the source goes on past it.
                    p.ack.ack();
                    return None;
                }
                Err(AppendError::TooLarge) => {
                    tracing::error!(sink = %self.shared.metrics.health_key(), bytes = p.data.data().len(),
                        "a batch is larger than a disk buffer record can be (256 MiB); it is dropped and counted (reason=\"too_large_for_buffer\"): lower --memory-limit or the source's read size");
                    self.shared
                        .metrics
                        .discarded("too_large_for_buffer", p.events);
                    p.ack.ack();
                    return None;
                }
                Err(e) => {
                    // Full and blocking, or a disk that cannot be written:
                    // what is appended already becomes durable now, this
                    // payload waits (unacknowledged, still charged).
                    self.make_durable(std::mem::take(written), last_error);
                    if let AppendError::Unwritable(msg) = &e {
                        if last_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                            tracing::error!(sink = %self.shared.metrics.health_key(), error = %msg,
                                "cannot write the disk buffer (is the disk full?); holding the data, nothing is acknowledged until it is written");
                            *last_error = Some(Instant::now());
                        }
                        self.shared.metrics.health().fatal(
                            &format!("{}/write", self.shared.health_key()),
                            format!("cannot write the disk buffer: {msg}"),
                        );
                    }
                    if self.shared.reader_gone.load(Ordering::Acquire) {
                        // Unanswered: its source reads it again next time.
                        return None;
                    }
                    waited = true;
                    if matches!(e, AppendError::Full) {
                        self.shared.full.store(true, Ordering::Relaxed);
                    }
                    self.shared.report_size(self.writer.usage());
                    std::thread::sleep(FULL_RETRY);
                }
            }
        }
    }

    /// Syncs what was appended and acknowledges it; while syncing fails,
    /// keeps trying (nothing unsynced is acknowledged).
    fn make_durable(&mut self, written: Vec<Payload>, last_error: &mut Option<Instant>) {
        if written.is_empty() {
            return;
        }
        loop {
            match self.writer.sync() {
                Ok(()) => break,
                Err(e) => {
                    if self.shared.reader_gone.load(Ordering::Acquire) {
                        // Stopping: unanswered, the sources read it again.
                        return;
                    }
                    if last_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::error!(sink = %self.shared.metrics.health_key(), error = %e,
                            "cannot make the disk buffer durable (is the disk full?); holding the data, nothing is acknowledged until it is written");
                        *last_error = Some(Instant::now());
                    }
                    self.shared.metrics.health().fatal(
                        &format!("{}/write", self.shared.health_key()),
                        format!("cannot write the disk buffer: {e}"),
                    );
                    std::thread::sleep(FULL_RETRY * 4);
                }
            }
        }
        self.shared
            .metrics
            .health()
            .recovered(&format!("{}/write", self.shared.health_key()));
        for p in written {
            let Payload { ack, charge, .. } = p;
            ack.ack();
            drop(charge);
        }
        self.shared.report_size(self.writer.usage());
        self.shared.written.notify_one();
    }
}

/// The answer for one record (one payload) read back.
struct RecordDone {
    /// The chunk it was read in: (segment, start).
    chunk: (u64, u64),
    /// Its index in the chunk.
    index: usize,
    delivered: bool,
}

/// Sends the outcome of each payload of a chunk to the reader task; the
/// payload's index in the chunk is its acknowledgement's sequence number.
struct ChunkAck {
    tx: mpsc::UnboundedSender<RecordDone>,
    chunk: (u64, u64),
}

impl AckReceiver for ChunkAck {
    fn complete(&self, seq: u64, delivered: bool) {
        let _ = self.tx.send(RecordDone {
            chunk: self.chunk,
            index: seq as usize,
            delivered,
        });
    }
}

/// A chunk read back, kept until the sink answered each of its records.
struct InFlight {
    chunk: petrel_spool::Chunk,
    /// When its first record was written (for the age gauge).
    first_written: u64,
    /// Events of each record; `None` once delivered (or unreadable).
    events: Vec<Option<u64>>,
    /// Records not yet delivered.
    left: usize,
}

impl InFlight {
    /// The segment range of record `i`: its header to its end.
    fn range(&self, i: usize) -> (u64, u64) {
        let r = &self.chunk.records[i];
        (
            self.chunk.start + (r.start - petrel_spool::RECORD_HEADER) as u64,
            self.chunk.start + r.end as u64,
        )
    }
}

/// What the reading half has handed out and not had answered.
struct Draining {
    reader: Reader,
    shared: Arc<Shared>,
    /// Bytes of the chunks in flight.
    bytes: usize,
    /// (segment, start) → the chunk, kept until the sink answered every
    /// payload of it; oldest first.
    chunks: std::collections::BTreeMap<(u64, u64), InFlight>,
    /// Records the sink answered as not delivered, to hand out again.
    retry: Vec<((u64, u64), usize)>,
    /// Records left undelivered at the stop.
    failed: u64,
    /// Logs, counts and reports damage the reader found.
    damage: petrel_core::DamageReporter,
}

impl Draining {
    /// Books the answer for a record: a delivered record is committed at
    /// once (not when the rest of its chunk is), so that a crash sends
    /// again only what was in flight and the last state interval's
    /// deliveries; an undelivered one is handed out again, unless the
    /// pipeline stops (then it stays uncommitted, for the next start).
    fn settle(&mut self, d: RecordDone) {
        let Some(f) = self.chunks.get_mut(&d.chunk) else {
            return;
        };
        if d.delivered {
            if let Some(events) = f.events.get_mut(d.index).and_then(Option::take) {
                let (start, end) = f.range(d.index);
                self.reader.complete(f.chunk.segment, start, end);
                self.shared
                    .events
                    .fetch_sub(events as i64, Ordering::Relaxed);
                f.left -= 1;
            }
        } else if self.shared.closed.load(Ordering::Acquire) {
            self.failed += 1;
            f.left -= 1;
        } else {
            self.retry.push((d.chunk, d.index));
        }
        if f.left == 0 {
            self.bytes = self.bytes.saturating_sub(f.chunk.buf.len());
            self.chunks.remove(&d.chunk);
        }
    }

    fn report(&mut self) {
        let damage = self.reader.take_damage();
        for d in &damage {
            self.damage
                .report(&d.path, d.offset, d.bytes, d.records, &d.what);
        }
        if !damage.is_empty() {
            // The events of a skipped record are unknown to the count
            // kept since the start: count what is left again, so the
            // gauge keeps saying what is on disk.
            let mut left = 0u64;
            let _ = self.reader.for_each_unread_prefix(RECORD_META, |b| {
                left += record_events(b);
            });
            let in_flight: u64 = self
                .chunks
                .values()
                .flat_map(|f| f.events.iter().flatten())
                .sum();
            self.shared
                .events
                .store((left + in_flight) as i64, Ordering::Relaxed);
        }
        self.damage.tick();
        let oldest = self.chunks.values().next().map(|c| c.first_written);
        self.shared
            .gauges
            .oldest_seconds
            .set(oldest.map_or(0, |t| now_millis().saturating_sub(t) as i64 / 1000));
        // Segments written since the last read are counted too: the
        // gauge is what is on disk, also while the sink is down and
        // nothing is read.
        let _ = self.reader.refresh();
        self.shared
            .report_size(self.reader.uncommitted_bytes() + self.reader.backlog_bytes());
    }
}

/// The reading half: hands the spool's records to the sink, commits
/// what it acknowledged. Once the ingest side closed (the pipeline
/// stops) it still delivers what the buffer holds, until the shutdown
/// deadline aborts it; what is left then is delivered after the next
/// start.
async fn drain(reader: Reader, sink: Arc<dyn Sink>, sink_tx: PayloadSender, shared: Arc<Shared>) {
    let source = Arc::new(SourceInfo {
        path: "".into(),
        meta: Vec::new().into(),
        source_type: "buffer",
    });
    /// Tells the ingest side when this task ends, aborted or not.
    struct Gone(Arc<Shared>);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.reader_gone.store(true, Ordering::Release);
        }
    }
    let _gone = Gone(shared.clone());
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<RecordDone>();
    let mut st = Draining {
        reader,
        shared: shared.clone(),
        bytes: 0,
        chunks: Default::default(),
        retry: Vec::new(),
        failed: 0,
        damage: shared.metrics.damage_reporter(),
    };
    let mut closed_at: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        while let Ok(d) = done_rx.try_recv() {
            st.settle(d);
        }
        if let Err(e) = st.reader.maintain(false) {
            tracing::warn!(sink = %shared.metrics.health_key(), error = %e, "cannot update the disk buffer's read position; delivered data may be sent again after a restart");
        }
        st.report();
        if shared.closed.load(Ordering::Acquire) {
            let since = *closed_at.get_or_insert_with(Instant::now);
            // The reader lists new segments every 50 ms: the last look
            // must come after the ingest side's last sync.
            if st.chunks.is_empty()
                && st.reader.backlog_bytes() == 0
                && since.elapsed() > Duration::from_millis(150)
            {
                break;
            }
        }
        if !st.retry.is_empty() && retry_at.is_none_or(|t| Instant::now() >= t) {
            if retry_at.is_none() {
                // A sink answers "not delivered" only when it gives up on
                // a payload; sending it again at once would spin.
                retry_at = Some(Instant::now() + Duration::from_secs(1));
            } else {
                retry_at = None;
                for (key, index) in std::mem::take(&mut st.retry) {
                    if let Some(f) = st.chunks.get(&key) {
                        dispatch(f, Some(index), sink.as_ref(), &sink_tx, &source, &done_tx);
                    }
                }
            }
        }
        let mut read_any = false;
        if st.bytes < READ_AHEAD {
            match st.reader.read(CHUNK_BYTES) {
                Ok(Some(chunk)) => {
                    read_any = true;
                    st.bytes += chunk.buf.len();
                    let key = (chunk.segment, chunk.start);
                    let f = read_chunk(chunk, sink.as_ref(), &shared, &mut st.reader);
                    dispatch(&f, None, sink.as_ref(), &sink_tx, &source, &done_tx);
                    if f.left == 0 {
                        st.bytes = st.bytes.saturating_sub(f.chunk.buf.len());
                    } else {
                        st.chunks.insert(key, f);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(sink = %shared.metrics.health_key(), error = %e, "cannot read the disk buffer; retrying");
                    shared.metrics.error("buffer_read", 1);
                }
            }
        }
        if read_any {
            continue;
        }
        tokio::select! {
            Some(d) = done_rx.recv() => st.settle(d),
            _ = shared.written.notified() => {}
            _ = tick.tick() => {}
        }
    }
    // The sink finishes what it holds once its queue closes.
    drop(sink_tx);
    if st.failed > 0 {
        tracing::info!(sink = %shared.metrics.health_key(), records = st.failed, "disk buffer: data the sink did not deliver stays in the buffer for the next start");
    }
    if let Err(e) = st.reader.maintain(true) {
        tracing::warn!(sink = %shared.metrics.health_key(), error = %e, "cannot save the disk buffer's read position; delivered data may be sent again after a restart");
    }
    st.report();
}

/// Reads the records of a chunk: their events, and when the first was
/// written. A record in a layout this version cannot read (the spool's
/// checksum passed, so only another version's layout gets here) is
/// counted, reported as damage and committed as done.
fn read_chunk(
    chunk: petrel_spool::Chunk,
    sink: &dyn Sink,
    shared: &Shared,
    reader: &mut Reader,
) -> InFlight {
    let mut events = Vec::with_capacity(chunk.records.len());
    let mut first_written = None;
    let mut unreadable = 0u64;
    for r in &chunk.records {
        match chunk.buf.get(r.clone()).and_then(|b| record_meta(b, sink)) {
            Some((written_ms, n)) => {
                first_written.get_or_insert(written_ms);
                events.push(Some(n));
            }
            None => {
                unreadable += 1;
                events.push(None);
            }
        }
    }
    let f = InFlight {
        first_written: first_written.unwrap_or_else(now_millis),
        left: events.iter().filter(|e| e.is_some()).count(),
        events,
        chunk,
    };
    if unreadable > 0 {
        tracing::error!(sink = %shared.metrics.health_key(), records = unreadable,
            "disk buffer records in an unknown layout (written by another version?) are skipped and counted (error_type=\"buffer_unreadable\")");
        shared.metrics.error("buffer_unreadable", unreadable);
        for i in 0..f.events.len() {
            if f.events[i].is_none() {
                let (start, end) = f.range(i);
                reader.complete(f.chunk.segment, start, end);
            }
        }
    }
    f
}

/// Hands a chunk's records (or only record `only`) to the sink, each
/// payload with its own acknowledgement, so each is committed once the
/// sink answered it.
fn dispatch(
    f: &InFlight,
    only: Option<usize>,
    sink: &dyn Sink,
    tx: &PayloadSender,
    source: &Arc<SourceInfo>,
    done_tx: &mpsc::UnboundedSender<RecordDone>,
) {
    let key = (f.chunk.segment, f.chunk.start);
    let receiver: Arc<dyn AckReceiver> = Arc::new(ChunkAck {
        tx: done_tx.clone(),
        chunk: key,
    });
    for (i, r) in f.chunk.records.iter().enumerate() {
        if only.is_some_and(|o| o != i) || f.events[i].is_none() {
            continue;
        }
        // Read back again for each dispatch: the chunk keeps only bytes.
        let Some(rec) = f
            .chunk
            .buf
            .get(r.clone())
            .and_then(|b| read_record(b, sink))
        else {
            continue;
        };
        let payload = Payload {
            data: rec.data,
            events: rec.events,
            input_bytes: rec.input_bytes,
            source: source.clone(),
            ack: BatchAck::start(receiver.clone(), i as u64),
            charge: MemoryCharge::none(),
        };
        // Fails only when the sink has stopped; the part then answers as
        // undelivered and the record stays for the next start.
        let _ = tx.send(payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::AckPart;

    struct Plain;
    impl Sink for Plain {
        fn encode(&self, _: &petrel_core::EventBatch, _: &mut Encoded) {}
        fn run(self: Arc<Self>, _: PayloadReceiver) -> petrel_core::plugin::BoxFuture {
            Box::pin(async {})
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let p = Payload {
            data: Encoded {
                bytes: b"one\ntwo\n".to_vec(),
                record_ends: vec![4, 8],
                ..Encoded::default()
            },
            events: 2,
            input_bytes: 8,
            source: Arc::new(SourceInfo::file("x", Vec::new().into())),
            ack: AckPart::detached(),
            charge: MemoryCharge::none(),
        };
        let mut out = Vec::new();
        write_record(&p, &[], &mut out);
        let r = read_record(&out, &Plain).expect("reads back");
        assert_eq!(r.events, 2);
        assert_eq!(r.input_bytes, 8);
        assert_eq!(r.data.bytes, b"one\ntwo\n");
        assert_eq!(r.data.record_ends, vec![4, 8]);
        assert!(r.written_ms > 0);
        // Truncated, or of another version: not read as a payload.
        assert!(read_record(&out[..out.len() - 9], &Plain).is_none());
        let mut other = out.clone();
        other[0] = 9;
        assert!(read_record(&other, &Plain).is_none());
    }
}
