//! `petrel docs`: documentation generated from the code, so that it cannot
//! drift from it. The component reference is made from the plugin
//! registry (each plugin's paragraph and key docs); the shell completions
//! and the man page from the command line's own definition.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use petrel_core::plugin::{KeyDoc, Plugin};

use crate::registry;

/// The command that writes every generated document into the tree (the
/// reference into the book, the completions and man pages into the
/// package's files), quoted in the generated files and in the tests that
/// compare them with the code.
pub const REGENERATE: &str = "scripts/regenerate-docs.sh";

/// What `petrel docs` prints.
#[derive(clap::Subcommand, Debug)]
pub enum DocsCmd {
    /// The component reference (Markdown): every source, processor and
    /// sink with its keys, their types, defaults and meaning.
    Reference {
        /// Write `sources.md`, `processors.md` and `sinks.md` into this
        /// directory instead of printing them one after the other.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A shell completion script on stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The man page (roff) on stdout.
    Man {
        /// Write `petrel.1` and a `petrel-SUBCOMMAND.1` for each
        /// subcommand into this directory instead.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs `petrel docs`; `cmd` is the whole command line's definition.
pub fn main(what: DocsCmd, cmd: &mut clap::Command) -> ExitCode {
    let written = match what {
        DocsCmd::Reference { out: Some(dir) } => write_reference(&dir),
        DocsCmd::Reference { out: None } => {
            for (_, text) in reference() {
                print!("{text}");
            }
            Ok(())
        }
        DocsCmd::Completions { shell } => {
            use std::io::Write;
            std::io::stdout().write_all(&completions(shell, cmd))
        }
        DocsCmd::Man { out: None } => man(cmd, &mut std::io::stdout()),
        DocsCmd::Man { out: Some(dir) } => write_man_pages(cmd, &dir),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("petrel docs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The completion script of `shell` for `cmd`.
pub fn completions(shell: clap_complete::Shell, cmd: &clap::Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd.clone(), "petrel", &mut out);
    out
}

/// Sections of the man page that the command line's definition does not
/// hold: signals, environment, files, exit status.
const MAN_SECTIONS: &str = include_str!("man.roff");

/// Writes the man page: what clap_mangen derives from `cmd` (name,
/// synopsis, description, options, subcommands, examples), then
/// [`MAN_SECTIONS`].
pub fn man(cmd: &clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    // The crate version only: `--version` also names the git revision,
    // which would make the committed page differ after every commit.
    let page = clap_mangen::Man::new(cmd.clone().version(env!("CARGO_PKG_VERSION")));
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;
    page.render_options_section(out)?;
    page.render_subcommands_section(out)?;
    page.render_extra_section(out)?;
    out.write_all(MAN_SECTIONS.as_bytes())?;
    page.render_version_section(out)
}

/// The man pages: `petrel.1`, then one per visible subcommand, named
/// `petrel-SUBCOMMAND.1` as the main page's SUBCOMMANDS section refers
/// to them.
pub fn man_pages(cmd: &clap::Command) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut pages = Vec::new();
    let mut main = Vec::new();
    man(cmd, &mut main)?;
    pages.push(("petrel.1".to_string(), main));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("petrel-{}", sub.get_name());
        let mut page = Vec::new();
        let sub = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("petrel {}", sub.get_name()))
            .version(env!("CARGO_PKG_VERSION"));
        clap_mangen::Man::new(sub).render(&mut page)?;
        pages.push((format!("{name}.1"), page));
    }
    Ok(pages)
}

fn write_man_pages(cmd: &clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, page) in man_pages(cmd)? {
        std::fs::write(dir.join(name), page)?;
    }
    Ok(())
}

fn write_reference(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in reference() {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

/// The reference pages, file name and Markdown: one for each section of a
/// pipeline file, each plugin in registry order.
pub fn reference() -> Vec<(&'static str, String)> {
    vec![
        (
            "sources.md",
            page(
                "Sources",
                "sources",
                "Sources read or receive events and hand them to their pipeline's processors.",
                registry::SOURCES,
            ),
        ),
        (
            "processors.md",
            page(
                "Processors",
                "processors",
                "Processors run in order on each batch, on the shared processing pool.",
                registry::PROCESSORS,
            ),
        ),
        (
            "sinks.md",
            page(
                "Sinks",
                "sinks",
                "Sinks deliver events and acknowledge each batch once it is delivered; a source commits what every sink of its pipeline acknowledged.",
                registry::SINKS,
            ),
        ),
        ("layouts.md", layouts_page()),
    ]
}

/// The names of the metadata in every layout of `metadata: {layout}`,
/// from the schema module's table.
fn layouts_page() -> String {
    format!(
        "<!-- Generated from crates/petrel-core/src/schema.rs by `{REGENERATE}`: edit its `NAMES`, not this file. -->\n\n\
# Metadata layouts\n\n\
A sink that writes fields (`ndjson`, the elasticsearch documents, Loki's JSON lines, the opentelemetry \
records, the s3 objects) names the metadata of the sources as its `metadata: {{layout: ...}}` says \
(default `flat`; `otel` on the opentelemetry sink). Each row is one name: Petrel's own (the `flat` column: \
the name in conditions, templates and processors), then its name in each layout. `nested`, `ecs`, \
`fluent-bit` and `vector` write dotted names as objects (`kubernetes.pod.name` is \
`{{\"kubernetes\":{{\"pod\":{{\"name\":...}}}}}}`); `flat` and `otel` write them as dotted keys. \
*key* is the key of a label or annotation, kept whole (`app.kubernetes.io/name`); with \
`dedot: true` (the default of `ecs`) its dots become `_`. A metadata name not in the table is written as \
it is (split at its dots where the layout nests). A field a processor set under one of these names \
takes the metadata's place and its name in the layout; fields of other names are written as they are.\n\n\
On the opentelemetry sink the metadata goes into the resource, except `log.file.path` and \
`log.iostream`, which the Collector keeps on each record; the message is the record's body.\n\n{}",
        petrel_core::schema::reference_table()
    )
}

/// Keys every entry of a section accepts besides its plugin's own (a
/// processor's `when:`), listed after each plugin's keys.
pub trait CommonKeys {
    /// Their documentation.
    fn common_key_docs() -> &'static [KeyDoc] {
        &[]
    }
}

impl CommonKeys for dyn petrel_core::plugin::SourceConfig {}
impl CommonKeys for dyn petrel_core::plugin::SinkConfig {}
impl CommonKeys for dyn petrel_core::plugin::ProcessorConfig {
    fn common_key_docs() -> &'static [KeyDoc] {
        crate::processors::when::KEY_DOCS
    }
}

fn page<C: ?Sized + CommonKeys>(
    title: &str,
    section: &str,
    intro: &str,
    plugins: &[&Plugin<C>],
) -> String {
    let mut s = format!(
        "<!-- Generated from the plugin registry by `{REGENERATE}`: edit the plugins' `DOC` and `KEY_DOCS`, not this file. -->\n\n# {title}\n\n{intro} Each entry of `{section}:` names its kind with `type:`; the keys below are all it accepts (any other is an error naming the closest one).\n"
    );
    for p in plugins {
        s.push_str(&plugin_section(p));
    }
    s
}

/// One plugin's part of the reference: its heading, paragraph and table.
/// The test of the committed reference compares these one by one, so that
/// a build without an optional plugin still checks the others.
pub fn plugin_section<C: ?Sized + CommonKeys>(p: &Plugin<C>) -> String {
    let mut s = format!(
        "\n## `{}`\n\n{}\n\n| key | type | default | meaning |\n|---|---|---|---|\n",
        p.type_name, p.doc
    );
    for k in p.key_docs.iter().chain(C::common_key_docs()) {
        s.push_str(&key_row(k));
    }
    s
}

fn key_row(k: &KeyDoc) -> String {
    let default = match k.default {
        Some(d) => format!("`{}`", cell(d)),
        None => "—".to_string(),
    };
    format!(
        "| `{}` | {} | {} | {} |\n",
        k.name,
        cell(&k.kind.name()),
        default,
        cell(k.doc)
    )
}

/// Text fit for a table cell: a `|` would end the cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plugin_has_a_section_with_a_row_per_key() {
        let pages = reference();
        let all: String = pages.iter().map(|(_, t)| t.as_str()).collect();
        for p in registry::SOURCES {
            assert!(all.contains(&format!("\n## `{}`\n", p.type_name)));
        }
        let file = registry::SOURCES
            .iter()
            .find(|p| p.type_name == "file")
            .expect("the file source is always built");
        let section = plugin_section(file);
        for k in file.keys {
            assert!(
                section.contains(&format!("\n| `{k}` |")),
                "no row for `{k}` in\n{section}"
            );
        }
    }

    #[test]
    fn choices_and_pipes_are_escaped_in_cells() {
        let k = KeyDoc {
            name: "mode",
            kind: petrel_core::plugin::KeyKind::OneOf(&["a", "b"]),
            default: Some("a"),
            doc: "x | y",
        };
        assert_eq!(key_row(&k), "| `mode` | a\\|b | `a` | x \\| y |\n");
    }
}
