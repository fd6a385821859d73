//! `type: remap` — runs a VRL program (Vector Remap Language, the `vrl`
//! crate) on every event.
//!
//! ```yaml
//! processors:
//!   - type: remap
//!     source: |
//!       . = merge(., parse_json!(.message))
//!       .level = upcase!(.level)
//! ```
//!
//! The program is compiled once when the pipeline is loaded (and at every
//! reload); compile and type errors, an unhandled fallible expression
//! among them, are configuration errors at the line and column of the
//! pipeline file, with VRL's own diagnostic.
//!
//! **What a program sees.** `.` is the event's fields; `.message` is the
//! message and `.timestamp` the event time (a VRL timestamp) when the event
//! has one. `%` is the batch's source metadata, read-only in effect (writes
//! to it are visible to the rest of the program and then forgotten):
//! `%file`, `%source_type`, `%host` and the source's fields, dotted names
//! split into objects (`%k8s.namespace`, `%kafka.topic`), the key of a
//! label or annotation kept whole (`%k8s.annotations."petrel.dev/parser"`).
//!
//! **How it runs.** The program runs against [`EventTarget`], an adapter
//! over Petrel's own event, not a copy of it:
//! - reading a top-level field converts that field only, once per run; a
//!   span of the read buffer becomes a [`bytes::Bytes`] slice of the
//!   buffer, not a copy;
//! - writes and deletions of top-level fields (and of anything below them)
//!   go to an overlay of whole top-level fields; the event itself is not
//!   touched while the program runs;
//! - an abort or an error throws the overlay away: the event is as it was,
//!   without having been cloned;
//! - an event the program did not write to is left exactly as it was, so
//!   it is encoded on the same path, byte for byte;
//! - writing the overlay back puts text that still lies in the read buffer
//!   back as spans, so stable event ids (which come from spans) survive a
//!   program that moved the message around.
//!
//! Operations on the root itself (`. = ...`, `merge(., ...)`, `del(.)`,
//! an index at the root) switch that run to a whole converted object (all
//! fields, spans still as buffer slices), as VRL's own target would hold.
//! Fields of that object equal to the event's are written back untouched.
//!
//! Assigning an array to `.` emits one event per element, as Vector does.
//!
//! **Functions.** The VRL standard library, except the network functions,
//! which are not compiled in (`http_request`, `dns_lookup`, `reverse_dns`),
//! and the functions that read the agent's environment, host or files
//! (`get_env_var`, `get_hostname`, `get_timezone_name`, `parse_proto`,
//! `encode_proto`, `validate_json_schema`, `parse_etld`), which a program
//! may call only with `allow_env: true`: a pipeline file, possibly written
//! by another team or shipped in a Helm value, must not be able to read
//! the agent's secrets (its environment holds credentials of the sinks)
//! or its files by default.
//!
//! **Errors.** A runtime error keeps the event unchanged
//! (`drop_on_error: false`, the default) or drops it (counted as discarded
//! with `reason="remap_error"`); either way it is counted in
//! `petrel_component_errors_total{error_type="remap"}` and logged, at most
//! once every 10 seconds per processor. An `abort` drops the event
//! (`drop_on_abort: true`, the default, `reason="remap_abort"`) or keeps it
//! unchanged. A run whose written fields would exceed `max_output_bytes`
//! is such an error too, so that one event cannot make the agent's memory
//! grow without bound.
//!
//! **Limits.** A run's working memory (what it allocates and still holds,
//! measured by the agent's allocator, `crate::alloc`) and its time are
//! bounded: a run over `max_memory_bytes` (default a quarter of the
//! pipeline's share of `--memory-limit`) or `max_run_ms` is interrupted
//! between two expressions (VRL's cooperative execution control) and the
//! event is handled as an abort with `reason="remap_limit"` (dropped and
//! counted, or rerouted, or kept unchanged with `drop_on_abort: false`);
//! the other events of the batch go on. The new data runs leave in a
//! batch's events is charged to the pipeline's memory budget and may not
//! pass the pipeline's share of `--memory-limit`: past it, further events
//! of the batch are handled the same way. So a program adds at most about
//! twice the pipeline's share to the agent's memory, whatever it does.
//!
//! With `reroute_dropped: <sink id>`, a dropped event is not discarded: it
//! goes, as it was before the failed run and with a `dropped` field saying
//! why, to that sink of the pipeline alone (Vector's `reroute_dropped`,
//! with the reason as a field since Petrel's events carry no separate
//! metadata), and skips the processors after this one.

use std::cell::{Cell, OnceCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use petrel_core::config::{ConfigError, Map, Node};
use petrel_core::plugin::{KeyDoc, KeyKind, Processor};
use petrel_core::{
    ComponentMetrics, Event, EventBatch, Key, LazyCounter, Rerouted, SourceInfo, Span, Value,
};
use vrl::compiler::runtime::{Runtime, Terminate};
use vrl::compiler::state::{ExternalEnv, RuntimeState};
use vrl::compiler::{CompileConfig, Function, Program, SecretTarget, Target, TimeZone};
use vrl::path::{OwnedSegment, OwnedTargetPath, OwnedValuePath, PathPrefix};
use vrl::value::{KeyString, ObjectMap, Secrets, Value as V};

/// Keys accepted.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "source",
    "file",
    "drop_on_error",
    "drop_on_abort",
    "reroute_dropped",
    "allow_env",
    "timezone",
    "max_output_bytes",
    "max_memory_bytes",
    "max_run_ms",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Runs a VRL program (Vector Remap Language, as in Vector's `remap` transform) on every event: `.` is the event's fields (`.message`, `.timestamp` the event time), `%` the source metadata (`%file`, `%host`, `%k8s.namespace`, `%kafka.topic`, ...). Compiled once at load; compile errors and unhandled fallible expressions are configuration errors. Assigning an array to `.` emits one event per element. Network functions are not available; functions that read the agent's environment, host or files only with `allow_env: true`. Runtime errors count in `petrel_component_errors_total{error_type="remap"}`; dropped events count as discarded with `reason=remap_error` or `remap_abort`."#;

/// Default of `max_output_bytes`.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 4 << 20;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "source",
        kind: KeyKind::String,
        default: None,
        doc: r#"The VRL program, inline (use a block scalar, `source: |`). Exactly one of `source` and `file` is required."#,
    },
    KeyDoc {
        name: "file",
        kind: KeyKind::String,
        default: None,
        doc: r#"A file holding the VRL program, relative to the pipeline file's directory; read and compiled at load and at every reload."#,
    },
    KeyDoc {
        name: "drop_on_error",
        kind: KeyKind::Bool,
        default: Some("false"),
        doc: r#"Drop an event whose run failed (counted as discarded with `reason=remap_error`) instead of passing it on unchanged. Either way the error counts in `petrel_component_errors_total{error_type="remap"}`."#,
    },
    KeyDoc {
        name: "drop_on_abort",
        kind: KeyKind::Bool,
        default: Some("true"),
        doc: r#"Drop an event whose program called `abort` (counted as discarded with `reason=remap_abort`); `false` passes it on unchanged."#,
    },
    KeyDoc {
        name: "reroute_dropped",
        kind: KeyKind::String,
        default: None,
        doc: r#"The `id` of a sink of this pipeline that receives the events this processor drops (`drop_on_error`, `drop_on_abort`), unchanged by the failed run, with a field `dropped` saying why (`reason`: `remap_error` or `remap_abort`, `message`, `component_id`, `component_type`). That sink receives these events and nothing else, so it has no `when`. Without it, dropped events are counted as discarded."#,
    },
    KeyDoc {
        name: "allow_env",
        kind: KeyKind::Bool,
        default: Some("false"),
        doc: r#"Let the program call the functions that read the agent's environment, host or files (`get_env_var`, `get_hostname`, `get_timezone_name`, `parse_proto`, `encode_proto`, `validate_json_schema`, `parse_etld`). Off by default: the agent's environment holds the sinks' credentials, and a pipeline file must not read them unless its author was trusted to."#,
    },
    KeyDoc {
        name: "timezone",
        kind: KeyKind::String,
        default: Some("local"),
        doc: r#"The time zone of timestamps parsed or formatted without one (`parse_timestamp`, `format_timestamp`): `local` or a name such as `UTC` or `Europe/Paris`."#,
    },
    KeyDoc {
        name: "max_output_bytes",
        kind: KeyKind::Bytes,
        default: Some("4MiB"),
        doc: r#"Largest amount of new data (fields written, not counting text still in the read buffer) one run may leave in an event; a run over it is a runtime error and the event is handled by `drop_on_error`."#,
    },
    KeyDoc {
        name: "max_memory_bytes",
        kind: KeyKind::Bytes,
        default: Some(
            "a quarter of the pipeline's share of --memory-limit (4 MiB at 16 MiB), at least 1 MiB",
        ),
        doc: r#"Largest working memory of one run (what the program allocated and still holds: values, variables, the new fields). A run over it is interrupted between two expressions and its event handled as an abort counted with `reason="remap_limit"` (`drop_on_abort`, `reroute_dropped`). Besides, the new data of all the runs of one batch is charged to the pipeline's memory budget and may not pass the pipeline's share of `--memory-limit`: events after that are handled the same way."#,
    },
    KeyDoc {
        name: "max_run_ms",
        kind: KeyKind::Duration,
        default: Some("1000"),
        doc: r#"Longest time one run may take; a run over it is interrupted as for `max_memory_bytes` (`reason="remap_limit"`). VRL has no loops, so only a program over huge values gets near it."#,
    },
];

/// Default of `max_run_ms`.
pub const DEFAULT_MAX_RUN: Duration = Duration::from_millis(1000);

/// The smallest default working-memory limit of a run.
const MIN_MAX_MEMORY: u64 = 1 << 20;

/// The functions that read the agent's environment, host or files: off
/// unless `allow_env: true` (see the module documentation for why).
pub const ENV_FUNCTIONS: &[&str] = &[
    "get_env_var",
    "get_hostname",
    "get_timezone_name",
    "parse_proto",
    "encode_proto",
    "validate_json_schema",
    "parse_etld",
];

