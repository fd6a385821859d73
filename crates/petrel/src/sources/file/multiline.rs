//! Multiline: joining lines into events inside the file source, so that an
//! event is never split across reads.
//!
//! The reader hands over the complete lines of each block; [`Multiline::group`]
//! returns the events that are known to be complete and the offset where
//! the still open event starts. The reader keeps the open event's bytes
//! with the next read (so the event stays one contiguous span of one
//! buffer, with no copy per line) and does not commit them. An open event
//! is emitted when the file has not grown for `timeout_ms`.
//!
//! Rules:
//! - `start_pattern`: a line matching it starts an event; other lines are
//!   appended to the current one. Lines before the first start line (no
//!   event open yet, e.g. reading from the middle of a file) become one
//!   event each.
//! - `continue_pattern`: a line matching it is appended to the current
//!   event; any other line starts a new one.
//! - `end_pattern`: lines are appended until a line matching it, which ends
//!   the event.
//! - `mode: timestamp`: like `start_pattern`, where a start line is one
//!   that begins with a timestamp (`timestamp_formats`, default: ISO 8601,
//!   `[YYYY-MM-DD hh:mm:ss.ffffff]`, syslog `MMM dd hh:mm:ss`, Apache/nginx
//!   `dd/MMM/yyyy:hh:mm:ss`). No regex runs on this path.
//!
//! Patterns are matched at the start of the line only (anchored), so a long
//! line costs no more than its prefix. An event reaching `max_lines` lines
//! or `max_bytes` bytes is cut there (counted as `multiline_cut`) and the
//! rest continues as a new event.

use std::time::Duration;

use petrel_core::config::{Map, Node};
use petrel_core::Span;
use petrel_time::{self as timestamp, TimeZone, TimestampFormat};
use regex::bytes::Regex;

/// Keys accepted under `multiline:`.
pub const KEYS: &[&str] = &[
    "start_pattern",
    "continue_pattern",
    "end_pattern",
    "mode",
    "timestamp_formats",
    "timeout_ms",
    "max_lines",
    "max_bytes",
];

/// The `multiline` key, documented once for every plugin that reads it.
pub const MULTILINE_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "multiline",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Joins lines into events in the source, so an event is never split across reads: exactly one rule of `start_pattern`, `continue_pattern`, `end_pattern` (regexes anchored at the line start) or `mode: timestamp` (a line beginning with a timestamp of `timestamp_formats` starts an event); `timeout_ms` (`1000`): a held event is emitted when the file has not grown for this long; `max_lines` (`1000`) and `max_bytes` (`max_line_bytes`): an event is cut there (counted `multiline_cut`)."#,
};

/// How event boundaries are found.
#[derive(Debug, Clone)]
pub enum Rule {
    /// A matching line starts an event.
    Start(Regex),
    /// A matching line continues the current event.
    Continue(Regex),
    /// A matching line ends the current event.
    End(Regex),
    /// A line starting with a timestamp starts an event (`None`: the
    /// default set of formats).
    Timestamp(Option<Vec<TimestampFormat>>),
}

/// Multiline settings of a file source.
#[derive(Debug, Clone)]
pub struct Multiline {
    /// Boundary rule.
    pub rule: Rule,
    /// Flush an open event when the file did not grow for this long.
    pub timeout: Duration,
    /// Most lines per event.
    pub max_lines: usize,
    /// Most bytes per event.
    pub max_bytes: usize,
}

fn anchored(n: Node<'_>, p: &str) -> Option<Regex> {
    match Regex::new(&format!("^(?:{p})")) {
        Ok(r) => Some(r),
        Err(e) => {
            let msg = e
                .to_string()
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_string();
            n.error(format!("invalid regex `{p}`: {msg}"));
            None
        }
    }
}

