//! `type: mask` — replaces sensitive text in a field.
//!
//! ```yaml
//! processors:
//!   # Card numbers: keep the last four digits.
//!   - type: mask
//!     pattern: '\b(?:\d[ -]?){12}(\d{4})\b'
//!     replace: '****-****-****-$1'
//!   # Phone numbers: a constant.
//!   - type: mask
//!     pattern: '(?:\+\d{1,3}[ .-]?)?\(?\d{3}\)?[ .-]?\d{3}[ .-]?\d{4}\b'
//!     replace: '<phone>'
//!   # Tokens: a stable pseudonym, so equal tokens can still be correlated.
//!   - type: mask
//!     field: authorization         # default `message`
//!     pattern: '[A-Za-z0-9_-]{20,}'
//!     hash: sha256
//!     salt: "${MASK_SALT}"         # optional; ${ENV} is expanded at load
//! ```
//!
//! Every non-overlapping match of `pattern` (Rust `regex` syntax, searched
//! anywhere; `(?i)` for case-insensitive) in field `field` is replaced:
//!
//! - with `replace` (default `***`), where `$1`, `${1}` and `${name}`
//!   insert capture groups and `$$` is a literal `$`. The file loader
//!   expands `${VAR}` and turns `$$` into `$` first, so in a pipeline file
//!   these are written `$1`, `$${1}`, `$${name}` and `$$$$`. A reference to a
//!   group the pattern does not have is a configuration error (so a stray
//!   `$` cannot silently erase text). Write `${1}x` (in a file: `$${1}x`), not `$1x`.
//! - or, with `hash: sha256`, with the first 16 hex characters (64 bits) of
//!   SHA-256 of `salt` followed by the matched bytes; without a salt,
//!   `printf '%s' 'the-match' | sha256sum | cut -c1-16` gives the same text.
//!   Use a secret salt: unsalted hashes of short values (phone numbers) can
//!   be reversed by trying every value.
//!
//! Matches of zero length are ignored, and a pattern that matches the empty
//! string is rejected. A changed field becomes a string (or raw bytes when
//! the result is not valid UTF-8); an event whose field is missing or has
//! no match is left exactly as it was, at no cost beyond the search. Text
//! that is not valid UTF-8 is searched as bytes. Numbers and booleans are
//! searched as their JSON text (a number that is masked becomes a string);
//! `null`, arrays and objects are left alone. Events are never dropped.

use petrel_core::config::Map;
use petrel_core::plugin::Processor;
use petrel_core::{ComponentMetrics, EventBatch, Key, Value};
use regex::bytes::Regex;
use sha2::{Digest, Sha256};

use super::common::{intern_name, regex_error, value_text};

/// Keys accepted.
pub const KEYS: &[&str] = &["type", "id", "field", "pattern", "replace", "hash", "salt"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Replaces every match of a regex in a field with a replacement or a salted SHA-256 pseudonym; events are never dropped."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "field",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"message"#),
        doc: r#"The field searched."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "pattern",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: a Rust `regex`, searched anywhere; a pattern that matches the empty string is rejected."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "replace",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"***"#),
        doc: r#"The replacement: `$1`, `${1}` and `${name}` insert capture groups (a group the pattern lacks is an error), `$$` is a literal `$`. In a pipeline file write `$${name}` and `$$$$`: the loader expands `${VAR}` and turns `$$` into `$` before the processor reads the value."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "hash",
        kind: petrel_core::plugin::KeyKind::OneOf(&["sha256"]),
        default: None,
        doc: r#"Instead of `replace`: the first 16 hex characters of SHA-256 of `salt` followed by the match."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "salt",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"With `hash`: prefixed to each match before hashing; `${ENV}` expanded at load. Use a secret salt: unsalted hashes of short values can be reversed."#,
    },
];

/// Hex characters of the hash written for each match.
const HASH_HEX_CHARS: usize = 16;

/// What replaces a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replacement {
    /// A constant; `expand` when it refers to capture groups.
    Text {
        /// The replacement as written.
        with: Vec<u8>,
        /// It contains `$` references to expand per match.
        expand: bool,
    },
    /// A SHA-256 hex prefix of salt + match.
    Sha256 {
        /// Prepended to each match before hashing.
        salt: Vec<u8>,
    },
}

/// Configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The field to mask.
    pub field: String,
    /// What to look for.
    pub pattern: Regex,
    /// What to put instead.
    pub replacement: Replacement,
}