/// The standard library a program may call: every function of
/// `vrl::stdlib::all()` (the network functions are not compiled in), less
/// [`ENV_FUNCTIONS`] unless `allow_env`.
pub fn functions(allow_env: bool) -> Vec<Box<dyn Function>> {
    vrl::stdlib::all()
        .into_iter()
        .filter(|f| allow_env || !ENV_FUNCTIONS.contains(&f.identifier()))
        .collect()
}

/// Configuration: the compiled program and what to do with failed runs.
#[derive(Clone)]
pub struct Config {
    /// The compiled program, shared by every thread that runs it.
    pub program: Arc<Program>,
    /// The program reads `%`: only then is the metadata object built.
    pub reads_metadata: bool,
    /// Drop events whose run failed.
    pub drop_on_error: bool,
    /// Drop events whose program aborted.
    pub drop_on_abort: bool,
    /// The sink that receives dropped events instead of their being
    /// discarded.
    pub reroute_dropped: Option<Arc<str>>,
    /// Time zone for timestamps without one.
    pub timezone: TimeZone,
    /// Bound on the new data a run leaves in an event.
    pub max_output_bytes: u64,
    /// Bound on a run's working memory; `None`: a quarter of the
    /// pipeline's budget.
    pub max_memory_bytes: Option<u64>,
    /// Bound on a run's time.
    pub max_run: Duration,
    /// `file:`: the program's path and text, so that a reload notices a
    /// change of the program alone.
    pub program_file: Option<(String, String)>,
    /// `allow_env`: the program may read the agent's environment, host
    /// and files.
    pub allow_env: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("remap::Config")
            .field("drop_on_error", &self.drop_on_error)
            .field("drop_on_abort", &self.drop_on_abort)
            .finish_non_exhaustive()
    }
}

/// Where the program text sits in the pipeline file, to turn positions in
/// the program into positions in the file.
enum ProgramOrigin {
    /// Inline `source:`: the YAML scalar's node.
    Inline,
    /// `file:`, at this path.
    File(String),
}

impl Config {
    /// Reads the keys, reads `file:` if given, and compiles the program;
    /// compile errors are reported at their place in the pipeline file (or
    /// in the program file).
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let drop_on_error = match map.get("drop_on_error") {
            Some(_) => map.bool("drop_on_error")?,
            None => false,
        };
        let drop_on_abort = match map.get("drop_on_abort") {
            Some(_) => map.bool("drop_on_abort")?,
            None => true,
        };
        let reroute_dropped = match map.get("reroute_dropped") {
            // Whether it names a sink of the pipeline is checked with the
            // sinks (config.rs).
            Some(n) => Some(Arc::<str>::from(n.as_str()?)),
            None => None,
        };
        let allow_env = match map.get("allow_env") {
            Some(_) => map.bool("allow_env")?,
            None => false,
        };
        let max_output_bytes = match map.get("max_output_bytes") {
            Some(_) => map.u64("max_output_bytes", true)?,
            None => DEFAULT_MAX_OUTPUT_BYTES,
        };
        let max_memory_bytes = match map.get("max_memory_bytes") {
            Some(_) => Some(map.u64("max_memory_bytes", true)?),
            None => None,
        };
        let max_run = match map.get("max_run_ms") {
            Some(_) => Duration::from_millis(map.u64("max_run_ms", true)?.max(1)),
            None => DEFAULT_MAX_RUN,
        };
        let timezone = match map.get("timezone") {
            None => TimeZone::Local,
            Some(n) => {
                let text = n.as_str()?;
                match TimeZone::parse(text) {
                    Some(tz) => tz,
                    None => {
                        n.error(format!(
                            "unknown time zone `{text}`; use `local` or a name such as `UTC` or `Europe/Paris`"
                        ));
                        return None;
                    }
                }
            }
        };
        let (node, text, origin) = match (map.get("source"), map.get("file")) {
            (Some(n), None) => (n, n.as_str()?.to_string(), ProgramOrigin::Inline),
            (None, Some(n)) => {
                let rel = n.as_str()?;
                let path = resolve_path(map.node().file(), rel);
                match std::fs::read_to_string(&path) {
                    Ok(t) => (n, t, ProgramOrigin::File(path)),
                    // `validate --offline`: the program is on the host;
                    // the rest of the configuration is still checked.
                    Err(e) if !petrel_core::config::host_checks() => {
                        n.warn(format!(
                            "the VRL program `{path}` was not checked (`--offline`: {e})"
                        ));
                        (n, "true".to_string(), ProgramOrigin::Inline)
                    }
                    Err(e) => {
                        n.error(format!("cannot read the VRL program `{path}`: {e}"));
                        return None;
                    }
                }
            }
            (Some(n), Some(_)) => {
                n.error(
                    "give the program either inline (`source:`) or in a file (`file:`), not both",
                );
                return None;
            }
            (None, None) => {
                map.node().error(
                    "`remap` needs a program: `source: |` followed by VRL, or `file: program.vrl`",
                );
                return None;
            }
        };
        let program = compile(&text, allow_env).map_err(|diags| {
            let file = match &origin {
                ProgramOrigin::Inline => None,
                ProgramOrigin::File(path) => Some(path.as_str()),
            };
            report(&node, &text, file, diags);
        });
        let program = program.ok()?;
        let program_file = match origin {
            ProgramOrigin::File(path) => Some((path, text)),
            ProgramOrigin::Inline => None,
        };
        let reads_metadata = reads_metadata(&program);
        Some(Self {
            program: Arc::new(program),
            reads_metadata,
            drop_on_error,
            drop_on_abort,
            reroute_dropped,
            timezone,
            max_output_bytes,
            max_memory_bytes,
            max_run,
            program_file,
            allow_env,
        })
    }
}

/// True when `program` reads `%`: only then is the metadata object built
/// for its runs.
fn reads_metadata(program: &Program) -> bool {
    program
        .info()
        .target_queries
        .iter()
        .any(|q| q.prefix == PathPrefix::Metadata)
}

/// Reports compile problems of program `text`: at their place in the
/// program file `file`, or in the pipeline file when the program is the
/// inline scalar `node`.
fn report(node: &Node<'_>, text: &str, file: Option<&str>, diags: Vec<CompileProblem>) {
    for d in diags {
        let (line, col, file) = match file {
            None => {
                let (l, c) = file_position(node, text, d.offset);
                (l, c, node.file().clone())
            }
            Some(path) => {
                // The loader names every error by the pipeline file, so
                // the program file's own position goes into the message,
                // reported at the `file:` key.
                let (l, c) = line_col(text, d.offset);
                let (nl, nc) = node.position();
                node.errors().push(ConfigError {
                    file: node.file().clone(),
                    line: nl,
                    col: nc,
                    message: format!("remap: {path}:{l}:{c}: {}", diagnostic(&d)),
                });
                continue;
            }
        };
        node.errors().push(ConfigError {
            file,
            line,
            col,
            message: format!("remap: {}", diagnostic(&d)),
        });
    }
}

/// The text of a compile problem in a configuration error: VRL's own
/// rendering over several lines (as `vector vrl` prints it), or the
/// one-line message when there is none.
fn diagnostic(d: &CompileProblem) -> String {
    if d.rendered.is_empty() {
        d.message.clone()
    } else {
        d.rendered.clone()
    }
}

/// A VRL boolean expression as a condition (`when: {vrl: '.level == "error"'}`):
/// an event matches when the expression is `true`; `false`, an error or
/// an abort do not match. The expression sees the event and `%` as a
/// `remap` program does; what it writes is thrown away.
#[derive(Clone)]
pub struct VrlCondition {
    program: Arc<Program>,
    /// The expression reads `%`: only then is the metadata object built.
    reads_metadata: bool,
}

impl std::fmt::Debug for VrlCondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VrlCondition").finish_non_exhaustive()
    }
}

thread_local! {
    /// One VRL runtime (its variables) per processing thread, for
    /// conditions, which are evaluated one event at a time.
    static CONDITION_RUNTIME: std::cell::RefCell<Runtime> =
        std::cell::RefCell::new(Runtime::new(RuntimeState::default()));
    /// The metadata object of the last source a condition read `%` of:
    /// conditions run event by event, and a batch's events share their
    /// source, so the object is built once per batch rather than per
    /// event. Holding the `Arc` keeps its address from being reused.
    #[allow(clippy::type_complexity)]
    static CONDITION_METADATA: std::cell::RefCell<Option<(Arc<SourceInfo>, MetaView, V, bool)>> =
        const { std::cell::RefCell::new(None) };
}

impl VrlCondition {
    /// Compiles the expression held by the string `node`; it must be of
    /// boolean type. Problems are reported at their place in the file.
    pub fn parse(node: Node<'_>) -> Option<Self> {
        let text = node.as_str()?.to_string();
        let program = match compile(&text, false) {
            Ok(p) => p,
            Err(diags) => {
                report(&node, &text, None, diags);
                return None;
            }
        };
        let kind = program.final_type_info().result.kind().clone();
        if !kind.is_boolean() {
            node.error(format!(
                "a `vrl` condition must be a boolean expression, e.g. `.level == \"error\"`; this one is {kind}"
            ));
            return None;
        }
        let reads_metadata = reads_metadata(&program);
        Some(Self {
            program: Arc::new(program),
            reads_metadata,
        })
    }

    /// True when the expression is `true` for `ev` of `batch`.
    pub fn matches(&self, batch: &EventBatch, ev: &Event) -> bool {
        CONDITION_METADATA.with(|cache| {
            let mut cache = cache.borrow_mut();
            let fresh = match &*cache {
                Some((source, _, _, had_percent)) => {
                    !Arc::ptr_eq(source, &batch.source) || (self.reads_metadata && !had_percent)
                }
                None => true,
            };
            if fresh {
                let percent = if self.reads_metadata {
                    metadata(&batch.source)
                } else {
                    V::Object(ObjectMap::new())
                };
                *cache = Some((
                    batch.source.clone(),
                    MetaView::new(&batch.source),
                    percent,
                    self.reads_metadata,
                ));
            }
            match &*cache {
                Some((source, view, percent, _)) => self.eval(
                    batch,
                    ev,
                    MetaCtx {
                        source,
                        view,
                        percent,
                    },
                ),
                None => false,
            }
        })
    }

