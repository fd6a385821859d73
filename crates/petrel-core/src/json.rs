//! JSON writing shared by the encodings and the line templates: strings
//! escaped with SIMD, invalid UTF-8 replaced and counted, event values
//! written as JSON. A module of its own so that `encode` (which renders
//! templates) and `template` (which writes values as JSON) both build on
//! it without importing each other.

use bytes::Bytes;
use serde_json::ser::{CompactFormatter, Formatter};

use crate::event::{EventBatch, Key, Value};

/// What encoding a batch noticed on the way.
#[derive(Debug, Default, Clone)]
pub struct EncodeStats {
    /// Values that were not valid UTF-8 and were written with U+FFFD.
    pub invalid_utf8: u64,
    /// Template fields that were missing (written as the `missing` text).
    pub missing_fields: u64,
    /// The batch buffer last checked as a whole, and whether it is UTF-8.
    /// Holding the `Bytes` keeps its memory from being reused by another
    /// buffer while the answer is kept.
    checked_buf: Option<(Bytes, bool)>,
}

impl EncodeStats {
    /// `buf` as text when all of it is UTF-8, checked once per buffer.
    ///
    /// Spans of a parsed line (nine fields of an access log and the line
    /// itself) were each checked on their own: ten short checks per event
    /// cost 10 % of the nginx283 parse → ndjson row, where one pass over
    /// the buffer costs a fraction of one. A span of valid text whose ends
    /// are character boundaries is itself valid text.
    fn text_of<'a>(&mut self, buf: &'a Bytes) -> Option<&'a str> {
        let valid = match &self.checked_buf {
            Some((b, valid)) if b.as_ptr() == buf.as_ptr() && b.len() == buf.len() => *valid,
            _ => {
                let valid = simdutf8::basic::from_utf8(buf).is_ok();
                self.checked_buf = Some((buf.clone(), valid));
                valid
            }
        };
        if valid {
            // SAFETY: these exact bytes (same address and length, kept
            // alive by the clone above, and `Bytes` are immutable) were
            // checked to be UTF-8.
            Some(unsafe { std::str::from_utf8_unchecked(buf) })
        } else {
            None
        }
    }
}

pub(crate) fn write_json_key(k: &Key, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    write_json_str(out, k);
}

/// Whether `b` is UTF-8, with the SIMD check the encoders use.
#[inline]
pub fn is_utf8(b: &[u8]) -> bool {
    simdutf8::basic::from_utf8(b).is_ok()
}

/// Writes bytes as a JSON string, invalid UTF-8 replaced and counted.
pub fn write_json_bytes(b: &[u8], out: &mut Vec<u8>, stats: &mut EncodeStats) {
    // simdutf8's check is several times the standard library's on long
    // ASCII lines, and this check runs on every value of every event.
    match simdutf8::basic::from_utf8(b) {
        Ok(s) => {
            write_json_str(out, s);
        }
        Err(_) => {
            stats.invalid_utf8 += 1;
            let s = String::from_utf8_lossy(b);
            write_json_str(out, &s);
        }
    }
}

/// Writes `s` as a quoted, escaped JSON string.
#[inline]
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // sonic-rs escapes with SIMD: measured 2.5× serde_json's byte loop on
    // log lines (3.8–4.4 GB/s against 1.6–1.8), and escaping was the
    // largest single cost of every ndjson pipeline. Writing a &str into a
    // Vec cannot fail.
    let _ = sonic_rs::to_writer(&mut *out, s);
}

/// Writes `v` as JSON.
pub fn write_json_value(batch: &EventBatch, v: &Value, out: &mut Vec<u8>, stats: &mut EncodeStats) {
    let mut f = CompactFormatter;
    match v {
        Value::Span(s) => {
            // `get` checks both ends are character boundaries (and in range).
            let text = stats
                .text_of(&batch.buf)
                .and_then(|t| t.get(s.start as usize..s.end()));
            match text {
                Some(t) => write_json_str(out, t),
                None => write_json_bytes(batch.bytes_of(v).unwrap_or_default(), out, stats),
            }
        }
        Value::Str(_) | Value::Bytes(_) => {
            write_json_bytes(batch.bytes_of(v).unwrap_or_default(), out, stats)
        }
        Value::Int(i) => {
            let _ = f.write_i64(out, *i);
        }
        Value::Float(x) if x.is_finite() => {
            let _ = f.write_f64(out, *x);
        }
        Value::Float(_) | Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => {
            let _ = f.write_bool(out, *b);
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_value(batch, item, out, stats);
            }
            out.push(b']');
        }
        Value::Object(fields) => {
            out.push(b'{');
            for (i, (k, item)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_key(k, out);
                out.push(b':');
                write_json_value(batch, item, out, stats);
            }
            out.push(b'}');
        }
    }
}

/// How deep JSON may nest (arrays and objects) to be parsed: the JSON
/// parser refuses deeper values, and the receiving sources that take JSON
/// (Splunk HEC, Beats) refuse them when they arrive, as other invalid
/// data, instead of storing them unparsed.
pub const MAX_JSON_DEPTH: usize = 64;

/// Whether the JSON text `b` nests arrays and objects deeper than `max`
/// (brackets inside strings do not count). A linear scan without
/// parsing, cheap enough to run on every received event.
pub fn nesting_exceeds(b: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                // Skip the string, escapes included.
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_measured_outside_strings() {
        assert!(!nesting_exceeds(br#"{"a":[1,{"b":"[[[[[["}]}"#, 3));
        assert!(nesting_exceeds(br#"{"a":[1,{"b":[[]]}]}"#, 3));
        assert!(!nesting_exceeds(br#"{"a":"\"[[[[\\"}"#, 1));
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(nesting_exceeds(deep.as_bytes(), MAX_JSON_DEPTH));
        let ok = "[".repeat(MAX_JSON_DEPTH) + &"]".repeat(MAX_JSON_DEPTH);
        assert!(!nesting_exceeds(ok.as_bytes(), MAX_JSON_DEPTH));
    }
}
