//! `{{ field }}` templates: Kafka topics (`app-{{ level }}`), index names,
//! throttle keys, and the lines of the `text` encoding
//! (`{{ timestamp | %b %e %H:%M:%S }} {{ host }} {{ app }}: {{ message }}`).
//!
//! A template is compiled once, when the configuration is read: literal
//! text, and fields with filters after `|` (`{{ proc_id | prefix([) |
//! suffix(]) }}`):
//!
//! - a strftime pattern (anything with a `%`, see
//!   [`petrel_time::OUTPUT_DIRECTIVES`]): the value as a time, written in
//!   the template's zone (first filter only);
//! - `json`: the value as JSON (text quoted and escaped; first filter only);
//! - `upper`, `lower`: ASCII case;
//! - `prefix(TEXT)`, `suffix(TEXT)`: text written before or after the
//!   value only when there is one (`TEXT` may be quoted: `prefix(" ")`);
//!   such a field is optional: missing, it writes nothing at all.
//!
//! Fields are the event's (dotted paths reach into objects), then the
//! batch's metadata (`host`, `file`, `source_type`, ...). `timestamp` is the
//! event time (RFC 3339 without a filter), else a `timestamp` field, else the
//! time the template is rendered. A field that is missing, empty or null
//! renders as the caller's `missing` text and is counted.

use std::io::Write as _;

use crate::config::Node;
use crate::event::{Event, EventBatch, Value};
use crate::json::{write_json_bytes, write_json_value, EncodeStats};
use petrel_time::{TimeFormatter, TimeZone, TimestampFormat};

/// What a field is passed through before it is written.
#[derive(Debug, Clone, PartialEq)]
enum Filter {
    /// The value as a time, formatted.
    Time(Box<TimeFormatter>),
    /// The value as JSON.
    Json,
    /// ASCII upper case.
    Upper,
    /// ASCII lower case.
    Lower,
    /// Text before a present value.
    Prefix(String),
    /// Text after a present value.
    Suffix(String),
}

/// The named filters, for error messages.
const FILTERS: &str = "a strftime pattern such as `%b %e %H:%M:%S`, `json`, `upper`, `lower`, `prefix(TEXT)` or `suffix(TEXT)`";

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Lit(String),
    Field { name: String, filters: Vec<Filter> },
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

/// What rendering needs besides the event.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    /// Written for a missing, empty or null field.
    pub missing: &'a [u8],
    /// The time written for `timestamp` when the event has none
    /// (read once per batch by the caller).
    pub now_ns: i64,
}

impl Template {
    /// Parses `text`; times of the time filter are written in UTC. An
    /// unclosed `{{`, an empty field name, an unknown filter or a bad
    /// strftime pattern is reported at `node`.
    pub fn parse(text: &str, node: Node<'_>) -> Option<Self> {
        Self::parse_in(text, node, &TimeZone::Utc)
    }

