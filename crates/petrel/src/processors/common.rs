//! What parsers share: the `on_error` policy and access to a field's bytes
//! while the batch's events are being changed.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

use petrel_core::config::Map;
use petrel_core::config::{Node, YamlNode};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, Event, EventBatch, Key, Span, Value};

/// Keys every parser accepts besides its own.
pub const PARSER_KEYS: &[&str] = &["type", "id", "field", "on_error", "raw_field"];

/// The `field` key, documented once for every plugin that reads it.
pub const FIELD_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "field",
    kind: petrel_core::plugin::KeyKind::String,
    default: Some(r#"message"#),
    doc: r#"The field parsed."#,
};

/// The `on_error` key, documented once for every plugin that reads it.
pub const ON_ERROR_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "on_error",
    kind: petrel_core::plugin::KeyKind::OneOf(&["keep", "drop", "raw"]),
    default: Some(r#"keep"#),
    doc: r#"What a parse failure does (each counts in `errors_total{error_type="parse_failed"}`): `keep` passes the event on unchanged with a `parse_error` field; `drop` drops it (counted as discarded, `reason=parse_error`); `raw` keeps it and copies the unparsed value into `raw_field`."#,
};

/// The `raw_field` key, documented once for every plugin that reads it.
pub const RAW_FIELD_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "raw_field",
    kind: petrel_core::plugin::KeyKind::String,
    default: Some(r#"raw"#),
    doc: r#"With `on_error: raw`: the field that receives the unparsed value."#,
};

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
    failed: LazyCounter,
    dropped: LazyCounter,
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

/// Merges `parsed` into the event's fields with [`Event::set`] semantics
/// (a `message` key replaces the message; an existing key is replaced; the
/// last of repeated keys wins), leaving `parsed` empty. `distinct` promises
/// that `parsed` has no repeated key (names fixed at build time).
pub(crate) fn merge_fields(ev: &mut Event, parsed: &mut Vec<(Key, Value)>, distinct: bool) {
    /// Above this many fields the quadratic `set` loop gives way to a map.
    const LINEAR_LIMIT: usize = 32;
    let n = parsed.len();
    if ev.fields.is_empty()
        && n <= LINEAR_LIMIT
        && !parsed.iter().any(|(k, _)| k == "message")
        && (distinct || all_distinct(parsed))
    {
        // The common case: the first parser of a chain. Moving the entries
        // keeps `parsed`'s allocation for the next event.
        ev.fields.append(parsed);
        return;
    }
    if ev.fields.len() + n <= LINEAR_LIMIT {
        for (k, v) in parsed.drain(..) {
            ev.set(k, v);
        }
        return;
    }
    // Large objects (a hostile or unusual line): index the names so that a
    // 100k-key object costs linear time rather than quadratic.
    let mut index: HashMap<String, usize, BuildFnv> = ev
        .fields
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.to_string(), i))
        .collect();
    for (k, v) in parsed.drain(..) {
        if k == "message" {
            ev.message = v;
        } else if let Some(&i) = index.get(&*k) {
            ev.fields[i].1 = v;
        } else {
            index.insert(k.to_string(), ev.fields.len());
            ev.fields.push((k, v));
        }
    }
}

fn all_distinct(fields: &[(Key, Value)]) -> bool {
    fields
        .iter()
        .enumerate()
        .all(|(i, (k, _))| fields[..i].iter().all(|(k2, _)| k2 != k))
}

// ---------------------------------------------------------------------------
// Field names without an allocation per field per event.
//
// `Key` is `Cow<'static, str>`: a `Borrowed` key costs a pointer copy, an
// `Owned` one an allocation and a free per event. Names from configuration
// are leaked once per distinct name (configuration is small and read a few
// times at most, so the leak is bounded). Names found in JSON data are
// interned the same way up to a global bound, so that the usual case — every
// line has the same few keys — allocates nothing, while a stream of random
// keys cannot grow memory without limit: past the bound, or for long names,
// keys are simply owned.

/// Data-derived names interned at most (each at most
/// `MAX_INTERNED_LEN` bytes: at most 512 KiB leaked in all).
const MAX_INTERNED_KEYS: usize = 8192;
/// Longer data-derived names are never interned.
const MAX_INTERNED_LEN: usize = 64;

#[derive(Default)]
struct Interner {
    names: HashSet<&'static str>,
    data_names: usize,
}

static INTERNER: LazyLock<Mutex<Interner>> = LazyLock::new(Mutex::default);
/// Set once the data-name bound is reached, so misses stop taking the lock.
pub(crate) static INTERNER_FULL: AtomicBool = AtomicBool::new(false);

