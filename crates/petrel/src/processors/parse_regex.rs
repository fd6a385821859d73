//! `type: parse_regex` — named regex captures into fields.
//!
//! ```yaml
//! processors:
//!   - type: parse_regex
//!     field: message      # default `message`
//!     pattern: '\[(?<time>[^]]+)]\s\[(?<level>\w+)]\s\[(?<pid>\d+)]\s(?<file>\S+):(?<line>\d+)\slog:(?<log>.*)'
//!     on_error: keep      # keep | drop | raw
//!     raw_field: raw      # with `on_error: raw`
//! ```
//!
//! The pattern is searched in the field (unanchored: start it with `^` to
//! match from the start). Every named group — `(?<name>…)`, `(?P<name>…)`
//! or `(?'name'…)` — that took part in the match becomes a field holding
//! the captured text, borrowed from the read buffer without a copy; unnamed
//! groups are ignored and a named group that did not participate (inside an
//! alternative that was not taken) is absent. A captured field replaces an
//! existing field of the same name (`message` included).
//!
//! Syntax and semantics are PCRE2's (Perl-compatible), matching bytes: `\w`,
//! `\d` and `\s` are ASCII classes and `.` matches any byte but a newline,
//! so lines that are not valid UTF-8 still match. `(*UTF)(*UCP)` at the
//! start of the pattern switches to Unicode classes (a line that is not
//! valid UTF-8 then fails to parse). PCRE2 backtracks: a pattern with nested
//! quantifiers such as `(a+)+$` can be slow on lines that almost match; each
//! match is bounded by PCRE2's match limit (10 million steps), and a line
//! that exceeds it fails to parse rather than stalling the pipeline. A group
//! repeated tens of thousands of times (`(?:a|b)*` over a long line) can
//! likewise exhaust the 1 MiB JIT stack and fail; a repeated character class
//! (`[ab]*`, `.*`) has no such limit.
//!
//! An invalid pattern, or one without a named group, is a configuration
//! error with its position. A line that does not match (or a missing or
//! non-text field) is a parse failure: counted in
//! `component_errors{error_type="parse_failed"}` and handled by `on_error`
//! (`keep`: unchanged plus `parse_error`; `drop`: dropped and counted as
//! discarded with reason `parse_error`; `raw`: like keep, with the field
//! copied into `raw_field`).
//!
//! Engine: PCRE2 with its JIT compiler (the `pcre2` crate builds a bundled
//! PCRE2). On the regex512 data it captures a 512-byte line in about 0.3 µs,
//! where the `regex` crate needs 8–9 µs (see the `parsers` benchmark).

use parking_lot::Mutex;
use pcre2::bytes::{CaptureLocations, Regex, RegexBuilder};
use petrel_core::config::Map;
use petrel_core::plugin::Processor;
use petrel_core::{ComponentMetrics, EventBatch, Key, Value};

use super::common::{self, config_key, FieldParse, OnError, PARSER_KEYS};

/// Keys accepted.
pub const KEYS: &[&str] = &[
    PARSER_KEYS[0],
    PARSER_KEYS[1],
    PARSER_KEYS[2],
    PARSER_KEYS[3],
    PARSER_KEYS[4],
    "pattern",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Named captures of a PCRE2 pattern (with JIT) become fields, borrowed from the read buffer; a line that does not match is a parse failure."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    crate::processors::common::FIELD_DOC,
    crate::processors::common::ON_ERROR_DOC,
    crate::processors::common::RAW_FIELD_DOC,
    petrel_core::plugin::KeyDoc {
        name: "pattern",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: a PCRE2 pattern with at least one named group (`(?<name>...)`), searched unanchored; matches bytes (`(*UTF)(*UCP)` for Unicode classes)."#,
    },
];

const WHO: &str = "parse_regex";

/// JIT stack limit per match. PCRE2's default (32 KiB) is exhausted by a
/// repeated group over a few thousand bytes; 1 MiB covers tens of thousands
/// of repetitions of a group (a repeated character class such as `.*` or
/// `[^|]*` needs none), and its pages are only touched as the stack grows.
/// A match that needs more fails to parse ("JIT stack limit reached").
const JIT_STACK_BYTES: usize = 1 << 20;