    /// Parses `text` as [`Template::parse`] does, times written in `tz`.
    pub fn parse_in(text: &str, node: Node<'_>, tz: &TimeZone) -> Option<Self> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Lit(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                node.error(format!(
                    "unclosed `{{{{` in template `{text}`; write `{{{{ field }}}}`"
                ));
                return None;
            };
            let inner = &after[..close];
            let mut pieces = inner.split('|');
            let name = pieces.next().unwrap_or_default().trim();
            if name.is_empty() {
                node.error(format!(
                    "empty `{{{{ }}}}` in template `{text}`; name a field inside"
                ));
                return None;
            }
            let mut filters = Vec::new();
            for f in pieces {
                let f = parse_filter(f.trim(), name, text, node, tz)?;
                if matches!(f, Filter::Time(_) | Filter::Json) && !filters.is_empty() {
                    node.error(format!(
                        "in template `{text}`, a time pattern or `json` must be the first filter of `{name}`"
                    ));
                    return None;
                }
                filters.push(f);
            }
            parts.push(Part::Field {
                name: name.to_string(),
                filters,
            });
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Lit(rest.to_string()));
        }
        Some(Self { parts })
    }

    /// The text when the template has no fields.
    pub fn as_static(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Lit(s)] => Some(s),
            _ => None,
        }
    }

    /// Renders into `out`; false when a field is missing or empty.
    pub fn render(&self, ev: &Event, batch: &EventBatch, out: &mut String) -> bool {
        self.render_with(ev, batch, out, |s, o| o.push_str(s))
    }

    /// Renders into `out`, literal text through `lit` (which may expand it:
    /// strftime in index names, so that `%` in a field value stays as it
    /// is). Missing fields render as nothing and make the result false.
    pub fn render_with(
        &self,
        ev: &Event,
        batch: &EventBatch,
        out: &mut String,
        mut lit: impl FnMut(&str, &mut String),
    ) -> bool {
        out.clear();
        let mut complete = true;
        let mut scratch = Vec::new();
        let mut stats = EncodeStats::default();
        let opts = RenderOptions {
            missing: b"",
            now_ns: 0,
        };
        for p in &self.parts {
            match p {
                Part::Lit(s) => lit(s, out),
                Part::Field { name, filters } => {
                    // Plain text fields, the common case of topics and
                    // index names, without the scratch buffer.
                    if filters.is_empty() && name != "timestamp" {
                        match ev.get_path(name) {
                            Some(Value::Int(i)) => {
                                let _ = std::fmt::Write::write_fmt(out, format_args!("{i}"));
                                continue;
                            }
                            Some(v) => match batch.bytes_of(v) {
                                Some(b) if !b.is_empty() => {
                                    out.push_str(&String::from_utf8_lossy(b));
                                    continue;
                                }
                                Some(_) => {
                                    complete = false;
                                    continue;
                                }
                                None => {}
                            },
                            None => match batch.meta_field(ev, name) {
                                Some(b) if !b.is_empty() => {
                                    out.push_str(&String::from_utf8_lossy(b));
                                    continue;
                                }
                                _ => {
                                    complete = false;
                                    continue;
                                }
                            },
                        }
                    }
                    scratch.clear();
                    let now = if name == "timestamp" && ev.time_ns.is_none() {
                        now_ns()
                    } else {
                        0
                    };
                    let opts = RenderOptions {
                        now_ns: now,
                        ..opts
                    };
                    if render_field(name, filters, ev, batch, opts, &mut scratch, &mut stats) {
                        out.push_str(&String::from_utf8_lossy(&scratch));
                    } else if !optional(filters) {
                        complete = false;
                    }
                }
            }
        }
        complete
    }

    /// Appends the rendering to `out` as bytes (field values as they are,
    /// not necessarily UTF-8); returns how many fields were missing (each
    /// written as `opts.missing`).
    pub fn render_bytes(
        &self,
        ev: &Event,
        batch: &EventBatch,
        opts: RenderOptions<'_>,
        out: &mut Vec<u8>,
        stats: &mut EncodeStats,
    ) -> u32 {
        let mut missing = 0;
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.extend_from_slice(s.as_bytes()),
                Part::Field { name, filters } => {
                    if !render_field(name, filters, ev, batch, opts, out, stats)
                        && !optional(filters)
                    {
                        out.extend_from_slice(opts.missing);
                        missing += 1;
                    }
                }
            }
        }
        missing
    }

    /// Renders into `out` with every field's value passed through
    /// `value` (its text, lossy UTF-8; `None` when missing or empty), the
    /// literal text as it is: for templates whose values must not change
    /// the meaning of the literal text (a file path, where a value must
    /// not add directories). Returns how many fields were missing.
    pub fn render_values(
        &self,
        ev: &Event,
        batch: &EventBatch,
        out: &mut String,
        mut value: impl FnMut(Option<&str>, &mut String),
    ) -> u32 {
        out.clear();
        let mut missing = 0;
        let mut scratch = Vec::new();
        let mut stats = EncodeStats::default();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Field { name, filters } => {
                    scratch.clear();
                    let opts = RenderOptions {
                        missing: b"",
                        now_ns: if name == "timestamp" && ev.time_ns.is_none() {
                            now_ns()
                        } else {
                            0
                        },
                    };
                    let found =
                        render_field(name, filters, ev, batch, opts, &mut scratch, &mut stats)
                            && !scratch.is_empty();
                    if found {
                        value(Some(&String::from_utf8_lossy(&scratch)), out);
                    } else {
                        missing += u32::from(!optional(filters));
                        value(None, out);
                    }
                }
            }
        }
        missing
    }

    /// The field names the template reads.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field { name, .. } => Some(name.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// The literal parts, for checking them when the template is parsed.
    pub fn literals(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Lit(s) => Some(s.as_str()),
            Part::Field { .. } => None,
        })
    }
}

