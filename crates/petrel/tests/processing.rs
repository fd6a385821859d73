//! End-to-end tests of event processing: parsers (`parse_regex`,
//! `parse_json`, `parse_delimiter`, `parse_timestamp`), `filter`, `fields`
//! and `mask`, and multiline grouping in the file source, all through the
//! real binary with a `file` sink in `ndjson` encoding. Every expected value
//! is computed independently in the test (plain string operations on the
//! input) and compared exactly.

mod common;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use common::*;

/// The CONTEXT regex with named groups.
const RE: &str = r"\[(?<time>[^]]+)]\s\[(?<level>\w+)]\s\[(?<pid>\d+)]\s(?<file>\S+):(?<line>\d+)\slog:(?<log>.*)";

/// Lines per multiline512 event.
const ML_LINES: usize = 23;

// ---------------------------------------------------------------------------
// Output parsing
// ---------------------------------------------------------------------------

/// One ndjson record with its keys in written order; duplicate keys are kept
/// (a plain `serde_json::Value` would silently keep only the last one).
#[derive(Debug, Clone)]
struct Obj(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Obj {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Obj;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Obj, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, Value>()? {
                    v.push((k, val));
                }
                Ok(Obj(v))
            }
        }
        d.deserialize_map(V)
    }
}

impl Obj {
    /// The value of `key`; the last one when it is written more than once
    /// (what most JSON readers keep).
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The text value of `key`; panics with the record when it is missing
    /// or not a string.
    fn s(&self, key: &str) -> &str {
        match self.get(key) {
            Some(Value::String(s)) => s,
            other => panic!("field `{key}` should be a string, got {other:?} in {self}"),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Keys in written order.
    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// Keys that are written more than once.
    fn duplicate_keys(&self) -> Vec<&str> {
        let keys = self.keys();
        let mut d: Vec<&str> = keys
            .iter()
            .enumerate()
            .filter(|(i, k)| keys[..*i].contains(k))
            .map(|(_, k)| *k)
            .collect();
        d.dedup();
        d
    }

    /// As a `serde_json` map (last value of a repeated key wins).
    fn to_map(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        for (k, v) in &self.0 {
            m.insert(k.clone(), v.clone());
        }
        m
    }
}

impl fmt::Display for Obj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: String = self
            .0
            .iter()
            .map(|(k, v)| {
                let v = v.to_string();
                let v: String = v.chars().take(80).collect();
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join(", ");
        write!(f, "{{{text}}}")
    }
}

/// Every record of the ndjson file `out`.
fn read_events(out: &Path) -> Vec<Obj> {
    read_lines(out)
        .iter()
        .map(|l| {
            serde_json::from_slice::<Obj>(l).unwrap_or_else(|e| {
                panic!(
                    "output line is not a JSON object ({e}): {}",
                    String::from_utf8_lossy(l)
                )
            })
        })
        .collect()
}

/// Waits until `out` has exactly `n` complete lines and the checkpoint of
/// every input covers the whole file (so nothing more is on its way), then
/// returns the records.
fn wait_output(agent: &Agent, data: &Path, inputs: &[&Path], out: &Path, n: usize) -> Vec<Obj> {
    for input in inputs {
        wait_committed(data, input);
    }
    wait_for(
        LONG,
        &format!("{n} events in {}", out.display()),
        || match count_lines(out) {
            c if c == n => Ok(()),
            c => Err(format!(
                "{c} lines so far; agent stderr tail: {}",
                tail(&agent.stderr())
            )),
        },
    );
    read_events(out)
}

/// Waits until the committed offset of `input` is its length.
fn wait_committed(data: &Path, input: &Path) {
    let len = std::fs::metadata(input).expect("input").len();
    wait_for(
        LONG,
        &format!("the checkpoint of {} to reach {len}", input.display()),
        || match checkpoint_offset(data, input) {
            Some(o) if o == len => Ok(()),
            o => Err(format!("checkpoint offset {o:?}")),
        },
    );
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

// ---------------------------------------------------------------------------
// Configuration helpers
// ---------------------------------------------------------------------------

/// A pipeline reading `input` from its beginning into the ndjson file `out`.
/// `source_extra` are more keys of the source (indented by four spaces),
/// `processors` a complete `processors:` section (or empty).
fn pipeline(input: &Path, out: &Path, source_extra: &str, processors: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n{source_extra}{processors}sinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
        input.display(),
        out.display()
    )
}

fn parse_regex_yaml(id: &str, extra: &str) -> String {
    format!("  - type: parse_regex\n    id: {id}\n    pattern: '{RE}'\n{extra}")
}

fn labels<'a>(
    pipeline: &'a str,
    id: &'a str,
    extra: (&'a str, &'a str),
) -> Vec<(&'a str, &'a str)> {
    let mut l = component(pipeline, "processor", id);
    l.push(extra);
    l
}

/// Waits until counter `name` with `labels` equals `want`, then checks that
/// it stays there (it must not overshoot).
fn wait_counter(agent: &Agent, name: &str, labels: &[(&str, &str)], want: f64) {
    wait_for(LONG, &format!("{name}{labels:?} == {want}"), || match agent
        .metric_or_zero(name, labels)
    {
        v if v == want => Ok(()),
        v => Err(format!("value {v}")),
    });
}

// ---------------------------------------------------------------------------
// Independent parsing of the input
// ---------------------------------------------------------------------------

/// Splits a `[time] [level] [pid] file:line log:text` line with plain
/// string operations, mirroring the CONTEXT regex:
/// `\[([^]]+)]\s\[(\w+)]\s\[(\d+)]\s(\S+):(\d+)\slog:(.*)`.
fn split_bracket(line: &str) -> [String; 6] {
    let rest = line.strip_prefix('[').expect("starts with [");
    let (time, rest) = rest.split_once("] [").expect("time");
    let (level, rest) = rest.split_once("] [").expect("level");
    let (pid, rest) = rest.split_once("] ").expect("pid");
    let (location, log) = rest.split_once(" log:").expect("log");
    let (file, n) = location.rsplit_once(':').expect("file:line");
    assert!(!time.contains(']') && !file.contains(' '));
    assert!(pid.bytes().all(|b| b.is_ascii_digit()) && n.bytes().all(|b| b.is_ascii_digit()));
    [time, level, pid, file, n, log].map(str::to_string)
}

/// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC) as the RFC 3339 text the ndjson
/// encoding writes: `YYYY-MM-DDTHH:MM:SS.ffffff000Z`.
fn rfc3339_of(time: &str) -> String {
    let (date, clock) = time.split_once(' ').expect("date and time");
    let (hms, frac) = clock.split_once('.').expect("fraction");
    assert_eq!(hms.len(), 8, "{time}");
    format!("{date}T{hms}.{frac:0<9}Z")
}

/// Every maximal run of ASCII digits replaced by `***`.
fn mask_digit_runs(s: &str) -> String {
    let mut out = String::new();
    let mut in_run = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_run {
                out.push_str("***");
            }
            in_run = true;
        } else {
            out.push(c);
            in_run = false;
        }
    }
    out
}

