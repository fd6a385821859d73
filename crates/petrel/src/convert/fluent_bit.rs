//! Fluent Bit's classic configuration format (`fluent-bit.conf`):
//! `[SERVICE]`, `[INPUT]`, `[FILTER]`, `[OUTPUT]` sections of `Key Value`
//! lines, `@INCLUDE` (globs, relative to the including file), `@SET`
//! variables, and the parsers files that `Parsers_File` names (`[PARSER]`,
//! `[MULTILINE_PARSER]`).
//!
//! Fluent Bit routes by tag: every record carries its input's `Tag`, and
//! each filter and output applies to the tags its `Match` (a glob) or
//! `Match_Regex` selects. Petrel routes by pipeline, so each input becomes
//! one pipeline: its source, the filters that match its tag in the order
//! written, and the outputs that match it. An output matched by two
//! inputs is written in both pipelines (two connections, the same
//! records).
//!
//! Records are written in the `fluent-bit` layout (`log`, `time`,
//! `kubernetes.pod_name`, ...), the names Fluent Bit's records have.
//!
//! Keys are matched without regard to case, as Fluent Bit does. A key
//! this converter does not know is reported as not converted, never
//! dropped silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{Component, Converted, Origin, Outcome, Pipeline, ReadError, Report};

/// Largest configuration read (all files together): far above real ones
/// (a 5,000-line file with 200 inputs is about 200 kB).
const MAX_BYTES: usize = 64 << 20;

/// Deepest `@INCLUDE` nesting.
const MAX_DEPTH: usize = 16;

/// One `Key Value` line.
#[derive(Debug, Clone)]
struct KeyLine {
    key: String,
    value: String,
    at: Origin,
}

/// One section.
#[derive(Debug, Clone)]
struct Section {
    /// Lower case: `input`, `filter`, `output`, `service`, `parser`,
    /// `multiline_parser`, `upstream`, `node`, `plugins`.
    kind: String,
    at: Origin,
    entries: Vec<KeyLine>,
}

impl Section {
    fn get(&self, key: &str) -> Option<&KeyLine> {
        self.entries
            .iter()
            .find(|e| e.key.eq_ignore_ascii_case(key))
    }

    fn all(&self, key: &str) -> Vec<&KeyLine> {
        self.entries
            .iter()
            .filter(|e| e.key.eq_ignore_ascii_case(key))
            .collect()
    }

    fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(|e| e.value.as_str())
    }

    fn name(&self) -> String {
        self.value("Name").unwrap_or("").to_ascii_lowercase()
    }
}

struct Reader {
    vars: BTreeMap<String, String>,
    total: usize,
    stack: Vec<PathBuf>,
}

fn err(file: &str, line: usize, message: impl Into<String>) -> ReadError {
    ReadError {
        at: Origin {
            file: file.to_string(),
            line,
        },
        message: message.into(),
    }
}

impl Reader {
    /// Reads `path` and what it includes into `out`.
    fn read(&mut self, path: &Path, out: &mut Vec<Section>) -> Result<(), ReadError> {
        let shown = path.display().to_string();
        let canon =
            std::fs::canonicalize(path).map_err(|e| err(&shown, 1, format!("cannot read: {e}")))?;
        if let Some(i) = self.stack.iter().position(|p| *p == canon) {
            let chain: Vec<String> = self.stack[i..]
                .iter()
                .chain(std::iter::once(&canon))
                .map(|p| p.display().to_string())
                .collect();
            return Err(err(
                &shown,
                1,
                format!(
                    "`@INCLUDE` loop: {}; remove one of these includes",
                    chain.join(" includes ")
                ),
            ));
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(err(
                &shown,
                1,
                format!("`@INCLUDE` nested more than {MAX_DEPTH} deep"),
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| err(&shown, 1, format!("cannot read: {e}")))?;
        self.total += bytes.len();
        if self.total > MAX_BYTES {
            return Err(err(
                &shown,
                1,
                format!(
                    "the configuration is larger than {} MiB in all; this is not a Fluent Bit configuration",
                    MAX_BYTES >> 20
                ),
            ));
        }
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t,
            Err(e) => {
                let line = 1 + bytes[..e.valid_up_to()]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count();
                return Err(err(
                    &shown,
                    line,
                    "not text (invalid UTF-8): is this the Fluent Bit configuration file?",
                ));
            }
        };
        if text.contains('\0') {
            let line = 1 + text[..text.find('\0').unwrap_or(0)].matches('\n').count();
            return Err(err(
                &shown,
                line,
                "not text (a NUL byte): is this the Fluent Bit configuration file?",
            ));
        }
        self.stack.push(canon);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let r = self.parse(&shown, &dir, text, out);
        self.stack.pop();
        r
    }

    fn expand(&self, s: &str) -> String {
        // `@SET` variables are replaced now; other `${VAR}` are the
        // environment's, which Petrel's loader expands the same way.
        let mut out = s.to_string();
        for (k, v) in &self.vars {
            out = out.replace(&format!("${{{k}}}"), v);
        }
        out
    }

    fn parse(
        &mut self,
        shown: &str,
        dir: &Path,
        text: &str,
        out: &mut Vec<Section>,
    ) -> Result<(), ReadError> {
        let mut current: Option<Section> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let t = raw.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if let Some(rest) = t.strip_prefix('@') {
                let (cmd, arg) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                let arg = arg.trim();
                match cmd.to_ascii_uppercase().as_str() {
                    "INCLUDE" => {
                        if let Some(s) = current.take() {
                            out.push(s);
                        }
                        let pattern = self.expand(arg);
                        let full = if Path::new(&pattern).is_absolute() {
                            PathBuf::from(&pattern)
                        } else {
                            dir.join(&pattern)
                        };
                        let matches = include_matches(&full)
                            .map_err(|e| err(shown, line, format!("`@INCLUDE {arg}`: {e}")))?;
                        if matches.is_empty() {
                            return Err(err(
                                shown,
                                line,
                                format!("`@INCLUDE {arg}`: no such file ({})", full.display()),
                            ));
                        }
                        for m in matches {
                            self.read(&m, out)?;
                        }
                    }
                    "SET" => {
                        let Some((k, v)) = arg.split_once('=') else {
                            return Err(err(shown, line, format!("`@SET {arg}`: write `@SET NAME=value`")));
                        };
                        self.vars.insert(k.trim().to_string(), v.trim().to_string());
                    }
                    other => {
                        return Err(err(
                            shown,
                            line,
                            format!("unknown command `@{other}`: Fluent Bit's commands are `@INCLUDE` and `@SET`"),
                        ))
                    }
                }
                continue;
            }
            if t.starts_with('[') {
                let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else {
                    return Err(err(
                        shown,
                        line,
                        format!("`{t}`: a section header is `[NAME]`, with its `]`"),
                    ));
                };
                if let Some(s) = current.take() {
                    out.push(s);
                }
                let kind = name.trim().to_ascii_lowercase();
                if !matches!(
                    kind.as_str(),
                    "service"
                        | "input"
                        | "filter"
                        | "output"
                        | "parser"
                        | "multiline_parser"
                        | "upstream"
                        | "node"
                        | "plugins"
                        | "stream_task"
                ) {
                    return Err(err(
                        shown,
                        line,
                        format!("unknown section `[{name}]`: Fluent Bit's are SERVICE, INPUT, FILTER, OUTPUT, PARSER, MULTILINE_PARSER, UPSTREAM, NODE and PLUGINS"),
                    ));
                }
                current = Some(Section {
                    kind,
                    at: Origin {
                        file: shown.to_string(),
                        line,
                    },
                    entries: Vec::new(),
                });
                continue;
            }
            let Some(sec) = current.as_mut() else {
                return Err(err(
                    shown,
                    line,
                    format!("`{t}` is outside any section: put it under `[SERVICE]`, `[INPUT]`, `[FILTER]` or `[OUTPUT]`"),
                ));
            };
            let (k, v) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
            sec.entries.push(KeyLine {
                key: k.to_string(),
                value: self.expand(v.trim()),
                at: Origin {
                    file: shown.to_string(),
                    line,
                },
            });
        }
        if let Some(s) = current.take() {
            out.push(s);
        }
        Ok(())
    }
}

/// The files an `@INCLUDE` path names: itself, or with wildcards in its
/// last component (`inputs/*.conf`), the matching files in sorted order.
fn include_matches(full: &Path) -> Result<Vec<PathBuf>, String> {
    let name = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?', '[']) {
        return Ok(if full.exists() {
            vec![full.to_path_buf()]
        } else {
            Vec::new()
        });
    }
    let dir = full.parent().unwrap_or(Path::new("."));
    if dir.to_string_lossy().contains(['*', '?', '[']) {
        return Err("wildcards are read in the file name only (`dir/*.conf`)".into());
    }
    let m = globset::Glob::new(&name)
        .map_err(|e| format!("not a valid path pattern: {e}"))?
        .compile_matcher();
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| m.is_match(n)))
        .collect();
    out.sort();
    Ok(out)
}