/// A field with `prefix` or `suffix` is optional: when missing it writes
/// nothing, not the `missing` text, and is not counted.
fn optional(filters: &[Filter]) -> bool {
    filters
        .iter()
        .any(|f| matches!(f, Filter::Prefix(_) | Filter::Suffix(_)))
}

/// The current time in nanoseconds since the epoch (0 if the clock is
/// before 1970).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn parse_filter(f: &str, field: &str, text: &str, node: Node<'_>, tz: &TimeZone) -> Option<Filter> {
    if f.contains('%') {
        return match TimeFormatter::new(f, tz.clone()) {
            Ok(t) => Some(Filter::Time(Box::new(t))),
            Err(e) => {
                node.error(format!("template `{text}`, field `{field}`: {e}"));
                None
            }
        };
    }
    let arg = |word: &str| {
        let a = f
            .strip_prefix(word)?
            .trim_start()
            .strip_prefix('(')?
            .strip_suffix(')')?;
        let a = match a.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
            Some(q) => q,
            None => a.trim(),
        };
        Some(a.to_string())
    };
    if let Some(a) = arg("prefix") {
        return Some(Filter::Prefix(a));
    }
    if let Some(a) = arg("suffix") {
        return Some(Filter::Suffix(a));
    }
    match f {
        "json" => Some(Filter::Json),
        "upper" => Some(Filter::Upper),
        "lower" => Some(Filter::Lower),
        _ => {
            node.error(format!(
                "unknown filter `{f}` on `{field}` in template `{text}`; use {FILTERS}"
            ));
            None
        }
    }
}

/// Appends field `name` of `ev` through `filters`; false (and nothing
/// written) when it is missing, empty, null, or not a time for the time
/// filter.
fn render_field(
    name: &str,
    filters: &[Filter],
    ev: &Event,
    batch: &EventBatch,
    opts: RenderOptions<'_>,
    out: &mut Vec<u8>,
    stats: &mut EncodeStats,
) -> bool {
    let start = out.len();
    if !render_value(name, filters.first(), ev, batch, opts, out, stats) {
        return false;
    }
    for f in filters {
        match f {
            Filter::Upper => out[start..].make_ascii_uppercase(),
            Filter::Lower => out[start..].make_ascii_lowercase(),
            Filter::Prefix(p) => {
                out.splice(start..start, p.bytes());
            }
            Filter::Suffix(x) => out.extend_from_slice(x.as_bytes()),
            Filter::Time(_) | Filter::Json => {}
        }
    }
    true
}

