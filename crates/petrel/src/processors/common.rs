//! What parsers share: the `on_error` policy and access to a field's bytes
//! while the batch's events are being changed.

use petrel_core::config::Map;
use petrel_core::{Event, Key, Span, Value};

/// Keys every parser accepts besides its own.
pub const PARSER_KEYS: &[&str] = &["type", "id", "field", "on_error", "raw_field"];

/// What a parser does with an event it cannot parse.
#[derive(Debug, Clone, PartialEq)]
pub enum OnError {
    /// Keep the event unchanged, with field `parse_error` naming the
    /// processor and the reason.
    Keep,
    /// Drop the event; counted as discarded with reason `parse_error`.
    Drop,
    /// Keep the event, with the unparsed value copied into the named field
    /// and `parse_error` set as for `keep`.
    Raw(Key),
}

impl OnError {
    /// Reads `on_error` (default `keep`) and `raw_field` (default `raw`).
    pub fn parse(map: &Map<'_>) -> Option<Self> {
        Some(match map.choice("on_error", &["keep", "drop", "raw"]) {
            None if map.get("on_error").is_some() => return None,
            None | Some("keep") => OnError::Keep,
            Some("drop") => OnError::Drop,
            Some(_) => OnError::Raw(map.str("raw_field").unwrap_or("raw").to_string().into()),
        })
    }
}

/// Reads `field` (default `message`).
pub fn source_field(map: &Map<'_>) -> Key {
    map.str("field").unwrap_or("message").to_string().into()
}

/// The bytes of `field` in `ev`, and the offset in `buf` where they start
/// when they are a span of it (so that parsed parts can be spans too).
#[inline]
pub fn field_bytes<'a>(
    buf: &'a [u8],
    ev: &'a Event,
    field: &str,
) -> Option<(&'a [u8], Option<u32>)> {
    match ev.get(field)? {
        Value::Span(s) => Some((s.get(buf), Some(s.start))),
        v => v.as_bytes(buf).map(|b| (b, None)),
    }
}

/// A value for `part` of a field: a span of the batch buffer when the field
/// itself is one (`base` set), else an owned copy.
#[inline]
pub fn part_value(field: &[u8], base: Option<u32>, start: usize, end: usize) -> Value {
    match base {
        Some(b) => Value::Span(Span::new(b as usize + start, end - start)),
        None => match std::str::from_utf8(&field[start..end]) {
            Ok(s) => Value::Str(s.into()),
            Err(_) => Value::Bytes(field[start..end].into()),
        },
    }
}

/// Applies `policy` to an event that failed to parse. Returns false when
/// the event must be dropped.
pub fn on_failure(policy: &OnError, ev: &mut Event, field: &str, who: &str, reason: &str) -> bool {
    match policy {
        OnError::Drop => false,
        OnError::Keep => {
            ev.set(
                "parse_error".into(),
                Value::Str(format!("{who}: {reason}").into()),
            );
            true
        }
        OnError::Raw(name) => {
            if let Some(v) = ev.get(field).cloned() {
                ev.set(name.clone(), v);
            }
            ev.set(
                "parse_error".into(),
                Value::Str(format!("{who}: {reason}").into()),
            );
            true
        }
    }
}
