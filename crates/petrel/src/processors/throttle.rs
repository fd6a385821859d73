//! `type: throttle` — at most `threshold` events (or bytes) per key per
//! window; the excess is dropped, counted.
//!
//! ```yaml
//! processors:
//!   - type: throttle
//!     key_field: "{{ k8s.namespace }}/{{ k8s.pod }}"   # one budget per pod
//!     threshold: 1000
//!     window_secs: 1
//! ```
//!
//! Each key has a fixed window: it starts with the key's first event and
//! lets `threshold` events (with `unit: bytes`, bytes of the message) pass
//! until `window_secs` have gone by, when a new window starts. Events over
//! the budget are dropped and counted in
//! `petrel_component_discarded_events_total{reason="throttled"}`.
//!
//! Keys are kept as 64-bit hashes of the rendered `key_field` in an LRU
//! of at most `max_keys`: memory stays bounded whatever the number of
//! keys. A key evicted to make room (counted in
//! `petrel_component_cache_evictions_total`) starts a fresh window when it
//! comes back, so with more active keys than `max_keys` a key may pass
//! more than its threshold — never fewer events than the threshold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::plugin::{KeyDoc, KeyKind, Processor};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, EventBatch};

use super::keys::{hash, Lru};
use crate::sinks::template::Template;

/// Keys accepted.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "threshold",
    "window_secs",
    "key_field",
    "unit",
    "max_keys",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Lets at most `threshold` events (or bytes) per key through in each window of `window_secs`; the excess is dropped and counted as discarded with `reason=throttled`. Keys live in an LRU of at most `max_keys` hashes, so memory is bounded whatever their number."#;

/// Default of `max_keys`.
pub const DEFAULT_MAX_KEYS: u64 = 100_000;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "threshold",
        kind: KeyKind::Int,
        default: None,
        doc: r#"Required: events (or bytes with `unit: bytes`) each key may pass per window, at least 1."#,
    },
    KeyDoc {
        name: "window_secs",
        kind: KeyKind::Duration,
        default: None,
        doc: r#"Required: the window in seconds (fractions allowed, e.g. `0.5`). A key's window starts with its first event and a new one starts once this time has passed."#,
    },
    KeyDoc {
        name: "key_field",
        kind: KeyKind::Template,
        default: None,
        doc: r#"A template such as `"{{ k8s.namespace }}/{{ k8s.pod }}"` over the event's fields and its source metadata (`host`, `file`, ...); each distinct value has its own budget, a missing field renders empty. Absent: one budget for the whole processor."#,
    },
    KeyDoc {
        name: "unit",
        kind: KeyKind::OneOf(&["events", "bytes"]),
        default: Some("events"),
        doc: r#"What `threshold` counts: events, or bytes of the message (an event larger than `threshold` never passes)."#,
    },
    KeyDoc {
        name: "max_keys",
        kind: KeyKind::Int,
        default: Some("100000"),
        doc: r#"Keys remembered at most (about 64 bytes each), least recently seen evicted first, counted in `petrel_component_cache_evictions_total`; an evicted key starts a fresh window when it comes back."#,
    },
];

/// What `threshold` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Events.
    Events,
    /// Bytes of the message.
    Bytes,
}

/// Configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Budget per key per window.
    pub threshold: u64,
    /// Window length.
    pub window: Duration,
    /// The key; `None`: one key.
    pub key: Option<Template>,
    /// What the threshold counts.
    pub unit: Unit,
    /// Keys remembered at most.
    pub max_keys: usize,
}

/// Reads `window_secs`-like keys: a positive number of seconds.
pub(crate) fn seconds(map: &Map<'_>, key: &str) -> Option<Option<Duration>> {
    let Some(n) = map.get(key) else {
        return Some(None);
    };
    let text = n.as_str()?;
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Some(Some(Duration::from_secs_f64(s))),
        _ => {
            n.error(format!(
                "`{key}` must be a positive number of seconds, e.g. `1` or `0.5`, found `{text}`"
            ));
            None
        }
    }
}