/// Appends the value of field `name`, as a time or as JSON when `first` is
/// such a filter, else as text.
fn render_value(
    name: &str,
    first: Option<&Filter>,
    ev: &Event,
    batch: &EventBatch,
    opts: RenderOptions<'_>,
    out: &mut Vec<u8>,
    stats: &mut EncodeStats,
) -> bool {
    let value = ev.get_path(name);
    let meta = || batch.meta_field(ev, name).filter(|b| !b.is_empty());
    match first {
        Some(Filter::Time(fmt)) => {
            let ns = if name == "timestamp" {
                ev.time_ns
                    .or_else(|| value.and_then(|v| time_of(v, batch, fmt.time_zone())))
                    .unwrap_or(opts.now_ns)
            } else {
                match value
                    .and_then(|v| time_of(v, batch, fmt.time_zone()))
                    .or_else(|| {
                        let b = meta()?;
                        TimestampFormat::auto(fmt.time_zone().clone())
                            .parse(b)
                            .map(|(ns, _)| ns)
                    }) {
                    Some(ns) => ns,
                    None => return false,
                }
            };
            fmt.write(ns, out);
            return true;
        }
        Some(Filter::Json) => {
            match value {
                Some(Value::Null) | None if meta().is_none() => return false,
                Some(v) => write_json_value(batch, v, out, stats),
                None => write_json_bytes(meta().unwrap_or_default(), out, stats),
            }
            return true;
        }
        _ => {}
    }
    match value {
        None if name == "timestamp" => {
            petrel_time::write_rfc3339(ev.time_ns.unwrap_or(opts.now_ns), out);
            true
        }
        None => match meta() {
            Some(b) => {
                out.extend_from_slice(b);
                true
            }
            None => false,
        },
        Some(_) if name == "timestamp" && ev.time_ns.is_some() => {
            petrel_time::write_rfc3339(ev.time_ns.unwrap_or_default(), out);
            true
        }
        Some(v) => write_plain(v, batch, out, stats),
    }
}

/// Appends a value as text: text as its bytes, numbers and booleans as
/// written in JSON, arrays and objects as JSON. False for null and empty
/// text.
fn write_plain(v: &Value, batch: &EventBatch, out: &mut Vec<u8>, stats: &mut EncodeStats) -> bool {
    match v {
        Value::Span(_) | Value::Str(_) | Value::Bytes(_) => match batch.bytes_of(v) {
            Some(b) if !b.is_empty() => {
                out.extend_from_slice(b);
                true
            }
            _ => false,
        },
        Value::Int(i) => {
            let _ = write!(out, "{i}");
            true
        }
        Value::Float(x) if x.is_finite() => {
            let _ = write!(out, "{x}");
            true
        }
        Value::Bool(b) => {
            out.extend_from_slice(if *b { b"true" } else { b"false" });
            true
        }
        Value::Float(_) | Value::Null => false,
        Value::Array(_) | Value::Object(_) => {
            write_json_value(batch, v, out, stats);
            true
        }
    }
}