    fn eval(&self, batch: &EventBatch, ev: &Event, meta: MetaCtx<'_>) -> bool {
        CONDITION_RUNTIME.with(|rt| {
            let mut rt = rt.borrow_mut();
            rt.clear();
            let mut target = EventTarget::new(&batch.buf, ev, meta);
            matches!(
                rt.resolve(&mut target, &self.program, &TimeZone::Local),
                Ok(V::Boolean(true))
            )
        })
    }
}

/// `rel` relative to the directory of the pipeline file `file`.
fn resolve_path(file: &str, rel: &str) -> String {
    let p = std::path::Path::new(rel);
    if p.is_absolute() {
        return rel.to_string();
    }
    match std::path::Path::new(file).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(p).to_string_lossy().into_owned(),
        _ => rel.to_string(),
    }
}

/// One compile problem: its byte offset in the program and a one-line
/// message with VRL's code, message, labels and notes.
#[derive(Debug)]
pub struct CompileProblem {
    /// Byte offset in the program text.
    pub offset: usize,
    /// What VRL says, on one line.
    pub message: String,
    /// What VRL prints for it: its code and message, then the program's
    /// line with a caret under the column, labels and notes, over several
    /// lines (empty when VRL gave no diagnostic).
    pub rendered: String,
}

/// VRL's code for a call to a function it does not know.
const UNDEFINED_FUNCTION: usize = 105;

/// Compiles `source` with the standard library ([`functions`]); warnings
/// are not errors.
pub fn compile(source: &str, allow_env: bool) -> Result<Program, Vec<CompileProblem>> {
    let fns = functions(allow_env);
    let external = ExternalEnv::default();
    // Some functions check their constant arguments at compile time and
    // panic when that fails (`encode_proto` with a descriptor file it
    // cannot open): a panic is a compile error, not the agent's end.
    let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        vrl::compiler::compile_with_external(source, &fns, &external, CompileConfig::default())
    }));
    let compiled = match compiled {
        Ok(c) => c,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("the VRL compiler failed");
            return Err(vec![CompileProblem {
                offset: 0,
                message: format!("VRL error: {}", what.replace('\n', " ")),
                rendered: String::new(),
            }]);
        }
    };
    match compiled {
        Ok(r) => Ok(r.program),
        Err(list) => Err(list
            .errors()
            .into_iter()
            .map(|d| {
                let primary = d.labels.iter().find(|l| l.primary).or(d.labels.first());
                let offset = primary.map_or(0, |l| l.span.start());
                let mut msg = format!("VRL error[E{:03}]: {}", d.code, d.message);
                for l in &d.labels {
                    if !l.message.is_empty() {
                        msg.push_str(": ");
                        msg.push_str(&l.message);
                    }
                }
                for n in &d.notes {
                    let n = n.to_string();
                    if !n.trim().is_empty() {
                        msg.push_str("; ");
                        msg.push_str(n.trim());
                    }
                }
                let called = primary.and_then(|l| source.get(l.span.start()..l.span.end()));
                let off = ENV_FUNCTIONS.iter().find(|f| {
                    !allow_env && d.code == UNDEFINED_FUNCTION && called == Some(**f)
                });
                // VRL's own rendering, as `vector vrl` prints it: several
                // lines, the program's line with a caret under the column.
                let mut rendered = vrl::diagnostic::Formatter::new(source, vec![(*d).clone()])
                    .to_string()
                    .trim_matches('\n')
                    .to_string();
                if let Some(f) = off {
                    let note = format!(
                        "`{f}` reads the agent's environment, host or files and is off unless the processor sets `allow_env: true`"
                    );
                    msg.push_str("; ");
                    msg.push_str(&note);
                    rendered.push_str("\n  = ");
                    rendered.push_str(&note);
                }
                CompileProblem {
                    offset,
                    message: msg.replace('\n', " "),
                    rendered,
                }
            })
            .collect()),
    }
}

/// 1-based (line, column) of byte `offset` in `text`, the column counted
/// in characters.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, col)
}

/// The position in the pipeline file of byte `offset` of the inline
/// program `text` held by the scalar `node`. The YAML parser places a
/// block scalar (`source: |`) at its first content line and column, and
/// every line of it shares that indentation, so positions map line for
/// line. A one-line scalar maps column for column from its node, one
/// column later when it is quoted (told from the file's text, when it can
/// be read). A multi-line quoted scalar is reported at its start.
fn file_position(node: &Node<'_>, text: &str, offset: usize) -> (usize, usize) {
    let (nline, ncol) = node.position();
    let (pl, pc) = line_col(text, offset);
    let quoted = std::fs::read_to_string(node.file().as_ref())
        .ok()
        .and_then(|t| {
            let line = t.lines().nth(nline.checked_sub(1)?)?;
            line.chars().nth(ncol.checked_sub(1)?)
        })
        .is_some_and(|c| c == '"' || c == '\'');
    if text.trim_end().contains('\n') {
        if quoted {
            return (nline, ncol);
        }
        (nline + pl - 1, ncol + pc - 1)
    } else {
        (nline, ncol + pc - 1 + usize::from(quoted))
    }
}

/// The running processor.
pub struct Remap {
    program: Arc<Program>,
    reads_metadata: bool,
    drop_on_error: bool,
    drop_on_abort: bool,
    reroute_dropped: Option<Arc<str>>,
    timezone: TimeZone,
    max_output_bytes: u64,
    max_memory_bytes: Option<u64>,
    max_run: Duration,
    errors: LazyCounter,
    dropped_error: LazyCounter,
    dropped_abort: LazyCounter,
    dropped_limit: LazyCounter,
    /// Runs over a limit (kept or dropped), logged at most every 10 s.
    limited: LazyCounter,
    id: String,
    last_log: Mutex<Option<Instant>>,
}

/// At most one log line per processor in this interval.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Remap {
    /// Builds it; `metrics` provides the error and discard counters.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            program: c.program.clone(),
            reads_metadata: c.reads_metadata,
            drop_on_error: c.drop_on_error,
            drop_on_abort: c.drop_on_abort,
            reroute_dropped: c.reroute_dropped.clone(),
            timezone: c.timezone,
            max_output_bytes: c.max_output_bytes,
            max_memory_bytes: c.max_memory_bytes,
            max_run: c.max_run,
            errors: metrics.error_counter("remap"),
            dropped_error: metrics.discarded_counter("remap_error"),
            dropped_abort: metrics.discarded_counter("remap_abort"),
            dropped_limit: metrics.discarded_counter("remap_limit"),
            limited: metrics.error_counter("remap_limit"),
            id: metrics.health_key().to_string(),
            last_log: Mutex::new(None),
        })
    }

    /// Sets `ev` aside for the `reroute_dropped` sink, with why it was
    /// dropped; false when there is no such sink (the caller counts the
    /// event as discarded).
    fn reroute(&self, batch: &mut EventBatch, mut ev: Event, reason: &str, message: &str) -> bool {
        let Some(sink) = &self.reroute_dropped else {
            return false;
        };
        let id = self.id.rsplit('/').next().unwrap_or(&self.id);
        let why = Value::Object(vec![
            (Key::from("reason"), Value::Str(reason.into())),
            (Key::from("message"), Value::Str(message.into())),
            (Key::from("component_id"), Value::Str(id.into())),
            (Key::from("component_type"), Value::Str("remap".into())),
        ]);
        ev.set(Key::from("dropped"), why);
        batch.rerouted.push(Rerouted {
            sink: sink.clone(),
            event: ev,
        });
        true
    }

    fn log_error(&self, what: &str, total: u64, kind: &str) {
        let mut last = self.last_log.lock();
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            tracing::warn!("remap {}: {what} ({total} {kind} so far)", self.id);
        }
    }
}

/// What one run did to its event.
pub enum Outcome {
    /// The program wrote nothing: the event stays as it was.
    Unchanged,
    /// These top-level fields were set (`Some`) or deleted (`None`).
    Fields(Vec<(KeyString, Option<V>)>),
    /// The root was replaced or operated on as a whole: this is the new root.
    Root(V),
}

/// What interrupts a run: its working memory or its time over their
/// limits, looked at between two expressions.
struct RunLimits {
    measure: crate::alloc::Measure,
    max_memory: i64,
    deadline: Instant,
    /// Checkpoints since the clock was last read: reading it at each one
    /// would cost more than most expressions.
    ticks: u32,
    hit: Option<String>,
}