impl Multiline {
    /// Reads the `multiline:` mapping; `default_max_bytes` is the source's
    /// `max_line_bytes`.
    pub fn parse(node: Node<'_>, default_max_bytes: usize) -> Option<Self> {
        let map: Map<'_> = node.as_map(KEYS)?;
        let mut rules = Vec::new();
        for key in ["start_pattern", "continue_pattern", "end_pattern"] {
            if let Some(n) = map.get(key) {
                let re = anchored(n, n.as_str()?)?;
                rules.push(match key {
                    "start_pattern" => Rule::Start(re),
                    "continue_pattern" => Rule::Continue(re),
                    _ => Rule::End(re),
                });
            }
        }
        match map.choice("mode", &["pattern", "timestamp"]) {
            Some("timestamp") => {
                let formats = match map.get("timestamp_formats") {
                    None => None,
                    Some(n) => {
                        let mut v = Vec::new();
                        for (f, fnode) in n.as_str_list() {
                            match TimestampFormat::new(f, TimeZone::Utc) {
                                Ok(t) => v.push(t),
                                Err(e) => {
                                    fnode.error(format!("bad timestamp format `{f}`: {}", e.0))
                                }
                            }
                        }
                        Some(v)
                    }
                };
                rules.push(Rule::Timestamp(formats));
            }
            None if map.get("mode").is_some() => return None,
            _ => {}
        }
        if rules.len() != 1 {
            map.node().error(
                "`multiline` needs exactly one of `start_pattern`, `continue_pattern`, `end_pattern` or `mode: timestamp`",
            );
            return None;
        }
        Some(Self {
            rule: rules.remove(0),
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(1000)),
            max_lines: map.u64("max_lines", false).unwrap_or(1000).max(1) as usize,
            max_bytes: map
                .u64("max_bytes", true)
                .map(|b| b as usize)
                .unwrap_or(default_max_bytes)
                .max(64),
        })
    }

    fn is_start(&self, line: &[u8]) -> bool {
        match &self.rule {
            Rule::Start(r) => r.is_match(line),
            Rule::Timestamp(None) => timestamp::starts_with_timestamp(line),
            Rule::Timestamp(Some(fs)) => fs.iter().any(|f| f.parse_prefix(line).is_some()),
            Rule::Continue(_) | Rule::End(_) => false,
        }
    }

    /// Groups the complete lines of `buf` (every line ends with `\n`) into
    /// events, pushed to `out` as spans without their last newline. Returns
    /// the offset where the open event starts (`buf.len()` when none is
    /// open) and the number of events cut by `max_lines`/`max_bytes`.
    pub fn group(&self, buf: &[u8], out: &mut Vec<Span>) -> (usize, u64) {
        let mut cut = 0;
        // The open event: its start and line count.
        let mut open: Option<(usize, usize)> = None;
        let mut s = 0;
        let close = |out: &mut Vec<Span>, start: usize, end_nl: usize| {
            out.push(Span::new(start, end_nl - start));
        };
        for nl in memchr::memchr_iter(b'\n', buf) {
            let line = &buf[s..nl];
            match &self.rule {
                Rule::Start(_) | Rule::Timestamp(_) => {
                    if self.is_start(line) {
                        if let Some((st, n)) = open {
                            if n > 0 {
                                close(out, st, s - 1);
                            }
                        }
                        open = Some((s, 1));
                    } else if let Some((_, n)) = open.as_mut() {
                        *n += 1;
                    } else {
                        // Before the first start line: an event of its own.
                        close(out, s, nl);
                    }
                }
                Rule::Continue(r) => {
                    if open.is_some() && r.is_match(line) {
                        if let Some((_, n)) = open.as_mut() {
                            *n += 1;
                        }
                    } else {
                        if let Some((st, _)) = open {
                            close(out, st, s - 1);
                        }
                        open = Some((s, 1));
                    }
                }
                Rule::End(r) => {
                    let (st, _) = *open.get_or_insert((s, 0));
                    if let Some((_, n)) = open.as_mut() {
                        *n += 1;
                    }
                    if r.is_match(line) {
                        close(out, st, nl);
                        open = None;
                    }
                }
            }
            // Limits: cut the open event after this line.
            if let Some((st, n)) = open {
                if n >= self.max_lines || nl + 1 - st >= self.max_bytes {
                    cut += 1;
                    let mut p = st;
                    while nl - p > self.max_bytes {
                        out.push(Span::new(p, self.max_bytes));
                        p += self.max_bytes;
                    }
                    close(out, p, nl);
                    // The lines that follow still belong to the cut event:
                    // they form a new one rather than one event each.
                    open = match self.rule {
                        Rule::Start(_) | Rule::Timestamp(_) => Some((nl + 1, 0)),
                        _ => None,
                    };
                }
            }
            s = nl + 1;
        }
        (open.map(|(st, _)| st).unwrap_or(buf.len()), cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors};
    use std::sync::Arc;

    fn ml(yaml: &str) -> Result<Multiline, Vec<String>> {
        let f: Arc<str> = "m.yaml".into();
        let raw = parse_yaml(&f, yaml).unwrap();
        let errs = ConfigErrors::new();
        let m = Multiline::parse(petrel_core::config::Node::root(&f, &raw, &errs), 1 << 20);
        let v: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
        match m {
            Some(m) if v.is_empty() => Ok(m),
            _ => Err(v),
        }
    }

    fn events(m: &Multiline, buf: &[u8]) -> (Vec<String>, String) {
        let mut out = Vec::new();
        let (held, _) = m.group(buf, &mut out);
        (
            out.iter()
                .map(|s| String::from_utf8_lossy(s.get(buf)).into_owned())
                .collect(),
            String::from_utf8_lossy(&buf[held..]).into_owned(),
        )
    }

    #[test]
    fn start_pattern_holds_the_last_event() {
        let m = ml("start_pattern: '\\[\\d{4}-'").unwrap();
        let buf = b"orphan\n[2025-01-01] a\n  at x\n  at y\n[2025-01-02] b\n  at z\n";
        let (ev, held) = events(&m, buf);
        assert_eq!(ev, vec!["orphan", "[2025-01-01] a\n  at x\n  at y"]);
        assert_eq!(held, "[2025-01-02] b\n  at z\n");
    }

    #[test]
    fn timestamp_mode_uses_the_default_formats() {
        let m = ml("mode: timestamp").unwrap();
        let buf = b"[2025-04-03 10:02:06.561793] [info] boom\n    at com.example.A(A.java:1)\n2025-04-03T10:02:07Z next\n";
        let (ev, held) = events(&m, buf);
        assert_eq!(
            ev,
            vec!["[2025-04-03 10:02:06.561793] [info] boom\n    at com.example.A(A.java:1)"]
        );
        assert_eq!(held, "2025-04-03T10:02:07Z next\n");
    }

    #[test]
    fn continue_and_end_patterns() {
        let c = ml("continue_pattern: '\\s'").unwrap();
        let (ev, held) = events(&c, b"a\n b\n c\nd\n e\n");
        assert_eq!(ev, vec!["a\n b\n c"]);
        assert_eq!(held, "d\n e\n");
        let e = ml("end_pattern: '.*;$'").unwrap();
        let (ev, held) = events(&e, b"x\ny;\nz\n");
        assert_eq!(ev, vec!["x\ny;"]);
        assert_eq!(held, "z\n");
    }

    #[test]
    fn max_lines_cuts_and_counts() {
        let m = ml("start_pattern: S\nmax_lines: 2").unwrap();
        let mut out = Vec::new();
        let buf = b"S1\nc\nc\nc\nS2\n";
        let (held, cut) = m.group(buf, &mut out);
        assert_eq!(cut, 2, "both two-line events reached max_lines");
        let ev: Vec<&[u8]> = out.iter().map(|s| s.get(buf)).collect();
        assert_eq!(ev, vec![&b"S1\nc"[..], b"c\nc"]);
        assert_eq!(&buf[held..], b"S2\n");
    }

    #[test]
    fn config_errors() {
        assert!(ml("start_pattern: '('").unwrap_err()[0].contains("invalid regex"));
        assert!(ml("timeout_ms: 5").unwrap_err()[0].contains("exactly one"));
        assert!(ml("start_pattern: a\nend_pattern: b").unwrap_err()[0].contains("exactly one"));
    }
}
