//! Wiring pipelines onto the shared threads: `--threads` processing
//! workers, one sink runtime whose tasks deliver and acknowledge, and the
//! sources, each started through its plugin with a [`SourceContext`].
//!
//! Pipelines are independent units: [`Topology::apply`] replaces the set
//! of running pipelines with a new configuration, leaving the pipelines
//! whose file did not change untouched, draining the changed and removed
//! ones (their sources stop, everything in flight is acknowledged, offsets
//! are checkpointed) and starting the new ones.

pub mod buffer;
pub mod workers;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::plugin::{EngineOptions, OutputFile, SharedServices, Source, SourceContext};
use petrel_core::{Key, MemoryBudget, Metrics, PipelineBudget};

use crate::config::PipelineConfig;
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
    /// Upper bound on draining at shutdown (and per reload).
    pub shutdown_timeout: Duration,
    /// How long offsets of files (and state of sources) not seen are kept.
    pub checkpoint_ttl: Duration,
}

/// The smallest share of the memory limit a pipeline gets, so that with
/// many pipelines each can still keep a couple of read blocks in flight.
const MIN_PIPELINE_BUDGET: usize = 512 << 10;

/// Environment variable naming a text: events containing it make the
/// pipeline panic. A test hook for panic isolation; never set in production.
pub const PANIC_ON_ENV: &str = "PETREL_TEST_PANIC_ON";

/// Environment variable naming a text: the worker processing an event
/// containing it never returns. A test hook for the stuck-worker check of
/// `/health/live`; never set in production.
pub const HANG_ON_ENV: &str = "PETREL_TEST_HANG_ON";

/// Environment variable naming a text: an event containing it makes the
/// whole process abort (SIGABRT), as a crash would. A test hook for the
/// crash-loop guard of remotely managed pipelines; never set in
/// production.
pub const ABORT_ON_ENV: &str = "PETREL_TEST_ABORT_ON";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Panic,
    Hang,
    Abort,
}

struct PanicOn {
    text: Vec<u8>,
    fault: Fault,
}

impl petrel_core::plugin::Processor for PanicOn {
    fn process(&self, batch: &mut petrel_core::EventBatch) {
        for ev in &batch.events {
            if let Some(b) = batch.bytes_of(&ev.message) {
                if memchr::memmem::find(b, &self.text).is_some() {
                    if self.fault == Fault::Abort {
                        eprintln!("{ABORT_ON_ENV}: event contains the injected text: aborting");
                        std::process::abort();
                    }
                    if self.fault == Fault::Hang {
                        loop {
                            std::thread::park();
                        }
                    }
                    panic!("{PANIC_ON_ENV}: event contains the injected text");
                }
            }
        }
    }
}

fn fault_injection(metrics: &Arc<Metrics>, pipeline: &str) -> Option<ProcessorSlot> {
    let var = |name| std::env::var(name).ok().filter(|t: &String| !t.is_empty());
    let (name, text, fault) = match (var(PANIC_ON_ENV), var(HANG_ON_ENV), var(ABORT_ON_ENV)) {
        (Some(t), _, _) => (PANIC_ON_ENV, t, Fault::Panic),
        (None, Some(t), _) => (HANG_ON_ENV, t, Fault::Hang),
        (None, None, Some(t)) => (ABORT_ON_ENV, t, Fault::Abort),
        (None, None, None) => return None,
    };
    let what = match fault {
        Fault::Panic => "panic",
        Fault::Hang => "hang",
        Fault::Abort => "abort the process",
    };
    tracing::warn!("{name} is set: events containing `{text}` will {what} (test hook)");
    Some(ProcessorSlot {
        processor: Box::new(PanicOn {
            text: text.into_bytes(),
            fault,
        }),
        metrics: metrics.component(pipeline, "processor", "panic_on", "test_panic_on"),
    })
}

use crate::host::hostname;

/// Every file the sinks of `all` write, with the name of its pipeline.
fn output_files(all: &[PipelineConfig]) -> Vec<(&str, OutputFile<'_>)> {
    all.iter()
        .flat_map(|p| {
            p.sinks
                .iter()
                .filter_map(|(_, s)| s.output_file())
                .map(|f| (p.name.as_str(), f))
        })
        .collect()
}