impl vrl::compiler::runtime::ExecutionControl for RunLimits {
    fn checkpoint(&mut self) -> std::ops::ControlFlow<()> {
        let live = self.measure.live();
        if live > self.max_memory {
            self.hit = Some(format!(
                "the run held {live} bytes, over max_memory_bytes ({})",
                self.max_memory
            ));
            return std::ops::ControlFlow::Break(());
        }
        self.ticks += 1;
        if self.ticks >= 64 {
            self.ticks = 0;
            if Instant::now() >= self.deadline {
                self.hit = Some("the run took longer than max_run_ms".to_string());
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

impl Processor for Remap {
    fn process(&self, batch: &mut EventBatch) {
        let percent = if self.reads_metadata {
            metadata(&batch.source)
        } else {
            V::Object(ObjectMap::new())
        };
        let source = batch.source.clone();
        let view = MetaView::new(&source);
        let meta = MetaCtx {
            source: &source,
            view: &view,
            percent: &percent,
        };
        // Sized from the pipeline's share of the memory limit (tests and
        // `petrel test` run without a budget: 64 MiB).
        let budget = batch.charge.budget_limit().unwrap_or(64 << 20) as u64;
        let max_memory = self
            .max_memory_bytes
            .unwrap_or((budget / 4).max(MIN_MAX_MEMORY))
            .min(i64::MAX as u64) as i64;
        let mut runtime = Runtime::new(RuntimeState::default());
        let events = std::mem::take(&mut batch.events);
        let mut out = Vec::with_capacity(events.len());
        let (mut errors, mut dropped_error, mut dropped_abort) = (0u64, 0u64, 0u64);
        let (mut limited, mut dropped_limit) = (0u64, 0u64);
        let mut last_error = String::new();
        let mut last_limit = String::new();
        // New data the runs left in this batch's events, charged to the
        // pipeline's budget as it grows.
        let mut batch_output = 0u64;
        for ev in events {
            runtime.clear();
            let mut limits = RunLimits {
                measure: crate::alloc::measure(),
                max_memory,
                deadline: Instant::now() + self.max_run,
                ticks: 0,
                hit: None,
            };
            let result = run_limited(
                &mut runtime,
                &self.program,
                &self.timezone,
                &batch.buf,
                &ev,
                meta,
                &mut limits,
            );
            // The last expression has no checkpoint after it: what it
            // allocated is looked at here.
            let result = match result {
                Ok(_) if limits.measure.live() > max_memory => {
                    limits.hit = Some(format!(
                        "the run held {} bytes, over max_memory_bytes ({max_memory})",
                        limits.measure.live()
                    ));
                    Err(Terminate::Interrupted)
                }
                other => other,
            };
            drop(limits.measure);
            let failure = match result {
                Ok(outcome) => {
                    let size = outcome_size(&outcome, &batch.buf);
                    if size > self.max_output_bytes {
                        Some(format!(
                            "the run would leave {size} bytes of new data in the event, over max_output_bytes ({})",
                            self.max_output_bytes
                        ))
                    } else if batch_output + size > budget {
                        limited += 1;
                        last_limit = format!(
                            "the runs of one batch would leave more than the pipeline's share of --memory-limit ({budget} bytes) of new data"
                        );
                        if self.drop_on_abort {
                            if !self.reroute(batch, ev, "remap_limit", &last_limit) {
                                dropped_limit += 1;
                            }
                        } else {
                            out.push(ev);
                        }
                        continue;
                    } else {
                        batch_output += size;
                        let extra = batch.charge.more(size as usize);
                        batch.charge.merge(extra);
                        apply(&batch.buf, meta, ev, outcome, &mut out);
                        continue;
                    }
                }
                Err(Terminate::Abort(e)) => {
                    if self.drop_on_abort {
                        if !self.reroute(batch, ev, "remap_abort", &e.to_string()) {
                            dropped_abort += 1;
                        }
                    } else {
                        out.push(ev);
                    }
                    continue;
                }
                Err(Terminate::Interrupted) => {
                    limited += 1;
                    last_limit = limits
                        .hit
                        .take()
                        .unwrap_or_else(|| "interrupted".to_string());
                    if self.drop_on_abort {
                        if !self.reroute(batch, ev, "remap_limit", &last_limit) {
                            dropped_limit += 1;
                        }
                    } else {
                        out.push(ev);
                    }
                    continue;
                }
                Err(Terminate::Error(e)) => Some(e.to_string()),
            };
            if let Some(f) = failure {
                errors += 1;
                last_error = f;
                if self.drop_on_error {
                    if !self.reroute(batch, ev, "remap_error", &last_error) {
                        dropped_error += 1;
                    }
                } else {
                    // The overlay is gone: the event is the one read.
                    out.push(ev);
                }
            }
        }
        batch.events = out;
        if errors > 0 {
            let total = self.errors.inc_by(errors) + errors;
            self.log_error(&last_error, total, "runtime errors");
        }
        if limited > 0 {
            let total = self.limited.inc_by(limited) + limited;
            self.log_error(&last_limit, total, "runs over a limit");
        }
        if dropped_error > 0 {
            self.dropped_error.inc_by(dropped_error);
        }
        if dropped_abort > 0 {
            self.dropped_abort.inc_by(dropped_abort);
        }
        if dropped_limit > 0 {
            self.dropped_limit.inc_by(dropped_limit);
        }
    }
}

/// [`run`], interrupted by `limits`.
fn run_limited(
    runtime: &mut Runtime,
    program: &Program,
    timezone: &TimeZone,
    buf: &Bytes,
    ev: &Event,
    meta: MetaCtx<'_>,
    limits: &mut RunLimits,
) -> Result<Outcome, Terminate> {
    let mut target = EventTarget::new(buf, ev, meta);
    runtime.resolve_with_control(&mut target, program, timezone, limits)?;
    Ok(target.into_outcome())
}

/// Runs `program` against `ev` through the adapter; the event is only
/// read: what the program wrote is returned.
pub fn run(
    runtime: &mut Runtime,
    program: &Program,
    timezone: &TimeZone,
    buf: &Bytes,
    ev: &Event,
    meta: MetaCtx<'_>,
) -> Result<Outcome, Terminate> {
    let mut target = EventTarget::new(buf, ev, meta);
    runtime.resolve(&mut target, program, timezone)?;
    Ok(target.into_outcome())
}

/// The source metadata of a batch as the VRL object `%`: dotted names
/// split into objects, except that the key of a label or an annotation
/// (`k8s.labels.app.kubernetes.io/name`) stays one key.
pub fn metadata(source: &SourceInfo) -> V {
    let mut root = ObjectMap::new();
    if !source.path.is_empty() {
        root.insert(
            "file".into(),
            V::Bytes(Bytes::copy_from_slice(source.path.as_bytes())),
        );
    }
    if !source.source_type.is_empty() {
        root.insert(
            "source_type".into(),
            V::Bytes(Bytes::from_static(source.source_type.as_bytes())),
        );
    }
    for (k, v) in source.meta.iter() {
        let k: &str = k;
        let mut parts: Vec<&str> = Vec::with_capacity(3);
        match k.split_once('.') {
            None => parts.push(k),
            Some((a, rest)) => {
                parts.push(a);
                match rest.split_once('.') {
                    Some((b, key)) if b == "labels" || b == "annotations" => {
                        parts.push(b);
                        parts.push(key);
                    }
                    _ => parts.push(rest),
                }
            }
        }
        let path = OwnedValuePath {
            segments: parts.into_iter().map(OwnedSegment::field).collect(),
        };
        let mut obj = V::Object(std::mem::take(&mut root));
        obj.insert(&path, V::Bytes(Bytes::copy_from_slice(v.as_bytes())));
        if let V::Object(m) = obj {
            root = m;
        }
    }
    V::Object(root)
}

/// The batch's metadata as a program sees it in `.`: one top-level field
/// per first segment of the entries' names (`host`, `file`, `k8s`,
/// `container`), dotted names split into objects, a label's or an
/// annotation's key kept whole. Built once per batch; an event that hid
/// some of it, or whose own fields took an entry's place, gets its own
/// value of that group.
#[derive(Debug, Default)]
pub struct MetaView {
    groups: Vec<MetaGroup>,
}

#[derive(Debug)]
struct MetaGroup {
    name: KeyString,
    /// The entry named exactly like the group (`host`), if any.
    exact: Option<usize>,
    /// The entries below it: number and path below the group.
    below: Vec<(usize, Vec<String>)>,
    /// The group's value with every entry as the batch has it.
    value: V,
}

impl MetaView {
    /// The view of `source`'s metadata.
    pub fn new(source: &SourceInfo) -> Self {
        let mut groups: Vec<MetaGroup> = Vec::new();
        for (i, name, text) in source.entries() {
            let segs = petrel_core::schema::segments(name);
            let top = segs[0];
            let gi = match groups.iter().position(|g| g.name.as_str() == top) {
                Some(gi) => gi,
                None => {
                    groups.push(MetaGroup {
                        name: top.into(),
                        exact: None,
                        below: Vec::new(),
                        value: V::Null,
                    });
                    groups.len() - 1
                }
            };
            let g = &mut groups[gi];
            let value = V::Bytes(Bytes::copy_from_slice(text.as_bytes()));
            if segs.len() == 1 {
                g.exact = Some(i);
                g.value = value;
            } else {
                let rel: Vec<String> = segs[1..].iter().map(|s| s.to_string()).collect();
                if !matches!(g.value, V::Object(_)) {
                    g.value = V::Object(ObjectMap::new());
                }
                let path = OwnedValuePath {
                    segments: rel.iter().map(|s| OwnedSegment::field(s)).collect(),
                };
                g.value.insert(&path, value);
                g.below.push((i, rel));
            }
        }
        Self { groups }
    }

    fn find(&self, name: &str) -> Option<(usize, &MetaGroup)> {
        self.groups
            .iter()
            .enumerate()
            .find(|(_, g)| g.name.as_str() == name)
    }

    /// Group `g` as `ev` has it: `None` when the event hid all of it.
    fn value_for(&self, g: &MetaGroup, source: &SourceInfo, ev: &Event, buf: &Bytes) -> Option<V> {
        if let Some(i) = g.exact {
            return (!ev.hidden.contains(i)).then(|| g.value.clone());
        }
        let own_below = |name: &str| ev.get(name);
        let changed = g.below.iter().any(|(i, _)| {
            ev.hidden.contains(*i)
                || source
                    .entry(*i)
                    .is_some_and(|(name, _)| own_below(name).is_some())
        });
        if !changed {
            return Some(g.value.clone());
        }
        let mut v = V::Object(ObjectMap::new());
        let mut any = false;
        for (i, rel) in &g.below {
            let Some((name, text)) = source.entry(*i) else {
                continue;
            };
            let value = match own_below(name) {
                Some(own) => to_vrl(own, buf),
                None if ev.hidden.contains(*i) => continue,
                None => V::Bytes(Bytes::copy_from_slice(text.as_bytes())),
            };
            let path = OwnedValuePath {
                segments: rel.iter().map(|s| OwnedSegment::field(s)).collect(),
            };
            v.insert(&path, value);
            any = true;
        }
        any.then_some(v)
    }
}

/// What a run sees besides its event: the batch's metadata, as `.`'s
/// groups ([`MetaView`]) and as `%`.
#[derive(Debug, Clone, Copy)]
pub struct MetaCtx<'a> {
    /// The batch's metadata entries.
    pub source: &'a SourceInfo,
    /// Their view in `.`.
    pub view: &'a MetaView,
    /// `%`: the metadata as the source set it (read-only in effect).
    pub percent: &'a V,
}

/// The leaves of `obj`, a group's new value, by path below the group: a
/// label's or annotation's key is one leaf whatever its value.
fn leaves(obj: ObjectMap) -> Vec<(Vec<String>, V)> {
    fn walk(prefix: &mut Vec<String>, obj: ObjectMap, out: &mut Vec<(Vec<String>, V)>) {
        for (k, v) in obj {
            let family = prefix.is_empty() && petrel_core::schema::is_family(k.as_str());
            prefix.push(k.into());
            match v {
                V::Object(m) if family => {
                    for (key, x) in m {
                        prefix.push(key.into());
                        out.push((prefix.clone(), x));
                        prefix.pop();
                    }
                }
                V::Object(m) if !m.is_empty() => walk(prefix, m, out),
                other => out.push((prefix.clone(), other)),
            }
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    walk(&mut Vec::new(), obj, &mut out);
    out
}

/// Writes group `g`'s new value `v` (`None`: deleted) back into `ev`:
/// entries left as they were stay the batch's (the fast path of the
/// encoders), changed ones become own fields of the entry's name (which
/// every layout still names as metadata), missing ones are hidden, new
/// ones become own fields named below the group (`k8s.cluster`).
fn write_group(ctx: MetaCtx<'_>, g: &MetaGroup, ev: &mut Event, v: Option<V>, buf: &Bytes) {
    let src = ctx.source;
    let same_text = |v: &V, i: usize| {
        src.entry(i)
            .is_some_and(|(_, t)| matches!(v, V::Bytes(b) if b.as_ref() == t.as_bytes()))
    };
    let Some(v) = v else {
        src.remove(ev, &g.name);
        return;
    };
    if let Some(i) = g.exact {
        if same_text(&v, i) && !ev.hidden.contains(i) {
            ev.remove(&g.name);
        } else {
            src.set(ev, Key::Owned(g.name.to_string()), from_vrl(v, buf));
        }
        return;
    }
    let V::Object(obj) = v else {
        src.set(ev, Key::Owned(g.name.to_string()), from_vrl(v, buf));
        return;
    };
    let mut new = leaves(obj);
    for (i, rel) in &g.below {
        let Some((name, _)) = src.entry(*i) else {
            continue;
        };
        let name = name.to_string();
        match new.iter().position(|(p, _)| p == rel) {
            Some(j) => {
                let (_, leaf) = new.swap_remove(j);
                if same_text(&leaf, *i) {
                    ev.remove(&name);
                    ev.hidden.remove(*i);
                } else {
                    ev.set(Key::Owned(name), from_vrl(leaf, buf));
                    ev.hidden.remove(*i);
                }
            }
            None => {
                ev.remove(&name);
                ev.hidden.insert(*i);
            }
        }
    }
    for (rel, leaf) in new {
        let name = format!("{}.{}", g.name, rel.join("."));
        ev.set(Key::Owned(name), from_vrl(leaf, buf));
    }
}

/// The adapter: VRL's [`Target`] over a Petrel event, which it only reads.
/// See the module documentation.
#[derive(Debug)]
pub struct EventTarget<'a> {
    buf: &'a Bytes,
    ev: &'a Event,
    /// Top-level fields read so far, converted once: index `i` is
    /// `ev.fields[i]`; then the message; then the event time.
    cache: Vec<OnceCell<V>>,
    /// Written top-level fields, in order of their first write.
    overlay: Vec<(KeyString, Option<V>)>,
    /// The root as a whole, once an operation on the root needed it.
    full: Option<V>,
    /// A read-only view of the whole root, built when the program reads
    /// `.` without writing it; dropped at every write.
    root_view: OnceCell<V>,
    /// VRL asks for the root once before running, only to check that
    /// there is one; that first call is answered without building it.
    checked: Cell<bool>,
    ctx: MetaCtx<'a>,
    /// The metadata groups read so far, converted once (same order as
    /// the view's groups).
    groups: Vec<OnceCell<Option<V>>>,
    meta_written: Option<V>,
    secrets: Secrets,
}

/// Answer to VRL's check that the target has a root.
static EMPTY_ROOT: std::sync::LazyLock<V> =
    std::sync::LazyLock::new(|| V::Object(ObjectMap::new()));

impl<'a> EventTarget<'a> {
    /// An adapter over `ev` (whose spans point into `buf`) of a batch
    /// with metadata `ctx`.
    pub fn new(buf: &'a Bytes, ev: &'a Event, ctx: MetaCtx<'a>) -> Self {
        Self {
            buf,
            ev,
            cache: (0..ev.fields.len() + 2).map(|_| OnceCell::new()).collect(),
            overlay: Vec::new(),
            full: None,
            root_view: OnceCell::new(),
            checked: Cell::new(false),
            groups: (0..ctx.view.groups.len())
                .map(|_| OnceCell::new())
                .collect(),
            ctx,
            meta_written: None,
            secrets: Secrets::new(),
        }
    }

    /// What the run wrote.
    pub fn into_outcome(self) -> Outcome {
        match self.full {
            Some(v) => Outcome::Root(v),
            None if self.overlay.is_empty() => Outcome::Unchanged,
            None => Outcome::Fields(self.overlay),
        }
    }

    /// The event's own value of top-level field `name`, converted once.
    fn original(&self, name: &str) -> Option<&V> {
        let n = self.ev.fields.len();
        match name {
            "message" if !matches!(self.ev.message, Value::Null) => {
                Some(self.cache[n].get_or_init(|| to_vrl(&self.ev.message, self.buf)))
            }
            "message" => None,
            "timestamp" if self.ev.time_ns.is_some() => Some(self.cache[n + 1].get_or_init(|| {
                V::Timestamp(chrono::DateTime::from_timestamp_nanos(
                    self.ev.time_ns.unwrap_or_default(),
                ))
            })),
            _ => match self.ev.fields.iter().position(|(k, _)| k == name) {
                Some(i) => {
                    Some(self.cache[i].get_or_init(|| to_vrl(&self.ev.fields[i].1, self.buf)))
                }
                None => {
                    let (gi, g) = self.ctx.view.find(name)?;
                    self.groups[gi]
                        .get_or_init(|| {
                            self.ctx
                                .view
                                .value_for(g, self.ctx.source, self.ev, self.buf)
                        })
                        .as_ref()
                }
            },
        }
    }

    /// The current value of top-level field `name`: written, else the
    /// event's.
    fn current(&self, name: &str) -> Option<&V> {
        match self.overlay.iter().find(|(k, _)| k.as_str() == name) {
            Some((_, v)) => v.as_ref(),
            None => self.original(name),
        }
    }

    /// Names of the event's top-level fields as the program sees them.
    fn original_names(&self) -> Vec<&str> {
        let mut names = Vec::with_capacity(self.ev.fields.len() + 2);
        if !matches!(self.ev.message, Value::Null) {
            names.push("message");
        }
        if self.ev.time_ns.is_some() {
            names.push("timestamp");
        }
        for (k, _) in &self.ev.fields {
            if (k == "timestamp" && self.ev.time_ns.is_some()) || names.contains(&k.as_ref()) {
                continue;
            }
            // An own field that took the place of a dotted entry is seen
            // inside its group.
            if k.contains('.') && self.ctx.source.find(k).is_some() {
                continue;
            }
            names.push(k);
        }
        for g in &self.ctx.view.groups {
            let name = g.name.as_str();
            if !names.contains(&name) && self.original(name).is_some() {
                names.push(name);
            }
        }
        names
    }

    /// The whole root: the event's fields, then what was written.
    fn build_root(&self) -> V {
        let mut map = ObjectMap::new();
        for name in self.original_names() {
            if let Some(v) = self.original(name) {
                map.insert(name.into(), v.clone());
            }
        }
        for (k, v) in &self.overlay {
            match v {
                Some(v) => map.insert(k.clone(), v.clone()),
                None => map.remove(k),
            };
        }
        V::Object(map)
    }

    /// Switches this run to a whole root and returns it.
    fn full_mut(&mut self) -> &mut V {
        if self.full.is_none() {
            let root = self.build_root();
            self.full = Some(root);
            self.overlay.clear();
        }
        self.root_view = OnceCell::new();
        self.full.get_or_insert_with(|| V::Object(ObjectMap::new()))
    }

    /// Moves top-level field `name` into the overlay (converted) and
    /// returns its slot.
    fn slot(&mut self, name: &KeyString) -> &mut Option<V> {
        self.root_view = OnceCell::new();
        let i = match self.overlay.iter().position(|(k, _)| k == name) {
            Some(i) => i,
            None => {
                let v = self.original(name.as_str()).cloned();
                self.overlay.push((name.clone(), v));
                self.overlay.len() - 1
            }
        };
        &mut self.overlay[i].1
    }
}

/// The first segment of `path` when it is a field name, and the rest.
fn split_field(path: &OwnedValuePath) -> Option<(&KeyString, OwnedValuePath)> {
    match path.segments.first() {
        Some(OwnedSegment::Field(name)) => Some((
            name,
            OwnedValuePath {
                segments: path.segments[1..].to_vec(),
            },
        )),
        _ => None,
    }
}

impl Target for EventTarget<'_> {
    fn target_insert(&mut self, path: &OwnedTargetPath, value: V) -> Result<(), String> {
        if path.prefix == PathPrefix::Metadata {
            let meta = self
                .meta_written
                .get_or_insert_with(|| self.ctx.percent.clone());
            meta.insert(&path.path, value);
            return Ok(());
        }
        if self.full.is_some() {
            self.full_mut().insert(&path.path, value);
            return Ok(());
        }
        match split_field(&path.path) {
            Some((name, rest)) if rest.is_root() => {
                *self.slot(name) = Some(value);
            }
            Some((name, rest)) => {
                let slot = self.slot(name);
                let mut v = slot.take().unwrap_or(V::Null);
                v.insert(&rest, value);
                *slot = Some(v);
            }
            None => {
                self.full_mut().insert(&path.path, value);
            }
        }
        Ok(())
    }

    fn target_get(&self, path: &OwnedTargetPath) -> Result<Option<&V>, String> {
        if path.prefix == PathPrefix::Metadata {
            let meta = self.meta_written.as_ref().unwrap_or(self.ctx.percent);
            return Ok(meta.get(&path.path));
        }
        if let Some(full) = &self.full {
            return Ok(full.get(&path.path));
        }
        match split_field(&path.path) {
            Some((name, rest)) => Ok(self.current(name.as_str()).and_then(|v| v.get(&rest))),
            None if path.path.is_root() && !self.checked.get() => {
                // `Runtime::resolve` asks for the root before running the
                // program, only to see that there is one (vrl 0.38); the
                // program's own reads of `.` come after.
                self.checked.set(true);
                Ok(Some(&*EMPTY_ROOT))
            }
            None => Ok(self
                .root_view
                .get_or_init(|| self.build_root())
                .get(&path.path)),
        }
    }

    fn target_get_mut(&mut self, path: &OwnedTargetPath) -> Result<Option<&mut V>, String> {
        if path.prefix == PathPrefix::Metadata {
            let meta = self
                .meta_written
                .get_or_insert_with(|| self.ctx.percent.clone());
            return Ok(meta.get_mut(&path.path));
        }
        if self.full.is_some() {
            return Ok(self.full_mut().get_mut(&path.path));
        }
        match split_field(&path.path) {
            Some((name, rest)) => {
                if self
                    .current(name.as_str())
                    .and_then(|v| v.get(&rest))
                    .is_none()
                {
                    return Ok(None);
                }
                Ok(self.slot(name).as_mut().and_then(|v| v.get_mut(&rest)))
            }
            None => Ok(self.full_mut().get_mut(&path.path)),
        }
    }

    fn target_remove(
        &mut self,
        path: &OwnedTargetPath,
        compact: bool,
    ) -> Result<Option<V>, String> {
        if path.prefix == PathPrefix::Metadata {
            let meta = self
                .meta_written
                .get_or_insert_with(|| self.ctx.percent.clone());
            return Ok(meta.remove(&path.path, compact));
        }
        if self.full.is_some() {
            return Ok(self.full_mut().remove(&path.path, compact));
        }
        match split_field(&path.path) {
            Some((name, rest)) => {
                if self
                    .current(name.as_str())
                    .and_then(|v| v.get(&rest))
                    .is_none()
                {
                    return Ok(None);
                }
                if rest.is_root() {
                    return Ok(self.slot(name).take());
                }
                let slot = self.slot(name);
                let removed = slot.as_mut().and_then(|v| v.remove(&rest, compact));
                let emptied = match slot {
                    Some(V::Object(m)) => m.is_empty(),
                    Some(V::Array(a)) => a.is_empty(),
                    _ => false,
                };
                if compact && emptied {
                    *slot = None;
                }
                Ok(removed)
            }
            None => Ok(self.full_mut().remove(&path.path, compact)),
        }
    }
}

impl SecretTarget for EventTarget<'_> {
    fn get_secret(&self, key: &str) -> Option<&str> {
        self.secrets.get_secret(key)
    }

    fn insert_secret(&mut self, key: &str, value: &str) {
        self.secrets.insert_secret(key, value);
    }

    fn remove_secret(&mut self, key: &str) {
        self.secrets.remove_secret(key);
    }
}

/// A Petrel value as a VRL value; text of the buffer becomes a slice of it.
pub fn to_vrl(v: &Value, buf: &Bytes) -> V {
    match v {
        Value::Span(s) => {
            let end = s.end().min(buf.len());
            let start = (s.start as usize).min(end);
            V::Bytes(buf.slice(start..end))
        }
        Value::Str(s) => V::Bytes(Bytes::copy_from_slice(s.as_bytes())),
        Value::Bytes(b) => V::Bytes(Bytes::copy_from_slice(b)),
        Value::Int(i) => V::Integer(*i),
        Value::Float(f) if f.is_nan() => V::Null,
        Value::Float(f) => V::from_f64_or_zero(*f),
        Value::Bool(b) => V::Boolean(*b),
        Value::Null => V::Null,
        Value::Array(a) => V::Array(a.iter().map(|x| to_vrl(x, buf)).collect()),
        Value::Object(o) => {
            let mut m = ObjectMap::new();
            for (k, x) in o {
                m.insert(k.as_ref().into(), to_vrl(x, buf));
            }
            V::Object(m)
        }
    }
}

/// A VRL value as a Petrel value; bytes that are a slice of `buf` become a
/// span again (no copy, and the event keeps its place in the stream).
pub fn from_vrl(v: V, buf: &Bytes) -> Value {
    match v {
        V::Bytes(b) => {
            if let Some(span) = span_in(&b, buf) {
                return Value::Span(span);
            }
            match String::from_utf8(b.to_vec()) {
                Ok(s) => Value::Str(s.into_boxed_str()),
                Err(e) => Value::Bytes(e.into_bytes().into_boxed_slice()),
            }
        }
        V::String(s) => from_vrl(V::Bytes(s.into_bytes()), buf),
        V::Regex(r) => Value::Str(r.as_str().into()),
        V::Integer(i) => Value::Int(i),
        V::Float(f) => Value::Float(f.into_inner()),
        V::Boolean(b) => Value::Bool(b),
        V::Timestamp(t) => Value::Str(
            t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
                .into_boxed_str(),
        ),
        V::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| (Key::Owned(k.into()), from_vrl(x, buf)))
                .collect(),
        ),
        V::Array(a) => Value::Array(a.into_iter().map(|x| from_vrl(x, buf)).collect()),
        V::Null => Value::Null,
    }
}

