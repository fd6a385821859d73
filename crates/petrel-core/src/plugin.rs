//! The contracts between the engine and its plugins.
//!
//! Each plugin kind registers once as a [`Plugin`] (type name, keys,
//! parser); its parsed config ([`SourceConfig`], [`ProcessorConfig`],
//! [`SinkConfig`]) knows how to start or build it. Sources get a
//! [`SourceContext`] with everything they need: the emitter into their
//! pipeline, its memory budget, metrics, metadata and shared services.
//!
//! Processors transform batches on the shared processing pool. Sinks are
//! split in two: [`Sink::encode`] does the CPU work (serialisation) on the
//! processing pool so it scales with `--threads`, and [`Sink::run`] is an
//! asynchronous task on the shared sink runtime that performs I/O and
//! acknowledges each [`Payload`] once its data is delivered.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ack::AckPart;
use crate::config::Map;
use crate::event::{EventBatch, Key, SourceInfo};
use crate::memory::{MemoryCharge, PipelineBudget};
use crate::metrics::ComponentMetrics;

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
    /// The data when it is a batch's read buffer as it is (raw lines in
    /// the text encoding, see [`EventBatch::verbatim_lines`]): shared with
    /// the batch instead of copied into `bytes`, which stays empty. Only
    /// encoders of sinks that read the data through [`Encoded::data`] set
    /// it.
    pub shared: Option<bytes::Bytes>,
}

impl Encoded {
    /// The encoded data: the shared buffer, or else `bytes`.
    #[inline]
    pub fn data(&self) -> &[u8] {
        match &self.shared {
            Some(b) => b,
            None => &self.bytes,
        }
    }
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("bytes", &self.data().len())
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

/// Creates a sink's payload queue (unbounded: what it holds is bounded by
/// the memory budget each payload is charged to).
pub fn payload_channel() -> (PayloadSender, PayloadReceiver) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (PayloadSender(tx), PayloadReceiver(rx))
}

/// The sending end of a sink's payload queue.
///
/// Payloads travel boxed: tokio's channel allocates its first block of 32
/// slots when it is created, and with the payload itself in each slot that
/// was 4.4 KB per sink, most of an idle pipeline's memory after its
/// metrics (BENCHMARKS.md, "Where per-pipeline memory goes"); boxed it is
/// 256 bytes, for one allocation per payload (a batch, not an event).
#[derive(Clone)]
pub struct PayloadSender(tokio::sync::mpsc::UnboundedSender<Box<Payload>>);

impl PayloadSender {
    /// Queues `payload`; gives it back (still boxed, as it travelled)
    /// when the sink has stopped.
    pub fn send(&self, payload: Payload) -> Result<(), Box<Payload>> {
        self.0.send(Box::new(payload)).map_err(|e| e.0)
    }
}

/// The receiving end of a sink's payload queue.
pub struct PayloadReceiver(tokio::sync::mpsc::UnboundedReceiver<Box<Payload>>);

impl PayloadReceiver {
    /// The next payload; `None` once the queue is closed and empty.
    /// Cancel-safe, like tokio's `recv`.
    pub async fn recv(&mut self) -> Option<Payload> {
        self.0.recv().await.map(|p| *p)
    }

    /// The next payload, waiting on the calling thread (which must not be
    /// a runtime's); `None` once the queue is closed and empty.
    pub fn blocking_recv(&mut self) -> Option<Payload> {
        self.0.blocking_recv().map(|p| *p)
    }

    /// The next payload if one is queued now.
    pub fn try_recv(&mut self) -> Result<Payload, tokio::sync::mpsc::error::TryRecvError> {
        self.0.try_recv().map(|p| *p)
    }

    /// Waits for at least one payload, then appends up to `limit` of those
    /// queued to `buf`; returns how many, 0 only once the queue is closed
    /// and empty (or `limit` is 0).
    pub async fn recv_many(&mut self, buf: &mut Vec<Payload>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        let Some(first) = self.0.recv().await else {
            return 0;
        };
        buf.push(*first);
        let mut n = 1;
        while n < limit {
            match self.0.try_recv() {
                Ok(p) => buf.push(*p),
                Err(_) => break,
            }
            n += 1;
        }
        n
    }
}

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

    /// Bytes of encoded output this sink may write per byte read, in
    /// thousandths, for short lines: the first estimate of a pipeline's
    /// memory per byte read, before any batch was measured. Too low, and
    /// the first read of a verbose encoding (an action line and field
    /// names per event) alone holds several times the memory limit.
    fn expansion_hint(&self) -> usize {
        2000
    }

    /// Writes the [`Encoded::attachment`] this sink's `encode` made, so a
    /// disk buffer can keep the payload whole; false when the sink makes
    /// none (the default) or cannot write it.
    fn write_attachment(&self, _attachment: &(dyn Any + Send + Sync), _out: &mut Vec<u8>) -> bool {
        false
    }

    /// Reads back what [`Sink::write_attachment`] wrote; `None` when
    /// `bytes` is not such a record.
    fn read_attachment(&self, _bytes: &[u8]) -> Option<Box<dyn Any + Send + Sync>> {
        None
    }
}

