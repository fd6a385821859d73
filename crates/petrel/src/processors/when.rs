//! `when:` on any processor: the processor runs only on the events that
//! match; the others pass through unchanged, in their place.
//!
//! ```yaml
//! processors:
//!   - type: parse_json
//!     when: {include: {"k8s.annotations.petrel.dev/parser": "^json$"}}
//! ```
//!
//! It is implemented once, as a wrapper the config loader puts around any
//! processor whose entry has `when:` ([`WhenConfig`]), so plugins know
//! nothing of it. A batch whose events all match (or none) costs one test
//! per event; a mixed batch is processed run by run (each run of
//! consecutive matching events is handed to the processor as the batch's
//! events), so events keep their order whatever the processor drops.
//!
//! The condition language is the one of the `filter` processor and of the
//! sinks' `when:` ([`Condition`]); [`When`] is the one place a further
//! form (`{vrl: '...'}`) would be parsed and evaluated.

use std::sync::Arc;

use petrel_core::config::Node;
use petrel_core::plugin::{KeyDoc, KeyKind, Processor, ProcessorConfig};
use petrel_core::{ComponentMetrics, Event, EventBatch};

use super::condition::Condition;

/// Keys every processor entry accepts besides its plugin's own.
pub const KEYS: &[&str] = &["when"];

/// The documentation of [`KEYS`], listed in every processor's reference.
pub const KEY_DOCS: &[KeyDoc] = &[KeyDoc {
    name: "when",
    kind: KeyKind::Condition,
    default: None,
    doc: r#"`{include: {field: regex}, exclude: {field: regex}}`, the `filter` processor's language, or `{vrl: '<boolean VRL expression>'}` such as `{vrl: '.level == "error"'}` (as a `remap` program sees the event; an error does not match): the processor runs only on the events that match; the others pass through unchanged, in their place. Absent: every event."#,
}];

/// A condition on one event, in one of the forms `when:` accepts.
#[derive(Debug, Clone)]
pub enum When {
    /// `{include: ..., exclude: ...}`: regexes on fields.
    Condition(Condition),
    /// `{vrl: '<boolean expression>'}`.
    #[cfg(feature = "remap")]
    Vrl(super::remap::VrlCondition),
}

impl When {
    /// Reads a condition at `node`; `what` names the key in messages
    /// (`when`, `always_keep`). Problems are reported at the node.
    pub fn parse(node: Node<'_>, what: &str) -> Option<Self> {
        if node.as_map_quiet().is_none() {
            node.error(format!(
                "`{what}` must be a condition like the filter processor's, \
                 e.g. `{what}: {{include: {{level: \"^error$\"}}}}`"
            ));
            return None;
        }
        // The one place the forms are told apart.
        #[cfg(feature = "remap")]
        if let Some(v) = node.as_map_quiet().and_then(|m| m.get("vrl")) {
            node.as_map(&["vrl"])?;
            return super::remap::VrlCondition::parse(v).map(When::Vrl);
        }
        let map = node.as_map(&["include", "exclude"])?;
        Condition::parse(&map, what).map(When::Condition)
    }

    /// True when `ev` of `batch` meets the condition.
    #[inline]
    pub fn matches(&self, batch: &EventBatch, ev: &Event) -> bool {
        match self {
            When::Condition(c) => c.matches(batch, ev),
            #[cfg(feature = "remap")]
            When::Vrl(c) => c.matches(batch, ev),
        }
    }
}

/// A processor's configuration with its `when:`.
#[derive(Debug)]
pub struct WhenConfig {
    /// Which events the processor runs on.
    pub when: When,
    /// The processor's own configuration.
    pub inner: Arc<dyn ProcessorConfig>,
}

impl ProcessorConfig for WhenConfig {
    fn uses_env(&self) -> bool {
        self.inner.uses_env()
    }

    fn type_name(&self) -> &'static str {
        self.inner.type_name()
    }

    fn file_input(&self) -> Option<(&str, &str)> {
        self.inner.file_input()
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Box<dyn Processor>> {
        Ok(Box::new(WhenProcessor {
            when: self.when.clone(),
            inner: self.inner.build(metrics)?,
        }))
    }
}

/// Runs `inner` on the events that match `when`.
pub struct WhenProcessor {
    when: When,
    inner: Box<dyn Processor>,
}

impl Processor for WhenProcessor {
    fn process(&self, batch: &mut EventBatch) {
        let mask: Vec<bool> = batch
            .events
            .iter()
            .map(|ev| self.when.matches(batch, ev))
            .collect();
        let matching = mask.iter().filter(|m| **m).count();
        if matching == 0 {
            return;
        }
        if matching == mask.len() {
            self.inner.process(batch);
            return;
        }
        // Each run of matching events becomes the batch's events while the
        // processor runs, so the batch's buffer, source and origin are the
        // real ones and what the processor keeps of a run is put back where
        // the run was.
        let events = std::mem::take(&mut batch.events);
        let mut out = Vec::with_capacity(events.len());
        let mut run = Vec::new();
        let mut events = events.into_iter().zip(mask).peekable();
        while let Some((ev, matched)) = events.next() {
            if !matched {
                out.push(ev);
                continue;
            }
            run.push(ev);
            while let Some((ev, _)) = events.next_if(|(_, m)| *m) {
                run.push(ev);
            }
            batch.events = std::mem::take(&mut run);
            self.inner.process(batch);
            out.append(&mut batch.events);
            run = std::mem::take(&mut batch.events);
        }
        batch.events = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::fields::test_support::{batch_of, metrics, parse_cfg, with_field};
    use crate::processors::{filter, parse_json};
    use petrel_core::config::{parse_yaml, ConfigErrors};
    use petrel_core::Value;

    fn when(yaml: &str) -> When {
        let file: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&file, yaml).expect("yaml");
        let errs = ConfigErrors::new();
        let w = When::parse(Node::root(&file, &raw, &errs), "when");
        assert!(errs.is_empty(), "{:?}", errs.into_vec());
        w.expect("condition")
    }

