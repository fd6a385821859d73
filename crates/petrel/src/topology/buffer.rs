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

use petrel_core::plugin::{Encoded, Payload, PayloadReceiver, PayloadSender, Sink};
use petrel_core::{
    AckPart, AckReceiver, BatchAck, BufferGauges, ComponentMetrics, MemoryCharge, SourceInfo,
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
    let writer = Writer::open(dir, WriterOptions::for_cap(max_size))
        .map_err(|e| anyhow::anyhow!("disk buffer {}: {e}", dir.display()))?;
    let gauges = metrics.buffer_gauges();
    gauges.max_bytes.set(max_size as i64);
    let shared = Arc::new(Shared {
        written: Notify::new(),
        closed: AtomicBool::new(false),
        events: AtomicI64::new(0),
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

/// A record read back.
struct Record {
    written_ms: u64,
    events: u64,
    input_bytes: u64,
    data: Encoded,
}

/// Takes `n` bytes off the front of `b`.
fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if b.len() < n {
        return None;
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Some(head)
}

fn take_u64(b: &mut &[u8]) -> Option<u64> {
    take(b, 8)?.try_into().ok().map(u64::from_le_bytes)
}

fn take_u32(b: &mut &[u8]) -> Option<u32> {
    take(b, 4)?.try_into().ok().map(u32::from_le_bytes)
}

/// Reads a record; `None` when it is not one this version wrote (the
/// spool's checksum passed, so only another version's layout gets here).
fn read_record(mut b: &[u8], sink: &dyn Sink) -> Option<Record> {
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
            bytes: b.to_vec(),
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
                        "a batch is larger than the disk buffer's max_size; it is dropped and counted (reason=\"too_large_for_buffer\"): raise `max_size`");
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

/// The answer for one chunk of records read back.
struct ChunkDone {
    segment: u64,
    start: u64,
    end: u64,
    events: u64,
    bytes: usize,
    delivered: bool,
}

/// Sends the outcome of a chunk's payloads, once all answered, to the
/// reader task.
struct ChunkAck {
    tx: mpsc::UnboundedSender<ChunkDone>,
    segment: u64,
    start: u64,
    end: u64,
    events: u64,
    bytes: usize,
}

impl AckReceiver for ChunkAck {
    fn complete(&self, _seq: u64, delivered: bool) {
        let _ = self.tx.send(ChunkDone {
            segment: self.segment,
            start: self.start,
            end: self.end,
            events: self.events,
            bytes: self.bytes,
            delivered,
        });
    }
}

/// What the reading half has handed out and not had answered.
struct Draining {
    reader: Reader,
    shared: Arc<Shared>,
    /// Bytes of the chunks in flight.
    bytes: usize,
    /// (segment, start) → the chunk, kept until the sink answered every
    /// payload of it, and when its first record was written (for the age
    /// gauge); oldest first.
    chunks: std::collections::BTreeMap<(u64, u64), (u64, petrel_spool::Chunk)>,
    /// Chunks the sink answered as not delivered, to hand out again.
    retry: Vec<(u64, u64)>,
    /// Chunks left undelivered at the stop.
    failed: u64,
}

impl Draining {
    /// Books the answer for a chunk: delivered chunks are committed; an
    /// undelivered one is handed out again, unless the pipeline stops
    /// (then it stays uncommitted, for the next start).
    fn settle(&mut self, d: ChunkDone) {
        let key = (d.segment, d.start);
        if d.delivered {
            self.bytes = self.bytes.saturating_sub(d.bytes);
            self.chunks.remove(&key);
            self.reader.complete(d.segment, d.start, d.end);
            self.shared
                .events
                .fetch_sub(d.events as i64, Ordering::Relaxed);
        } else if self.shared.closed.load(Ordering::Acquire) {
            self.bytes = self.bytes.saturating_sub(d.bytes);
            self.chunks.remove(&key);
            self.failed += 1;
        } else {
            self.retry.push(key);
        }
    }

    fn report(&self) {
        let oldest = self.chunks.values().next().map(|c| c.0);
        self.shared
            .gauges
            .oldest_seconds
            .set(oldest.map_or(0, |t| now_millis().saturating_sub(t) as i64 / 1000));
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
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<ChunkDone>();
    let mut st = Draining {
        reader,
        shared: shared.clone(),
        bytes: 0,
        chunks: Default::default(),
        retry: Vec::new(),
        failed: 0,
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
                for key in std::mem::take(&mut st.retry) {
                    if let Some((_, chunk)) = st.chunks.get(&key) {
                        dispatch(chunk, sink.as_ref(), &sink_tx, &source, &done_tx, &shared);
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
                    let first_written =
                        dispatch(&chunk, sink.as_ref(), &sink_tx, &source, &done_tx, &shared);
                    st.chunks
                        .insert((chunk.segment, chunk.start), (first_written, chunk));
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
        tracing::info!(sink = %shared.metrics.health_key(), chunks = st.failed, "disk buffer: data the sink did not deliver stays in the buffer for the next start");
    }
    if let Err(e) = st.reader.maintain(true) {
        tracing::warn!(sink = %shared.metrics.health_key(), error = %e, "cannot save the disk buffer's read position; delivered data may be sent again after a restart");
    }
    st.report();
}

/// Turns a chunk's records into payloads for the sink, all answering one
/// acknowledgement for the chunk; returns when its first record was
/// written.
fn dispatch(
    chunk: &petrel_spool::Chunk,
    sink: &dyn Sink,
    tx: &PayloadSender,
    source: &Arc<SourceInfo>,
    done_tx: &mpsc::UnboundedSender<ChunkDone>,
    shared: &Shared,
) -> u64 {
    let mut records = Vec::with_capacity(chunk.records.len());
    let mut unreadable = 0u64;
    for r in &chunk.records {
        match chunk.buf.get(r.clone()).and_then(|b| read_record(b, sink)) {
            Some(rec) => records.push(rec),
            None => unreadable += 1,
        }
    }
    if unreadable > 0 {
        tracing::error!(sink = %shared.metrics.health_key(), records = unreadable,
            "disk buffer records in an unknown layout (written by another version?) are skipped and counted (error_type=\"buffer_unreadable\")");
        shared.metrics.error("buffer_unreadable", unreadable);
    }
    let events: u64 = records.iter().map(|r| r.events).sum();
    let first_written = records.first().map_or_else(now_millis, |r| r.written_ms);
    let ack = BatchAck::start(
        Arc::new(ChunkAck {
            tx: done_tx.clone(),
            segment: chunk.segment,
            start: chunk.start,
            end: chunk.end,
            events,
            bytes: chunk.buf.len(),
        }),
        0,
    );
    let parts: Vec<AckPart> = ack.split(records.len());
    for (rec, ack) in records.into_iter().zip(parts) {
        let payload = Payload {
            data: rec.data,
            events: rec.events,
            input_bytes: rec.input_bytes,
            source: source.clone(),
            ack,
            charge: MemoryCharge::none(),
        };
        // Fails only when the sink has stopped; the part then answers as
        // undelivered and the chunk stays for the next start.
        let _ = tx.send(payload);
    }
    first_written
}

#[cfg(test)]
mod tests {
    use super::*;

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