/// The span of `buf` that `b` is a slice of, if it is one.
fn span_in(b: &Bytes, buf: &Bytes) -> Option<Span> {
    if b.is_empty() {
        return None;
    }
    let base = buf.as_ptr() as usize;
    let p = b.as_ptr() as usize;
    let start = p.checked_sub(base)?;
    (start + b.len() <= buf.len()).then(|| Span::new(start, b.len()))
}

/// Bytes of new data in `v`: text outside `buf`, keys, 8 per scalar.
fn vrl_size(v: &V, buf: &Bytes) -> u64 {
    match v {
        V::Bytes(b) if span_in(b, buf).is_some() => 8,
        V::Bytes(b) => b.len() as u64,
        V::String(s) => vrl_size(&V::Bytes(s.as_bytes().clone()), buf),
        V::Object(m) => m
            .iter()
            .map(|(k, x)| k.len() as u64 + vrl_size(x, buf))
            .sum(),
        V::Array(a) => a.iter().map(|x| vrl_size(x, buf)).sum(),
        _ => 8,
    }
}

fn outcome_size(o: &Outcome, buf: &Bytes) -> u64 {
    match o {
        Outcome::Unchanged => 0,
        Outcome::Fields(f) => f
            .iter()
            .map(|(k, v)| k.len() as u64 + v.as_ref().map_or(0, |v| vrl_size(v, buf)))
            .sum(),
        Outcome::Root(v) => vrl_size(v, buf),
    }
}

