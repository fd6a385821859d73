//! `petrel test`: pipeline unit tests for operators' CI.
//!
//! A test file (`*.test.yaml`) feeds input lines to a pipeline of the
//! configuration and checks the events coming out of one of its components.
//! The pipeline is loaded by the same loader as `petrel run`, and its
//! processor chain is built through the plugin registry exactly as the
//! topology builds it ([`crate::topology::build_processors`]), then run
//! in-process on one batch. Sources and sinks are never started: the lines
//! stand for what the source decoded, and "at a sink" means the batch the
//! sinks would receive.
//!
//! ```yaml
//! pipeline: nginx-kafka          # optional when the config has one pipeline
//! tests:
//!   - name: a request becomes fields
//!     input:
//!       - '203.0.113.7 - - [23/Nov/2026:10:02:06 +0000] "GET / HTTP/1.1" 200 5 "-" "curl/8"'
//!     meta: {kafka.topic: web}   # optional: the input's source metadata
//!     at: combined               # a source, processor or sink id; default: the sinks' input
//!     expect:
//!       count: 1
//!       dropped: { filtered: 0 }
//!       events:
//!         - equals: { client: 203.0.113.7, status: "200" }
//!           matches: { user_agent: '^curl/' }
//!           absent: [parse_error]
//! ```
//!
//! Exit status: 0 when every test passes, 1 when an assertion fails, 2 when
//! the configuration or a test file is invalid.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use petrel_core::config::{closest, parse_yaml, ConfigError, ConfigErrors, Node};
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::{Event, EventBatch, Key, Metrics, SourceInfo, Span};

use crate::config::{self, PipelineConfig};
use crate::topology;

/// What `petrel test` was asked to do.
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// The pipeline file or directory (`--config`).
    pub config: PathBuf,
    /// Test files or directories of them; empty: those next to the config.
    pub tests: Vec<PathBuf>,
    /// Where to write a JUnit XML report.
    pub junit: Option<PathBuf>,
}

/// Exit status: every test passed.
pub const EXIT_PASS: u8 = 0;
/// Exit status: at least one assertion failed.
pub const EXIT_FAIL: u8 = 1;
/// Exit status: the configuration or a test file is invalid.
pub const EXIT_INVALID: u8 = 2;

const FILE_KEYS: &[&str] = &["pipeline", "tests"];
const CASE_KEYS: &[&str] = &["name", "input", "file", "meta", "at", "expect"];
const EXPECT_KEYS: &[&str] = &["count", "dropped", "events"];
const EVENT_KEYS: &[&str] = &["equals", "matches", "absent"];

/// Where the events are looked at: after this many processors of the chain.
#[derive(Debug, Clone)]
struct At {
    processors: usize,
    shown: String,
}

#[derive(Debug, Default)]
struct EventExpect {
    equals: Vec<(String, String)>,
    matches: Vec<(String, regex::Regex)>,
    absent: Vec<String>,
}

#[derive(Debug)]
struct Case {
    name: String,
    input: Vec<String>,
    file: String,
    /// Source metadata of the input batch, as a source would set it
    /// (`k8s.annotations.<key>`, `kafka.topic`...), besides `host`.
    meta: Vec<(String, String)>,
    at: At,
    count: Option<u64>,
    dropped: Vec<(String, u64)>,
    events: Vec<EventExpect>,
}

struct Suite {
    shown: String,
    pipeline: usize,
    cases: Vec<Case>,
}

/// The result of one test.
struct Outcome {
    name: String,
    /// Diff lines; empty when the test passed.
    problems: Vec<String>,
    /// The events seen, as JSON lines, shown under a failure.
    actual: Vec<String>,
    /// Discarded counts by processor and reason, shown under a failure.
    discarded: Vec<String>,
}

