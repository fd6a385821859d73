//! `type: parse_json` — turns a field holding a JSON object into fields.
//!
//! ```yaml
//! processors:
//!   - type: parse_json
//!     field: message      # default `message`
//!     flatten: false      # true: nested objects become `a.b.c` keys
//!     separator: "."      # joins flattened keys (only with `flatten: true`)
//!     on_error: keep      # keep | drop | raw
//!     raw_field: raw      # with `on_error: raw`
//! ```
//!
//! Each key of the object becomes a field of the event, in input order; a
//! key that already exists (or `message`) is replaced, and when the object
//! repeats a key the last value wins. The parsed field itself is left as it
//! was unless the object has a key of the same name.
//!
//! Values: strings without escapes borrow the read buffer (no copy); strings
//! with escapes are unescaped into owned text; integers that fit in 64 bits
//! become integers, other numbers floats; `true`/`false`/`null` are kept as
//! such; arrays stay arrays and nested objects stay nested objects. With
//! `flatten: true` nested objects are merged into the event with their keys
//! joined by `separator` (`{"a":{"b":1}}` gives `a.b: 1`); arrays are not
//! flattened, and an empty nested object is kept as an empty object.
//!
//! A parse failure is: the field is missing or not text, the text is not
//! valid JSON (broken, truncated, invalid UTF-8, nested deeper than 64
//! levels, trailing garbage), or the JSON value is not an object. It is
//! counted in `component_errors{error_type="parse_failed"}` and handled by
//! `on_error`: `keep` leaves the event unchanged and adds `parse_error`;
//! `drop` drops it (counted as discarded with reason `parse_error`); `raw`
//! also copies the unparsed value into `raw_field`.
//!
//! Engine: `sonic-rs` (SIMD JSON) driving a serde visitor that builds
//! Petrel values directly, without an intermediate document. On json512
//! lines it takes about 0.47 µs per line where `serde_json` takes 0.74 µs
//! and `simd-json` (which needs a mutable copy of each line) 0.88 µs (see
//! the `parsers` benchmark).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::ops::Range;

use petrel_core::config::Map;
use petrel_core::plugin::Processor;
use petrel_core::{ComponentMetrics, EventBatch, Key, Span, Value};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

mod flat;

use super::common::{intern_data_name, static_name, BuildFnv, FieldParse, OnError, PARSER_KEYS};

/// Keys accepted.
pub const KEYS: &[&str] = &[
    PARSER_KEYS[0],
    PARSER_KEYS[1],
    PARSER_KEYS[2],
    PARSER_KEYS[3],
    PARSER_KEYS[4],
    "flatten",
    "separator",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Turns a field holding a JSON object into fields, in input order; an existing field of the same name is replaced."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    crate::processors::common::FIELD_DOC,
    crate::processors::common::ON_ERROR_DOC,
    crate::processors::common::RAW_FIELD_DOC,
    petrel_core::plugin::KeyDoc {
        name: "flatten",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"`true`: nested objects become `a.b.c` keys; arrays are not flattened."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "separator",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"."#),
        doc: r#"Joins flattened keys (with `flatten: true`)."#,
    },
];

/// The name used in `parse_error` messages.
const WHO: &str = "parse_json";

/// Configuration of `parse_json`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The field holding the JSON text.
    pub field: String,
    /// Join nested object keys with `separator` instead of nesting.
    pub flatten: bool,
    /// Joins flattened keys.
    pub separator: String,
    /// What to do with an event that does not parse.
    pub on_error: OnError,
}

impl Config {
    /// Reads the keys; problems are recorded on the map's node.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let on_error = OnError::parse(&map)?;
        let field = map.str("field").unwrap_or("message").to_string();
        let flatten = match map.get("flatten") {
            Some(n) => n.as_bool()?,
            None => false,
        };
        let separator = match map.get("separator") {
            Some(n) => {
                let s = n.as_str()?;
                if s.is_empty() {
                    n.error("`separator` must not be empty; the default is `.`");
                    return None;
                }
                if !flatten {
                    n.error("`separator` only applies with `flatten: true`; add it or remove `separator`");
                    return None;
                }
                s.to_string()
            }
            None => ".".to_string(),
        };
        Some(Self {
            field,
            flatten,
            separator,
            on_error,
        })
    }
}