/// Reads the configuration files (the main file first; parsers files
/// given here or by `Parsers_File`).
fn read_all(inputs: &[PathBuf]) -> Result<Vec<Section>, Vec<ReadError>> {
    let mut r = Reader {
        vars: BTreeMap::new(),
        total: 0,
        stack: Vec::new(),
    };
    let mut sections = Vec::new();
    let mut errors = Vec::new();
    for p in inputs {
        if let Err(e) = r.read(p, &mut sections) {
            errors.push(e);
        }
    }
    // Parsers files named by the service section, relative to the file
    // that names them.
    let named: Vec<PathBuf> = sections
        .iter()
        .filter(|s| s.kind == "service")
        .flat_map(|s| s.all("Parsers_File"))
        .map(|k| {
            let p = PathBuf::from(&k.value);
            if p.is_absolute() {
                p
            } else {
                Path::new(&k.at.file)
                    .parent()
                    .map(|d| d.join(&p))
                    .unwrap_or(p)
            }
        })
        .collect();
    for p in named {
        if inputs.iter().any(|i| same_path(i, &p)) {
            continue;
        }
        if !p.exists() {
            // Reported at conversion (the parsers it would hold are
            // missing); not fatal.
            continue;
        }
        if let Err(e) = r.read(&p, &mut sections) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(sections)
    } else {
        Err(errors)
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Fluent Bit's booleans.
fn on(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// Fluent Bit's sizes (`32k`, `5MB`) as bytes.
fn size(v: &str) -> Option<u64> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower.strip_suffix("kb").or_else(|| lower.strip_suffix('k'))
    {
        (n.to_string(), 1u64 << 10)
    } else if let Some(n) = lower.strip_suffix("mb").or_else(|| lower.strip_suffix('m')) {
        (n.to_string(), 1 << 20)
    } else if let Some(n) = lower.strip_suffix("gb").or_else(|| lower.strip_suffix('g')) {
        (n.to_string(), 1 << 30)
    } else {
        (lower.clone(), 1)
    };
    num.trim().parse::<u64>().ok().map(|n| n * mult)
}

/// Fluent Bit's tag globs: `*` matches anything, including dots.
fn tag_matches(pattern: &str, tag: &str) -> bool {
    fn m(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], t) || (!t.is_empty() && m(p, &t[1..])),
            (Some(a), Some(b)) if a == b => m(&p[1..], &t[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), tag.as_bytes())
}

/// Whether a filter or output applies to an input tagged `tag` (whose
/// `*`, in tail's tags, stands for the file's path).
fn routes(sec: &Section, tag: &str, report: &mut Report, component: &str) -> bool {
    let concrete = tag.replace('*', "var.log.app.log");
    if let Some(m) = sec.value("Match") {
        return tag_matches(m, tag) || tag_matches(m, &concrete);
    }
    if let Some(r) = sec.get("Match_Regex") {
        return match regex::Regex::new(&r.value) {
            Ok(re) => re.is_match(tag) || re.is_match(&concrete),
            Err(e) => {
                report.add(
                    &r.at,
                    component,
                    "Match_Regex",
                    Outcome::NotConverted,
                    format!("not a regex Petrel reads: {e}"),
                );
                false
            }
        };
    }
    false
}

/// A record key of Fluent Bit as Petrel's field: `log` is the message.
fn field(key: &str) -> String {
    match key {
        "log" => "message".to_string(),
        k => k.trim_start_matches('$').to_string(),
    }
}

/// A `[PARSER]`.
#[derive(Debug, Clone)]
struct ParserDef {
    format: String,
    regex: Option<String>,
    time_key: Option<String>,
    time_format: Option<String>,
    time_keep: bool,
    at: Origin,
}

fn parsers(sections: &[Section]) -> BTreeMap<String, ParserDef> {
    let mut out = BTreeMap::new();
    for s in sections.iter().filter(|s| s.kind == "parser") {
        let Some(name) = s.value("Name") else {
            continue;
        };
        out.insert(
            name.to_string(),
            ParserDef {
                format: s.value("Format").unwrap_or("").to_ascii_lowercase(),
                regex: s.value("Regex").map(str::to_string),
                time_key: s.value("Time_Key").map(str::to_string),
                time_format: s.value("Time_Format").map(str::to_string),
                time_keep: s.value("Time_Keep").and_then(on).unwrap_or(false),
                at: s.at.clone(),
            },
        );
    }
    out
}

/// Processors doing what parser `name` does to `key`.
fn parser_processors(
    name: &str,
    key: &str,
    id: &str,
    at: &Origin,
    what: &str,
    defs: &BTreeMap<String, ParserDef>,
    report: &mut Report,
) -> Vec<Component> {
    let Some(d) = defs.get(name) else {
        report.add(at, what, "Parser", Outcome::NotConverted, format!("parser `{name}` is not defined in the files read; give its parsers file as another input (or in `Parsers_File`)"));
        return Vec::new();
    };
    let mut out = Vec::new();
    let ctx = format!("{what} → [PARSER] {name} ({})", d.at);
    match d.format.as_str() {
        "regex" => {
            let Some(re) = &d.regex else {
                report.add(
                    &d.at,
                    &format!("[PARSER] {name}"),
                    "Regex",
                    Outcome::NotConverted,
                    "a regex parser without `Regex`",
                );
                return out;
            };
            let mut c = Component::new("parse_regex", id, at, &ctx);
            c.set("field", field(key));
            c.set("pattern", re.as_str());
            out.push(c);
            report.add(&d.at, &format!("[PARSER] {name}"), "Regex", Outcome::Approximated, "parse_regex with the same pattern (PCRE2 instead of Onigmo: the same named groups; Onigmo-only syntax would fail validation). A line that does not match keeps its record with a `parse_error` field, where Fluent Bit keeps it unchanged; the captured keys join the record and the line stays in `log`, where Fluent Bit keeps only the captures");
        }
        "json" => {
            let mut c = Component::new("parse_json", id, at, &ctx);
            c.set("field", field(key));
            out.push(c);
            report.add(
                &d.at,
                &format!("[PARSER] {name}"),
                "Format",
                Outcome::Approximated,
                "parse_json: the parsed keys join the record and the line stays in `log`, where Fluent Bit keeps only the parsed keys; drop `log` with a `fields` processor (`remove: [message]`) if it is not wanted",
            );
        }
        "logfmt" if cfg!(feature = "remap") => {
            let mut c = Component::new("remap", id, at, &ctx);
            let f = field(key);
            c.set(
                "source",
                format!(". = merge(., parse_logfmt(.{f}) ?? {{}})"),
            );
            out.push(c);
            report.add(
                &d.at,
                &format!("[PARSER] {name}"),
                "Format",
                Outcome::Converted,
                "remap with `parse_logfmt`",
            );
        }
        other => {
            report.add(
                &d.at,
                &format!("[PARSER] {name}"),
                "Format",
                Outcome::NotConverted,
                format!(
                    "format `{other}` has no Petrel parser yet; a `remap` program can parse it"
                ),
            );
            return out;
        }
    }
    if let (Some(tk), Some(tf)) = (&d.time_key, &d.time_format) {
        let mut c = Component::new(
            "parse_timestamp",
            &format!("{id}_time"),
            at,
            &format!("{ctx}: Time_Key/Time_Format"),
        );
        c.set("field", tk.as_str());
        c.set("format", time_format(tf));
        c.set("remove_field", !d.time_keep);
        out.push(c);
        report.add(
            &d.at,
            &format!("[PARSER] {name}"),
            "Time_Format",
            Outcome::Converted,
            "parse_timestamp (strftime patterns as Fluent Bit's strptime)",
        );
    }
    out
}

/// Fluent Bit's time format in Petrel's: `%L` (the fraction of a second,
/// Fluent Bit's own directive) is `%.f` after a dot, `%f` otherwise.
fn time_format(f: &str) -> String {
    f.replace(".%L", "%.f").replace("%L", "%f")
}

/// The keys of a section this converter has handled; the others are
/// reported as not converted.
struct Keys<'a> {
    sec: &'a Section,
    done: BTreeSet<String>,
}

impl<'a> Keys<'a> {
    fn new(sec: &'a Section) -> Self {
        let mut done = BTreeSet::new();
        done.insert("name".to_string());
        Keys { sec, done }
    }

    fn take(&mut self, key: &str) -> Option<&'a KeyLine> {
        self.done.insert(key.to_ascii_lowercase());
        self.sec.get(key)
    }

    fn take_all(&mut self, key: &str) -> Vec<&'a KeyLine> {
        self.done.insert(key.to_ascii_lowercase());
        self.sec.all(key)
    }

    /// Reports each key of `table` that the section has, as its row says
    /// (key, outcome, note).
    fn note(&mut self, component: &str, report: &mut Report, table: &[(&str, Outcome, &str)]) {
        for (k, o, note) in table {
            if let Some(e) = self.take(k) {
                report.add(&e.at, component, &e.key, *o, *note);
            }
        }
    }

    fn rest(&self, component: &str, report: &mut Report) {
        for e in &self.sec.entries {
            if !self.done.contains(&e.key.to_ascii_lowercase()) {
                report.add(&e.at, component, &e.key, Outcome::NotConverted, "a key this converter does not know for this plugin: check what it does and set the nearest Petrel key by hand");
            }
        }
    }
}

