//! Encodings shared by sinks: `text` (the message and a newline, or a line
//! [`Template`]) and `ndjson` (one JSON object per event, written as the
//! sink's [`Output`] says: see [`crate::schema`]).

use std::sync::Arc;

use crate::event::{Event, EventBatch, Value};
use crate::json::write_json_key;
use crate::schema::{Output, Plan};

pub use crate::json::{is_utf8, write_json_bytes, write_json_str, write_json_value, EncodeStats};
use crate::template::{now_ns, RenderOptions, Template};
use petrel_time::write_rfc3339;

/// How a sink turns events into bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Encoding {
    /// The message bytes as they were read, then `\n`.
    Text,
    /// One JSON object per line, the fields the sink's [`Output`] selects
    /// in its layout.
    Ndjson(Arc<Output>),
    /// A line template (`{{ timestamp | %b %e %H:%M:%S }} {{ host }}
    /// {{ message }}`), then `\n`.
    Template(Arc<LineTemplate>),
}

/// The `text` encoding with a template: compiled once, when the
/// configuration is read.
#[derive(Debug, Clone, PartialEq)]
pub struct LineTemplate {
    /// The line, without its newline.
    pub template: Template,
    /// Written for a missing field (empty by default).
    pub missing: Box<[u8]>,
}

impl Encoding {
    /// Names accepted in configuration.
    pub const NAMES: &'static [&'static str] = &["text", "ndjson"];

    /// Parses a configuration name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "text" => Some(Self::Text),
            "ndjson" => Some(Self::Ndjson(Arc::default())),
            _ => None,
        }
    }

    /// The output of `ndjson` resolved for `batch` (once per batch, for
    /// [`Encoding::write_event`]); `None` for the other encodings.
    pub fn plan<'a>(&'a self, batch: &EventBatch) -> Option<Plan<'a>> {
        match self {
            Self::Ndjson(o) => Some(o.plan(&batch.source)),
            _ => None,
        }
    }

    /// Renders one event's line (no newline) for sinks that frame events
    /// themselves (syslog): the message, the JSON object (as `plan`, from
    /// [`Encoding::plan`] for this batch, says), or the template.
    pub fn write_event(
        &self,
        plan: Option<&Plan<'_>>,
        batch: &EventBatch,
        ev: &Event,
        now_ns: i64,
        out: &mut Vec<u8>,
        stats: &mut EncodeStats,
    ) {
        match self {
            Self::Text => write_text_value(batch, &ev.message, out),
            Self::Ndjson(o) => match plan {
                Some(p) => p.write_json(batch, ev, JsonShape::NDJSON, out, stats),
                None => o
                    .plan(&batch.source)
                    .write_json(batch, ev, JsonShape::NDJSON, out, stats),
            },
            Self::Template(t) => {
                let opts = RenderOptions {
                    missing: &t.missing,
                    now_ns,
                };
                let missing = t.template.render_bytes(ev, batch, opts, out, stats);
                stats.missing_fields += u64::from(missing);
            }
        }
    }
}

/// Appends the encoding of every event of `batch` to `out`.
///
/// When `record_ends` is given, the end offset in `out` of each event's
/// record is pushed, for sinks that send events as separate messages.
pub fn encode_batch(
    encoding: &Encoding,
    batch: &EventBatch,
    out: &mut Vec<u8>,
    mut record_ends: Option<&mut Vec<u32>>,
) -> EncodeStats {
    let mut stats = EncodeStats::default();
    match encoding {
        Encoding::Text if record_ends.is_none() => encode_text_runs(batch, out),
        Encoding::Text => {
            for ev in &batch.events {
                write_text_value(batch, &ev.message, out);
                out.push(b'\n');
                if let Some(ends) = record_ends.as_deref_mut() {
                    ends.push(out.len() as u32);
                }
            }
        }
        Encoding::Ndjson(output) => {
            let plan = output.plan(&batch.source);
            for ev in &batch.events {
                plan.write_json(batch, ev, JsonShape::NDJSON, out, &mut stats);
                out.push(b'\n');
                if let Some(ends) = record_ends.as_deref_mut() {
                    ends.push(out.len() as u32);
                }
            }
        }
        Encoding::Template(_) => {
            // One clock reading per batch, for events without a time.
            let now = now_ns();
            for ev in &batch.events {
                encoding.write_event(None, batch, ev, now, out, &mut stats);
                out.push(b'\n');
                if let Some(ends) = record_ends.as_deref_mut() {
                    ends.push(out.len() as u32);
                }
            }
        }
    }
    stats
}

