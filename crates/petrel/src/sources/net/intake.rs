//! From received blocks to delivered events: the memory buffer, the disk
//! spool, and delivery with retries until every sink acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::plugin::{Emitter, SourceContext};
use petrel_core::LazyCounter;
use petrel_core::{
    AckReceiver, BatchAck, EventBatch, Key, MemoryCharge, PipelineBudget, SourceInfo,
};
use petrel_spool::{AppendError, Reader, SharedWriter, Writer, WriterOptions};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, oneshot};

use super::{record, Block, BufferOptions, Decode, WhenFull};

/// The answer to a submitted block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Accepted: in the memory budget, or durable in the spool.
    Accepted,
    /// The buffer is full; try again later.
    Full,
    /// Not accepted, for this reason.
    Failed(String),
}

struct Submission {
    block: Block,
    reply: Option<oneshot::Sender<Admission>>,
    /// Memory buffer: called once every sink delivered the block.
    delivered: Option<OnDelivered>,
}

/// Called once a block's events were delivered by every sink (see
/// [`Intake::submit_tracked`]).
pub type OnDelivered = Box<dyn FnOnce() + Send>;

/// Blocks waiting for the dispatcher; small, since each may be a whole
/// read buffer and they are not charged yet: when it is full, connections
/// stop reading.
const QUEUE_BLOCKS: usize = 16;

/// Queued blocks of one stream are joined up to this size.
const COALESCE_BYTES: usize = 256 << 10;

/// Bytes the spool reader reads at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// First wait before sending a block again after a failed delivery;
/// doubled per failure up to [`MAX_RETRY`].
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Where connections hand their blocks; cheap to clone.
#[derive(Clone)]
pub struct Intake {
    tx: mpsc::Sender<Submission>,
    dispatcher: Thread,
}

impl Intake {
    /// Hands over `block`, waiting while the queue is full (which stops
    /// the caller's reading: backpressure). `false` once the source stops.
    pub async fn submit(&self, block: Block) -> bool {
        let ok = self
            .tx
            .send(Submission {
                block,
                reply: None,
                delivered: None,
            })
            .await
            .is_ok();
        self.dispatcher.unpark();
        ok
    }

    /// Hands over `block` and waits for the answer (HTTP answers its
    /// client with it).
    pub async fn submit_and_wait(&self, block: Block, timeout: Duration) -> Admission {
        self.submit_tracked(block, timeout, None).await
    }

    /// Like [`submit_and_wait`](Self::submit_and_wait); with a memory
    /// buffer `delivered` is called once every sink delivered the block
    /// (never if it is not delivered before the source stops). With a
    /// disk buffer it is never called: [`Admission::Accepted`] already
    /// means durable. For protocols that acknowledge delivery to their
    /// clients (Splunk HEC indexer acknowledgement).
    pub async fn submit_tracked(
        &self,
        block: Block,
        timeout: Duration,
        delivered: Option<OnDelivered>,
    ) -> Admission {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(Submission {
            block,
            reply: Some(tx),
            delivered,
        });
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Admission::Failed("the source is stopping".into()),
            Err(_) => return Admission::Full,
        }
        self.dispatcher.unpark();
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => Admission::Failed("the source is stopping".into()),
            Err(_) => Admission::Full,
        }
    }

    /// Hands over `block` like [`Intake::submit`] (waiting while the queue
    /// is full: backpressure, as any stream) and returns what answers once
    /// the block is safe: delivered to every sink with the memory buffer,
    /// durable in the spool with the disk buffer. For stream protocols that
    /// acknowledge to their sender (the fluent source's `chunk`). `None`
    /// once the source stops; the answer is dropped (never sent) if the
    /// block is dropped or the source stops first.
    pub async fn submit_acked(&self, block: Block) -> Option<oneshot::Receiver<Admission>> {
        let (tx, rx) = oneshot::channel();
        let delivered: OnDelivered = Box::new(move || {
            let _ = tx.send(Admission::Accepted);
        });
        let ok = self
            .tx
            .send(Submission {
                block,
                reply: None,
                delivered: Some(delivered),
            })
            .await
            .is_ok();
        self.dispatcher.unpark();
        ok.then_some(rx)
    }

    /// Hands over `block` if the queue has room, from a thread outside
    /// the runtime (datagram receivers, which must never block: they
    /// also watch for their stop and for the kernel's drops meanwhile).
    pub fn try_submit(&self, block: Block) -> TrySubmit {
        let r = self.tx.try_send(Submission {
            block,
            reply: None,
            delivered: None,
        });
        self.dispatcher.unpark();
        match r {
            Ok(()) => TrySubmit::Done,
            Err(mpsc::error::TrySendError::Full(s)) => TrySubmit::Full(s.block),
            Err(mpsc::error::TrySendError::Closed(_)) => TrySubmit::Closed,
        }
    }
}

