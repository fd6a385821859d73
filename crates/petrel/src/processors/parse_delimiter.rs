//! `type: parse_delimiter` — separated values into fields.
//!
//! ```yaml
//! processors:
//!   - type: parse_delimiter
//!     field: message      # default `message`
//!     separator: "|"      # required; one or more bytes, e.g. "\t" or " | "
//!     quote: '"'          # default `"`; one byte; "" turns quoting off
//!     keys: [time, level, pid, file, line, log]   # required
//!     extra: last         # last | drop | error
//!     on_error: keep      # keep | drop | raw
//!     raw_field: raw      # with `on_error: raw`
//! ```
//!
//! The field is split at every `separator`; the n-th value goes to the n-th
//! key, borrowed from the read buffer without a copy. Empty values (`a||c`)
//! are empty strings.
//!
//! Quoting: a value that starts with the quote byte is quoted. It ends at
//! the next lone quote, which must be followed by a separator or the end of
//! the field; a doubled quote inside stands for one quote (`"say ""hi"""`
//! gives `say "hi"`). The value is the text between the quotes. A quote
//! anywhere else in a value is an ordinary byte.
//!
//! Fewer values than keys: the keys without a value are absent; not an
//! error. More values than keys, by `extra`:
//! - `last` (default): the last key gets the rest of the field unsplit,
//!   separators and quotes included, like `splitn`. When the rest is one
//!   single value, quoted or not, it is taken like any other value.
//! - `drop`: the values beyond the last key are ignored.
//! - `error`: the event fails to parse.
//!
//! Parse failures: an empty field, a quoted value without its closing
//! quote, a closing quote followed by something other than a separator,
//! too many values with `extra: error`, a missing or non-text field. They
//! are counted in `component_errors{error_type="parse_failed"}` and handled
//! by `on_error` (`keep`: unchanged plus `parse_error`; `drop`: dropped and
//! counted as discarded with reason `parse_error`; `raw`: like keep, with the
//! field copied into `raw_field`). Bytes need not be UTF-8.
//!
//! Engine: a splitter on `memchr` (SIMD byte search; `memmem` for
//! multi-byte separators).

use std::fmt;