fn input_lines(path: &Path) -> Vec<String> {
    read_lines(path)
        .into_iter()
        .map(|l| String::from_utf8(l).expect("generated data is UTF-8"))
        .collect()
}

fn gen_into(dir: &Path, format: &str, size: &str) -> PathBuf {
    let p = dir.join(format!("{format}.log"));
    let n = gen(format, size, &p);
    assert!(n > 0, "petrel gen wrote nothing");
    p
}

// ---------------------------------------------------------------------------
// 1. parse_regex on regex512
// ---------------------------------------------------------------------------

/// Case 1: regex512 through `parse_regex` with the CONTEXT regex: one event per
/// line, each with exactly the six captured fields, equal to what plain
/// string splitting of the line gives.
#[test]
fn regex512_parse_regex_exact_fields() {
    let dir = tempdir();
    let input = gen_into(dir.path(), "regex512", "200KB");
    // Handwritten lines with the awkward cases: a colon inside the file
    // name (the regex backtracks to the last `:digits`), brackets, spaces
    // and another ` log:` inside the message, an empty message.
    let hand = [
        "[2025-12-31 23:59:59.999999] [error] [1] /srv/a:b/x.go:7 log: spaced: value ] [x] log:again",
        "[2026-01-01 00:00:00.000000] [warn] [99999] relative.go:0 log:",
    ];
    for h in hand {
        append(&input, format!("{h}\n").as_bytes());
    }
    let lines = input_lines(&input);
    assert!(lines.len() > 300, "{} lines", lines.len());
    assert!(
        lines[0].starts_with("[2025-04-03 10:02:06.561793] ["),
        "the data set starts at its documented time: {}",
        lines[0]
    );

    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "rx",
        &pipeline(
            &input,
            &out,
            "",
            &format!("processors:\n{}", parse_regex_yaml("rx", "")),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, lines.len());

    const NAMES: [&str; 6] = ["time", "level", "pid", "file", "line", "log"];
    for (i, (line, ev)) in lines.iter().zip(&events).enumerate() {
        let want = split_bracket(line);
        assert_eq!(ev.s("message"), line, "event {i}: message");
        for (name, w) in NAMES.iter().zip(&want) {
            assert_eq!(ev.s(name), w, "event {i}: field `{name}` of {line:?}");
        }
        assert!(!ev.has("parse_error"), "event {i}: {ev}");
        assert!(!ev.has("timestamp"), "no event time was set: {ev}");
        // Layout: message first, then (apart from `file`, see the
        // dedicated test) the captured fields in pattern order.
        let keys: Vec<&str> = ev
            .keys()
            .into_iter()
            .filter(|k| *k != "file" && *k != "host")
            .collect();
        assert_eq!(
            keys,
            ["message", "time", "level", "pid", "line", "log"],
            "event {i}: keys of {ev}"
        );
    }
    // Spot checks against literal values.
    let first = &events[0];
    assert_eq!(first.s("time"), "2025-04-03 10:02:06.561793");
    assert_eq!(first.s("file"), "/root/stdout-test/server_stdout.go");
    let n = events.len();
    assert_eq!(events[n - 2].s("file"), "/srv/a:b/x.go");
    assert_eq!(events[n - 2].s("line"), "7");
    assert_eq!(events[n - 2].s("log"), " spaced: value ] [x] log:again");
    assert_eq!(events[n - 1].s("pid"), "99999");
    assert_eq!(events[n - 1].s("log"), "");
    let failed = agent.metric_or_zero(
        "petrel_component_errors_total",
        &labels("rx", "rx", ("error_type", "parse_failed")),
    );
    assert_eq!(failed, 0.0, "no line failed to parse");
}

