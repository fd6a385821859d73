//! `type: fields` — copies, renames, adds and removes fields.
//!
//! ```yaml
//! processors:
//!   - type: fields
//!     copy:   { message: original }          # from: to
//!     rename: { lvl: level, msg: message }   # from: to
//!     add:
//!       env: production
//!       host: "${HOSTNAME}"
//!       region: "${REGION:-eu-west-1}"
//!     remove: [debug_info, tmp]
//! ```
//!
//! The operations run in this fixed order, each in file order: `copy`,
//! `rename`, `add`, `remove`. So `add` can overwrite a renamed field and
//! `remove` can delete anything the steps before produced.
//!
//! - `copy: {from: to}` sets `to` to the value of `from`; nothing happens
//!   when `from` is missing. An existing `to` is overwritten.
//! - `rename: {from: to}` moves the value; nothing happens when `from` is
//!   missing. An existing `to` is overwritten.
//! - `add: {name: value}` sets a constant string, overwriting an existing
//!   field (`replicas: 3` adds the string `"3"`). `${NAME}` in a value is
//!   replaced by environment
//!   variable `NAME` when the configuration is loaded; the configuration is
//!   rejected when `NAME` is not set, unless written `${NAME:-default}`
//!   (the default is also used when the variable is empty). `$$` is a
//!   literal `$`.
//! - `remove: [name, ...]` deletes fields; missing ones are ignored.
//!
//! `message` (the raw event text) is a field like any other: it can be the
//! source or target of `copy`/`rename` and be set by `add`. Renaming or
//! removing it leaves the event without a message: no `message` key in
//! `ndjson` (never `null`), an empty line from a `text` sink.
//!
//! The source's metadata is fields too: `file`, `host`, `source_address`,
//! `k8s.pod_name`, `k8s.labels.<key>`, ... can be copied, renamed and
//! removed, and a removed one is absent from every sink's output. A group
//! name stands for every entry below it: `remove: [k8s.labels]` removes
//! all the pod's labels, `rename: {k8s: kubernetes}` moves the pod's
//! metadata into one object field `kubernetes`. An `add` or the target of
//! `copy`/`rename` of a metadata name replaces it. The event time set by
//! `parse_timestamp` is not a field and is not affected.

use petrel_core::config::{Map, Node, YamlNode};
use petrel_core::plugin::Processor;
use petrel_core::{ComponentMetrics, Event, EventBatch, Key, SourceInfo, Value};

use super::common::{free_map, intern_name};

/// Keys accepted.
pub const KEYS: &[&str] = &["type", "id", "copy", "rename", "add", "remove"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Copies, renames, adds and removes fields, in that fixed order."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "copy",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"`from: to`: sets `to` to the value of `from` (nothing when `from` is missing); an existing `to` is overwritten."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "rename",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"`from: to`: moves the value (nothing when `from` is missing); an existing `to` is overwritten."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "add",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"`name: value`: sets a constant string, overwriting; `${NAME}` is replaced by the environment variable at load (an error when unset unless written `${NAME:-default}`), `$$` is a literal `$`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "remove",
        kind: petrel_core::plugin::KeyKind::List,
        default: Some(r#"[]"#),
        doc: r#"Fields to delete; missing ones are ignored."#,
    },
];

/// Configuration; every list is in file order.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `from → to` copies.
    pub copy: Vec<(String, String)>,
    /// `from → to` moves.
    pub rename: Vec<(String, String)>,
    /// Constant values, environment variables already expanded.
    pub add: Vec<(String, Value)>,
    /// Fields to delete.
    pub remove: Vec<String>,
}

impl Config {
    /// Reads the four operation maps/lists; at least one is required.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let mut ok = true;
        let mut c = Config::default();
        for (key, dst) in [("copy", &mut c.copy), ("rename", &mut c.rename)] {
            let Some(node) = map.get(key) else { continue };
            let Some(entries) = free_map(node, key) else {
                ok = false;
                continue;
            };
            for (from, to_node) in entries {
                let Some(to) = to_node.as_str() else {
                    ok = false;
                    continue;
                };
                if from.is_empty() || to.is_empty() {
                    to_node.error(format!("`{key}` needs non-empty field names on both sides"));
                    ok = false;
                    continue;
                }
                dst.push((from.to_string(), to.to_string()));
            }
        }
        if let Some(node) = map.get("add") {
            match free_map(node, "add") {
                Some(entries) => {
                    for (name, v) in entries {
                        if name.is_empty() {
                            v.error("`add` has an empty field name");
                            ok = false;
                            continue;
                        }
                        match constant(v) {
                            Some(value) => c.add.push((name.to_string(), value)),
                            None => ok = false,
                        }
                    }
                }
                None => ok = false,
            }
        }
        if let Some(node) = map.get("remove") {
            for (name, n) in node.as_str_list() {
                if name.is_empty() {
                    n.error("`remove` has an empty field name");
                    ok = false;
                    continue;
                }
                c.remove.push(name.to_string());
            }
        }
        if ok && c.copy.is_empty() && c.rename.is_empty() && c.add.is_empty() && c.remove.is_empty()
        {
            map.node().error(
                "`fields` needs at least one of `copy`, `rename`, `add` or `remove`, \
                 e.g. `add: {env: production}`",
            );
            return None;
        }
        ok.then_some(c)
    }
}

