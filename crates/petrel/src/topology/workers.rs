//! The shared processing pool: `--threads` workers that run every
//! pipeline's processor chain and sink encoders, whatever the number of
//! pipelines.
//!
//! A panic in a processor or an encoder must not stall a pipeline: each
//! batch runs under `catch_unwind`. A batch whose processing panicked is
//! not delivered (its acknowledgement fails, so the source reads it again)
//! and the pipeline switches to isolation for a while: batches are then
//! processed one event at a time, so the event that panics is dropped and
//! counted (`reason="panic"`) and the rest flows on.
//!
//! A processor that never returns (a loop on some input) cannot be caught
//! that way: each worker stamps when it took its batch, and
//! [`WorkerPool::busy_threads`] lets the agent report a worker busy with
//! one batch for too long as stuck (`/health/live`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use petrel_core::plugin::{Emitter, Encoded, Payload, PayloadSender, Processor, Sink};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, Event, EventBatch, Metrics, PipelineBudget};

use crate::config::SinkRoute;

/// How long a pipeline processes event by event after a panic, and how
/// long `/health` reports it.
const ISOLATION: Duration = Duration::from_secs(10);

/// A sink as seen by the processing pool.
pub struct SinkSlot {
    /// The plugin.
    pub sink: Arc<dyn Sink>,
    /// Its payload queue on the sink runtime.
    pub tx: PayloadSender,
    /// Its counters.
    pub metrics: ComponentMetrics,
    /// Payloads encoded out of order, waiting for their predecessors.
    pub reorder: Mutex<Reorder>,
    /// Which events it receives (`when:`).
    pub route: SinkRoute,
    /// Encoded bytes per 1024 input bytes of its last payload, plus one
    /// (0: none yet), to size the next payload's buffer (see `deliver`).
    pub out_per_in: AtomicU64,
}

impl SinkSlot {
    /// Capacity for the encoding of `view`: its input times what the last
    /// payload's encoding gave, with a margin. Parsed events grow 2–3×
    /// into ndjson; a buffer sized for the input was reallocated twice per
    /// batch, each time copying everything written so far.
    fn out_capacity(&self, view: &EventBatch) -> usize {
        let input = view.buf.len();
        match self.out_per_in.load(Ordering::Relaxed) {
            // Room for the data plus framing; the Vec grows if needed.
            0 => input + view.events.len() * 2 + 64,
            // The last payload was the batch's buffer itself (shared).
            1 => 0,
            r => {
                let want = (input as u64).saturating_mul(r - 1) / 1024;
                // A sixteenth more, and room for sonic-rs's escaper, which
                // asks for six times a value's length before writing it.
                let want = want + want / 16 + 8192;
                usize::try_from(want).unwrap_or(usize::MAX)
            }
        }
    }

    /// Learns the output-to-input ratio of a payload just encoded.
    fn learn(&self, view: &EventBatch, out: &Encoded) {
        let input = view.buf.len().max(1) as u64;
        let r = (out.bytes.len() as u64).saturating_mul(1024) / input;
        self.out_per_in.store(r + 1, Ordering::Relaxed);
    }
}

/// Puts payloads back in read order: workers finish batches in any order,
/// but a sink must see a file's lines in the order they were written.
/// `None` marks a batch that will never come (its processing panicked), so
/// that its successors are not held back forever.
#[derive(Default)]
pub struct Reorder {
    next: u64,
    pending: BTreeMap<u64, Option<Payload>>,
}

impl Reorder {
    /// Queues `item` as batch `seq` and sends every batch that is now in
    /// order.
    fn push(&mut self, seq: u64, item: Option<Payload>, tx: &PayloadSender) {
        self.pending.insert(seq, item);
        while let Some(item) = self.pending.remove(&self.next) {
            self.next += 1;
            if let Some(p) = item {
                // Fails only when the sink has stopped; the payload's ack
                // part is dropped then, which reports a failed delivery.
                let _ = tx.send(p);
            }
        }
    }
}