/// The running `parse_json` processor.
pub struct ParseJson {
    parse: FieldParse,
    parser: JsonParser,
}

impl ParseJson {
    /// Builds the processor; counters are taken now so the hot path only
    /// bumps atomics.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            parse: FieldParse::new(WHO, &c.field, &c.on_error, &metrics),
            parser: JsonParser::new(c.flatten.then_some(c.separator.as_str())),
        })
    }
}

impl Processor for ParseJson {
    fn process(&self, batch: &mut EventBatch) {
        self.parse.apply(batch, false, |bytes, base, parsed| {
            self.parser.parse(bytes, base, parsed)
        });
    }
}

/// Why a value did not parse.
#[derive(Debug)]
pub enum JsonError {
    /// Invalid JSON, or JSON that is not an object.
    Invalid(String),
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Invalid(e) => write!(f, "invalid JSON: {e}"),
        }
    }
}

/// Parses JSON objects into Petrel fields. Shared by the processor, the
/// benchmarks (which drive it with other JSON engines) and the fuzz targets.
#[derive(Debug, Clone)]
pub struct JsonParser {
    /// `Some(separator)` when nested objects are flattened.
    separator: Option<&'static str>,
}

impl JsonParser {
    /// A parser; `flatten_separator` set flattens nested objects.
    pub fn new(flatten_separator: Option<&str>) -> Self {
        Self {
            separator: flatten_separator.map(static_name),
        }
    }

    /// Parses `input`, which must hold one JSON object, appending its fields
    /// to `out`. `base` is the offset of `input` in the batch buffer when it
    /// is a span of it: strings without escapes then become spans. On error
    /// `out` may hold part of the fields.
    pub fn parse(
        &self,
        input: &[u8],
        base: Option<u32>,
        out: &mut Vec<(Key, Value)>,
    ) -> Result<(), JsonError> {
        // Anything but an object is rejected here rather than by sonic-rs:
        // to report a wrong type it skips the whole value with a recursion
        // that has no depth limit, so a line of 100k `[` would overflow the
        // worker's stack.
        let first = input
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
        if first != Some(&b'{') {
            return Err(JsonError::Invalid(match first {
                None => "empty input".into(),
                Some(_) => "not a JSON object".into(),
            }));
        }
        // sonic-rs validates the UTF-8 of the whole input before parsing
        // and rejects strings past an invalid byte, so the `&str`s it hands
        // to the visitor are valid.
        if petrel_core::encode::is_utf8(input) {
            let before = out.len();
            let done = LOCAL_KEYS.with(|cache| {
                let mut cache = cache.borrow_mut();
                let mut ctx = Ctx {
                    start: input.as_ptr() as usize,
                    len: input.len(),
                    original: input,
                    copied: false,
                    base,
                    keys: &mut cache,
                    separator: self.separator,
                    depth: 1,
                };
                flat::parse(
                    input,
                    out,
                    |pos, name| ctx.key_at(pos, name),
                    |offset, s| flat::string_value(base, offset, s),
                )
            });
            if done == flat::Flat::Done {
                return Ok(());
            }
            out.truncate(before);
        }
        self.parse_sonic(input, base, out)
    }

    /// [`parse`](Self::parse) through sonic-rs alone: every input the flat
    /// scan declines, and the reference the scan is tested against.
    fn parse_sonic(
        &self,
        input: &[u8],
        base: Option<u32>,
        out: &mut Vec<(Key, Value)>,
    ) -> Result<(), JsonError> {
        let mut de = sonic_rs::Deserializer::from_slice(input);
        self.parse_with(&mut de, input, None, base, out)
            .and_then(|()| de.end())
            .map_err(|e| {
                // sonic-rs appends an excerpt of the input on further lines;
                // the first line (what and where) is enough for `parse_error`.
                let mut msg = e.to_string();
                msg.truncate(msg.find('\n').unwrap_or(msg.len()));
                JsonError::Invalid(msg)
            })
    }

