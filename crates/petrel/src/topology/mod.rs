//! Wiring pipelines onto the shared threads: one input thread for all file
//! sources, `--threads` processing workers, and one sink runtime whose
//! tasks deliver and acknowledge.

pub mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::{MemoryBudget, Metrics, PipelineBudget};

use crate::config::PipelineConfig;
use crate::sinks::SinkConfig;
use crate::sources::file::reader::ReadContext;
use crate::sources::file::service::{FileService, ServiceOptions, SourceSpec};
use crate::sources::SourceConfig;
use workers::{PipelineRuntime, ProcessorSlot, SinkSlot, WorkerPool};

/// Settings of `petrel run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Checkpoints and other state.
    pub data_dir: PathBuf,
    /// Processing workers.
    pub threads: usize,
    /// Bytes of in-flight data for the whole process.
    pub memory_limit: usize,
    /// Upper bound on draining at shutdown.
    pub shutdown_timeout: Duration,
}

/// The smallest share of the memory limit a pipeline gets, so that with
/// many pipelines each can still keep a couple of read blocks in flight.
const MIN_PIPELINE_BUDGET: usize = 512 << 10;

/// How long the file input, once caught up, lets new writes accumulate
/// after inotify woke it. Every read costs a hand-off through each stage
/// (processing pool, sink, acknowledgement, checkpoint); loggers that write
/// every few milliseconds or every line made that the dominant cost at low
/// rates. Data arriving while the input is still catching up is read at
/// once.
const IDLE_READ_DELAY: Duration = Duration::from_millis(50);

/// Globs matching the files this agent writes itself. A file source whose
/// include pattern also matches a file sink's output would read its own
/// output forever, growing it without end; such files are always excluded.
fn own_output_globs(pipelines: &[PipelineConfig]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pipelines {
        for (_, s) in &p.sinks {
            if let SinkConfig::File(f) = s {
                let path = std::path::absolute(&f.path).unwrap_or_else(|_| f.path.clone());
                out.push(globset::escape(&path.to_string_lossy()));
            }
        }
    }
    out
}

/// Environment variable naming a text: events containing it make the
/// pipeline panic. A test hook for panic isolation; never set in production.
pub const PANIC_ON_ENV: &str = "PETREL_TEST_PANIC_ON";

struct PanicOn(Vec<u8>);

impl petrel_core::plugin::Processor for PanicOn {
    fn process(&self, batch: &mut petrel_core::EventBatch) {
        for ev in &batch.events {
            if let Some(b) = batch.bytes_of(&ev.message) {
                if memchr::memmem::find(b, &self.0).is_some() {
                    panic!("{PANIC_ON_ENV}: event contains the injected text");
                }
            }
        }
    }
}

fn fault_injection(metrics: &Arc<Metrics>, pipeline: &str) -> Option<ProcessorSlot> {
    let text = std::env::var(PANIC_ON_ENV).ok().filter(|t| !t.is_empty())?;
    tracing::warn!("{PANIC_ON_ENV} is set: events containing `{text}` will panic (test hook)");
    Some(ProcessorSlot {
        processor: Box::new(PanicOn(text.into_bytes())),
        metrics: metrics.component(pipeline, "processor", "panic_on", "test_panic_on"),
    })
}

/// A running set of pipelines.
pub struct Topology {
    files: Option<FileService>,
    pool: Option<WorkerPool>,
    runtime: Option<tokio::runtime::Runtime>,
    sink_tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The process-wide memory budget.
    pub budget: Arc<MemoryBudget>,
}