/// A processor and its counters.
pub struct ProcessorSlot {
    /// The plugin.
    pub processor: Box<dyn Processor>,
    /// Its counters.
    pub metrics: ComponentMetrics,
}

/// Everything the workers need to run one pipeline.
pub struct PipelineRuntime {
    /// Pipeline name (file stem).
    pub name: String,
    /// Processor chain, in order.
    pub processors: Vec<ProcessorSlot>,
    /// Sinks; each gets every batch.
    pub sinks: Vec<SinkSlot>,
    /// Memory budget of this pipeline.
    pub budget: Arc<PipelineBudget>,
    /// Sequence number of the next batch emitted into this pipeline.
    pub next_seq: AtomicU64,
    /// Process event by event until then (after a panic).
    isolate_until: Mutex<Option<Instant>>,
    metrics: Arc<Metrics>,
    /// Events no sink's `when:` took (`reason="unrouted"`); `None` when
    /// every sink takes every event.
    unrouted: Option<LazyCounter>,
}

impl PipelineRuntime {
    /// A pipeline with its components.
    pub fn new(
        name: String,
        processors: Vec<ProcessorSlot>,
        sinks: Vec<SinkSlot>,
        budget: Arc<PipelineBudget>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let unrouted = sinks
            .iter()
            .any(|s| !matches!(s.route, SinkRoute::All))
            .then(|| {
                metrics
                    .component(&name, "router", "when", "when")
                    .discarded_counter("unrouted")
            });
        Self {
            name,
            processors,
            sinks,
            budget,
            next_seq: AtomicU64::new(0),
            isolate_until: Mutex::new(None),
            metrics,
            unrouted,
        }
    }

    fn isolating(&self) -> bool {
        let mut g = self.isolate_until.lock();
        match *g {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *g = None;
                false
            }
            None => false,
        }
    }
}

type Work = (Arc<PipelineRuntime>, u64, EventBatch);

/// The pool's input queue and threads.
pub struct WorkerPool {
    tx: Option<Sender<Work>>,
    threads: Vec<JoinHandle<()>>,
    /// Per worker: milliseconds after `epoch`, plus one, at which it took
    /// the batch it is processing; 0 while it waits for work. Two relaxed
    /// stores per batch: cheap enough to keep on always.
    busy_since: Vec<Arc<AtomicU64>>,
    epoch: Instant,
}