/// Runs `petrel test` and returns its exit status; the report goes to
/// standard output, problems with the input to standard output as
/// `FILE:LINE:COL: message` lines.
pub fn run(opts: &TestOptions) -> u8 {
    let pipelines = match config::load(&opts.config) {
        Ok(p) => p,
        Err(errs) => {
            for e in errs {
                println!("{e}");
            }
            return EXIT_INVALID;
        }
    };
    let files = match test_files(opts) {
        Ok(f) => f,
        Err(msg) => {
            println!("{msg}");
            return EXIT_INVALID;
        }
    };
    let mut suites = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match load_suite(f, &pipelines) {
            Ok(s) => suites.push(s),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        for e in errors {
            println!("{e}");
        }
        return EXIT_INVALID;
    }
    let mut results = Vec::new();
    for s in &suites {
        let p = &pipelines[s.pipeline];
        let mut outcomes = Vec::new();
        for c in &s.cases {
            match run_case(p, c) {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    println!("{}: test `{}`: {e:#}", s.shown, c.name);
                    return EXIT_INVALID;
                }
            }
        }
        results.push((s, outcomes));
    }
    let (mut passed, mut failed) = (0usize, 0usize);
    for (s, outcomes) in &results {
        for o in outcomes {
            if o.problems.is_empty() {
                passed += 1;
                println!("ok   {}: {}", s.shown, o.name);
            } else {
                failed += 1;
                println!("FAIL {}: {}", s.shown, o.name);
                for line in &o.problems {
                    println!("  {line}");
                }
                if !o.discarded.is_empty() {
                    println!("  discarded: {}", o.discarded.join(", "));
                }
                println!("  actual events:");
                if o.actual.is_empty() {
                    println!("    (none)");
                }
                for (i, a) in o.actual.iter().enumerate() {
                    println!("    {i}: {a}");
                }
            }
        }
    }
    println!(
        "{passed} passed, {failed} failed ({} test file(s))",
        results.len()
    );
    if let Some(path) = &opts.junit {
        let xml = junit(&results, &pipelines);
        if let Err(e) = std::fs::write(path, xml) {
            println!("{}: cannot write the JUnit report: {e}", path.display());
            return EXIT_INVALID;
        }
    }
    if failed > 0 {
        EXIT_FAIL
    } else {
        EXIT_PASS
    }
}

fn is_dir(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.is_dir()).unwrap_or(false)
}

fn tests_in(dir: &Path, accept: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| config::is_test_file(p))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&accept))
        .collect();
    v.sort();
    Ok(v)
}

/// The test files named on the command line, or by default those next to
/// the configuration: every `*.test.yaml` of a config directory, or
/// `NAME.test.yaml` and `NAME.*.test.yaml` beside a pipeline file
/// `NAME.yaml`.
fn test_files(opts: &TestOptions) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    if opts.tests.is_empty() {
        if is_dir(&opts.config) {
            out = tests_in(&opts.config, |_| true)?;
        } else {
            let stem = opts
                .config
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let dir = match opts.config.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let prefix = format!("{stem}.");
            out = tests_in(&dir, |n| n.starts_with(&prefix))?;
        }
        if out.is_empty() {
            return Err(format!(
                "{}:1:1: no test files next to the configuration (*.test.yaml); name them on the command line or add one",
                opts.config.display()
            ));
        }
        return Ok(out);
    }
    for t in &opts.tests {
        if is_dir(t) {
            let found = tests_in(t, |_| true)?;
            if found.is_empty() {
                return Err(format!(
                    "{}:1:1: no test files (*.test.yaml) in this directory",
                    t.display()
                ));
            }
            out.extend(found);
        } else {
            out.push(t.clone());
        }
    }
    Ok(out)
}

fn whole_file_error(shown: &Arc<str>, message: String) -> Vec<ConfigError> {
    vec![ConfigError {
        file: shown.clone(),
        line: 1,
        col: 1,
        message,
    }]
}

fn load_suite(path: &Path, pipelines: &[PipelineConfig]) -> Result<Suite, Vec<ConfigError>> {
    let shown: Arc<str> = path.to_string_lossy().into();
    let text = std::fs::read_to_string(path)
        .map_err(|e| whole_file_error(&shown, format!("cannot read: {e}")))?;
    let raw = parse_yaml(&shown, &text).map_err(|mut e| {
        if e.message.starts_with("the file must be a mapping") {
            e.message = "a test file must be a mapping with `pipeline` and `tests`".into();
        }
        vec![e]
    })?;
    let errs = ConfigErrors::new();
    let root = Node::root(&shown, &raw, &errs);
    let mut suite = Suite {
        shown: shown.to_string(),
        pipeline: 0,
        cases: Vec::new(),
    };
    if let Some(m) = root.as_map(FILE_KEYS) {
        let names: Vec<&str> = pipelines.iter().map(|p| p.name.as_str()).collect();
        match m.get("pipeline") {
            Some(n) => {
                if let Some(name) = n.as_str() {
                    match names.iter().position(|x| *x == name) {
                        Some(i) => suite.pipeline = i,
                        None => {
                            let mut msg =
                                format!("`pipeline`: no pipeline `{name}` in the configuration");
                            if let Some(best) = closest(name, &names) {
                                msg.push_str(&format!("; did you mean `{best}`?"));
                            }
                            msg.push_str(&format!("; pipelines: {}", names.join(", ")));
                            n.error(msg);
                        }
                    }
                }
            }
            None if names.len() == 1 => {}
            None => m.node().error(format!(
                "missing required key `pipeline`: the configuration has several pipelines ({})",
                names.join(", ")
            )),
        }
        if let Some(n) = m.required("tests", "[{ name: ..., input: [...], expect: {count: 1} }]") {
            let list = n.as_list();
            if list.is_empty() {
                n.error("`tests` is empty; add at least one test");
            }
            if let Some(p) = pipelines.get(suite.pipeline).filter(|_| errs.is_empty()) {
                for (i, item) in list.into_iter().enumerate() {
                    if let Some(c) = parse_case(item, i, p) {
                        suite.cases.push(c);
                    }
                }
            }
        }
    }
    let list = errs.into_vec();
    if list.is_empty() {
        Ok(suite)
    } else {
        Err(list)
    }
}