    /// Like [`parse`](Self::parse) with any serde deserializer. `copy`
    /// is the address range of the bytes the deserializer reads when they
    /// are a copy of `original` it may modify in place (simd-json); `None`
    /// when it reads `original` itself. A borrowed string becomes a span
    /// when `original` holds the same bytes at its offset. The caller checks
    /// for trailing input.
    pub fn parse_with<'de, D: Deserializer<'de>>(
        &self,
        de: D,
        original: &[u8],
        copy: Option<Range<usize>>,
        base: Option<u32>,
        out: &mut Vec<(Key, Value)>,
    ) -> Result<(), D::Error> {
        let range = original.as_ptr_range();
        let copied = copy.is_some();
        let parsed = copy.unwrap_or(range.start as usize..range.end as usize);
        LOCAL_KEYS.with(|cache| {
            // Not re-entered: nothing called from here parses JSON again.
            let mut cache = cache.borrow_mut();
            let mut ctx = Ctx {
                start: parsed.start,
                len: parsed.end.saturating_sub(parsed.start),
                original,
                copied,
                base,
                keys: &mut cache,
                separator: self.separator,
                depth: 1,
            };
            de.deserialize_map(TopVisitor { ctx: &mut ctx, out })
        })
    }
}

/// Per-thread view of the interned names: the hot path looks names up here
/// without any lock.
#[derive(Default)]
struct LocalKeys {
    set: HashSet<&'static str, BuildFnv>,
    /// The names of the last object by position: log lines nearly always
    /// carry the same keys in the same order, so one string comparison
    /// usually replaces hashing.
    recent: Vec<&'static str>,
}

/// Positions remembered in [`LocalKeys::recent`].
const MAX_RECENT: usize = 64;

thread_local! {
    static LOCAL_KEYS: RefCell<LocalKeys> = RefCell::default();
}

// ---------------------------------------------------------------------------
// serde visitors building Petrel values.

struct Ctx<'c> {
    /// Address range of the bytes being parsed, to recognise borrowed strings.
    start: usize,
    len: usize,
    original: &'c [u8],
    /// The parsed bytes are a copy that may have been modified in place.
    copied: bool,
    base: Option<u32>,
    keys: &'c mut LocalKeys,
    separator: Option<&'static str>,
    /// Arrays and objects open around the value being read.
    depth: usize,
}

/// Deepest nesting accepted. sonic-rs allows 255 levels, which is more stack
/// than a 2 MiB thread has in debug builds (about 23 KiB per level there,
/// well under 1 KiB in release); logs never nest anywhere near this deep.
const MAX_DEPTH: usize = petrel_core::json::MAX_JSON_DEPTH;