/// Converts the Fluent Bit configuration in `inputs`.
pub fn convert(inputs: &[PathBuf]) -> Result<Converted, Vec<ReadError>> {
    let sections = read_all(inputs)?;
    let mut report = Report::default();
    let mut c = Converted::default();
    let defs = parsers(&sections);
    for s in sections.iter().filter(|s| s.kind == "service") {
        service(s, &mut report, &mut c.run_flags);
    }
    for s in sections.iter().filter(|s| {
        matches!(
            s.kind.as_str(),
            "upstream" | "node" | "plugins" | "stream_task"
        )
    }) {
        report.add(&s.at, &format!("[{}]", s.kind.to_uppercase()), "", Outcome::NotConverted, "not used by Petrel: upstreams are a sink's list of endpoints, plugins are built in, stream processing is a `remap` program");
    }
    let filters: Vec<&Section> = sections.iter().filter(|s| s.kind == "filter").collect();
    let outputs: Vec<&Section> = sections.iter().filter(|s| s.kind == "output").collect();
    let mut used_filters = vec![false; filters.len()];
    let mut used_outputs = vec![false; outputs.len()];
    let mut names = BTreeSet::new();
    for (n, input) in sections.iter().filter(|s| s.kind == "input").enumerate() {
        let plugin = input.name();
        let component = format!("[INPUT] {plugin}");
        let id = format!("{}_{n}", plugin.replace(['-', '.'], "_"));
        let tag = input
            .value("Tag")
            .map(str::to_string)
            .unwrap_or_else(|| format!("{plugin}.{n}"));
        let mut name = input
            .value("Alias")
            .map(str::to_string)
            .unwrap_or_else(|| id.clone());
        name = name
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        while !names.insert(name.clone()) {
            name.push('_');
        }
        let mut p = Pipeline {
            name,
            header: vec![format!(
                "Converted by `petrel convert --from fluent-bit` from {component} at {} (Tag {tag}).",
                input.at
            )],
            ..Pipeline::default()
        };
        // A kubernetes filter on this input's tag makes it Petrel's
        // kubernetes source, which reads the container logs with their
        // metadata.
        let k8s = filters.iter().position(|f| {
            f.name() == "kubernetes" && routes(f, &tag, &mut report, "[FILTER] kubernetes")
        });
        let Some(source) = source(
            input,
            &plugin,
            &id,
            &component,
            k8s.map(|i| filters[i]),
            &defs,
            &mut report,
            &mut p,
        ) else {
            continue;
        };
        p.sources.push(source);
        for (i, f) in filters.iter().enumerate() {
            let fname = f.name();
            let fcomp = format!("[FILTER] {fname}");
            if !routes(f, &tag, &mut report, &fcomp) {
                continue;
            }
            let first = !used_filters[i];
            used_filters[i] = true;
            let mut r = Report::default();
            filter(f, &fname, &format!("{fname}_{i}"), &defs, &mut r, &mut p);
            // Each filter is reported once, however many inputs it
            // applies to.
            if first {
                report.entries.extend(r.entries);
            }
        }
        for (i, o) in outputs.iter().enumerate() {
            let oname = o.name();
            let ocomp = format!("[OUTPUT] {oname}");
            if !routes(o, &tag, &mut report, &ocomp) {
                continue;
            }
            let first = !used_outputs[i];
            used_outputs[i] = true;
            let mut r = Report::default();
            if let Some(s) = output(
                o,
                &oname,
                &format!("{}_{i}", oname.replace(['-', '.'], "_")),
                &mut r,
            ) {
                p.sinks.push(s);
            }
            if first {
                report.entries.extend(r.entries);
            }
        }
        if p.sinks.is_empty() {
            report.add(&input.at, &component, "Tag", Outcome::NotConverted, format!("no output matches tag `{tag}`: Fluent Bit drops these records; the pipeline is left out (a Petrel pipeline needs a sink)"));
            continue;
        }
        c.pipelines.push(p);
    }
    for (i, f) in filters.iter().enumerate() {
        if !used_filters[i] {
            report.add(
                &f.at,
                &format!("[FILTER] {}", f.name()),
                "Match",
                Outcome::Converted,
                "matches no input's tag: nothing to convert (Fluent Bit never runs it either)",
            );
        }
    }
    for (i, o) in outputs.iter().enumerate() {
        if !used_outputs[i] {
            report.add(&o.at, &format!("[OUTPUT] {}", o.name()), "Match", Outcome::Converted, "matches no input's tag: nothing to convert (Fluent Bit sends nothing there either)");
        }
    }
    report.entries.sort_by(|a, b| a.at.cmp(&b.at));
    c.report = report;
    Ok(c)
}

fn service(s: &Section, report: &mut Report, flags: &mut Vec<String>) {
    let comp = "[SERVICE]";
    for e in &s.entries {
        let k = e.key.to_ascii_lowercase();
        let (outcome, note): (Outcome, String) = match k.as_str() {
            "flush" => (Outcome::Approximated, "sinks send when their batch is full or after its `timeout_ms` (1 s by default for most), not on one agent-wide flush timer".into()),
            "daemon" => (Outcome::Converted, "Petrel runs in the foreground under systemd or as a container; no daemon mode is needed".into()),
            "log_level" => {
                let level = match e.value.to_ascii_lowercase().as_str() {
                    "off" | "error" => "error",
                    "warn" | "warning" => "warn",
                    "debug" => "debug",
                    "trace" => "trace",
                    _ => "info",
                };
                flags.push(format!("--log-level {level}"));
                (Outcome::Converted, format!("`--log-level {level}`"))
            }
            "log_file" => (Outcome::Approximated, "Petrel logs to standard error (the journal or the container log)".into()),
            "parsers_file" => (Outcome::Converted, if Path::new(&e.value).is_absolute() || Path::new(&e.at.file).parent().is_some_and(|d| d.join(&e.value).exists()) { "read: its parsers are converted where used".into() } else { "not found beside the configuration: give it as another input".into() }),
            "plugins_file" | "streams_file" => (Outcome::NotConverted, "Petrel's plugins are built in, and stream processing is a `remap` program".into()),
            "http_server" | "http_monitor" => (Outcome::Converted, "Petrel's API (`/metrics`, `/health`) is always served at `--api-addr`".into()),
            "http_listen" | "http_port" => {
                if k == "http_port" {
                    let host = s.value("HTTP_Listen").unwrap_or("0.0.0.0");
                    flags.push(format!("--api-addr {host}:{}", e.value));
                }
                (Outcome::Converted, "`--api-addr`".into())
            }
            "health_check" | "hc_errors_count" | "hc_retry_failure_count" | "hc_period" => (Outcome::Approximated, "`/health` reports each component's state; its thresholds are `--unhealthy-after`".into()),
            "storage.path" | "storage.sync" | "storage.checksum" | "storage.backlog.mem_limit" | "storage.metrics" | "storage.max_chunks_up" => (Outcome::Approximated, "Petrel keeps file positions until the sinks confirm delivery, so nothing read is lost without a storage layer; a sink's `buffer: {type: disk}` holds data across a long outage".into()),
            "grace" => (Outcome::Approximated, "Petrel drains in-flight data on SIGTERM within its stop deadline".into()),
            "coro_stack_size" | "scheduler.base" | "scheduler.cap" => (Outcome::Converted, "not needed by Petrel".into()),
            _ => (Outcome::NotConverted, "a service key this converter does not know".into()),
        };
        report.add(&e.at, comp, &e.key, outcome, note);
    }
}

