//! The local limits a remote pipeline is checked against before it is
//! applied: what it may read, write, run, send to, and whether it may read
//! the environment. A pipeline that breaks one is refused whole, with
//! every reason; nothing of it starts.
//!
//! Path limits are globs. A remote source's `include` glob is allowed only
//! when every path it can match is matched by an allowed glob: the check
//! compares the two glob patterns component by component (an allowed `**`
//! takes any number of components, an allowed `*`-style component takes
//! any one component that does not contain `**`, a literal component only
//! itself), so it never allows a pattern that reaches outside, at the cost
//! of refusing some that do not (write the limit as a directory tree:
//! `/var/log/**`).

use super::agent_file::Limits;
use crate::config::PipelineConfig;

/// Every limit `p` breaks, in words that name the component, the key and
/// the limit (empty: allowed).
pub fn check(p: &PipelineConfig, limits: &Limits) -> Vec<String> {
    let mut why = Vec::new();
    let text = p.text.split("\n\0").next().unwrap_or_default();
    if !limits.allow_env && uses_env_reference(text) {
        why.push(
            "the pipeline uses `${...}` environment references, which remote pipelines may not \
             (they would send the agent's environment elsewhere); set `limits.allow_env: true` in \
             the agent file to allow it"
                .to_string(),
        );
    }
    for (id, s) in &p.sources {
        let kind = s.type_name();
        if let Some(allowed) = &limits.source_types {
            if !allowed.iter().any(|t| t == kind) {
                why.push(format!(
                    "source `{id}`: type `{kind}` is not among `limits.source_types` ({})",
                    allowed.join(", ")
                ));
            }
        }
        if let Some((include, _)) = s.read_globs() {
            for g in include {
                if !glob_within(g, &limits.read_paths) {
                    why.push(format!(
                        "source `{id}`: `include` `{g}` reaches outside `limits.read_paths` ({}); \
                         remote sources may read only there",
                        shown(&limits.read_paths)
                    ));
                }
            }
        }
        for path in s.local_paths() {
            if !glob_within(&path, &limits.read_paths) {
                why.push(format!(
                    "source `{id}`: reads `{path}`, outside `limits.read_paths` ({})",
                    shown(&limits.read_paths)
                ));
            }
        }
        if let (Some(prog), false) = (s.runs_program(), limits.allow_exec) {
            why.push(format!(
                "source `{id}`: runs the program `{prog}`, and remote pipelines may not run \
                 programs; set `limits.allow_exec: true` in the agent file to allow it"
            ));
        }
    }
    for (id, c) in &p.processors {
        if let Some((file, _)) = c.file_input() {
            if !glob_within(file, &limits.read_paths) {
                why.push(format!(
                    "processor `{id}`: reads `{file}`, outside `limits.read_paths` ({})",
                    shown(&limits.read_paths)
                ));
            }
        }
        if c.uses_env() && !limits.allow_env {
            why.push(format!(
                "processor `{id}`: `allow_env: true` lets the program read the agent's environment, \
                 host and files, which remote pipelines may not; set `limits.allow_env: true` in the \
                 agent file to allow it"
            ));
        }
    }
    let any_host = limits.destinations.iter().any(|d| d == "*");
    for (id, s) in &p.sinks {
        let kind = s.type_name();
        if let Some(allowed) = &limits.sink_types {
            if !allowed.iter().any(|t| t == kind) {
                why.push(format!(
                    "sink `{id}`: type `{kind}` is not among `limits.sink_types` ({})",
                    allowed.join(", ")
                ));
            }
        }
        match s.destinations() {
            Some(hosts) => {
                for h in hosts {
                    if !any_host && !host_allowed(&h, &limits.destinations) {
                        why.push(format!(
                            "sink `{id}`: sends to `{h}`, which no pattern of `limits.destinations` ({}) allows",
                            limits.destinations.join(", ")
                        ));
                    }
                }
            }
            None if !any_host => why.push(format!(
                "sink `{id}`: type `{kind}` does not tell where it sends, so it cannot be checked \
                 against `limits.destinations`"
            )),
            None => {}
        }
        for w in s.local_writes() {
            let w = w.to_string_lossy();
            if !glob_within(&w, &limits.write_paths) {
                why.push(format!(
                    "sink `{id}`: writes `{w}`, outside `limits.write_paths` ({}); remote sinks may \
                     write files only there",
                    shown(&limits.write_paths)
                ));
            }
        }
    }
    why
}