/// Case 1b: A processor that sets `file` (here `parse_regex`'s `file` group):
/// the event has one `file` — the processor's value (documented in
/// `filter.rs`/`event.rs`: "`file` is the source file's path unless a
/// processor set a `file` field"), so the ndjson object must hold it once,
/// not the source path and the captured value side by side.
#[test]
fn ndjson_file_field_set_by_processor_is_written_once() {
    let dir = tempdir();
    let input = dir.path().join("app.log");
    append(
        &input,
        b"[2025-04-03 10:02:06.561793] [info] [131172] /root/stdout-test/server_stdout.go:165 log:hello\n",
    );
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "dupfile",
        &pipeline(
            &input,
            &out,
            "",
            &format!("processors:\n{}", parse_regex_yaml("rx", "")),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, 1);
    let raw = String::from_utf8(read_lines(&out).remove(0)).unwrap();
    let ev = &events[0];
    assert_eq!(ev.s("file"), "/root/stdout-test/server_stdout.go", "{raw}");
    assert!(
        ev.duplicate_keys().is_empty(),
        "the ndjson object repeats keys {:?}: {raw}",
        ev.duplicate_keys()
    );
}

// ---------------------------------------------------------------------------
// 2. parse_json on json512
// ---------------------------------------------------------------------------

/// Case 2: json512 through `parse_json`: each event's fields are the input
/// object's members, same values and types (numbers stay numbers), same
/// order; `message` is the raw line.
#[test]
fn json512_parse_json_fields_equal_input() {
    let dir = tempdir();
    let input = gen_into(dir.path(), "json512", "200KB");
    append(
        &input,
        br#"{"s":"esc \"q\" \u00e9\n","neg":-5,"f":1.5,"i64max":9223372036854775807,"huge":123456789012345678901234567890,"t":true,"n":null,"arr":[1,"x"],"obj":{"a":{"b":2}},"message":"replaced"}"#,
    );
    append(&input, b"\n");
    let lines = input_lines(&input);
    assert!(lines.len() > 300, "{} lines", lines.len());
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "js",
        &pipeline(
            &input,
            &out,
            "",
            "processors:\n  - type: parse_json\n    id: js\n",
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, lines.len());

    let last = lines.len() - 1;
    for (i, (line, ev)) in lines.iter().zip(&events).enumerate() {
        let want: Obj = serde_json::from_str(line).expect("input is JSON");
        let mut want_map = want.to_map();
        let mut got_map = ev.to_map();
        if i < last {
            assert_eq!(ev.s("message"), line, "event {i}: message");
            got_map.remove("message");
        } else {
            // The object's own `message` replaces the raw text; it has no
            // `file` member, so `file` is the source path.
            assert_eq!(ev.s("message"), "replaced", "{ev}");
            assert_eq!(ev.s("file"), &*input.to_string_lossy(), "{ev}");
            got_map.remove("file");
        }
        // `host` comes from the kernel, for every source.
        assert_eq!(
            got_map.remove("host").as_ref().and_then(|v| v.as_str()),
            Some(common::hostname().as_str()),
            "event {i}"
        );
        assert_eq!(
            got_map,
            std::mem::take(&mut want_map),
            "event {i}: fields of {line}"
        );
        // Input order is kept (leaving aside `message`, and `file`, which
        // the encoding also writes for the source path).
        let order = |o: &Obj| -> Vec<String> {
            o.keys()
                .into_iter()
                .filter(|k| *k != "message" && *k != "file" && *k != "host")
                .map(str::to_string)
                .collect()
        };
        assert_eq!(order(ev), order(&want), "event {i}: key order");
        assert!(!ev.has("parse_error"), "{ev}");
    }
    // Types of the generated lines: numbers stay numbers.
    for ev in &events[..last] {
        assert!(ev.get("pid").is_some_and(Value::is_u64), "pid: {ev}");
        assert!(ev.get("line").is_some_and(Value::is_u64), "line: {ev}");
        assert!(ev.get("time").is_some_and(Value::is_string), "time: {ev}");
    }
    let first = &events[0];
    assert_eq!(first.s("time"), "2025-04-03 10:02:06.561793");
    assert_eq!(first.s("file"), "/root/stdout-test/server_stdout.go");
    // The handwritten line: exact values and types.
    let h = &events[last];
    assert_eq!(h.s("s"), "esc \"q\" é\n");
    assert_eq!(h.get("neg"), Some(&Value::from(-5)));
    assert_eq!(h.get("f"), Some(&Value::from(1.5)));
    assert_eq!(
        h.get("i64max"),
        Some(&Value::from(i64::MAX)),
        "exact integer"
    );
    assert!(
        h.get("huge").is_some_and(Value::is_f64),
        "too big: a float: {h}"
    );
    assert_eq!(h.get("t"), Some(&Value::Bool(true)));
    assert_eq!(h.get("n"), Some(&Value::Null));
    assert_eq!(h.get("arr"), Some(&serde_json::json!([1, "x"])));
    assert_eq!(h.get("obj"), Some(&serde_json::json!({"a": {"b": 2}})));
    let failed = agent.metric_or_zero(
        "petrel_component_errors_total",
        &labels("js", "js", ("error_type", "parse_failed")),
    );
    assert_eq!(failed, 0.0);
}