/// Where a source hands its batches: the entry of a pipeline's processor
/// chain on the shared processing pool. Never blocks; memory is bounded by
/// the source's budget, taken before reading.
pub trait Emitter: Send + Sync {
    /// Queues `batch` for processing.
    fn emit(&self, batch: EventBatch);
}

/// A parsed `sources:` entry: knows its type and how to start.
pub trait SourceConfig: std::fmt::Debug + Send + Sync {
    /// The `type:` name.
    fn type_name(&self) -> &'static str;

    /// Starts the source. It reads on its own thread (or on a service it
    /// shares with sources of its kind, found in `ctx.shared`) and emits
    /// into `ctx.emitter` until stopped.
    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>>;

    /// Include and exclude globs of files this source reads, for the
    /// feedback-loop check against the agent's own output files.
    fn read_globs(&self) -> Option<(&[String], &[String])> {
        None
    }

    /// Where (line, column) the configuration asks to read again from a
    /// fixed position on every start, whatever was committed (a forced
    /// replay): a sink that promises no duplicates across restarts
    /// (`exactly_once`) cannot keep that promise, and `validate` warns.
    fn replays_on_start(&self) -> Option<(usize, usize)> {
        None
    }

    /// Local files, directories or devices this source reads besides
    /// [`SourceConfig::read_globs`] (a journal directory, `/dev/kmsg`),
    /// checked against the paths a remotely managed pipeline may read.
    fn local_paths(&self) -> Vec<String> {
        Vec::new()
    }

    /// The program this source runs when the configuration names one
    /// (an exec-like feature, refused in remotely managed pipelines unless
    /// the agent allows it).
    fn runs_program(&self) -> Option<String> {
        None
    }
}

/// A running source.
pub trait Source: Send {
    /// Stops reading. In-flight data is still acknowledged until
    /// [`Source::wait_stopped`] returns or `deadline` passes.
    fn begin_stop(&mut self, deadline: Instant);

    /// Waits until everything the source emitted was answered (or
    /// `deadline` passed) and its state is persisted. Returns an error
    /// when the final state could not be written (the process then exits
    /// non-zero).
    fn wait_stopped(self: Box<Self>, deadline: Instant) -> anyhow::Result<()>;

    /// False when the source's thread ended without being stopped.
    fn is_alive(&self) -> bool {
        true
    }

    /// True once the source has ended by itself and everything it emitted
    /// was delivered (standard input reached its end). When every source
    /// of the agent is finished, the agent stops.
    fn is_finished(&self) -> bool {
        false
    }
}

/// Settings of the whole agent that sources may need.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Checkpoints and other state.
    pub data_dir: PathBuf,
    /// How long state of sources (or files) that are gone is kept.
    pub checkpoint_ttl: Duration,
    /// Upper bound on waiting for in-flight data at shutdown.
    pub shutdown_timeout: Duration,
    /// The agent's `--memory-limit` in bytes, for plugins whose client
    /// libraries buffer outside the memory budget (librdkafka) and size
    /// those buffers from it.
    pub memory_limit: usize,
}

/// Everything a source gets when it starts, and nothing specific to one
/// kind of source.
pub struct SourceContext {
    /// Pipeline name.
    pub pipeline: String,
    /// Source id within the pipeline.
    pub id: String,
    /// `pipeline/id`: the key of this source's persisted state.
    pub key: String,
    /// Where batches go (the pipeline's processor chain).
    pub emitter: Arc<dyn Emitter>,
    /// The pipeline's memory budget: charge before reading.
    pub budget: Arc<PipelineBudget>,
    /// This source's counters (and, through them, the agent's).
    pub metrics: ComponentMetrics,
    /// Metadata fields every batch of this source carries (`host`).
    pub meta: Arc<[(Key, Arc<str>)]>,
    /// Files written by this agent's sinks that this source must not
    /// read: its own pipeline's outputs, and other pipelines' unless they
    /// allow reading back.
    pub own_outputs: Arc<Vec<PathBuf>>,
    /// Services shared by sources of one kind (one input thread for all
    /// file sources, say), created by the first source that needs one.
    pub shared: Arc<SharedServices>,
    /// Agent-wide settings.
    pub engine: EngineOptions,
    /// Where this source keeps what it needs to resume after a restart
    /// (keyed by `key`, written atomically).
    pub state: crate::state::StateStore,
}

