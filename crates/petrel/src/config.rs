//! Loading pipeline files: one YAML file per pipeline, named by its stem.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use petrel_core::config::{closest, parse_yaml, ConfigError, ConfigErrors, Node};

use crate::processors::{self, ProcessorConfig};
use crate::sinks::{self, SinkConfig};
use crate::sources::{self, SourceConfig};

/// One pipeline: sources → processors → sinks.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The file stem.
    pub name: String,
    /// The file it came from.
    pub file: PathBuf,
    /// Sources with their ids.
    pub sources: Vec<(String, SourceConfig)>,
    /// Processors with their ids, in order.
    pub processors: Vec<(String, ProcessorConfig)>,
    /// Sinks with their ids.
    pub sinks: Vec<(String, SinkConfig)>,
}

const TOP_KEYS: &[&str] = &["sources", "processors", "sinks"];

/// Loads `path`: one pipeline file, or every `*.yaml`/`*.yml` in a
/// directory. Returns every problem found, each with its position.
pub fn load(path: &Path) -> Result<Vec<PipelineConfig>, Vec<ConfigError>> {
    let shown: Arc<str> = path.to_string_lossy().into();
    let whole = |msg: String| {
        vec![ConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            message: msg,
        }]
    };
    let meta = std::fs::metadata(path).map_err(|e| whole(format!("cannot read: {e}")))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| whole(format!("cannot list directory: {e}")))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        v.sort();
        if v.is_empty() {
            return Err(whole(
                "no pipeline files (*.yaml or *.yml) in this directory; add one, e.g. from examples/".into(),
            ));
        }
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut pipelines = Vec::new();
    let mut errors = Vec::new();
    let mut names = std::collections::HashMap::new();
    for f in files {
        match load_file(&f) {
            Ok(p) => {
                if let Some(prev) = names.insert(p.name.clone(), p.file.clone()) {
                    errors.push(ConfigError {
                        file: f.to_string_lossy().into(),
                        line: 1,
                        col: 1,
                        message: format!(
                            "pipeline name `{}` is also used by {}; rename one of the files",
                            p.name,
                            prev.display()
                        ),
                    });
                }
                pipelines.push(p);
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(pipelines)
    } else {
        Err(errors)
    }
}

/// Loads one pipeline file.
pub fn load_file(path: &Path) -> Result<PipelineConfig, Vec<ConfigError>> {
    let shown: Arc<str> = path.to_string_lossy().into();
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![ConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            message: format!("cannot read: {e}"),
        }]
    })?;
    let raw = parse_yaml(&shown, &text).map_err(|e| vec![e])?;
    let errs = ConfigErrors::new();
    // Relative paths inside the file resolve against its directory, which
    // must therefore be absolute.
    let abs_file: Arc<str> = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into();
    let root = Node::root(&abs_file, &raw, &errs);
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pipeline".into());
    let mut p = PipelineConfig {
        name,
        file: path.to_path_buf(),
        sources: Vec::new(),
        processors: Vec::new(),
        sinks: Vec::new(),
    };
    if let Some(m) = root.as_map(TOP_KEYS) {
        if let Some(n) = m.required("sources", "[{ type: file, include: [\"/var/log/*.log\"] }]") {
            p.sources = section(n, "source", sources::parse);
            if n.as_list().is_empty() {
                n.error("`sources` is empty; add at least one source, e.g. `- type: file`");
            }
        }
        if let Some(n) = m.get("processors") {
            p.processors = section(n, "processor", processors::parse);
        }
        if let Some(n) = m.required("sinks", "[{ type: stdout }]") {
            p.sinks = section(n, "sink", sinks::parse);
            if n.as_list().is_empty() {
                n.error("`sinks` is empty; add at least one sink, e.g. `- type: stdout`");
            }
            check_feedback(n, &p.sources);
        }
    } else if errs.is_empty() {
        root.error("the file is empty; it needs `sources` and `sinks`");
    }
    // Report with the path as the user gave it.
    let list: Vec<ConfigError> = errs
        .into_vec()
        .into_iter()
        .map(|mut e| {
            e.file = shown.clone();
            e
        })
        .collect();
    if list.is_empty() {
        Ok(p)
    } else {
        Err(list)
    }
}