impl Topology {
    /// Builds and starts every pipeline. `runtime` runs the sinks (and may
    /// run other tasks, such as the API server).
    pub fn start(
        pipelines: &[PipelineConfig],
        opts: &RunOptions,
        metrics: Arc<Metrics>,
        budget: Arc<MemoryBudget>,
        runtime: tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        metrics.memory_limit.set(opts.memory_limit as i64);
        let per_pipeline = (opts.memory_limit / pipelines.len().max(1))
            .max(MIN_PIPELINE_BUDGET)
            .min(opts.memory_limit);
        let own_outputs = own_output_globs(pipelines);
        let pool = WorkerPool::start(opts.threads)?;
        let mut sink_tasks = Vec::new();
        let mut specs = Vec::new();
        for p in pipelines {
            let pbudget = PipelineBudget::new(budget.clone(), per_pipeline);
            let mut processors = Vec::new();
            for (id, c) in &p.processors {
                let m = metrics.component(&p.name, "processor", id, c.type_name());
                processors.push(ProcessorSlot {
                    processor: c.build(m.clone())?,
                    metrics: m,
                });
            }
            let mut sinks = Vec::new();
            for (id, c) in &p.sinks {
                let m = metrics.component(&p.name, "sink", id, c.type_name());
                let sink = c
                    .build(m.clone())
                    .map_err(|e| anyhow::anyhow!("pipeline {} sink {id}: {e}", p.name))?;
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                sink_tasks.push(runtime.spawn(sink.clone().run(rx)));
                sinks.push(SinkSlot {
                    sink,
                    tx,
                    metrics: m,
                    reorder: Default::default(),
                });
            }
            if let Some(slot) = fault_injection(&metrics, &p.name) {
                processors.insert(0, slot);
            }
            let rt = Arc::new(PipelineRuntime::new(
                p.name.clone(),
                processors,
                sinks,
                pbudget.clone(),
                metrics.clone(),
            ));
            for (id, c) in &p.sources {
                let m = metrics.component(&p.name, "source", id, c.type_name());
                match c {
                    SourceConfig::File(fc) => specs.push(SourceSpec {
                        key: format!("{}/{id}", p.name),
                        pipeline: p.name.clone(),
                        config: {
                            let mut fc = fc.clone();
                            fc.exclude.extend(own_outputs.iter().cloned());
                            fc
                        },
                        ctx: ReadContext {
                            block_bytes: fc.read_block_bytes,
                            max_line_bytes: fc.max_line_bytes,
                            partial_line_timeout: fc.partial_line_timeout,
                            emitter: pool.emitter(rt.clone()),
                            budget: pbudget.clone(),
                            sent_events: m.sent_events.clone(),
                            sent_bytes: m.sent_bytes.clone(),
                            split_lines: m.error_counter("line_too_long"),
                            pauses: metrics
                                .backpressure_pauses
                                .get_or_create(&vec![("pipeline".to_string(), p.name.clone())])
                                .clone(),
                            read_errors: m.error_counter("read_failed"),
                            truncations: m.error_counter("file_truncated"),
                            multiline: fc.multiline.clone().map(Arc::new),
                            multiline_cut: m.error_counter("multiline_cut"),
                        },
                    }),
                }
            }
        }
        let files = FileService::start(
            specs,
            ServiceOptions {
                data_dir: opts.data_dir.clone(),
                rescan_interval: Duration::from_secs(10),
                poll_interval: Duration::from_secs(1),
                checkpoint_interval: Duration::from_secs(1),
                deleted_file_timeout: Duration::from_secs(60),
                rotated_file_idle: Duration::from_secs(5),
                shutdown_timeout: opts.shutdown_timeout,
                idle_read_delay: IDLE_READ_DELAY,
            },
            metrics.clone(),
        )?;
        Ok(Self {
            files: Some(files),
            pool: Some(pool),
            runtime: Some(runtime),
            sink_tasks,
            budget,
        })
    }

    /// Names of the agent's threads that died (they never should: a
    /// panic is caught per batch). The process exits non-zero then.
    pub fn dead_threads(&self) -> Vec<String> {
        let mut dead = Vec::new();
        if self.files.as_ref().is_some_and(|f| !f.is_alive()) {
            dead.push("petrel-input".to_string());
        }
        if let Some(p) = &self.pool {
            dead.extend(p.dead_threads());
        }
        dead
    }

    /// Stops reading, drains in-flight data to the sinks, writes the final
    /// checkpoint, and stops every thread, all by `deadline`: one bound for
    /// the whole shutdown, however many sinks are stuck.
    pub fn shutdown(mut self, deadline: Instant) {
        if let Some(f) = self.files.take() {
            f.shutdown();
        }
        // Dropping the pool's queue and the pipelines' sink senders lets
        // each sink finish what it holds and return.
        if let Some(p) = self.pool.take() {
            p.join();
        }
        if let Some(rt) = self.runtime.take() {
            let tasks = std::mem::take(&mut self.sink_tasks);
            let left = deadline.saturating_duration_since(Instant::now());
            rt.block_on(async {
                let all = async {
                    for t in tasks {
                        let _ = t.await;
                    }
                };
                if tokio::time::timeout(left, all).await.is_err() {
                    tracing::warn!("shutdown timeout reached with sinks still delivering; their data was not acknowledged and will be read again at the next start");
                }
            });
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}