#[allow(clippy::too_many_arguments)]
fn source(
    s: &Section,
    plugin: &str,
    id: &str,
    comp: &str,
    k8s: Option<&Section>,
    defs: &BTreeMap<String, ParserDef>,
    report: &mut Report,
    p: &mut Pipeline,
) -> Option<Component> {
    let mut keys = Keys::new(s);
    keys.note(
        comp,
        report,
        &[
            ("Tag", Outcome::Converted, "routing: this input is its own pipeline, with the filters and outputs that match its tag"),
            ("Alias", Outcome::Converted, "the pipeline's name"),
            ("Mem_Buf_Limit", Outcome::Approximated, "Petrel bounds memory agent-wide (`--memory-limit`), pausing the sources that are ahead instead of one input"),
            ("storage.type", Outcome::Approximated, "positions are committed only after delivery: nothing read is lost on a crash without filesystem buffering"),
            ("Threaded", Outcome::Converted, "Petrel reads every file source on one input thread and processes on a shared pool"),
            ("Log_Level", Outcome::Approximated, "Petrel has one log level, `--log-level`"),
        ],
    );
    let c = match plugin {
        "tail" => tail(s, &mut keys, id, comp, k8s, defs, report, p),
        "systemd" => {
            let mut c = Component::new("journald", id, &s.at, comp);
            if let Some(e) = keys.take("Path") {
                c.set("directory", e.value.as_str());
                report.add(&e.at, comp, &e.key, Outcome::Converted, "directory");
            }
            let mut matches: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for e in keys.take_all("Systemd_Filter") {
                match e.value.split_once('=') {
                    Some((f, v)) => {
                        matches
                            .entry(f.to_string())
                            .or_default()
                            .push(v.to_string());
                        report.add(&e.at, comp, &e.key, Outcome::Converted, "include_matches");
                    }
                    None => report.add(
                        &e.at,
                        comp,
                        &e.key,
                        Outcome::NotConverted,
                        "not `FIELD=value`",
                    ),
                }
            }
            if let Some(e) = keys.take("Systemd_Filter_Type") {
                report.add(
                    &e.at,
                    comp,
                    &e.key,
                    if e.value.eq_ignore_ascii_case("or") {
                        Outcome::Approximated
                    } else {
                        Outcome::Converted
                    },
                    "Petrel ORs values of one field and ANDs fields, as journalctl",
                );
            }
            if !matches.is_empty() {
                c.set("include_matches", json!(matches));
            }
            let tail = keys
                .take("Read_From_Tail")
                .map(|e| on(&e.value).unwrap_or(false))
                .unwrap_or(false);
            c.set("since_now", tail);
            keys.note(
                comp,
                report,
                &[
                    ("DB", Outcome::Approximated, "Petrel keeps its journal cursor in its data dir"),
                    ("DB.Sync", Outcome::Converted, "Petrel's journal cursor is written atomically and synced with its checkpoints"),
                    ("Max_Fields", Outcome::Converted, "bounded by `max_entry_bytes` and the memory limit"),
                    ("Max_Entries", Outcome::Converted, "bounded by `max_entry_bytes` and the memory limit"),
                    ("Strip_Underscores", Outcome::NotConverted, "Petrel keeps the journal's field names; rename with the `fields` processor"),
                    ("Lowercase", Outcome::NotConverted, "Petrel keeps the journal's field names; rename with the `fields` processor"),
                ],
            );
            Some(c)
        }
        "tcp" | "forward" | "http" | "syslog" => {
            let listen = keys
                .take("Listen")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| "0.0.0.0".into());
            let default_port = match plugin {
                "forward" => "24224",
                "http" => "9880",
                "syslog" => "5140",
                _ => "5170",
            };
            let port = keys
                .take("Port")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| default_port.into());
            let type_ = match plugin {
                "forward" => "fluent",
                other => other,
            };
            let mut c = Component::new(type_, id, &s.at, comp);
            c.set("address", format!("{listen}:{port}"));
            report.add(
                &s.at,
                comp,
                "",
                Outcome::Converted,
                format!("the `{type_}` source on {listen}:{port}"),
            );
            if plugin == "syslog" {
                let mode = keys
                    .take("Mode")
                    .map(|e| e.value.to_ascii_lowercase())
                    .unwrap_or_else(|| "unix_udp".into());
                let m = match mode.as_str() {
                    "tcp" => "tcp",
                    "udp" => "udp",
                    "unix_tcp" => "unix_stream",
                    _ => "unix_datagram",
                };
                c.set("mode", m);
                if m.starts_with("unix") {
                    let path = keys
                        .take("Path")
                        .map(|e| e.value.clone())
                        .unwrap_or_default();
                    c.set("address", path);
                }
                if let Some(e) = keys.take("Parser") {
                    let f = match e.value.as_str() {
                        "syslog-rfc5424" => "rfc5424",
                        "syslog-rfc3164" | "syslog-rfc3164-local" => "rfc3164",
                        _ => "auto",
                    };
                    c.set("format", f);
                    report.add(
                        &e.at,
                        comp,
                        &e.key,
                        Outcome::Converted,
                        format!("format: {f}"),
                    );
                }
            }
            if plugin == "tcp" {
                if let Some(e) = keys.take("Format") {
                    if e.value.eq_ignore_ascii_case("json") {
                        let mut j = Component::new(
                            "parse_json",
                            &format!("{id}_json"),
                            &e.at,
                            &format!("{comp} Format json"),
                        );
                        j.set("field", "message");
                        p.processors.push(j);
                    }
                    report.add(
                        &e.at,
                        comp,
                        &e.key,
                        Outcome::Converted,
                        "lines parsed by parse_json when `json`",
                    );
                }
            }
            for k in [
                "Buffer",
                "Buffer_Chunk_Size",
                "Buffer_Max_Size",
                "Chunk_Size",
            ] {
                if let Some(e) = keys.take(k) {
                    report.add(&e.at, comp, &e.key, Outcome::Approximated, "Petrel bounds an entry by `max_entry_bytes`/`max_message_bytes` and the connections by the memory limit");
                }
            }
            if let Some(e) = keys.take("Buffer_Size") {
                report.add(
                    &e.at,
                    comp,
                    &e.key,
                    Outcome::Approximated,
                    "Petrel bounds a message by `max_message_bytes` (and the memory limit)",
                );
            }
            Some(c)
        }
        "stdin" => Some(Component::new("stdin", id, &s.at, comp)),
        "kmsg" => Some(Component::new("kernel", id, &s.at, comp)),
        _ => {
            report.add(
                &s.at,
                comp,
                "",
                Outcome::NotConverted,
                format!(
                    "Petrel has no source like Fluent Bit's `{plugin}`{}",
                    match plugin {
                        "cpu"
                        | "mem"
                        | "disk"
                        | "netif"
                        | "proc"
                        | "node_exporter_metrics"
                        | "prometheus_scrape"
                        | "fluentbit_metrics" => ": it is a metrics input; Petrel collects logs",
                        "dummy" => ": use `petrel gen` for test data",
                        "kafka" => ": use the `kafka` source",
                        "opentelemetry" => ": use the `opentelemetry` source",
                        _ => "",
                    }
                ),
            );
            return None;
        }
    };
    keys.rest(comp, report);
    c
}