/// Reports file sinks whose output a file source of the same pipeline
/// reads: the pipeline would read back everything it writes, forever (and
/// fill the disk).
fn check_feedback(sinks: Node<'_>, sources: &[(String, SourceConfig)]) {
    use crate::sources::file::discovery::compile_glob;
    use petrel_core::config::YamlNode;
    let build = |pats: &[String]| {
        let mut b = globset::GlobSetBuilder::new();
        for p in pats {
            if let Ok(g) = compile_glob(p) {
                b.add(g);
            }
        }
        b.build().ok()
    };
    let mut readers = Vec::new();
    for (id, src) in sources {
        match src {
            SourceConfig::File(fc) => {
                if let (Some(inc), Some(exc)) = (build(&fc.include), build(&fc.exclude)) {
                    readers.push((id, inc, exc));
                }
            }
        }
    }
    if readers.is_empty() || !matches!(sinks.raw(), YamlNode::Sequence(_)) {
        return;
    }
    let scalar = |n: Node<'_>| match n.raw() {
        YamlNode::Scalar(s) => Some(s.as_str().to_string()),
        _ => None,
    };
    for item in sinks.as_list() {
        let Some(m) = item.as_map_quiet() else {
            continue;
        };
        if m.get("type").and_then(scalar).as_deref() != Some("file") {
            continue;
        }
        let Some(pn) = m.get("path") else { continue };
        let Some(given) = scalar(pn) else { continue };
        let path = resolve_path(pn, &given);
        if let Some((id, _, _)) = readers
            .iter()
            .find(|(_, inc, exc)| inc.is_match(&path) && !exc.is_match(&path))
        {
            pn.error(format!(
                "the file sink writes `{given}`, which source `{id}` of this pipeline reads: it would read its own output forever; write elsewhere or add the path to that source's `exclude`"
            ));
        }
    }
}

fn section<T>(n: Node<'_>, what: &str, parse: fn(Node<'_>) -> Option<T>) -> Vec<(String, T)> {
    let mut out: Vec<(String, T)> = Vec::new();
    for (i, item) in n.as_list().into_iter().enumerate() {
        let Some(cfg) = parse(item) else { continue };
        let m = item.as_map_quiet();
        let ty = m.and_then(|m| m.str("type")).unwrap_or(what);
        let id = m
            .and_then(|m| m.str("id"))
            .map(str::to_string)
            .unwrap_or_else(|| format!("{ty}_{i}"));
        if out.iter().any(|(other, _)| *other == id) {
            item.error(format!(
                "duplicate {what} id `{id}`; give each {what} its own `id`"
            ));
        }
        out.push((id, cfg));
    }
    out
}

/// Reads `type:` of a component and checks it against `types`.
pub fn component_type(node: Node<'_>, types: &[&'static str], what: &str) -> Option<&'static str> {
    let Some(m) = node.as_map_quiet() else {
        node.error(format!(
            "each {what} must be a mapping with a `type`, e.g. `- type: {}`",
            types.first().copied().unwrap_or("...")
        ));
        return None;
    };
    let Some(tn) = m.get("type") else {
        node.error(format!(
            "missing required key `type` in this {what}; one of {}",
            list(types)
        ));
        return None;
    };
    let t = tn.as_str()?;
    if let Some(found) = types.iter().find(|x| **x == t) {
        return Some(found);
    }
    let mut msg = format!("unknown {what} type `{t}`");
    if let Some(best) = closest(t, types) {
        msg.push_str(&format!("; did you mean `{best}`?"));
    }
    if types.is_empty() {
        msg.push_str(&format!("; no {what} types exist yet, remove this entry"));
    } else {
        msg.push_str(&format!("; available: {}", list(types)));
    }
    tn.error(msg);
    None
}

fn list(types: &[&str]) -> String {
    types
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves `p` against the directory of the file `n` is in.
pub fn resolve_path(n: Node<'_>, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    Path::new(&**n.file())
        .parent()
        .map(|d| d.join(path))
        .unwrap_or_else(|| path.to_path_buf())
}

/// Replaces `${NAME}` and `${NAME:-default}` in `s` with environment
/// values found by `lookup`, and `$$` with `$`. A `$` followed by anything
/// else is kept as it is. Errors name the problem (unset variable, bad
/// name, missing `}`).
pub fn expand_env(
    s: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Cow<'_, str>, String> {
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
                return Err(format!(
                    "`${{` without a closing `}}` in `{s}`; write `$${{` for a literal `${{`"
                ));
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
                return Err(format!(
                    "invalid environment variable name `{name}` in `{s}`: use letters, digits \
                     and `_`, e.g. `${{HOSTNAME}}` or `${{REGION:-eu-west-1}}`"
                ));
            }
            match (lookup(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (or not UTF-8); set it, or \
                         give a default with `${{{name}:-default}}`"
                    ))
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
