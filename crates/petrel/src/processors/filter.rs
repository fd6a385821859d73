//! `type: filter` — keeps or drops events by regular expressions on fields.
//!
//! ```yaml
//! processors:
//!   - type: filter
//!     include:            # every one must match (AND)
//!       level: "^(error|warn)$"
//!       file: "payment"
//!     exclude:            # none may match
//!       message: "healthcheck|/ping"
//! ```
//!
//! An event is kept when **all** `include` regexes match their fields and
//! **no** `exclude` regex matches its field; at least one of the two maps
//! is required. A missing field matches nothing: it fails `include` and
//! passes `exclude`. Regexes are searched anywhere in the value (write `^`
//! and `$` to anchor them) with the syntax of the Rust `regex` crate; use
//! `(?i)` for case-insensitive matching. They run on the raw bytes of text
//! values, so values that are not valid UTF-8 can still match (`.` does not
//! match an invalid byte). Numbers and booleans (from `parse_json`) match
//! against their JSON text (`200`, `1.5`, `true`); `null`, arrays and
//! objects match nothing. `message` is the raw event text; `file` is the
//! source file's path unless a processor set a `file` field.
//!
//! The condition can instead be a boolean VRL expression (`vrl:
//! '.status >= 500'`, as a `remap` program sees the event): the event is
//! kept when it is `true`, dropped when it is `false` or fails.
//!
//! Dropped events are counted in
//! `petrel_component_discarded_events_total{reason="filtered"}`; they are
//! not errors.

use petrel_core::config::Map;
use petrel_core::plugin::Processor;
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, EventBatch};

use super::condition::Condition;
use super::when::When;

/// Keys accepted.
pub const KEYS: &[&str] = &["type", "id", "include", "exclude", "vrl"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Keeps an event when every `include` regex matches its field and no `exclude` regex does, or when the boolean VRL expression `vrl` is true; dropped events count as discarded with `reason=filtered`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "include",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"Field name to regex (Rust `regex` syntax, searched anywhere, `(?i)` for case-insensitive); every one must match. Fields are the event's, then its source metadata (`file`, `host`, `source_type`, `kafka.topic`, ...). A missing field matches nothing. At least one of `include` and `exclude` is required."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "exclude",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"Field name to regex; none may match."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "vrl",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Instead of `include`/`exclude`: a boolean VRL expression (as a `remap` program sees the event, e.g. `.status >= 500 || %k8s.namespace == "payments"`); the event is kept when it is `true`, dropped when it is `false` or fails."#,
    },
];

/// Configuration: the condition events must meet to be kept.
#[derive(Debug, Clone)]
pub struct Config {
    /// `include`/`exclude` regexes, or a VRL expression.
    pub condition: When,
}

impl Config {
    /// Reads `include` and `exclude`; invalid regexes are reported with the
    /// regex engine's explanation.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        if let Some(v) = map.get("vrl") {
            if map.get("include").is_some() || map.get("exclude").is_some() {
                v.error("give the condition either as `vrl` or as `include`/`exclude`, not both");
                return None;
            }
            #[cfg(feature = "remap")]
            return super::remap::VrlCondition::parse(v).map(|c| Self {
                condition: When::Vrl(c),
            });
            #[cfg(not(feature = "remap"))]
            {
                v.error("`vrl` needs a build with the `remap` feature (the default); use `include`/`exclude`");
                return None;
            }
        }
        Some(Self {
            condition: When::Condition(Condition::parse(&map, "filter")?),
        })
    }
}

/// The running processor.
pub struct Filter {
    condition: When,
    filtered: LazyCounter,
}

impl Filter {
    /// Builds it; `metrics` provides the `filtered` discard counter.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            condition: c.condition.clone(),
            filtered: metrics.discarded_counter("filtered"),
        })
    }
}

impl Processor for Filter {
    fn process(&self, batch: &mut EventBatch) {
        let before = batch.events.len();
        let mut events = std::mem::take(&mut batch.events);
        events.retain(|ev| self.condition.matches(batch, ev));
        batch.events = events;
        let dropped = before - batch.events.len();
        if dropped > 0 {
            self.filtered.inc_by(dropped as u64);
        }
    }
}