/// The answer of [`Intake::try_submit`].
pub enum TrySubmit {
    /// Queued.
    Done,
    /// The queue is full: the block is given back.
    Full(Block),
    /// The source is stopping.
    Closed,
}

/// Flags shared by a source's threads.
#[derive(Default)]
struct Flags {
    /// No more input: drain the queue, then deliver what is held.
    stop_input: AtomicBool,
    /// End now.
    stop: AtomicBool,
}

/// The threads behind an [`Intake`].
pub struct IntakeRunner {
    flags: Arc<Flags>,
    threads: Vec<JoinHandle<()>>,
    acks: Arc<Acks>,
    disk: bool,
    key: String,
}

impl IntakeRunner {
    /// No more input is coming; held data is still delivered.
    pub fn begin_stop(&self) {
        self.flags.stop_input.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.thread().unpark();
        }
    }

    /// Waits until everything accepted was delivered (memory) or is safe
    /// in the spool with its in-flight part answered (disk), at most until
    /// `deadline`.
    pub fn wait_stopped(mut self, deadline: Instant) -> anyhow::Result<()> {
        self.begin_stop();
        while Instant::now() < deadline && self.threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.flags.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
        let left = self.acks.retained_frames();
        if left > 0 && !self.disk {
            anyhow::bail!(
                "source {}: {left} message(s) held in memory were not delivered before the shutdown deadline (use `buffer: {{type: disk}}` to keep them across restarts)",
                self.key
            );
        }
        Ok(())
    }

    /// True while its threads run.
    pub fn is_alive(&self) -> bool {
        self.flags.stop_input.load(Ordering::SeqCst)
            || self.threads.iter().all(|t| !t.is_finished())
    }
}

/// Counters of a receiving source.
#[derive(Clone)]
struct Counters {
    sent_events: Counter,
    sent_bytes: Counter,
    buffer_full: LazyCounter,
    too_large: LazyCounter,
    bad_records: LazyCounter,
    corrupt_bytes: LazyCounter,
    damaged_records: LazyCounter,
    spool_bytes: Gauge,
    spool_errors: LazyCounter,
}

/// Starts the intake of a source: with a disk buffer, a spool in
/// `<data dir>/spool/<source key>`.
pub fn start(
    ctx: &SourceContext,
    decode: Arc<dyn Decode>,
    buffer: &BufferOptions,
    source_type: &'static str,
) -> anyhow::Result<(Intake, IntakeRunner)> {
    let spool = buffer
        .disk
        .then(|| super::spool_dir(&ctx.engine.data_dir, &ctx.key));
    start_with(ctx, decode, buffer, source_type, spool.as_deref())
}

fn counters(ctx: &SourceContext) -> Counters {
    let m = &ctx.metrics;
    Counters {
        sent_events: m.sent_events.clone(),
        sent_bytes: m.sent_bytes.clone(),
        buffer_full: m.discarded_counter("buffer_full"),
        too_large: m.discarded_counter("too_large"),
        bad_records: m.error_counter("spool_bad_record"),
        corrupt_bytes: m.error_counter("spool_corrupt_bytes"),
        damaged_records: m.error_counter("spool_damaged_records"),
        spool_bytes: m.spool_bytes_gauge(),
        spool_errors: m.error_counter("spool_write_failed"),
    }
}