/// Reads a required integer of at least 1.
pub(crate) fn positive(map: &Map<'_>, key: &str, example: &str) -> Option<u64> {
    let n = map.required(key, example)?;
    let v = n.as_u64(false)?;
    if v == 0 {
        n.error(format!(
            "`{key}` must be at least 1, e.g. `{key}: {example}`"
        ));
        return None;
    }
    Some(v)
}

impl Config {
    /// Reads the keys; every problem is reported at its key.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let threshold = positive(&map, "threshold", "1000");
        let window = match map.required("window_secs", "1") {
            Some(_) => seconds(&map, "window_secs").flatten(),
            None => None,
        };
        let key = match map.get("key_field") {
            Some(n) => Some(Template::parse(n.as_str()?, n)?),
            None => None,
        };
        let unit = match map.choice("unit", &["events", "bytes"]) {
            None if map.get("unit").is_some() => return None,
            Some("bytes") => Unit::Bytes,
            _ => Unit::Events,
        };
        let max_keys = match map.get("max_keys") {
            Some(n) => match n.as_u64(false)? {
                0 => {
                    n.error("`max_keys` must be at least 1, e.g. `max_keys: 100000`");
                    return None;
                }
                v => v,
            },
            None => DEFAULT_MAX_KEYS,
        };
        Some(Self {
            threshold: threshold?,
            window: window?,
            key,
            unit,
            max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX),
        })
    }
}

/// A key's window.
struct Window {
    /// When it started, in nanoseconds since the processor was built.
    start_ns: u64,
    /// Events or bytes passed in it.
    used: u64,
}

/// The running processor.
pub struct Throttle {
    threshold: u64,
    window_ns: u64,
    key: Option<Template>,
    unit: Unit,
    epoch: Instant,
    windows: Mutex<Lru<Window>>,
    throttled: LazyCounter,
}

impl Throttle {
    /// Builds it with its counters.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            threshold: c.threshold,
            window_ns: u64::try_from(c.window.as_nanos()).unwrap_or(u64::MAX),
            key: c.key.clone(),
            unit: c.unit,
            epoch: Instant::now(),
            windows: Mutex::new(Lru::new(c.max_keys, metrics.cache_evictions())),
            throttled: metrics.discarded_counter("throttled"),
        })
    }

    /// Processes `batch` as if at `now` (tests step time with it).
    pub fn process_at(&self, batch: &mut EventBatch, now: Instant) {
        let now_ns =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let mut events = std::mem::take(&mut batch.events);
        let mut text = String::new();
        let mut windows = self.windows.lock();
        let before = events.len();
        events.retain(|ev| {
            let key = match &self.key {
                Some(t) => {
                    // A missing field renders empty: its events share a key.
                    t.render(ev, batch, &mut text);
                    hash(text.as_bytes())
                }
                None => 0,
            };
            let cost = match self.unit {
                Unit::Events => 1,
                Unit::Bytes => batch.bytes_of(&ev.message).map_or(0, |b| b.len() as u64),
            };
            let (w, _) = windows.entry(key, || Window {
                start_ns: now_ns,
                used: 0,
            });
            if now_ns.saturating_sub(w.start_ns) >= self.window_ns {
                w.start_ns = now_ns;
                w.used = 0;
            }
            if w.used.saturating_add(cost) <= self.threshold {
                w.used += cost;
                true
            } else {
                false
            }
        });
        drop(windows);
        let dropped = before - events.len();
        batch.events = events;
        if dropped > 0 {
            self.throttled.inc_by(dropped as u64);
        }
    }
}

impl Processor for Throttle {
    fn process(&self, batch: &mut EventBatch) {
        self.process_at(batch, Instant::now());
    }
}