fn parse_case(item: Node<'_>, i: usize, p: &PipelineConfig) -> Option<Case> {
    let m = item.as_map(CASE_KEYS)?;
    let name = m
        .str("name")
        .map(str::to_string)
        .unwrap_or_else(|| format!("test {i}"));
    let mut input = Vec::new();
    if let Some(n) = m.required("input", "[\"a log line\"]") {
        for (s, _) in n.as_str_list() {
            // A block string (`input: |`) is several lines.
            input.extend(s.lines().map(str::to_string));
        }
    }
    let file = m.str("file").unwrap_or_default().to_string();
    let mut meta = Vec::new();
    if let Some(n) = m.get("meta") {
        for (k, v) in crate::processors::common::free_map(n, "meta")? {
            meta.push((k.to_string(), v.as_str()?.to_string()));
        }
    }
    let at = match m.get("at") {
        None => At {
            processors: p.processors.len(),
            shown: "the sinks' input".into(),
        },
        Some(n) => resolve_at(n, p)?,
    };
    let mut case = Case {
        name,
        input,
        file,
        meta,
        at,
        count: None,
        dropped: Vec::new(),
        events: Vec::new(),
    };
    let en = m.required("expect", "{ count: 1 }")?;
    let em = en.as_map(EXPECT_KEYS)?;
    case.count = em.u64("count", false);
    if let Some(d) = em.get("dropped") {
        if let Some(dm) = d.as_map_quiet() {
            for (reason, v) in dm.entries() {
                if let Some(n) = v.as_u64(false) {
                    case.dropped.push((reason.to_string(), n));
                }
            }
        } else {
            d.error("`dropped` must be a mapping of reason to count, e.g. `{ filtered: 1 }`");
        }
    }
    if let Some(evs) = em.get("events") {
        for ev in evs.as_list() {
            case.events.push(parse_event_expect(ev)?);
        }
    }
    if case.count.is_none() && case.dropped.is_empty() && case.events.is_empty() {
        en.error("`expect` has no assertion; add `count`, `dropped` or `events`");
        return None;
    }
    Some(case)
}

fn parse_event_expect(n: Node<'_>) -> Option<EventExpect> {
    let mut out = EventExpect::default();
    let Some(m) = n.as_map(EVENT_KEYS) else {
        // `- {}` or `-` with nothing: no assertion on this event.
        return Some(out);
    };
    if let Some(eq) = m.get("equals").and_then(|e| {
        e.as_map_quiet().or_else(|| {
            e.error("`equals` must be a mapping of field to value");
            None
        })
    }) {
        for (k, v) in eq.entries() {
            if let Some(s) = v.as_str() {
                out.equals.push((k.to_string(), s.to_string()));
            }
        }
    }
    if let Some(mm) = m.get("matches").and_then(|e| {
        e.as_map_quiet().or_else(|| {
            e.error("`matches` must be a mapping of field to regular expression");
            None
        })
    }) {
        for (k, v) in mm.entries() {
            if let Some(s) = v.as_str() {
                match regex::Regex::new(s) {
                    Ok(re) => out.matches.push((k.to_string(), re)),
                    Err(e) => v.error(format!("`matches.{k}`: invalid regular expression: {e}")),
                }
            }
        }
    }
    if let Some(a) = m.get("absent") {
        out.absent = a
            .as_str_list()
            .into_iter()
            .map(|(s, _)| s.to_string())
            .collect();
    }
    Some(out)
}