/// Configuration of `parse_regex`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The field to match.
    pub field: String,
    /// The PCRE2 pattern, with at least one named group.
    pub pattern: String,
    /// What to do with an event that does not match.
    pub on_error: OnError,
}

impl Config {
    /// Reads the keys and checks the pattern; problems are recorded with
    /// their position.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let on_error = OnError::parse(&map)?;
        let field = map.str("field").unwrap_or("message").to_string();
        let node = map.required("pattern", r"'^(?<level>\w+) (?<msg>.*)'")?;
        let pattern = node.as_str()?;
        // Compiling without the JIT is enough to validate, and cheap.
        if let Err(e) = compile(pattern, false) {
            node.error(e);
            return None;
        }
        Some(Self {
            field,
            pattern: pattern.to_string(),
            on_error,
        })
    }
}

/// Compiles `pattern` and lists its named groups as (index, name).
fn compile(pattern: &str, jit: bool) -> Result<(Regex, Vec<(usize, String)>), String> {
    let re = RegexBuilder::new()
        .jit_if_available(jit)
        .max_jit_stack_size(jit.then_some(JIT_STACK_BYTES))
        .build(pattern)
        .map_err(|e| format!("invalid regular expression `{pattern}`: {e}"))?;
    let names: Vec<(usize, String)> = re
        .capture_names()
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.as_ref().map(|n| (i, n.clone())))
        .collect();
    if names.is_empty() {
        return Err(format!(
            "the pattern `{pattern}` has no named group, so it would add no field; \
             name the parts to keep, e.g. `(?<level>\\w+)`"
        ));
    }
    Ok((re, names))
}

/// The running `parse_regex` processor.
pub struct ParseRegex {
    parse: FieldParse,
    matcher: RegexMatcher,
}

impl ParseRegex {
    /// Builds the processor: compiles the pattern with the JIT and takes
    /// the counters so the hot path only bumps atomics.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            parse: FieldParse::new(WHO, &c.field, &c.on_error, &metrics),
            matcher: RegexMatcher::new(&c.pattern).map_err(anyhow::Error::msg)?,
        })
    }
}

impl Processor for ParseRegex {
    fn process(&self, batch: &mut EventBatch) {
        let mut scratch = self.matcher.scratch();
        self.parse.apply(batch, true, |bytes, base, parsed| {
            self.matcher.captures(&mut scratch, bytes, base, parsed)
        });
        self.matcher.recycle(scratch);
    }
}

/// Why a line did not parse.
#[derive(Debug)]
pub enum RegexError {
    /// The pattern does not match.
    NoMatch,
    /// PCRE2 gave up (match limit, JIT stack).
    Engine(pcre2::Error),
}

impl std::fmt::Display for RegexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegexError::NoMatch => f.write_str("pattern does not match"),
            RegexError::Engine(e) => write!(f, "matching failed: {e}"),
        }
    }
}

/// A compiled pattern with its named groups, reusable match state kept in a
/// pool (one per worker in practice). Public for the benchmarks and the
/// fuzz targets.
pub struct RegexMatcher {
    re: Regex,
    /// (group index, field name) for every named group.
    names: Vec<(usize, Key)>,
    pool: Mutex<Vec<CaptureLocations>>,
}

