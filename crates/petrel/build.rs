//! Puts the git revision the binary is built from into `PETREL_REVISION`,
//! so that `petrel --version` (and the image labels made from it) name the
//! exact commit, not only the crate version shared by many commits.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git` run in this crate's directory; `None` when git is missing or this
/// is not a checkout (a source tarball, `cargo package`).
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// A path git names relative to `dir` made absolute (`--git-path` answers
/// relative to the working directory unless the git dir is elsewhere, as in
/// a worktree).
fn git_path(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(git(dir, &["rev-parse", "--git-path", name])?);
    Some(if p.is_absolute() { p } else { dir.join(p) })
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PETREL_GIT_REV");
    let rev = git(&dir, &["rev-parse", "--short=12", "HEAD"]);
    if rev.is_some() {
        // Rebuilt when HEAD moves (checkout, commit on the current branch),
        // not on every build. Only files that exist are named: cargo treats
        // a missing one as always changed. A ref that is packed lives in
        // packed-refs until the next commit writes it loose.
        let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
        if let Some(r) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(r);
        }
        for name in watched {
            if let Some(p) = git_path(&dir, &name).filter(|p| p.exists()) {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    let rev = rev
        .or_else(|| {
            std::env::var("PETREL_GIT_REV")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PETREL_REVISION={rev}");
}