fn resolve_at(n: Node<'_>, p: &PipelineConfig) -> Option<At> {
    let id = n.as_str()?;
    if let Some(i) = p.processors.iter().position(|(x, _)| x == id) {
        return Some(At {
            processors: i + 1,
            shown: format!("processor `{id}`"),
        });
    }
    if p.sources.iter().any(|(x, _)| x == id) {
        return Some(At {
            processors: 0,
            shown: format!("source `{id}`"),
        });
    }
    if p.sinks.iter().any(|(x, _)| x == id) {
        return Some(At {
            processors: p.processors.len(),
            shown: format!("sink `{id}`"),
        });
    }
    let all: Vec<&str> = p
        .sources
        .iter()
        .map(|(x, _)| x.as_str())
        .chain(p.processors.iter().map(|(x, _)| x.as_str()))
        .chain(p.sinks.iter().map(|(x, _)| x.as_str()))
        .collect();
    let mut msg = format!("`at`: no component `{id}` in pipeline `{}`", p.name);
    if let Some(best) = closest(id, &all) {
        msg.push_str(&format!("; did you mean `{best}`?"));
    }
    msg.push_str(&format!("; components: {}", all.join(", ")));
    n.error(msg);
    None
}

fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A field as the sinks would write it: strings as they are, anything else
/// as its JSON text (so `status: 200` matches a number or a string).
fn render(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Runs the pipeline's processor chain on the case's input up to the
/// component the case looks at, and compares.
fn run_case(p: &PipelineConfig, c: &Case) -> anyhow::Result<Outcome> {
    // Fresh counters per test, so that `dropped` counts this test only.
    let metrics = Metrics::new();
    let slots = topology::build_processors(p, &metrics)?;
    let mut buf = Vec::new();
    let mut events = Vec::with_capacity(c.input.len());
    for line in &c.input {
        let start = buf.len();
        buf.extend_from_slice(line.as_bytes());
        events.push(Event::from_span(Span::new(start, line.len())));
        buf.push(b'\n');
    }
    let input_bytes = buf.len() as u64;
    let info = Arc::new(SourceInfo {
        path: c.file.as_str().into(),
        meta: std::iter::once((Key::Borrowed("host"), crate::host::hostname()))
            .chain(
                c.meta
                    .iter()
                    .map(|(k, v)| (Key::Owned(k.clone()), Arc::from(v.as_str()))),
            )
            .collect(),
        source_type: p.sources.first().map(|(_, s)| s.type_name()).unwrap_or(""),
    });
    let mut batch = EventBatch::new(Bytes::from(buf), info);
    batch.events = events;
    batch.input_bytes = input_bytes;
    let mut problems = Vec::new();
    let run = &slots[..c.at.processors.min(slots.len())];
    for ((id, _), slot) in p.processors.iter().zip(run) {
        slot.metrics
            .received_events
            .inc_by(batch.events.len() as u64);
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| slot.processor.process(&mut batch))) {
            let msg = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            problems.push(format!("processor `{id}` panicked: {msg}"));
            return Ok(Outcome {
                name: c.name.clone(),
                problems,
                actual: Vec::new(),
                discarded: Vec::new(),
            });
        }
        slot.metrics.sent_events.inc_by(batch.events.len() as u64);
    }
    let run_ids: &[&str] = &p
        .processors
        .iter()
        .take(run.len())
        .map(|(id, _)| id.as_str())
        .collect::<Vec<_>>();
    let mut out = Vec::new();
    let mut ends = Vec::new();
    let ndjson = Encoding::Ndjson(Default::default());
    encode_batch(&ndjson, &batch, &mut out, Some(&mut ends));
    let mut actual = Vec::new();
    let mut records = Vec::new();
    let mut start = 0usize;
    for end in ends {
        let rec = out.get(start..end as usize).unwrap_or_default();
        start = end as usize;
        let text = String::from_utf8_lossy(rec).trim_end().to_string();
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).unwrap_or_default();
        actual.push(text);
        records.push(map);
    }
    if let Some(n) = c.count {
        if n != records.len() as u64 {
            problems.push(format!(
                "count at {}: expected {n}, got {}",
                c.at.shown,
                records.len()
            ));
        }
    }
    for (reason, want) in &c.dropped {
        let got: u64 = run.iter().map(|s| s.metrics.discarded_count(reason)).sum();
        if got != *want {
            problems.push(format!(
                "dropped with reason `{reason}` before {}: expected {want}, got {got}",
                c.at.shown
            ));
        }
    }
    for (i, want) in c.events.iter().enumerate() {
        let Some(ev) = records.get(i) else {
            problems.push(format!(
                "event {i}: expected an event, got none ({} event(s) at {})",
                records.len(),
                c.at.shown
            ));
            continue;
        };
        for (field, value) in &want.equals {
            match ev.get(field) {
                Some(v) if render(v) == *value => {}
                Some(v) => problems.push(format!(
                    "event {i}, field `{field}`: expected {}, got {}",
                    quote(value),
                    quote(&render(v))
                )),
                None => problems.push(format!(
                    "event {i}, field `{field}`: expected {}, got no such field",
                    quote(value)
                )),
            }
        }
        for (field, re) in &want.matches {
            match ev.get(field) {
                Some(v) if re.is_match(&render(v)) => {}
                Some(v) => problems.push(format!(
                    "event {i}, field `{field}`: expected a match of /{}/, got {}",
                    re.as_str(),
                    quote(&render(v))
                )),
                None => problems.push(format!(
                    "event {i}, field `{field}`: expected a match of /{}/, got no such field",
                    re.as_str()
                )),
            }
        }
        for field in &want.absent {
            if let Some(v) = ev.get(field) {
                problems.push(format!(
                    "event {i}, field `{field}`: expected absent, got {}",
                    quote(&render(v))
                ));
            }
        }
    }
    Ok(Outcome {
        name: c.name.clone(),
        problems,
        actual,
        discarded: discarded_counts(&metrics, run_ids),
    })
}

