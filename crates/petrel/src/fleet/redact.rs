//! Secrets out of the effective configuration a management server is
//! sent: the value of every key whose name says it holds a secret
//! (`password`, `token`, `secret_access_key`, an `Authorization` header,
//! ...) is replaced by `"<redacted>"` in the file's text, which keeps its
//! layout and comments. The text is parsed again afterwards: if a secret
//! could not be replaced in place (a block scalar, a value over several
//! lines), the whole file is withheld rather than sent half redacted.
//!
//! `${VAR}` references stay as they are written: the file's text holds the
//! reference, never the value the agent expanded it to.

use std::sync::Arc;

use petrel_core::config::{parse_yaml, YamlNode};

/// What replaces a secret value.
pub const REDACTED: &str = "<redacted>";

/// True for a key whose value is a secret.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "api_key",
        "apikey",
        "api-key",
        "authorization",
        "private_key",
        "credential",
        "cookie",
        "sasl",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// `text` with every secret value replaced, or a comment saying it was
/// withheld.
pub fn redact(text: &str) -> String {
    let name: Arc<str> = "effective".into();
    let Ok(tree) = parse_yaml(&name, text) else {
        return text.to_string();
    };
    let mut spans = Vec::new();
    collect(&tree, text, false, false, &mut spans);
    if spans.is_empty() {
        return text.to_string();
    }
    let Some(out) = splice(text, &mut spans) else {
        return withheld();
    };
    // Checked, not trusted: every secret must now read `<redacted>`.
    match parse_yaml(&name, &out) {
        Ok(t) if secrets_redacted(&t) => out,
        _ => withheld(),
    }
}

fn withheld() -> String {
    "# withheld: a secret in this file could not be redacted in place\n".into()
}

/// Byte ranges of secret values.
fn collect(node: &YamlNode, text: &str, secret: bool, flow: bool, out: &mut Vec<(usize, usize)>) {
    match node {
        YamlNode::Scalar(s) => {
            if secret {
                match s
                    .span()
                    .start()
                    .and_then(|m| value_end(text, m.character(), flow))
                {
                    Some(r) => out.push(r),
                    // Unknown extent: a marker the splice refuses.
                    None => out.push((usize::MAX, usize::MAX)),
                }
            }
        }
        YamlNode::Mapping(m) => {
            let flow = flow || opens_flow(text, m.span().start().map(|s| s.character()));
            for (k, v) in m.iter() {
                collect(v, text, secret || is_secret_key(k.as_str()), flow, out);
            }
        }
        YamlNode::Sequence(l) => {
            let flow = flow || opens_flow(text, l.span().start().map(|s| s.character()));
            for v in l.iter() {
                collect(v, text, secret, flow, out);
            }
        }
    }
}

fn byte_at(text: &str, ch: usize) -> Option<usize> {
    text.char_indices()
        .nth(ch)
        .map(|(b, _)| b)
        .or_else(|| (text.chars().count() == ch).then_some(text.len()))
}

fn opens_flow(text: &str, ch: Option<usize>) -> bool {
    ch.and_then(|c| byte_at(text, c))
        .and_then(|b| text[b..].chars().next())
        .is_some_and(|c| c == '{' || c == '[')
}

