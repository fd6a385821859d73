//! Reading configuration with positions, so that every problem can be
//! reported as `FILE:LINE:COL: what is wrong and how to fix it`.
//!
//! Plugins describe their keys through [`Map`]; unknown keys, wrong types
//! and missing keys are collected in [`ConfigErrors`] rather than stopping
//! at the first one.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};

pub use marked_yaml::Node as YamlNode;

/// False while `petrel validate --offline` checks a configuration away
/// from its host: plugins then skip what needs the host itself (that TLS
/// certificates and program files exist, what a path is), and check only
/// the configuration.
static HOST_CHECKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the host checks of the plugins off (`validate --offline`) or on.
pub fn set_host_checks(on: bool) {
    HOST_CHECKS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// True unless `petrel validate --offline` turned the host checks off: a
/// plugin's parse function asks before it reads a file named by the
/// configuration.
pub fn host_checks() -> bool {
    HOST_CHECKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One configuration problem with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the problem is in.
    pub file: Arc<str>,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.col, self.message
        )
    }
}

/// Collects problems while a configuration is read, and owns the dotted
/// paths of the nodes visited (they live exactly as long as the read).
#[derive(Default)]
pub struct ConfigErrors {
    list: RefCell<Vec<ConfigError>>,
    warnings: RefCell<Vec<ConfigError>>,
    paths: typed_arena::Arena<String>,
}

impl std::fmt::Debug for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigErrors")
            .field("list", &self.list)
            .finish()
    }
}

impl ConfigErrors {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a problem.
    pub fn push(&self, e: ConfigError) {
        self.list.borrow_mut().push(e);
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.list.borrow().is_empty()
    }

    /// Records something that loads but should change (a deprecated
    /// key): `validate` prints it, `run` logs it.
    pub fn warn(&self, w: ConfigError) {
        self.warnings.borrow_mut().push(w);
    }

    /// Takes the warnings recorded so far, in order of position.
    pub fn take_warnings(&self) -> Vec<ConfigError> {
        let mut v = std::mem::take(&mut *self.warnings.borrow_mut());
        v.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
        v.dedup();
        v
    }

    /// How many problems were recorded so far (a reader that reports
    /// several problems compares it before and after).
    pub fn len(&self) -> usize {
        self.list.borrow().len()
    }

    /// The recorded problems, in order of position.
    pub fn into_vec(self) -> Vec<ConfigError> {
        let mut v = self.list.into_inner();
        v.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
        v.dedup();
        v
    }
}

/// Parses YAML text into a positioned tree; a syntax error becomes a
/// [`ConfigError`]. Anchors, aliases and merge keys (`<<: *base`) are
/// resolved here, every node keeping the position it was written at
/// (see [`crate::yaml`]).
pub fn parse_yaml(file: &Arc<str>, text: &str) -> Result<YamlNode, ConfigError> {
    crate::yaml::load(file, text)
}

/// A positioned configuration value.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    file: &'a Arc<str>,
    raw: &'a YamlNode,
    /// Dotted path used in messages, e.g. `sinks[0].path`.
    path: &'a str,
    errs: &'a ConfigErrors,
}

impl<'a> Node<'a> {
    /// Wraps the root of a parsed file.
    pub fn root(file: &'a Arc<str>, raw: &'a YamlNode, errs: &'a ConfigErrors) -> Self {
        Self {
            file,
            raw,
            path: "",
            errs,
        }
    }