impl WorkerPool {
    /// Starts `n` workers.
    pub fn start(n: usize) -> std::io::Result<Self> {
        // Unbounded on purpose: sources charge memory before reading, so the
        // queue's size is bounded by the memory limit, and a source is never
        // blocked while holding its thread.
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        let epoch = Instant::now();
        let mut threads = Vec::with_capacity(n);
        let mut busy_since = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let rx: Receiver<Work> = rx.clone();
            let busy = Arc::new(AtomicU64::new(0));
            busy_since.push(busy.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("petrel-worker-{i}"))
                    .spawn(move || {
                        while let Ok((p, seq, batch)) = rx.recv() {
                            let now =
                                u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
                            busy.store(now.saturating_add(1), Ordering::Relaxed);
                            run_pipeline(&p, seq, batch);
                            busy.store(0, Ordering::Relaxed);
                        }
                    })?,
            );
        }
        Ok(Self {
            tx: Some(tx),
            threads,
            busy_since,
            epoch,
        })
    }

    /// Each worker's name and how long it has been busy with its current
    /// batch (zero while it waits for work). Processing a batch takes
    /// milliseconds and never waits on a sink (their queues are
    /// unbounded, paid by the memory budget before reading), so a long
    /// time means a processor that does not return.
    pub fn busy_threads(&self) -> Vec<(String, Duration)> {
        let now = self.epoch.elapsed();
        self.threads
            .iter()
            .zip(&self.busy_since)
            .map(|(t, busy)| {
                let name = t.thread().name().unwrap_or("petrel-worker").to_string();
                let since = match busy.load(Ordering::Relaxed) {
                    0 => now,
                    ms => Duration::from_millis(ms - 1),
                };
                (name, now.saturating_sub(since))
            })
            .collect()
    }

    /// An emitter feeding `pipeline`.
    pub fn emitter(&self, pipeline: Arc<PipelineRuntime>) -> Arc<dyn Emitter> {
        Arc::new(PipelineEmitter {
            tx: self.tx.clone(),
            pipeline,
        })
    }

    /// Names of worker threads that ended while the pool runs.
    pub fn dead_threads(&self) -> Vec<String> {
        self.threads
            .iter()
            .filter(|t| t.is_finished())
            .map(|t| t.thread().name().unwrap_or("petrel-worker").to_string())
            .collect()
    }

    /// Closes the queue and waits for the workers to finish what is queued.
    pub fn join(mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct PipelineEmitter {
    tx: Option<Sender<Work>>,
    pipeline: Arc<PipelineRuntime>,
}

impl Emitter for PipelineEmitter {
    fn emit(&self, batch: EventBatch) {
        if let Some(tx) = &self.tx {
            // Sources emit from one thread, so this numbering is read order.
            let seq = self.pipeline.next_seq.fetch_add(1, Ordering::Relaxed);
            // A send fails only after shutdown; the batch's ack part is then
            // dropped unanswered, so its offsets are not committed.
            let _ = tx.send((self.pipeline.clone(), seq, batch));
        }
    }
}

/// Text of a panic payload, for the log.
fn panic_text(e: &(dyn std::any::Any + Send)) -> &str {
    e.downcast_ref::<&str>()
        .copied()
        .or_else(|| e.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs the processor chain on `batch`; on a panic returns the index of
/// the processor that panicked and its message.
fn run_chain(p: &PipelineRuntime, batch: &mut EventBatch) -> Result<(), (usize, String)> {
    let at = Cell::new(0usize);
    catch_unwind(AssertUnwindSafe(|| {
        for (i, slot) in p.processors.iter().enumerate() {
            at.set(i);
            let before = batch.events.len() as u64;
            slot.metrics.received_events.inc_by(before);
            slot.processor.process(batch);
            slot.metrics.sent_events.inc_by(batch.events.len() as u64);
            p.metrics
                .taps
                .offer(|| slot.metrics.health_key().to_string(), batch);
        }
    }))
    .map_err(|e| (at.get(), panic_text(&*e).to_string()))
}

fn report_panic(p: &PipelineRuntime, slot: &ComponentMetrics, what: &str, msg: &str) {
    tracing::error!(pipeline = %p.name, component = %slot.health_key(), panic = %msg,
        "{what} panicked; processing this pipeline event by event for {}s to isolate the event",
        ISOLATION.as_secs());
    p.metrics.health.unhealthy_for(
        slot.health_key(),
        format!("{what} panicked: {msg}"),
        ISOLATION,
    );
}

fn run_pipeline(p: &PipelineRuntime, seq: u64, mut batch: EventBatch) {
    p.metrics
        .taps
        .offer(|| format!("{}/source", p.name), &batch);
    if !p.processors.is_empty() {
        batch.verbatim_lines = false;
        if p.isolating() {
            run_isolated(p, &mut batch);
        } else if let Err((i, msg)) = run_chain(p, &mut batch) {
            let slot = &p.processors[i].metrics;
            slot.error("panic", 1);
            report_panic(p, slot, "processor", &msg);
            *p.isolate_until.lock() = Instant::now().checked_add(ISOLATION);
            // The batch is not delivered: its ack part fails when dropped
            // below, so the source reads the data again (now isolated).
            for s in &p.sinks {
                s.reorder.lock().push(seq, None, &s.tx);
            }
            return;
        }
    }
    deliver(p, seq, batch);
}

/// Processes each event alone so that one that panics can be dropped
/// (counted) without losing the others.
fn run_isolated(p: &PipelineRuntime, batch: &mut EventBatch) {
    let events = std::mem::take(&mut batch.events);
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let mut one = EventBatch::new(batch.buf.clone(), batch.source.clone());
        one.events.push(ev);
        match run_chain(p, &mut one) {
            // Processors add values beside the buffer, never replace it, so
            // the events' spans stay valid in the original batch.
            Ok(()) => {
                out.append(&mut one.events);
                batch.rerouted.append(&mut one.rerouted);
            }
            Err((i, msg)) => {
                let slot = &p.processors[i].metrics;
                slot.error("panic", 1);
                slot.discarded("panic", 1);
                report_panic(p, slot, "processor", &msg);
                *p.isolate_until.lock() = Instant::now().checked_add(ISOLATION);
            }
        }
    }
    batch.events = out;
}

/// For each sink, the indices of the events its `when:` takes, or `None`
/// when it takes them all; `None` overall when no sink has a `when:`.
/// Events taken by no sink are counted as unrouted.
fn route(p: &PipelineRuntime, batch: &EventBatch) -> Option<Vec<Option<Vec<u32>>>> {
    let unrouted = p.unrouted.as_ref()?;
    let mut picks: Vec<Option<Vec<u32>>> = p
        .sinks
        .iter()
        .map(|s| match s.route {
            SinkRoute::All => None,
            // Takes only the events set aside for it (see `deliver`).
            _ => Some(Vec::new()),
        })
        .collect();
    let has_all = picks.iter().any(Option::is_none);
    let mut lost = 0u64;
    for (i, ev) in batch.events.iter().enumerate() {
        let mut taken = false;
        for (slot, pick) in p.sinks.iter().zip(picks.iter_mut()) {
            if let (SinkRoute::When(c), Some(pick)) = (&slot.route, pick) {
                if c.matches(batch, ev) {
                    pick.push(i as u32);
                    taken = true;
                }
            }
        }
        if !taken {
            let mut unmatched = false;
            for (slot, pick) in p.sinks.iter().zip(picks.iter_mut()) {
                if let (SinkRoute::Unmatched, Some(pick)) = (&slot.route, pick) {
                    pick.push(i as u32);
                    unmatched = true;
                }
            }
            if !unmatched && !has_all {
                lost += 1;
            }
        }
    }
    if lost > 0 {
        unrouted.inc_by(lost);
    }
    Some(picks)
}

/// The events of `batch` at `picks`, sharing its buffer, for a sink that
/// takes only some of them.
fn sub_batch(batch: &EventBatch, picks: &[u32]) -> EventBatch {
    let mut sub = EventBatch::new(batch.buf.clone(), batch.source.clone());
    sub.events = picks
        .iter()
        .filter_map(|&i| batch.events.get(i as usize).cloned())
        .collect();
    sub.origin = batch.origin.clone();
    let total = batch.events.len().max(1) as u64;
    sub.input_bytes = batch.input_bytes * picks.len() as u64 / total;
    sub
}

/// The events set aside for the sink routed by `route`, when it is a
/// `reroute_dropped` sink.
fn set_aside_for<'a>(
    route: &'a SinkRoute,
    rerouted: &'a [petrel_core::Rerouted],
) -> Option<impl Iterator<Item = &'a petrel_core::Rerouted>> {
    match route {
        SinkRoute::Rerouted(id) => Some(rerouted.iter().filter(move |r| r.sink == *id)),
        _ => None,
    }
}

