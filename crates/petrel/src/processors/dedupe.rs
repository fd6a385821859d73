//! `type: dedupe` — drops events already seen among the last
//! `cache.num_events` distinct ones.
//!
//! ```yaml
//! processors:
//!   - type: dedupe
//!     fields: {match: [message, host]}   # or {ignore: [timestamp]}
//!     cache: {num_events: 5000}
//! ```
//!
//! An event's identity is a 64-bit hash of the chosen fields: `match`
//! lists them (default `timestamp`, `host`, `message`, as Vector's); a
//! missing field counts as missing, which differs from an empty one.
//! `ignore` takes the message, the event time and every field of the event
//! except those listed (source metadata such as `host` only with `match`).
//! Hashes live in an LRU of `num_events`: a duplicate further back than
//! that passes. Duplicates are dropped and counted in
//! `petrel_component_discarded_events_total{reason="duplicate"}`.

use std::sync::Arc;

use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::plugin::{KeyDoc, KeyKind, Processor};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, Event, EventBatch};

use super::keys::{encode_text, encode_value, hash, Lru};

/// Keys accepted.
pub const KEYS: &[&str] = &["type", "id", "fields", "cache"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Drops an event whose chosen fields hash the same as one of the last `cache.num_events` distinct events; duplicates count as discarded with `reason=duplicate`."#;

/// Default of `cache.num_events` (Vector's).
pub const DEFAULT_NUM_EVENTS: u64 = 5000;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "fields",
        kind: KeyKind::Map,
        default: Some("{match: [timestamp, host, message]}"),
        doc: r#"`{match: [names]}`: events are the same when these fields are (an event field, else source metadata such as `host`; `timestamp` is the event time unless a field has that name; missing differs from empty). Or `{ignore: [names]}`: the message, event time and every event field except these."#,
    },
    KeyDoc {
        name: "cache",
        kind: KeyKind::Map,
        default: Some("{num_events: 5000}"),
        doc: r#"`{num_events}`: hashes remembered (about 48 bytes each), least recently seen evicted first, counted in `petrel_component_cache_evictions_total`."#,
    },
];

/// Which fields make an event's identity.
#[derive(Debug, Clone, PartialEq)]
pub enum Fields {
    /// These fields.
    Match(Vec<String>),
    /// Every field but these.
    Ignore(Vec<String>),
}

/// Configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The identity's fields.
    pub fields: Fields,
    /// Hashes remembered.
    pub num_events: usize,
}

impl Config {
    /// Reads the keys; every problem is reported at its key.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let fields = match map.get("fields") {
            None => Some(Fields::Match(
                ["timestamp", "host", "message"].map(String::from).to_vec(),
            )),
            Some(n) => n.as_map(&["match", "ignore"]).and_then(|m| {
                let names = |key: &str| {
                    m.get(key).map(|n| {
                        n.as_str_list()
                            .into_iter()
                            .map(|(s, _)| s.to_string())
                            .collect::<Vec<_>>()
                    })
                };
                match (names("match"), names("ignore")) {
                    (Some(f), None) if !f.is_empty() => Some(Fields::Match(f)),
                    (None, Some(f)) => Some(Fields::Ignore(f)),
                    _ => {
                        n.error(
                            "`fields` needs exactly one of `match` (a non-empty list) or `ignore`, \
                             e.g. `fields: {match: [message, host]}`",
                        );
                        None
                    }
                }
            }),
        };
        let num_events = match map.get("cache") {
            None => Some(DEFAULT_NUM_EVENTS),
            Some(n) => n.as_map(&["num_events"]).and_then(|m| match m.get("num_events") {
                None => Some(DEFAULT_NUM_EVENTS),
                Some(v) => match v.as_u64(false)? {
                    0 => {
                        v.error("`num_events` must be at least 1, e.g. `cache: {num_events: 5000}`");
                        None
                    }
                    x => Some(x),
                },
            }),
        };
        Some(Self {
            fields: fields?,
            num_events: usize::try_from(num_events?).unwrap_or(usize::MAX),
        })
    }
}

/// The running processor.
pub struct Dedupe {
    fields: Fields,
    seen: Mutex<Lru<()>>,
    duplicates: LazyCounter,
}