impl RegexMatcher {
    /// Compiles `pattern` with the JIT; fails on an invalid pattern or one
    /// without named groups.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let (re, names) = compile(pattern, true)?;
        Ok(Self {
            names: names.iter().map(|(i, n)| (*i, config_key(n))).collect(),
            re,
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Match state for one batch; give it back with [`recycle`](Self::recycle).
    /// Taken per batch so the lock is not on the per-event path.
    pub fn scratch(&self) -> CaptureLocations {
        self.pool
            .lock()
            .pop()
            .unwrap_or_else(|| self.re.capture_locations())
    }

    /// Returns match state to the pool.
    pub fn recycle(&self, locs: CaptureLocations) {
        self.pool.lock().push(locs);
    }

    /// Matches `field` and appends one entry per participating named group
    /// to `out`: spans of the batch buffer when `base` (the field's offset in
    /// it) is known, owned copies otherwise.
    #[inline]
    pub fn captures(
        &self,
        locs: &mut CaptureLocations,
        field: &[u8],
        base: Option<u32>,
        out: &mut Vec<(Key, Value)>,
    ) -> Result<(), RegexError> {
        match self.re.captures_read(locs, field) {
            Ok(Some(_)) => {
                for (i, name) in &self.names {
                    // PCRE2 offsets lie inside the subject; `get` on the
                    // field re-checks before any slicing by `part_value`.
                    if let Some((s, e)) = locs.get(*i) {
                        if s <= e && e <= field.len() {
                            out.push((name.clone(), common::part_value(field, base, s, e)));
                        }
                    }
                }
                Ok(())
            }
            Ok(None) => Err(RegexError::NoMatch),
            Err(e) => Err(RegexError::Engine(e)),
        }
    }
}

/// Registration of `type: parse_regex`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "parse_regex",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "parse_regex"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(ParseRegex::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::parse_json::tests::process_lines;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::Metrics;
    use std::sync::Arc;

    const PAT: &str = r"\[(?P<time>[^]]+)]\s\[(?<level>\w+)]\s\[(?<pid>\d+)]\s(?<file>\S+):(?<line>\d+)\slog:(?<log>.*)";

    fn config(yaml: &str) -> Result<Config, Vec<String>> {
        let file: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&file, yaml).expect("yaml");
        let errs = ConfigErrors::new();
        let c = Node::root(&file, &raw, &errs)
            .as_map(KEYS)
            .and_then(Config::parse);
        let v: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
        match c {
            Some(c) if v.is_empty() => Ok(c),
            _ => Err(v),
        }
    }

    fn build(extra: &str, pattern: &str) -> (ParseRegex, Arc<Metrics>) {
        let yaml = format!("type: parse_regex\npattern: '{pattern}'\n{extra}");
        let c = config(&yaml).expect("config");
        let m = Metrics::new();
        let p =
            ParseRegex::new(&c, m.component("p", "processor", "r", "parse_regex")).expect("build");
        (p, m)
    }