#[allow(clippy::too_many_arguments)]
fn tail(
    s: &Section,
    keys: &mut Keys<'_>,
    id: &str,
    comp: &str,
    k8s: Option<&Section>,
    defs: &BTreeMap<String, ParserDef>,
    report: &mut Report,
    p: &mut Pipeline,
) -> Option<Component> {
    let Some(path) = keys.take("Path") else {
        report.add(
            &s.at,
            comp,
            "Path",
            Outcome::NotConverted,
            "tail without `Path` reads nothing",
        );
        return None;
    };
    let globs: Vec<String> = path
        .value
        .split(',')
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
        .collect();
    let containers = globs.iter().all(|g| g.starts_with("/var/log/containers/"));
    let ml: Vec<String> = keys
        .take("multiline.parser")
        .map(|e| {
            e.value
                .split(',')
                .map(|v| v.trim().to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default();
    let cri_or_docker = ml.iter().any(|m| m == "cri" || m == "docker");
    let mut c;
    if containers && (k8s.is_some() || cri_or_docker) {
        c = Component::new("kubernetes_logs", id, &s.at, comp);
        report.add(&path.at, comp, &path.key, Outcome::Converted, "the `kubernetes_logs` source: container logs decoded (CRI and Docker, partial lines joined) with the pod's metadata");
        if let Some(e) = s.get("multiline.parser") {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                "CRI and Docker log formats are decoded by the `kubernetes_logs` source",
            );
        }
        if let Some(f) = k8s {
            c.set("api", true);
            kubernetes_filter(f, &mut c, report, p);
        }
        let pods: Vec<&String> = globs
            .iter()
            .filter(|g| g.as_str() != "/var/log/containers/*.log")
            .collect();
        if !pods.is_empty() {
            report.add(&path.at, comp, &path.key, Outcome::Approximated, format!("`kubernetes_logs` reads every container; the narrower paths {pods:?} need its `include: {{namespaces, pods, containers}}` written by hand"));
        }
    } else {
        c = Component::new("file", id, &s.at, comp);
        c.set("include", globs.clone());
        report.add(&path.at, comp, &path.key, Outcome::Converted, "include");
        if !ml.is_empty() {
            report.add(&s.get("multiline.parser").map(|e| e.at.clone()).unwrap_or_else(|| s.at.clone()), comp, "multiline.parser", Outcome::NotConverted, format!("multiline parsers {ml:?} on plain files: set the file source's `multiline` (start_pattern, or `mode: timestamp`) by hand"));
        }
        if let Some(f) = k8s {
            report.add(&f.at, "[FILTER] kubernetes", "", Outcome::NotConverted, "applies to a tail input that does not read /var/log/containers: the metadata comes from the container log path; use the `kubernetes_logs` source");
        }
    }
    if let Some(e) = keys.take("Exclude_Path") {
        let ex: Vec<String> = e.value.split(',').map(|g| g.trim().to_string()).collect();
        if c.get("type") == Some(&Value::from("file")) {
            c.set("exclude", ex);
            report.add(&e.at, comp, &e.key, Outcome::Converted, "exclude");
        } else {
            report.add(&e.at, comp, &e.key, Outcome::Approximated, "write the containers to leave out as `kubernetes_logs`' `exclude: {namespaces, pods, containers}`");
        }
    }
    let head = keys.take("Read_from_Head");
    let from_head = head.and_then(|e| on(&e.value)).unwrap_or(false);
    c.set("read_from", if from_head { "beginning" } else { "end" });
    report.add(
        &head.map(|e| e.at.clone()).unwrap_or_else(|| s.at.clone()),
        comp,
        "Read_from_Head",
        Outcome::Converted,
        if from_head { "read_from: beginning" } else { "read_from: end (Fluent Bit's default, made explicit: Petrel's file source also starts new files at their end on its first start)" },
    );
    if let Some(e) = keys.take("DB") {
        report.add(&e.at, comp, &e.key, Outcome::Approximated, format!("Petrel keeps its positions in its data dir: to start where Fluent Bit stopped, run `petrel convert --import-positions {} --data-dir DIR --config PIPELINES` with both agents stopped (without it, the first start reads per `read_from`)", e.value));
    }
    for k in [
        "DB.sync",
        "DB.locking",
        "DB.journal_mode",
        "DB.compare_filename",
    ] {
        if let Some(e) = keys.take(k) {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                "Petrel's checkpoints are written atomically and synced",
            );
        }
    }
    if let Some(e) = keys.take("Buffer_Max_Size") {
        match size(&e.value) {
            Some(n) if c.get("type") == Some(&Value::from("file")) => {
                c.set("max_line_bytes", n);
                report.add(&e.at, comp, &e.key, Outcome::Approximated, "max_line_bytes: a longer line is split into events of this size (and counted) where Fluent Bit skips it or stops the file");
            }
            _ => report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Approximated,
                "Petrel's default line bound (1 MiB) applies",
            ),
        }
    }
    keys.note(
        comp,
        report,
        &[
            ("Buffer_Chunk_Size", Outcome::Converted, "Petrel sizes its reads itself (`read_block_bytes`)"),
            ("Skip_Long_Lines", Outcome::Approximated, "a line longer than `max_line_bytes` is split into pieces and counted (`line_too_long`), not skipped"),
            ("Skip_Empty_Lines", Outcome::NotConverted, "empty lines are events in Petrel; drop them with `filter: {exclude: {message: \"^$\"}}`"),
            ("Refresh_Interval", Outcome::Converted, "Petrel watches with inotify and rescans every 10 s"),
            ("Rotate_Wait", Outcome::Approximated, "a rotated file is read to its end and closed after 5 s idle"),
            ("Inotify_Watcher", Outcome::Converted, "Petrel watches with inotify and rescans every 10 s"),
            ("Watcher_Interval", Outcome::Converted, "Petrel watches with inotify and rescans every 10 s"),
            ("Progress_Check_Interval", Outcome::Converted, "Petrel watches with inotify and rescans every 10 s"),
            ("Exit_On_Eof", Outcome::NotConverted, "use the `stdin` source for one-shot reads"),
            ("File_Cache_Advise", Outcome::Converted, "not needed"),
        ],
    );
    if let Some(e) = keys.take("Ignore_Older") {
        if c.get("type") == Some(&Value::from("file")) {
            c.set("ignore_older", e.value.as_str());
            report.add(&e.at, comp, &e.key, Outcome::Converted, "ignore_older");
        } else {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::NotConverted,
                "`kubernetes_logs` has no ignore_older",
            );
        }
    }
    keys.note(
        comp,
        report,
        &[
            (
                "Path_Key",
                Outcome::Approximated,
                "the path is always the `file` field (its name in the fluent-bit layout: `file`)",
            ),
            (
                "Offset_Key",
                Outcome::NotConverted,
                "not available in Petrel",
            ),
            (
                "Key",
                Outcome::Approximated,
                "the line is the `message` field, written as `log` in the fluent-bit layout",
            ),
            (
                "Tag_Regex",
                Outcome::NotConverted,
                "not available in Petrel",
            ),
            (
                "Docker_Mode",
                Outcome::Approximated,
                "Docker's split lines are joined by the `kubernetes_logs` source",
            ),
            (
                "Docker_Mode_Flush",
                Outcome::Approximated,
                "Docker's split lines are joined by the `kubernetes_logs` source",
            ),
            (
                "Docker_Mode_Parser",
                Outcome::Approximated,
                "Docker's split lines are joined by the `kubernetes_logs` source",
            ),
            (
                "Multiline",
                Outcome::NotConverted,
                "set the file source's `multiline: {start_pattern: ...}` with the first-line regex",
            ),
            (
                "Multiline_Flush",
                Outcome::NotConverted,
                "set the file source's `multiline: {start_pattern: ...}` with the first-line regex",
            ),
            (
                "Parser_Firstline",
                Outcome::NotConverted,
                "set the file source's `multiline: {start_pattern: ...}` with the first-line regex",
            ),
            (
                "multiline.key_content",
                Outcome::NotConverted,
                "set the file source's `multiline: {start_pattern: ...}` with the first-line regex",
            ),
        ],
    );
    let container_source = c.get("type") == Some(&Value::from("kubernetes_logs"));
    if let Some(e) = keys.take("Parser").filter(|e| {
        // The container runtimes' formats are decoded by the
        // `kubernetes_logs` source itself.
        let decoded = container_source
            && matches!(
                e.value.to_ascii_lowercase().as_str(),
                "docker" | "cri" | "containerd" | "docker-daemon"
            );
        if decoded {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                "the container log format is decoded by the `kubernetes_logs` source",
            );
        }
        !decoded
    }) {
        let procs = parser_processors(
            &e.value,
            "log",
            &format!("{id}_parser"),
            &e.at,
            comp,
            defs,
            report,
        );
        if !procs.is_empty() {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                "processors after the source",
            );
        }
        p.processors.extend(procs);
    }
    Some(c)
}

fn kubernetes_filter(f: &Section, c: &mut Component, report: &mut Report, p: &mut Pipeline) {
    let comp = "[FILTER] kubernetes";
    report.add(&f.at, comp, "", Outcome::Converted, "the `kubernetes_logs` source with `api: true` (pod, namespace and owner metadata from the API server)");
    for e in &f.entries {
        let k = e.key.to_ascii_lowercase();
        let (o, note): (Outcome, String) = match k.as_str() {
            "name" | "match" | "match_regex" | "alias" => continue,
            "kube_url" | "kube_ca_file" | "kube_token_file" | "kube_ca_path" => (Outcome::Converted, "the in-cluster service account, as Fluent Bit's defaults (`kubeconfig` for another cluster)".into()),
            "kube_tag_prefix" | "regex_parser" => (Outcome::Converted, "the pod, namespace and container come from the log path".into()),
            "merge_log" => {
                if on(&e.value) == Some(true) {
                    let mut j = Component::new("parse_json", "merge_log", &e.at, "[FILTER] kubernetes Merge_Log");
                    j.set("field", "message");
                    p.processors.insert(0, j);
                    (Outcome::Approximated, "parse_json on the message: a JSON line's keys join the record; a line that is not JSON gets a `parse_error` field, where Fluent Bit leaves it as it is".into())
                } else {
                    (Outcome::Converted, "off".into())
                }
            }
            "merge_log_key" => (Outcome::NotConverted, "the parsed keys go to the top of the record; move them with the `fields` processor".into()),
            "keep_log" => (Outcome::Approximated, "the message is kept".into()),
            "labels" => (if on(&e.value) == Some(false) { Outcome::Approximated } else { Outcome::Converted }, "pod labels are always added".into()),
            "annotations" => {
                if on(&e.value) != Some(false) {
                    (Outcome::Approximated, "Fluent Bit copies every annotation; Petrel copies the keys listed in `annotation_fields` (add the ones you use)".into())
                } else {
                    (Outcome::Converted, "no annotations".into())
                }
            }
            "k8s-logging.parser" | "k8s-logging.exclude" => (Outcome::NotConverted, "per-pod parsers and exclusion by annotation are not in this version".into()),
            "buffer_size" | "use_kubelet" | "kubelet_port" | "cache_use_docker_id" | "kube_meta_cache_ttl" | "kube_token_ttl" => (Outcome::Converted, "Petrel watches the API server and keeps its own cache".into()),
            _ => (Outcome::NotConverted, "a kubernetes filter key this converter does not know".into()),
        };
        report.add(&e.at, comp, &e.key, o, note);
    }
    let _ = c;
}