fn start_with(
    ctx: &SourceContext,
    decode: Arc<dyn Decode>,
    buffer: &BufferOptions,
    source_type: &'static str,
    spool: Option<&Path>,
) -> anyhow::Result<(Intake, IntakeRunner)> {
    let flags = Arc::new(Flags::default());
    let counters = counters(ctx);
    let (tx, rx) = mpsc::channel(QUEUE_BLOCKS);
    let mut threads = Vec::new();
    let delivery_parts = (
        ctx.emitter.clone(),
        decode,
        ctx.meta.clone(),
        source_type,
        counters.clone(),
    );
    let (acks, dispatcher) = match spool {
        None => {
            let acks = Acks::new();
            let delivery = Delivery::new(delivery_parts, acks.clone());
            let mut d = MemoryDispatcher {
                rx,
                pending: None,
                delivery,
                budget: ctx.budget.clone(),
                when_full: buffer.when_full,
                flags: flags.clone(),
                counters,
            };
            let h = std::thread::Builder::new()
                .name(format!("petrel-in-{source_type}"))
                .spawn(move || d.run())?;
            let t = h.thread().clone();
            threads.push(h);
            (acks, t)
        }
        Some(dir) => {
            let reader = Reader::open(dir)
                .map_err(|e| anyhow::anyhow!("cannot open the spool {}: {e}", dir.display()))?;
            let writer = Writer::open(dir, WriterOptions::for_cap(buffer.max_bytes))
                .map_err(|e| anyhow::anyhow!("cannot write the spool {}: {e}", dir.display()))?;
            let writer = Arc::new(SharedWriter::new(writer, buffer.sync_interval)?);
            let acks = Acks::new();
            let mut delivery = Delivery::new(delivery_parts, acks.clone());
            delivery.spool_identity = reader.identity();
            let mut r = SpoolReader {
                reader,
                delivery,
                budget: ctx.budget.clone(),
                flags: flags.clone(),
                counters: counters.clone(),
                damage: ctx.metrics.damage_reporter(),
            };
            let rh = std::thread::Builder::new()
                .name(format!("petrel-spool-{source_type}"))
                .spawn(move || r.run())?;
            let waiters: Waiters = Arc::default();
            let w2 = waiters.clone();
            writer.on_durable(move |durable| {
                let mut w = w2.lock();
                let mut i = 0;
                while i < w.len() {
                    if w[i].0 <= durable {
                        match w.swap_remove(i).1 {
                            Waiter::Reply(tx) => {
                                let _ = tx.send(Admission::Accepted);
                            }
                            Waiter::Durable(f) => f(),
                        }
                    } else {
                        i += 1;
                    }
                }
            });
            // A write or sync that fails answers every waiting request at
            // once (503), instead of at the request's own timeout: their
            // data stays buffered and may still be delivered, so a client
            // that sends again may cause a duplicate, never a loss.
            let w3 = waiters.clone();
            writer.on_failure(move |why| {
                for (_, w) in w3.lock().drain(..) {
                    // A stream's acknowledgement is never given: the
                    // sender keeps the data and sends it again.
                    if let Waiter::Reply(tx) = w {
                        let _ =
                            tx.send(Admission::Failed(format!("cannot write the spool: {why}")));
                    }
                }
            });
            let mut d = DiskDispatcher {
                rx,
                writer,
                waiters,
                metrics: ctx.metrics.clone(),
                refusing_since: None,
                reader_thread: rh.thread().clone(),
                when_full: buffer.when_full,
                flags: flags.clone(),
                counters,
            };
            let dh = std::thread::Builder::new()
                .name(format!("petrel-in-{source_type}"))
                .spawn(move || d.run())?;
            let t = dh.thread().clone();
            threads.push(dh);
            threads.push(rh);
            (acks, t)
        }
    };
    Ok((
        Intake { tx, dispatcher },
        IntakeRunner {
            flags,
            threads,
            acks,
            disk: spool.is_some(),
            key: ctx.key.clone(),
        },
    ))
}

/// Reads a spool another process writes (`petrel pipe`), for `type: spool`.
pub fn start_spool_reader(
    ctx: &SourceContext,
    decode: Arc<dyn Decode>,
    dir: &Path,
    source_type: &'static str,
) -> anyhow::Result<IntakeRunner> {
    let reader = Reader::open(dir)
        .map_err(|e| anyhow::anyhow!("cannot open the spool {}: {e}", dir.display()))?;
    let flags = Arc::new(Flags::default());
    let counters = counters(ctx);
    let acks = Acks::new();
    let mut delivery = Delivery::new(
        (
            ctx.emitter.clone(),
            decode,
            ctx.meta.clone(),
            source_type,
            counters.clone(),
        ),
        acks.clone(),
    );
    delivery.spool_identity = reader.identity();
    let mut r = SpoolReader {
        reader,
        delivery,
        budget: ctx.budget.clone(),
        flags: flags.clone(),
        counters,
        damage: ctx.metrics.damage_reporter(),
    };
    let h = std::thread::Builder::new()
        .name(format!("petrel-spool-{source_type}"))
        .spawn(move || r.run())?;
    Ok(IntakeRunner {
        flags,
        threads: vec![h],
        acks,
        disk: true,
        key: ctx.key.clone(),
    })
}