    fn text<'a>(b: &'a EventBatch, ev: usize, name: &str) -> Option<&'a [u8]> {
        b.bytes_of(b.events[ev].get(name)?)
    }

    const LINE: &[u8] = b"[2025-04-03 10:02:06.561793] [info] [131172] /root/stdout-test/server_stdout.go:165 log:ZQsC8JI2";

    #[test]
    fn named_captures_become_spans() {
        let (p, _) = build("", PAT);
        let b = process_lines(&p, &[LINE]);
        let ev = &b.events[0];
        let names: Vec<&str> = ev.fields.iter().map(|(k, _)| &**k).collect();
        assert_eq!(names, ["time", "level", "pid", "file", "line", "log"]);
        assert!(ev.fields.iter().all(|(_, v)| matches!(v, Value::Span(_))));
        assert_eq!(
            text(&b, 0, "time"),
            Some(&b"2025-04-03 10:02:06.561793"[..])
        );
        assert_eq!(text(&b, 0, "pid"), Some(&b"131172"[..]));
        assert_eq!(text(&b, 0, "log"), Some(&b"ZQsC8JI2"[..]));
    }

    #[test]
    fn non_participating_groups_are_absent_and_invalid_utf8_matches() {
        let (p, _) = build("", r"^(?<a>x+)|(?<b>y+)(?<rest>.*)");
        let b = process_lines(&p, &[b"yy\xff\xfe", b"xx"]);
        assert!(b.events[0].get("a").is_none());
        assert_eq!(text(&b, 0, "b"), Some(&b"yy"[..]));
        assert_eq!(text(&b, 0, "rest"), Some(&b"\xff\xfe"[..]));
        assert_eq!(text(&b, 1, "a"), Some(&b"xx"[..]));
        assert!(b.events[1].get("b").is_none());
    }

    #[test]
    fn failures_follow_on_error() {
        let lines: &[&[u8]] = &[b"no match here", b"", b"\xff\xfe\n", LINE];
        let (p, m) = build("", PAT);
        let b = process_lines(&p, lines);
        assert_eq!(b.events.len(), 4);
        for ev in &b.events[..3] {
            assert_eq!(
                ev.get("parse_error"),
                Some(&Value::Str("parse_regex: pattern does not match".into()))
            );
            assert!(ev.get("level").is_none());
        }
        assert!(b.events[3].get("parse_error").is_none());
        assert!(m.render().contains("error_type=\"parse_failed\"} 3"));

        let (p, m) = build("on_error: drop", PAT);
        let b = process_lines(&p, lines);
        assert_eq!(b.events.len(), 1);
        assert!(m.render().contains("reason=\"parse_error\"} 3"));

        let (p, _) = build("on_error: raw\nraw_field: line_raw", PAT);
        let b = process_lines(&p, lines);
        assert_eq!(text(&b, 0, "line_raw"), Some(&b"no match here"[..]));
        assert!(b.events[0].get("parse_error").is_some());
    }

    #[test]
    fn other_fields_and_owned_values() {
        // Parse a field produced by an earlier step: an owned string.
        let m = RegexMatcher::new(r"(?<k>\w+)=(?<v>\w+)").expect("compile");
        let mut locs = m.scratch();
        let mut out = Vec::new();
        m.captures(&mut locs, b"  a=b", None, &mut out)
            .expect("match");
        assert_eq!(
            out,
            vec![
                ("k".into(), Value::Str("a".into())),
                ("v".into(), Value::Str("b".into()))
            ]
        );
        m.recycle(locs);
        let (p, _) = build("field: nope", PAT);
        let b = process_lines(&p, &[LINE]);
        assert_eq!(
            b.events[0].get("parse_error"),
            Some(&Value::Str(
                "parse_regex: field is missing or not text".into()
            ))
        );
    }

    #[test]
    fn one_mib_line_and_pathological_pattern() {
        let mut big = b"[t] [info] [1] f:1 log:".to_vec();
        big.extend(std::iter::repeat_n(b'x', 1 << 20));
        let (p, _) = build("", PAT);
        let b = process_lines(&p, &[&big]);
        assert_eq!(text(&b, 0, "log").map(<[u8]>::len), Some(1 << 20));
        // A repeated class needs no JIT stack, however long the line.
        let (p, _) = build("", r"^(?<all>[xy]*)$");
        let b = process_lines(&p, &[&big[23..]]);
        assert_eq!(text(&b, 0, "all").map(<[u8]>::len), Some(1 << 20));
        // A repeated alternation stacks a frame per byte: past the JIT stack
        // limit the line fails to parse, cleanly.
        let (p, _) = build("", r"^(?<all>(?:x|y)*)$");
        let b = process_lines(&p, &[&big[23..]]);
        let Some(Value::Str(e)) = b.events[0].get("parse_error") else {
            panic!("failure expected")
        };
        assert!(e.contains("JIT stack limit"), "{e}");
        // Catastrophic backtracking hits the match limit: a failure, not a hang.
        let (p, _) = build("", r"^(?<a>(x+x+)+y)");
        let evil = vec![b'x'; 4096];
        let b = process_lines(&p, &[&evil]);
        let Some(Value::Str(e)) = b.events[0].get("parse_error") else {
            panic!("failure expected")
        };
        assert!(
            e.contains("matching failed") || e.contains("does not match"),
            "{e}"
        );
    }

    #[test]
    fn config_errors_are_positioned() {
        let e = config("type: parse_regex\npattern: '(?<a>x'").unwrap_err();
        assert!(
            e[0].starts_with("t.yaml:2:10: invalid regular expression `(?<a>x`"),
            "{e:?}"
        );
        let e = config("type: parse_regex\npattern: '(x)'").unwrap_err();
        assert!(e[0].contains("has no named group"), "{e:?}");
        let e = config("type: parse_regex").unwrap_err();
        assert!(e[0].contains("missing required key `pattern`"), "{e:?}");
    }

    #[test]
    fn random_inputs_never_panic() {
        let (p, _) = build("", PAT);
        let (q, _) = build("", r"(?<a>[a-z]+)(?:=(?<b>\d*))?");
        let mut rng = crate::processors::parse_delimiter::tests::Rng(11);
        for _ in 0..20_000 {
            let line = rng.mutate(&[LINE, b"k=1 z=22"], b"[] :=\xff\x00log");
            process_lines(&p, &[&line]);
            process_lines(&q, &[&line]);
        }
    }
}
