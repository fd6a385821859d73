//! The command line: one module per subcommand beside the engine's
//! modules, so that `main.rs` only calls [`main`].

pub mod docs;
pub mod pipe;
pub mod run;
pub mod tap;
pub mod test;
pub mod top;
pub mod validate;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use petrel_gen as gen;

use run::RunArgs;

const EXAMPLES: &str = "\
Examples:
  petrel run --config examples/quickstart.yaml --data-dir /tmp/petrel-data
  petrel run --config /etc/petrel/pipelines/ --threads 2 --memory-limit 128MiB
  petrel validate --config /etc/petrel/pipelines/
  petrel test --config examples/pipelines/nginx-kafka.yaml --junit report.xml
  petrel pipe --spool-dir /var/lib/petrel/spool/apache   # as Apache's CustomLog \"|...\"
  petrel gen --format single128 --size 1GiB --output /tmp/single128.log
  petrel gen --format nginx283 --rate 10MB --duration 60 --output /tmp/access.log --rotate-bytes 100MB";

/// The description of `petrel --help` and of the man page.
const LONG_ABOUT: &str = "\
Petrel tails log files through rotation, truncation and restarts, receives \
syslog, TCP, HTTP and OTLP, runs each event through a chain of processors \
and delivers it at least once to files, Kafka, HTTP endpoints and log \
stores. A pipeline is one YAML file; a directory of them is one pipeline \
per *.yaml or *.yml file, named by the file stem. The component reference \
is in /usr/share/doc/petrel/reference/ (docs/src/reference/ in the \
source), examples in /usr/share/doc/petrel/examples/. Every subcommand \
lists its options with --help.";

/// `petrel --version`: the crate version and the git revision built
/// (crates/petrel/build.rs), so a binary or an image names its commit.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PETREL_REVISION"),
    ")"
);

/// Petrel: a log collection agent.
#[derive(Parser, Debug)]
#[command(name = "petrel", version = VERSION, about, long_about = LONG_ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run pipelines until SIGINT or SIGTERM.
    #[command(after_help = EXAMPLES)]
    Run(RunArgs),
    /// Check pipeline files; exit 2 with one `FILE:LINE:COL: problem` line each.
    Validate {
        /// A pipeline file or a directory of `*.yaml`/`*.yml` files.
        #[arg(long)]
        config: PathBuf,
        /// Check the configuration alone, away from the host it runs on:
        /// skip what needs that host (that TLS certificates, keys and
        /// `remap` program files exist and load, what a sink's path is).
        #[arg(long)]
        offline: bool,
    },
    /// Run pipeline unit tests (`*.test.yaml`): feed lines to a pipeline's
    /// processor chain in-process and check the events at a component; exit
    /// 0 when all pass, 1 when one fails, 2 on invalid config or test files.
    Test {
        /// A pipeline file or a directory of `*.yaml`/`*.yml` files.
        #[arg(long)]
        config: PathBuf,
        /// Write a JUnit XML report here.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Test files or directories of them (default: `*.test.yaml` next
        /// to the config).
        tests: Vec<PathBuf>,
    },
    /// Convert another agent's configuration into Petrel pipeline files,
    /// with a report of what was converted, approximated or not converted;
    /// exit 1 when something was not converted (unless
    /// `--bypass-errors`), 2 when the input cannot be read.
    Convert {
        /// The format of the input.
        #[arg(long, value_enum, required_unless_present = "import_positions")]
        from: Option<crate::convert::Format>,
        /// The configuration: its main file first, then any other files it
        /// needs (a parsers file).
        #[arg(required_unless_present = "import_positions")]
        inputs: Vec<PathBuf>,
        /// Import the other agent's read positions from this file (Fluent
        /// Bit's tail `DB`) into the checkpoints of `--data-dir`, for the
        /// sources of the Petrel pipelines in `--config` (or `--out`).
        /// Run it with the agents stopped.
        #[arg(long, requires = "data_dir")]
        import_positions: Option<PathBuf>,
        /// Petrel's data directory (`petrel run --data-dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The Petrel pipelines the positions are for (default: `--out`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write one `<pipeline>.yaml` per pipeline here (default: print
        /// them).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write the report (Markdown) here (default: standard error).
        #[arg(long)]
        report: Option<PathBuf>,
        /// Exit 0 even when parts were not converted.
        #[arg(long)]
        bypass_errors: bool,
    },
    /// Write a benchmark data set.
    Gen(GenArgs),
    /// Copy standard input to a spool directory without ever making the
    /// writer wait (for Apache `CustomLog "|petrel pipe ..."`); a running
    /// agent reads it with `sources: [{type: spool, path: DIR}]`.
    Pipe(PipeArgs),
    /// Print a sample of the events leaving a component of a running
    /// agent (ndjson or their messages); the pipeline never waits for it.
    Tap {
        /// `PIPELINE` (the sinks' input) or `PIPELINE/COMPONENT` (a source:
        /// what the pipeline's sources produce; a processor: its output; a
        /// sink: its input).
        target: String,
        /// The agent's `--api-addr`; `https://host:port` for an API
        /// served over TLS.
        #[arg(long, default_value = "127.0.0.1:8686")]
        api_addr: String,
        #[command(flatten)]
        tls: tap::ApiTls,
        /// Stop after this many events.
        #[arg(long)]
        limit: Option<u64>,
        /// At most this many events per second.
        #[arg(long)]
        rate: Option<u64>,
        /// `ndjson` (every field) or `text` (the message).
        #[arg(long, value_enum, default_value_t = tap::TapFormat::Ndjson)]
        format: tap::TapFormat,
    },
    /// Print generated documentation: the component reference (Markdown),
    /// shell completions or the man page.
    Docs {
        /// What to print.
        #[command(subcommand)]
        what: docs::DocsCmd,
    },
    /// A live terminal view of a running agent (rates per component, lag
    /// per file, memory, CPU), read from its API; `q` quits.
    Top {
        /// The agent's `--api-addr`; `https://host:port` for an API
        /// served over TLS.
        #[arg(long, default_value = "127.0.0.1:8686")]
        api_addr: String,
        #[command(flatten)]
        tls: tap::ApiTls,
        /// Milliseconds between two readings.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
}