fn shown(globs: &[String]) -> String {
    if globs.is_empty() {
        "none".into()
    } else {
        globs.join(", ")
    }
}

/// True when `text` holds a `${...}` reference (`$${` is a literal).
fn uses_env_reference(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'$' {
            if b[i + 1] == b'$' {
                i += 2;
                continue;
            }
            if b[i + 1] == b'{' {
                return true;
            }
        }
        i += 1;
    }
    false
}

/// True when `host` matches one of `patterns` (`*.example.com` matches
/// `a.example.com` and `a.b.example.com`, not `example.com`).
pub fn host_allowed(host: &str, patterns: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    patterns.iter().any(|p| {
        if p == "*" {
            return true;
        }
        match p.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(&format!(".{suffix}")),
            None => host == *p,
        }
    })
}

/// True when every path `pattern` can match is matched by one of
/// `allowed` (see the module documentation); `..` is never allowed.
pub fn glob_within(pattern: &str, allowed: &[String]) -> bool {
    if !pattern.starts_with('/') || pattern.split('/').any(|c| c == "..") {
        return false;
    }
    let p: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    allowed.iter().any(|a| {
        let a: Vec<&str> = a.split('/').filter(|c| !c.is_empty()).collect();
        covers(&a, &p)
    })
}

fn is_meta(c: &str) -> bool {
    c.contains(['*', '?', '[', '{'])
}

/// Does the allowed component list `a` cover every path of `p`?
fn covers(a: &[&str], p: &[&str]) -> bool {
    match (a.first(), p.first()) {
        (None, None) => true,
        (Some(&"**"), _) => {
            // `**` takes zero or more components of `p`, whatever they are.
            (0..=p.len()).any(|k| covers(&a[1..], &p[k..]))
        }
        (None, Some(_)) | (Some(_), None) => false,
        (Some(ac), Some(pc)) => component_covers(ac, pc) && covers(&a[1..], &p[1..]),
    }
}

fn component_covers(a: &str, p: &str) -> bool {
    if p.contains("**") {
        // Only `**` covers `**` (handled above).
        return false;
    }
    if !is_meta(p) {
        // A literal component: the allowed glob must match it.
        return globset::Glob::new(a)
            .map(|g| g.compile_matcher().is_match(p))
            .unwrap_or(false);
    }
    // A pattern component: covered by `*` alone, or by the same text.
    a == "*" || a == p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn globs_inside_the_limit_pass_and_others_do_not() {
        let a = allowed(&["/var/log/**", "/srv/*/logs/*.log"]);
        for ok in [
            "/var/log/app.log",
            "/var/log/*.log",
            "/var/log/**/*.log",
            "/var/log/nginx/access.log",
            "/srv/web/logs/a.log",
            "/srv/*/logs/*.log",
            "/srv/api/logs/*.log",
        ] {
            assert!(glob_within(ok, &a), "{ok}");
        }
        for bad in [
            "/etc/passwd",
            "/var/**",
            "/var/log/../../etc/shadow",
            "relative/*.log",
            "/srv/**/logs/*.log",
            "/srv/web/logs/*.txt",
            "/srv/web/logs/x/a.log",
            "/*",
        ] {
            assert!(!glob_within(bad, &a), "{bad}");
        }
        assert!(!glob_within("/tmp/x", &[]));
    }

    #[test]
    fn host_patterns() {
        let p = allowed(&["*.example.com", "10.0.0.7"]);
        assert!(host_allowed("a.example.com", &p));
        assert!(host_allowed("A.B.Example.com.", &p));
        assert!(!host_allowed("example.com", &p));
        assert!(!host_allowed("evil-example.com", &p));
        assert!(host_allowed("10.0.0.7", &p));
        assert!(!host_allowed("10.0.0.8", &p));
    }

    #[test]
    fn env_references_are_found_but_not_escaped_dollars() {
        assert!(uses_env_reference("a: ${HOME}"));
        assert!(!uses_env_reference("a: $${HOME} $5 $x"));
        assert!(uses_env_reference("a: $$${X}"));
    }
}