impl Config {
    /// Reads the keys; regex errors, unknown group references and
    /// conflicting options are reported at their position.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let field = map.str("field").unwrap_or("message");
        if field.is_empty() {
            map.node().error("`field` must not be empty");
            return None;
        }
        let pnode = map.required("pattern", "'\\d{16}'")?;
        let text = pnode.as_str()?;
        let pattern = match Regex::new(text) {
            Ok(re) => re,
            Err(e) => {
                pnode.error(format!(
                    "invalid regex `{text}` in `pattern`: {}",
                    regex_error(&e)
                ));
                return None;
            }
        };
        if pattern.find(b"").is_some() {
            pnode.error(
                "`pattern` matches the empty string, so it would insert the replacement \
                 everywhere; use `+` instead of `*` or `?`, e.g. `\\d+`",
            );
            return None;
        }
        let hash = match map.get("hash") {
            Some(n) => Some(n.as_choice(&["sha256"])?),
            None => None,
        };
        let replacement = match (hash, map.get("replace")) {
            (Some(_), Some(r)) => {
                r.error("use either `replace` or `hash`, not both");
                return None;
            }
            (Some(_), None) => {
                let salt = match map.get("salt") {
                    None => Vec::new(),
                    // `${VAR}` was expanded when the file was loaded.
                    Some(n) => n.as_str()?.as_bytes().to_vec(),
                };
                Replacement::Sha256 { salt }
            }
            (None, r) => {
                if let Some(n) = map.get("salt") {
                    n.error("`salt` only applies with `hash: sha256`");
                    return None;
                }
                let with = match r {
                    Some(n) => n.as_str()?,
                    None => "***",
                };
                if let Err(e) = check_group_refs(with, &pattern) {
                    if let Some(n) = r {
                        n.error(e);
                    }
                    return None;
                }
                Replacement::Text {
                    with: with.as_bytes().to_vec(),
                    expand: with.contains('$'),
                }
            }
        };
        Some(Self {
            field: field.to_string(),
            pattern,
            replacement,
        })
    }
}

/// Checks that every `$` reference in `with` names a group of `re`, with
/// the regex crate's expansion rules: `$$` is a `$`; `${name}`; `$name`
/// takes the longest run of letters, digits and `_`; a `$` followed by
/// anything else is literal.
fn check_group_refs(with: &str, re: &Regex) -> Result<(), String> {
    let b = with.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        let rest = &with[i + 1..];
        let name = if rest.starts_with('$') {
            i += 2;
            continue;
        } else if let Some(body) = rest.strip_prefix('{') {
            match body.find('}') {
                Some(end) => {
                    i += end + 3;
                    &body[..end]
                }
                None => {
                    i += 1;
                    continue;
                }
            }
        } else {
            let n = rest
                .bytes()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                .count();
            i += n + 1;
            &rest[..n]
        };
        if name.is_empty() {
            continue;
        }
        let exists = match name.parse::<usize>() {
            Ok(idx) => idx < re.captures_len(),
            Err(_) => re.capture_names().flatten().any(|n| n == name),
        };
        if !exists {
            return Err(format!(
                "`replace` refers to capture group `{name}`, which `pattern` does not have \
                 (it has {} numbered group(s)); in a pipeline file write `$$$$` for a literal `$`, \
                 and `$${{1}}x` rather than `$1x` (the loader turns `$$` into `$`)",
                re.captures_len() - 1
            ));
        }
    }
    Ok(())
}

/// The running processor.
pub struct Mask {
    field: &'static str,
    pattern: Regex,
    replacement: Replacement,
}

impl Mask {
    /// Builds it (no counters of its own: events are never dropped).
    pub fn new(c: &Config, _metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            field: intern_name(&c.field),
            pattern: c.pattern.clone(),
            replacement: c.replacement.clone(),
        })
    }

    /// `text` with every match replaced, or None when nothing matched (so
    /// that unmatched events cost no allocation).
    fn mask(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut last = 0;
        let mut matched = false;
        match &self.replacement {
            Replacement::Text { with, expand: true } => {
                for caps in self.pattern.captures_iter(text) {
                    let Some(m) = caps.get(0) else { continue };
                    if m.is_empty() {
                        continue;
                    }
                    matched = true;
                    start_piece(&mut out, text, last, m.start());
                    caps.expand(with, &mut out);
                    last = m.end();
                }
            }
            r => {
                for m in self.pattern.find_iter(text) {
                    if m.is_empty() {
                        continue;
                    }
                    matched = true;
                    start_piece(&mut out, text, last, m.start());
                    match r {
                        Replacement::Sha256 { salt } => write_hash(salt, m.as_bytes(), &mut out),
                        Replacement::Text { with, .. } => out.extend_from_slice(with),
                    }
                    last = m.end();
                }
            }
        }
        if !matched {
            return None;
        }
        out.extend_from_slice(&text[last..]);
        Some(out)
    }
}