/// The events a processor set aside for one sink (`reroute_dropped`), as
/// a batch sharing `batch`'s buffer. Their input bytes are not counted
/// again: the flow's sinks account for the batch's input.
fn set_aside_batch(batch: &EventBatch, events: Vec<Event>) -> EventBatch {
    let mut sub = EventBatch::new(batch.buf.clone(), batch.source.clone());
    sub.events = events;
    sub.origin = batch.origin.clone();
    sub
}

fn deliver(p: &PipelineRuntime, seq: u64, mut batch: EventBatch) {
    p.metrics.taps.offer(|| format!("{}/sink", p.name), &batch);
    let picks = route(p, &batch);
    // A sink that takes no event of this batch gets no payload, and its
    // acknowledgement is not waited for.
    let rerouted = std::mem::take(&mut batch.rerouted);
    let takes = |i: usize| match set_aside_for(&p.sinks[i].route, &rerouted) {
        Some(mut set_aside) => set_aside.next().is_some(),
        None => match picks.as_ref().and_then(|v| v[i].as_ref()) {
            Some(v) => !v.is_empty(),
            None => true,
        },
    };
    let receivers = (0..p.sinks.len()).filter(|&i| takes(i)).count();
    let mut parts = match batch.ack.take() {
        Some(ack) => ack.split(receivers),
        None => (0..receivers)
            .map(|_| petrel_core::AckPart::detached())
            .collect(),
    }
    .into_iter();
    // Everything this batch needs at its peak, to size the reservations
    // of the next reads.
    let mut needed = batch.buf.len() + batch.events.capacity() * std::mem::size_of::<Event>();
    // Taken out so that sinks can borrow the batch; released at the end,
    // when the batch itself goes.
    let mut reserved = std::mem::take(&mut batch.charge);
    for (i, slot) in p.sinks.iter().enumerate() {
        let pick = picks.as_ref().and_then(|v| v[i].as_deref());
        let sub;
        let view = if let Some(set_aside) = set_aside_for(&slot.route, &rerouted) {
            sub = set_aside_batch(&batch, set_aside.map(|r| r.event.clone()).collect());
            if sub.events.is_empty() {
                slot.reorder.lock().push(seq, None, &slot.tx);
                continue;
            }
            &sub
        } else {
            match pick {
                Some([]) => {
                    slot.reorder.lock().push(seq, None, &slot.tx);
                    continue;
                }
                Some(pick) if pick.len() < batch.events.len() => {
                    sub = sub_batch(&batch, pick);
                    &sub
                }
                _ => &batch,
            }
        };
        let Some(ack) = parts.next() else {
            break;
        };
        let events = view.events.len() as u64;
        slot.metrics.received_events.inc_by(events);
        let mut out = Encoded {
            bytes: Vec::with_capacity(slot.out_capacity(view)),
            ..Encoded::default()
        };
        let encoded = catch_unwind(AssertUnwindSafe(|| slot.sink.encode(view, &mut out)));
        if let Err(e) = encoded {
            slot.metrics.error("panic", 1);
            report_panic(p, &slot.metrics, "sink encoder", panic_text(&*e));
            // `ack` is dropped unanswered: the source reads the batch again.
            drop(ack);
            slot.reorder.lock().push(seq, None, &slot.tx);
            continue;
        }
        if out.invalid_utf8 > 0 {
            slot.metrics.error("invalid_utf8", out.invalid_utf8);
        }
        slot.learn(view, &out);
        slot.metrics.received_bytes.inc_by(out.data().len() as u64);
        // The encoded copy is paid from the batch's reservation; a shortfall
        // is charged (bounded by this batch) and learned. A shared buffer
        // costs what a copy would: the payload keeps it alive past the
        // batch, whose own charge ends below.
        let shared = out.shared.as_ref().map_or(0, |b| b.len());
        let need = out.bytes.capacity() + out.record_ends.capacity() * 4 + shared;
        needed += need;
        let mut charge = reserved.split(need);
        if charge.bytes() < need {
            charge.merge(p.budget.charge_held(need - charge.bytes()));
        }
        let payload = Payload {
            data: out,
            events,
            input_bytes: view.input_bytes,
            source: batch.source.clone(),
            ack,
            charge,
        };
        slot.reorder.lock().push(seq, Some(payload), &slot.tx);
    }
    p.budget.learn(batch.buf.len(), needed);
    drop(reserved);
    if batch.verbatim_lines {
        // Raw lines, untouched (no processor ran): each event is a span
        // with no fields and owns nothing, so forgetting them is a
        // complete drop, and reading 72 bytes per line again only to find
        // that out was 3 % of the single128 → text pipeline's CPU.
        debug_assert!(batch
            .events
            .iter()
            .all(|e| e.fields.capacity() == 0 && matches!(e.message, petrel_core::Value::Span(_))));
        // SAFETY: shrinking the length is sound; see above for why nothing
        // is left undropped.
        unsafe { batch.events.set_len(0) };
    } else {
        petrel_core::event::drop_events(&mut batch.events);
    }
}