/// `reason=N (processor)` for every non-zero discarded counter of the
/// processors in `ids`, read back from the test's own metrics registry
/// (the reasons are the processors' own, not known in advance).
fn discarded_counts(metrics: &Metrics, ids: &[&str]) -> Vec<String> {
    let text = metrics.render();
    let label = |line: &str, name: &str| -> Option<String> {
        let key = format!("{name}=\"");
        let start = line.find(&key)? + key.len();
        let len = line.get(start..)?.find('"')?;
        line.get(start..start + len).map(str::to_string)
    };
    let mut out = Vec::new();
    for line in text.lines() {
        if !line.starts_with("petrel_component_discarded_events_total{") {
            continue;
        }
        let (Some(id), Some(reason)) = (label(line, "component_id"), label(line, "reason")) else {
            continue;
        };
        let count = line.rsplit(' ').next().unwrap_or_default();
        if ids.contains(&id.as_str()) && count != "0" {
            out.push(format!("{reason}={count} ({id})"));
        }
    }
    out
}

/// Escapes text for XML attributes and content; characters XML 1.0 does
/// not allow at all become U+FFFD.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A JUnit XML report: one `testsuite` per test file, one `testcase` per
/// test, a `failure` with the diff for each failed one.
fn junit(results: &[(&Suite, Vec<Outcome>)], pipelines: &[PipelineConfig]) -> String {
    let total: usize = results.iter().map(|(_, o)| o.len()).sum();
    let failed = |o: &[Outcome]| o.iter().filter(|x| !x.problems.is_empty()).count();
    let all_failed: usize = results.iter().map(|(_, o)| failed(o)).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"petrel test\" tests=\"{total}\" failures=\"{all_failed}\" errors=\"0\">\n"
    ));
    for (s, outcomes) in results {
        let class = pipelines
            .get(s.pipeline)
            .map(|p| p.name.as_str())
            .unwrap_or_default();
        x.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\">\n",
            xml_escape(&s.shown),
            outcomes.len(),
            failed(outcomes)
        ));
        for o in outcomes {
            x.push_str(&format!(
                "    <testcase classname=\"{}\" name=\"{}\"",
                xml_escape(class),
                xml_escape(&o.name)
            ));
            if o.problems.is_empty() {
                x.push_str("/>\n");
                continue;
            }
            let first = o.problems.first().map(String::as_str).unwrap_or_default();
            let mut body = o.problems.join("\n");
            if !o.discarded.is_empty() {
                body.push_str(&format!("\ndiscarded: {}", o.discarded.join(", ")));
            }
            body.push_str("\nactual events:\n");
            for (i, a) in o.actual.iter().enumerate() {
                body.push_str(&format!("{i}: {a}\n"));
            }
            x.push_str(&format!(
                ">\n      <failure message=\"{}\" type=\"assertion\">{}</failure>\n    </testcase>\n",
                xml_escape(first),
                xml_escape(&body)
            ));
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escape_covers_markup_and_control_characters() {
        assert_eq!(
            xml_escape("a<b>&\"c'\u{1}\n"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}\n"
        );
    }
}
