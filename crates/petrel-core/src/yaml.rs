//! The YAML loader behind [`crate::config::parse_yaml`]: a positioned tree
//! (`marked_yaml` nodes) built from `yaml-rust2`'s parser events, with
//! anchors, aliases and merge keys (`<<: *base`), which `marked_yaml`'s own
//! loader refuses.
//!
//! Every node keeps the position where it was written: a node reached
//! through an alias is a copy of the anchored one, positions included, so
//! a problem in it is reported at the line the user wrote it on. Keys
//! merged with `<<` likewise keep the anchor's positions, and keys written
//! in the mapping itself win over merged ones, wherever they stand.
//!
//! Environment variables (`${VAR}`, `${VAR:-default}`, `$$`) are expanded
//! over a loaded tree by [`expand_env_tree`], every scalar value at once,
//! with an error at the `${` of an unset variable.

use std::collections::HashMap;
use std::sync::Arc;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode, MarkedSequenceNode};
use marked_yaml::{Marker, Node, Span};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker as ScanMarker, TScalarStyle};

use crate::config::{expand_env, ConfigError};

/// Nodes an alias may copy in all: a file of a few anchors used a few
/// times stays far below it, while a "billion laughs" document (aliases of
/// aliases, each doubling the tree) is refused instead of filling memory.
const MAX_NODES: usize = 1_000_000;

/// Where the tree being built stands.
// One frame per open collection of a config file, so the size of the
// larger variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Frame {
    /// Inside a mapping: its start, entries so far, the key waiting for its
    /// value (with whether it is a plain `<<`), the mappings merged in by
    /// `<<` (applied at its end), and its anchor.
    Mapping {
        start: Marker,
        map: MarkedMappingNode,
        key: Option<(MarkedScalarNode, bool)>,
        merges: Vec<(Node, Marker)>,
        anchor: usize,
    },
    /// Inside a sequence: its start, items so far and its anchor.
    Sequence {
        start: Marker,
        items: Vec<Node>,
        anchor: usize,
    },
}

/// What went wrong, where.
struct LoadFailure {
    at: Marker,
    message: String,
}

struct Loader {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    error: Option<LoadFailure>,
    /// Nodes created so far, copies through aliases included.
    nodes: usize,
}

fn marker(m: ScanMarker) -> Marker {
    Marker::new(0, m.index(), m.line(), m.col() + 1)
}

/// A tag as it is usually written (`!!str` rather than its resolved
/// `tag:yaml.org,2002:str`).
fn tag_text(t: &yaml_rust2::parser::Tag) -> String {
    match t.handle.as_str() {
        "tag:yaml.org,2002:" => format!("!!{}", t.suffix),
        h => format!("{h}{}", t.suffix),
    }
}

fn count_nodes(n: &Node) -> usize {
    match n {
        Node::Scalar(_) => 1,
        Node::Sequence(s) => 1 + s.iter().map(count_nodes).sum::<usize>(),
        Node::Mapping(m) => 1 + m.values().map(count_nodes).sum::<usize>(),
    }
}

