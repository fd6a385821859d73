//! What parsers share: the `on_error` policy and access to a field's bytes
//! while the batch's events are being changed.

use std::fmt;

use petrel_core::config::Map;
use petrel_core::{ComponentMetrics, Event, EventBatch, Key, Span, Value};
use prometheus_client::metrics::counter::Counter;

use super::parse_json::{merge_fields, static_name};

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
            add_parse_error(ev, who, reason);
            true
        }
        OnError::Raw(name) => {
            if let Some(v) = ev.get(field).cloned() {
                ev.set(name.clone(), v);
            }
            add_parse_error(ev, who, reason);
            true
        }
    }
}

/// Adds `who: reason` to the event's `parse_error`, after the errors of
/// earlier processors (joined with `; `): with chained parsers the first
/// failure is usually the cause of the later ones and must stay visible.
pub fn add_parse_error(ev: &mut Event, who: &str, reason: &str) {
    let text = match ev.get("parse_error") {
        Some(Value::Str(prev)) => format!("{prev}; {who}: {reason}"),
        _ => format!("{who}: {reason}"),
    };
    ev.set("parse_error".into(), Value::Str(text.into()));
}

/// What the parsers share around their own parsing: the field they read,
/// the `on_error` policy and the failure counters (taken at build time so
/// the hot path only bumps atomics).
pub struct FieldParse {
    /// The field parsed.
    pub field: &'static str,
    who: &'static str,
    on_error: OnError,
    failed: Counter,
    dropped: Counter,
}

impl FieldParse {
    /// For the processor named `who` (used in `parse_error` values).
    pub fn new(
        who: &'static str,
        field: &str,
        on_error: &OnError,
        metrics: &ComponentMetrics,
    ) -> Self {
        Self {
            field: static_name(field),
            who,
            on_error: on_error.clone(),
            failed: metrics.error_counter("parse_failed"),
            dropped: metrics.discarded_counter("parse_error"),
        }
    }

    /// Runs `parse` on the field of every event of `batch`. `parse` gets the
    /// field's bytes, their offset in the batch buffer when they are a span
    /// of it, and appends the fields it found; those are merged into the
    /// event (`distinct`: the parser never yields a name twice). A missing
    /// field or a parse error goes through `on_error`, counted.
    pub fn apply<E: fmt::Display>(
        &self,
        batch: &mut EventBatch,
        distinct: bool,
        mut parse: impl FnMut(&[u8], Option<u32>, &mut Vec<(Key, Value)>) -> Result<(), E>,
    ) {
        let EventBatch { buf, events, .. } = batch;
        let buf: &[u8] = buf;
        let mut parsed: Vec<(Key, Value)> = Vec::new();
        let (mut failed, mut dropped) = (0u64, 0u64);
        events.retain_mut(|ev| {
            parsed.clear();
            let result = match field_bytes(buf, ev, self.field) {
                Some((bytes, base)) => parse(bytes, base, &mut parsed).map_err(|e| e.to_string()),
                None => Err("field is missing or not text".to_string()),
            };
            match result {
                Ok(()) => {
                    merge_fields(ev, &mut parsed, distinct);
                    true
                }
                Err(reason) => {
                    failed += 1;
                    let keep = on_failure(&self.on_error, ev, self.field, self.who, &reason);
                    dropped += u64::from(!keep);
                    keep
                }
            }
        });
        if failed > 0 {
            self.failed.inc_by(failed);
        }
        if dropped > 0 {
            self.dropped.inc_by(dropped);
        }
    }
}