/// A field value read as a time: epoch numbers (unit from the digit count),
/// or text in one of the common formats (times without an offset in `tz`).
fn time_of(v: &Value, batch: &EventBatch, tz: &TimeZone) -> Option<i64> {
    let auto = TimestampFormat::auto(tz.clone());
    match v {
        Value::Int(i) => auto.from_integer(*i),
        Value::Float(x) => auto.from_float(*x),
        _ => auto.parse(batch.bytes_of(v)?).map(|(ns, _)| ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_yaml, ConfigErrors};
    use crate::event::{SourceInfo, Span};
    use std::sync::Arc;

    fn tpl_in(s: &str, tz: &str) -> Result<Template, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, "x: 1").unwrap();
        let errs = ConfigErrors::new();
        let tz = TimeZone::from_name(tz).unwrap();
        Template::parse_in(s, Node::root(&f, &raw, &errs), &tz).ok_or_else(|| {
            errs.into_vec()
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    fn tpl(s: &str) -> Option<Template> {
        tpl_in(s, "UTC").ok()
    }

    fn batch() -> EventBatch {
        let meta: Arc<[(crate::Key, Arc<str>)]> = Arc::from(vec![("host".into(), "web1".into())]);
        EventBatch::new(
            bytes::Bytes::from_static(b"warn"),
            Arc::new(SourceInfo::file("/x", meta)),
        )
    }

    #[test]
    fn renders_fields_and_reports_missing() {
        let t = tpl("app-{{ level }}").unwrap();
        let batch = batch();
        let mut ev = Event::from_span(Span::new(0, 0));
        let mut out = String::new();
        assert!(!t.render(&ev, &batch, &mut out));
        ev.set("level".into(), Value::Span(Span::new(0, 4)));
        assert!(t.render(&ev, &batch, &mut out));
        assert_eq!(out, "app-warn");
        let f = tpl("f={{ file }}").unwrap();
        assert!(f.render(&ev, &batch, &mut out));
        assert_eq!(out, "f=/x");
        assert_eq!(tpl("plain").unwrap().as_static(), Some("plain"));
        assert!(tpl("bad-{{ level").is_none());
        let up =
            tpl("{{ level | upper | prefix([) | suffix(\"] \") }}{{ nope | prefix(x) }}").unwrap();
        assert!(up.render(&ev, &batch, &mut out));
        assert_eq!(out, "[WARN] ");
    }

    #[test]
    fn text_lines_with_times_filters_and_missing_fields() {
        let t = tpl_in(
            "{{ timestamp | %b %e %H:%M:%S }} {{ host }} {{ app }}[{{ pid }}]: {{ message }} {{ obj | json }} {{ n }}",
            "+01:00",
        )
        .unwrap();
        let batch = batch();
        let mut ev = Event::from_span(Span::new(0, 4));
        ev.time_ns = Some(1_699_063_384_005_000_000);
        ev.set("app".into(), Value::Str("sshd".into()));
        ev.set(
            "obj".into(),
            Value::Object(vec![("k".into(), Value::Str("a\"b".into()))]),
        );
        ev.set("n".into(), Value::Int(-7));
        let mut out = Vec::new();
        let mut st = EncodeStats::default();
        let opts = RenderOptions {
            missing: b"-",
            now_ns: 0,
        };
        assert_eq!(t.render_bytes(&ev, &batch, opts, &mut out, &mut st), 1);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"Nov  4 03:03:04 web1 sshd[-]: warn {"k":"a\"b"} -7"#
        );
        // Without an event time: the `timestamp` field, else the render time.
        let mut ev = Event::from_span(Span::new(0, 4));
        let ts = tpl("{{ timestamp | %Y-%m-%d }}|{{ timestamp }}").unwrap();
        let opts = RenderOptions {
            missing: b"",
            now_ns: 86_400_000_000_000,
        };
        let mut out = Vec::new();
        ts.render_bytes(&ev, &batch, opts, &mut out, &mut st);
        assert_eq!(out, b"1970-01-02|1970-01-02T00:00:00.000000000Z");
        ev.set(
            "timestamp".into(),
            Value::Str("2024-02-03T04:05:06Z".into()),
        );
        let mut out = Vec::new();
        ts.render_bytes(&ev, &batch, opts, &mut out, &mut st);
        assert_eq!(out, b"2024-02-03|2024-02-03T04:05:06Z");
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        let e = tpl_in("{{ a | %Q }}", "UTC").unwrap_err();
        assert!(e.contains("`%Q`") && e.contains("field `a`"), "{e}");
        let e = tpl_in("{{ a | shout }}", "UTC").unwrap_err();
        assert!(e.contains("unknown filter `shout`"), "{e}");
        let e = tpl_in("x {{ a ", "UTC").unwrap_err();
        assert!(e.contains("unclosed"), "{e}");
        let e = tpl_in("{{ a | upper | json }}", "UTC").unwrap_err();
        assert!(e.contains("first filter"), "{e}");
        let e = tpl_in("{{ | json }}", "UTC").unwrap_err();
        assert!(e.contains("empty"), "{e}");
    }
}
