//! The shared processing pool: `--threads` workers that run every
//! pipeline's processor chain and sink encoders, whatever the number of
//! pipelines.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use petrel_core::plugin::{Emitter, Encoded, Payload, Processor, Sink};
use petrel_core::{ComponentMetrics, EventBatch, PipelineBudget};
use tokio::sync::mpsc::UnboundedSender;

/// A sink as seen by the processing pool.
pub struct SinkSlot {
    /// The plugin.
    pub sink: Arc<dyn Sink>,
    /// Its payload queue on the sink runtime.
    pub tx: UnboundedSender<Payload>,
    /// Its counters.
    pub metrics: ComponentMetrics,
    /// Payloads encoded out of order, waiting for their predecessors.
    pub reorder: Mutex<Reorder>,
}

/// Puts payloads back in read order: workers finish batches in any order,
/// but a sink must see a file's lines in the order they were written.
#[derive(Default)]
pub struct Reorder {
    next: u64,
    pending: BTreeMap<u64, Payload>,
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
}

type Work = (Arc<PipelineRuntime>, u64, EventBatch);

/// The pool's input queue and threads.
pub struct WorkerPool {
    tx: Option<Sender<Work>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `n` workers.
    pub fn start(n: usize) -> std::io::Result<Self> {
        // Unbounded on purpose: sources charge memory before reading, so the
        // queue's size is bounded by the memory limit, and a source is never
        // blocked while holding its thread.
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let rx: Receiver<Work> = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("petrel-worker-{i}"))
                    .spawn(move || {
                        while let Ok((p, seq, batch)) = rx.recv() {
                            run_pipeline(&p, seq, batch);
                        }
                    })?,
            );
        }
        Ok(Self {
            tx: Some(tx),
            threads,
        })
    }

    /// An emitter feeding `pipeline`.
    pub fn emitter(&self, pipeline: Arc<PipelineRuntime>) -> Arc<dyn Emitter> {
        Arc::new(PipelineEmitter {
            tx: self.tx.clone(),
            pipeline,
        })
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

fn run_pipeline(p: &PipelineRuntime, seq: u64, mut batch: EventBatch) {
    for slot in &p.processors {
        let before = batch.events.len() as u64;
        slot.metrics.received_events.inc_by(before);
        slot.processor.process(&mut batch);
        slot.metrics.sent_events.inc_by(batch.events.len() as u64);
    }
    let parts = match batch.ack.take() {
        Some(ack) => ack.split(p.sinks.len()),
        None => p
            .sinks
            .iter()
            .map(|_| petrel_core::AckPart::detached())
            .collect(),
    };
    for (slot, ack) in p.sinks.iter().zip(parts) {
        let events = batch.events.len() as u64;
        slot.metrics.received_events.inc_by(events);
        // Room for the data plus framing; the Vec grows if needed.
        let mut out = Encoded {
            bytes: Vec::with_capacity(batch.buf.len() + batch.events.len() * 2 + 64),
            ..Encoded::default()
        };
        slot.sink.encode(&batch, &mut out);
        if out.invalid_utf8 > 0 {
            slot.metrics.error("invalid_utf8", out.invalid_utf8);
        }
        slot.metrics.received_bytes.inc_by(out.bytes.len() as u64);
        let charge = p
            .budget
            .force_charge(out.bytes.capacity() + out.record_ends.capacity() * 4);
        let payload = Payload {
            data: out,
            events,
            input_bytes: batch.input_bytes,
            source: batch.source.clone(),
            ack,
            charge,
        };
        let mut r = slot.reorder.lock();
        r.pending.insert(seq, payload);
        loop {
            let next = r.next;
            let Some(p) = r.pending.remove(&next) else {
                break;
            };
            r.next += 1;
            // Fails only when the sink has stopped; the payload's ack part
            // is dropped then, which reports a failed delivery.
            let _ = slot.tx.send(p);
        }
    }
}