/// Appends the unmatched text before a match, reserving room for the
/// whole result on the first one.
#[inline]
fn start_piece(out: &mut Vec<u8>, text: &[u8], last: usize, start: usize) {
    if out.capacity() == 0 {
        out.reserve(text.len() + 32);
    }
    out.extend_from_slice(&text[last..start]);
}

/// Appends the hex prefix of SHA-256(salt ‖ m).
fn write_hash(salt: &[u8], m: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::new().chain_update(salt).chain_update(m).finalize();
    for byte in digest.iter().take(HASH_HEX_CHARS / 2) {
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 0xf)]);
    }
}

impl Processor for Mask {
    fn process(&self, batch: &mut EventBatch) {
        let EventBatch { buf, events, .. } = batch;
        for ev in events.iter_mut() {
            let masked = {
                let Some(v) = ev.get(self.field) else {
                    continue;
                };
                let mut scratch = [0u8; 32];
                let Some(text) = value_text(v, buf, &mut scratch) else {
                    continue;
                };
                match self.mask(text) {
                    Some(m) => m,
                    None => continue,
                }
            };
            let value = match String::from_utf8(masked) {
                Ok(s) => Value::Str(s.into_boxed_str()),
                Err(e) => Value::Bytes(e.into_bytes().into_boxed_slice()),
            };
            ev.set(Key::Borrowed(self.field), value);
        }
    }
}