/// Registration of `type: throttle`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "throttle",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "throttle"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Throttle::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::fields::test_support::{
        batch_of, cfg_errors, metrics, parse_cfg, with_field,
    };
    use petrel_core::Value;

    fn throttle(yaml: &str) -> (Throttle, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (Throttle::new(&c, m.clone()).expect("build"), m)
    }

    fn keyed(keys: &[&'static str]) -> EventBatch {
        let lines: Vec<String> = (0..keys.len()).map(|i| format!("line {i}")).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut b = batch_of(&refs);
        for (i, k) in keys.iter().enumerate() {
            with_field(&mut b, i, "user", Value::Str((*k).into()));
        }
        b
    }

    #[test]
    fn threshold_per_key_per_window_exactly() {
        let (t, m) = throttle(
            "type: throttle\nthreshold: 2\nwindow_secs: 10\nkey_field: \"u-{{ user }}\"\n",
        );
        let t0 = t.epoch;
        let mut b = keyed(&["a", "a", "b", "a", "b", "b", "c", "a"]);
        t.process_at(&mut b, t0);
        let kept: Vec<&Value> = b.events.iter().filter_map(|e| e.get("user")).collect();
        let s = |x: &str| Value::Str(x.into());
        assert_eq!(kept, [&s("a"), &s("a"), &s("b"), &s("b"), &s("c")]);
        assert_eq!(m.discarded_count("throttled"), 3);

        // Same window: a is spent, c has one left.
        let mut b = keyed(&["a", "c", "c"]);
        t.process_at(&mut b, t0 + Duration::from_secs(9));
        assert_eq!(b.events.len(), 1);
        assert_eq!(m.discarded_count("throttled"), 5);

        // The next window: a passes twice again.
        let mut b = keyed(&["a", "a", "a"]);
        t.process_at(&mut b, t0 + Duration::from_secs(10));
        assert_eq!(b.events.len(), 2);
        assert_eq!(m.discarded_count("throttled"), 6);
    }

    #[test]
    fn without_key_one_budget_and_bytes_unit() {
        let (t, m) = throttle("type: throttle\nthreshold: 10\nwindow_secs: 0.5\nunit: bytes\n");
        let mut b = batch_of(&["12345", "1234", "1", "1", "123456789012"]);
        t.process_at(&mut b, t.epoch);
        // 5 + 4 + 1 = 10; the next 1 and the 12-byte line are over.
        assert_eq!(b.events.len(), 3);
        assert_eq!(m.discarded_count("throttled"), 2);
    }

    #[test]
    fn keys_are_bounded_by_max_keys_and_evictions_counted() {
        let (t, m) =
            throttle("type: throttle\nthreshold: 1\nwindow_secs: 60\nkey_field: \"{{ user }}\"\nmax_keys: 100\n");
        let names: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
        let lines: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut b = batch_of(&lines);
        for (i, n) in names.iter().enumerate() {
            b.events[i].set("user".into(), Value::Str(n.as_str().into()));
        }
        t.process_at(&mut b, t.epoch);
        assert_eq!(b.events.len(), 1000, "every key's first event passes");
        assert_eq!(t.windows.lock().len(), 100);
        assert_eq!(m.cache_evictions().get(), 900);
        let text = m.metrics().render();
        assert!(
            text.contains("petrel_component_cache_evictions_total{") && text.contains("} 900"),
            "{text}"
        );
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors("type: throttle\n", KEYS, Config::parse);
        assert!(errs.iter().any(|e| e.contains("threshold")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("window_secs")), "{errs:?}");
        let errs = cfg_errors(
            "type: throttle\nthreshold: 0\nwindow_secs: -1\nunit: lines\nkey_field: \"{{ a\"\n",
            KEYS,
            Config::parse,
        );
        for want in [
            "`threshold` must be at least 1",
            "`window_secs` must be a positive number of seconds",
            "unclosed `{{`",
        ] {
            assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:?}");
        }
    }
}