impl Ctx<'_> {
    /// Enters an array or object; fails past [`MAX_DEPTH`].
    #[inline]
    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(E::custom(format_args!(
                "nested deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(())
    }
    #[inline]
    fn key(&mut self, name: &str) -> Key {
        if let Some(s) = self.keys.set.get(name) {
            return Cow::Borrowed(s);
        }
        match intern_data_name(name) {
            Some(s) => {
                self.keys.set.insert(s);
                Cow::Borrowed(s)
            }
            None => Cow::Owned(name.to_string()),
        }
    }

    /// The key for the `pos`-th field of the top-level object.
    #[inline]
    fn key_at(&mut self, pos: usize, name: &str) -> Key {
        if let Some(s) = self.keys.recent.get(pos) {
            if *s == name {
                return Cow::Borrowed(s);
            }
        }
        let key = self.key(name);
        if let Cow::Borrowed(s) = key {
            let recent = &mut self.keys.recent;
            if pos < recent.len() {
                recent[pos] = s;
            } else if pos == recent.len() && pos < MAX_RECENT {
                recent.push(s);
            }
        }
        key
    }

    /// A string the parser borrowed from its input: a span when it lies in
    /// the input and the input is a span of the batch buffer.
    #[inline]
    fn borrowed_str(&self, s: &str) -> Value {
        if let Some(base) = self.base {
            let p = s.as_ptr() as usize;
            if p >= self.start && p - self.start + s.len() <= self.len {
                let off = p - self.start;
                if !self.copied || self.original.get(off..off + s.len()) == Some(s.as_bytes()) {
                    return Value::Span(Span::new(base as usize + off, s.len()));
                }
            }
        }
        Value::Str(s.into())
    }
}

/// The top-level object: its fields go to `out`.
struct TopVisitor<'a, 'c> {
    ctx: &'a mut Ctx<'c>,
    out: &'a mut Vec<(Key, Value)>,
}

impl<'de> Visitor<'de> for TopVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        match self.ctx.separator {
            None => {
                let first = self.out.len();
                while let Some(key) = map.next_key_seed(KeySeed {
                    ctx: &mut *self.ctx,
                    pos: Some(self.out.len() - first),
                })? {
                    let v = map.next_value_seed(ValueSeed(&mut *self.ctx))?;
                    self.out.push((key, v));
                }
            }
            Some(sep) => {
                let mut prefix = String::new();
                let first = self.out.len();
                while let Some(name) = map.next_key_seed(NameSeed)? {
                    prefix.clear();
                    prefix.push_str(&name);
                    map.next_value_seed(FlatSeed {
                        ctx: &mut *self.ctx,
                        first,
                        prefix: &mut prefix,
                        sep,
                        out: &mut *self.out,
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// A key as a Petrel key (interned when possible); `pos` is its position
/// in the top-level object.
struct KeySeed<'a, 'c> {
    ctx: &'a mut Ctx<'c>,
    pos: Option<usize>,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_, '_> {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_, '_> {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match self.pos {
            Some(pos) => self.ctx.key_at(pos, v),
            None => self.ctx.key(v),
        })
    }
}

/// A key as text, for building flattened names.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// Any JSON value as a Petrel value.
struct ValueSeed<'a, 'c>(&'a mut Ctx<'c>);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Scalars shared by [`ValueSeed`] and [`FlatSeed`].
macro_rules! scalar_visits {
    ($out:ty, $wrap:expr) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<$out, E> {
            Ok($wrap(self, Value::Bool(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<$out, E> {
            Ok($wrap(self, Value::Int(v)))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<$out, E> {
            let v = i64::try_from(v).map_or(Value::Float(v as f64), Value::Int);
            Ok($wrap(self, v))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<$out, E> {
            Ok($wrap(self, Value::Float(v)))
        }
        fn visit_unit<E: de::Error>(self) -> Result<$out, E> {
            Ok($wrap(self, Value::Null))
        }
        fn visit_none<E: de::Error>(self) -> Result<$out, E> {
            Ok($wrap(self, Value::Null))
        }
        fn visit_borrowed_str<E: de::Error>(mut self, v: &'de str) -> Result<$out, E> {
            let v = self.ctx().borrowed_str(v);
            Ok($wrap(self, v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<$out, E> {
            Ok($wrap(self, Value::Str(v.into())))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<$out, E> {
            Ok($wrap(self, Value::Str(v.into_boxed_str())))
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<$out, E> {
            Ok($wrap(self, Value::Bytes(v.into())))
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<$out, A::Error> {
            self.ctx().enter()?;
            // The hint comes from the input; cap it so a hostile length
            // cannot reserve much memory up front.
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(v) = seq.next_element_seed(ValueSeed(&mut *self.ctx()))? {
                items.push(v);
            }
            self.ctx().depth -= 1;
            Ok($wrap(self, Value::Array(items)))
        }
    };
}

trait HasCtx<'c> {
    fn ctx(&mut self) -> &mut Ctx<'c>;
}

impl<'c> HasCtx<'c> for ValueSeed<'_, 'c> {
    fn ctx(&mut self) -> &mut Ctx<'c> {
        self.0
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    scalar_visits!(Value, |_s: Self, v: Value| v);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.enter()?;
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(k) = map.next_key_seed(KeySeed {
            ctx: &mut *self.0,
            pos: None,
        })? {
            let v = map.next_value_seed(ValueSeed(&mut *self.0))?;
            fields.push((k, v));
        }
        self.0.depth -= 1;
        Ok(Value::Object(fields))
    }
}

/// A value under flattened name `prefix`: objects recurse with longer
/// names, anything else is appended to `out`.
struct FlatSeed<'a, 'c> {
    ctx: &'a mut Ctx<'c>,
    /// Fields already in `out` before this object.
    first: usize,
    prefix: &'a mut String,
    sep: &'static str,
    out: &'a mut Vec<(Key, Value)>,
}

impl<'c> HasCtx<'c> for FlatSeed<'_, 'c> {
    fn ctx(&mut self) -> &mut Ctx<'c> {
        self.ctx
    }
}

impl FlatSeed<'_, '_> {
    fn push(self, v: Value) {
        let key = self.ctx.key_at(self.out.len() - self.first, self.prefix);
        self.out.push((key, v));
    }
}

impl<'de> DeserializeSeed<'de> for FlatSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FlatSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    scalar_visits!((), |s: Self, v: Value| s.push(v));

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.ctx.enter()?;
        let len = self.prefix.len();
        let mut empty = true;
        while let Some(name) = map.next_key_seed(NameSeed)? {
            empty = false;
            self.prefix.truncate(len);
            self.prefix.push_str(self.sep);
            self.prefix.push_str(&name);
            map.next_value_seed(FlatSeed {
                ctx: &mut *self.ctx,
                first: self.first,
                prefix: &mut *self.prefix,
                sep: self.sep,
                out: &mut *self.out,
            })?;
        }
        self.prefix.truncate(len);
        self.ctx.depth -= 1;
        if empty {
            self.push(Value::Object(Vec::new()));
        }
        Ok(())
    }
}

/// Registration of `type: parse_json`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "parse_json",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "parse_json"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(ParseJson::new(self, metrics)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::processors::common::{merge_fields, INTERNER_FULL};
    use bytes::Bytes;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::Event;
    use petrel_core::{Metrics, SourceInfo};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

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

    /// Runs a processor built from `yaml` over `lines`; returns the batch and
    /// the metrics text.
    fn run(yaml: &str, lines: &[&[u8]]) -> (EventBatch, String) {
        let c = config(yaml).expect("config");
        let metrics = Metrics::new();
        let p = ParseJson::new(&c, metrics.component("p", "processor", "j", "parse_json"))
            .expect("build");
        let batch = process_lines(&p, lines);
        (batch, metrics.render())
    }

    pub(crate) fn process_lines(p: &dyn Processor, lines: &[&[u8]]) -> EventBatch {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for l in lines {
            spans.push(Span::new(buf.len(), l.len()));
            buf.extend_from_slice(l);
            buf.push(b'\n');
        }
        let mut b = EventBatch::new(
            Bytes::from(buf),
            Arc::new(SourceInfo::file("/x.log", Default::default())),
        );
        b.events = spans.into_iter().map(Event::from_span).collect();
        p.process(&mut b);
        for ev in &b.events {
            check_spans(&b.buf, &ev.message);
            for (_, v) in &ev.fields {
                check_spans(&b.buf, v);
            }
        }
        b
    }

    fn check_spans(buf: &[u8], v: &Value) {
        match v {
            Value::Span(s) => assert!(s.end() <= buf.len(), "{s:?} outside {}", buf.len()),
            Value::Array(items) => items.iter().for_each(|v| check_spans(buf, v)),
            Value::Object(f) => f.iter().for_each(|(_, v)| check_spans(buf, v)),
            _ => {}
        }
    }

    fn text<'a>(b: &'a EventBatch, ev: usize, name: &str) -> Option<&'a str> {
        let v = b.events[ev].get(name)?;
        b.bytes_of(v).map(|x| std::str::from_utf8(x).expect("utf8"))
    }

    fn ndjson(b: &EventBatch) -> String {
        let mut out = Vec::new();
        petrel_core::encode::encode_batch(
            &petrel_core::encode::Encoding::from_name("ndjson").expect("ndjson"),
            b,
            &mut out,
            None,
        );
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn object_becomes_fields_with_spans_for_plain_strings() {
        let line = br#"{"time":"2025-04-03","level":"info","pid":123,"neg":-4,"f":1.5,"big":18446744073709551615,"esc":"a\"b\u00e9","t":true,"n":null,"arr":[1,"x",{"k":"v"}],"obj":{"a":{"b":2}}}"#;
        let (b, _) = run("type: parse_json", &[line]);
        let ev = &b.events[0];
        assert!(matches!(ev.get("time"), Some(Value::Span(_))));
        assert_eq!(text(&b, 0, "time"), Some("2025-04-03"));
        assert_eq!(text(&b, 0, "level"), Some("info"));
        assert_eq!(ev.get("pid"), Some(&Value::Int(123)));
        assert_eq!(ev.get("neg"), Some(&Value::Int(-4)));
        assert_eq!(ev.get("f"), Some(&Value::Float(1.5)));
        assert_eq!(ev.get("big"), Some(&Value::Float(18446744073709551615.0)));
        assert_eq!(ev.get("esc"), Some(&Value::Str("a\"bé".into())));
        assert_eq!(ev.get("t"), Some(&Value::Bool(true)));
        assert_eq!(ev.get("n"), Some(&Value::Null));
        let Some(Value::Array(items)) = ev.get("arr") else {
            panic!("array expected")
        };
        assert_eq!(items.len(), 3);
        assert!(matches!(items[2], Value::Object(_)));
        let names: Vec<&str> = ev.fields.iter().map(|(k, _)| &**k).collect();
        assert_eq!(
            names,
            ["time", "level", "pid", "neg", "f", "big", "esc", "t", "n", "arr", "obj"]
        );
        // Interned names are borrowed: no allocation per field (unless
        // another test filled the bounded interner first).
        assert!(
            INTERNER_FULL.load(Ordering::Relaxed)
                || ev.fields.iter().all(|(k, _)| matches!(k, Cow::Borrowed(_)))
        );
        let out = ndjson(&b);
        assert!(
            out.contains(r#""obj":{"a":{"b":2}}"#) && out.contains(r#""arr":[1,"x",{"k":"v"}]"#),
            "{out}"
        );
    }

    #[test]
    fn flatten_joins_nested_keys() {
        let line = br#"{"a":{"b":{"c":1},"d":"x","e":{}},"f":[{"g":1}],"h":2}"#;
        let (b, _) = run("type: parse_json\nflatten: true\nseparator: _", &[line]);
        let ev = &b.events[0];
        let names: Vec<&str> = ev.fields.iter().map(|(k, _)| &**k).collect();
        assert_eq!(names, ["a_b_c", "a_d", "a_e", "f", "h"]);
        assert_eq!(ev.get("a_b_c"), Some(&Value::Int(1)));
        assert_eq!(text(&b, 0, "a_d"), Some("x"));
        assert_eq!(ev.get("a_e"), Some(&Value::Object(Vec::new())));
        assert!(matches!(ev.get("f"), Some(Value::Array(_))));
        let (b, _) = run("type: parse_json\nflatten: true", &[br#"{"a":{"b":1}}"#]);
        assert_eq!(b.events[0].get("a.b"), Some(&Value::Int(1)));
    }

    #[test]
    fn repeated_and_message_keys_replace() {
        let (b, _) = run("type: parse_json", &[br#"{"a":1,"a":2,"message":"inner"}"#]);
        let ev = &b.events[0];
        assert_eq!(ev.fields, vec![("a".into(), Value::Int(2))]);
        assert_eq!(b.bytes_of(&ev.message), Some(&b"inner"[..]));
    }

    #[test]
    fn failures_follow_on_error() {
        let bad: &[&[u8]] = &[
            br#"{"a":1"#,            // truncated
            br#"{"a":tru}"#,         // broken literal
            b"",                     // empty line
            b"[1,2]",                // not an object
            b"\"str\"",              // not an object
            b"{\"a\":\"\xff\xfe\"}", // invalid UTF-8
            br#"{"a":1} trailing"#,  // trailing garbage
            br#"{"a":1}"#,           // fine
        ];
        let (b, m) = run("type: parse_json", bad);
        assert_eq!(b.events.len(), 8);
        for ev in &b.events[..7] {
            let Some(Value::Str(e)) = ev.get("parse_error") else {
                panic!("parse_error expected: {ev:?}")
            };
            assert!(e.starts_with("parse_json: invalid JSON"), "{e}");
        }
        assert!(b.events[7].get("parse_error").is_none());
        assert!(m.contains("error_type=\"parse_failed\"} 7"), "{m}");

        let (b, m) = run("type: parse_json\non_error: drop", bad);
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.events[0].get("a"), Some(&Value::Int(1)));
        assert!(m.contains("reason=\"parse_error\"} 7"), "{m}");

        let (b, _) = run("type: parse_json\non_error: raw\nraw_field: orig", bad);
        assert_eq!(b.events.len(), 8);
        assert_eq!(text(&b, 0, "orig"), Some(r#"{"a":1"#));
        assert!(b.events[0].get("parse_error").is_some());
    }

    #[test]
    fn missing_field_is_a_failure() {
        let (b, _) = run("type: parse_json\nfield: nope", &[br#"{"a":1}"#]);
        let Some(Value::Str(e)) = b.events[0].get("parse_error") else {
            panic!("parse_error expected")
        };
        assert_eq!(&**e, "parse_json: field is missing or not text");
    }

    #[test]
    fn owned_source_values_give_owned_strings() {
        let p = JsonParser::new(None);
        let mut out = Vec::new();
        p.parse(br#"{"a":"x"}"#, None, &mut out).expect("parse");
        assert_eq!(out, vec![("a".into(), Value::Str("x".into()))]);
    }

    #[test]
    fn huge_and_deep_inputs_do_not_break() {
        let mut big = b"{\"log\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', 1 << 20));
        big.extend_from_slice(b"\"}");
        let deep = [vec![b'['; 100_000], vec![b']'; 100_000]].concat();
        let mut deep_obj = b"{\"a\":".to_vec();
        deep_obj.extend(std::iter::repeat_n(b"{\"a\":".as_slice(), 5000).flatten());
        // A 1 MiB object with many distinct keys takes the indexed merge.
        let mut wide = b"{".to_vec();
        for i in 0..50_000 {
            wide.extend_from_slice(format!("\"k{}\":{},", i % 40_000, i).as_bytes());
        }
        wide.extend_from_slice(b"\"end\":0}");
        let (b, _) = run("type: parse_json", &[&big, &deep, &deep_obj, &wide]);
        assert_eq!(text(&b, 0, "log").map(str::len), Some(1 << 20));
        assert!(b.events[1].get("parse_error").is_some());
        assert!(b.events[2].get("parse_error").is_some());
        assert_eq!(b.events[3].fields.len(), 40_001);
        assert_eq!(b.events[3].get("k0"), Some(&Value::Int(40_000)));
    }

    #[test]
    fn config_errors_are_positioned() {
        let e = config("type: parse_json\nseparator: _").unwrap_err();
        assert!(
            e[0].starts_with("t.yaml:2:12: `separator` only applies"),
            "{e:?}"
        );
        let e = config("type: parse_json\nflatten: maybe").unwrap_err();
        assert!(e[0].contains("must be `true` or `false`"), "{e:?}");
        let e = config("type: parse_json\non_error: ignore").unwrap_err();
        assert!(
            e[0].contains("must be one of `keep`, `drop`, `raw`"),
            "{e:?}"
        );
    }

    #[test]
    fn merge_keeps_set_semantics_when_fields_exist() {
        let mut ev = Event::from_span(Span::new(0, 1));
        ev.fields.push(("a".into(), Value::Int(0)));
        let mut parsed = vec![("b".into(), Value::Int(1)), ("a".into(), Value::Int(2))];
        merge_fields(&mut ev, &mut parsed, true);
        assert_eq!(
            ev.fields,
            vec![("a".into(), Value::Int(2)), ("b".into(), Value::Int(1))]
        );
        assert!(parsed.is_empty());
    }

    /// A bounded, seeded fuzz run: random and mutated inputs never panic and
    /// every span stays inside the buffer (the `fuzz/` targets do the same
    /// with coverage guidance).
    #[test]
    fn random_inputs_never_panic() {
        let p = ParseJson::new(
            &config("type: parse_json\nflatten: true").expect("config"),
            Metrics::new().component("p", "processor", "j", "parse_json"),
        )
        .expect("build");
        let q = ParseJson::new(
            &config("type: parse_json").expect("config"),
            Metrics::new().component("p", "processor", "j", "parse_json"),
        )
        .expect("build");
        let seeds: &[&[u8]] = &[
            br#"{"a":{"b":[1,2.5,"x\n"]},"c":null,"d":"plain","e":true}"#,
            br#"{"time":"2025","level":"info","pid":1,"log":"abc"}"#,
        ];
        let mut rng = crate::processors::parse_delimiter::tests::Rng(7);
        for _ in 0..20_000 {
            let line = rng.mutate(seeds, b"{}[]\":,\\u0aeE.-+ \xff");
            process_lines(&p, &[&line]);
            process_lines(&q, &[&line]);
        }
    }

    /// The flat scan gives exactly what sonic-rs gives, and declines
    /// whatever it does not handle the same way (sonic-rs then decides).
    #[test]
    fn the_flat_scan_agrees_with_sonic_rs() {
        let cases: &[&[u8]] = &[
            br#"{"a":"x","b":1,"c":-2,"d":true,"e":false,"f":null}"#,
            br#"  { "a" : "x" , "b" :  0 }  "#,
            b"{\t\"a\"\r\n:\n\"x\"}\n",
            br#"{}"#,
            br#"{ }"#,
            br#"{"a":"x","a":"y"}"#,
            br#"{"message":"m","file":"f.go"}"#,
            br#"{"a":"","b":"\u00e9","c":"\"q\"","d":"a\\b"}"#,
            "{\"a\":\"é 中文 🙂\",\"é\":1}".as_bytes(),
            br#"{"a":123456789012345678,"b":-123456789012345678}"#,
            br#"{"a":1234567890123456789,"b":9223372036854775807,"c":9223372036854775808}"#,
            br#"{"a":-9223372036854775808,"b":18446744073709551616}"#,
            br#"{"a":0,"b":-0,"c":01,"d":-01,"e":1.5,"f":1e3,"g":1E3,"h":-}"#,
            br#"{"a":1.0}"#,
            br#"{"a":-0}"#,
            br#"{"a":01}"#,
            br#"{"a":1x}"#,
            br#"{"a":tru}"#,
            br#"{"a":truex}"#,
            br#"{"a":nul}"#,
            br#"{"a":{"b":1}}"#,
            br#"{"a":[1,2]}"#,
            br#"{"a":"x",}"#,
            br#"{"a" "x"}"#,
            br#"{"a":"x""b":1}"#,
            br#"{"a":"x"} x"#,
            br#"{"a":"x"}}"#,
            br#"{"a":"unterminated}"#,
            br#"{"a":"x"#,
            br#"{"a":"#,
            br#"{"a""#,
            br#"{"a"#,
            br#"{"#,
            br#"{a:1}"#,
            b"{\"a\":\"tab\there\"}",
            b"{\"a\":\"nl\nhere\"}",
            b"{\"a\":\"\x7f\"}",
            b"{\"a\":\"\xff\"}",
            b"{\"\xff\":1}",
            b"{\"a\":\"x\"}\x00",
            "{\"k\":\"0123456789abcdef0123456789abcdef\\\"0123456789abcdef\"}".as_bytes(),
        ];
        let long = format!(
            r#"{{"time":"2025-04-03 10:02:06.561793","level":"error","pid":174578,"file":"/root/x.go","line":971,"log":"{}"}}"#,
            "L".repeat(400)
        );
        let mut all: Vec<Vec<u8>> = cases.iter().map(|c| c.to_vec()).collect();
        all.push(long.clone().into_bytes());
        // Every prefix of a long line: cuts inside keys, values, numbers
        // and literals, at every position of a 16-byte block.
        for cut in 0..long.len() {
            all.push(long.as_bytes()[..cut].to_vec());
        }
        // `parse` answers input that is not an object before either engine
        // sees it.
        all.retain(|i| i.iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'{'));
        for flatten in [None, Some(".")] {
            let p = JsonParser::new(flatten);
            for input in &all {
                for base in [None, Some(7)] {
                    let mut fast = vec![("before".into(), Value::Int(1))];
                    let mut slow = fast.clone();
                    let a = p.parse(input, base, &mut fast);
                    let b = p.parse_sonic(input, base, &mut slow);
                    let shown = String::from_utf8_lossy(input);
                    assert_eq!(a.is_ok(), b.is_ok(), "{shown}");
                    if let (Err(a), Err(b)) = (&a, &b) {
                        assert_eq!(a.to_string(), b.to_string(), "{shown}");
                    }
                    if a.is_ok() {
                        assert_eq!(fast, slow, "{shown}");
                    }
                }
            }
        }
    }
}
