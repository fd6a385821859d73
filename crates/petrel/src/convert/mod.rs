//! `petrel convert`: another agent's configuration turned into Petrel
//! pipeline files, with a report of what was converted, approximated (and
//! how the behaviour differs) or not converted (why, and what to do
//! instead).
//!
//! Shaped like Grafana Alloy's `internal/converter`: one module per source
//! format (`fluent_bit`, ...) that reads the format with its own rules
//! and fills the same two things, the pipelines ([`Pipeline`]) and one
//! [`Report`] shared by every format. What is written is loaded back with
//! the loader of `petrel validate` before the command succeeds: a
//! converter bug shows as a failed conversion, never as a file the agent
//! refuses later.

pub mod fluent_bit;
pub mod positions;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where a part of the original configuration was written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Origin {
    /// The file, as given or included.
    pub file: String,
    /// Its line (1-based).
    pub line: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A configuration that cannot be read at all (syntax, an include loop,
/// a file that is not text): the file and line, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// Where.
    pub at: Origin,
    /// What, and how to fix it.
    pub message: String,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// What happened to one component or key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Petrel does the same.
    Converted,
    /// Petrel does something close; the note says how it differs.
    Approximated,
    /// Left out; the note says why and what to do instead.
    NotConverted,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Converted => "converted",
            Outcome::Approximated => "approximated",
            Outcome::NotConverted => "not converted",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where it was written.
    pub at: Origin,
    /// The component (`[INPUT] tail`, `[OUTPUT] es`).
    pub component: String,
    /// The key, or empty for the component as a whole.
    pub key: String,
    /// What happened.
    pub outcome: Outcome,
    /// How it differs, why it was left out, what to do.
    pub note: String,
}

/// The report of one conversion, shared by every format.
#[derive(Debug, Default)]
pub struct Report {
    /// Every component and key, in the order read.
    pub entries: Vec<Entry>,
}

impl Report {
    /// Records `outcome` for `component`'s `key` (empty: the whole
    /// component).
    pub fn add(
        &mut self,
        at: &Origin,
        component: &str,
        key: &str,
        outcome: Outcome,
        note: impl Into<String>,
    ) {
        self.entries.push(Entry {
            at: at.clone(),
            component: component.to_string(),
            key: key.to_string(),
            outcome,
            note: note.into(),
        });
    }

    /// How many entries have `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.entries.iter().filter(|e| e.outcome == outcome).count()
    }

    /// The report as Markdown: a summary line, then one table row per
    /// entry.
    pub fn markdown(&self, from: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# petrel convert --from {from}\n\n{} converted, {} approximated, {} not converted.\n",
            self.count(Outcome::Converted),
            self.count(Outcome::Approximated),
            self.count(Outcome::NotConverted)
        );
        out.push_str("| where | component | key | outcome | note |\n|---|---|---|---|---|\n");
        for e in &self.entries {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                e.at,
                e.component,
                if e.key.is_empty() { "—" } else { &e.key },
                e.outcome.word(),
                e.note.replace('|', "\\|").replace('\n', " ")
            );
        }
        out
    }
}

/// One component of a pipeline being written: its comment (where it came
/// from) and its keys in order.
#[derive(Debug, Clone, Default)]
pub struct Component {
    /// Comment lines written above it.
    pub comments: Vec<String>,
    /// Keys and values, in the order written.
    pub keys: Vec<(String, Value)>,
}

impl Component {
    /// A component of `type_` with `id`, from `at`.
    pub fn new(type_: &str, id: &str, at: &Origin, what: &str) -> Component {
        Component {
            comments: vec![format!("{what} at {at}")],
            keys: vec![
                ("type".into(), Value::from(type_)),
                ("id".into(), Value::from(id)),
            ],
        }
    }