fn filter(
    f: &Section,
    plugin: &str,
    id: &str,
    defs: &BTreeMap<String, ParserDef>,
    report: &mut Report,
    p: &mut Pipeline,
) {
    let comp = format!("[FILTER] {plugin}");
    let mut keys = Keys::new(f);
    keys.take("Match");
    keys.take("Match_Regex");
    keys.take("Alias");
    match plugin {
        "kubernetes" => return, // turned into the source
        "grep" => {
            let mut c = Component::new("filter", id, &f.at, &comp);
            let mut include = serde_json::Map::new();
            let mut exclude = serde_json::Map::new();
            for (k, map) in [("Regex", &mut include), ("Exclude", &mut exclude)] {
                for e in keys.take_all(k) {
                    match e.value.split_once(char::is_whitespace) {
                        Some((key, re)) if !key.starts_with("$") || !key.contains('[') => {
                            map.insert(field(key), Value::from(re.trim()));
                            report.add(&e.at, &comp, &e.key, Outcome::Converted, format!("{} {}", if k == "Regex" { "include" } else { "exclude" }, field(key)));
                        }
                        _ => report.add(&e.at, &comp, &e.key, Outcome::NotConverted, "a record accessor with brackets (`$a['b']`): write the field's dotted name by hand"),
                    }
                }
            }
            if let Some(e) = keys.take("Logical_Op") {
                report.add(&e.at, &comp, &e.key, if e.value.eq_ignore_ascii_case("and") || e.value.eq_ignore_ascii_case("legacy") { Outcome::Converted } else { Outcome::NotConverted }, "Petrel's `include` needs every regex to match, `exclude` drops on any: `or` needs a `vrl` condition");
            }
            if !include.is_empty() {
                c.set("include", Value::Object(include));
            }
            if !exclude.is_empty() {
                c.set("exclude", Value::Object(exclude));
            }
            if c.get("include").is_some() || c.get("exclude").is_some() {
                p.processors.push(c);
            }
        }
        "modify" | "record_modifier" => {
            let mut add = serde_json::Map::new();
            let mut remove = Vec::new();
            let mut rename = serde_json::Map::new();
            let mut copy = serde_json::Map::new();
            for e in &f.entries {
                let k = e.key.to_ascii_lowercase();
                if matches!(k.as_str(), "name" | "match" | "match_regex" | "alias") {
                    continue;
                }
                let mut two = e.value.splitn(2, char::is_whitespace);
                let a = two.next().unwrap_or("").trim();
                let b = two.next().unwrap_or("").trim();
                let (o, note) = match k.as_str() {
                    "set" | "record" => {
                        add.insert(field(a), Value::from(b));
                        (Outcome::Converted, "fields add".to_string())
                    }
                    "add" => {
                        add.insert(field(a), Value::from(b));
                        (Outcome::Approximated, "fields add: sets the field even when it exists, where `Add` keeps an existing value".to_string())
                    }
                    "remove" | "remove_key" => {
                        remove.push(Value::from(field(a)));
                        (Outcome::Converted, "fields remove".to_string())
                    }
                    "rename" | "hard_rename" => {
                        rename.insert(field(a), Value::from(field(b)));
                        (
                            if k == "rename" {
                                Outcome::Approximated
                            } else {
                                Outcome::Converted
                            },
                            "fields rename (overwrites an existing target, as `Hard_rename`)"
                                .to_string(),
                        )
                    }
                    "copy" | "hard_copy" => {
                        copy.insert(field(a), Value::from(field(b)));
                        (
                            if k == "copy" {
                                Outcome::Approximated
                            } else {
                                Outcome::Converted
                            },
                            "fields copy (overwrites an existing target, as `Hard_copy`)"
                                .to_string(),
                        )
                    }
                    _ => (
                        Outcome::NotConverted,
                        "wildcards, conditions and allowlists need a `remap` program".to_string(),
                    ),
                };
                report.add(&e.at, &comp, &e.key, o, note);
            }
            let mut c = Component::new("fields", id, &f.at, &comp);
            let mut any = false;
            for (k, v) in [
                ("add", Value::Object(add)),
                ("rename", Value::Object(rename)),
                ("copy", Value::Object(copy)),
                ("remove", Value::Array(remove)),
            ] {
                let empty = match &v {
                    Value::Object(m) => m.is_empty(),
                    Value::Array(a) => a.is_empty(),
                    _ => true,
                };
                if !empty {
                    c.set(k, v);
                    any = true;
                }
            }
            if any {
                p.processors.push(c);
            }
            return;
        }
        "parser" => {
            let key = keys
                .take("Key_Name")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| "log".into());
            for e in keys.take_all("Parser") {
                let procs = parser_processors(
                    &e.value,
                    &key,
                    &format!(
                        "{id}_{}",
                        e.value.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
                    ),
                    &e.at,
                    &comp,
                    defs,
                    report,
                );
                if !procs.is_empty() {
                    report.add(
                        &e.at,
                        &comp,
                        &e.key,
                        Outcome::Converted,
                        format!("parses `{}`", field(&key)),
                    );
                }
                p.processors.extend(procs);
            }
            for k in ["Reserve_Data", "Preserve_Key", "Unescape_Key"] {
                if let Some(e) = keys.take(k) {
                    report.add(
                        &e.at,
                        &comp,
                        &e.key,
                        Outcome::Approximated,
                        "Petrel's parse processors keep the other fields and the parsed one",
                    );
                }
            }
        }
        _ => {
            report.add(&f.at, &comp, "", Outcome::NotConverted, match plugin {
                "lua" | "wasm" => "write the script as a `remap` (VRL) program".to_string(),
                "nest" | "rewrite_tag" | "multiline" => "not in this version: a `remap` program can restructure records; multiline belongs on the source (`multiline`)".to_string(),
                "throttle" => "use the `throttle` processor (a rate per window)".to_string(),
                _ => format!("Petrel has no processor like `{plugin}`"),
            });
            return;
        }
    }
    keys.rest(&comp, report);
}

/// `http(s)://host:port` of an output's `Host`, `Port` and `tls`.
fn base_url(o: &Section, keys: &mut Keys<'_>, default_port: &str) -> String {
    let host = keys
        .take("Host")
        .map(|e| e.value.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = keys
        .take("Port")
        .map(|e| e.value.clone())
        .unwrap_or_else(|| default_port.into());
    let tls = keys.take("tls").and_then(|e| on(&e.value)).unwrap_or(false);
    let _ = o;
    format!("{}://{host}:{port}", if tls { "https" } else { "http" })
}

/// `HTTP_User` and `HTTP_Passwd` as the sink's basic `auth`.
fn basic_auth(keys: &mut Keys<'_>, c: &mut Component, comp: &str, report: &mut Report) {
    if let (Some(u), Some(pw)) = (keys.take("HTTP_User"), keys.take("HTTP_Passwd")) {
        c.set(
            "auth",
            json!({"strategy": "basic", "user": u.value, "password": pw.value}),
        );
        for e in [u, pw] {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                "auth: {strategy: basic}",
            );
        }
    }
}

fn tls_keys(keys: &mut Keys<'_>, c: &mut Component, comp: &str, report: &mut Report) {
    let mut tls = serde_json::Map::new();
    for (k, petrel) in [
        ("tls.ca_file", "ca_file"),
        ("tls.crt_file", "cert_file"),
        ("tls.key_file", "key_file"),
    ] {
        if let Some(e) = keys.take(k) {
            tls.insert(petrel.into(), Value::from(e.value.as_str()));
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::Converted,
                format!("tls.{petrel}"),
            );
        }
    }
    if let Some(e) = keys.take("tls.verify") {
        if on(&e.value) == Some(false) {
            tls.insert("verify".into(), Value::from(false));
        }
        report.add(&e.at, comp, &e.key, Outcome::Converted, "tls.verify");
    }
    for k in ["tls.debug", "tls.vhost", "tls.ca_path", "tls.key_passwd"] {
        if let Some(e) = keys.take(k) {
            report.add(
                &e.at,
                comp,
                &e.key,
                Outcome::NotConverted,
                "no Petrel equivalent",
            );
        }
    }
    if !tls.is_empty() {
        c.set("tls", Value::Object(tls));
    }
}