// ---------------------------------------------------------------------------
// Delivery

/// A spool range answered once all blocks read from it were delivered.
struct ChunkDone {
    segment: u64,
    start: u64,
    end: u64,
    remaining: AtomicUsize,
    /// Memory of the chunk's buffer, released with the last block.
    _charge: MemoryCharge,
}

/// A block kept until every sink acknowledged it.
struct Retained {
    block: Block,
    _charge: MemoryCharge,
    chunk: Option<Arc<ChunkDone>>,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Called once delivered.
    on_delivered: Option<OnDelivered>,
}

/// Learns delivery outcomes; shared with the sinks' acknowledgements.
struct Acks {
    retained: Mutex<BTreeMap<u64, Retained>>,
    /// Spool ranges fully delivered, for the reader to commit.
    done: Mutex<Vec<(u64, u64, u64)>>,
    next_seq: AtomicU64,
    /// The thread to wake when something was answered.
    owner: Mutex<Option<Thread>>,
}

impl Acks {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            retained: Mutex::new(BTreeMap::new()),
            done: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(0),
            owner: Mutex::new(None),
        })
    }

    fn retained_frames(&self) -> usize {
        self.retained
            .lock()
            .values()
            .map(|r| r.block.frames.len())
            .sum()
    }
}

impl AckReceiver for Acks {
    fn complete(&self, seq: u64, delivered: bool) {
        let mut r = self.retained.lock();
        // The owner is woken only when it has something to do (commit a
        // range, resend): a wake-up per delivered batch costs more than
        // the batch at high message rates.
        let mut wake = false;
        if delivered {
            if let Some(mut b) = r.remove(&seq) {
                drop(r);
                if let Some(f) = b.on_delivered.take() {
                    f();
                }
                if let Some(c) = b.chunk {
                    if c.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        self.done.lock().push((c.segment, c.start, c.end));
                        wake = true;
                    }
                }
            }
        } else if let Some(b) = r.get_mut(&seq) {
            b.backoff = (b.backoff * 2).clamp(MIN_RETRY, MAX_RETRY);
            b.retry_at = Some(Instant::now() + b.backoff);
            wake = true;
        }
        if wake {
            if let Some(t) = &*self.owner.lock() {
                t.unpark();
            }
        }
    }
}

/// Decodes blocks into batches and emits them, keeping each block until it
/// was delivered. Used from one thread.
struct Delivery {
    emitter: Arc<dyn Emitter>,
    decode: Arc<dyn Decode>,
    meta: Arc<[(Key, Arc<str>)]>,
    source_type: &'static str,
    counters: Counters,
    acks: Arc<Acks>,
    /// Batch origins by peer, so a stream from one peer shares one.
    infos: HashMap<Option<Arc<str>>, Arc<SourceInfo>>,
    /// The spool's identity, when blocks come from a spool: each event's
    /// position (segment and offset) then stays the same however often
    /// it is read, for sinks' document ids.
    spool_identity: Option<u128>,
}

type DeliveryParts = (
    Arc<dyn Emitter>,
    Arc<dyn Decode>,
    Arc<[(Key, Arc<str>)]>,
    &'static str,
    Counters,
);

impl Delivery {
    fn new(parts: DeliveryParts, acks: Arc<Acks>) -> Self {
        let (emitter, decode, meta, source_type, counters) = parts;
        Self {
            emitter,
            decode,
            meta,
            source_type,
            counters,
            acks,
            infos: HashMap::new(),
            spool_identity: None,
        }
    }

    fn info(&mut self, peer: &Option<Arc<str>>) -> Arc<SourceInfo> {
        if let Some(i) = self.infos.get(peer) {
            return i.clone();
        }
        if self.infos.len() >= 4096 {
            self.infos.clear();
        }
        let mut meta: Vec<(Key, Arc<str>)> = self.meta.to_vec();
        if let Some(p) = peer {
            meta.push((Key::Borrowed("source_address"), p.clone()));
        }
        let info = Arc::new(SourceInfo {
            path: "".into(),
            meta: meta.into(),
            source_type: self.source_type,
        });
        self.infos.insert(peer.clone(), info.clone());
        info
    }