// ---------------------------------------------------------------------------
// 3. parse_delimiter on delim512
// ---------------------------------------------------------------------------

/// Case 3: delim512 through `parse_delimiter` (`|`, six keys): exact values;
/// plus a quoted value holding the separator and a line with more values
/// than keys (`extra: last`).
#[test]
fn delim512_parse_delimiter_exact_values() {
    let dir = tempdir();
    let input = gen_into(dir.path(), "delim512", "200KB");
    let gen_lines = input_lines(&input).len();
    append(
        &input,
        b"2025-04-03 10:02:06.561793|info|1|\"/a|b.go\"|3|say \"\"hi\"\"\n\
          t|l|p|f|n|x|y||z\n\
          a||c\n",
    );
    let lines = input_lines(&input);
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "dl",
        &pipeline(
            &input,
            &out,
            "",
            "processors:\n  - type: parse_delimiter\n    id: dl\n    separator: \"|\"\n    keys: [time, level, pid, file, line, log]\n",
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, lines.len());

    const KEYS: [&str; 6] = ["time", "level", "pid", "file", "line", "log"];
    for (i, (line, ev)) in lines.iter().zip(&events).take(gen_lines).enumerate() {
        let want: Vec<&str> = line.split('|').collect();
        assert_eq!(want.len(), 6, "generated line {i} has six values: {line}");
        assert_eq!(ev.s("message"), line, "event {i}");
        for (k, w) in KEYS.iter().zip(&want) {
            assert_eq!(ev.s(k), *w, "event {i}: `{k}` of {line}");
        }
        assert!(!ev.has("parse_error"), "{ev}");
    }
    assert_eq!(events[0].s("time"), "2025-04-03 10:02:06.561793");
    let q = &events[gen_lines];
    assert_eq!(q.s("file"), "/a|b.go", "quoted value: {q}");
    assert_eq!(q.s("line"), "3");
    assert_eq!(
        q.s("log"),
        "say \"\"hi\"\"",
        "a quote inside a value is a byte"
    );
    let x = &events[gen_lines + 1];
    let got: Vec<&str> = KEYS.iter().map(|k| x.s(k)).collect();
    assert_eq!(got, ["t", "l", "p", "f", "n", "x|y||z"], "extra: last");
    let short = &events[gen_lines + 2];
    assert_eq!(short.s("time"), "a");
    assert_eq!(short.s("level"), "", "empty value");
    assert_eq!(short.s("pid"), "c");
    for k in ["line", "log"] {
        assert!(!short.has(k), "keys without a value are absent: {short}");
    }
    assert!(!short.has("parse_error"), "fewer values is not an error");
    let failed = agent.metric_or_zero(
        "petrel_component_errors_total",
        &labels("dl", "dl", ("error_type", "parse_failed")),
    );
    assert_eq!(failed, 0.0);
}

// ---------------------------------------------------------------------------
// 4./5. Multiline on multiline512
// ---------------------------------------------------------------------------