/// The value of an `add` entry: always a string, with `${ENV}` expanded.
/// (The YAML loader does not tell quoted from unquoted scalars, so `3` and
/// `"3"` cannot be told apart; strings are the predictable choice.)
fn constant(node: Node<'_>) -> Option<Value> {
    let YamlNode::Scalar(s) = node.raw() else {
        node.error("`add` values must be strings, numbers or booleans, not lists or maps");
        return None;
    };
    // `${VAR}` was expanded when the file was loaded.
    Some(Value::Str(s.as_str().into()))
}

/// The running processor.
pub struct Fields {
    copy: Vec<(&'static str, &'static str)>,
    rename: Vec<(&'static str, &'static str)>,
    add: Vec<(&'static str, Value)>,
    remove: Vec<&'static str>,
}

impl Fields {
    /// Builds it (no counters: the engine counts events in and out).
    pub fn new(c: &Config, _metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let pairs = |v: &[(String, String)]| {
            v.iter()
                .map(|(a, b)| (intern_name(a), intern_name(b)))
                .collect()
        };
        Ok(Self {
            copy: pairs(&c.copy),
            rename: pairs(&c.rename),
            add: c
                .add
                .iter()
                .map(|(k, v)| (intern_name(k), v.clone()))
                .collect(),
            remove: c.remove.iter().map(|k| intern_name(k)).collect(),
        })
    }

    /// The source metadata (`src`) counts as fields of the event: copied,
    /// renamed and removed like its own, a group name (`k8s`) standing
    /// for every entry below it.
    fn apply(&self, src: &SourceInfo, ev: &mut Event) {
        for &(from, to) in &self.copy {
            if let Some(v) = src.value_of(ev, from) {
                src.set(ev, Key::Borrowed(to), v);
            }
        }
        for &(from, to) in &self.rename {
            if from == to {
                continue;
            }
            if let Some(v) = src.take(ev, from) {
                src.set(ev, Key::Borrowed(to), v);
            }
        }
        for (name, v) in &self.add {
            src.set(ev, Key::Borrowed(name), v.clone());
        }
        for &name in &self.remove {
            src.remove(ev, name);
        }
    }
}

impl Processor for Fields {
    fn process(&self, batch: &mut EventBatch) {
        let EventBatch { source, events, .. } = batch;
        for ev in events {
            self.apply(source, ev);
        }
    }
}

/// Helpers for the processor unit tests of this directory.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use bytes::Bytes;
    use petrel_core::config::{parse_yaml, ConfigErrors, Map, Node};
    use petrel_core::{ComponentMetrics, Event, EventBatch, Metrics, SourceInfo, Span, Value};