/// Registration of `type: filter`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "filter",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "filter"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Filter::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::common::value_text;
    use crate::processors::fields::test_support::{
        batch_of, batch_raw, cfg_errors, metrics, parse_cfg, with_field,
    };
    use petrel_core::Value;

    fn filter(yaml: &str) -> (Filter, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (Filter::new(&c, m.clone()).unwrap(), m)
    }

    #[test]
    fn include_and_exclude() {
        let (f, m) = filter(
            "type: filter\ninclude:\n  message: \"err\"\n  level: \"^(error|warn)$\"\nexclude:\n  message: \"(?i)healthcheck\"\n",
        );
        let mut b = batch_of(&[
            "an error happened",
            "an error in HealthCheck",
            "no problem",
            "error but level missing",
            "error with wrong level",
            "error \u{ff} non-ascii is fine",
        ]);
        with_field(&mut b, 0, "level", Value::Str("error".into()));
        with_field(&mut b, 1, "level", Value::Str("warn".into()));
        with_field(&mut b, 2, "level", Value::Str("error".into()));
        with_field(&mut b, 4, "level", Value::Str("info".into()));
        with_field(&mut b, 5, "level", Value::Str("warn".into()));
        f.process(&mut b);
        let kept: Vec<&[u8]> = b
            .events
            .iter()
            .map(|e| b.bytes_of(&e.message).unwrap())
            .collect();
        assert_eq!(
            kept,
            vec![
                &b"an error happened"[..],
                "error \u{ff} non-ascii is fine".as_bytes()
            ]
        );
        let text = m.metrics().render();
        assert!(text.contains("reason=\"filtered\"} 4"), "{text}");
        assert!(!text.contains("petrel_component_errors_total{"), "{text}");
    }

    #[test]
    fn file_is_the_source_path() {
        let (f, _) = filter("type: filter\ninclude:\n  file: \"/t\\\\.log$\"\n");
        let mut b = batch_of(&["a", "b"]);
        with_field(&mut b, 1, "file", Value::Str("other".into()));
        f.process(&mut b);
        assert_eq!(b.events.len(), 1);
        assert!(b.events[0].get("file").is_none());
    }

    #[test]
    fn exclude_only_missing_field_passes() {
        let (f, _) = filter("type: filter\nexclude:\n  user: \"^bot\"\n");
        let mut b = batch_of(&["a", "b", "c"]);
        with_field(&mut b, 0, "user", Value::Str("bot-7".into()));
        with_field(&mut b, 1, "user", Value::Str("alice".into()));
        f.process(&mut b);
        assert_eq!(b.events.len(), 2);
    }

    #[test]
    fn numbers_booleans_bytes_and_empty() {
        let (f, _) = filter("type: filter\ninclude:\n  status: \"^5\\\\d\\\\d$\"\n");
        let mut b = batch_of(&["a", "b", "c", "d", "e", "f"]);
        with_field(&mut b, 0, "status", Value::Int(503));
        with_field(&mut b, 1, "status", Value::Int(200));
        with_field(&mut b, 2, "status", Value::Str("502".into()));
        with_field(&mut b, 3, "status", Value::Bytes(b"5\xff0".to_vec().into()));
        with_field(&mut b, 4, "status", Value::Str("".into()));
        with_field(&mut b, 5, "status", Value::Null);
        f.process(&mut b);
        assert_eq!(b.events.len(), 2);

        let (f, _) = filter("type: filter\ninclude:\n  ok: \"true\"\n  ratio: \"^0\\\\.5$\"\n");
        let mut b = batch_of(&["a", "b"]);
        with_field(&mut b, 0, "ok", Value::Bool(true));
        with_field(&mut b, 0, "ratio", Value::Float(0.5));
        with_field(&mut b, 1, "ok", Value::Bool(false));
        with_field(&mut b, 1, "ratio", Value::Float(0.5));
        f.process(&mut b);
        assert_eq!(b.events.len(), 1);

        // Invalid UTF-8 bytes in the message: the regex still runs.
        let (f, _) = filter("type: filter\ninclude:\n  message: \"x\"\n");
        let mut b = batch_raw(b"\xffx\xfe\n\xff\xfe\n", &[(0, 3), (4, 2)]);
        f.process(&mut b);
        assert_eq!(b.events.len(), 1);
    }

    #[test]
    fn big_field_and_extremes() {
        let (f, _) = filter("type: filter\ninclude:\n  message: \"needle$\"\n");
        let mut big = "x".repeat(1 << 20);
        big.push_str("needle");
        let mut b = batch_of(&[&big, &"x".repeat(1 << 20), ""]);
        f.process(&mut b);
        assert_eq!(b.events.len(), 1);
        let mut s = [0u8; 32];
        assert_eq!(
            value_text(&Value::Int(i64::MIN), &[], &mut s),
            Some(&b"-9223372036854775808"[..])
        );
        let mut s = [0u8; 32];
        assert!(value_text(&Value::Float(-1.2345678901234567e-300), &[], &mut s).is_some());
        let mut s = [0u8; 32];
        assert_eq!(value_text(&Value::Float(f64::NAN), &[], &mut s), None);
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors("type: filter\n", KEYS, Config::parse);
        assert!(errs[0].contains("needs `include` or `exclude`"), "{errs:?}");
        let errs = cfg_errors(
            "type: filter\ninclude:\n  level: \"(unclosed\"\n  x: [a]\nexclude: nope\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs.iter().any(|e| e.contains(
                "3:10: invalid regex `(unclosed` for field `level` in `include`: \
                 unclosed group (at character 1)"
            )),
            "{errs:?}"
        );
        assert!(errs.iter().all(|e| !e.contains('\n')), "{errs:?}");
        assert!(
            errs.iter()
                .any(|e| e.contains("`include.x` must be a string")),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.contains("`exclude` must be a map")),
            "{errs:?}"
        );
    }
}