    /// Emits `block` for the first time. `kept` pays for the block while it
    /// is held; `extra` travels with the batch (for the sinks' copies).
    fn send_new(
        &mut self,
        block: Block,
        kept: MemoryCharge,
        extra: MemoryCharge,
        chunk: Option<Arc<ChunkDone>>,
        on_delivered: Option<OnDelivered>,
    ) {
        let seq = self.acks.next_seq.fetch_add(1, Ordering::SeqCst);
        let bytes: u64 = block.frames.iter().map(|s| s.len as u64).sum();
        let batch = self.batch(&block, extra, seq, chunk.as_deref());
        // Events, not frames: a frame of the fluent, splunk_hec or OTLP
        // source holds many.
        let frames = batch.events.len() as u64;
        self.acks.retained.lock().insert(
            seq,
            Retained {
                block,
                _charge: kept,
                chunk,
                retry_at: None,
                backoff: Duration::ZERO,
                on_delivered,
            },
        );
        self.counters.sent_events.inc_by(frames);
        self.counters.sent_bytes.inc_by(bytes);
        self.emitter.emit(batch);
    }

    fn batch(
        &mut self,
        block: &Block,
        charge: MemoryCharge,
        seq: u64,
        chunk: Option<&ChunkDone>,
    ) -> EventBatch {
        let mut batch = EventBatch::new(block.buf.clone(), self.info(&block.peer));
        // A spooled block's buffer is its chunk as read from the segment,
        // so a frame's buffer position plus the chunk's start is where it
        // sits in the segment: the same every time it is read.
        if let (Some(id), Some(c)) = (self.spool_identity, chunk) {
            let mut key = [0u8; 24];
            key[..16].copy_from_slice(&id.to_le_bytes());
            key[16..].copy_from_slice(&c.segment.to_le_bytes());
            batch.origin = Some(petrel_core::Origin {
                stream: twox_hash::XxHash3_128::oneshot(&key),
                base: c.start,
                starts: None,
                per_record: false,
            });
        }
        batch.events.reserve(block.frames.len());
        self.decode.decode(block, &mut batch);
        batch.input_bytes = block.frames.iter().map(|s| s.len as u64).sum();
        batch.charge = charge;
        batch.ack = Some(BatchAck::start(self.acks.clone(), seq));
        batch
    }

    /// Sends again the blocks whose delivery failed and whose backoff
    /// passed, under a new sequence number (the old one was answered).
    fn resend_due(&mut self) {
        let now = Instant::now();
        let due: Vec<u64> = self
            .acks
            .retained
            .lock()
            .iter()
            .filter(|(_, b)| b.retry_at.is_some_and(|t| t <= now))
            .map(|(s, _)| *s)
            .collect();
        for old in due {
            let Some(mut r) = self.acks.retained.lock().remove(&old) else {
                continue;
            };
            tracing::warn!(
                source_type = self.source_type,
                retry_in_ms = r.backoff.as_millis() as u64,
                "delivery of received data failed; sending it again"
            );
            r.retry_at = None;
            let seq = self.acks.next_seq.fetch_add(1, Ordering::SeqCst);
            let batch = self.batch(&r.block, MemoryCharge::none(), seq, r.chunk.as_deref());
            self.acks.retained.lock().insert(seq, r);
            self.emitter.emit(batch);
        }
    }

    fn pending(&self) -> usize {
        self.acks.retained.lock().len()
    }
}

// ---------------------------------------------------------------------------
// Memory buffer

struct MemoryDispatcher {
    rx: mpsc::Receiver<Submission>,
    /// Taken from the queue while coalescing, admitted next.
    pending: Option<Submission>,
    delivery: Delivery,
    budget: Arc<PipelineBudget>,
    when_full: WhenFull,
    flags: Arc<Flags>,
    counters: Counters,
}

impl MemoryDispatcher {
    fn run(&mut self) {
        *self.delivery.acks.owner.lock() = Some(std::thread::current());
        loop {
            if self.flags.stop.load(Ordering::SeqCst) {
                return;
            }
            self.delivery.resend_due();
            if let Some(sub) = self.pending.take() {
                self.admit(sub);
                continue;
            }
            match self.rx.try_recv() {
                Ok(sub) => {
                    let sub = self.coalesce(sub);
                    self.admit(sub)
                }
                Err(_) => {
                    if self.flags.stop_input.load(Ordering::SeqCst) {
                        self.rx.close();
                        while let Ok(sub) = self.rx.try_recv() {
                            self.admit(sub);
                        }
                        if self.delivery.pending() == 0 {
                            return;
                        }
                    }
                    std::thread::park_timeout(Duration::from_millis(20));
                }
            }
        }
    }