    /// A batch whose events are `lines` (joined by newlines in one buffer).
    pub(crate) fn batch_of(lines: &[&str]) -> EventBatch {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for l in lines {
            spans.push((buf.len(), l.len()));
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        batch_raw(&buf, &spans)
    }

    /// A batch over raw bytes with events at `spans` (start, len).
    pub(crate) fn batch_raw(buf: &[u8], spans: &[(usize, usize)]) -> EventBatch {
        let mut b = EventBatch::new(
            Bytes::copy_from_slice(buf),
            Arc::new(SourceInfo::file("/var/log/t.log", Default::default())),
        );
        b.events = spans
            .iter()
            .map(|&(s, l)| Event::from_span(Span::new(s, l)))
            .collect();
        b
    }

    /// Sets field `name` of event `i`.
    pub(crate) fn with_field(b: &mut EventBatch, i: usize, name: &'static str, v: Value) {
        b.events[i].set(name.into(), v);
    }

    /// Counters of a processor in a fresh registry.
    pub(crate) fn metrics() -> ComponentMetrics {
        Metrics::new().component("p", "processor", "t", "test")
    }

    /// Runs a plugin's config parser on `yaml`; panics listing the errors.
    pub(crate) fn parse_cfg<C>(
        yaml: &str,
        keys: &'static [&'static str],
        parse: impl for<'a> FnOnce(Map<'a>) -> Option<C>,
    ) -> Option<C> {
        let (c, errs) = run(yaml, keys, parse);
        assert!(errs.is_empty(), "unexpected config errors: {errs:?}");
        c
    }

    /// The errors (as `file:line:col: message`) a plugin's parser reports.
    pub(crate) fn cfg_errors<C>(
        yaml: &str,
        keys: &'static [&'static str],
        parse: impl for<'a> FnOnce(Map<'a>) -> Option<C>,
    ) -> Vec<String> {
        let (c, errs) = run(yaml, keys, parse);
        assert!(c.is_none(), "a config with errors must not parse");
        assert!(!errs.is_empty(), "expected errors");
        errs
    }

    fn run<C>(
        yaml: &str,
        keys: &'static [&'static str],
        parse: impl for<'a> FnOnce(Map<'a>) -> Option<C>,
    ) -> (Option<C>, Vec<String>) {
        let file: Arc<str> = "t.yaml".into();
        let mut raw = parse_yaml(&file, yaml).expect("yaml");
        // As the loader does (crate::config::load_file): variables are
        // expanded once, before any plugin reads the values.
        let env =
            petrel_core::yaml::expand_env_tree(&file, yaml, &mut raw, &|n| std::env::var(n).ok());
        if !env.is_empty() {
            return (None, env.iter().map(|e| e.to_string()).collect());
        }
        let errs = ConfigErrors::new();
        let c = Node::root(&file, &raw, &errs).as_map(keys).and_then(parse);
        (c, errs.into_vec().iter().map(|e| e.to_string()).collect())
    }
}