    #[cfg(feature = "remap")]
    #[test]
    fn vrl_condition_runs_the_processor_on_matching_events() {
        let p = WhenProcessor {
            when: when(
                "vrl: 'starts_with(string!(.message), \"{\") && %file == \"/var/log/t.log\"'\n",
            ),
            inner: Box::new(
                filter::Filter::new(
                    &parse_cfg(
                        "type: filter\ninclude:\n  message: \"keep\"\n",
                        filter::KEYS,
                        filter::Config::parse,
                    )
                    .expect("config"),
                    metrics(),
                )
                .unwrap(),
            ),
        };
        let mut b = batch_of(&["{drop", "plain", "{keep", "x"]);
        p.process(&mut b);
        assert_eq!(messages(&b), vec!["plain", "{keep", "x"]);
        // Not boolean, or not compiling: configuration errors.
        for bad in ["vrl: '.message'\n", "vrl: '.a = ('\n"] {
            let file: Arc<str> = "t.yaml".into();
            let raw = parse_yaml(&file, bad).expect("yaml");
            let errs = ConfigErrors::new();
            assert!(When::parse(Node::root(&file, &raw, &errs), "when").is_none());
            let errs = errs.into_vec();
            assert!(errs[0].to_string().starts_with("t.yaml:1:"), "{errs:?}");
        }
    }

    fn messages(b: &EventBatch) -> Vec<String> {
        b.events
            .iter()
            .map(|e| String::from_utf8_lossy(b.bytes_of(&e.message).unwrap_or(b"")).into_owned())
            .collect()
    }

    fn json_when(cond: &str) -> WhenProcessor {
        WhenProcessor {
            when: when(cond),
            inner: Box::new(
                parse_json::ParseJson::new(
                    &parse_cfg(
                        "type: parse_json\n",
                        parse_json::KEYS,
                        parse_json::Config::parse,
                    )
                    .expect("config"),
                    metrics(),
                )
                .expect("parse_json"),
            ),
        }
    }

    #[test]
    fn parse_json_on_half_the_events_keeps_the_others_unchanged_and_in_order() {
        let p = json_when("include: {fmt: '^json$'}");
        let lines: Vec<String> = (0..10).map(|i| format!("{{\"n\":{i}}}")).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut b = batch_of(&refs);
        for i in (0..10).step_by(2) {
            with_field(&mut b, i, "fmt", Value::Str("json".into()));
        }
        p.process(&mut b);
        assert_eq!(messages(&b), lines, "order and messages kept");
        for (i, ev) in b.events.iter().enumerate() {
            let n = ev.get("n");
            if i % 2 == 0 {
                assert_eq!(n, Some(&Value::Int(i as i64)), "event {i} parsed");
            } else {
                assert_eq!(n, None, "event {i} untouched");
                assert_eq!(ev.fields.len(), 0, "event {i} untouched");
            }
        }
    }

    #[test]
    fn a_dropping_processor_keeps_the_order_of_what_remains() {
        // filter inside `when`: drops the matching events that fail it.
        let cfg = filter::Config {
            condition: when("include: {message: 'keep'}"),
        };
        let p = WhenProcessor {
            when: when("include: {message: '^m'}"),
            inner: Box::new(filter::Filter::new(&cfg, metrics()).expect("filter")),
        };
        let mut b = batch_of(&["m1 keep", "m2", "x3", "m4", "m5 keep", "x6", "m7", "x8 m"]);
        p.process(&mut b);
        assert_eq!(messages(&b), ["m1 keep", "x3", "m5 keep", "x6", "x8 m"]);
    }

    #[test]
    fn all_or_none_matching() {
        let p = json_when("exclude: {message: 'nothing-has-this'}");
        let mut b = batch_of(&["{\"a\":1}", "{\"a\":2}"]);
        p.process(&mut b);
        assert!(b.events.iter().all(|e| e.get("a").is_some()));
        let p = json_when("include: {missing: '.'}");
        let mut b = batch_of(&["{\"a\":1}", "{\"a\":2}"]);
        p.process(&mut b);
        assert!(b.events.iter().all(|e| e.fields.is_empty()));
    }

    #[test]
    fn config_errors_name_the_key() {
        let file: Arc<str> = "t.yaml".into();
        for (yaml, want) in [
            ("yes", "`when` must be a condition"),
            ("{}", "`when` needs `include` or `exclude`"),
            ("{include: {a: '('}}", "invalid regex"),
            ("{includ: {a: b}}", "includ"),
        ] {
            let raw = parse_yaml(&file, &format!("when: {yaml}\n")).expect("yaml");
            let errs = ConfigErrors::new();
            let node = Node::root(&file, &raw, &errs)
                .as_map_quiet()
                .and_then(|m| m.get("when"))
                .expect("when");
            assert!(When::parse(node, "when").is_none());
            let errs: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
            assert!(errs.iter().any(|e| e.contains(want)), "{yaml}: {errs:?}");
        }
    }
}