/// Services that sources of one kind share, by type. The topology owns
/// it; dropping it stops whatever is left.
#[derive(Default)]
pub struct SharedServices {
    services: parking_lot::Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl SharedServices {
    /// The service of type `T`, created with `make` if there is none yet.
    pub fn get_or_try_init<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<Arc<T>> {
        let mut m = self.services.lock();
        if let Some(s) = m.get(&TypeId::of::<T>()) {
            if let Ok(t) = s.clone().downcast::<T>() {
                return Ok(t);
            }
        }
        let t = Arc::new(make()?);
        m.insert(TypeId::of::<T>(), t.clone());
        Ok(t)
    }

    /// Every service, for health checks and shutdown.
    pub fn all(&self) -> Vec<Arc<dyn Any + Send + Sync>> {
        self.services.lock().values().cloned().collect()
    }
}

/// A parsed `processors:` entry.
pub trait ProcessorConfig: std::fmt::Debug + Send + Sync {
    /// The `type:` name.
    fn type_name(&self) -> &'static str;
    /// Creates the running processor; `metrics` are its counters.
    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Box<dyn Processor>>;
    /// What this processor read from a file other than the pipeline file
    /// (a program kept in a file of its own), as the file's name and text:
    /// a reload rebuilds the pipeline when only that file changed.
    fn file_input(&self) -> Option<(&str, &str)> {
        None
    }
    /// True when this processor reads the agent's environment (VRL with
    /// `allow_env`): refused in remotely managed pipelines unless the
    /// agent allows it.
    fn uses_env(&self) -> bool {
        false
    }
}

/// A parsed `sinks:` entry.
pub trait SinkConfig: std::fmt::Debug + Send + Sync {
    /// The `type:` name.
    fn type_name(&self) -> &'static str;
    /// Creates the running sink; `metrics` are its counters.
    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>>;
    /// Creates the running sink with the agent's settings, for a sink that
    /// keeps state of its own in the data dir (the s3 sink's record of the
    /// objects it wrote). By default [`SinkConfig::build`].
    fn build_with(
        &self,
        metrics: ComponentMetrics,
        engine: &EngineOptions,
    ) -> anyhow::Result<Arc<dyn Sink>> {
        let _ = engine;
        self.build(metrics)
    }
    /// The local file this sink writes, when it writes one: sources must
    /// not read it back unless it says so.
    fn output_file(&self) -> Option<OutputFile<'_>> {
        None
    }
    /// The config key by which this sink commits its source's positions
    /// itself (a transactional sink): it must then be the pipeline's only
    /// sink, or the others could be skipped by a commit they did not
    /// confirm.
    fn commits_source_positions(&self) -> Option<&'static str> {
        None
    }
    /// The hosts this sink sends to (`Some(vec![])` for a sink that sends
    /// nowhere but a local file or stdout), checked against the
    /// destinations a remotely managed pipeline may send to. `None`, the
    /// default, means unknown: such a sink is refused in a remote pipeline
    /// whenever the destinations are limited.
    fn destinations(&self) -> Option<Vec<String>> {
        None
    }
    /// Local files this sink writes (its output, a dead letter file),
    /// checked against the paths a remotely managed pipeline may write.
    fn local_writes(&self) -> Vec<PathBuf> {
        self.output_file()
            .map(|f| vec![f.path.to_path_buf()])
            .unwrap_or_default()
    }
}

/// A local file written by a sink.
#[derive(Debug, Clone, Copy)]
pub struct OutputFile<'a> {
    /// The path as configured (absolute).
    pub path: &'a Path,
    /// The config key that names it, for error messages.
    pub key: &'static str,
    /// Other pipelines may read it (chaining pipelines through a file);
    /// the same pipeline never may.
    pub read_back: bool,
}

/// How a plugin kind is registered: its type name, the keys it accepts
/// (for `validate` and suggestions) and its parser. The config loader and
/// the topology only ever iterate these.
pub struct Plugin<C: ?Sized> {
    /// The `type:` name.
    pub type_name: &'static str,
    /// What the plugin does, one paragraph of Markdown, for the generated
    /// component reference.
    pub doc: &'static str,
    /// Keys accepted in its config entry (`type` and `id` included). The
    /// config loader checks entries against these names (unknown keys and
    /// suggestions), so they stay a plain list.
    pub keys: &'static [&'static str],
    /// The documentation of each of `keys`, in the order the reference
    /// lists them: every name of `keys` exactly once, and no other.
    pub key_docs: &'static [KeyDoc],
    /// Reads an entry; problems go to the map's error list.
    pub parse: fn(Map<'_>) -> Option<Arc<C>>,
}