/// Writes top-level field `name` of `ev` (message and event time
/// included); `None` deletes it. A name that is a group of the batch's
/// metadata (and not an own field of the event) is written back into the
/// metadata ([`write_group`]).
fn set_top(ctx: MetaCtx<'_>, ev: &mut Event, name: KeyString, v: Option<V>, buf: &Bytes) {
    if let Some((_, g)) = ctx.view.find(name.as_str()) {
        if ev.get(name.as_str()).is_none() {
            write_group(ctx, g, ev, v, buf);
            return;
        }
    }
    match name.as_str() {
        "message" => ev.message = v.map_or(Value::Null, |v| from_vrl(v, buf)),
        "timestamp" => {
            ev.remove("timestamp");
            ev.time_ns = None;
            match v {
                Some(V::Timestamp(t)) if t.timestamp_nanos_opt().is_some() => {
                    ev.time_ns = t.timestamp_nanos_opt();
                }
                Some(v) => ev.fields.push(("timestamp".into(), from_vrl(v, buf))),
                None => {}
            }
        }
        _ => match v {
            Some(v) => ev.set(Key::Owned(name.into()), from_vrl(v, buf)),
            None => {
                ev.remove(name.as_str());
            }
        },
    }
}

/// Puts the outcome of a run on `ev` (of a batch with metadata `ctx`)
/// and pushes the resulting event(s).
pub fn apply(buf: &Bytes, ctx: MetaCtx<'_>, mut ev: Event, outcome: Outcome, out: &mut Vec<Event>) {
    match outcome {
        Outcome::Unchanged => out.push(ev),
        Outcome::Fields(fields) => {
            for (k, v) in fields {
                set_top(ctx, &mut ev, k, v, buf);
            }
            out.push(ev);
        }
        Outcome::Root(V::Array(items)) => {
            for item in items {
                let mut e = Event::new(Value::Null);
                match item {
                    V::Object(m) => replace_root(ctx, &mut e, m, buf),
                    other => {
                        // Only the message: none of the metadata.
                        for g in &ctx.view.groups {
                            ctx.source.remove(&mut e, &g.name);
                        }
                        e.message = from_vrl(other, buf);
                    }
                }
                out.push(e);
            }
        }
        Outcome::Root(V::Object(m)) => {
            replace_root(ctx, &mut ev, m, buf);
            out.push(ev);
        }
        Outcome::Root(other) => {
            // `. = "text"`: the event becomes that message alone, without
            // its metadata.
            ev.fields.clear();
            ev.time_ns = None;
            for g in &ctx.view.groups {
                ctx.source.remove(&mut ev, &g.name);
            }
            ev.message = from_vrl(other, buf);
            out.push(ev);
        }
    }
}

