//! The condition language shared by the `filter` processor and the sinks'
//! `when:` routing: `include` (every regex must match its field) and
//! `exclude` (none may match).
//!
//! A field is looked up among the event's fields first (a dotted name
//! also as a path into nested objects, `@metadata.beat`), then among its
//! batch's source metadata (`file`, `host`, `source_type`, `kafka.topic`,
//! container labels...), exactly as sinks would write it. A missing field
//! matches nothing: it fails `include` and passes `exclude`. Regexes are
//! searched anywhere in the value (write `^` and `$` to anchor them) on the
//! raw bytes, so values that are not valid UTF-8 can still match. Numbers
//! and booleans match against their JSON text (`200`, `1.5`, `true`);
//! `null`, arrays and objects match nothing.

use petrel_core::config::{Map, Node};
use petrel_core::{Event, EventBatch};
use regex::bytes::Regex;

use super::common::{free_map, regex_error, value_text};

/// A compiled condition.
#[derive(Debug, Clone, Default)]
pub struct Condition {
    /// Field name → regex that must all match.
    pub include: Vec<(String, Regex)>,
    /// Field name → regex of which none may match.
    pub exclude: Vec<(String, Regex)>,
}

impl Condition {
    /// Reads `include` and `exclude` of `map`; `what` names the owner in
    /// the message when both are missing (`filter`, `when`). Invalid
    /// regexes are reported with the regex engine's explanation.
    pub fn parse(map: &Map<'_>, what: &str) -> Option<Self> {
        let include = map.get("include").map(|n| rules(n, "include"));
        let exclude = map.get("exclude").map(|n| rules(n, "exclude"));
        if include.is_none() && exclude.is_none() {
            map.node().error(format!(
                "`{what}` needs `include` or `exclude` (a map of field name to regex), \
                 e.g. `include: {{level: \"^error$\"}}`"
            ));
            return None;
        }
        Some(Self {
            include: include.unwrap_or(Some(Vec::new()))?,
            exclude: exclude.unwrap_or(Some(Vec::new()))?,
        })
    }

    /// True when `ev` of `batch` passes every rule.
    #[inline]
    pub fn matches(&self, batch: &EventBatch, ev: &Event) -> bool {
        let mut scratch = [0u8; 32];
        let test = |field: &str, re: &Regex, scratch: &mut [u8; 32]| {
            let text = match ev.get_path(field) {
                Some(v) => value_text(v, &batch.buf, scratch),
                None => batch.meta_field(ev, field),
            };
            text.is_some_and(|t| re.is_match(t))
        };
        self.include.iter().all(|(f, re)| test(f, re, &mut scratch))
            && !self.exclude.iter().any(|(f, re)| test(f, re, &mut scratch))
    }
}

/// Reads a map of field → regex; None when any entry was wrong (all are
/// reported).
fn rules(node: Node<'_>, what: &str) -> Option<Vec<(String, Regex)>> {
    let mut ok = true;
    let mut out = Vec::new();
    for (field, value) in free_map(node, what)? {
        let Some(pattern) = value.as_str() else {
            ok = false;
            continue;
        };
        if field.is_empty() {
            value.error(format!("`{what}` has an empty field name"));
            ok = false;
            continue;
        }
        match Regex::new(pattern) {
            Ok(re) => out.push((field.to_string(), re)),
            Err(e) => {
                value.error(format!(
                    "invalid regex `{pattern}` for field `{field}` in `{what}`: {}",
                    regex_error(&e)
                ));
                ok = false;
            }
        }
    }
    ok.then_some(out)
}