/// The byte range of the scalar that starts at character `ch`.
fn value_end(text: &str, ch: usize, flow: bool) -> Option<(usize, usize)> {
    let start = byte_at(text, ch)?;
    let rest = &text[start..];
    let first = rest.chars().next()?;
    let len = match first {
        '"' => {
            let mut esc = false;
            let mut end = None;
            for (i, c) in rest.char_indices().skip(1) {
                match (esc, c) {
                    (true, _) => esc = false,
                    (false, '\\') => esc = true,
                    (false, '"') => {
                        end = Some(i + 1);
                        break;
                    }
                    (false, '\n') => return None,
                    _ => {}
                }
            }
            end?
        }
        '\'' => {
            let b = rest.as_bytes();
            let mut i = 1;
            loop {
                match b.get(i)? {
                    b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
                    b'\'' => break i + 1,
                    b'\n' => return None,
                    _ => i += 1,
                }
            }
        }
        // Block scalars span lines: not replaced in place.
        '|' | '>' => return None,
        _ => {
            let line = rest.split('\n').next().unwrap_or(rest);
            let mut end = line.len();
            if let Some(i) = line.find(" #") {
                end = end.min(i);
            }
            if flow {
                if let Some(i) = line.find([',', '}', ']']) {
                    end = end.min(i);
                }
            }
            let v = line[..end].trim_end();
            // A plain scalar may go on over the next lines, more indented.
            let after = &rest[line.len()..];
            if !flow && continues(after, text, start) {
                return None;
            }
            v.len()
        }
    };
    Some((start, start + len))
}

/// True when the line after a plain scalar continues it (indented more
/// than the line the scalar started on, and not a key or list item of its
/// own).
fn continues(after: &str, text: &str, start: usize) -> bool {
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = text[line_start..].len() - text[line_start..].trim_start().len();
    let Some(next) = after.strip_prefix('\n').and_then(|a| a.split('\n').next()) else {
        return false;
    };
    let t = next.trim_start();
    let next_indent = next.len() - t.len();
    !t.is_empty()
        && !t.starts_with('#')
        && next_indent > indent
        && !t.contains(": ")
        && !t.starts_with("- ")
}

fn splice(text: &str, spans: &mut [(usize, usize)]) -> Option<String> {
    spans.sort();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(s, e) in spans.iter() {
        if s == usize::MAX || s < at || e > text.len() {
            return None;
        }
        out.push_str(&text[at..s]);
        out.push('"');
        out.push_str(REDACTED);
        out.push('"');
        at = e;
    }
    out.push_str(&text[at..]);
    Some(out)
}

fn secrets_redacted(node: &YamlNode) -> bool {
    fn walk(n: &YamlNode, secret: bool) -> bool {
        match n {
            YamlNode::Scalar(s) => !secret || s.as_str() == REDACTED,
            YamlNode::Mapping(m) => m
                .iter()
                .all(|(k, v)| walk(v, secret || is_secret_key(k.as_str()))),
            YamlNode::Sequence(l) => l.iter().all(|v| walk(v, secret)),
        }
    }
    walk(node, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_in_place() {
        let text = "sinks:\n  - type: http # out\n    url: https://h/x\n    headers: {Authorization: \"Bearer abc\", X-Team: a}\n    auth:\n      strategy: basic\n      password: s3cr'et # keep\n      user: bob\n  - type: kafka\n    client: {sasl.password: 'p''w'}\n    token: ${TOKEN}\n";
        let r = redact(text);
        assert!(!r.contains("abc"), "{r}");
        assert!(!r.contains("s3cr"), "{r}");
        assert!(!r.contains("p''w"), "{r}");
        assert!(r.contains("X-Team: a"), "{r}");
        assert!(r.contains("user: bob"), "{r}");
        assert!(r.contains("# keep"), "{r}");
        assert!(r.contains("# out"), "{r}");
        assert_eq!(r.matches(REDACTED).count(), 4, "{r}");
    }

    #[test]
    fn what_cannot_be_replaced_in_place_is_withheld() {
        let r = redact("auth:\n  password: |\n    line one\n    line two\n");
        assert!(!r.contains("line"), "{r}");
        assert!(r.starts_with("# withheld"), "{r}");
        let r = redact("auth:\n  password: first\n    second\n");
        assert!(!r.contains("first") && !r.contains("second"), "{r}");
    }

    #[test]
    fn files_without_secrets_are_unchanged() {
        let t = "sources: [{type: stdin}]\nsinks: [{type: stdout}]\n";
        assert_eq!(redact(t), t);
    }
}