impl Loader {
    fn fail(&mut self, at: Marker, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(LoadFailure {
                at,
                message: message.into(),
            });
        }
    }

    /// Puts a finished node where it belongs: as the value of the waiting
    /// key, a key itself, an item, or the document.
    fn place(&mut self, node: Node, anchor: usize, at: Marker, plain_merge_key: bool) {
        self.nodes += 1;
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                if !matches!(node, Node::Mapping(_)) {
                    self.fail(
                        at,
                        "the file must be a mapping with `sources`, `processors` and `sinks`",
                    );
                    return;
                }
                self.root = Some(node);
            }
            Some(Frame::Sequence { items, .. }) => items.push(node),
            Some(Frame::Mapping {
                map, key, merges, ..
            }) => match key.take() {
                None => match node {
                    Node::Scalar(s) => *key = Some((s, plain_merge_key)),
                    _ => self.fail(
                        at,
                        "a mapping key must be a plain value, not a list or a mapping",
                    ),
                },
                Some((_, true)) => merges.push((node, at)),
                Some((k, false)) => {
                    if let Some((prev, _)) = map.get_key_value(&k) {
                        let line = prev.span().start().map_or(0, |m| m.line());
                        let name = k.as_str().to_string();
                        let at = k.span().start().copied().unwrap_or(at);
                        self.fail(
                            at,
                            format!(
                                "duplicate key `{name}` (also on line {line}); remove one of the two"
                            ),
                        );
                        return;
                    }
                    map.insert(k, node);
                }
            },
        }
    }

    /// Merges the mappings of `<<` keys into `map`: keys the mapping sets
    /// itself win, then earlier merged mappings over later ones (YAML's
    /// merge key rules).
    fn merge(&mut self, map: &mut MarkedMappingNode, merges: Vec<(Node, Marker)>) {
        for (source, at) in merges {
            let sources: Vec<Node> = match source {
                Node::Mapping(m) => vec![Node::Mapping(m)],
                Node::Sequence(s) if s.iter().all(|n| matches!(n, Node::Mapping(_))) => {
                    s.iter().cloned().collect()
                }
                _ => {
                    self.fail(
                        at,
                        "`<<` merges a mapping or a list of mappings, e.g. `<<: *defaults` \
                         where `defaults` is an anchor on a mapping",
                    );
                    return;
                }
            };
            for s in sources {
                let Node::Mapping(m) = s else { continue };
                for (k, v) in m.iter() {
                    if !map.contains_key(k) {
                        map.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
}

impl MarkedEventReceiver for Loader {
    fn on_event(&mut self, ev: Event, mark: ScanMarker) {
        if self.error.is_some() {
            return;
        }
        let at = marker(mark);
        if self.nodes > MAX_NODES {
            self.fail(
                at,
                format!("the file expands to more than {MAX_NODES} values through aliases; use fewer nested aliases"),
            );
            return;
        }
        match ev {
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {
                if matches!(ev, Event::DocumentStart) && self.root.is_some() {
                    self.fail(
                        at,
                        "a pipeline file holds one YAML document; remove the `---` and what follows, or move it to a file of its own",
                    );
                }
            }
            Event::Alias(id) => {
                let Some(node) = self.anchors.get(&id).cloned() else {
                    self.fail(
                        at,
                        "this alias refers to a node that contains it (or to no anchor); \
                         an anchor can be used only after its node ends",
                    );
                    return;
                };
                self.nodes += count_nodes(&node);
                self.place(node, 0, at, false);
            }
            Event::Scalar(value, style, anchor, tag) => {
                if let Some(t) = tag {
                    self.fail(
                        at,
                        format!(
                            "YAML tags are not supported (`{}`); remove the tag and write the value as it is",
                            tag_text(&t)
                        ),
                    );
                    return;
                }
                let is_key = matches!(self.stack.last(), Some(Frame::Mapping { key: None, .. }));
                let merge_key = is_key && style == TScalarStyle::Plain && value == "<<";
                let node = MarkedScalarNode::new(Span::new_start(at), value);
                self.place(Node::Scalar(node), anchor, at, merge_key);
            }
            Event::SequenceStart(_, Some(t)) | Event::MappingStart(_, Some(t)) => {
                self.fail(
                    at,
                    format!(
                        "YAML tags are not supported (`{}`); remove the tag",
                        tag_text(&t)
                    ),
                );
            }
            Event::SequenceStart(anchor, _) => {
                if matches!(self.stack.last(), Some(Frame::Mapping { key: None, .. })) {
                    self.fail(at, "a mapping key must be a plain value, not a list");
                    return;
                }
                self.stack.push(Frame::Sequence {
                    start: at,
                    items: Vec::new(),
                    anchor,
                });
            }
            Event::MappingStart(anchor, _) => {
                if matches!(self.stack.last(), Some(Frame::Mapping { key: None, .. })) {
                    self.fail(at, "a mapping key must be a plain value, not a mapping");
                    return;
                }
                self.stack.push(Frame::Mapping {
                    start: at,
                    map: MarkedMappingNode::new_empty(Span::new_start(at)),
                    key: None,
                    merges: Vec::new(),
                    anchor,
                });
            }
            Event::SequenceEnd => {
                if let Some(Frame::Sequence {
                    start,
                    items,
                    anchor,
                }) = self.stack.pop()
                {
                    let node = MarkedSequenceNode::new(Span::new_with_marks(start, at), items);
                    self.place(Node::Sequence(node), anchor, start, false);
                }
            }
            Event::MappingEnd => {
                if let Some(Frame::Mapping {
                    start,
                    map,
                    merges,
                    anchor,
                    ..
                }) = self.stack.pop()
                {
                    let mut full = map;
                    *full.span_mut() = Span::new_with_marks(start, at);
                    self.merge(&mut full, merges);
                    self.place(Node::Mapping(full), anchor, start, false);
                }
            }
        }
    }
}

/// Parses `text` into a positioned tree whose top is a mapping (an empty
/// document is an empty mapping).
pub(crate) fn load(file: &Arc<str>, text: &str) -> Result<Node, ConfigError> {
    let mut loader = Loader {
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        error: None,
        nodes: 0,
    };
    let mut parser = Parser::new(text.chars());
    let err = |m: Marker, message: String| ConfigError {
        file: file.clone(),
        line: m.line().max(1),
        col: m.column().max(1),
        message,
    };
    if let Err(e) = parser.load(&mut loader, true) {
        if let Some(f) = loader.error {
            return Err(err(f.at, f.message));
        }
        return Err(err(marker(*e.marker()), format!("YAML syntax error: {e}")));
    }
    if let Some(f) = loader.error {
        return Err(err(f.at, f.message));
    }
    Ok(loader.root.unwrap_or_else(|| {
        let at = Marker::new(0, 0, 1, 1);
        Node::Mapping(MarkedMappingNode::new_empty(Span::new_start(at)))
    }))
}

/// Expands `${VAR}`, `${VAR:-default}` and `$$` in every scalar value of
/// `root` (mapping keys are names and stay as written) with `lookup`.
/// Each unset variable without a default, bad name or unclosed `${` is
/// reported at its own `${` in `text`, naming the variable.
pub fn expand_env_tree(
    file: &Arc<str>,
    text: &str,
    root: &mut Node,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    walk(root, &mut |s: &mut MarkedScalarNode| {
        if !s.as_str().contains('$') {
            return;
        }
        match expand_env(s.as_str(), lookup) {
            Ok(v) => {
                let v = v.into_owned();
                let span = *s.span();
                *s = MarkedScalarNode::new(span, v);
            }
            Err(e) => {
                let start = s.span().start().copied();
                let (line, col) = locate(text, start.as_ref(), &e.at);
                errors.push(ConfigError {
                    file: file.clone(),
                    line,
                    col,
                    message: e.message,
                });
            }
        }
    });
    errors.sort_by_key(|e| (e.line, e.col));
    errors.dedup();
    errors
}

fn walk(n: &mut Node, f: &mut dyn FnMut(&mut MarkedScalarNode)) {
    match n {
        Node::Scalar(s) => f(s),
        Node::Sequence(items) => {
            for i in items.iter_mut() {
                walk(i, f);
            }
        }
        Node::Mapping(m) => {
            for (_, v) in m.iter_mut() {
                walk(v, f);
            }
        }
    }
}

/// Line and column of the first `needle` in `text` at or after the
/// scalar that starts at `start` (a quoted or block scalar holds its
/// text a few characters after its start); the scalar's own position
/// when it is not found.
fn locate(text: &str, start: Option<&Marker>, needle: &str) -> (usize, usize) {
    let Some(m) = start else { return (1, 1) };
    let (line, col) = (m.line().max(1), m.column().max(1));
    // The marker counts characters; find the byte where the scalar starts.
    let Some((byte, _)) = text.char_indices().nth(m.character()) else {
        return (line, col);
    };
    let Some(found) = text[byte..].find(needle) else {
        return (line, col);
    };
    let before = &text[byte..byte + found];
    match before.rfind('\n') {
        None => (line, col + before.chars().count()),
        Some(nl) => (
            line + before.matches('\n').count(),
            before[nl + 1..].chars().count() + 1,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f() -> Arc<str> {
        "t.yaml".into()
    }

    fn get<'a>(n: &'a Node, path: &[&str]) -> &'a Node {
        let mut cur = n;
        for p in path {
            cur = match cur {
                Node::Mapping(m) => m.get_node(p).unwrap_or_else(|| panic!("no {p}")),
                Node::Sequence(s) => &s[p.parse::<usize>().unwrap()],
                Node::Scalar(_) => panic!("scalar at {p}"),
            };
        }
        cur
    }

    fn text(n: &Node) -> &str {
        n.as_scalar()
            .map(|s| s.as_str())
            .unwrap_or("<not a scalar>")
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let y = "\
x-kafka: &kafka
  type: kafka
  brokers: [\"a:9092\", \"b:9092\"]
  topic: base
sinks:
  - <<: *kafka
    topic: mine
  - *kafka
  - <<: [*kafka, {extra: 1}]
";
        let root = load(&f(), y).unwrap();
        assert_eq!(text(get(&root, &["sinks", "0", "topic"])), "mine");
        assert_eq!(text(get(&root, &["sinks", "0", "type"])), "kafka");
        assert_eq!(text(get(&root, &["sinks", "0", "brokers", "1"])), "b:9092");
        assert!(get(&root, &["sinks", "0"])
            .as_mapping()
            .unwrap()
            .get_node("<<")
            .is_none());
        assert_eq!(text(get(&root, &["sinks", "1", "topic"])), "base");
        assert_eq!(text(get(&root, &["sinks", "2", "extra"])), "1");
        // The merged key keeps the line it was written on (the anchor's).
        let brokers = get(&root, &["sinks", "0", "brokers"]);
        assert_eq!(brokers.span().start().unwrap().line(), 3);
        let topic = get(&root, &["sinks", "0", "topic"]);
        assert_eq!(topic.span().start().unwrap().line(), 7);
    }

    #[test]
    fn quoted_merge_key_is_a_plain_key_and_duplicates_are_refused() {
        let root = load(&f(), "a:\n  \"<<\": 1\n").unwrap();
        assert_eq!(text(get(&root, &["a", "<<"])), "1");
        let e = load(&f(), "a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.yaml:3:1: duplicate key `a` (also on line 1); remove one of the two"
        );
        let e = load(&f(), "a: &x 1\nb:\n  <<: *x\n").unwrap_err();
        assert!(e.message.contains("merges a mapping"), "{e}");
        assert_eq!((e.line, e.col), (3, 7));
    }

    #[test]
    fn bad_documents_are_positioned() {
        let e = load(&f(), "- a\n").unwrap_err();
        assert!(e.message.contains("must be a mapping"), "{e}");
        let e = load(&f(), "a: !!str 1\n").unwrap_err();
        assert!(e.message.contains("tags are not supported"), "{e}");
        let e = load(&f(), "a: *nope\n").unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        let e = load(&f(), "a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.message.contains("one YAML document"), "{e}");
        assert!(load(&f(), "").unwrap().as_mapping().unwrap().is_empty());
    }

    #[test]
    fn billion_laughs_is_refused() {
        let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            y.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = load(&f(), &y).unwrap_err();
        assert!(e.message.contains("more than"), "{e}");
    }

    #[test]
    fn env_is_expanded_in_every_value_and_errors_point_at_the_variable() {
        let y = "\
a: ${HOST}
b: [\"x-${HOST}\", \"$${HOST}\"]
c:
  d: |
    line one
    is ${NOPE}
e: \"   ${ALSO_NOPE:-dflt}\"
f: 'quoted ${UNSET_2}'
${KEY}: kept
";
        let mut root = load(&f(), y).unwrap();
        let lookup = |n: &str| (n == "HOST").then(|| "h1".to_string());
        let errs = expand_env_tree(&f(), y, &mut root, &lookup);
        let shown: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            shown[0].starts_with("t.yaml:6:8: environment variable `NOPE` is not set"),
            "{shown:?}"
        );
        assert!(
            shown[1].starts_with("t.yaml:8:12: environment variable `UNSET_2` is not set"),
            "{shown:?}"
        );
        assert_eq!(text(get(&root, &["a"])), "h1");
        assert_eq!(text(get(&root, &["b", "0"])), "x-h1");
        assert_eq!(text(get(&root, &["b", "1"])), "${HOST}");
        assert_eq!(text(get(&root, &["e"])), "   dflt");
        assert_eq!(text(get(&root, &["${KEY}"])), "kept");
    }
}