impl Dedupe {
    /// Builds it with its counters.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            fields: c.fields.clone(),
            seen: Mutex::new(Lru::new(c.num_events, metrics.cache_evictions())),
            duplicates: metrics.discarded_counter("duplicate"),
        })
    }

    /// The identity of `ev`, encoded into `out` (cleared first).
    fn identity(&self, batch: &EventBatch, ev: &Event, out: &mut Vec<u8>) {
        out.clear();
        match &self.fields {
            Fields::Match(names) => {
                for name in names {
                    match ev.get(name) {
                        Some(v) => encode_value(out, v, &batch.buf),
                        None => match (name.as_str(), ev.time_ns) {
                            ("timestamp", Some(t)) => {
                                out.push(b'T');
                                out.extend_from_slice(&t.to_le_bytes());
                            }
                            _ => match batch.meta_field(ev, name) {
                                Some(b) => {
                                    out.push(b's');
                                    encode_text(out, b);
                                }
                                None => out.push(b'-'),
                            },
                        },
                    }
                }
            }
            Fields::Ignore(ignored) => {
                let skip = |n: &str| ignored.iter().any(|i| i == n);
                if !skip("message") {
                    encode_value(out, &ev.message, &batch.buf);
                }
                if let (false, Some(t)) = (skip("timestamp"), ev.time_ns) {
                    out.push(b'T');
                    out.extend_from_slice(&t.to_le_bytes());
                }
                // Sorted by name: the same fields in another order are the
                // same event.
                let mut fields: Vec<_> = ev.fields.iter().filter(|(k, _)| !skip(k)).collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                for (k, v) in fields {
                    encode_text(out, k.as_bytes());
                    encode_value(out, v, &batch.buf);
                }
            }
        }
    }
}

impl Processor for Dedupe {
    fn process(&self, batch: &mut EventBatch) {
        let mut events = std::mem::take(&mut batch.events);
        let before = events.len();
        let mut scratch = Vec::new();
        let hashes: Vec<u64> = events
            .iter()
            .map(|ev| {
                self.identity(batch, ev, &mut scratch);
                hash(&scratch)
            })
            .collect();
        let mut seen = self.seen.lock();
        let mut i = 0;
        events.retain(|_| {
            let (_, existed) = seen.entry(hashes[i], || ());
            i += 1;
            !existed
        });
        drop(seen);
        let dropped = before - events.len();
        batch.events = events;
        if dropped > 0 {
            self.duplicates.inc_by(dropped as u64);
        }
    }
}

/// Registration of `type: dedupe`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "dedupe",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "dedupe"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Dedupe::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::fields::test_support::{
        batch_of, cfg_errors, metrics, parse_cfg, with_field,
    };
    use petrel_core::Value;

    fn dedupe(yaml: &str) -> (Dedupe, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (Dedupe::new(&c, m.clone()).expect("build"), m)
    }

    fn messages(b: &EventBatch) -> Vec<String> {
        b.events
            .iter()
            .map(|e| String::from_utf8_lossy(b.bytes_of(&e.message).unwrap_or(b"")).into_owned())
            .collect()
    }

    #[test]
    fn default_fields_drop_exact_repeats_across_batches() {
        let (d, m) = dedupe("type: dedupe\n");
        let mut b = batch_of(&["a", "b", "a", "c", "b", "a"]);
        d.process(&mut b);
        assert_eq!(messages(&b), ["a", "b", "c"]);
        let mut b = batch_of(&["c", "d"]);
        d.process(&mut b);
        assert_eq!(messages(&b), ["d"]);
        assert_eq!(m.discarded_count("duplicate"), 4);
    }

    #[test]
    fn match_and_ignore() {
        let (d, _) = dedupe("type: dedupe\nfields: {match: [user]}\n");
        let mut b = batch_of(&["1", "2", "3", "4", "5"]);
        with_field(&mut b, 0, "user", Value::Str("x".into()));
        with_field(&mut b, 1, "user", Value::Str("x".into()));
        with_field(&mut b, 2, "user", Value::Str("".into()));
        with_field(&mut b, 3, "user", Value::Int(7));
        // 4 has no user: missing differs from empty.
        d.process(&mut b);
        assert_eq!(messages(&b), ["1", "3", "4", "5"]);

        let (d, _) = dedupe("type: dedupe\nfields: {ignore: [seq]}\n");
        let mut b = batch_of(&["same", "same", "same", "other"]);
        with_field(&mut b, 0, "seq", Value::Int(1));
        with_field(&mut b, 0, "a", Value::Int(1));
        with_field(&mut b, 1, "a", Value::Int(1));
        with_field(&mut b, 1, "seq", Value::Int(2));
        with_field(&mut b, 2, "a", Value::Int(2));
        d.process(&mut b);
        assert_eq!(messages(&b), ["same", "same", "other"]);
        assert_eq!(b.events[1].get("a"), Some(&Value::Int(2)));
    }

    #[test]
    fn the_cache_is_bounded() {
        let (d, m) = dedupe("type: dedupe\nfields: {match: [message]}\ncache: {num_events: 3}\n");
        let mut b = batch_of(&["1", "2", "3", "4", "1", "4"]);
        d.process(&mut b);
        // "1" was evicted by "4", so it passes again; "4" is remembered.
        assert_eq!(messages(&b), ["1", "2", "3", "4", "1"]);
        assert_eq!(d.seen.lock().len(), 3);
        assert_eq!(m.cache_evictions().get(), 2);
        assert_eq!(m.discarded_count("duplicate"), 1);
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors(
            "type: dedupe\nfields: {match: [a], ignore: [b]}\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].contains("exactly one of `match`"), "{errs:?}");
        let errs = cfg_errors(
            "type: dedupe\ncache: {num_events: 0}\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs[0].contains("`num_events` must be at least 1"),
            "{errs:?}"
        );
    }
}