    /// Joins the blocks already queued behind `first` from the same
    /// stream into one (one copy), so that small socket reads at high
    /// rates travel as one batch: the cost per batch (queues, wake-ups,
    /// a write and an acknowledgement per sink) dominates otherwise.
    fn coalesce(&mut self, first: Submission) -> Submission {
        // A block answered or acknowledged on its own is never merged.
        if first.reply.is_some()
            || first.delivered.is_some()
            || first.block.buf.len() >= COALESCE_BYTES
        {
            return first;
        }
        let mut parts = vec![first.block];
        let mut total = parts[0].buf.len();
        let mut next = None;
        while total < COALESCE_BYTES {
            match self.rx.try_recv() {
                Ok(s)
                    if s.reply.is_none()
                        && s.delivered.is_none()
                        && s.block.peer == parts[0].peer
                        && s.block.json == parts[0].json =>
                {
                    total += s.block.buf.len();
                    parts.push(s.block);
                }
                Ok(s) => {
                    next = Some(s);
                    break;
                }
                Err(_) => break,
            }
        }
        if let Some(s) = next {
            // A different stream: admitted right after.
            self.pending = Some(s);
        }
        if parts.len() == 1 {
            return Submission {
                block: parts.remove(0),
                reply: None,
                delivered: None,
            };
        }
        let mut buf = bytes::BytesMut::with_capacity(total);
        let mut frames = Vec::new();
        for p in &parts {
            let base = buf.len();
            frames.extend(
                p.frames
                    .iter()
                    .map(|s| petrel_core::Span::new(base + s.start as usize, s.len as usize)),
            );
            buf.extend_from_slice(&p.buf);
        }
        let head = &parts[0];
        Submission {
            block: Block {
                buf: buf.freeze(),
                frames,
                peer: head.peer.clone(),
                received_ns: head.received_ns,
                json: head.json,
            },
            reply: None,
            delivered: None,
        }
    }

    fn admit(&mut self, sub: Submission) {
        let Submission {
            block,
            reply,
            delivered,
        } = sub;
        let len = block.buf.len();
        let want = self.budget.reservation(len);
        let charge = match self.when_full {
            WhenFull::DropNewest => self.budget.try_charge(want),
            WhenFull::Block => {
                // An HTTP client gets 503 after a second rather than a
                // connection held open; a stream waits as long as it takes
                // (the socket stops being read: TCP pushes back).
                let started = Instant::now();
                loop {
                    let c = self
                        .budget
                        .charge_blocking(want, Instant::now() + Duration::from_millis(100));
                    if c.is_some()
                        || (reply.is_some() && started.elapsed() >= Duration::from_secs(1))
                        || self.flags.stop.load(Ordering::SeqCst)
                    {
                        break c;
                    }
                    self.delivery.resend_due();
                }
            }
        };
        let Some(mut charge) = charge else {
            if reply.is_none() {
                self.counters.buffer_full.inc_by(block.frames.len() as u64);
            }
            if let Some(r) = reply {
                let _ = r.send(Admission::Full);
            }
            return;
        };
        let kept = charge.split(len);
        self.delivery.send_new(block, kept, charge, None, delivered);
        if let Some(r) = reply {
            let _ = r.send(Admission::Accepted);
        }
    }
}

// ---------------------------------------------------------------------------
// Disk buffer

/// HTTP requests waiting for their record to be durable, by ticket.
/// Who waits for a spool write to be durable: a request's answer, or a
/// stream's acknowledgement ([`Intake::submit_acked`]).
enum Waiter {
    Reply(oneshot::Sender<Admission>),
    Durable(OnDelivered),
}

type Waiters = Arc<Mutex<Vec<(u64, Waiter)>>>;

struct DiskDispatcher {
    rx: mpsc::Receiver<Submission>,
    writer: Arc<SharedWriter>,
    waiters: Waiters,
    /// For `/health`: a source whose spool refuses data is unhealthy.
    metrics: petrel_core::ComponentMetrics,
    /// Since when appends are refused (spool full or unwritable), and
    /// the last refusal: an episode ends when appends succeed again or
    /// nobody was refused for a while.
    refusing_since: Option<(Instant, Instant)>,
    reader_thread: Thread,
    when_full: WhenFull,
    flags: Arc<Flags>,
    counters: Counters,
}