fn output(o: &Section, plugin: &str, id: &str, report: &mut Report) -> Option<Component> {
    let comp = format!("[OUTPUT] {plugin}");
    let mut keys = Keys::new(o);
    keys.take("Match");
    keys.take("Match_Regex");
    keys.take("Alias");
    keys.note(
        &comp,
        report,
        &[
            ("Retry_Limit", Outcome::Approximated, "Petrel retries until delivered (`retry` bounds it on request/response sinks); a record is never dropped for retries"),
            ("Workers", Outcome::Converted, "requests in flight are sized by the congestion window"),
            ("storage.total_limit_size", Outcome::Approximated, "a sink's `buffer: {type: disk, max_bytes}`"),
            ("net.keepalive", Outcome::Converted, "Petrel's connection handling"),
            ("net.connect_timeout", Outcome::Converted, "Petrel's connection handling"),
        ],
    );
    let mut c = match plugin {
        "es" | "elasticsearch" | "opensearch" => {
            let mut c = Component::new("elasticsearch", id, &o.at, &comp);
            // The elasticsearch sink's `id` is the document id; the
            // component's is `component_id`.
            c.keys[1].0 = "component_id".into();
            let url = base_url(o, &mut keys, "9200");
            let path = keys
                .take("Path")
                .map(|e| e.value.clone())
                .unwrap_or_default();
            c.set("endpoints", vec![format!("{url}{path}")]);
            let logstash = keys
                .take("Logstash_Format")
                .and_then(|e| on(&e.value))
                .unwrap_or(false);
            let index = if logstash {
                let prefix = keys
                    .take("Logstash_Prefix")
                    .map(|e| e.value.clone())
                    .unwrap_or_else(|| "logstash".into());
                let df = keys
                    .take("Logstash_DateFormat")
                    .map(|e| e.value.clone())
                    .unwrap_or_else(|| "%Y.%m.%d".into());
                format!("{prefix}-{df}")
            } else {
                keys.take("Index")
                    .map(|e| e.value.clone())
                    .unwrap_or_else(|| "fluent-bit".into())
            };
            c.set("index", index);
            c.set("mode", "index");
            basic_auth(&mut keys, &mut c, &comp, report);
            for k in [
                "Suppress_Type_Name",
                "Type",
                "Replace_Dots",
                "Generate_ID",
                "Trace_Output",
                "Trace_Error",
                "Buffer_Size",
                "Include_Tag_Key",
                "Tag_Key",
                "Time_Key",
                "Time_Key_Format",
                "Current_Time_Index",
                "Logstash_Prefix_Key",
                "Pipeline",
                "Cloud_ID",
                "Cloud_Auth",
                "AWS_Auth",
                "AWS_Region",
                "compress",
            ] {
                if let Some(e) = keys.take(k) {
                    let (oc, note): (Outcome, String) = match k {
                        "Suppress_Type_Name" | "Type" => (Outcome::Converted, "Petrel sends no mapping type".into()),
                        "Pipeline" => {
                            c.set("pipeline", e.value.as_str());
                            (Outcome::Converted, "pipeline".into())
                        }
                        "compress" => {
                            c.set("compression", if e.value.eq_ignore_ascii_case("gzip") { "gzip" } else { "none" });
                            (Outcome::Converted, "compression".into())
                        }
                        "Generate_ID" => (Outcome::Approximated, "Petrel derives document ids from the source position, so a retry after a crash does not duplicate (`mode: create`)".into()),
                        "Buffer_Size" | "Trace_Output" | "Trace_Error" => (Outcome::Converted, "not needed".into()),
                        "Time_Key" | "Time_Key_Format" => (Outcome::Approximated, "the time is written as `@timestamp` by the sink's `timestamp_key`".into()),
                        "Replace_Dots" => (Outcome::Approximated, "the fluent-bit layout nests dotted names".into()),
                        _ => (Outcome::NotConverted, "no Petrel equivalent in this version".into()),
                    };
                    report.add(&e.at, &comp, &e.key, oc, note);
                }
            }
            tls_keys(&mut keys, &mut c, &comp, report);
            c.set("timestamp_key", "@timestamp");
            report.add(&o.at, &comp, "", Outcome::Converted, "the `elasticsearch` sink (`mode: index`, as Fluent Bit's `index` action), fluent-bit layout, `@timestamp`");
            c
        }
        "kafka" => {
            let mut c = Component::new("kafka", id, &o.at, &comp);
            let brokers: Vec<String> = keys
                .take("Brokers")
                .map(|e| e.value.split(',').map(|b| b.trim().to_string()).collect())
                .unwrap_or_else(|| vec!["127.0.0.1:9092".into()]);
            c.set("brokers", brokers);
            let topics = keys
                .take("Topics")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| "fluent-bit".into());
            let first = topics
                .split(',')
                .next()
                .unwrap_or("fluent-bit")
                .trim()
                .to_string();
            if topics.contains(',') {
                report.add(&o.at, &comp, "Topics", Outcome::Approximated, format!("Fluent Bit writes to the first topic unless `Topic_Key` picks another; so does Petrel: `{first}`"));
            }
            if let Some(e) = keys.take("Topic_Key") {
                c.set("topic", format!("{{{{ {} }}}}", field(&e.value)));
                c.set("fallback_topic", first.as_str());
                report.add(
                    &e.at,
                    &comp,
                    &e.key,
                    Outcome::Converted,
                    "topic template with fallback_topic",
                );
            } else {
                c.set("topic", first.as_str());
            }
            if let Some(e) = keys.take("Message_Key_Field") {
                c.set("key_field", field(&e.value));
                report.add(&e.at, &comp, &e.key, Outcome::Converted, "key_field");
            }
            let fmt = keys
                .take("Format")
                .map(|e| e.value.to_ascii_lowercase())
                .unwrap_or_else(|| "json".into());
            if fmt == "json" {
                c.set("encoding", "ndjson");
            } else {
                report.add(
                    &o.at,
                    &comp,
                    "Format",
                    Outcome::NotConverted,
                    format!("format `{fmt}`: Petrel writes JSON or text"),
                );
            }
            let mut rd = serde_json::Map::new();
            for e in &o.entries {
                if let Some(k) = e
                    .key
                    .strip_prefix("rdkafka.")
                    .or_else(|| e.key.strip_prefix("RDKAFKA."))
                {
                    rd.insert(k.to_string(), Value::from(e.value.as_str()));
                    report.add(&e.at, &comp, &e.key, Outcome::Converted, "librdkafka");
                    keys.done.insert(e.key.to_ascii_lowercase());
                }
            }
            if !rd.is_empty() {
                c.set("librdkafka", Value::Object(rd));
            }
            for k in ["Timestamp_Key", "Timestamp_Format", "queue_full_retries"] {
                if let Some(e) = keys.take(k) {
                    report.add(&e.at, &comp, &e.key, Outcome::Approximated, "the time is written under the sink's `timestamp_key`; a full queue waits instead of retrying a number of times");
                }
            }
            report.add(
                &o.at,
                &comp,
                "",
                Outcome::Converted,
                "the `kafka` sink (librdkafka), fluent-bit layout",
            );
            c
        }
        "loki" => {
            let mut c = Component::new("loki", id, &o.at, &comp);
            let url = base_url(o, &mut keys, "3100");
            c.set("endpoint", url);
            if let Some(e) = keys.take("Uri") {
                c.set("path", e.value.as_str());
            }
            let mut labels = serde_json::Map::new();
            if let Some(e) = keys.take("Labels") {
                for part in e.value.split(',') {
                    let part = part.trim();
                    match part.split_once('=') {
                        Some((k, v)) => {
                            let v = v.trim();
                            let v = match v.strip_prefix('$') {
                                Some(rec) => format!("{{{{ {} }}}}", field(rec)),
                                None => v.to_string(),
                            };
                            labels.insert(k.trim().to_string(), Value::from(v));
                        }
                        None => {
                            let rec = part.trim_start_matches('$');
                            labels.insert(
                                rec.replace(['.', '[', ']', '\'', '"'], "_"),
                                Value::from(format!("{{{{ {} }}}}", field(rec))),
                            );
                        }
                    }
                }
                report.add(&e.at, &comp, &e.key, Outcome::Converted, "labels");
            } else {
                labels.insert("job".into(), Value::from("fluent-bit"));
            }
            if let Some(e) = keys.take("Label_Keys") {
                for part in e.value.split(',') {
                    let rec = part.trim().trim_start_matches('$');
                    labels.insert(
                        rec.replace(['.', '[', ']', '\'', '"'], "_"),
                        Value::from(format!("{{{{ {} }}}}", field(rec))),
                    );
                }
                report.add(
                    &e.at,
                    &comp,
                    &e.key,
                    Outcome::Converted,
                    "labels from record keys",
                );
            }
            c.set("labels", Value::Object(labels));
            if let Some(e) = keys.take("Line_Format") {
                c.set(
                    "line_format",
                    if e.value.eq_ignore_ascii_case("key_value") {
                        "text"
                    } else {
                        "json"
                    },
                );
                report.add(
                    &e.at,
                    &comp,
                    &e.key,
                    if e.value.eq_ignore_ascii_case("key_value") {
                        Outcome::Approximated
                    } else {
                        Outcome::Converted
                    },
                    "line_format",
                );
            }
            if let Some(e) = keys.take("Tenant_ID") {
                c.set("tenant_id", e.value.as_str());
                report.add(&e.at, &comp, &e.key, Outcome::Converted, "tenant_id");
            }
            basic_auth(&mut keys, &mut c, &comp, report);
            keys.note(
                &comp,
                report,
                &[
                    (
                        "Remove_Keys",
                        Outcome::Approximated,
                        "remove them with a `fields` processor before the sink",
                    ),
                    (
                        "Drop_Single_Key",
                        Outcome::Approximated,
                        "`line_format: text` writes the message alone",
                    ),
                    (
                        "Auto_Kubernetes_Labels",
                        Outcome::NotConverted,
                        "write the labels by hand",
                    ),
                    (
                        "Label_Map_Path",
                        Outcome::NotConverted,
                        "write the labels by hand",
                    ),
                    (
                        "Structured_Metadata",
                        Outcome::NotConverted,
                        "write the labels by hand",
                    ),
                ],
            );
            tls_keys(&mut keys, &mut c, &comp, report);
            report.add(&o.at, &comp, "", Outcome::Converted, "the `loki` sink");
            c
        }
        "http" => {
            let mut c = Component::new("http", id, &o.at, &comp);
            let url = base_url(o, &mut keys, "80");
            let uri = keys
                .take("URI")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| "/".into());
            c.set("url", format!("{url}{uri}"));
            let fmt = keys
                .take("Format")
                .map(|e| e.value.to_ascii_lowercase())
                .unwrap_or_else(|| "msgpack".into());
            match fmt.as_str() {
                "json" => c.set("encoding", "json_array"),
                "json_lines" | "json_stream" => c.set("encoding", "ndjson"),
                other => report.add(&o.at, &comp, "Format", Outcome::NotConverted, format!("format `{other}` (Fluent Bit's default is msgpack): Petrel sends JSON (`ndjson` or `json_array`)")),
            }
            let mut headers = serde_json::Map::new();
            for e in keys.take_all("Header") {
                if let Some((k, v)) = e.value.split_once(char::is_whitespace) {
                    headers.insert(k.to_string(), Value::from(v.trim()));
                    report.add(&e.at, &comp, &e.key, Outcome::Converted, "headers");
                }
            }
            if let (Some(u), Some(pw)) = (keys.take("HTTP_User"), keys.take("HTTP_Passwd")) {
                use base64::Engine;
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", u.value, pw.value));
                headers.insert(
                    "Authorization".into(),
                    Value::from(format!("Basic {token}")),
                );
                for e in [u, pw] {
                    report.add(
                        &e.at,
                        &comp,
                        &e.key,
                        Outcome::Converted,
                        "an `Authorization: Basic` header",
                    );
                }
            }
            if !headers.is_empty() {
                c.set("headers", Value::Object(headers));
            }
            if let Some(e) = keys.take("compress") {
                c.set(
                    "compression",
                    if e.value.eq_ignore_ascii_case("gzip") {
                        "gzip"
                    } else {
                        "none"
                    },
                );
                report.add(&e.at, &comp, &e.key, Outcome::Converted, "compression");
            }
            for k in ["json_date_key", "json_date_format"] {
                if let Some(e) = keys.take(k) {
                    report.add(
                        &e.at,
                        &comp,
                        &e.key,
                        Outcome::Approximated,
                        "the time is written under the sink's `timestamp_key` (`timestamp_format`)",
                    );
                }
            }
            tls_keys(&mut keys, &mut c, &comp, report);
            report.add(&o.at, &comp, "", Outcome::Converted, "the `http` sink");
            c
        }
        "file" => {
            let mut c = Component::new("file", id, &o.at, &comp);
            let dir = keys
                .take("Path")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| ".".into());
            let file = keys
                .take("File")
                .map(|e| e.value.clone())
                .unwrap_or_else(|| "fluent-bit.out".into());
            c.set("path", format!("{}/{file}", dir.trim_end_matches('/')));
            let fmt = keys
                .take("Format")
                .map(|e| e.value.to_ascii_lowercase())
                .unwrap_or_default();
            c.set("encoding", "ndjson");
            report.add(&o.at, &comp, "Format", if fmt.is_empty() || fmt == "plain" { Outcome::Approximated } else { Outcome::NotConverted }, "one JSON object per line (Fluent Bit's `plain`; its default writes `tag: [time, record]`)");
            c
        }
        "stdout" => {
            let mut c = Component::new("stdout", id, &o.at, &comp);
            let fmt = keys
                .take("Format")
                .map(|e| e.value.to_ascii_lowercase())
                .unwrap_or_default();
            c.set("encoding", "ndjson");
            report.add(
                &o.at,
                &comp,
                "Format",
                if fmt == "json_lines" {
                    Outcome::Converted
                } else {
                    Outcome::Approximated
                },
                "one JSON object per line (Fluent Bit's default prints `[0] tag: [time, {...}]`)",
            );
            c
        }
        "null" => {
            report.add(&o.at, &comp, "", Outcome::Converted, "the `blackhole` sink");
            Component::new("blackhole", id, &o.at, &comp)
        }
        _ => {
            report.add(&o.at, &comp, "", Outcome::NotConverted, match plugin {
                "forward" => "Petrel has no forward output: send to the next agent with `tcp` (ndjson) or `http`, or to its store directly".to_string(),
                "s3" => "use the `s3` sink (bucket, region, key template) by hand".to_string(),
                "opentelemetry" => "use the `opentelemetry` sink (`endpoint: http://host:4318/v1/logs`)".to_string(),
                "syslog" => "use the `syslog` sink".to_string(),
                _ => format!("Petrel has no output like `{plugin}`"),
            });
            return None;
        }
    };
    keys.rest(&comp, report);
    // Every sink that writes fields names them as Fluent Bit's records do.
    if c.get("type") != Some(&Value::from("blackhole")) {
        c.set("metadata", json!({"layout": "fluent-bit"}));
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn tags_match_as_fluent_bit_globs() {
        assert!(tag_matches("*", "kube.var.log"));
        assert!(tag_matches("kube.*", "kube.var.log.containers.a.log"));
        assert!(!tag_matches("app.*", "kube.x"));
        assert!(tag_matches("a*c", "abc"));
    }

    #[test]
    fn a_tail_to_elasticsearch_config_converts_and_validates() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "parsers.conf", "[PARSER]\n    Name   apache\n    Format regex\n    Regex  ^(?<host>[^ ]*) [^ ]* (?<user>[^ ]*) \\[(?<time>[^\\]]*)\\] \"(?<method>\\S+)(?: +(?<path>[^ ]*) +\\S*)?\" (?<code>[^ ]*) (?<size>[^ ]*)$\n    Time_Key time\n    Time_Format %d/%b/%Y:%H:%M:%S %z\n");
        write(d.path(), "outputs.conf", "[OUTPUT]\n    Name  es\n    Match app.*\n    Host  es.local\n    Port  9200\n    Logstash_Format On\n    Logstash_Prefix web\n    Suppress_Type_Name On\n");
        let main = write(d.path(), "fluent-bit.conf", "@SET LOGDIR=/var/log/web\n[SERVICE]\n    Flush        1\n    Log_Level    debug\n    Parsers_File parsers.conf\n    HTTP_Server  On\n    HTTP_Port    2020\n\n[INPUT]\n    Name   tail\n    Tag    app.access\n    Path   ${LOGDIR}/access.log\n    Parser apache\n    DB     /var/lib/fb/tail.db\n\n[FILTER]\n    Name   grep\n    Match  app.*\n    Exclude path ^/health\n\n[FILTER]\n    Name   modify\n    Match  *\n    Add    env prod\n    Rename code status\n\n@INCLUDE outputs.conf\n");
        let c = convert(&[main]).expect("reads");
        assert_eq!(c.pipelines.len(), 1);
        let p = &c.pipelines[0];
        let y = p.yaml();
        assert!(
            y.contains("\"/var/log/web/access.log\""),
            "@SET expanded: {y}"
        );
        assert!(y.contains("type: \"parse_regex\""), "{y}");
        assert!(y.contains("type: \"parse_timestamp\""), "{y}");
        assert!(y.contains("exclude: {\"path\":\"^/health\"}"), "{y}");
        assert!(y.contains("index: \"web-%Y.%m.%d\""), "{y}");
        assert!(y.contains("fluent-bit.conf:9"), "origins named: {y}");
        assert!(c.run_flags.contains(&"--log-level debug".to_string()));
        assert!(c.run_flags.contains(&"--api-addr 0.0.0.0:2020".to_string()));
        // Every key is in the report, none unknown.
        assert_eq!(
            c.report.count(Outcome::NotConverted),
            0,
            "{}",
            c.report.markdown("fluent-bit")
        );
        let out = d.path().join("out");
        super::super::write_and_validate(&c, &out).expect("the output loads");
    }

    #[test]
    fn kubernetes_filter_makes_the_container_source_and_unknowns_are_reported() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "fluent-bit.conf", "[INPUT]\n    Name tail\n    Tag kube.*\n    Path /var/log/containers/*.log\n    multiline.parser docker, cri\n    Mem_Buf_Limit 5MB\n    Skip_Long_Lines On\n\n[FILTER]\n    Name kubernetes\n    Match kube.*\n    Merge_Log On\n    Keep_Log Off\n    K8S-Logging.Parser On\n\n[FILTER]\n    Name lua\n    Match *\n    script a.lua\n\n[OUTPUT]\n    Name kafka\n    Match *\n    Brokers k1:9092,k2:9092\n    Topics logs\n    rdkafka.compression.codec lz4\n    Frobnicate yes\n\n[OUTPUT]\n    Name forward\n    Match nothing.here\n");
        let c = convert(&[main]).expect("reads");
        let y = c.pipelines[0].yaml();
        assert!(y.contains("type: \"kubernetes_logs\""), "{y}");
        assert!(y.contains("api: true"), "{y}");
        assert!(y.contains("\"layout\":\"fluent-bit\""), "{y}");
        assert!(y.contains("\"compression.codec\":\"lz4\""), "{y}");
        let md = c.report.markdown("fluent-bit");
        for want in [
            "| [FILTER] lua | — | not converted",
            "| [OUTPUT] kafka | Frobnicate | not converted",
            "K8S-Logging.Parser | not converted",
        ] {
            assert!(md.contains(want), "{want} in\n{md}");
        }
        super::super::write_and_validate(&c, &d.path().join("out")).expect("the output loads");
    }

    #[test]
    fn bad_input_names_the_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "syntax.conf",
                b"[INPUT\n    Name tail\n".to_vec(),
                "syntax.conf:1:",
            ),
            (
                "outside.conf",
                b"# c\n    Name tail\n".to_vec(),
                "outside.conf:2:",
            ),
            ("section.conf", b"[INPUTS]\n".to_vec(), "unknown section"),
            ("cmd.conf", b"@IMPORT x\n".to_vec(), "unknown command"),
            (
                "garbage.conf",
                vec![0x5b, 0xff, 0xfe, 0x00, 0x01, b'\n'],
                "not text",
            ),
            (
                "nul.conf",
                b"[INPUT]\n  Name \0tail\n".to_vec(),
                "nul.conf:2:",
            ),
            (
                "missing.conf",
                b"@INCLUDE nowhere.conf\n".to_vec(),
                "no such file",
            ),
        ];
        for (name, body, want) in cases {
            let p = d.path().join(name);
            std::fs::write(&p, body).unwrap();
            let errs = convert(&[p]).expect_err(name);
            let text = errs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            assert!(text.contains(want), "{name}: {text}");
        }
        write(d.path(), "a.conf", "@INCLUDE b.conf\n");
        write(d.path(), "b.conf", "@INCLUDE a.conf\n");
        let errs = convert(&[d.path().join("a.conf")]).expect_err("loop");
        assert!(errs[0].message.contains("`@INCLUDE` loop"), "{}", errs[0]);
        // A 10 MB configuration is read (and converted) without trouble.
        let mut big = String::from("[OUTPUT]\n    Name null\n    Match *\n");
        while big.len() < 10 << 20 {
            big.push_str("[INPUT]\n    Name dummy\n# padding padding padding padding padding\n");
        }
        let p = write(d.path(), "big.conf", &big);
        let c = convert(&[p]).expect("a large file reads");
        assert!(c.report.count(Outcome::NotConverted) > 1000);
    }
}