    /// Sets `key` (replacing an earlier value).
    pub fn set(&mut self, key: &str, v: impl Into<Value>) {
        let v = v.into();
        match self.keys.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.keys.push((key.to_string(), v)),
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// One Petrel pipeline file being written.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    /// The pipeline's name (its file is `<name>.yaml`).
    pub name: String,
    /// Comment lines at the top of the file.
    pub header: Vec<String>,
    /// Its sources.
    pub sources: Vec<Component>,
    /// Its processors, in order.
    pub processors: Vec<Component>,
    /// Its sinks.
    pub sinks: Vec<Component>,
}

fn comment(out: &mut String, indent: &str, text: &str) {
    for l in text.lines() {
        let _ = writeln!(out, "{indent}# {l}");
    }
}

impl Pipeline {
    /// The pipeline file's text. Values are written as JSON (which is
    /// YAML), so that no value from the original can change the file's
    /// structure.
    pub fn yaml(&self) -> String {
        let mut out = String::new();
        for h in &self.header {
            comment(&mut out, "", h);
        }
        for (section, list) in [
            ("sources", &self.sources),
            ("processors", &self.processors),
            ("sinks", &self.sinks),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{section}:");
            for c in list {
                for l in &c.comments {
                    comment(&mut out, "  ", l);
                }
                for (i, (k, v)) in c.keys.iter().enumerate() {
                    let lead = if i == 0 { "  - " } else { "    " };
                    let _ = writeln!(
                        out,
                        "{lead}{k}: {}",
                        serde_json::to_string(v).unwrap_or_default()
                    );
                }
            }
        }
        out
    }
}

/// A finished conversion.
#[derive(Debug, Default)]
pub struct Converted {
    /// The pipelines.
    pub pipelines: Vec<Pipeline>,
    /// The report.
    pub report: Report,
    /// Flags of `petrel run` that the original's agent-wide settings
    /// became (`--log-level debug`).
    pub run_flags: Vec<String>,
}

/// Source formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Fluent Bit's classic `.conf` format (`[INPUT]` sections,
    /// `@INCLUDE`, `@SET`, parsers files).
    FluentBit,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::FluentBit => "fluent-bit",
        }
    }
}

/// Converts `inputs` of `format`.
pub fn convert(format: Format, inputs: &[PathBuf]) -> Result<Converted, Vec<ReadError>> {
    match format {
        Format::FluentBit => fluent_bit::convert(inputs),
    }
}

/// Writes the pipelines into `dir` and loads them back with the loader of
/// `petrel validate --offline`; the problems, if any.
pub fn write_and_validate(c: &Converted, dir: &Path) -> Result<(), Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
    for p in &c.pipelines {
        let path = dir.join(format!("{}.yaml", p.name));
        std::fs::write(&path, p.yaml()).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    }
    if c.pipelines.is_empty() {
        return Ok(());
    }
    petrel_core::config::set_host_checks(false);
    let r = crate::config::load(dir);
    petrel_core::config::set_host_checks(true);
    r.map(|_| ())
        .map_err(|errs| errs.iter().map(|e| e.to_string()).collect())
}