fn leak(interner: &mut Interner, name: &str) -> &'static str {
    match interner.names.get(name) {
        Some(s) => s,
        None => {
            let s: &'static str = Box::leak(name.into());
            interner.names.insert(s);
            s
        }
    }
}

/// A `'static` copy of a configured name, leaked at most once per distinct
/// name for the life of the process, so events can use `Cow::Borrowed`.
pub(crate) fn static_name(name: &str) -> &'static str {
    let mut interner = INTERNER.lock().unwrap_or_else(|p| p.into_inner());
    leak(&mut interner, name)
}

/// The key for a configured name (see [`static_name`]).
pub(crate) fn config_key(name: &str) -> Key {
    Cow::Borrowed(static_name(name))
}

pub(crate) fn intern_data_name(name: &str) -> Option<&'static str> {
    if name.len() > MAX_INTERNED_LEN || INTERNER_FULL.load(Ordering::Relaxed) {
        return None;
    }
    let mut interner = INTERNER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = interner.names.get(name) {
        return Some(s);
    }
    if interner.data_names >= MAX_INTERNED_KEYS {
        INTERNER_FULL.store(true, Ordering::Relaxed);
        return None;
    }
    interner.data_names += 1;
    Some(leak(&mut interner, name))
}

/// The entries of a user-keyed map (field names chosen by the user, so no
/// allowed-key check); None after reporting when `node` is not a map. An
/// empty value (`key:`) is an empty map.
pub(crate) fn free_map<'a>(node: Node<'a>, what: &str) -> Option<Vec<(&'a str, Node<'a>)>> {
    match node.raw() {
        YamlNode::Mapping(_) => node.as_map_quiet().map(|m| m.entries()),
        YamlNode::Scalar(s) if s.as_str().is_empty() => Some(Vec::new()),
        _ => {
            node.error(format!(
                "`{what}` must be a map of field names, e.g. `{what}: {{level: value}}`"
            ));
            None
        }
    }
}

/// A field name as a `&'static str`, so that per-event keys are
/// `Cow::Borrowed` and cloning them never allocates. Interned: each
/// distinct name is stored once for the process, however often the
/// configuration is reloaded.
pub(crate) fn intern_name(name: &str) -> &'static str {
    static_name(name)
}

/// The regex crate's error on one line (config errors are one line each):
/// the explanation and, when it points at the pattern, the character.
pub(crate) fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let Some(what) = lines.iter().rev().find_map(|l| l.strip_prefix("error: ")) else {
        return lines.join(" ");
    };
    // The rendering is: a header, the pattern indented by 4 spaces, a line
    // of `^` under the offending part, then `error: ...`.
    let caret = lines
        .iter()
        .find(|l| l.trim().starts_with('^') && l.trim().bytes().all(|c| matches!(c, b'^' | b'-')));
    match caret.and_then(|l| l.find('^')) {
        Some(col) if lines.len() == 4 => {
            format!("{what} (at character {})", col.saturating_sub(4) + 1)
        }
        _ => what.to_string(),
    }
}

/// The text a regex sees for `v`: the bytes of text values; numbers and
/// booleans written as JSON into `scratch` (the form sinks show them in);
/// None for null, arrays and objects.
pub(crate) fn value_text<'a>(
    v: &'a Value,
    buf: &'a [u8],
    scratch: &'a mut [u8; 32],
) -> Option<&'a [u8]> {
    use serde_json::ser::{CompactFormatter, Formatter};
    let mut cur = std::io::Cursor::new(&mut scratch[..]);
    let mut f = CompactFormatter;
    // An i64 takes at most 20 bytes and a finite f64 at most 24 in this
    // (ryu) form, so the writes below cannot run out of room.
    let written = match v {
        Value::Span(_) | Value::Str(_) | Value::Bytes(_) => return v.as_bytes(buf),
        Value::Int(i) => f.write_i64(&mut cur, *i),
        Value::Float(x) if x.is_finite() => f.write_f64(&mut cur, *x),
        Value::Bool(b) => cur.write_all(if *b { b"true" } else { b"false" }),
        Value::Float(_) | Value::Null | Value::Array(_) | Value::Object(_) => return None,
    };
    written.ok()?;
    let n = cur.position() as usize;
    scratch.get(..n)
}

/// FNV-1a: field names are short, where it beats SipHash several times;
/// hash flooding costs at most the bounded interner's lookups.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type BuildFnv = BuildHasherDefault<Fnv>;
