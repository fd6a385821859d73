//! Committed documents generated from the code are what the code
//! generates. The component reference (`docs/src/reference/*.md`):
//! every key a plugin accepts is documented there, no key is documented
//! that the code does not accept, and the generated text is the committed
//! text. The shell completions and man pages the Debian package installs
//! (`crates/petrel/debian/generated/`): byte for byte.

use std::collections::BTreeSet;
use std::path::PathBuf;

use petrel::cli::docs::{
    completions, man_pages, plugin_section, reference, CommonKeys, REGENERATE,
};
use petrel::registry;
use petrel_core::plugin::Plugin;

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference")
}

fn committed(name: &str) -> String {
    let path = reference_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; generate it with `{REGENERATE}`",
            path.display()
        )
    })
}

/// The committed section of plugin `name` ("## `name`" up to the next
/// heading of that level), if any.
fn section<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    let head = format!("\n## `{name}`\n");
    let start = page.find(&head)?;
    let rest = &page[start + 1..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i + 1);
    Some(&page[start..start + 1 + end])
}

/// The keys a section's table documents.
fn documented_keys(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(k, _)| k.to_string()))
        .collect()
}

/// The plugin names a page has sections for.
fn sections_of(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("## `"))
        .filter_map(|l| l.strip_suffix('`'))
        .map(str::to_string)
        .collect()
}

fn check_page<C: ?Sized + CommonKeys>(
    file: &str,
    plugins: &[&Plugin<C>],
    problems: &mut Vec<String>,
) {
    let page = committed(file);
    for p in plugins {
        let Some(sec) = section(&page, p.type_name) else {
            problems.push(format!("{file}: no section for `{}`", p.type_name));
            continue;
        };
        let code: BTreeSet<String> = p
            .keys
            .iter()
            .copied()
            .chain(C::common_key_docs().iter().map(|k| k.name))
            .map(str::to_string)
            .collect();
        let docs = documented_keys(sec);
        for k in code.difference(&docs) {
            problems.push(format!(
                "{file}: `{}` accepts key `{k}`, which the committed reference does not document",
                p.type_name
            ));
        }
        for k in docs.difference(&code) {
            problems.push(format!(
                "{file}: the committed reference documents key `{k}` of `{}`, which the code does not accept",
                p.type_name
            ));
        }
        let generated = plugin_section(p);
        // The committed section ends where the next one starts; the
        // generated one stands alone.
        if sec.trim_end() != generated.trim_end() {
            problems.push(format!(
                "{file}: the section of `{}` differs from what the code generates",
                p.type_name
            ));
        }
    }
    let registered: BTreeSet<String> = plugins.iter().map(|p| p.type_name.to_string()).collect();
    let extra: Vec<String> = sections_of(&page)
        .difference(&registered)
        .cloned()
        .collect();
    if all_plugins_built() {
        for name in extra {
            problems.push(format!(
                "{file}: documents `{name}`, which the registry does not have"
            ));
        }
    } else if !extra.is_empty() {
        // A build without an optional plugin cannot generate its section;
        // say which were not compared rather than pass quietly.
        eprintln!("{file}: not compared in this build (optional plugins left out): {extra:?}");
    }
}

fn all_plugins_built() -> bool {
    cfg!(all(
        feature = "elasticsearch",
        feature = "loki",
        feature = "opentelemetry"
    ))
}

#[test]
fn committed_reference_matches_the_code() {
    let mut problems = Vec::new();
    check_page("sources.md", registry::SOURCES, &mut problems);
    check_page("processors.md", registry::PROCESSORS, &mut problems);
    check_page("sinks.md", registry::SINKS, &mut problems);
    if all_plugins_built() {
        for (name, text) in reference() {
            if committed(name) != text {
                problems.push(format!("{name} differs from what the code generates"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the component reference in docs/src/reference/ is out of date:\n  {}\nregenerate it with `{REGENERATE}` and commit the result",
        problems.join("\n  ")
    );
}

#[test]
fn the_key_parser_of_this_test_reads_a_generated_section() {
    // The comparison above is only as good as `documented_keys`: it must
    // find every key of a generated section.
    let p = registry::SINKS
        .iter()
        .find(|p| p.type_name == "file")
        .expect("the file sink is always built");
    let keys: BTreeSet<String> = p.keys.iter().map(|k| k.to_string()).collect();
    assert_eq!(documented_keys(&plugin_section(p)), keys);
    let page = format!("# Sinks\n{}", plugin_section(p));
    assert!(section(&page, "file").is_some());
    assert_eq!(sections_of(&page), BTreeSet::from(["file".to_string()]));
}

fn generated_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("debian/generated")
}

fn assert_committed(rel: &str, generated: &[u8]) {
    let path = generated_dir().join(rel);
    let committed = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; generate it with `{REGENERATE}`",
            path.display()
        )
    });
    assert!(
        committed == generated,
        "{} differs from what the code generates; regenerate it with `{REGENERATE}` and commit the result",
        path.display()
    );
}

#[test]
fn committed_completions_match_the_command_line() {
    let cmd = petrel::cli::command();
    for (shell, file) in [
        (clap_complete::Shell::Bash, "completions/petrel.bash"),
        (clap_complete::Shell::Zsh, "completions/_petrel"),
        (clap_complete::Shell::Fish, "completions/petrel.fish"),
    ] {
        let script = completions(shell, &cmd);
        // A script that does not know the subcommands would compare equal
        // to an equally empty committed file; it must name them.
        let text = String::from_utf8_lossy(&script);
        for sub in ["run", "validate", "tap", "top"] {
            assert!(text.contains(sub), "{file} does not mention `{sub}`");
        }
        assert_committed(file, &script);
    }
}

#[test]
fn committed_man_pages_match_the_command_line() {
    let pages = man_pages(&petrel::cli::command()).expect("render the man pages");
    let names: BTreeSet<String> = pages.iter().map(|(n, _)| n.clone()).collect();
    assert!(
        names.contains("petrel.1") && names.contains("petrel-run.1"),
        "{names:?}"
    );
    let main = String::from_utf8_lossy(&pages[0].1).into_owned();
    for section in [
        ".SH SYNOPSIS",
        ".SH SIGNALS",
        ".SH EXIT STATUS",
        "petrel\\-run",
    ] {
        assert!(main.contains(section), "petrel.1 lacks {section}");
    }
    for (name, page) in &pages {
        assert_committed(&format!("man/{name}"), page);
    }
    // No page is committed that the command line no longer has.
    let committed: BTreeSet<String> = std::fs::read_dir(generated_dir().join("man"))
        .expect("list the committed man pages")
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(committed, names, "regenerate with `{REGENERATE}`");
}