use memchr::memmem;
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
    "separator",
    "quote",
    "keys",
    "extra",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Splits a field at a separator into the given keys, with optional quoting; values borrow from the read buffer."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    crate::processors::common::FIELD_DOC,
    crate::processors::common::ON_ERROR_DOC,
    crate::processors::common::RAW_FIELD_DOC,
    petrel_core::plugin::KeyDoc {
        name: "separator",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: one or more bytes, e.g. `"\t"` or `" | "`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "quote",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"""#),
        doc: r#"One byte that quotes a value (a doubled quote inside stands for one); `""` turns quoting off."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "keys",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Required: the field names, in order; keys without a value are absent."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "extra",
        kind: petrel_core::plugin::KeyKind::OneOf(&["last", "drop", "error"]),
        default: Some(r#"last"#),
        doc: r#"More values than keys: `last` gives the last key the rest unsplit, `drop` ignores them, `error` fails the parse."#,
    },
];

const WHO: &str = "parse_delimiter";

/// What to do with values beyond the last key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// The last key gets the rest of the field, unsplit.
    Last,
    /// Ignore them.
    Drop,
    /// Fail to parse.
    Error,
}

/// Configuration of `parse_delimiter`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The field to split.
    pub field: String,
    /// The separator, one or more bytes.
    pub separator: Vec<u8>,
    /// The quote byte, `None` when quoting is off.
    pub quote: Option<u8>,
    /// Names of the values, in order; distinct and non-empty.
    pub keys: Vec<String>,
    /// Values beyond the last key.
    pub extra: Extra,
    /// What to do with an event that does not parse.
    pub on_error: OnError,
}

impl Config {
    /// Reads the keys; problems are recorded with their position.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let on_error = OnError::parse(&map)?;
        let field = map.str("field").unwrap_or("message").to_string();
        let sep_node = map.required("separator", "\"|\"")?;
        let separator = sep_node.as_str()?.as_bytes().to_vec();
        if separator.is_empty() {
            sep_node.error("`separator` must not be empty; for example `separator: \"|\"`");
            return None;
        }
        let quote = match map.get("quote") {
            None => Some(b'"'),
            Some(n) => match n.as_str()?.as_bytes() {
                [] => None,
                [q] => {
                    if separator.contains(q) {
                        n.error("`quote` must not be part of `separator`");
                        return None;
                    }
                    Some(*q)
                }
                _ => {
                    n.error("`quote` must be a single byte such as '\"' or \"'\", or \"\" to turn quoting off");
                    return None;
                }
            },
        };
        let keys_node = map.required("keys", "[time, level, message]")?;
        let mut keys: Vec<String> = Vec::new();
        for (k, n) in keys_node.as_str_list() {
            if k.is_empty() {
                n.error("a key name must not be empty");
                return None;
            }
            if keys.iter().any(|x| x == k) {
                n.error(format!(
                    "key `{k}` is listed twice; every value needs its own name"
                ));
                return None;
            }
            keys.push(k.to_string());
        }
        if keys.is_empty() {
            keys_node
                .error("`keys` must name at least one value, e.g. `keys: [time, level, message]`");
            return None;
        }
        let extra = match map.get("extra") {
            None => Extra::Last,
            Some(n) => match n.as_choice(&["last", "drop", "error"])? {
                "drop" => Extra::Drop,
                "error" => Extra::Error,
                _ => Extra::Last,
            },
        };
        Some(Self {
            field,
            separator,
            quote,
            keys,
            extra,
            on_error,
        })
    }
}

/// The running `parse_delimiter` processor.
pub struct ParseDelimiter {
    parse: FieldParse,
    splitter: Splitter,
    keys: Vec<Key>,
}

impl ParseDelimiter {
    /// Builds the processor; counters are taken now so the hot path only
    /// bumps atomics.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        if c.keys.is_empty() || c.separator.is_empty() {
            anyhow::bail!("parse_delimiter needs a separator and at least one key");
        }
        Ok(Self {
            parse: FieldParse::new(WHO, &c.field, &c.on_error, &metrics),
            splitter: Splitter::new(&c.separator, c.quote, c.keys.len(), c.extra),
            keys: c.keys.iter().map(|k| config_key(k)).collect(),
        })
    }
}

impl Processor for ParseDelimiter {
    fn process(&self, batch: &mut EventBatch) {
        let mut parts: Vec<Part> = Vec::with_capacity(self.keys.len());
        self.parse.apply(batch, true, |bytes, base, parsed| {
            parts.clear();
            self.splitter.split(bytes, &mut parts)?;
            for (part, key) in parts.iter().zip(&self.keys) {
                parsed.push((key.clone(), part.value(bytes, base, self.splitter.quote)));
            }
            Ok::<(), SplitError>(())
        });
    }
}

/// Why a field did not split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    /// The field is empty.
    Empty,
    /// A quoted value has no closing quote.
    UnterminatedQuote,
    /// A closing quote is followed by neither a separator nor the end.
    TextAfterQuote,
    /// More values than keys with `extra: error`.
    TooManyValues,
}

impl fmt::Display for SplitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SplitError::Empty => "field is empty",
            SplitError::UnterminatedQuote => "quoted value without closing quote",
            SplitError::TextAfterQuote => "closing quote not followed by a separator",
            SplitError::TooManyValues => "more values than keys",
        })
    }
}

/// One value: the byte range `start..end` of the field (inside the quotes
/// for a quoted value); `doubled` when it holds doubled quotes to unescape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// First byte of the value.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
    /// The value contains doubled quotes standing for single ones.
    pub doubled: bool,
}

impl Part {
    /// The value: a span of the batch buffer when possible (`base` is the
    /// field's offset in it), an owned unescaped copy otherwise.
    #[inline]
    pub fn value(&self, field: &[u8], base: Option<u32>, quote: Option<u8>) -> Value {
        match (self.doubled, quote) {
            (true, Some(q)) => {
                let raw = field.get(self.start..self.end).unwrap_or_default();
                let mut out = Vec::with_capacity(raw.len());
                let mut i = 0;
                while let Some(&b) = raw.get(i) {
                    out.push(b);
                    // A doubled quote stands for one.
                    i += if b == q && raw.get(i + 1) == Some(&q) {
                        2
                    } else {
                        1
                    };
                }
                match String::from_utf8(out) {
                    Ok(s) => Value::Str(s.into_boxed_str()),
                    Err(e) => Value::Bytes(e.into_bytes().into_boxed_slice()),
                }
            }
            _ => common::part_value(field, base, self.start, self.end),
        }
    }
}

/// Bytes examined eight at a time before handing over to `memchr`.
const SHORT_SCAN: usize = 32;

/// The first `b` in `hay`. Log fields are mostly a few bytes long, where a
/// call into `memchr` costs more than the search itself: the first
/// [`SHORT_SCAN`] bytes are searched inline a word at a time, the rest (a
/// long message) by `memchr`'s SIMD loop.
#[inline]
fn find_byte(b: u8, hay: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let pattern = LO * u64::from(b);
    let mut i = 0;
    while i < SHORT_SCAN {
        let Some(chunk) = hay.get(i..i + 8) else {
            // Fewer than eight bytes left.
            return hay
                .get(i..)
                .unwrap_or_default()
                .iter()
                .position(|&c| c == b)
                .map(|j| i + j);
        };
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ pattern;
        // A zero byte in `x` is a match. The lowest flagged byte is always a
        // true zero (borrows only run towards higher bytes).
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    memchr::memchr(b, hay.get(i..).unwrap_or_default()).map(|j| i + j)
}

enum Separator {
    Byte(u8),
    // Boxed: the finder is large and multi-byte separators are rare.
    Bytes(Box<memmem::Finder<'static>>),
}

/// Splits fields into [`Part`]s; public for the benchmarks and fuzz targets.
pub struct Splitter {
    sep: Separator,
    sep_len: usize,
    quote: Option<u8>,
    keys: usize,
    extra: Extra,
}

impl Splitter {
    /// A splitter for `keys` values (at least one) separated by `sep` (not
    /// empty), with optional quoting.
    pub fn new(sep: &[u8], quote: Option<u8>, keys: usize, extra: Extra) -> Self {
        Self {
            sep: match sep {
                [b] => Separator::Byte(*b),
                _ => Separator::Bytes(Box::new(memmem::Finder::new(sep).into_owned())),
            },
            sep_len: sep.len().max(1),
            quote,
            keys: keys.max(1),
            extra,
        }
    }

    #[inline]
    fn find_sep(&self, hay: &[u8]) -> Option<usize> {
        match &self.sep {
            Separator::Byte(b) => find_byte(*b, hay),
            Separator::Bytes(f) => f.find(hay),
        }
    }

    /// Splits `field` into at most as many parts as there are keys, pushed
    /// to `out`. Every part lies inside `field`.
    pub fn split(&self, field: &[u8], out: &mut Vec<Part>) -> Result<(), SplitError> {
        if field.is_empty() {
            return Err(SplitError::Empty);
        }
        let mut pos = 0;
        loop {
            if out.len() + 1 == self.keys && self.extra == Extra::Last {
                out.push(self.rest(field, pos));
                return Ok(());
            }
            let (part, next) = self.value(field, pos)?;
            out.push(part);
            let Some(next) = next else { return Ok(()) };
            if out.len() == self.keys {
                return match self.extra {
                    Extra::Error => Err(SplitError::TooManyValues),
                    _ => Ok(()),
                };
            }
            pos = next;
        }
    }

    /// The last key's value under `extra: last`: one value when the rest is
    /// exactly one, else the rest unsplit.
    fn rest(&self, field: &[u8], pos: usize) -> Part {
        let raw = Part {
            start: pos,
            end: field.len(),
            doubled: false,
        };
        // An unquoted value runs to the end either way: no need to search.
        if self.quote.is_none() || field.get(pos) != self.quote.as_ref() {
            return raw;
        }
        match self.value(field, pos) {
            Ok((part, None)) => part,
            _ => raw,
        }
    }

    /// The value starting at `pos` and where the next one starts (`None`
    /// when this one ends the field).
    #[inline]
    fn value(&self, field: &[u8], pos: usize) -> Result<(Part, Option<usize>), SplitError> {
        let rest = field.get(pos..).unwrap_or_default();
        match self.quote {
            Some(q) if rest.first() == Some(&q) => self.quoted(field, pos, q),
            _ => Ok(match self.find_sep(rest) {
                Some(i) => (
                    Part {
                        start: pos,
                        end: pos + i,
                        doubled: false,
                    },
                    Some(pos + i + self.sep_len),
                ),
                None => (
                    Part {
                        start: pos,
                        end: field.len(),
                        doubled: false,
                    },
                    None,
                ),
            }),
        }
    }

    fn quoted(&self, field: &[u8], pos: usize, q: u8) -> Result<(Part, Option<usize>), SplitError> {
        let start = pos + 1;
        let mut i = start;
        let mut doubled = false;
        loop {
            let hay = field.get(i..).unwrap_or_default();
            let close = i + memchr::memchr(q, hay).ok_or(SplitError::UnterminatedQuote)?;
            if field.get(close + 1) == Some(&q) {
                doubled = true;
                i = close + 2;
                continue;
            }
            let part = Part {
                start,
                end: close,
                doubled,
            };
            let after = close + 1;
            if after == field.len() {
                return Ok((part, None));
            }
            let tail = field.get(after..).unwrap_or_default();
            let is_sep = match &self.sep {
                Separator::Byte(b) => tail.first() == Some(b),
                Separator::Bytes(f) => tail.starts_with(f.needle()),
            };
            return if is_sep {
                Ok((part, Some(after + self.sep_len)))
            } else {
                Err(SplitError::TextAfterQuote)
            };
        }
    }
}

/// Registration of `type: parse_delimiter`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "parse_delimiter",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "parse_delimiter"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(ParseDelimiter::new(self, metrics)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::processors::parse_json::tests::process_lines;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::Metrics;
    use std::sync::Arc;

    /// splitmix64 with input mutation helpers, for the seeded fuzz tests of
    /// all three parsers.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        /// A seed with a few random edits (bytes from `alphabet` or any
        /// byte), or purely random bytes.
        pub(crate) fn mutate(&mut self, seeds: &[&[u8]], alphabet: &[u8]) -> Vec<u8> {
            let mut v = if self.below(8) == 0 {
                Vec::new()
            } else {
                seeds[self.below(seeds.len())].to_vec()
            };
            for _ in 0..=self.below(6) {
                let byte = if self.below(4) == 0 {
                    self.next() as u8
                } else {
                    alphabet[self.below(alphabet.len())]
                };
                let at = self.below(v.len() + 1);
                match self.below(4) {
                    0 if !v.is_empty() => {
                        v.remove(at.min(v.len() - 1));
                    }
                    1 => v.truncate(at),
                    2 if !v.is_empty() => {
                        let last = v.len() - 1;
                        v[at.min(last)] = byte;
                    }
                    _ => v.insert(at, byte),
                }
            }
            v
        }
    }

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

    fn build(yaml: &str) -> (ParseDelimiter, Arc<Metrics>) {
        let c = config(&format!("type: parse_delimiter\n{yaml}")).expect("config");
        let m = Metrics::new();
        let p = ParseDelimiter::new(&c, m.component("p", "processor", "d", "parse_delimiter"))
            .expect("build");
        (p, m)
    }

    /// Parses one line; the fields as (name, text) or the parse error.
    fn parse(yaml: &str, line: &[u8]) -> Result<Vec<(String, String)>, String> {
        let (p, _) = build(yaml);
        let b = process_lines(&p, &[line]);
        let ev = &b.events[0];
        if let Some(Value::Str(e)) = ev.get("parse_error") {
            return Err(e.to_string());
        }
        Ok(ev
            .fields
            .iter()
            .map(|(k, v)| {
                let t = b.bytes_of(v).expect("text");
                (k.to_string(), String::from_utf8_lossy(t).into_owned())
            })
            .collect())
    }

    fn kv(pairs: &[(&str, &str)]) -> Result<Vec<(String, String)>, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    const ABC: &str = "separator: '|'\nkeys: [a, b, c]";

    #[test]
    fn splits_into_spans() {
        let line = b"2025-04-03 10:02:06.561793|info|131172|/root/x.go|165|ZQsC8JI2";
        let (p, _) = build("separator: '|'\nkeys: [time, level, pid, file, line, log]");
        let b = process_lines(&p, &[line]);
        let ev = &b.events[0];
        assert_eq!(ev.fields.len(), 6);
        assert!(ev.fields.iter().all(|(_, v)| matches!(v, Value::Span(_))));
        assert_eq!(b.bytes_of(&ev.fields[5].1), Some(&b"ZQsC8JI2"[..]));
        assert_eq!(
            parse(ABC, b"1||3"),
            kv(&[("a", "1"), ("b", ""), ("c", "3")])
        );
    }

    #[test]
    fn fewer_values_leave_keys_absent() {
        assert_eq!(parse(ABC, b"1|2"), kv(&[("a", "1"), ("b", "2")]));
        assert_eq!(parse(ABC, b"x"), kv(&[("a", "x")]));
        assert_eq!(parse(ABC, b"|"), kv(&[("a", ""), ("b", "")]));
    }

    #[test]
    fn extra_values_by_policy() {
        assert_eq!(
            parse(ABC, b"1|2|3|4|\"5\""),
            kv(&[("a", "1"), ("b", "2"), ("c", "3|4|\"5\"")])
        );
        // One quoted value as the rest is unquoted like any other.
        assert_eq!(
            parse(ABC, b"1|2|\"3|4\""),
            kv(&[("a", "1"), ("b", "2"), ("c", "3|4")])
        );
        assert_eq!(
            parse(ABC, b"1|2|\"3|4"),
            kv(&[("a", "1"), ("b", "2"), ("c", "\"3|4")])
        );
        let drop = "separator: '|'\nkeys: [a, b]\nextra: drop";
        assert_eq!(parse(drop, b"1|2|3|\"4"), kv(&[("a", "1"), ("b", "2")]));
        let err = "separator: '|'\nkeys: [a, b]\nextra: error";
        assert_eq!(
            parse(err, b"1|2|3"),
            Err("parse_delimiter: more values than keys".into())
        );
        assert_eq!(parse(err, b"1|2"), kv(&[("a", "1"), ("b", "2")]));
    }

    #[test]
    fn quotes() {
        assert_eq!(
            parse(ABC, b"\"a|b\"|\"say \"\"hi\"\"\"|\"\""),
            kv(&[("a", "a|b"), ("b", "say \"hi\""), ("c", "")])
        );
        // A quote inside an unquoted value is an ordinary byte.
        assert_eq!(parse(ABC, b"ab\"c|d"), kv(&[("a", "ab\"c"), ("b", "d")]));
        assert_eq!(
            parse(ABC, b"\"unterminated|x|y"),
            Err("parse_delimiter: quoted value without closing quote".into())
        );
        assert_eq!(
            parse(ABC, b"\"ab\"c|x"),
            Err("parse_delimiter: closing quote not followed by a separator".into())
        );
        // Quoting off: quotes are data.
        assert_eq!(
            parse("separator: '|'\nquote: ''\nkeys: [a, b]", b"\"x|y\""),
            kv(&[("a", "\"x"), ("b", "y\"")])
        );
        assert_eq!(
            parse("separator: ','\nquote: \"'\"\nkeys: [a, b]", b"'x,''y''',z"),
            kv(&[("a", "x,'y'"), ("b", "z")])
        );
    }

    #[test]
    fn multi_byte_separator() {
        let yaml = "separator: ' | '\nkeys: [a, b, c]";
        assert_eq!(
            parse(yaml, b"1 | \"2 | x\" | 3|4"),
            kv(&[("a", "1"), ("b", "2 | x"), ("c", "3|4")])
        );
        assert_eq!(parse(yaml, b"1 |2"), kv(&[("a", "1 |2")]));
        let tab = "separator: \"\\t\"\nkeys: [a, b]";
        assert_eq!(parse(tab, b"x\ty"), kv(&[("a", "x"), ("b", "y")]));
    }

    #[test]
    fn failures_follow_on_error() {
        let lines: &[&[u8]] = &[b"", b"\"open|x", b"1|2|3"];
        let (p, m) = build(ABC);
        let b = process_lines(&p, lines);
        assert_eq!(b.events.len(), 3);
        assert_eq!(
            b.events[0].get("parse_error"),
            Some(&Value::Str("parse_delimiter: field is empty".into()))
        );
        assert!(b.events[1].get("parse_error").is_some());
        assert!(b.events[1].get("a").is_none());
        assert!(m.render().contains("error_type=\"parse_failed\"} 2"));

        let (p, m) = build(&format!("{ABC}\non_error: drop"));
        let b = process_lines(&p, lines);
        assert_eq!(b.events.len(), 1);
        assert!(m.render().contains("reason=\"parse_error\"} 2"));

        let (p, _) = build(&format!("{ABC}\non_error: raw"));
        let b = process_lines(&p, lines);
        assert_eq!(
            b.bytes_of(b.events[1].get("raw").expect("raw")),
            Some(&b"\"open|x"[..])
        );
    }

    #[test]
    fn invalid_utf8_and_one_mib_values() {
        assert_eq!(parse(ABC, b"\xff|\"\xfe\"\"\"").map(|v| v.len()), Ok(2));
        let (p, _) = build(ABC);
        let b = process_lines(&p, &[b"\"\xfe\"\"\""]);
        assert_eq!(
            b.events[0].get("a"),
            Some(&Value::Bytes(b"\xfe\"".to_vec().into()))
        );
        let mut big = b"a|".to_vec();
        big.extend(std::iter::repeat_n(b'x', 1 << 20));
        big.extend_from_slice(b"|\"");
        big.extend(std::iter::repeat_n(b'y', 1 << 20));
        big.push(b'"');
        let b = process_lines(&p, &[&big]);
        let ev = &b.events[0];
        assert_eq!(
            b.bytes_of(ev.get("b").expect("b")).map(<[u8]>::len),
            Some(1 << 20)
        );
        assert_eq!(
            b.bytes_of(ev.get("c").expect("c")).map(<[u8]>::len),
            Some(1 << 20)
        );
    }

    #[test]
    fn config_errors_are_positioned() {
        let e = |y: &str| config(&format!("type: parse_delimiter\n{y}")).unwrap_err();
        assert!(e("keys: [a]")[0].contains("missing required key `separator`"));
        assert!(e("separator: '|'")[0].contains("missing required key `keys`"));
        let v = e("separator: ''\nkeys: [a]");
        assert!(
            v[0].starts_with("t.yaml:2:12: `separator` must not be empty"),
            "{v:?}"
        );
        assert!(e("separator: '|'\nkeys: [a, a]")[0].contains("listed twice"));
        assert!(e("separator: '|'\nkeys: []")[0].contains("at least one"));
        assert!(e("separator: '|'\nquote: ab\nkeys: [a]")[0].contains("single byte"));
        assert!(e("separator: '|'\nquote: '|'\nkeys: [a]")[0].contains("part of `separator`"));
        assert!(e("separator: '|'\nkeys: [a]\nextra: more")[0].contains("must be one of"));
    }

    #[test]
    fn find_byte_agrees_with_a_plain_search() {
        let mut rng = Rng(5);
        for len in 0..100 {
            for _ in 0..50 {
                let hay: Vec<u8> = (0..len).map(|_| b"ab|\x80\xff\x00"[rng.below(6)]).collect();
                for b in [b'|', 0x80, 0xff, 0, b'z'] {
                    assert_eq!(
                        find_byte(b, &hay),
                        hay.iter().position(|&c| c == b),
                        "{hay:?} {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn random_inputs_keep_parts_inside_the_field() {
        let mut rng = Rng(3);
        let splitters = [
            Splitter::new(b"|", Some(b'"'), 3, Extra::Last),
            Splitter::new(b"|", Some(b'"'), 2, Extra::Error),
            Splitter::new(b", ", Some(b'\''), 4, Extra::Drop),
            Splitter::new(b"|", None, 1, Extra::Last),
        ];
        let seeds: &[&[u8]] = &[b"a|\"b\"\"c\"|d|e", b"'x, y', z, 'w''', v, u"];
        let mut parts = Vec::new();
        for _ in 0..50_000 {
            let line = rng.mutate(seeds, b"|\", '\xff");
            for s in &splitters {
                parts.clear();
                if s.split(&line, &mut parts).is_ok() {
                    assert!(!parts.is_empty() && parts.len() <= s.keys);
                    for p in &parts {
                        assert!(p.start <= p.end && p.end <= line.len(), "{p:?} {line:?}");
                        let _ = p.value(&line, Some(0), s.quote);
                    }
                }
            }
        }
        let (p, _) = build(ABC);
        for _ in 0..5_000 {
            let line = rng.mutate(seeds, b"|\"");
            process_lines(&p, &[&line]);
        }
    }
}