    /// The underlying YAML.
    pub fn raw(&self) -> &'a YamlNode {
        self.raw
    }

    /// The collector problems go to.
    pub fn errors(&self) -> &'a ConfigErrors {
        self.errs
    }

    /// The file this node is in.
    pub fn file(&self) -> &'a Arc<str> {
        self.file
    }

    /// (line, column) where this node starts.
    pub fn position(&self) -> (usize, usize) {
        // A mapping's own span may start at its first value; its first key
        // is where a reader looks for it.
        if let YamlNode::Mapping(m) = self.raw {
            if let Some((k, _)) = m.iter().next() {
                return marker_pos(k.span().start());
            }
        }
        marker_pos(self.raw.span().start())
    }

    /// Records a warning at this node (see [`ConfigErrors::warn`]).
    pub fn warn(&self, message: impl Into<String>) {
        let (line, col) = self.position();
        self.errs.warn(ConfigError {
            file: self.file.clone(),
            line,
            col,
            message: message.into(),
        });
    }

    /// Records a problem at this node.
    pub fn error(&self, message: impl Into<String>) {
        let (line, col) = self.position();
        self.errs.push(ConfigError {
            file: self.file.clone(),
            line,
            col,
            message: message.into(),
        });
    }

    fn describe(&self) -> &'static str {
        match self.raw {
            YamlNode::Scalar(_) => "a scalar",
            YamlNode::Mapping(_) => "a mapping",
            YamlNode::Sequence(_) => "a list",
        }
    }

    fn label(&self) -> String {
        if self.path.is_empty() {
            "the file".into()
        } else {
            format!("`{}`", self.path)
        }
    }

    /// This node as a mapping whose keys must be among `allowed`; unknown
    /// keys are reported with the closest allowed one.
    pub fn as_map(&self, allowed: &[&str]) -> Option<Map<'a>> {
        let YamlNode::Mapping(m) = self.raw else {
            if matches!(self.raw, YamlNode::Scalar(s) if s.as_str().is_empty()) {
                // `key:` with nothing after it: treat as an empty mapping.
                return None;
            }
            self.error(format!(
                "{} must be a mapping (`key: value` lines), found {}",
                self.label(),
                self.describe()
            ));
            return None;
        };
        for (k, _) in m.iter() {
            if !allowed.contains(&k.as_str()) {
                let (line, col) = marker_pos(k.span().start());
                self.errs.push(ConfigError {
                    file: self.file.clone(),
                    line,
                    col,
                    message: unknown_key_message(k.as_str(), &self.label(), allowed),
                });
            }
        }
        Some(Map {
            node: *self,
            map: m,
        })
    }

    /// This node as a mapping, without checking its keys (for reading keys
    /// common to every component, such as `type` and `id`).
    pub fn as_map_quiet(&self) -> Option<Map<'a>> {
        match self.raw {
            YamlNode::Mapping(m) => Some(Map {
                node: *self,
                map: m,
            }),
            _ => None,
        }
    }

    /// This node as a list of nodes (a scalar counts as a one-item list).
    pub fn as_list(&self) -> Vec<Node<'a>> {
        match self.raw {
            YamlNode::Sequence(s) => s
                .iter()
                .enumerate()
                .map(|(i, raw)| Node {
                    raw,
                    path: self.errs.path(format!("{}[{i}]", self.path)),
                    ..*self
                })
                .collect(),
            YamlNode::Scalar(s) if s.as_str().is_empty() => Vec::new(),
            YamlNode::Scalar(_) => vec![*self],
            YamlNode::Mapping(_) => {
                self.error(format!(
                    "{} must be a list (`- item` lines or `[a, b]`), found a mapping",
                    self.label()
                ));
                Vec::new()
            }
        }
    }

    /// The scalar text of this node, or a recorded error.
    pub fn as_str(&self) -> Option<&'a str> {
        match self.raw {
            YamlNode::Scalar(s) => Some(s.as_str()),
            _ => {
                self.error(format!(
                    "{} must be a string, found {}",
                    self.label(),
                    self.describe()
                ));
                None
            }
        }
    }

    /// A non-negative integer, with optional size suffix when `size` is set
    /// (`64MiB`, `512KB`, `1GiB`).
    pub fn as_u64(&self, size: bool) -> Option<u64> {
        let s = self.as_str()?;
        let parsed = if size {
            parse_size(s)
        } else {
            s.trim().parse().ok()
        };
        if parsed.is_none() {
            let hint = if size {
                "a byte count such as `1048576` or `1MiB`"
            } else {
                "a non-negative integer"
            };
            self.error(format!("{} must be {hint}, found `{s}`", self.label()));
        }
        parsed
    }

    /// A duration: a number with a unit (`500ms`, `30s`, `10m`, `12h`,
    /// `7d`), or a bare number of seconds.
    pub fn as_duration(&self) -> Option<std::time::Duration> {
        let s = self.as_str()?;
        let parsed = parse_duration(s);
        if parsed.is_none() {
            self.error(format!(
                "{} must be a duration such as `30s`, `10m`, `12h` or `7d`, found `{s}`",
                self.label()
            ));
        }
        parsed
    }

    /// A boolean (`true`/`false`).
    pub fn as_bool(&self) -> Option<bool> {
        let s = self.as_str()?;
        match s {
            "true" | "True" | "TRUE" | "yes" | "on" => Some(true),
            "false" | "False" | "FALSE" | "no" | "off" => Some(false),
            _ => {
                self.error(format!(
                    "{} must be `true` or `false`, found `{s}`",
                    self.label()
                ));
                None
            }
        }
    }

    /// One of `choices`.
    pub fn as_choice(&self, choices: &[&'static str]) -> Option<&'static str> {
        let s = self.as_str()?;
        if let Some(c) = choices.iter().find(|c| **c == s) {
            return Some(c);
        }
        let mut msg = format!(
            "{} must be one of {}, found `{s}`",
            self.label(),
            choices
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(best) = closest(s, choices) {
            msg.push_str(&format!("; did you mean `{best}`?"));
        }
        self.error(msg);
        None
    }

    /// A list of strings (a single string is accepted as a one-item list).
    pub fn as_str_list(&self) -> Vec<(&'a str, Node<'a>)> {
        self.as_list()
            .into_iter()
            .filter_map(|n| n.as_str().map(|s| (s, n)))
            .collect()
    }
}

/// A mapping whose keys were checked against the allowed set.
#[derive(Clone, Copy)]
pub struct Map<'a> {
    node: Node<'a>,
    map: &'a MarkedMappingNode,
}

impl<'a> Map<'a> {
    /// The mapping itself as a node.
    pub fn node(&self) -> Node<'a> {
        self.node
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Node<'a>> {
        let (k, raw) = self.map.iter().find(|(k, _)| k.as_str() == key)?;
        Some(Node {
            file: self.node.file,
            raw,
            path: self.node.errs.child_path(self.node.path, k),
            errs: self.node.errs,
        })
    }

    /// The value of `key`, recording "missing required key" when absent.
    pub fn required(&self, key: &str, example: &str) -> Option<Node<'a>> {
        let n = self.get(key);
        if n.is_none() {
            self.node.error(format!(
                "missing required key `{key}` in {}; add for example `{key}: {example}`",
                self.node.label()
            ));
        }
        n
    }

    /// Optional string.
    pub fn str(&self, key: &str) -> Option<&'a str> {
        self.get(key).and_then(|n| n.as_str())
    }

    /// Optional unsigned integer (`size` allows suffixes like `MiB`).
    pub fn u64(&self, key: &str, size: bool) -> Option<u64> {
        self.get(key).and_then(|n| n.as_u64(size))
    }

    /// Optional boolean.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(|n| n.as_bool())
    }

    /// Optional choice among `choices`.
    pub fn choice(&self, key: &str, choices: &[&'static str]) -> Option<&'static str> {
        self.get(key).and_then(|n| n.as_choice(choices))
    }

    /// Keys and values in file order.
    pub fn entries(&self) -> Vec<(&'a str, Node<'a>)> {
        self.map
            .iter()
            .map(|(k, raw)| {
                (
                    k.as_str(),
                    Node {
                        file: self.node.file,
                        raw,
                        path: self.node.errs.child_path(self.node.path, k),
                        errs: self.node.errs,
                    },
                )
            })
            .collect()
    }
}

impl ConfigErrors {
    /// Keeps `p` for as long as this read.
    fn path(&self, p: String) -> &str {
        self.paths.alloc(p).as_str()
    }

    fn child_path(&self, parent: &str, k: &MarkedScalarNode) -> &str {
        self.path(if parent.is_empty() {
            k.as_str().to_string()
        } else {
            format!("{parent}.{}", k.as_str())
        })
    }
}

fn marker_pos(m: Option<&marked_yaml::Marker>) -> (usize, usize) {
    m.map(|m| (m.line().max(1), m.column().max(1)))
        .unwrap_or((1, 1))
}

/// The allowed name closest to `got`, if it is close enough to be a typo.
pub fn closest<'c>(got: &str, allowed: &[&'c str]) -> Option<&'c str> {
    allowed
        .iter()
        .map(|a| (strsim::damerau_levenshtein(got, a), *a))
        .filter(|(d, a)| *d <= 2.max(a.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

fn unknown_key_message(key: &str, within: &str, allowed: &[&str]) -> String {
    let mut msg = format!("unknown key `{key}` in {within}");
    if let Some(best) = closest(key, allowed) {
        msg.push_str(&format!("; did you mean `{best}`?"));
    } else {
        msg.push_str(&format!(
            "; valid keys are {}",
            allowed
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    msg
}

/// Parses `500ms`, `30s`, `10m`, `12h`, `7d` and a bare number of
/// seconds.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let ms: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).map(std::time::Duration::from_millis)
}

/// Parses `123`, `64KiB`, `10MB`, `1GiB` (case-insensitive units; KB/MB/GB
/// are powers of 1000, KiB/MiB/GiB powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Why [`expand_env`] refused a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    /// What is wrong and how to fix it, naming the variable.
    pub message: String,
    /// The text where the problem starts (`${NAME`), to find its column.
    pub at: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Replaces `${NAME}` and `${NAME:-default}` in `s` with environment
/// values found by `lookup`, and `$$` with `$`. A `$` followed by anything
/// else is kept as it is. Errors name the problem (unset variable, bad
/// name, missing `}`).
///
/// The loader runs it once over every value of a pipeline file
/// ([`crate::yaml::expand_env_tree`]); plugins read values already
/// expanded and must not expand them again (`$$` would be undone).
pub fn expand_env(
    s: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Cow<'_, str>, EnvError> {
    if !s.contains('$') {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(EnvError {
                    message: "`${` without a closing `}`; write `$${` for a literal `${`".into(),
                    at: "${".into(),
                });
            };
            let inner = &body[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let valid = name
                .bytes()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
                && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
            if !valid {
                return Err(EnvError {
                    message: format!(
                        "invalid environment variable name `{name}`: use letters, digits \
                         and `_`, e.g. `${{HOSTNAME}}` or `${{REGION:-eu-west-1}}`; write \
                         `$${{` for a literal `${{`"
                    ),
                    at: format!("${{{name}"),
                });
            }
            match (lookup(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(EnvError {
                        message: format!(
                            "environment variable `{name}` is not set (or not UTF-8); set it, \
                             or give a default with `${{{name}:-default}}`"
                        ),
                        at: format!("${{{name}"),
                    })
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_suggests_closest() {
        let file: Arc<str> = "p.yaml".into();
        let raw = parse_yaml(&file, "sources: []\nsinkz: []\n").unwrap();
        let errs = ConfigErrors::new();
        let root = Node::root(&file, &raw, &errs);
        let m = root.as_map(&["sources", "processors", "sinks"]).unwrap();
        assert!(m.required("sinks", "[]").is_none());
        let v: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            v,
            vec![
                "p.yaml:1:1: missing required key `sinks` in the file; add for example `sinks: []`",
                "p.yaml:2:1: unknown key `sinkz` in the file; did you mean `sinks`?",
            ]
        );
    }

    #[test]
    fn wrong_types_are_positioned() {
        let file: Arc<str> = "q.yaml".into();
        let raw = parse_yaml(&file, "a:\n  n: abc\n  c: txet\n").unwrap();
        let errs = ConfigErrors::new();
        let root = Node::root(&file, &raw, &errs);
        let a = root
            .as_map(&["a"])
            .unwrap()
            .get("a")
            .unwrap()
            .as_map(&["n", "c"])
            .unwrap();
        assert_eq!(a.u64("n", false), None);
        assert_eq!(a.choice("c", &["text", "ndjson"]), None);
        let v: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            v[0],
            "q.yaml:2:6: `a.n` must be a non-negative integer, found `abc`"
        );
        assert_eq!(
            v[1],
            "q.yaml:3:6: `a.c` must be one of `text`, `ndjson`, found `txet`; did you mean `text`?"
        );
    }

    #[test]
    fn syntax_error_has_position() {
        let file: Arc<str> = "s.yaml".into();
        let e = parse_yaml(&file, "a: [1, 2\nb: 3\n").unwrap_err();
        assert_eq!(&*e.file, "s.yaml");
        assert!(e.message.starts_with("YAML syntax error"), "{e}");
    }

    #[test]
    fn durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("2d"), Some(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("1w"), None);
        assert_eq!(parse_duration("m"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("10MB"), Some(10_000_000));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("5 parsecs"), None);
    }
}
