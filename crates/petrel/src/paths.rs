//! Paths and globs as the configuration and the file-reading plugins see
//! them: resolving relative paths against the configuration file, the file
//! source's glob dialect, and matching a path under every spelling (`..`,
//! symlinks) for the feedback-loop guard. Below both the config loader
//! and the plugins, so neither imports the other.

use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobBuilder};
use petrel_core::config::Node;

/// Compiles one glob the way the file source uses it: `*` and `?` stay
/// within a path component, `**` spans any depth.
pub fn compile_glob(pattern: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// The part of a pattern before its first glob character, and how many
/// components below it the pattern can reach (`None`: any depth).
pub fn walk_root(pattern: &str) -> (PathBuf, Option<usize>) {
    let mut base = PathBuf::new();
    let mut rest = Vec::new();
    let mut in_glob = false;
    for c in Path::new(pattern).components() {
        let s = c.as_os_str().to_string_lossy();
        if !in_glob && !s.contains(['*', '?', '[', '{']) {
            base.push(c.as_os_str());
        } else {
            in_glob = true;
            rest.push(s.to_string());
        }
    }
    if rest.is_empty() {
        // A literal path: watch its directory.
        let parent = base.parent().map(Path::to_path_buf).unwrap_or_default();
        return (parent, Some(1));
    }
    let depth = if rest.iter().any(|s| s.contains("**")) {
        None
    } else {
        Some(rest.len())
    };
    (base, depth)
}

/// True when `p` is absolute and has no `..` components.
pub fn is_clean_absolute(p: &str) -> bool {
    let path = Path::new(p);
    path.is_absolute() && !path.components().any(|c| matches!(c, Component::ParentDir))
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

/// Tells whether a file source's globs match a path, under every spelling
/// of it: lexically normalised and with symlinks resolved, against globs
/// whose literal directory is also resolved.
pub struct ReadMatcher {
    include: Vec<globset::GlobSet>,
    exclude: Vec<globset::GlobSet>,
}

impl ReadMatcher {
    /// Compiles `include` and `exclude` (absolute globs), each also with
    /// its literal leading directory resolved through symlinks.
    pub fn new(include: &[String], exclude: &[String]) -> Self {
        let variants = |pats: &[String]| {
            let mut sets = Vec::new();
            for resolve in [false, true] {
                let mut b = globset::GlobSetBuilder::new();
                for p in pats {
                    let p = if resolve {
                        resolve_glob_root(p)
                    } else {
                        p.clone()
                    };
                    if let Ok(g) = compile_glob(&p) {
                        b.add(g);
                    }
                }
                if let Ok(set) = b.build() {
                    sets.push(set);
                }
            }
            sets
        };
        Self {
            include: variants(include),
            exclude: variants(exclude),
        }
    }

    /// True when some spelling of `path` is included and not excluded.
    pub fn reads(&self, path: &Path) -> bool {
        spellings(path).iter().any(|p| {
            self.include.iter().any(|s| s.is_match(p))
                && !self.exclude.iter().any(|s| s.is_match(p))
        })
    }
}

/// `path` without `.` and `..` (lexically), and with its existing part
/// resolved through symlinks.
pub fn spellings(path: &Path) -> Vec<PathBuf> {
    let mut lexical = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                lexical.pop();
            }
            std::path::Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    let mut out = vec![lexical.clone()];
    // The file may not exist yet: resolve the deepest existing ancestor.
    let mut tail = Vec::new();
    let mut cur = lexical.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(cur) {
            let mut r = real;
            for t in tail.iter().rev() {
                r.push(t);
            }
            if r != lexical {
                out.push(r);
            }
            break;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                cur = parent;
            }
            _ => break,
        }
    }
    out
}

/// `pattern` with its literal leading directories resolved through
/// symlinks (unchanged when they do not exist).
fn resolve_glob_root(pattern: &str) -> String {
    let (root, _) = walk_root(pattern);
    let Ok(real) = std::fs::canonicalize(&root) else {
        return pattern.to_string();
    };
    let root_s = root.to_string_lossy();
    match pattern.strip_prefix(root_s.as_ref()) {
        Some(rest) => format!("{}{}", globset::escape(&real.to_string_lossy()), rest),
        None => pattern.to_string(),
    }
}
