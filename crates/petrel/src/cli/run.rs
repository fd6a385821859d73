//! `petrel run`: the agent itself. Loads the pipelines, starts the
//! topology and the API, and stays until a signal stops it, reloading the
//! configuration on SIGHUP, `POST /reload` or a change of `--config`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::{api, config, data_dir, fleet, topology};

use super::parse_bytes;

/// Options of `petrel run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A pipeline file or a directory of `*.yaml`/`*.yml` files (one pipeline each, named by file stem).
    #[arg(long)]
    config: PathBuf,
    /// Where checkpoints are kept.
    #[arg(long, default_value = "/var/lib/petrel", env = "PETREL_DATA_DIR")]
    data_dir: PathBuf,
    /// Processing threads (default: number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Memory for in-flight data, e.g. 16777216 or 16MiB (the default, chosen by measurement: see BENCHMARKS.md).
    #[arg(long, default_value = "16MiB", value_parser = parse_bytes)]
    memory_limit: u64,
    /// Address of the metrics and health API; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8686")]
    api_addr: String,
    /// Serve the API over TLS with this PEM certificate chain (with
    /// --api-tls-key); read again when the file changes.
    #[arg(long, requires = "api_tls_key", env = "PETREL_API_TLS_CERT")]
    api_tls_cert: Option<PathBuf>,
    /// The PEM private key of --api-tls-cert.
    #[arg(long, requires = "api_tls_cert", env = "PETREL_API_TLS_KEY")]
    api_tls_key: Option<PathBuf>,
    /// With --api-tls-cert: clients must present a certificate signed by
    /// this PEM CA (mutual TLS).
    #[arg(long, requires = "api_tls_cert", env = "PETREL_API_TLS_CLIENT_CA")]
    api_tls_client_ca: Option<PathBuf>,
    /// Which endpoints need the bearer token (PETREL_API_TOKEN or
    /// --api-token-file): `control` (/reload and /tap), `metrics` (also
    /// /metrics and /health; the probes /health/live and /health/ready stay
    /// open for the kubelet) or `all` (the probes too).
    #[arg(long, value_enum, default_value_t = api::AuthScope::Control, env = "PETREL_API_AUTH")]
    api_auth: api::AuthScope,
    /// A file holding the API's bearer token (instead of PETREL_API_TOKEN;
    /// a final newline is ignored).
    #[arg(long, env = "PETREL_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace) or a tracing filter; overrides PETREL_LOG.
    #[arg(long)]
    log_level: Option<String>,
    /// Format of the agent's own log lines on stderr: `text` for people,
    /// `json` (one object per line) for log pipelines such as Kubernetes'.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "PETREL_LOG_FORMAT")]
    log_format: LogFormat,
    /// Longest wait, in seconds, for in-flight data at shutdown (and for
    /// draining a pipeline changed by a reload).
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// How long offsets of files that are not seen (a directory not
    /// mounted yet, a pipeline removed) are kept, e.g. 7d, 12h, 3600s.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    checkpoint_ttl: Duration,
    /// How long a sink may keep failing before `/health` reports it
    /// (seconds); problems such as a dead thread count at once.
    #[arg(long, default_value_t = 30)]
    unhealthy_after: u64,
    /// Do not watch `--config` for changes (reload with SIGHUP or
    /// `POST /reload` only).
    #[arg(long)]
    no_watch_config: bool,
    /// The agent file: fleet management over OpAMP (`opamp:`), how remote
    /// pipelines are applied (`remote:`) and what they may do (`limits:`).
    #[arg(long, env = "PETREL_AGENT_CONFIG")]
    agent_config: Option<PathBuf>,
    /// The OpAMP server to be managed by (`ws://`, `wss://`, `http://`,
    /// `https://`), with the agent file's other settings or their
    /// defaults; overrides the agent file's `opamp.endpoint`.
    #[arg(long, env = "PETREL_OPAMP_ENDPOINT")]
    opamp_endpoint: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 7d, 12h, 30m or 3600s"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86400),
        _ => None,
    }
    .ok_or_else(|| format!("`{s}` is not a duration such as 7d, 12h, 30m or 3600s"))?;
    Ok(Duration::from_secs(secs))
}

/// Format of the agent's own logs (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per record.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message` and the
    /// record's fields at the top level.
    Json,
}

