//! The contracts between the engine and its plugins.
//!
//! Processors transform batches on the shared processing pool. Sinks are
//! split in two: [`Sink::encode`] does the CPU work (serialisation) on the
//! processing pool so it scales with `--threads`, and [`Sink::run`] is an
//! asynchronous task on the shared sink runtime that performs I/O and
//! acknowledges each [`Payload`] once its data is delivered.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::ack::AckPart;
use crate::event::{EventBatch, SourceInfo};
use crate::memory::MemoryCharge;

/// A step of a pipeline's processor chain.
pub trait Processor: Send + Sync {
    /// Transforms the batch in place (add, change or drop events).
    fn process(&self, batch: &mut EventBatch);
}

/// What a sink's encoder produces for one batch.
#[derive(Default)]
pub struct Encoded {
    /// The encoded records, back to back.
    pub bytes: Vec<u8>,
    /// End offset of each record in `bytes`, for sinks that send events as
    /// separate messages.
    pub record_ends: Vec<u32>,
    /// Sink-specific data computed on the processing pool (for example
    /// per-record routing), read back by the same sink's delivery task.
    pub attachment: Option<Box<dyn Any + Send + Sync>>,
    /// Values that were not valid UTF-8 and were written with U+FFFD.
    pub invalid_utf8: u64,
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("bytes", &self.bytes.len())
            .field("records", &self.record_ends.len())
            .finish()
    }
}

/// Encoded data of one batch for one sink.
#[derive(Debug)]
pub struct Payload {
    /// The encoded data.
    pub data: Encoded,
    /// Number of events encoded.
    pub events: u64,
    /// Input bytes (lines with newlines) the events came from.
    pub input_bytes: u64,
    /// Where the batch came from.
    pub source: Arc<SourceInfo>,
    /// Answer after delivery; dropping it reports a failure.
    pub ack: AckPart,
    /// Memory held by the encoded data.
    pub charge: MemoryCharge,
}

/// The receiving end of a sink's payload queue.
pub type PayloadReceiver = tokio::sync::mpsc::UnboundedReceiver<Payload>;

/// A future run on the sink runtime.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A destination for events.
pub trait Sink: Send + Sync + 'static {
    /// Encodes `batch` into `out`. Runs on the processing pool, so the CPU
    /// work of serialisation scales with `--threads`.
    fn encode(&self, batch: &EventBatch, out: &mut Encoded);

    /// Delivers payloads until the queue closes, acknowledging each after
    /// delivery. Returning ends the sink.
    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture;
}

/// Where a source hands its batches: the entry of a pipeline's processor
/// chain on the shared processing pool. Never blocks; memory is bounded by
/// the source's budget, taken before reading.
pub trait Emitter: Send + Sync {
    /// Queues `batch` for processing.
    fn emit(&self, batch: EventBatch);
}