/// Makes `ev` the object `m`: fields still present keep their place (and
/// their original value when equal), new ones follow in name order.
fn replace_root(ctx: MetaCtx<'_>, ev: &mut Event, mut m: ObjectMap, buf: &Bytes) {
    // The metadata groups the event showed (not replaced by an own field
    // of the same name) are written back on their own.
    let groups: Vec<(&MetaGroup, Option<V>)> = ctx
        .view
        .groups
        .iter()
        .filter(|g| ev.get(g.name.as_str()).is_none())
        .map(|g| (g, m.remove(g.name.as_str())))
        .collect();
    let message = m.remove("message");
    let timestamp = m.remove("timestamp");
    let keep_time = match (&timestamp, ev.time_ns) {
        (Some(V::Timestamp(t)), Some(ns)) => t.timestamp_nanos_opt() == Some(ns),
        _ => false,
    };
    let old = std::mem::take(&mut ev.fields);
    let mut fields: Vec<(Key, Value)> = Vec::with_capacity(old.len() + m.len());
    for (k, v) in old {
        if k == "timestamp" {
            continue;
        }
        // In place of a dotted entry: its group decides below.
        if k.contains('.') && ctx.source.find(&k).is_some() {
            fields.push((k, v));
            continue;
        }
        if let Some(nv) = m.remove(k.as_ref()) {
            if to_vrl(&v, buf) == nv {
                fields.push((k, v));
            } else {
                fields.push((k, from_vrl(nv, buf)));
            }
        }
    }
    for (k, v) in m {
        fields.push((Key::Owned(k.into()), from_vrl(v, buf)));
    }
    ev.fields = fields;
    match message {
        Some(nv) if to_vrl(&ev.message, buf) == nv => {}
        Some(nv) => ev.message = from_vrl(nv, buf),
        None => ev.message = Value::Null,
    }
    if !keep_time {
        set_top(ctx, ev, "timestamp".into(), timestamp, buf);
    }
    for (g, v) in groups {
        write_group(ctx, g, ev, v, buf);
    }
}

/// Registration of `type: remap`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "remap",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn uses_env(&self) -> bool {
        self.allow_env
    }

    fn type_name(&self) -> &'static str {
        "remap"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Box<dyn Processor>> {
        Ok(Box::new(Remap::new(self, metrics)?))
    }

    fn file_input(&self) -> Option<(&str, &str)> {
        self.program_file
            .as_ref()
            .map(|(path, text)| (path.as_str(), text.as_str()))
    }
}

/// The event as the VRL object a program sees as `.` (message, event time,
/// fields), for tests and comparisons.
pub fn event_to_vrl(ev: &Event, buf: &Bytes) -> V {
    let meta = V::Object(ObjectMap::new());
    let source = SourceInfo::default();
    let view = MetaView::default();
    EventTarget::new(
        buf,
        ev,
        MetaCtx {
            source: &source,
            view: &view,
            percent: &meta,
        },
    )
    .build_root()
}