/// What a sink itself asks of the JSON of its events, besides its
/// [`Output`]: its own key for the time, a time for events without one,
/// fields it writes elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonShape<'a> {
    /// The sink's key of the parsed event time (`@timestamp` for
    /// Elasticsearch); `None`: the output's (`timestamp_key`, else the
    /// layout's: `timestamp`, `@timestamp` for `ecs`). Written as it is,
    /// so it must need no JSON escaping.
    pub time_key: Option<&'a str>,
    /// Time written for events without a parsed time, already in RFC 3339
    /// (rendered once per batch, not per event); `None` writes no time
    /// for them.
    pub default_time: Option<&'a [u8]>,
    /// The same time in nanoseconds, for the other `timestamp_format`s.
    pub default_ns: Option<i64>,
    /// Fields (and batch metadata) left out, such as those a Loki sink
    /// turned into stream labels.
    pub skip: &'a [&'a str],
}

impl JsonShape<'static> {
    /// The `ndjson` encoding's shape.
    pub const NDJSON: Self = Self {
        time_key: None,
        default_time: None,
        default_ns: None,
        skip: &[],
    };
}

impl<'a> JsonShape<'a> {
    /// The sink's own time key, if it has one.
    pub fn sink_time_key(&self) -> Option<&'a str> {
        self.time_key
    }
}

/// Appends the JSON object of one event (no newline) in the default
/// output (`flat`, every field, RFC 3339 times): the message, the `file`
/// and metadata fields of its batch that it still has, its time, then its
/// fields. [`Plan::write_json`] calls it for the default output and
/// writes the others itself.
#[inline]
pub fn write_event_json(
    batch: &EventBatch,
    ev: &Event,
    shape: JsonShape<'_>,
    out: &mut Vec<u8>,
    stats: &mut EncodeStats,
) {
    let file = &*batch.source.path;
    let time_key = shape.time_key.unwrap_or("timestamp");
    // Removed by a processor: no `message` at all, never `null`. The
    // first key is written with its opening brace, the others with their
    // comma.
    let mut sep: u8 = b'{';
    if !matches!(ev.message, Value::Null) {
        out.extend_from_slice(b"{\"message\":");
        write_json_value(batch, &ev.message, out, stats);
        sep = b',';
    }
    let hidden = !ev.hidden.is_empty();
    // A `file` field set by a processor takes the place of the source
    // path; a parsed event time that of a field named like the time key.
    // Each key is written once.
    let skip_file = shape.skip.contains(&"file");
    match ev.fields.iter().find(|(k, _)| k == "file") {
        _ if skip_file => {}
        Some((_, v)) => {
            out.push(sep);
            out.extend_from_slice(b"\"file\":");
            write_json_value(batch, v, out, stats);
            sep = b',';
        }
        None if !(file.is_empty() || hidden && ev.hidden.contains(0)) => {
            // Already text: escaped without a UTF-8 check per event.
            out.push(sep);
            out.extend_from_slice(b"\"file\":");
            write_json_str(out, file);
            sep = b',';
        }
        None => {}
    }
    for (j, (k, v)) in batch.source.meta.iter().enumerate() {
        if !(ev.fields.iter().any(|(f, _)| f == k)
            || shape.skip.iter().any(|s| s == k)
            || hidden && ev.hidden.contains(j + 1))
        {
            out.push(sep);
            write_json_key(k, out);
            out.push(b':');
            write_json_str(out, v);
            sep = b',';
        }
    }
    let has_time = ev.time_ns.is_some() || shape.default_time.is_some();
    if has_time {
        // The key is a fixed name without characters to escape: copied,
        // not escaped, once per event.
        out.push(sep);
        sep = b',';
        out.push(b'"');
        out.extend_from_slice(time_key.as_bytes());
        out.extend_from_slice(b"\":\"");
        match (ev.time_ns, shape.default_time) {
            (Some(ns), _) => write_rfc3339(ns, out),
            (None, Some(text)) => out.extend_from_slice(text),
            (None, None) => {}
        }
        out.push(b'"');
    }
    for (k, v) in &ev.fields {
        if k == "file" || (has_time && k == time_key) || shape.skip.iter().any(|s| s == k) {
            continue;
        }
        out.push(sep);
        sep = b',';
        write_json_key(k, out);
        out.push(b':');
        write_json_value(batch, v, out, stats);
    }
    if sep == b'{' {
        // Every field removed: an empty object.
        out.push(b'{');
    }
    out.push(b'}');
}

/// Text encoding without record boundaries: consecutive lines that sit next
/// to each other in the read buffer, each followed by its own newline, are
/// copied as one block instead of line by line.
fn encode_text_runs(batch: &EventBatch, out: &mut Vec<u8>) {
    let buf = &batch.buf[..];
    if batch.verbatim_lines {
        out.extend_from_slice(buf);
        return;
    }
    let mut run: Option<(usize, usize)> = None;
    for ev in &batch.events {
        if let Value::Span(s) = &ev.message {
            let end = s.end();
            if buf.get(end) == Some(&b'\n') {
                match &mut run {
                    Some((_, run_end)) if *run_end == s.start as usize => *run_end = end + 1,
                    _ => {
                        if let Some((a, b)) = run {
                            out.extend_from_slice(&buf[a..b]);
                        }
                        run = Some((s.start as usize, end + 1));
                    }
                }
                continue;
            }
        }
        if let Some((a, b)) = run.take() {
            out.extend_from_slice(&buf[a..b]);
        }
        write_text_value(batch, &ev.message, out);
        out.push(b'\n');
    }
    if let Some((a, b)) = run {
        out.extend_from_slice(&buf[a..b]);
    }
}