#[derive(clap::Args, Debug)]
struct PipeArgs {
    /// The spool directory (created when missing).
    #[arg(long)]
    spool_dir: PathBuf,
    /// A name for this writer; events carry `source_address: pipe:NAME`.
    #[arg(long)]
    name: Option<String>,
    /// Spool size cap; beyond it new lines are dropped and counted.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Longest time written data waits for fsync, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    sync_interval_ms: u64,
    /// Lines longer than this are cut into pieces.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    max_line_bytes: u64,
}

#[derive(clap::Args, Debug)]
struct GenArgs {
    /// Data set.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(gen::DataSet::NAMES))]
    format: String,
    /// Total bytes, e.g. 1GiB.
    #[arg(long, value_parser = parse_bytes, conflicts_with_all = ["rate", "duration"], required_unless_present = "rate")]
    size: Option<u64>,
    /// Bytes per second, e.g. 10MB.
    #[arg(long, value_parser = parse_bytes, requires = "duration")]
    rate: Option<u64>,
    /// Seconds to write at `--rate`.
    #[arg(long, requires = "rate")]
    duration: Option<u64>,
    /// Output file (appended to).
    #[arg(long)]
    output: PathBuf,
    /// Rename the file to `<output>.N` each time it reaches this size.
    #[arg(long, value_parser = parse_bytes)]
    rotate_bytes: Option<u64>,
    /// Seed of the random parts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    petrel_core::config::parse_size(s)
        .ok_or_else(|| format!("`{s}` is not a byte count such as 1048576, 64MiB or 10MB"))
}

/// The command line's definition, for the generated completions and man
/// pages.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Parses the command line and runs the subcommand it names.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Validate { config, offline } => validate::main(&config, offline),
        Cmd::Convert {
            from,
            inputs,
            import_positions,
            data_dir,
            config,
            out,
            report,
            bypass_errors,
        } => {
            let mut code = ExitCode::SUCCESS;
            if let Some(from) = from {
                code = crate::convert::main(
                    from,
                    &inputs,
                    out.as_deref(),
                    report.as_deref(),
                    bypass_errors,
                );
                if code != ExitCode::SUCCESS && code != ExitCode::from(1) {
                    return code;
                }
            }
            if let (Some(db), Some(data_dir)) = (import_positions, data_dir) {
                let Some(config) = config.or(out) else {
                    eprintln!("petrel convert: --import-positions needs the Petrel pipelines: --config DIR (or --out DIR with a conversion)");
                    return ExitCode::from(2);
                };
                let imported = crate::convert::import_main(&db, &data_dir, &config);
                if imported != ExitCode::SUCCESS {
                    return imported;
                }
            }
            code
        }
        Cmd::Tap {
            target,
            api_addr,
            tls,
            limit,
            rate,
            format,
        } => {
            let api = match tap::ApiTarget::new(&api_addr, &tls) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("petrel tap: {e:#}");
                    return ExitCode::from(2);
                }
            };
            let o = tap::TapOptions {
                api,
                target,
                limit,
                rate,
                format,
            };
            match tap::run(&o, &mut std::io::stdout().lock()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("petrel tap: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Top {
            api_addr,
            tls,
            interval_ms,
        } => match tap::ApiTarget::new(&api_addr, &tls)
            .and_then(|t| top::run(t, Duration::from_millis(interval_ms.max(100))))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("petrel top: {e:#}");
                ExitCode::from(1)
            }
        },
        Cmd::Test {
            config,
            junit,
            tests,
        } => ExitCode::from(test::run(&test::TestOptions {
            config,
            tests,
            junit,
        })),
        Cmd::Pipe(a) => {
            let opts = pipe::PipeOptions {
                spool_dir: a.spool_dir,
                name: a.name,
                max_bytes: a.max_bytes,
                sync_interval: Duration::from_millis(a.sync_interval_ms),
                max_line_bytes: (a.max_line_bytes as usize).max(64),
            };
            match pipe::run(&opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("petrel pipe: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Gen(a) => {
            let Some(format) = gen::DataSet::from_name(&a.format) else {
                eprintln!("unknown format {}", a.format);
                return ExitCode::from(2);
            };
            let opts = gen::GenOptions {
                format,
                size: a.size,
                rate: a.rate,
                duration_secs: a.duration,
                output: a.output,
                rotate_bytes: a.rotate_bytes,
                seed: a.seed,
            };
            match gen::run(&opts) {
                Ok(r) => {
                    eprintln!(
                        "wrote {} bytes, {} lines, {} events in {} file(s)",
                        r.bytes, r.lines, r.events, r.files
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("petrel gen: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Run(a) => run::main(a),
        Cmd::Docs { what } => docs::main(what, &mut Cli::command()),
    }
}