/// Registration of `type: mask`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "mask",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "mask"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(Mask::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fields::test_support::*;
    use super::*;

    fn mask(yaml: &str) -> Mask {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        Mask::new(&c, metrics()).unwrap()
    }

    fn msgs(b: &EventBatch) -> Vec<String> {
        b.events
            .iter()
            .map(|e| {
                String::from_utf8_lossy(b.bytes_of(&e.message).unwrap_or(b"<none>")).into_owned()
            })
            .collect()
    }

    #[test]
    fn cards_keep_last_four_and_untouched_stays_a_span() {
        let m = mask(
            "type: mask\npattern: '\\b(?:\\d[ -]?){12}(\\d{4})\\b'\nreplace: '****-****-****-$1'\n",
        );
        let mut b = batch_of(&[
            "paid with 4111 1111 1111 1234 and 5500-0000-0000-0004 ok",
            "order 42 shipped",
            "",
        ]);
        m.process(&mut b);
        assert_eq!(
            msgs(&b),
            vec![
                "paid with ****-****-****-1234 and ****-****-****-0004 ok",
                "order 42 shipped",
                ""
            ]
        );
        assert!(matches!(b.events[0].message, Value::Str(_)));
        // Unmatched events are untouched: still spans of the buffer.
        assert!(matches!(b.events[1].message, Value::Span(_)));
        assert!(matches!(b.events[2].message, Value::Span(_)));
    }

    #[test]
    fn constant_default_and_phone() {
        let m = mask("type: mask\npattern: '(?:\\+\\d{1,3}[ .-]?)?\\(?\\d{3}\\)?[ .-]?\\d{3}[ .-]?\\d{4}\\b'\nreplace: '<phone>'\n");
        let mut b = batch_of(&["call +1 (555) 123-4567 or 555.123.4567 now"]);
        m.process(&mut b);
        assert_eq!(msgs(&b), vec!["call <phone> or <phone> now"]);

        let m = mask("type: mask\nfield: pw\npattern: '.+'\n");
        let mut b = batch_of(&["x", "y"]);
        with_field(&mut b, 0, "pw", Value::Str("hunter2".into()));
        m.process(&mut b);
        assert_eq!(b.events[0].get("pw"), Some(&Value::Str("***".into())));
        // Missing field: nothing added.
        assert!(b.events[1].get("pw").is_none());
    }

    #[test]
    fn hash_is_stable_salted_and_hex() {
        let m = mask("type: mask\npattern: 'tok_[a-z0-9]+'\nhash: sha256\n");
        let mut b = batch_of(&["a tok_abc b tok_abc c tok_xyz"]);
        m.process(&mut b);
        let out = &msgs(&b)[0];
        // printf '%s' tok_abc | sha256sum
        let want = {
            let d = Sha256::digest(b"tok_abc");
            d.iter()
                .take(8)
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
        };
        assert_eq!(want.len(), 16);
        let parts: Vec<&str> = out.split(' ').collect();
        assert_eq!(parts[1], want);
        assert_eq!(parts[3], want);
        assert_ne!(parts[5], want);
        assert!(parts[5].bytes().all(|c| c.is_ascii_hexdigit()) && parts[5].len() == 16);

        let salted = mask("type: mask\npattern: 'tok_[a-z0-9]+'\nhash: sha256\nsalt: pepper\n");
        let mut b = batch_of(&["tok_abc"]);
        salted.process(&mut b);
        let d = Sha256::digest(b"peppertok_abc");
        let want: String = d.iter().take(8).map(|x| format!("{x:02x}")).collect();
        assert_eq!(msgs(&b), vec![want]);
    }

    #[test]
    fn bytes_numbers_and_big_fields() {
        let m = mask("type: mask\npattern: '\\d{4}'\nreplace: '#'\n");
        let mut b = batch_raw(b"\xff1234\xfe\nabc\n", &[(0, 6), (7, 3)]);
        with_field(&mut b, 1, "message", Value::Int(123_456));
        m.process(&mut b);
        assert_eq!(
            b.events[0].message,
            Value::Bytes(b"\xff#\xfe".to_vec().into())
        );
        assert_eq!(b.events[1].message, Value::Str("#56".into()));

        let mut big = "a".repeat(1 << 20);
        big.push_str("9999");
        let mut b = batch_of(&[&big, &"b".repeat(1 << 20)]);
        m.process(&mut b);
        let Value::Str(s) = &b.events[0].message else {
            panic!("masked")
        };
        assert_eq!(s.len(), (1 << 20) + 1);
        assert!(s.ends_with('#'));
        assert!(matches!(b.events[1].message, Value::Span(_)));

        // Null and objects are left alone.
        let mut b = batch_of(&["x"]);
        with_field(&mut b, 0, "message", Value::Null);
        m.process(&mut b);
        assert_eq!(b.events[0].message, Value::Null);
    }

    #[test]
    fn named_groups_and_dollar() {
        let m = mask("type: mask\npattern: '(?P<user>\\w+)@(?P<host>[\\w.]+)'\nreplace: '$${user}@*** ($$$$)'\n");
        let mut b = batch_of(&["mail bob@example.com"]);
        m.process(&mut b);
        assert_eq!(msgs(&b), vec!["mail bob@*** ($)"]);
    }

    #[test]
    fn config_errors() {
        let e = |y: &str| cfg_errors(y, KEYS, Config::parse).join("\n");
        assert!(e("type: mask\n").contains("missing required key `pattern`"));
        let bad = e("type: mask\npattern: '(a'\n");
        assert!(
            bad.contains(
                "t.yaml:2:10: invalid regex `(a` in `pattern`: unclosed group (at character 1)"
            ),
            "{bad}"
        );
        assert!(e("type: mask\npattern: 'a*'\n").contains("matches the empty string"));
        assert!(e("type: mask\npattern: 'a'\nreplace: x\nhash: sha256\n")
            .contains("either `replace` or `hash`"));
        assert!(e("type: mask\npattern: 'a'\nhash: md5\n").contains("must be one of `sha256`"));
        assert!(e("type: mask\npattern: 'a'\nsalt: s\n").contains("only applies with"));
        let r = e("type: mask\npattern: '(a)'\nreplace: '$REDACTED'\n");
        assert!(r.contains("capture group `REDACTED`"), "{r}");
        assert!(e("type: mask\npattern: '(a)'\nreplace: '$1x'\n").contains("`1x`"));
        assert!(e("type: mask\npattern: '(a)'\nreplace: '$${2}'\n").contains("capture group `2`"));
        assert!(
            e("type: mask\npattern: 'a'\nhash: sha256\nsalt: '${PETREL_SURELY_UNSET_VAR}'\n")
                .contains("is not set")
        );
        // Valid references pass.
        let ok = |r: &str| check_group_refs(r, &Regex::new("(?P<n>a)(b)").unwrap());
        for r in ["$1", "${2}", "$n", "${n}", "$$", "$", "a$ b", "${", "$0"] {
            assert!(ok(r).is_ok(), "{r}");
        }
        assert!(ok("$3").is_err());
    }
}
