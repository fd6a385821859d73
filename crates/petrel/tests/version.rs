//! `petrel --version` names the crate version and the git revision the
//! binary was built from (crates/petrel/build.rs).

mod common;

use std::process::Command;

#[test]
fn version_names_the_crate_version_and_the_git_revision() {
    let out = Command::new(common::bin())
        .arg("--version")
        .output()
        .expect("run petrel --version");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8 version");
    let want_prefix = format!("petrel {} (", env!("CARGO_PKG_VERSION"));
    let rev = text
        .trim_end()
        .strip_prefix(&want_prefix)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("`{text}` is not `{want_prefix}<revision>)`"));
    // Tests run from a checkout (cargo test in this repository): the
    // revision must be git's, not the "unknown" of a tarball build. A
    // PETREL_TEST_BIN from elsewhere is another commit's: only its form
    // is checked then.
    assert_eq!(rev.len(), 12, "`{rev}`: 12 hex digits expected");
    assert!(
        rev.bytes().all(|b| b.is_ascii_hexdigit()),
        "`{rev}` is not hexadecimal"
    );
    if std::env::var_os("PETREL_TEST_BIN").is_none() {
        let git = Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR")])
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .expect("run git (the tests run from a git checkout)");
        assert!(git.status.success(), "git rev-parse: {git:?}");
        let head = String::from_utf8_lossy(&git.stdout).trim().to_string();
        assert_eq!(rev, head, "the binary's revision is not HEAD's");
    }
}
