//! `type: sample` — keeps 1 event in `rate`.
//!
//! ```yaml
//! processors:
//!   - type: sample
//!     rate: 10                 # keep 1 in 10
//!     key_field: trace_id      # a trace is kept or dropped whole
//!     always_keep: {include: {level: "^(error|warn)$"}}
//! ```
//!
//! With `key_field`, an event is kept when the hash of that field's value
//! is a multiple of `rate`: the decision depends only on the value, so all
//! the events of one trace (on every agent, across restarts) are kept or
//! dropped together, and about 1 in `rate` of the values is kept. Without
//! it, or for an event that lacks the field, a counter keeps the first of
//! every `rate` events, exactly as Vector's `sample` does. Events matching
//! `always_keep` are always kept and do not advance the counter. Dropped
//! events are counted in
//! `petrel_component_discarded_events_total{reason="sampled"}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{KeyDoc, KeyKind, Processor};
use petrel_core::{ComponentMetrics, EventBatch, Key, LazyCounter, Value};

use super::common::config_key;
use super::keys::{field_text, hash};
use super::throttle::positive;
use super::when::When;

/// Keys accepted.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "rate",
    "key_field",
    "always_keep",
    "sample_rate_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Keeps 1 event in `rate`: by a hash of `key_field` when the event has it (a trace's events are kept or dropped together), else by a counter (the first of every `rate`). Events matching `always_keep` are kept; dropped events count as discarded with `reason=sampled`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "rate",
        kind: KeyKind::Int,
        default: None,
        doc: r#"Required: keep 1 event in this many (`1` keeps every event)."#,
    },
    KeyDoc {
        name: "key_field",
        kind: KeyKind::String,
        default: None,
        doc: r#"A field (or source metadata such as `host`) whose value decides: kept when its XXH3 hash is a multiple of `rate`, the same on every agent and after restarts. Events without it are sampled by the counter."#,
    },
    KeyDoc {
        name: "always_keep",
        kind: KeyKind::Condition,
        default: None,
        doc: r#"`{include: ..., exclude: ...}` as `when:`: matching events are never sampled out."#,
    },
    KeyDoc {
        name: "sample_rate_key",
        kind: KeyKind::String,
        default: None,
        doc: r#"A field set to `rate` on each sampled event kept (not on `always_keep` ones), so that counts can be scaled back. Absent: no field."#,
    },
];

/// Configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Keep 1 in this many.
    pub rate: u64,
    /// The field hashed, if any.
    pub key_field: Option<String>,
    /// Events never dropped.
    pub always_keep: Option<When>,
    /// The field that records the rate.
    pub sample_rate_key: Option<String>,
}

impl Config {
    /// Reads the keys; every problem is reported at its key.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let rate = positive(&map, "rate", "10");
        let key_field = map.str("key_field").map(str::to_string);
        let always_keep = match map.get("always_keep") {
            Some(n) => Some(When::parse(n, "always_keep")?),
            None => None,
        };
        let sample_rate_key = map.str("sample_rate_key").map(str::to_string);
        Some(Self {
            rate: rate?,
            key_field,
            always_keep,
            sample_rate_key,
        })
    }
}

/// The running processor.
pub struct Sample {
    rate: u64,
    key_field: Option<&'static str>,
    always_keep: Option<When>,
    sample_rate: Option<(Key, Value)>,
    counter: AtomicU64,
    sampled: LazyCounter,
}

impl Sample {
    /// Builds it with its counters.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            rate: c.rate,
            key_field: c.key_field.as_deref().map(super::common::static_name),
            always_keep: c.always_keep.clone(),
            sample_rate: c.sample_rate_key.as_deref().map(|k| {
                (
                    config_key(k),
                    Value::Int(i64::try_from(c.rate).unwrap_or(i64::MAX)),
                )
            }),
            counter: AtomicU64::new(0),
            sampled: metrics.discarded_counter("sampled"),
        })
    }
}

/// How an event's fate is decided.
#[derive(Clone, Copy, PartialEq)]
enum Decision {
    /// It matches `always_keep`.
    Always,
    /// By the hash of its key: kept or not.
    Key(bool),
    /// By the counter.
    Counter,
}

impl Processor for Sample {
    fn process(&self, batch: &mut EventBatch) {
        let mut events = std::mem::take(&mut batch.events);
        let before = events.len();
        let decisions: Vec<Decision> = events
            .iter()
            .map(|ev| {
                if self
                    .always_keep
                    .as_ref()
                    .is_some_and(|w| w.matches(batch, ev))
                {
                    return Decision::Always;
                }
                let Some(field) = self.key_field else {
                    return Decision::Counter;
                };
                let mut scratch = [0u8; 32];
                match field_text(batch, ev, field, &mut scratch) {
                    Some(text) => Decision::Key(hash(text) % self.rate == 0),
                    None => Decision::Counter,
                }
            })
            .collect();
        // The counter moves once per batch; batches processed at once on
        // several threads each take their own range of it.
        let counted = decisions
            .iter()
            .filter(|d| **d == Decision::Counter)
            .count() as u64;
        let mut n = self.counter.fetch_add(counted, Ordering::Relaxed);
        let mut decisions = decisions.into_iter();
        events.retain_mut(|ev| {
            let kept = match decisions.next() {
                Some(Decision::Always) | None => return true,
                Some(Decision::Key(k)) => k,
                Some(Decision::Counter) => {
                    let k = n % self.rate == 0;
                    n = n.wrapping_add(1);
                    k
                }
            };
            if kept {
                if let Some((k, v)) = &self.sample_rate {
                    ev.set(k.clone(), v.clone());
                }
            }
            kept
        });
        let dropped = before - events.len();
        batch.events = events;
        if dropped > 0 {
            self.sampled.inc_by(dropped as u64);
        }
    }
}