/// The documentation of one key of a plugin's config entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    /// The key.
    pub name: &'static str,
    /// What the value must be.
    pub kind: KeyKind,
    /// The value used when the key is absent, as it would be written in
    /// YAML; `None` when the key is required or absence means "off".
    pub default: Option<&'static str>,
    /// What the key does, Markdown, one paragraph.
    pub doc: &'static str,
}

impl KeyDoc {
    /// The common `type` key: the plugin's type name.
    pub const TYPE: KeyDoc = KeyDoc {
        name: "type",
        kind: KeyKind::String,
        default: None,
        doc: "The plugin kind: this entry's type name. Required.",
    };
    /// The common `id` key: the component's name.
    pub const ID: KeyDoc = KeyDoc {
        name: "id",
        kind: KeyKind::String,
        default: Some("<type>_<index>"),
        doc: "Names the component in metrics, checkpoints, `petrel tap` and `petrel test`; unique within its section of the pipeline.",
    };
}

/// The type of a key's value, as the reference names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Any string.
    String,
    /// A whole number.
    Int,
    /// `true` or `false`.
    Bool,
    /// A list (of strings unless the doc says otherwise).
    List,
    /// A mapping of its own keys, which the doc names.
    Map,
    /// A number of the unit the key's name gives (`_ms`, `_secs`).
    Duration,
    /// A byte count: a number or a size such as `64KiB`, `1MiB`, `10MB`.
    Bytes,
    /// A string in which `{field}` is replaced by the event's field.
    Template,
    /// A condition on fields (`field`, `equals`, `matches`, ...).
    Condition,
    /// One of a fixed set of words.
    OneOf(&'static [&'static str]),
}

impl KeyKind {
    /// The name the reference prints: `string`, `int`, ..., or the
    /// allowed words joined by `|`.
    pub fn name(&self) -> String {
        match self {
            KeyKind::String => "string".into(),
            KeyKind::Int => "int".into(),
            KeyKind::Bool => "bool".into(),
            KeyKind::List => "list".into(),
            KeyKind::Map => "map".into(),
            KeyKind::Duration => "duration".into(),
            KeyKind::Bytes => "bytes".into(),
            KeyKind::Template => "template".into(),
            KeyKind::Condition => "condition".into(),
            KeyKind::OneOf(words) => words.join("|"),
        }
    }
}

/// A source kind.
pub type SourcePlugin = Plugin<dyn SourceConfig>;
/// A processor kind.
pub type ProcessorPlugin = Plugin<dyn ProcessorConfig>;
/// A sink kind.
pub type SinkPlugin = Plugin<dyn SinkConfig>;

#[cfg(test)]
mod payload_queue_tests {
    use super::*;
    use crate::{AckPart, MemoryCharge, SourceInfo};

    fn payload(events: u64) -> Payload {
        Payload {
            data: Encoded::default(),
            events,
            input_bytes: 0,
            source: Arc::new(SourceInfo::file("/x", Arc::from(Vec::new()))),
            ack: AckPart::detached(),
            charge: MemoryCharge::none(),
        }
    }

    #[test]
    fn recv_many_takes_what_is_queued_up_to_the_limit_and_0_once_closed() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (tx, mut rx) = payload_channel();
            for i in 1..=5 {
                assert!(tx.send(payload(i)).is_ok());
            }
            let mut buf = Vec::new();
            assert_eq!(rx.recv_many(&mut buf, 3).await, 3);
            assert_eq!(rx.recv_many(&mut buf, 0).await, 0);
            assert_eq!(rx.recv_many(&mut buf, 10).await, 2);
            let order: Vec<u64> = buf.iter().map(|p| p.events).collect();
            assert_eq!(order, [1, 2, 3, 4, 5]);
            assert!(rx.try_recv().is_err());
            assert!(tx.send(payload(6)).is_ok());
            assert_eq!(rx.recv().await.map(|p| p.events), Some(6));
            drop(tx);
            assert_eq!(rx.recv_many(&mut buf, 10).await, 0, "closed and empty");
            assert!(rx.recv().await.is_none());
        });
    }

    #[test]
    fn a_payload_comes_back_when_the_sink_has_stopped() {
        let (tx, rx) = payload_channel();
        drop(rx);
        assert_eq!(tx.send(payload(7)).err().map(|p| p.events), Some(7));
    }
}