/// Checks that `events` are the multiline512 events of `input`: 23 lines
/// each, starting with `[`, and together exactly the input.
fn check_multiline(what: &str, input: &Path, events: &[Obj]) {
    let bytes = std::fs::read(input).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let lines = text.lines().count();
    assert_eq!(lines % ML_LINES, 0, "{what}: input has whole events");
    assert_eq!(events.len(), lines / ML_LINES, "{what}: event count");
    for (i, ev) in events.iter().enumerate() {
        let m = ev.s("message");
        let n = m.split('\n').count();
        assert_eq!(
            n,
            ML_LINES,
            "{what}: event {i} has {n} lines: {:?}...",
            &m[..m.len().min(200)]
        );
        assert!(m.starts_with('['), "{what}: event {i} starts with `[`");
        assert!(
            m.split('\n')
                .skip(1)
                .all(|l| l.starts_with("    at com.example.")),
            "{what}: event {i}: every other line is a stack frame"
        );
        assert!(!m.ends_with('\n'), "{what}: no trailing newline");
    }
    // Event by event first, for a precise message on a mismatch.
    let all: Vec<&str> = text.lines().collect();
    for (i, (chunk, ev)) in all.chunks(ML_LINES).zip(events).enumerate() {
        let want = chunk.join("\n");
        let got = ev.s("message");
        if got != want {
            let at = got
                .bytes()
                .zip(want.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            let around = |s: &str| s[at.saturating_sub(60)..(at + 60).min(s.len())].to_string();
            // Which input event each output event is (by its whole text).
            let order: Vec<String> = events
                .iter()
                .map(|e| {
                    let m = e.s("message");
                    match all.chunks(ML_LINES).position(|c| c.join("\n") == m) {
                        Some(k) => k.to_string(),
                        None => "?".to_string(),
                    }
                })
                .collect();
            panic!(
                "{what}: event {i} differs from input lines {}..{} at byte {at} \
                 (lengths {} vs {}); output events are input events [{}]:\n got: {:?}\nwant: {:?}",
                i * ML_LINES,
                (i + 1) * ML_LINES,
                got.len(),
                want.len(),
                order.join(" "),
                around(got),
                around(&want)
            );
        }
    }
    let joined = events
        .iter()
        .map(|e| e.s("message"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        joined == text[..text.len() - 1],
        "{what}: the messages joined by newlines are not the input (lost, reordered or altered bytes)"
    );
}

/// Case 4: multiline512 grouped with `start_pattern: '^\['` and with
/// `mode: timestamp` (two pipelines of one agent): every event is whole.
#[test]
fn multiline512_start_pattern_and_timestamp_mode() {
    let dir = tempdir();
    let src = gen_into(dir.path(), "multiline512", "500KB");
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    let data = dir.path().join("data");
    let modes = [
        ("ml_start", "      start_pattern: '^\\['\n"),
        ("ml_ts", "      mode: timestamp\n"),
    ];
    let mut runs = Vec::new();
    for (name, rule) in modes {
        let input = dir.path().join(format!("{name}.log"));
        std::fs::copy(&src, &input).unwrap();
        let out = dir.path().join(format!("{name}.ndjson"));
        write_config(
            &conf,
            name,
            &pipeline(
                &input,
                &out,
                &format!("    multiline:\n{rule}      timeout_ms: 200\n"),
                "",
            ),
        );
        runs.push((name, input, out));
    }
    let agent = Agent::start(&conf, &data);
    let lines = count_lines(&src);
    for (name, input, out) in &runs {
        let events = wait_output(&agent, &data, &[input], out, lines / ML_LINES);
        check_multiline(name, input, &events);
        for ev in &events {
            assert_eq!(ev.s("file"), &*input.to_string_lossy());
        }
    }
}

/// Case 5: `read_block_bytes: 4096` (the minimum) with events of 11.7 KB: every
/// event spans several reads and still comes out whole.
#[test]
fn multiline_events_larger_than_read_block_stay_whole() {
    let dir = tempdir();
    let input = gen_into(dir.path(), "multiline512", "1MB");
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "mlblock",
        &pipeline(
            &input,
            &out,
            "    read_block_bytes: 4096\n    multiline:\n      start_pattern: '^\\['\n      timeout_ms: 200\n",
            "",
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let lines = count_lines(&input);
    assert!(lines / ML_LINES >= 80, "{lines} lines");
    let events = wait_output(&agent, &data, &[&input], &out, lines / ML_LINES);
    check_multiline("read_block_bytes 4096", &input, &events);
    let cut = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[("pipeline", "mlblock"), ("error_type", "multiline_cut")],
    );
    assert_eq!(cut, 0.0, "no event reached a limit");
}

// ---------------------------------------------------------------------------
// 6. Multiline timeout and checkpoints
// ---------------------------------------------------------------------------

fn events_of(out: &Path, file: &Path) -> Vec<Obj> {
    let want = file.to_string_lossy();
    read_events(out)
        .into_iter()
        .filter(|e| e.get("file").and_then(Value::as_str) == Some(&*want))
        .collect()
}

fn messages(evs: &[Obj]) -> Vec<String> {
    evs.iter().map(|e| e.s("message").to_string()).collect()
}

/// Case 6: An open event is emitted once the file has not grown for
/// `timeout_ms`, as one event; the next event starts cleanly after it.
/// While an event is held its bytes are not committed (checked on a second
/// source with a long timeout, so that several checkpoint writes happen
/// while it is held).
#[test]
fn multiline_timeout_flushes_and_held_event_is_not_committed() {
    let dir = tempdir();
    let short = dir.path().join("short.log");
    let long = dir.path().join("long.log");
    append(&short, b"");
    append(&long, b"");
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    const LONG_TIMEOUT_MS: u64 = 8000;
    let cfg = write_config(
        dir.path(),
        "mlt",
        &format!(
            "sources:\n\
             \x20 - type: file\n    id: short\n    include: [\"{}\"]\n    read_from: beginning\n    multiline:\n      start_pattern: '^\\['\n      timeout_ms: 300\n\
             \x20 - type: file\n    id: long\n    include: [\"{}\"]\n    read_from: beginning\n    multiline:\n      start_pattern: '^\\['\n      timeout_ms: {LONG_TIMEOUT_MS}\n\
             sinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            short.display(),
            long.display(),
            out.display()
        ),
    );
    let _agent = Agent::start(&cfg, &data);

    // Short timeout: one event of three lines, emitted by the timeout alone
    // (no following start line).
    let e1 =
        "[2025-04-03 10:00:00.000001] [error] first\n    at one(A.java:1)\n    at two(B.java:2)\n";
    append(&short, e1.as_bytes());
    let got = wait_for(LONG, "the first event after its timeout", || {
        let evs = events_of(&out, &short);
        if evs.is_empty() {
            Err("no event from short.log yet".into())
        } else {
            Ok(evs)
        }
    });
    assert_eq!(
        messages(&got),
        [e1.trim_end_matches('\n')],
        "one event with all three lines"
    );
    assert_eq!(got[0].s("message").split('\n').count(), 3);

    let e2 = "[2025-04-03 10:00:01.000002] [warn] second\n    at three(C.java:3)\n";
    append(&short, e2.as_bytes());
    let got = wait_for(LONG, "the second event", || {
        let evs = events_of(&out, &short);
        if evs.len() >= 2 {
            Ok(evs)
        } else {
            Err(format!("{} event(s) from short.log", evs.len()))
        }
    });
    assert_eq!(
        messages(&got),
        [e1.trim_end_matches('\n'), e2.trim_end_matches('\n')],
        "exactly two events, nothing split off or merged"
    );
    wait_committed(&data, &short);

    // Long timeout: A is closed by B's start line; B is held.
    let a = "[2025-04-03 10:00:02.000003] [info] A\n    at a1(A.java:1)\n    at a2(A.java:2)\n";
    let b = "[2025-04-03 10:00:03.000004] [info] B\n    at b1(B.java:1)\n";
    let t0 = Instant::now();
    append(&long, format!("{a}{b}").as_bytes());
    let a_end = a.len() as u64;
    let total = (a.len() + b.len()) as u64;
    wait_for(LONG, "event A", || match events_of(&out, &long).len() {
        0 => Err("nothing from long.log yet".into()),
        _ => Ok(()),
    });
    wait_for(LONG, "A to be committed", || {
        match checkpoint_offset(&data, &long) {
            Some(o) if o >= a_end => Ok(()),
            o => Err(format!("checkpoint {o:?}, A ends at {a_end}")),
        }
    });
    // Sample the checkpoint while B is verifiably held: read the offset
    // first, then confirm B was not emitted yet.
    let mut held_samples = 0;
    let sample_until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < sample_until {
        let cp = checkpoint_offset(&data, &long);
        let evs = events_of(&out, &long);
        if evs.len() > 1 {
            break; // B was emitted (timeout reached on a very slow machine)
        }
        assert_eq!(
            messages(&evs),
            [a.trim_end_matches('\n')],
            "only A is out while B is held"
        );
        assert_eq!(
            cp,
            Some(a_end),
            "while B is held the checkpoint must stop at its start ({a_end}); the file is {total} bytes"
        );
        held_samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        held_samples > 0,
        "B was emitted before it could be observed held ({:?} after writing, timeout {LONG_TIMEOUT_MS} ms)",
        t0.elapsed()
    );
    // After the timeout B comes out whole and is committed.
    let got = wait_for(LONG, "event B after its timeout", || {
        let evs = events_of(&out, &long);
        if evs.len() >= 2 {
            Ok(evs)
        } else {
            Err(format!("{} event(s) from long.log", evs.len()))
        }
    });
    assert_eq!(
        messages(&got),
        [a.trim_end_matches('\n'), b.trim_end_matches('\n')]
    );
    wait_committed(&data, &long);
    eprintln!("held-event checkpoint samples: {held_samples}");
}

// ---------------------------------------------------------------------------
// 7. A processor chain
// ---------------------------------------------------------------------------

/// Case 7: parse_regex → parse_timestamp → filter (no debug) → fields → mask ×2
/// on regex512: event time, filtering and its counter, field operations and
/// masking, for every line.
#[test]
fn processor_chain_regex_timestamp_filter_fields_mask() {
    let dir = tempdir();
    let input = gen_into(dir.path(), "regex512", "200KB");
    let known = "[2025-04-03 10:02:06.561793] [warn] [131172] /root/stdout-test/server_stdout.go:165 log:ZQsC8JI2 token 4242";
    append(
        &input,
        format!("{known}\n[2025-04-03 10:02:07.000000] [debug] [100000] /x.go:1 log:dropped\n")
            .as_bytes(),
    );
    let lines = input_lines(&input);
    let kept: Vec<&String> = lines
        .iter()
        .filter(|l| split_bracket(l)[1] != "debug")
        .collect();
    let debug = lines.len() - kept.len();
    assert!(debug >= 20 && kept.len() >= 200, "{debug} debug lines");

    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let processors = format!(
        "processors:\n{}\
         \x20 - type: parse_timestamp\n    id: ts\n    field: time\n    format: '%Y-%m-%d %H:%M:%S%.f'\n\
         \x20 - type: filter\n    id: nodebug\n    exclude:\n      level: '^debug$'\n\
         \x20 - type: fields\n    id: shape\n    copy: {{ level: severity }}\n    rename: {{ log: msg }}\n    add:\n      env: e2e\n      replicas: 3\n    remove: [line, time, file]\n\
         \x20 - type: mask\n    id: maskpid\n    field: pid\n    pattern: '^(\\d{{2}})\\d+$'\n    replace: '$${{1}}****'\n\
         \x20 - type: mask\n    id: maskmsg\n    field: msg\n    pattern: '[0-9]+'\n    replace: \"***\"\n",
        parse_regex_yaml("rx", "")
    );
    let cfg = write_config(
        dir.path(),
        "chain",
        &pipeline(&input, &out, "", &processors),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, kept.len());

    let mut want_keys = vec![
        "env",
        "host",
        "level",
        "message",
        "msg",
        "pid",
        "replicas",
        "severity",
        "timestamp",
    ];
    want_keys.sort();
    for (i, (line, ev)) in kept.iter().zip(&events).enumerate() {
        let [time, level, pid, _file, _n, log] = split_bracket(line);
        assert_eq!(ev.s("message"), *line, "event {i}");
        assert_eq!(ev.s("timestamp"), rfc3339_of(&time), "event {i}: {line}");
        assert_eq!(ev.s("level"), level, "event {i}");
        assert_eq!(ev.s("severity"), level, "event {i}: copy");
        assert_eq!(ev.s("pid"), format!("{}****", &pid[..2]), "event {i}: mask");
        assert_eq!(ev.s("msg"), mask_digit_runs(&log), "event {i}: rename+mask");
        assert_eq!(ev.s("env"), "e2e");
        assert_eq!(ev.s("replicas"), "3", "`add` writes strings");
        // `remove: [file]` removes the field named `file`: the captured
        // one and the source path alike (it used to leave the path).
        let mut keys = ev.keys();
        keys.sort();
        assert_eq!(keys, want_keys, "event {i}: {ev}");
    }
    let k = events.last().unwrap();
    assert_eq!(k.s("message"), known);
    assert_eq!(k.s("timestamp"), "2025-04-03T10:02:06.561793000Z");
    assert_eq!(k.s("pid"), "13****");
    assert_eq!(k.s("msg"), "ZQsC***JI*** token ***");
    assert!(events.iter().all(|e| e.s("level") != "debug"));

    wait_counter(
        &agent,
        "petrel_component_discarded_events_total",
        &labels("chain", "nodebug", ("reason", "filtered")),
        debug as f64,
    );
    for id in ["rx", "ts"] {
        let failed = agent.metric_or_zero(
            "petrel_component_errors_total",
            &labels("chain", id, ("error_type", "parse_failed")),
        );
        assert_eq!(failed, 0.0, "{id}: parse failures");
    }
}

// ---------------------------------------------------------------------------
// 8. Bad input through parsers
// ---------------------------------------------------------------------------

/// One input line and how each parser must treat it: `regex` holds the
/// expected fields when the regex matches (`None`: a parse failure); `json`
/// is true when the line is a JSON object (its members are the expected
/// fields).
struct Case {
    raw: &'static [u8],
    regex: Option<&'static [(&'static str, &'static str)]>,
    json: bool,
}

fn cases_initial() -> Vec<Case> {
    vec![
        Case {
            raw: b"[2025-04-03 10:02:06.561793] [info] [131172] /root/a.go:165 log:first",
            regex: Some(&[
                ("time", "2025-04-03 10:02:06.561793"),
                ("level", "info"),
                ("pid", "131172"),
                ("file", "/root/a.go"),
                ("line", "165"),
                ("log", "first"),
            ]),
            json: false,
        },
        Case {
            raw: b"this line does not match",
            regex: None,
            json: false,
        },
        Case {
            raw: b"{\"a\":",
            regex: None,
            json: false,
        },
        Case {
            raw: b"{\"k\":\"\xff\xfe\"}",
            regex: None,
            json: false,
        },
        Case {
            raw: b"",
            regex: None,
            json: false,
        },
        Case {
            raw: b"{\"a\":1,\"b\":\"x\"}",
            regex: None,
            json: true,
        },
        // Matches the regex although it is not UTF-8 (PCRE2 matches bytes).
        Case {
            raw: b"[2025-04-03 10:02:07.000001] [warn] [7] /b.go:2 log:caf\xff",
            regex: Some(&[
                ("time", "2025-04-03 10:02:07.000001"),
                ("level", "warn"),
                ("pid", "7"),
                ("file", "/b.go"),
                ("line", "2"),
                ("log", "caf\u{fffd}"),
            ]),
            json: false,
        },
    ]
}

fn cases_later() -> Vec<Case> {
    vec![
        Case {
            raw: b"[2025-04-03 10:02:08.000002] [error] [8] /c.go:3 log:later",
            regex: Some(&[
                ("time", "2025-04-03 10:02:08.000002"),
                ("level", "error"),
                ("pid", "8"),
                ("file", "/c.go"),
                ("line", "3"),
                ("log", "later"),
            ]),
            json: false,
        },
        Case {
            raw: b"{\"later\":true}",
            regex: None,
            json: true,
        },
        Case {
            raw: b"not json later",
            regex: None,
            json: false,
        },
    ]
}

fn json_fields(raw: &[u8]) -> Vec<(String, Value)> {
    serde_json::from_slice::<Obj>(raw)
        .expect("a valid JSON case")
        .0
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Keep,
    Drop,
    Raw,
}

/// Checks one pipeline's output against `cases`.
fn check_bad_input(pipe: &str, parser: &str, mode: Mode, cases: &[Case], events: &[Obj]) {
    let expected: Vec<&Case> = cases
        .iter()
        .filter(|c| mode != Mode::Drop || parses(parser, c))
        .collect();
    assert_eq!(
        events.len(),
        expected.len(),
        "{pipe}: events {:?}",
        events.iter().map(|e| e.to_string()).collect::<Vec<_>>()
    );
    for (i, (c, ev)) in expected.iter().zip(events).enumerate() {
        let lossy = String::from_utf8_lossy(c.raw);
        let ctx = format!("{pipe}: event {i} ({lossy:?}): {ev}");
        if parses(parser, c) {
            assert!(!ev.has("parse_error"), "{ctx}");
            assert!(!ev.has("orig"), "{ctx}");
            assert_eq!(ev.s("message"), lossy, "{ctx}");
            match parser {
                "regex" => {
                    for (k, v) in c.regex.unwrap() {
                        assert_eq!(ev.s(k), *v, "{ctx}: `{k}`");
                    }
                }
                _ => {
                    for (k, v) in json_fields(c.raw) {
                        assert_eq!(ev.get(&k), Some(&v), "{ctx}: `{k}`");
                    }
                }
            }
        } else {
            // Unchanged, plus `parse_error` naming the processor.
            assert_eq!(ev.s("message"), lossy, "{ctx}: message unchanged");
            let err = ev.s("parse_error");
            assert!(
                err.contains(&format!("parse_{parser}")),
                "{ctx}: parse_error should name the processor"
            );
            let mut keys = ev.keys();
            keys.retain(|k| *k != "file" && *k != "host");
            let want: &[&str] = match mode {
                Mode::Raw => &["message", "parse_error", "orig"],
                _ => &["message", "parse_error"],
            };
            let (mut a, mut b) = (keys.clone(), want.to_vec());
            a.sort();
            b.sort();
            assert_eq!(a, b, "{ctx}: no parsed field on a failed event");
            if mode == Mode::Raw {
                assert_eq!(ev.s("orig"), lossy, "{ctx}: raw_field holds the original");
            }
        }
    }
}

fn parses(parser: &str, c: &Case) -> bool {
    match parser {
        "regex" => c.regex.is_some(),
        _ => c.json,
    }
}

fn write_cases(path: &Path, cases: &[Case]) {
    let mut b = Vec::new();
    for c in cases {
        b.extend_from_slice(c.raw);
        b.push(b'\n');
    }
    append(path, &b);
}

/// Case 8: Lines a parser cannot handle (no match, broken JSON, invalid UTF-8,
/// an empty line) through `parse_regex` and `parse_json` with each
/// `on_error` policy: exact outcome per line, exact counters, and later
/// lines still arrive.
#[test]
fn bad_input_on_error_keep_drop_raw() {
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    let data = dir.path().join("data");
    let initial = cases_initial();
    let later = cases_later();
    let mut pipes = Vec::new();
    for parser in ["regex", "json"] {
        for (mode, policy) in [
            (Mode::Keep, "keep"),
            (Mode::Drop, "drop"),
            (Mode::Raw, "raw"),
        ] {
            let name = format!("{parser}_{policy}");
            let input = dir.path().join(format!("{name}.log"));
            write_cases(&input, &initial);
            let out = dir.path().join(format!("{name}.ndjson"));
            let extra = match mode {
                Mode::Raw => format!("    on_error: {policy}\n    raw_field: orig\n"),
                _ => format!("    on_error: {policy}\n"),
            };
            let proc = match parser {
                "regex" => parse_regex_yaml("p", &extra),
                _ => format!("  - type: parse_json\n    id: p\n{extra}"),
            };
            write_config(
                &conf,
                &name,
                &pipeline(&input, &out, "", &format!("processors:\n{proc}")),
            );
            pipes.push((name, parser, mode, input, out));
        }
    }
    let agent = Agent::start(&conf, &data);

    let check_all = |cases: &[Case]| {
        for (name, parser, mode, input, out) in &pipes {
            let failed = cases.iter().filter(|c| !parses(parser, c)).count();
            let n = match mode {
                Mode::Drop => cases.len() - failed,
                _ => cases.len(),
            };
            let events = wait_output(&agent, &data, &[input], out, n);
            check_bad_input(name, parser, *mode, cases, &events);
            wait_counter(
                &agent,
                "petrel_component_errors_total",
                &labels(name, "p", ("error_type", "parse_failed")),
                failed as f64,
            );
            let dropped = match mode {
                Mode::Drop => failed as f64,
                _ => 0.0,
            };
            wait_counter(
                &agent,
                "petrel_component_discarded_events_total",
                &labels(name, "p", ("reason", "parse_error")),
                dropped,
            );
        }
    };
    check_all(&initial);

    // The agent goes on: later lines, good and bad, still arrive.
    for (_, _, _, input, _) in &pipes {
        write_cases(input, &later);
    }
    let all: Vec<Case> = cases_initial().into_iter().chain(cases_later()).collect();
    check_all(&all);
    assert!(
        agent.http_get("/metrics").is_ok_and(|(st, _)| st == 200),
        "agent still serving"
    );
}

/// Chained parsers keep every failure: a line the regex does not match has
/// no `time`, so `parse_timestamp` fails too, and both reasons are in
/// `parse_error`, the cause first.
#[test]
fn chained_parser_errors_are_all_kept() {
    let dir = tempdir();
    let input = dir.path().join("chain.log");
    append(&input, b"not a bracketed line\n");
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let processors = format!(
        "processors:\n{}\x20 - type: parse_timestamp\n    id: ts\n    field: time\n    format: '%Y-%m-%d %H:%M:%S%.f'\n",
        parse_regex_yaml("rx", "")
    );
    let cfg = write_config(
        dir.path(),
        "chain",
        &pipeline(&input, &out, "", &processors),
    );
    let agent = Agent::start(&cfg, &data);
    let events = wait_output(&agent, &data, &[&input], &out, 1);
    let err = events[0].s("parse_error");
    assert!(
        err.starts_with("parse_regex: ") && err.contains("; parse_timestamp: "),
        "both failures, the first one first: {err}"
    );
}