/// Registration of `type: sample`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "sample",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "sample"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Sample::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::fields::test_support::{
        batch_of, cfg_errors, metrics, parse_cfg, with_field,
    };

    fn sample(yaml: &str) -> (Sample, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (Sample::new(&c, m.clone()).expect("build"), m)
    }

    fn lines(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("line {i}")).collect()
    }

    #[test]
    fn counter_keeps_the_first_of_every_rate_across_batches() {
        let (s, m) = sample("type: sample\nrate: 4\nsample_rate_key: sample_rate\n");
        let l = lines(10);
        let refs: Vec<&str> = l.iter().map(String::as_str).collect();
        let mut b = batch_of(&refs);
        s.process(&mut b);
        let kept: Vec<&[u8]> = b
            .events
            .iter()
            .filter_map(|e| b.bytes_of(&e.message))
            .collect();
        assert_eq!(kept, [&b"line 0"[..], b"line 4", b"line 8"]);
        assert!(b
            .events
            .iter()
            .all(|e| e.get("sample_rate") == Some(&Value::Int(4))));
        // The counter continues: 10, 11 dropped, 12 kept.
        let mut b = batch_of(&refs[..3]);
        s.process(&mut b);
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.bytes_of(&b.events[0].message), Some(&b"line 2"[..]));
        assert_eq!(m.discarded_count("sampled"), 9);
    }

    #[test]
    fn by_key_is_deterministic_and_keeps_a_key_whole() {
        let run = || {
            let (s, m) = sample("type: sample\nrate: 10\nkey_field: trace_id\n");
            let l = lines(3000);
            let refs: Vec<&str> = l.iter().map(String::as_str).collect();
            let mut b = batch_of(&refs);
            for i in 0..3000 {
                // 300 traces of 10 events each, interleaved.
                b.events[i].set(
                    "trace_id".into(),
                    Value::Str(format!("t{}", i % 300).into()),
                );
            }
            s.process(&mut b);
            let kept: Vec<String> = b
                .events
                .iter()
                .map(|e| {
                    String::from_utf8_lossy(b.bytes_of(&e.message).unwrap_or(b"")).into_owned()
                })
                .collect();
            let traces: std::collections::BTreeSet<String> = b
                .events
                .iter()
                .filter_map(|e| match e.get("trace_id") {
                    Some(Value::Str(t)) => Some(t.to_string()),
                    _ => None,
                })
                .collect();
            (kept, traces, m.discarded_count("sampled"))
        };
        let (kept, traces, dropped) = run();
        assert_eq!(
            run(),
            (kept.clone(), traces.clone(), dropped),
            "deterministic"
        );
        // Each kept trace is kept whole: 10 events per trace.
        assert_eq!(kept.len(), traces.len() * 10);
        assert_eq!(dropped as usize, 3000 - kept.len());
        // About 1 in 10 of 300 traces (binomial: 30 +- 3 sigma ~ 16).
        assert!((10..=50).contains(&traces.len()), "{} traces", traces.len());
        // The same decision as the hash says, for a known value.
        let keep_t0 = hash(b"t0") % 10 == 0;
        assert_eq!(traces.contains("t0"), keep_t0);
    }

    #[test]
    fn always_keep_and_events_without_the_key() {
        let (s, m) = sample(
            "type: sample\nrate: 1000000\nkey_field: trace_id\nalways_keep: {include: {level: '^error$'}}\n",
        );
        let l = lines(6);
        let refs: Vec<&str> = l.iter().map(String::as_str).collect();
        let mut b = batch_of(&refs);
        with_field(&mut b, 1, "level", Value::Str("error".into()));
        with_field(&mut b, 2, "level", Value::Str("info".into()));
        with_field(&mut b, 4, "level", Value::Str("error".into()));
        // No trace_id: the counter decides; only its first event passes.
        s.process(&mut b);
        let kept: Vec<&[u8]> = b
            .events
            .iter()
            .filter_map(|e| b.bytes_of(&e.message))
            .collect();
        assert_eq!(kept, [&b"line 0"[..], b"line 1", b"line 4"]);
        assert_eq!(m.discarded_count("sampled"), 3);
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors("type: sample\n", KEYS, Config::parse);
        assert!(errs[0].contains("rate"), "{errs:?}");
        let errs = cfg_errors(
            "type: sample\nrate: 0\nalways_keep: {include: {a: '('}}\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs.iter().any(|e| e.contains("`rate` must be at least 1")),
            "{errs:?}"
        );
        assert!(errs.iter().any(|e| e.contains("invalid regex")), "{errs:?}");
    }
}