fn init_logging(level: Option<&str>, format: LogFormat) {
    let filter = level
        .map(str::to_string)
        .or_else(|| std::env::var("PETREL_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    // The agent's own records also feed `internal_logs` sources.
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let internal = crate::sources::internal_logs::layer();
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish()
            .with(internal)
            .init(),
        // Flattened so that collectors find `message` and the fields at the
        // top level; spans are not used by the agent, so they are left out.
        LogFormat::Json => {
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish()
                .with(internal)
                .init();
            // The default panic report is several plain-text lines (more
            // with RUST_BACKTRACE), which would break a line-by-line JSON
            // reader; processor panics are survivable, so they do happen.
            std::panic::set_hook(Box::new(log_panic));
        }
    }
}

/// Logs a panic as one error record (`--log-format json`).
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload();
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)");
    let location = info.location().map(|l| l.to_string()).unwrap_or_default();
    let current = std::thread::current();
    let thread = current.name().unwrap_or("<unnamed>");
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        tracing::error!(thread, location, backtrace = %backtrace, "panicked: {msg}");
    } else {
        tracing::error!(thread, location, "panicked: {msg}");
    }
}

enum RunError {
    Config(Vec<petrel_core::ConfigError>),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for RunError {
    fn from(e: anyhow::Error) -> Self {
        RunError::Other(e)
    }
}

impl From<std::io::Error> for RunError {
    fn from(e: std::io::Error) -> Self {
        RunError::Other(e.into())
    }
}

/// Longest accepted `--shutdown-timeout`: larger values would overflow the
/// clock's deadline arithmetic and mean "wait forever" in practice anyway.
const MAX_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// What the main thread waits for.
enum Control {
    Stop(i32),
    Reload(&'static str),
}

/// The agent file and the OpAMP settings, when the agent is managed.
fn fleet_settings(
    a: &RunArgs,
) -> Result<
    Option<(
        fleet::agent_file::AgentFile,
        fleet::agent_file::OpampSettings,
    )>,
    RunError,
> {
    let file = match &a.agent_config {
        Some(p) => fleet::agent_file::load(p).map_err(RunError::Config)?,
        None => fleet::agent_file::AgentFile::default(),
    };
    let settings = match (&a.opamp_endpoint, &file.opamp) {
        (Some(e), from_file) => {
            if let Err(why) = fleet::agent_file::check_endpoint(e) {
                return Err(RunError::Other(anyhow::anyhow!("--opamp-endpoint: {why}")));
            }
            let mut s = from_file
                .clone()
                .unwrap_or_else(|| fleet::agent_file::OpampSettings::with_endpoint(e));
            s.endpoint = e.clone();
            s
        }
        (None, Some(s)) => s.clone(),
        (None, None) => return Ok(None),
    };
    Ok(Some((file, settings)))
}

fn run(a: RunArgs) -> Result<(), RunError> {
    let managed = fleet_settings(&a)?;
    // A managed agent may have no local pipeline at all: its pipelines
    // come from the server (or the last set it applied).
    let pipelines = config::load_with(&a.config, managed.is_some()).map_err(RunError::Config)?;
    for w in pipelines.iter().flat_map(|p| &p.warnings) {
        tracing::warn!("{}:{}:{}: {}", w.file, w.line, w.col, w.message);
    }
    // Checked before anything is bound or created, so that a second agent
    // or an unwritable directory fails with nothing half started.
    let _lock = data_dir::lock(&a.data_dir)?;
    raise_fd_limit();
    crate::host::tune_allocator(a.memory_limit as usize);
    let threads = a
        .threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1);
    let shutdown_timeout = Duration::from_secs(a.shutdown_timeout).min(MAX_SHUTDOWN_TIMEOUT);
    let opts = topology::RunOptions {
        data_dir: a.data_dir,
        threads,
        memory_limit: a.memory_limit as usize,
        shutdown_timeout,
        checkpoint_ttl: a.checkpoint_ttl,
    };
    // Sinks only do I/O and hand writes to the blocking pool; one runtime
    // thread serves every sink and the API.
    // Blocking writes are short; a small cap keeps the thread count fixed
    // even with a thousand file sinks, while one stalled destination still
    // leaves the others room.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(8)
        .thread_name("petrel-sink")
        .enable_all()
        .build()?;
    let token = api::token(a.api_token_file.as_deref())?;
    if a.api_auth != api::AuthScope::Control && token.is_none() {
        return Err(anyhow::anyhow!(
            "--api-auth {} needs a token: set PETREL_API_TOKEN or --api-token-file",
            a.api_auth.name()
        )
        .into());
    }
    let listener = std::net::TcpListener::bind(&a.api_addr)
        .map_err(|e| anyhow::anyhow!("cannot bind --api-addr {}: {e}", a.api_addr))?;
    let addr = listener.local_addr()?;
    let metrics = petrel_core::Metrics::new();
    let api_tls = match (&a.api_tls_cert, &a.api_tls_key) {
        (Some(cert), Some(key)) => {
            let owner = crate::tls::Owner {
                component: "api".into(),
                metrics: Some(metrics.clone()),
            };
            let mut cfg =
                crate::tls::server_config(cert, key, a.api_tls_client_ca.as_deref(), &owner)
                    .map_err(|e| anyhow::anyhow!("--api-tls-cert/--api-tls-key: {e:#}"))?;
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(std::sync::Arc::new(cfg))
        }
        _ => None,
    };
    metrics
        .health
        .set_unhealthy_after(Duration::from_secs(a.unhealthy_after));
    // Before any pipeline starts: a start that finds an apply not proven
    // healthy counts, and may put the last known good set back.
    let mut fleet = match managed {
        Some((file, settings)) => Some(fleet::Fleet::open(
            file,
            settings,
            &opts.data_dir,
            metrics.clone(),
        )?),
        None => None,
    };
    let budget = petrel_core::MemoryBudget::new(opts.memory_limit);
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded::<Control>();
    let (api_reload_tx, api_reload_rx) = crossbeam_channel::unbounded::<api::ReloadRequest>();
    forward_signals(ctl_tx.clone())?;
    if !a.no_watch_config {
        let tx = ctl_tx.clone();
        let watching = crate::config_watch::watch(&a.config, move || {
            tx.send(Control::Reload("configuration changed")).is_ok()
        });
        if let Err(e) = watching {
            tracing::warn!(error = %e, "cannot watch the configuration for changes; reload with SIGHUP or POST /reload");
        }
    }
    let scheme = if api_tls.is_some() { "https" } else { "http" };
    runtime.spawn(api::serve(
        listener,
        metrics.clone(),
        budget.clone(),
        api_reload_tx,
        api::Access {
            tls: api_tls,
            token,
            scope: a.api_auth,
        },
        fleet.as_ref().map(|f| f.view()),
    ));
    tracing::info!("API listening on {scheme}://{addr}");
    let count = pipelines.len();
    let rt = runtime.handle().clone();
    // Handed over, not copied: the running topology keeps the only copy
    // of each pipeline's configuration.
    let mut topo = topology::Topology::start(pipelines, &opts, metrics.clone(), budget, runtime)?;
    // Remote pipelines start after the local ones, from the managed
    // directory, whether the server answers or not; one that cannot start
    // is reported and does not stop the agent.
    let fleet_rx = match fleet.as_mut() {
        Some(f) => {
            f.start_remote(&mut topo);
            f.start(&rt, &topo)
        }
        None => crossbeam_channel::never(),
    };
    metrics
        .health
        .set_phase(petrel_core::health::Phase::Running);
    tracing::info!(
        pipelines = count,
        threads,
        memory_limit = opts.memory_limit,
        "petrel started"
    );
    // The same patience as for a failing sink: a batch takes milliseconds,
    // so a worker busy for that long is stuck, and an operator who wants
    // quicker probes lowers both together.
    let stuck_after = Duration::from_secs(a.unhealthy_after.max(1));
    let mut failure = None;
    loop {
        // A fleet apply's health watch ends on time, not at the next
        // second's turn (the server is told APPLIED then).
        let turn = fleet
            .as_ref()
            .and_then(|f| f.watch_remaining())
            .map_or(Duration::from_secs(1), |r| r.min(Duration::from_secs(1)));
        crossbeam_channel::select! {
            recv(ctl_rx) -> msg => match msg {
                Ok(Control::Stop(sig)) => {
                    tracing::info!(signal = sig, "stopping: draining in-flight data");
                    break;
                }
                Ok(Control::Reload(why)) => {
                    let _ = reload(&a.config, &mut topo, &metrics, why, fleet.as_mut());
                }
                Err(_) => break,
            },
            recv(api_reload_rx) -> req => {
                if let Ok(answer) = req {
                    let _ = answer.send(reload(&a.config, &mut topo, &metrics, "POST /reload", fleet.as_mut()));
                }
            },
            recv(fleet_rx) -> msg => {
                if let (Ok(msg), Some(f)) = (msg, fleet.as_mut()) {
                    let config = &a.config;
                    let m = &metrics;
                    f.handle(msg, &mut topo, |topo, f| {
                        let _ = reload(config, topo, m, "OpAMP restart command", Some(f));
                    });
                }
            },
            default(turn) => {}
        }
        if topo.finished() {
            tracing::info!("every source has ended and its data was delivered; stopping");
            break;
        }
        report_stuck_workers(&topo, &metrics.health, stuck_after);
        if let Some(f) = fleet.as_mut() {
            f.tick(&mut topo);
        }
        let dead = topo.dead_threads();
        if !dead.is_empty() {
            for t in &dead {
                metrics.health.stuck(&format!("thread/{t}"), "thread died");
            }
            tracing::error!(threads = ?dead, "an internal thread died; stopping with an error");
            failure = Some(anyhow::anyhow!(
                "internal thread(s) died: {}",
                dead.join(", ")
            ));
            break;
        }
    }
    // Not ready while draining, so that a Service stops sending to the
    // network sources; still live, so that the drain is not cut short.
    metrics
        .health
        .set_phase(petrel_core::health::Phase::Stopping);
    if let Some(f) = fleet.as_mut() {
        f.stop();
    }
    let deadline = Instant::now() + opts.shutdown_timeout;
    if let Err(e) = topo.shutdown(deadline) {
        failure.get_or_insert(e);
    }
    match failure {
        Some(e) => Err(RunError::Other(e)),
        None => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

/// Raises `thread/NAME` as stuck in `health` for each processing worker
/// busy with one batch for `stuck_after` or more, and clears it for the
/// others (a worker that returns is live again).
fn report_stuck_workers(
    topo: &topology::Topology,
    health: &petrel_core::health::Health,
    stuck_after: Duration,
) {
    for (name, busy) in topo.busy_threads() {
        let key = format!("thread/{name}");
        if busy >= stuck_after {
            health.stuck(
                &key,
                format!(
                    "busy with one batch for {}s: a processor does not return",
                    busy.as_secs()
                ),
            );
        } else {
            health.recovered(&key);
        }
    }
}

/// Loads the configuration again and applies it. An invalid one changes
/// nothing: the running pipelines stay and the errors are logged. When
/// the agent is managed, the running remote pipelines stay beside the
/// local ones.
fn reload(
    path: &std::path::Path,
    topo: &mut topology::Topology,
    metrics: &petrel_core::Metrics,
    why: &str,
    mut fleet: Option<&mut fleet::Fleet>,
) -> Result<String, String> {
    let count = |result: &str| {
        metrics
            .config_reloads
            .get_or_create(&vec![("result".to_string(), result.to_string())])
            .inc();
    };
    tracing::info!(trigger = why, "reloading the configuration");
    let pipelines = match config::load_with(path, fleet.is_some()) {
        Ok(p) => match fleet.as_deref_mut() {
            Some(f) => f.merge_local(p, topo),
            None => p,
        },
        Err(errs) => {
            let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
            for e in &text {
                tracing::error!("reload refused, the running configuration stays: {e}");
            }
            count("failed");
            return Err(text.join("\n"));
        }
    };
    let applied = topo.apply(pipelines);
    if let Some(f) = fleet {
        f.refresh_effective(topo);
    }
    match applied {
        Ok(done) if !done.failed.is_empty() => {
            count("failed");
            let failed: Vec<String> = done
                .failed
                .iter()
                .map(|(name, why)| format!("pipeline {name}: {why}"))
                .collect();
            let summary = format!(
                "added {:?}, changed {:?}, removed {:?}, unchanged {}; refused (these keep their previous configuration): {}",
                done.added,
                done.changed,
                done.removed,
                done.unchanged,
                failed.join("; ")
            );
            tracing::error!("configuration reloaded in part: {summary}");
            Err(summary)
        }
        Ok(done) => {
            let summary = format!(
                "added {:?}, changed {:?}, removed {:?}, unchanged {}",
                done.added, done.changed, done.removed, done.unchanged
            );
            if done.added.is_empty() && done.changed.is_empty() && done.removed.is_empty() {
                count("unchanged");
            } else {
                count("applied");
            }
            tracing::info!("configuration reloaded: {summary}");
            Ok(summary)
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "reload failed");
            count("failed");
            Err(format!("{e:#}"))
        }
    }
}

/// Turns SIGINT/SIGTERM into a stop and SIGHUP into a reload (logrotate's
/// `postrotate kill -HUP` habit must not kill the agent).
fn forward_signals(tx: crossbeam_channel::Sender<Control>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("petrel-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let msg = if sig == SIGHUP {
                    Control::Reload("SIGHUP")
                } else {
                    Control::Stop(sig)
                };
                if tx.send(msg).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// Tailing many files needs many descriptors; the soft limit is often 1024
/// while the hard limit allows far more.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Runs the agent with `a` until it is stopped; the exit code is 2 for an
/// invalid configuration and 1 for any other failure.
pub fn main(a: RunArgs) -> ExitCode {
    init_logging(a.log_level.as_deref(), a.log_format);
    let format = a.log_format;
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Config(errs)) => {
            for e in errs {
                // A JSON log stream must stay parseable line by line.
                match format {
                    LogFormat::Text => eprintln!("{e}"),
                    LogFormat::Json => tracing::error!("{e}"),
                }
            }
            ExitCode::from(2)
        }
        Err(RunError::Other(e)) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