impl DiskDispatcher {
    fn run(&mut self) {
        let mut wrote = false;
        loop {
            match self.rx.try_recv() {
                Ok(sub) => {
                    wrote |= self.admit(sub);
                    continue;
                }
                Err(_) => {
                    // A burst is spooled: make it visible to the reader.
                    if wrote {
                        wrote = false;
                        if let Err(e) = self.writer.flush() {
                            self.counters.spool_errors.inc();
                            tracing::error!(error = %e, "cannot write the spool; retrying");
                        }
                        self.reader_thread.unpark();
                    }
                    self.counters
                        .spool_bytes
                        .set(self.writer.with_writer(|w| w.usage()) as i64);
                    self.report_health();
                }
            }
            if self.flags.stop_input.load(Ordering::SeqCst)
                || self.flags.stop.load(Ordering::SeqCst)
            {
                self.rx.close();
                while let Ok(sub) = self.rx.try_recv() {
                    self.admit(sub);
                }
                if let Err(e) = self.writer.close() {
                    tracing::error!(error = %e, "cannot sync the spool at shutdown");
                }
                self.reader_thread.unpark();
                return;
            }
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }

    /// Raises or clears this source's problem in `/health`: writing the
    /// spool fails (unhealthy at once: no data can be accepted until an
    /// operator frees the disk), or the spool has been full for a while
    /// (failing: the sinks do not keep up or are down).
    fn report_health(&mut self) {
        let write_error = self
            .writer
            .with_writer(|w| w.write_error().map(str::to_string))
            .or_else(|| self.writer.last_error());
        if let Some(e) = write_error {
            self.metrics.metrics().health.fatal(
                self.metrics.health_key(),
                format!("cannot write the spool ({e}); received data is refused until the disk has room"),
            );
            return;
        }
        if self
            .refusing_since
            .is_some_and(|(_, last)| last.elapsed() >= Duration::from_secs(3))
        {
            self.refusing_since = None;
        }
        match self.refusing_since {
            Some((since, _)) if since.elapsed() >= Duration::from_millis(200) => self.metrics.failing(
                "the spool is full (buffer.max_size of undelivered data); received data is refused until the sinks catch up",
            ),
            Some(_) => {}
            None => self.metrics.recovered(),
        }
    }

    fn note_refusal(&mut self) {
        let now = Instant::now();
        let since = self.refusing_since.map_or(now, |(s, _)| s);
        self.refusing_since = Some((since, now));
    }

    /// Spools one block; true when something was written.
    fn admit(&mut self, sub: Submission) -> bool {
        // A request's `delivered` is dropped: its answer already means
        // durable. A stream's is called once the write is durable.
        let Submission {
            block,
            reply,
            delivered,
        } = sub;
        loop {
            match self.writer.append_with(|out| record::encode(&block, out)) {
                Ok(ticket) => {
                    self.refusing_since = None;
                    let waiter = match (reply, delivered) {
                        (Some(r), _) => Some(Waiter::Reply(r)),
                        (None, Some(f)) => Some(Waiter::Durable(f)),
                        (None, None) => None,
                    };
                    if let Some(w) = waiter {
                        self.waiters.lock().push((ticket, w));
                        self.writer.request_sync();
                    }
                    return true;
                }
                Err(AppendError::Full) => {
                    self.note_refusal();
                    let wait = self.when_full == WhenFull::Block
                        && reply.is_none()
                        && !self.flags.stop.load(Ordering::SeqCst);
                    if wait {
                        // The socket is not read meanwhile: the sender waits.
                        self.reader_thread.unpark();
                        self.report_health();
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    if let Some(r) = reply {
                        let _ = r.send(Admission::Full);
                    } else {
                        self.counters.buffer_full.inc_by(block.frames.len() as u64);
                    }
                    return false;
                }
                Err(AppendError::TooLarge) => {
                    self.counters.too_large.inc_by(block.frames.len() as u64);
                    if let Some(r) = reply {
                        let _ = r.send(Admission::Failed("request too large for the spool".into()));
                    }
                    return false;
                }
                Err(AppendError::Unwritable(why)) => {
                    self.note_refusal();
                    self.counters.spool_errors.inc();
                    self.report_health();
                    let wait = self.when_full == WhenFull::Block
                        && reply.is_none()
                        && !self.flags.stop.load(Ordering::SeqCst);
                    if wait {
                        // Streams wait for the disk like for a full spool.
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    if let Some(r) = reply {
                        let _ = r.send(Admission::Failed(format!("cannot write the spool: {why}")));
                    } else {
                        self.counters.buffer_full.inc_by(block.frames.len() as u64);
                    }
                    return false;
                }
            }
        }
    }
}

/// Emits what a spool holds, and commits what was delivered.
struct SpoolReader {
    reader: Reader,
    delivery: Delivery,
    budget: Arc<PipelineBudget>,
    flags: Arc<Flags>,
    counters: Counters,
    /// Logs, counts and reports damage the reader found.
    damage: petrel_core::DamageReporter,
}

impl SpoolReader {
    fn run(&mut self) {
        *self.delivery.acks.owner.lock() = Some(std::thread::current());
        let mut last_error: Option<Instant> = None;
        loop {
            self.delivery.resend_due();
            self.commit();
            if let Err(e) = self.reader.maintain(false) {
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::error!(spool = %self.reader.dir().display(), error = %e, "cannot update the spool's state");
                    last_error = Some(Instant::now());
                }
                self.counters.spool_errors.inc();
            }
            // The bytes up to the next valid record are skipped, the other
            // records kept, and a damaged segment is moved to the
            // quarantine directory once read.
            for d in self.reader.take_damage() {
                self.damage
                    .report(&d.path, d.offset, d.bytes, d.records, &d.what);
                self.counters.corrupt_bytes.inc_by(d.bytes);
                self.counters.damaged_records.inc_by(d.records);
            }
            self.damage.tick();
            if self.flags.stop.load(Ordering::SeqCst) {
                break;
            }
            if self.flags.stop_input.load(Ordering::SeqCst) {
                // The data is safe on disk: only wait for what is in flight.
                if self.delivery.pending() == 0 {
                    break;
                }
                std::thread::park_timeout(Duration::from_millis(10));
                continue;
            }
            let want = self.budget.reservation(CHUNK_BYTES);
            let Some(charge) = self
                .budget
                .charge_blocking(want, Instant::now() + Duration::from_millis(100))
            else {
                continue;
            };
            match self.reader.read(CHUNK_BYTES) {
                Ok(Some(chunk)) => self.emit(chunk, charge),
                Ok(None) => {
                    drop(charge);
                    std::thread::park_timeout(Duration::from_millis(20));
                }
                Err(e) => {
                    drop(charge);
                    self.counters.spool_errors.inc();
                    tracing::error!(spool = %self.reader.dir().display(), error = %e, "cannot read the spool; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        self.commit();
        if let Err(e) = self.reader.maintain(true) {
            tracing::error!(spool = %self.reader.dir().display(), error = %e, "cannot write the spool's state at shutdown; delivered data may be sent again");
        }
    }

    fn commit(&mut self) {
        let done = std::mem::take(&mut *self.delivery.acks.done.lock());
        for (seg, start, end) in done {
            self.reader.complete(seg, start, end);
        }
    }

    fn emit(&mut self, chunk: petrel_spool::Chunk, mut charge: MemoryCharge) {
        // Consecutive records from one peer become one batch.
        let mut blocks: Vec<Block> = Vec::new();
        let mut peers = None;
        for r in &chunk.records {
            match record::decode(&chunk.buf, r.clone(), &mut peers) {
                Ok(b) => match blocks.last_mut() {
                    Some(last) if last.peer == b.peer && last.json == b.json => {
                        last.frames.extend(b.frames)
                    }
                    _ => blocks.push(b),
                },
                Err(record::BadRecord) => {
                    self.counters.bad_records.inc();
                }
            }
        }
        charge.shrink_to(self.budget.reservation(chunk.buf.len()));
        let kept = charge.split(chunk.buf.len());
        let done = Arc::new(ChunkDone {
            segment: chunk.segment,
            start: chunk.start,
            end: chunk.end,
            remaining: AtomicUsize::new(blocks.len()),
            _charge: kept,
        });
        if blocks.is_empty() {
            self.reader.complete(chunk.segment, chunk.start, chunk.end);
            return;
        }
        let mut extra = Some(charge);
        for b in blocks {
            let e = extra.take().unwrap_or_default();
            self.delivery
                .send_new(b, MemoryCharge::none(), e, Some(done.clone()), None);
        }
    }
}