fn write_text_value(batch: &EventBatch, v: &Value, out: &mut Vec<u8>) {
    match batch.bytes_of(v) {
        Some(b) => out.extend_from_slice(b),
        // A removed message: an empty line, not the word `null`.
        None if matches!(v, Value::Null) => {}
        None => {
            let mut stats = EncodeStats::default();
            write_json_value(batch, v, out, &mut stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{SourceInfo, Span};
    use bytes::Bytes;
    use std::sync::Arc;

    fn batch(buf: &'static [u8], spans: &[(usize, usize)]) -> EventBatch {
        let mut b = EventBatch::new(
            Bytes::from_static(buf),
            Arc::new(SourceInfo::file("/var/log/a.log", Default::default())),
        );
        b.events = spans
            .iter()
            .map(|&(s, l)| Event::from_span(Span::new(s, l)))
            .collect();
        b
    }

    #[test]
    fn text_coalesces_and_stays_byte_exact() {
        let b = batch(b"ab\n\xff\xfe\nlast", &[(0, 2), (3, 2), (6, 4)]);
        let mut out = Vec::new();
        encode_batch(&Encoding::Text, &b, &mut out, None);
        assert_eq!(out, b"ab\n\xff\xfe\nlast\n");
        let mut out2 = Vec::new();
        let mut ends = Vec::new();
        encode_batch(&Encoding::Text, &b, &mut out2, Some(&mut ends));
        assert_eq!(out2, out);
        assert_eq!(ends, vec![3, 6, 11]);
    }

    /// A buffer that is text as a whole is checked once, but a span that
    /// cuts a character in two is still not text.
    #[test]
    fn spans_of_a_text_buffer_that_cut_a_character_are_replaced() {
        let b = batch("é ok\n".as_bytes(), &[(0, 1), (3, 2), (0, 5)]);
        let mut out = Vec::new();
        let st = encode_batch(&Encoding::from_name("ndjson").unwrap(), &b, &mut out, None);
        let text = String::from_utf8(out).unwrap();
        let messages: Vec<&str> = text
            .lines()
            .map(|l| l.split('"').nth(3).unwrap_or_default())
            .collect();
        assert_eq!(messages, ["\u{fffd}", "ok", "é ok"]);
        assert_eq!(st.invalid_utf8, 1);
    }

    #[test]
    fn ndjson_escapes_and_replaces_invalid_utf8() {
        let mut b = batch(b"say \"hi\"\t\n\xff", &[(0, 9), (10, 1)]);
        b.events[0].set("n".into(), Value::Int(-3));
        b.events[0].time_ns = Some(1_700_000_000_123_456_789);
        let mut out = Vec::new();
        let st = encode_batch(&Encoding::from_name("ndjson").unwrap(), &b, &mut out, None);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"message":"say \"hi\"\t","file":"/var/log/a.log","timestamp":"2023-11-14T22:13:20.123456789Z","n":-3}"#
        );
        assert_eq!(
            lines[1],
            "{\"message\":\"\u{fffd}\",\"file\":\"/var/log/a.log\"}"
        );
        assert_eq!(st.invalid_utf8, 1);
    }

    #[test]
    fn json_strings_round_trip_every_control_character() {
        let mut s: String = (0u8..0x20).map(char::from).collect();
        s.push_str("\"\\/\u{7f} é 中文 \u{2028} 🙂");
        // Lengths around the SIMD block sizes, so that the escapes land at
        // every position of a block.
        for pad in 0..40 {
            let v = format!("{}{s}{}", "a".repeat(pad), "b".repeat(pad));
            let mut out = Vec::new();
            write_json_str(&mut out, &v);
            let back: String = serde_json::from_slice(&out).expect("valid JSON");
            assert_eq!(back, v);
            assert!(out.iter().all(|&c| c >= 0x20), "no raw control bytes");
        }
    }

    #[test]
    fn processor_fields_replace_file_and_timestamp_once() {
        let mut b = batch(b"x", &[(0, 1)]);
        b.events[0].set("file".into(), Value::Str("main.go".into()));
        b.events[0].set("timestamp".into(), Value::Str("old".into()));
        b.events[0].time_ns = Some(0);
        let mut out = Vec::new();
        encode_batch(&Encoding::from_name("ndjson").unwrap(), &b, &mut out, None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"message\":\"x\",\"file\":\"main.go\",\"timestamp\":\"1970-01-01T00:00:00.000000000Z\"}\n"
        );
    }
}