/// `petrel convert`: exit 0 when everything converted (or
/// `--bypass-errors`), 1 when something was not converted, 2 when the
/// input cannot be read or the output does not validate.
pub fn main(
    format: Format,
    inputs: &[PathBuf],
    out: Option<&Path>,
    report: Option<&Path>,
    bypass_errors: bool,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let c = match convert(format, inputs) {
        Ok(c) => c,
        Err(errs) => {
            for e in errs {
                eprintln!("{e}");
            }
            return ExitCode::from(2);
        }
    };
    // Without `--out` the pipelines are printed, once they were checked
    // in a directory of our own.
    let scratch = std::env::temp_dir().join(format!(
        "petrel-convert-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let dir = out.map_or_else(|| scratch.clone(), Path::to_path_buf);
    let checked = write_and_validate(&c, &dir);
    if out.is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    if let Err(errs) = checked {
        eprintln!("petrel convert: the converted pipelines do not load (a converter bug: please report it with the input):");
        for e in errs {
            eprintln!("  {e}");
        }
        return ExitCode::from(2);
    }
    if out.is_none() {
        for p in &c.pipelines {
            println!("# ---- {}.yaml\n{}", p.name, p.yaml());
        }
    }
    let text = c.report.markdown(format.name());
    let text = if c.run_flags.is_empty() {
        text
    } else {
        format!(
            "{text}\nRun with: `petrel run --config DIR {}`\n",
            c.run_flags.join(" ")
        )
    };
    match report {
        Some(r) => {
            if let Err(e) = std::fs::write(r, &text) {
                eprintln!(
                    "petrel convert: cannot write the report {}: {e}",
                    r.display()
                );
                return ExitCode::from(2);
            }
        }
        None => eprint!("{text}"),
    }
    let missing = c.report.count(Outcome::NotConverted);
    eprintln!(
        "petrel convert: {} pipeline(s){}; {} converted, {} approximated, {missing} not converted",
        c.pipelines.len(),
        out.map(|d| format!(" written to {}", d.display()))
            .unwrap_or_default(),
        c.report.count(Outcome::Converted),
        c.report.count(Outcome::Approximated),
    );
    if missing > 0 && !bypass_errors {
        eprintln!("petrel convert: some parts were not converted (see the report); `--bypass-errors` accepts that");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// `petrel convert --import-positions DB --data-dir DIR --config DIR`:
/// exit 0 when the positions were read and the checkpoints written (the
/// report, on standard error, says what happened to each), 2 when the
/// database, the pipelines or the data directory cannot be used.
pub fn import_main(db: &Path, data_dir: &Path, config: &Path) -> std::process::ExitCode {
    use std::process::ExitCode;
    let positions = match positions::read_fluent_bit(db) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    petrel_core::config::set_host_checks(false);
    let pipelines = crate::config::load(config);
    petrel_core::config::set_host_checks(true);
    let pipelines = match pipelines {
        Ok(p) => p,
        Err(errs) => {
            for e in errs {
                eprintln!("{e}");
            }
            return ExitCode::from(2);
        }
    };
    // The agent must not run on this data directory meanwhile: it would
    // write its own checkpoints over these.
    let _lock = match crate::data_dir::lock(data_dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("petrel convert: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    match positions::import(&positions, &pipelines, data_dir, &mut report) {
        Ok(n) => {
            eprint!("{}", report.markdown("positions"));
            eprintln!(
                "petrel convert: {n} position(s) of {} imported into {}",
                positions.len(),
                data_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cannot_change_the_structure_of_the_file() {
        let mut p = Pipeline {
            name: "x".into(),
            header: vec!["line one\nline two".into()],
            ..Pipeline::default()
        };
        let mut c = Component::new(
            "file",
            "tail_0",
            &Origin {
                file: "a.conf".into(),
                line: 3,
            },
            "[INPUT] tail",
        );
        c.set("include", vec!["/var/log/*.log\"\nsinks: [x]"]);
        p.sources.push(c);
        let y = p.yaml();
        assert!(y.starts_with("# line one\n# line two\nsources:\n  # [INPUT] tail at a.conf:3\n  - type: \"file\"\n"), "{y}");
        let doc = marked_yaml::parse_yaml(0, &y).expect("yaml");
        let root = doc.as_mapping().expect("map");
        assert!(root.get("sinks").is_none(), "{y}");
        let inc = root
            .get("sources")
            .and_then(|s| s.as_sequence())
            .and_then(|s| s.first())
            .and_then(|c| c.as_mapping())
            .and_then(|c| c.get("include"))
            .and_then(|i| i.as_sequence())
            .and_then(|i| i.first())
            .and_then(|i| i.as_scalar())
            .map(|s| s.as_str().to_string());
        assert_eq!(inc.as_deref(), Some("/var/log/*.log\"\nsinks: [x]"));
    }
}