/// Registration of `type: fields`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "fields",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "fields"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Fields::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::borrow::Cow;

    fn fields(yaml: &str) -> Fields {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        Fields::new(&c, metrics()).unwrap()
    }

    fn text(b: &EventBatch, v: Option<&Value>) -> Option<String> {
        v.and_then(|v| b.bytes_of(v))
            .map(|x| String::from_utf8_lossy(x).into_owned())
    }

    #[test]
    fn order_copy_rename_add_remove() {
        let f = fields(
            "type: fields\ncopy: {message: original, a: a2}\nrename: {lvl: level, a: b}\n\
             add: {b: replaced, env: prod, n: 3, x: 1.5, t: true, z: null}\n\
             remove: [tmp, missing, x]\n",
        );
        let mut b = batch_of(&["hello", ""]);
        with_field(&mut b, 0, "lvl", Value::Str("warn".into()));
        with_field(&mut b, 0, "a", Value::Int(1));
        with_field(&mut b, 0, "tmp", Value::Null);
        f.process(&mut b);
        let ev = &b.events[0];
        assert_eq!(text(&b, ev.get("original")).as_deref(), Some("hello"));
        assert_eq!(ev.get("a2"), Some(&Value::Int(1)));
        assert_eq!(text(&b, ev.get("level")).as_deref(), Some("warn"));
        assert!(ev.get("lvl").is_none() && ev.get("a").is_none() && ev.get("tmp").is_none());
        // add ran after rename: `b` is the constant.
        assert_eq!(text(&b, ev.get("b")).as_deref(), Some("replaced"));
        assert_eq!(ev.get("n"), Some(&Value::Str("3".into())));
        assert_eq!(ev.get("t"), Some(&Value::Str("true".into())));
        assert_eq!(ev.get("z"), Some(&Value::Str("null".into())));
        assert!(ev.get("x").is_none());
        // Keys are borrowed: no per-event allocation for names.
        assert!(ev.fields.iter().all(|(k, _)| matches!(k, Cow::Borrowed(_))));
        // The empty event got copies of what existed only.
        let ev1 = &b.events[1];
        assert_eq!(text(&b, ev1.get("original")).as_deref(), Some(""));
        assert!(ev1.get("level").is_none() && ev1.get("a2").is_none());
    }

    #[test]
    fn message_is_a_field() {
        let f = fields("type: fields\nrename: {message: raw, body: message}\n");
        let mut b = batch_of(&["line one", "line two"]);
        with_field(&mut b, 0, "body", Value::Str("parsed".into()));
        f.process(&mut b);
        assert_eq!(
            text(&b, b.events[0].get("raw")).as_deref(),
            Some("line one")
        );
        assert_eq!(b.events[0].message, Value::Str("parsed".into()));
        // No `body`: the message moved away and stays null.
        assert_eq!(b.events[1].message, Value::Null);
        assert_eq!(
            text(&b, b.events[1].get("raw")).as_deref(),
            Some("line two")
        );

        let f = fields("type: fields\nremove: message\n");
        let mut b = batch_of(&["x"]);
        f.process(&mut b);
        assert_eq!(b.events[0].message, Value::Null);
    }

    #[test]
    fn large_and_binary_values_are_moved_not_copied_into_text() {
        let f = fields("type: fields\ncopy: {message: m2}\n");
        let big = "y".repeat(1 << 20);
        let mut b = batch_raw(
            &[big.as_bytes(), b"\n\xff\xfe\n"].concat(),
            &[(0, 1 << 20), ((1 << 20) + 1, 2)],
        );
        f.process(&mut b);
        // A span stays a span: copying costs no bytes.
        assert!(matches!(b.events[0].get("m2"), Some(Value::Span(s)) if s.len == 1 << 20));
        assert_eq!(
            b.bytes_of(b.events[1].get("m2").unwrap()),
            Some(&b"\xff\xfe"[..])
        );
    }

    #[test]
    fn env_expansion() {
        let env = |n: &str| match n {
            "HOST" => Some("web-1".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(
            petrel_core::config::expand_env("plain", env).unwrap(),
            "plain"
        );
        assert!(matches!(
            petrel_core::config::expand_env("plain", env).unwrap(),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            petrel_core::config::expand_env("h=${HOST}!", env).unwrap(),
            "h=web-1!"
        );
        assert_eq!(
            petrel_core::config::expand_env("${NOPE:-dflt}/${EMPTY:-e}/${EMPTY}", env).unwrap(),
            "dflt/e/"
        );
        assert_eq!(
            petrel_core::config::expand_env("$$HOST $${HOST} $5 end$", env).unwrap(),
            "$HOST ${HOST} $5 end$"
        );
        assert_eq!(
            petrel_core::config::expand_env("${HOST:-}", env).unwrap(),
            "web-1"
        );
        assert!(petrel_core::config::expand_env("${NOPE}", env)
            .unwrap_err()
            .message
            .contains("`NOPE` is not set"));
        assert!(petrel_core::config::expand_env("${HOST", env)
            .unwrap_err()
            .message
            .contains("closing"));
        assert!(petrel_core::config::expand_env("${1X}", env)
            .unwrap_err()
            .message
            .contains("invalid environment variable name"));
        assert!(petrel_core::config::expand_env("${}", env)
            .unwrap_err()
            .message
            .contains("invalid"));
    }

    #[test]
    fn add_env_from_process_environment() {
        // PATH is set in any test environment; the expansion is done once at
        // config time.
        let f = fields(
            "type: fields\nadd: {p: \"${PATH}\", d: \"${PETREL_SURELY_UNSET_VAR:-none}\"}\n",
        );
        let mut b = batch_of(&["x"]);
        f.process(&mut b);
        let p = std::env::var("PATH").unwrap();
        assert_eq!(b.events[0].get("p"), Some(&Value::Str(p.into())));
        assert_eq!(b.events[0].get("d"), Some(&Value::Str("none".into())));
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors("type: fields\n", KEYS, Config::parse);
        assert!(errs[0].contains("needs at least one of"), "{errs:?}");
        let errs = cfg_errors(
            "type: fields\nadd:\n  a: \"${PETREL_SURELY_UNSET_VAR}\"\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs[0].starts_with(
                "t.yaml:3:7: environment variable `PETREL_SURELY_UNSET_VAR` is not set"
            ),
            "{errs:?}"
        );
        let errs = cfg_errors(
            "type: fields\nadd:\n  a: x\n  b: [1]\n  \"\": x\nrename: [a]\ncopy: {a: \"\"}\n",
            KEYS,
            Config::parse,
        );
        let all = errs.join("\n");
        assert!(all.contains("`add` values must be strings"), "{all}");
        assert!(all.contains("`add` has an empty field name"), "{all}");
        assert!(all.contains("`rename` must be a map"), "{all}");
        assert!(all.contains("`copy` needs non-empty field names"), "{all}");
    }
}