/// An event made of the VRL object `m` (the inverse of [`event_to_vrl`]).
pub fn event_from_vrl(m: ObjectMap, buf: &Bytes) -> Event {
    let mut ev = Event::new(Value::Null);
    let meta = V::Object(ObjectMap::new());
    let source = SourceInfo::default();
    let view = MetaView::default();
    let ctx = MetaCtx {
        source: &source,
        view: &view,
        percent: &meta,
    };
    replace_root(ctx, &mut ev, m, buf);
    ev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::fields::test_support::{batch_of, cfg_errors, metrics, parse_cfg};
    use vrl::compiler::TargetValue;

    fn remap(yaml: &str) -> (Remap, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (Remap::new(&c, m.clone()).unwrap(), m)
    }

    fn program(src: &str) -> String {
        let mut y = String::from("type: remap\ntimezone: UTC\nsource: |\n");
        for l in src.lines() {
            y.push_str("  ");
            y.push_str(l);
            y.push('\n');
        }
        y
    }

    fn json_of(b: &EventBatch, i: usize) -> String {
        let v = event_to_vrl(&b.events[i], &b.buf);
        serde_json::to_string(&v).unwrap()
    }

    #[test]
    fn unchanged_event_is_untouched_and_reads_are_lazy() {
        let (r, m) = remap(&program("x = .message\nif x == \"nope\" { .a = 1 }"));
        let mut b = batch_of(&["hello", "nope"]);
        let before = b.events[0].clone();
        r.process(&mut b);
        assert_eq!(b.events[0], before);
        assert_eq!(b.events[1].get("a"), Some(&Value::Int(1)));
        // The message was not rewritten: still the span of the buffer.
        assert!(matches!(b.events[1].message, Value::Span(_)));
        assert!(!m.metrics().render().contains("error_type=\"remap\""));
    }

    #[test]
    fn nested_assignment_merge_and_upcase() {
        let (r, _) = remap(&program(
            ". = merge(., object!(parse_json!(.message)))\n.level = upcase!(.level)\n.http.status = 200\ndel(.drop)",
        ));
        let mut b = batch_of(&[r#"{"level":"info","drop":1,"n":2}"#]);
        r.process(&mut b);
        assert_eq!(
            json_of(&b, 0),
            r#"{"http":{"status":200},"level":"INFO","message":"{\"level\":\"info\",\"drop\":1,\"n\":2}","n":2}"#
        );
        // The message is still the span it was.
        assert!(matches!(b.events[0].message, Value::Span(_)));
    }

    #[test]
    /// Stable event ids (elasticsearch `id: auto`) come from
    /// `event_origin`; a program that leaves the message in place, even
    /// one that replaces the root, keeps them.
    fn event_origin_survives_programs_that_leave_the_message() {
        for src in [
            ".level = \"INFO\"",
            ". = merge(., object!(parse_json!(.message)))\n.level = upcase!(.level)",
            "del(.nothing)\n.n = 1",
        ] {
            let (r, _) = remap(&program(src));
            let mut b = batch_of(&["{\"level\":\"info\"}", "{\"level\":\"warn\"}"]);
            b.origin = Some(petrel_core::Origin {
                stream: 42,
                base: 1000,
                starts: None,
                per_record: false,
            });
            let before: Vec<_> = b.events.iter().map(|e| b.event_origin(e)).collect();
            assert!(before.iter().all(Option::is_some));
            r.process(&mut b);
            let after: Vec<_> = b.events.iter().map(|e| b.event_origin(e)).collect();
            assert_eq!(before, after, "{src}");
        }
    }

    #[test]
    fn moved_message_stays_a_span() {
        let (r, _) = remap(&program(".original = .message\n.message = \"x\""));
        let mut b = batch_of(&["abc"]);
        r.process(&mut b);
        assert!(matches!(b.events[0].get("original"), Some(Value::Span(_))));
        assert_eq!(b.events[0].message, Value::Str("x".into()));
    }

    #[test]
    fn abort_and_errors_follow_the_keys() {
        let src = "if .message == \"a\" { abort }\n.n = to_int!(.message)";
        let (r, m) = remap(&program(src));
        let mut b = batch_of(&["a", "zz", "7"]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 2);
        assert_eq!(json_of(&b, 0), r#"{"message":"zz"}"#);
        assert_eq!(json_of(&b, 1), r#"{"message":"7","n":7}"#);
        let text = m.metrics().render();
        assert!(text.contains("reason=\"remap_abort\"} 1"), "{text}");
        assert!(text.contains("error_type=\"remap\"} 1"), "{text}");

        let mut y = program(src);
        y.push_str("drop_on_error: true\ndrop_on_abort: false\n");
        let (r, m) = remap(&y);
        let mut b = batch_of(&["a", "zz", "7"]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 2);
        assert_eq!(json_of(&b, 0), r#"{"message":"a"}"#);
        let text = m.metrics().render();
        assert!(text.contains("reason=\"remap_error\"} 1"), "{text}");
    }

    #[test]
    fn array_root_emits_one_event_each() {
        let (r, _) = remap(&program(
            ". = [{\"message\": \"a\", \"k\": 1}, {\"message\": \"b\"}]",
        ));
        let mut b = batch_of(&["x", "y"]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 4);
        assert_eq!(json_of(&b, 0), r#"{"k":1,"message":"a"}"#);
        assert_eq!(json_of(&b, 3), r#"{"message":"b"}"#);
    }

    #[test]
    fn metadata_and_timestamp() {
        let (r, _) = remap(&program(
            ".f = %file\n.t = %source_type\n.timestamp = parse_timestamp!(\"2024-01-02T03:04:05Z\", \"%+\")",
        ));
        let mut b = batch_of(&["x"]);
        r.process(&mut b);
        assert_eq!(b.events[0].time_ns, Some(1_704_164_645_000_000_000));
        assert_eq!(
            b.bytes_of(b.events[0].get("f").unwrap()),
            Some(&b"/var/log/t.log"[..])
        );
        let mut si = SourceInfo::file(
            "/p",
            Arc::from(vec![
                (Key::from("k8s.namespace"), Arc::from("ns")),
                (
                    Key::from("k8s.annotations.petrel.dev/parser"),
                    Arc::from("json"),
                ),
            ]),
        );
        si.source_type = "kubernetes";
        let m = metadata(&si);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"file":"/p","k8s":{"annotations":{"petrel.dev/parser":"json"},"namespace":"ns"},"source_type":"kubernetes"}"#
        );
    }

    #[test]
    fn output_bound_and_bad_input() {
        let mut y = program("s = string!(.message)\n.big = s + s + s");
        y.push_str("max_output_bytes: 1KiB\n");
        let (r, m) = remap(&y);
        let big = "x".repeat(1000);
        let mut b = batch_of(&[&big, "small"]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 2);
        assert!(b.events[0].get("big").is_none());
        assert!(b.events[1].get("big").is_some());
        assert!(m.metrics().render().contains("error_type=\"remap\"} 1"));

        // Non-UTF-8 message: parse_json fails, counted, event kept.
        let (r, m) = remap(&program(". = merge(., object!(parse_json!(.message)))"));
        let mut b = crate::processors::fields::test_support::batch_raw(b"\xff{\n", &[(0, 2)]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 1);
        assert!(m.metrics().render().contains("error_type=\"remap\"} 1"));
    }

    #[test]
    fn a_run_over_its_memory_limit_is_interrupted_and_the_batch_goes_on() {
        // Doubles a 2,000-element array ten times: 2 M values, far over a
        // 1 MiB limit, unless the message is short.
        let doubling = "a = split(string!(.message), \"\")\n".to_string()
            + &"a = append(a, a)\n".repeat(10)
            + ".n = length(a)";
        let mut y = program(&doubling);
        y.push_str("max_memory_bytes: 1MiB\n");
        let (r, m) = remap(&y);
        let long = "x".repeat(2000);
        let mut b = batch_of(&["ab", &long, "cd"]);
        r.process(&mut b);
        // The long one dropped (drop_on_abort), the others done.
        assert_eq!(b.events.len(), 2);
        assert!(b.events.iter().all(|e| e.get("n").is_some()));
        let text = m.metrics().render();
        assert!(text.contains("reason=\"remap_limit\"} 1"), "{text}");
        assert!(text.contains("error_type=\"remap_limit\"} 1"), "{text}");

        // Kept unchanged when aborts are not dropped.
        y.push_str("drop_on_abort: false\n");
        let (r, _) = remap(&y);
        let mut b = batch_of(&[&long]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 1);
        assert!(b.events[0].get("n").is_none());
    }

    #[test]
    fn the_new_data_of_a_batch_is_charged_and_bounded_by_the_pipeline_budget() {
        // Each run leaves about 40 KB; a 256 KiB pipeline budget takes a
        // few events' worth, the rest of the batch is over the limit.
        let doubling =
            "s = string!(.message)\n".to_string() + &"s = s + s\n".repeat(10) + ".big = s";
        let (r, m) = remap(&program(&doubling));
        let line = "y".repeat(40);
        let lines: Vec<&str> = (0..20).map(|_| line.as_str()).collect();
        let mut b = batch_of(&lines);
        let budget =
            petrel_core::PipelineBudget::new(petrel_core::MemoryBudget::new(1 << 20), 256 << 10);
        b.charge = budget.charge_held(1024);
        r.process(&mut b);
        let kept = b.events.len();
        assert!((3..20).contains(&kept), "{kept} of 20 events kept");
        assert!(b.events.iter().all(|e| e.get("big").is_some()));
        // What was kept is charged to the budget, with the batch.
        assert!(
            budget.used() >= kept * 40_000,
            "{} bytes charged",
            budget.used()
        );
        let text = m.metrics().render();
        assert!(
            text.contains(&format!("reason=\"remap_limit\"}} {}", 20 - kept)),
            "{text}"
        );
        drop(b);
        assert_eq!(budget.used(), 0, "released with the batch");
    }

    #[test]
    fn a_run_over_its_time_limit_is_interrupted() {
        // 3,000 hashes of 512 bytes each: several milliseconds, far past
        // a 1 ms limit, in a constant amount of memory.
        let slow = "s = string!(.message)\n".to_string()
            + &"s = sha3(s + s + s + s)\n".repeat(3000)
            + ".s = s";
        let mut y = program(&slow);
        y.push_str("max_run_ms: 1\nmax_memory_bytes: 1GiB\n");
        let (r, m) = remap(&y);
        let mut b = batch_of(&[&"y".repeat(4000)]);
        r.process(&mut b);
        assert_eq!(b.events.len(), 0);
        let text = m.metrics().render();
        assert!(text.contains("reason=\"remap_limit\"} 1"), "{text}");
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors(
            "type: remap\nsource: |\n  .a = parse_json(.message)\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].starts_with("t.yaml:3:"), "{errs:?}");
        assert!(errs[0].contains("E103"), "{errs:?}");
        // As VRL prints it: the program's line, the caret under the
        // expression, the hint.
        assert!(
            errs[0].contains("1 │ .a = parse_json(.message)\n  │ ---- ^^^^^^^^^^^^^^^^^^^^"),
            "{errs:?}"
        );
        assert!(errs[0].contains("parse_json!(.message)"), "{errs:?}");
        let errs = cfg_errors("type: remap\nsource: \".a = (\"\n", KEYS, Config::parse);
        assert!(errs[0].starts_with("t.yaml:2:"), "{errs:?}");
        let errs = cfg_errors(
            "type: remap\nsource: .a = get_env_var!(\"HOME\")\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].contains("allow_env: true"), "{errs:?}");
        parse_cfg(
            "type: remap\nallow_env: true\nsource: .a = get_env_var!(\"HOME\")\n",
            KEYS,
            Config::parse,
        )
        .unwrap();
        let errs = cfg_errors("type: remap\n", KEYS, Config::parse);
        assert!(errs[0].contains("needs a program"), "{errs:?}");
        let errs = cfg_errors("type: remap\nfile: /nonexistent.vrl\n", KEYS, Config::parse);
        assert!(errs[0].contains("cannot read"), "{errs:?}");
    }

    /// Examples left out of the differential test, with the reason.
    const EXCLUDED: &[(&str, &str)] = &[];

    /// Every example of every standard-library function, run through the
    /// adapter and through VRL's own `TargetValue`: same result, same
    /// target (both seen through Petrel's event model).
    #[test]
    fn differential_against_target_value() {
        let fns = functions(true);
        let tz = TimeZone::parse("UTC").unwrap();
        let empty = Bytes::new();
        let (mut total, mut passed, mut excluded) = (0usize, 0usize, Vec::new());
        let mut failures = Vec::new();
        for f in &fns {
            for ex in f.examples() {
                let name = format!("{}: {}", f.identifier(), ex.title);
                if let Some((_, why)) = EXCLUDED.iter().find(|(n, _)| *n == name) {
                    excluded.push(format!("{name} ({why})"));
                    continue;
                }
                if ["parse_proto", "encode_proto"].contains(&f.identifier()) {
                    excluded.push(format!(
                        "{name} (reads a descriptor file from VRL's own repository)"
                    ));
                    continue;
                }
                if ex.skip {
                    excluded.push(format!(
                        "{name} (VRL marks it compile-only: external resources)"
                    ));
                    continue;
                }
                total += 1;
                let program = match vrl::compiler::compile(ex.source, &fns) {
                    Ok(r) => r.program,
                    Err(_) => {
                        // The adapter plays no part in a compile error.
                        excluded.push(format!("{name} (does not compile)"));
                        total -= 1;
                        continue;
                    }
                };
                let input: V = match ex.input {
                    Some(j) => serde_json::from_str::<serde_json::Value>(j).unwrap().into(),
                    None => V::Object(ObjectMap::new()),
                };
                let V::Object(input_map) = input.clone() else {
                    excluded.push(format!("{name} (input is not an object)"));
                    total -= 1;
                    continue;
                };
                // Reference.
                let mut reference = TargetValue {
                    value: input.clone(),
                    metadata: V::Object(ObjectMap::new()),
                    secrets: Secrets::new(),
                };
                reference.insert_secret("my_secret", "secret value");
                reference.insert_secret("datadog_api_key", "secret value");
                let r1 =
                    Runtime::new(RuntimeState::default()).resolve(&mut reference, &program, &tz);
                // Adapter, over an event made of the same object.
                let ev = event_from_vrl(input_map, &empty);
                let meta = V::Object(ObjectMap::new());
                let source = SourceInfo::default();
                let view = MetaView::default();
                let ctx = MetaCtx {
                    source: &source,
                    view: &view,
                    percent: &meta,
                };
                let mut target = EventTarget::new(&empty, &ev, ctx);
                target.insert_secret("my_secret", "secret value");
                target.insert_secret("datadog_api_key", "secret value");
                let r2 = Runtime::new(RuntimeState::default()).resolve(&mut target, &program, &tz);
                let outcome = target.into_outcome();
                let ok = match (&r1, &r2) {
                    (Ok(a), Ok(b)) if !ex.deterministic => a.kind_str() == b.kind_str(),
                    (Ok(a), Ok(b)) => {
                        let mut out = Vec::new();
                        apply(&empty, ctx, ev.clone(), outcome, &mut out);
                        let got: Vec<V> = out.iter().map(|e| event_to_vrl(e, &empty)).collect();
                        let want: Vec<V> = match reference.value.clone() {
                            V::Array(items) => items
                                .into_iter()
                                .map(|i| match i {
                                    V::Object(m) => {
                                        event_to_vrl(&event_from_vrl(m, &empty), &empty)
                                    }
                                    other => other,
                                })
                                .collect(),
                            V::Object(m) => vec![event_to_vrl(&event_from_vrl(m, &empty), &empty)],
                            other => vec![other],
                        };
                        let same_target = got.len() == want.len()
                            && got.iter().zip(&want).all(|(g, w)| match (g, w) {
                                (V::Object(gm), w) if !matches!(w, V::Object(_)) => {
                                    gm.len() == 1
                                        && gm
                                            .get("message")
                                            .map(|m| to_vrl(&from_vrl(m.clone(), &empty), &empty))
                                            == Some(to_vrl(&from_vrl(w.clone(), &empty), &empty))
                                }
                                _ => g == w,
                            });
                        if !same_target {
                            failures.push(format!("{name}: target {got:?} != {want:?}"));
                        }
                        a == b && same_target
                    }
                    (Err(a), Err(b)) => a.to_string() == b.to_string(),
                    _ => false,
                };
                if ok {
                    passed += 1;
                } else {
                    failures.push(format!("{name}: {r1:?} != {r2:?}"));
                }
            }
        }
        let rate = passed as f64 / total as f64;
        eprintln!(
            "differential: {passed}/{total} passed ({:.2} %), {} excluded:\n  {}\nfailures:\n  {}",
            rate * 100.0,
            excluded.len(),
            excluded.join("\n  "),
            failures.join("\n  ")
        );
        assert!(total > 300, "only {total} examples");
        assert!(rate >= 0.99, "{failures:#?}");
    }
}