/// Files written by sinks that `pipeline`'s sources must not read: its
/// own sinks' outputs always, other pipelines' unless they allow reading
/// back (chaining pipelines through a file, said explicitly).
/// Only files its sources' globs could match are listed, so that adding
/// an unrelated sink elsewhere does not count as a change of `pipeline`.
/// `files` are every sink output of the configuration with its
/// pipeline's name (see [`output_files`]).
fn own_outputs(files: &[(&str, OutputFile<'_>)], pipeline: &PipelineConfig) -> Vec<PathBuf> {
    // Nothing to guard against: no glob is compiled (a regex per glob,
    // freed at once, but raising the heap's high-water mark with a
    // thousand pipelines; issue 33).
    if !files
        .iter()
        .any(|(name, f)| *name == pipeline.name || !f.read_back)
    {
        return Vec::new();
    }
    let readers: Vec<crate::paths::ReadMatcher> = pipeline
        .sources
        .iter()
        .filter_map(|(_, s)| s.read_globs())
        .map(|(inc, exc)| crate::paths::ReadMatcher::new(inc, exc))
        .collect();
    let mut out = Vec::new();
    for (name, f) in files {
        if (*name == pipeline.name || !f.read_back) && readers.iter().any(|r| r.reads(f.path)) {
            out.push(f.path.to_path_buf());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Builds `p`'s processor chain through its plugins, each with its own
/// counters in `metrics`. `petrel test` runs the same chain in-process.
pub fn build_processors(
    p: &PipelineConfig,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Vec<ProcessorSlot>> {
    let mut processors = Vec::new();
    for (id, c) in &p.processors {
        let m = metrics.component(&p.name, "processor", id, c.type_name());
        let processor = c
            .build(m.clone())
            .map_err(|e| anyhow::anyhow!("pipeline {} processor {id}: {e}", p.name))?;
        processors.push(ProcessorSlot {
            processor,
            metrics: m,
        });
    }
    Ok(processors)
}

/// Aborts the sink tasks of a pipeline that failed to start and waits
/// until they are gone, so that what they hold (a disk buffer's reader
/// lock) is free for whatever starts next.
fn abort_and_wait(rt: &tokio::runtime::Runtime, tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in &tasks {
        t.abort();
    }
    rt.block_on(async {
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    });
}

/// A pipeline's components, built but not started: building can fail
/// (a bad broker list, an unwritable path), starting cannot leave a
/// half-replaced configuration behind.
struct Built {
    config: PipelineConfig,
    processors: Vec<ProcessorSlot>,
    sinks: Vec<BuiltSink>,
    own_outputs: Arc<Vec<PathBuf>>,
}

/// A sink built from its entry, with what the engine adds around it.
struct BuiltSink {
    id: String,
    type_name: &'static str,
    sink: Arc<dyn petrel_core::plugin::Sink>,
    metrics: petrel_core::ComponentMetrics,
    route: crate::config::SinkRoute,
    buffer: crate::config::SinkBuffer,
}

/// A running pipeline.
struct RunningPipeline {
    config: PipelineConfig,
    own_outputs: Arc<Vec<PathBuf>>,
    sources: Vec<Box<dyn Source>>,
    sink_tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What [`Topology::apply`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Pipelines started.
    pub added: Vec<String>,
    /// Pipelines drained and rebuilt.
    pub changed: Vec<String>,
    /// Pipelines drained and removed.
    pub removed: Vec<String>,
    /// Pipelines left running untouched.
    pub unchanged: usize,
    /// Pipelines whose new configuration could not be built or started,
    /// with why: each keeps running with its old configuration (an added
    /// one is not started).
    pub failed: Vec<(String, String)>,
}

/// A running set of pipelines.
pub struct Topology {
    pool: Option<WorkerPool>,
    runtime: Option<tokio::runtime::Runtime>,
    shared: Arc<SharedServices>,
    pipelines: BTreeMap<String, RunningPipeline>,
    metrics: Arc<Metrics>,
    opts: RunOptions,
    meta: Arc<[(Key, Arc<str>)]>,
    /// The process-wide memory budget.
    pub budget: Arc<MemoryBudget>,
}

impl Topology {
    /// The agent's metrics registry (for components outside a pipeline,
    /// such as the OpAMP client's TLS expiry gauge).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Builds and starts every pipeline. `runtime` runs the sinks (and may
    /// run other tasks, such as the API server).
    pub fn start(
        pipelines: Vec<PipelineConfig>,
        opts: &RunOptions,
        metrics: Arc<Metrics>,
        budget: Arc<MemoryBudget>,
        runtime: tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        metrics.memory_limit.set(opts.memory_limit as i64);
        let pool = WorkerPool::start(opts.threads)?;
        let mut t = Self {
            pool: Some(pool),
            runtime: Some(runtime),
            shared: Arc::new(SharedServices::default()),
            pipelines: BTreeMap::new(),
            metrics,
            opts: opts.clone(),
            meta: vec![(Key::Borrowed("host"), hostname())].into(),
            budget,
        };
        let applied = t.apply(pipelines)?;
        // At start a pipeline that cannot be built is an error of the
        // whole start, as an invalid configuration is.
        if let Some((name, why)) = applied.failed.into_iter().next() {
            anyhow::bail!("pipeline {name}: {why}");
        }
        Ok(t)
    }

    /// Makes `pipelines` the running set, one pipeline at a time: each
    /// changed or added pipeline is built before its old version is
    /// stopped, and a pipeline whose new configuration cannot be built or
    /// started keeps running with its old one (an added one is not
    /// started). Such a failure is in [`Applied::failed`], in the log, in
    /// `/health` (`<pipeline>/reload`, degraded until a reload of that
    /// pipeline succeeds) and in `petrel_reload_failures_total`; it never
    /// stops another pipeline. The error is for what stopping left
    /// undone.
    pub fn apply(&mut self, pipelines: Vec<PipelineConfig>) -> anyhow::Result<Applied> {
        let mut applied = Applied::default();
        let mut build = Vec::new();
        let files = output_files(&pipelines);
        let outputs: Vec<Vec<PathBuf>> = pipelines.iter().map(|p| own_outputs(&files, p)).collect();
        drop(files);
        applied.removed = self
            .pipelines
            .keys()
            .filter(|n| !pipelines.iter().any(|p| &p.name == *n))
            .cloned()
            .collect();
        let count = pipelines.len();
        // Moved into what is built, not cloned: with a thousand pipelines
        // a second copy of every configuration raised the heap's
        // high-water mark, which the allocator keeps (issue 33).
        for (p, outputs) in pipelines.into_iter().zip(outputs) {
            match self.pipelines.get(&p.name) {
                Some(r) if r.config.text == p.text && *r.own_outputs == outputs => {
                    applied.unchanged += 1;
                    // Running as configured: an earlier failure is over.
                    self.metrics.health.recovered(&format!("{}/reload", p.name));
                }
                Some(_) => build.push((p, outputs, true)),
                None => build.push((p, outputs, false)),
            }
        }
        let mut built = Vec::new();
        for (p, outputs, changed) in build {
            let name = p.name.clone();
            match self.build(p, outputs) {
                Ok(b) => built.push((b, changed)),
                Err(e) => self.reload_failed(&mut applied, &name, changed, &e),
            }
        }
        let mut stop_error = None;
        for name in &applied.removed {
            if let Some(p) = self.pipelines.remove(name) {
                if let Err(e) = self.stop_pipeline(p) {
                    tracing::error!(pipeline = %name, error = %e, "pipeline did not stop cleanly");
                    stop_error = Some(e);
                }
            }
            self.metrics.health.forget_prefix(&format!("{name}/"));
        }
        // Each pipeline gets an equal share of the limit; pipelines that
        // keep running keep theirs.
        let per_pipeline = (self.opts.memory_limit / count.max(1))
            .max(MIN_PIPELINE_BUDGET)
            .min(self.opts.memory_limit);
        for (b, changed) in built {
            let name = b.config.name.clone();
            // The old version is drained first: the new one reads its
            // sources' offsets and opens its disk buffers after it.
            let old = self.pipelines.remove(&name).map(|old| {
                let config = old.config.clone();
                let outputs = old.own_outputs.clone();
                if let Err(e) = self.stop_pipeline(old) {
                    tracing::error!(pipeline = %name, error = %e, "pipeline did not stop cleanly");
                    stop_error = Some(e);
                }
                (config, outputs)
            });
            match self.launch(b, per_pipeline) {
                Ok(running) => {
                    self.metrics.health.forget_prefix(&format!("{name}/"));
                    self.pipelines.insert(name.clone(), running);
                    if changed {
                        applied.changed.push(name);
                    } else {
                        applied.added.push(name);
                    }
                }
                Err(e) => {
                    self.reload_failed(&mut applied, &name, changed, &e);
                    if let Some((config, outputs)) = old {
                        self.restore(config, &outputs, per_pipeline);
                    }
                }
            }
        }
        match stop_error {
            Some(e) => Err(e),
            None => Ok(applied),
        }
    }

    /// Books a pipeline whose new configuration failed: logged, counted,
    /// in `/health`.
    fn reload_failed(&self, applied: &mut Applied, name: &str, changed: bool, e: &anyhow::Error) {
        let why = format!("{e:#}");
        if changed {
            tracing::error!(pipeline = %name, error = %why, "the changed pipeline cannot be started; it keeps running with its previous configuration");
        } else {
            tracing::error!(pipeline = %name, error = %why, "the new pipeline cannot be started");
        }
        self.metrics
            .named_counters(
                "reload_failures",
                "Pipelines whose changed configuration was refused by a reload (the pipeline keeps its previous configuration)",
            )
            .get_or_create(&vec![("pipeline".to_string(), name.to_string())])
            .inc();
        self.metrics.health.degraded(
            &format!("{name}/reload"),
            format!(
                "the last reload could not apply this pipeline's configuration ({}): {why}",
                if changed {
                    "it runs with its previous one"
                } else {
                    "it is not started"
                }
            ),
        );
        applied.failed.push((name.to_string(), why));
    }

    /// Starts a pipeline's previous configuration again after its new one
    /// failed to start.
    fn restore(&mut self, config: PipelineConfig, outputs: &[PathBuf], per_pipeline: usize) {
        let name = config.name.clone();
        let started = self
            .build(config, outputs.to_vec())
            .and_then(|b| self.launch(b, per_pipeline));
        match started {
            Ok(running) => {
                tracing::info!(pipeline = %name, "pipeline restarted with its previous configuration");
                self.pipelines.insert(name, running);
            }
            Err(e) => {
                tracing::error!(pipeline = %name, error = %format!("{e:#}"), "the previous configuration cannot be started again either: the pipeline is stopped");
                self.metrics.health.fatal(
                    &format!("{name}/reload"),
                    format!(
                        "stopped: neither its new nor its previous configuration starts: {e:#}"
                    ),
                );
            }
        }
    }

    fn build(&self, p: PipelineConfig, outputs: Vec<PathBuf>) -> anyhow::Result<Built> {
        let mut processors = build_processors(&p, &self.metrics)?;
        if let Some(slot) = fault_injection(&self.metrics, &p.name) {
            processors.insert(0, slot);
        }
        let mut sinks = Vec::new();
        for (i, (id, c)) in p.sinks.iter().enumerate() {
            let m = self.metrics.component(&p.name, "sink", id, c.type_name());
            let engine = EngineOptions {
                data_dir: self.opts.data_dir.clone(),
                checkpoint_ttl: self.opts.checkpoint_ttl,
                shutdown_timeout: self.opts.shutdown_timeout,
                memory_limit: self.opts.memory_limit,
            };
            let sink = c
                .build_with(m.clone(), &engine)
                .map_err(|e| anyhow::anyhow!("pipeline {} sink {id}: {e}", p.name))?;
            if let Some(crate::config::SinkBuffer::Disk { .. }) = p.sink_buffers.get(i) {
                let dir = buffer::buffer_dir(&self.opts.data_dir, &p.name, id);
                buffer::precheck(&dir, c.type_name())
                    .map_err(|e| anyhow::anyhow!("pipeline {} sink {id}: {e}", p.name))?;
            }
            sinks.push(BuiltSink {
                id: id.clone(),
                type_name: c.type_name(),
                sink,
                metrics: m,
                route: p.sink_routes.get(i).cloned().unwrap_or_default(),
                buffer: p.sink_buffers.get(i).cloned().unwrap_or_default(),
            });
        }
        Ok(Built {
            config: p,
            processors,
            sinks,
            own_outputs: Arc::new(outputs),
        })
    }

    fn launch(&mut self, b: Built, per_pipeline: usize) -> anyhow::Result<RunningPipeline> {
        let (Some(pool), Some(rt)) = (&self.pool, &self.runtime) else {
            anyhow::bail!("the agent is shutting down");
        };
        let p = b.config;
        let budget = PipelineBudget::new(self.budget.clone(), per_pipeline);
        budget.expect_sinks(b.sinks.iter().map(|s| s.sink.expansion_hint()));
        // Sized exactly: an empty `Vec` grows to four slots at its first
        // push, and a `SinkSlot` is a few hundred bytes (issue 33: 0.7 KB
        // per one-sink pipeline).
        let mut sinks = Vec::with_capacity(b.sinks.len());
        let mut sink_tasks = Vec::with_capacity(b.sinks.len());
        for s in b.sinks {
            let (tx, rx) = petrel_core::plugin::payload_channel();
            sink_tasks.push(rt.spawn(s.sink.clone().run(rx)));
            let tx = match s.buffer {
                crate::config::SinkBuffer::Memory => tx,
                crate::config::SinkBuffer::Disk {
                    max_size,
                    when_full,
                } => {
                    let dir = buffer::buffer_dir(&self.opts.data_dir, &p.name, &s.id);
                    let settings = buffer::Settings {
                        sink_type: s.type_name,
                        max_size,
                        when_full,
                    };
                    match buffer::start(
                        &dir,
                        settings,
                        s.sink.clone(),
                        tx,
                        s.metrics.clone(),
                        rt.handle(),
                    ) {
                        Ok(d) => {
                            sink_tasks.push(d.reader);
                            d.tx
                        }
                        Err(e) => {
                            abort_and_wait(rt, sink_tasks);
                            anyhow::bail!("pipeline {} sink {}: {e}", p.name, s.id);
                        }
                    }
                }
            };
            sinks.push(SinkSlot {
                sink: s.sink,
                tx,
                metrics: s.metrics,
                reorder: Default::default(),
                route: s.route,
                out_per_in: Default::default(),
            });
        }
        let runtime = Arc::new(PipelineRuntime::new(
            p.name.clone(),
            b.processors,
            sinks,
            budget.clone(),
            self.metrics.clone(),
        ));
        let emitter = pool.emitter(runtime);
        let mut sources = Vec::with_capacity(p.sources.len());
        for (id, c) in &p.sources {
            let ctx = SourceContext {
                pipeline: p.name.clone(),
                id: id.clone(),
                key: format!("{}/{id}", p.name),
                emitter: emitter.clone(),
                budget: budget.clone(),
                metrics: self.metrics.component(&p.name, "source", id, c.type_name()),
                meta: self.meta.clone(),
                own_outputs: b.own_outputs.clone(),
                shared: self.shared.clone(),
                state: petrel_core::state::StateStore::new(
                    &self.opts.data_dir,
                    &format!("{}/{id}", p.name),
                ),
                engine: EngineOptions {
                    data_dir: self.opts.data_dir.clone(),
                    checkpoint_ttl: self.opts.checkpoint_ttl,
                    shutdown_timeout: self.opts.shutdown_timeout,
                    memory_limit: self.opts.memory_limit,
                },
            };
            match c.start(ctx) {
                Ok(s) => sources.push(s),
                Err(e) => {
                    // Stop what this pipeline started, then report.
                    let deadline = Instant::now() + self.opts.shutdown_timeout;
                    for mut s in sources {
                        s.begin_stop(deadline);
                        let _ = s.wait_stopped(deadline);
                    }
                    // The buffers' tasks must be gone (their spool locks
                    // with them) before the previous version can start.
                    drop(emitter);
                    abort_and_wait(rt, sink_tasks);
                    anyhow::bail!("pipeline {} source {id}: {e}", p.name);
                }
            }
        }
        tracing::info!(pipeline = %p.name, sources = sources.len(), sinks = sink_tasks.len(), "pipeline started");
        Ok(RunningPipeline {
            config: p,
            own_outputs: b.own_outputs,
            sources,
            sink_tasks,
        })
    }

    /// Stops `p`'s sources (they answer once everything they emitted was
    /// answered and their state is saved), then lets its sinks finish.
    fn stop_pipeline(&mut self, p: RunningPipeline) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.opts.shutdown_timeout;
        let result = stop_sources(p.sources, deadline);
        self.join_sinks(p.sink_tasks, deadline);
        tracing::info!(pipeline = %p.config.name, "pipeline stopped");
        result
    }

    /// Waits for sink tasks until `deadline`, then aborts what is left
    /// (their unacknowledged data is read again).
    fn join_sinks(&self, tasks: Vec<tokio::task::JoinHandle<()>>, deadline: Instant) {
        let Some(rt) = &self.runtime else { return };
        let left = deadline.saturating_duration_since(Instant::now());
        let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        rt.block_on(async {
            let all = async {
                for t in tasks {
                    let _ = t.await;
                }
            };
            if tokio::time::timeout(left, all).await.is_err() {
                tracing::warn!("timeout reached with sinks still delivering; their data was not acknowledged and will be read again");
                for a in aborts {
                    a.abort();
                }
            }
        });
    }

    /// The configuration of every running pipeline (cheap clones: the
    /// parsed components are shared).
    pub fn configs(&self) -> Vec<PipelineConfig> {
        self.pipelines.values().map(|p| p.config.clone()).collect()
    }

    /// The running pipelines' configurations, by name.
    pub fn running(&self) -> impl Iterator<Item = &PipelineConfig> {
        self.pipelines.values().map(|p| &p.config)
    }

    /// Names of the agent's threads and sources that died (they never
    /// should: a panic is caught per batch). The process exits non-zero
    /// then.
    pub fn dead_threads(&self) -> Vec<String> {
        let mut dead = Vec::new();
        for (name, p) in &self.pipelines {
            for ((id, _), s) in p.config.sources.iter().zip(&p.sources) {
                if !s.is_alive() {
                    dead.push(format!("{name}/source/{id}"));
                }
            }
        }
        if let Some(p) = &self.pool {
            dead.extend(p.dead_threads());
        }
        dead
    }

    /// Each processing worker's name and how long it has been busy with
    /// one batch (see [`WorkerPool::busy_threads`]).
    pub fn busy_threads(&self) -> Vec<(String, Duration)> {
        self.pool
            .as_ref()
            .map(WorkerPool::busy_threads)
            .unwrap_or_default()
    }

    /// True when there are sources and every one has finished by itself
    /// (all input consumed and delivered): the agent then stops.
    pub fn finished(&self) -> bool {
        let mut any = false;
        for p in self.pipelines.values() {
            for s in &p.sources {
                if !s.is_finished() {
                    return false;
                }
                any = true;
            }
        }
        any
    }

    /// Stops reading, drains in-flight data to the sinks, writes the final
    /// checkpoint, and stops every thread, all by `deadline`: one bound for
    /// the whole shutdown, however many sinks are stuck. An error means
    /// some source's final state could not be saved.
    pub fn shutdown(mut self, deadline: Instant) -> anyhow::Result<()> {
        let pipelines = std::mem::take(&mut self.pipelines);
        let mut sources = Vec::new();
        let mut tasks = Vec::new();
        for (_, p) in pipelines {
            sources.extend(p.sources);
            tasks.extend(p.sink_tasks);
        }
        let result = stop_sources(sources, deadline);
        // Shared services (the file input thread) write their final state
        // when the last reference goes.
        self.shared = Arc::new(SharedServices::default());
        // Dropping the pool's queue lets each pipeline's runtime, and so
        // its sink senders, go; each sink then finishes what it holds.
        if let Some(p) = self.pool.take() {
            p.join();
        }
        self.join_sinks(tasks, deadline);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
        if self
            .metrics
            .health
            .report()
            .iter()
            .any(|u| u.component == "checkpoint")
        {
            anyhow::bail!("the final checkpoint could not be written");
        }
        result
    }
}

/// Asks every source to stop, then waits for each, all by one deadline.
fn stop_sources(mut sources: Vec<Box<dyn Source>>, deadline: Instant) -> anyhow::Result<()> {
    for s in &mut sources {
        s.begin_stop(deadline);
    }
    let mut result = Ok(());
    for s in sources {
        if let Err(e) = s.wait_stopped(deadline) {
            tracing::error!(error = %e, "source did not stop cleanly");
            result = Err(e);
        }
    }
    result
}
