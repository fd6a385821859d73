//! Shared file discovery for every file source of every pipeline.
//!
//! All include patterns are compiled into one glob set; the directories
//! they can match are walked once per scan, whatever the number of
//! pipelines, and each file found is matched once against the combined set.
//! inotify reports changes at once; a periodic scan covers what inotify can
//! miss (queue overflow, watch limits, network file systems).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use globset::{GlobSet, GlobSetBuilder};
use inotify::{Inotify, WatchDescriptor, WatchMask};

pub use crate::paths::{compile_glob, is_clean_absolute, walk_root};

use super::identity::FileId;

/// Include and exclude patterns of one file source.
#[derive(Debug, Clone)]
pub struct Patterns {
    /// Absolute include globs.
    pub include: Vec<String>,
    /// Absolute exclude globs.
    pub exclude: Vec<String>,
}

/// A file seen by a scan.
#[derive(Debug, Clone)]
pub struct Found {
    /// Path where it was found.
    pub path: PathBuf,
    /// Identity.
    pub id: FileId,
    /// Size when found.
    pub size: u64,
}

/// What changed since the last call, according to inotify.
#[derive(Debug, Default)]
pub struct Changes {
    /// Paths of files written to.
    pub modified: Vec<PathBuf>,
    /// Something was created, moved or deleted: rescan.
    pub rescan: bool,
    /// Renames seen within watched directories: (old path, new path).
    pub renamed: Vec<(PathBuf, PathBuf)>,
}

/// The include globs of every source, compiled so that a thousand sources
/// cost little more than one.
///
/// globset compiles a glob such as `/var/log/app-7/*.log` into a regex of
/// its own (several KB with its caches, whatever the number of identical
/// `*.log` tails beside it): 1,000 pipelines each including
/// `…/app-N/*.log` cost 20 MB of regexes (issue 33). Most globs are a
/// literal directory and a pattern for the name, so those are kept as a
/// map from directory to name globs, and each distinct name glob is
/// compiled once; the other globs (wildcards above the last component,
/// `**`) stay in one glob set.
struct IncludeSet {
    /// `<literal directory>/<name glob>` globs: per directory, the
    /// (index in `names`, index of the glob) pairs.
    by_dir: HashMap<PathBuf, Vec<(usize, usize)>>,
    /// Every distinct last component of an include glob (see
    /// [`name_glob`]), each compiled once.
    names: GlobSet,
    /// True when every include glob's last component is in `names`, so
    /// that a file whose name matches none of them cannot be included.
    names_cover_all: bool,
    /// The other globs, and the index of each among all include globs.
    rest: GlobSet,
    rest_index: Vec<usize>,
}

impl IncludeSet {
    fn new(patterns: &[&str]) -> Result<Self, globset::Error> {
        let mut by_dir: HashMap<PathBuf, Vec<(usize, usize)>> = HashMap::new();
        let mut name_index: HashMap<&str, usize> = HashMap::new();
        let mut names = GlobSetBuilder::new();
        let mut names_cover_all = true;
        let mut rest = GlobSetBuilder::new();
        let mut rest_index = Vec::new();
        for (i, p) in patterns.iter().enumerate() {
            let split = split_name(p);
            let name = match split {
                Some((_, name)) => {
                    let next = name_index.len();
                    let n = *name_index.entry(name).or_insert(next);
                    if n == next {
                        names.add(compile_glob(name)?);
                    }
                    Some(n)
                }
                None => {
                    names_cover_all = false;
                    None
                }
            };
            match (split, name) {
                (Some((dir, _)), Some(n)) if is_literal(dir) => {
                    let dir = if dir.is_empty() { "/" } else { dir };
                    by_dir.entry(PathBuf::from(dir)).or_default().push((n, i));
                }
                _ => {
                    rest.add(compile_glob(p)?);
                    rest_index.push(i);
                }
            }
        }
        Ok(Self {
            by_dir,
            names: names.build()?,
            names_cover_all,
            rest: rest.build()?,
            rest_index,
        })
    }

    /// True when some glob matches `path`.
    fn is_match(&self, path: &Path) -> bool {
        let mut hits = Vec::new();
        self.matches_into(path, &mut hits);
        !hits.is_empty()
    }

    /// The indexes of the globs matching `path`, into `hits`.
    fn matches_into(&self, path: &Path, hits: &mut Vec<usize>) {
        hits.clear();
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            if let Some(globs) = self.by_dir.get(dir) {
                let matched = self.names.matches(name);
                hits.extend(
                    globs
                        .iter()
                        .filter(|(n, _)| matched.contains(n))
                        .map(|&(_, g)| g),
                );
            }
        }
        if !self.rest_index.is_empty() {
            let mut rest = Vec::new();
            self.rest.matches_into(path, &mut rest);
            hits.extend(rest.into_iter().map(|r| self.rest_index[r]));
        }
    }

    /// True when a file called `name` may match some glob (a test on the
    /// name alone, before any path is built).
    fn name_may_match(&self, name: &OsStr) -> bool {
        !self.names_cover_all || self.names.is_match(name)
    }
}

/// True when `dir` has no glob syntax, so that it names one directory.
fn is_literal(dir: &str) -> bool {
    !dir.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// The shared discovery state.
pub struct Discovery {
    includes: IncludeSet,
    /// For each glob of `includes`, the sources it belongs to.
    include_owners: Vec<Vec<usize>>,
    excludes: Vec<GlobSet>,
    roots: Vec<(PathBuf, Option<usize>)>,
    inotify: Option<Inotify>,
    watches: HashMap<WatchDescriptor, PathBuf>,
    watched: HashSet<PathBuf>,
    inotify_buf: Vec<u8>,
    /// Old paths of MOVED_FROM events waiting for their MOVED_TO, by cookie.
    moves: HashMap<u32, PathBuf>,
    /// True once a watch could not be added (limit reached): scans must
    /// then run often.
    pub degraded: bool,
    /// Directories whose last listing failed (reported once each).
    failed_dirs: HashSet<PathBuf>,
    /// Names that files matching `names` were renamed to (rotation:
    /// `app.log` → `app.log.1`): the reader follows the file there, and
    /// writes to it must still reach the reader without waiting for the
    /// periodic refresh. Keyed by name alone, so that a lookup does not
    /// allocate; a name shared by two directories only costs the slow
    /// path for the other one.
    rotated_names: HashSet<OsString>,
}

/// Most names kept in [`Discovery::rotated_names`]: the set is cleared
/// when full, which only delays (to the next refresh) the reading of
/// writes to files renamed away long ago.
const MAX_ROTATED_NAMES: usize = 1024;

/// `pattern` split at its last `/` into the directory part and the glob
/// of the last path component, or `None` when that component cannot be
/// told apart from the rest (a `/` inside a `{}` or `[]` group, which
/// splitting at the last `/` would cut) or can match any name (`**`).
fn split_name(pattern: &str) -> Option<(&str, &str)> {
    let mut split = None;
    let (mut braces, mut in_class, mut escaped) = (0usize, false, false);
    for (i, c) in pattern.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '{' if !in_class => braces += 1,
            '}' if !in_class => braces = braces.saturating_sub(1),
            '/' if in_class || braces > 0 => return None,
            '/' => split = Some(i),
            _ => {}
        }
    }
    let split = split?;
    let last = &pattern[split + 1..];
    if last.is_empty() || last.contains("**") || compile_glob(last).is_err() {
        return None;
    }
    Some((&pattern[..split], last))
}

impl Discovery {
    /// Builds discovery for `sources` (index = source number).
    pub fn new(sources: &[Patterns]) -> Result<Self, globset::Error> {
        let mut owners: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        let mut roots: Vec<(PathBuf, Option<usize>)> = Vec::new();
        let mut excludes = Vec::with_capacity(sources.len());
        for (i, s) in sources.iter().enumerate() {
            for p in &s.include {
                let e = owners.entry(p.as_str()).or_insert_with(|| {
                    order.push(p.as_str());
                    Vec::new()
                });
                e.push(i);
            }
            let mut ex = GlobSetBuilder::new();
            for p in &s.exclude {
                ex.add(compile_glob(p)?);
            }
            excludes.push(ex.build()?);
        }
        let mut include_owners = Vec::with_capacity(order.len());
        for p in &order {
            include_owners.push(owners.remove(p).unwrap_or_default());
            roots.push(walk_root(p));
        }
        Ok(Self {
            includes: IncludeSet::new(&order)?,
            include_owners,
            excludes,
            roots: {
                roots.sort();
                roots.dedup();
                roots
            },
            inotify: Inotify::init().ok(),
            watches: HashMap::new(),
            watched: HashSet::new(),
            inotify_buf: vec![0; 64 * 1024],
            degraded: false,
            failed_dirs: HashSet::new(),
            moves: HashMap::new(),
            rotated_names: HashSet::new(),
        })
    }

    /// The inotify file descriptor, for waiting on changes.
    pub fn fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        self.inotify.as_ref().map(|i| i.as_raw_fd())
    }

    /// True when some include glob matches `path`.
    pub fn may_match(&self, path: &Path) -> bool {
        self.includes.is_match(path)
    }

    /// Walks every root and returns, per source, the matching files, and
    /// the directories that could not be listed (their files are unknown
    /// this time, not gone).
    pub fn scan(&mut self) -> (Vec<Vec<Found>>, Vec<PathBuf>) {
        let mut out: Vec<Vec<Found>> = vec![Vec::new(); self.excludes.len()];
        let mut seen_dirs = HashMap::new();
        let roots = self.roots.clone();
        let mut hits = Vec::new();
        let mut failed = Vec::new();
        for (root, depth) in roots {
            if !root.is_dir() {
                // Nothing matches yet: watch the nearest existing ancestor
                // so that the directory is picked up when it appears.
                self.watch_ancestor(&root);
                continue;
            }
            self.walk(
                &root,
                depth,
                &mut seen_dirs,
                &mut out,
                &mut hits,
                &mut failed,
            );
        }
        // Roots may overlap, so a file can be found twice.
        for v in &mut out {
            v.sort_by(|a, b| a.path.cmp(&b.path));
            v.dedup_by(|a, b| a.path == b.path);
        }
        for d in &failed {
            if self.failed_dirs.insert(d.0.clone()) {
                tracing::warn!(dir = %d.0.display(), error = %d.1,
                    "cannot list directory; keeping the files already known there and retrying at the next scan");
            }
        }
        let failed: Vec<PathBuf> = failed.into_iter().map(|(d, _)| d).collect();
        self.failed_dirs.retain(|d| failed.contains(d));
        (out, failed)
    }

    fn watch_ancestor(&mut self, dir: &Path) {
        let mut cur = dir.parent();
        while let Some(d) = cur {
            if d.is_dir() {
                if !self.watched.contains(d) {
                    tracing::info!(dir = %dir.display(),
                        "nothing matches yet: the directory does not exist; it will be picked up when it appears");
                    self.watch(d);
                }
                return;
            }
            cur = d.parent();
        }
    }

    fn walk(
        &mut self,
        dir: &Path,
        depth: Option<usize>,
        seen: &mut HashMap<PathBuf, Option<usize>>,
        out: &mut [Vec<Found>],
        hits: &mut Vec<usize>,
        failed: &mut Vec<(PathBuf, std::io::Error)>,
    ) {
        // Walk a directory again only when this visit reaches deeper than
        // the previous one (overlapping roots with different depths).
        match seen.get(dir) {
            Some(None) => return,
            Some(Some(prev)) if depth.is_some_and(|d| d <= *prev) => return,
            _ => {}
        }
        seen.insert(dir.to_path_buf(), depth);
        self.watch(dir);
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            // Gone: its files are gone too (or moved, which rename
            // tracking follows).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                failed.push((dir.to_path_buf(), e));
                return;
            }
        };
        for entry in rd {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    failed.push((dir.to_path_buf(), e));
                    break;
                }
            };
            let Ok(ft) = entry.file_type() else { continue };
            let path = entry.path();
            if ft.is_dir() {
                match depth {
                    Some(d) if d <= 1 => {}
                    _ => self.walk(&path, depth.map(|d| d - 1), seen, out, hits, failed),
                }
                continue;
            }
            // Regular files, and symlinks to them.
            self.includes.matches_into(&path, hits);
            if hits.is_empty() {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let id = FileId::of(&meta);
            for src in self.owners_of(&path, hits) {
                out[src].push(Found {
                    path: path.clone(),
                    id,
                    size: meta.len(),
                });
            }
        }
    }

    /// The sources whose include globs (already matched into `hits`) and
    /// exclude globs select `path`.
    fn owners_of(&self, path: &Path, hits: &[usize]) -> Vec<usize> {
        let mut added: Vec<usize> = Vec::new();
        for &g in hits {
            for &src in &self.include_owners[g] {
                if !added.contains(&src) && !self.excludes[src].is_match(path) {
                    added.push(src);
                }
            }
        }
        added
    }

    /// Files renamed away from a path a source reads, found under their new
    /// name: a file created and rotated between two scans (the agent busy,
    /// several rotations in a row) would otherwise never be seen at a
    /// matching path, and its lines would be lost.
    pub fn renamed_files(&self, renames: &[(PathBuf, PathBuf)]) -> Vec<(usize, Found)> {
        let mut out = Vec::new();
        let mut hits = Vec::new();
        for (old, new) in renames {
            self.includes.matches_into(old, &mut hits);
            if hits.is_empty() {
                continue;
            }
            let Ok(meta) = std::fs::metadata(new) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            for src in self.owners_of(old, &hits) {
                out.push((
                    src,
                    Found {
                        path: new.clone(),
                        id: FileId::of(&meta),
                        size: meta.len(),
                    },
                ));
            }
        }
        out
    }

    fn watch(&mut self, dir: &Path) {
        if self.watched.contains(dir) {
            return;
        }
        let Some(ino) = self.inotify.as_mut() else {
            self.degraded = true;
            return;
        };
        let mask = WatchMask::CREATE
            | WatchMask::MODIFY
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::CLOSE_WRITE
            | WatchMask::ATTRIB;
        match ino.watches().add(dir, mask) {
            Ok(wd) => {
                self.watches.insert(wd, dir.to_path_buf());
                self.watched.insert(dir.to_path_buf());
            }
            // Removed between listing and watching: the next scan sees.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)
                ) => {}
            Err(e) => {
                if !self.degraded {
                    tracing::warn!(dir = %dir.display(), error = %e,
                        "cannot watch directory (inotify watch limit reached: raise fs.inotify.max_user_watches); falling back to 1 s polling");
                }
                self.degraded = true;
            }
        }
    }

    /// Reads pending inotify events without blocking, at most a bounded
    /// amount per call.
    pub fn changes(&mut self) -> Changes {
        let mut ch = Changes::default();
        let Some(ino) = self.inotify.as_mut() else {
            return ch;
        };
        // A directory whose files change as fast as events are read (a
        // busy log next to ours) must not keep the caller here, away from
        // its stop flag and from the files it reads: at most
        // this many buffers per call, the rest stays queued in the kernel
        // (which reports an overflow, and so a rescan, if it fills).
        const MAX_READS: usize = 16;
        let mut seen: HashSet<PathBuf> = HashSet::new();
        let mut watches_removed = false;
        for _ in 0..MAX_READS {
            let events = match ino.read_events(&mut self.inotify_buf) {
                Ok(ev) => ev,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "inotify read failed; rescanning");
                    ch.rescan = true;
                    break;
                }
            };
            let mut any = false;
            for ev in events {
                any = true;
                use inotify::EventMask as M;
                if ev.mask.contains(M::Q_OVERFLOW) {
                    ch.rescan = true;
                    continue;
                }
                if ev.mask.contains(M::IGNORED) {
                    self.watches.remove(&ev.wd);
                    watches_removed = true;
                    continue;
                }
                let structural = M::CREATE | M::MOVED_TO | M::MOVED_FROM | M::DELETE | M::ATTRIB;
                // A busy file no pattern selects, beside one that is
                // collected, sends a write event per line: those are dropped
                // on their name alone, before any path is built. Directory
                // events and renames and deletions are kept: recursive
                // patterns and the following of rotated files need them.
                if let Some(name) = ev.name {
                    if !ev.mask.intersects(structural | M::ISDIR)
                        && !self.includes.name_may_match(name)
                        && !self.rotated_names.contains(name)
                    {
                        continue;
                    }
                }
                let Some(dir) = self.watches.get(&ev.wd) else {
                    continue;
                };
                if ev.mask.intersects(structural) {
                    ch.rescan = true;
                }
                if let Some(name) = ev.name {
                    let path = dir.join(name);
                    if ev.mask.intersects(M::MOVED_FROM | M::DELETE) {
                        self.rotated_names.remove(name);
                    }
                    if ev.mask.contains(M::MOVED_FROM) {
                        // Bounded: cookies whose MOVED_TO never comes (moved
                        // out of the watched tree) are dropped wholesale.
                        if self.moves.len() > 4096 {
                            self.moves.clear();
                        }
                        self.moves.insert(ev.cookie, path.clone());
                    } else if ev.mask.contains(M::MOVED_TO) {
                        if let Some(old) = self.moves.remove(&ev.cookie) {
                            let followed = !ev.mask.contains(M::ISDIR)
                                && !self.includes.name_may_match(name)
                                && old
                                    .file_name()
                                    .is_some_and(|o| self.includes.name_may_match(o));
                            if followed {
                                if self.rotated_names.len() >= MAX_ROTATED_NAMES {
                                    self.rotated_names.clear();
                                }
                                self.rotated_names.insert(name.to_os_string());
                            }
                            ch.renamed.push((old, path.clone()));
                        }
                    }
                    if ev
                        .mask
                        .intersects(M::MODIFY | M::CLOSE_WRITE | M::CREATE | M::MOVED_TO)
                        && !seen.contains(&path)
                    {
                        seen.insert(path.clone());
                        ch.modified.push(path);
                    }
                }
            }
            if !any {
                break;
            }
        }
        // Watches removed by the kernel (directory deleted) must be re-added
        // if the directory comes back. Only then: this hashes every
        // watched path, and runs at every turn of the input loop (with a
        // thousand watched directories, most of an idle agent's CPU,
        // issue 33).
        if watches_removed {
            let live: HashSet<&PathBuf> = self.watches.values().collect();
            self.watched.retain(|d| live.contains(d));
        }
        ch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_depths() {
        assert_eq!(
            walk_root("/var/log/app/**/*.log"),
            ("/var/log/app".into(), None)
        );
        assert_eq!(walk_root("/var/log/*/x.log"), ("/var/log".into(), Some(2)));
        assert_eq!(walk_root("/var/log/app.log"), ("/var/log".into(), Some(1)));
    }

    #[test]
    fn name_globs_are_the_last_component() {
        let m = |p: &str, name: &str| {
            split_name(p).map(|(_, g)| compile_glob(g).unwrap().compile_matcher().is_match(name))
        };
        assert_eq!(m("/var/log/*.log", "app.log"), Some(true));
        assert_eq!(m("/var/log/*.log", "app.log.1"), Some(false));
        assert_eq!(m("/var/*/app-{a,b}.log", "app-b.log"), Some(true));
        assert_eq!(m("/var/log/app.log", "noise.txt"), Some(false));
        // Any name may match: no filter.
        assert_eq!(m("/var/log/**", "x"), None);
        assert_eq!(m("/var/{log/a,b}.log", "a.log"), None);
        assert_eq!(m("/var/log/[/]x", "x"), None);
    }

    #[test]
    fn include_set_matches_as_globset_does() {
        let patterns = [
            "/var/log/app-1/*.log",
            "/var/log/app-2/*.log",
            "/var/log/app-2/x.txt",
            "/var/log/app-3/*.log",
            "/x.log",
            "/var/log/*/current",
            "/srv/**/*.log",
            "/var/log/app-\\[1\\]/*.log",
            "/var/log/app-1/{a,b}.out",
            "/var/{log/a,b}.log",
            "/var/log/app-1/*.log",
        ];
        let set = IncludeSet::new(&patterns).unwrap();
        let globs: Vec<_> = patterns
            .iter()
            .map(|p| compile_glob(p).unwrap().compile_matcher())
            .collect();
        // Only the two globs that cannot be split at their last `/` (or
        // whose directory has glob syntax) fall back to the glob set.
        assert_eq!(set.rest_index, vec![5, 6, 7, 9]);
        for path in [
            "/var/log/app-1/a.log",
            "/var/log/app-1/a.log.1",
            "/var/log/app-1/sub/a.log",
            "/var/log/app-2/a.log",
            "/var/log/app-2/x.txt",
            "/var/log/app-2/y.txt",
            "/var/log/app-3/.hidden.log",
            "/var/log/app-4/a.log",
            "/var/log/app-[1]/a.log",
            "/var/log/app-1/a.out",
            "/var/log/app-1/c.out",
            "/var/log/a.log",
            "/var/b.log",
            "/x.log",
            "/y.log",
            "/var/log/web/current",
            "/srv/a/b/c.log",
            "/srv/c.log",
        ] {
            let mut hits = Vec::new();
            set.matches_into(Path::new(path), &mut hits);
            hits.sort();
            let want: Vec<usize> = (0..patterns.len())
                .filter(|&i| globs[i].is_match(path))
                .collect();
            assert_eq!(hits, want, "{path}");
            assert_eq!(set.is_match(Path::new(path)), !want.is_empty(), "{path}");
        }
        // `**` and groups across `/` leave no name filter.
        assert!(set.name_may_match(OsStr::new("anything")));
        let logs = IncludeSet::new(&["/a/*.log", "/b/*.log", "/c/x.txt"]).unwrap();
        assert!(logs.name_may_match(OsStr::new("a.log")));
        assert!(logs.name_may_match(OsStr::new("x.txt")));
        assert!(!logs.name_may_match(OsStr::new("a.log.1")));
        // One compiled name glob serves every directory.
        assert_eq!(logs.names.len(), 2);
    }

    #[test]
    fn globs_keep_stars_within_components() {
        let g = compile_glob("/a/*.log").unwrap().compile_matcher();
        assert!(g.is_match("/a/x.log"));
        assert!(!g.is_match("/a/b/x.log"));
        let g = compile_glob("/a/**/*.log").unwrap().compile_matcher();
        assert!(g.is_match("/a/x.log"));
        assert!(g.is_match("/a/b/c/x.log"));
    }

    #[test]
    fn one_walk_serves_many_sources() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("x/y")).unwrap();
        std::fs::write(d.join("a.log"), "1\n").unwrap();
        std::fs::write(d.join("x/y/b.log"), "2\n").unwrap();
        std::fs::write(d.join("x/y/b.gz"), "3\n").unwrap();
        let all = format!("{}/**/*", d.display());
        let logs = format!("{}/*.log", d.display());
        let mut disc = Discovery::new(&[
            Patterns {
                include: vec![all.clone()],
                exclude: vec!["**/*.gz".into()],
            },
            Patterns {
                include: vec![logs, all],
                exclude: vec![],
            },
        ])
        .unwrap();
        let found = disc.scan().0;
        let names = |v: &Vec<Found>| {
            let mut n: Vec<String> = v
                .iter()
                .map(|f| f.path.strip_prefix(d).unwrap().display().to_string())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&found[0]), vec!["a.log", "x/y/b.log"]);
        assert_eq!(names(&found[1]), vec!["a.log", "x/y/b.gz", "x/y/b.log"]);
    }

    #[test]
    fn writes_are_reported_for_matching_and_rotated_names_only() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("app.log"), "").unwrap();
        std::fs::write(d.join("noise.txt"), "").unwrap();
        let mut disc = Discovery::new(&[Patterns {
            include: vec![format!("{}/*.log", d.display())],
            exclude: vec![],
        }])
        .unwrap();
        disc.scan();
        disc.changes();
        let mut app = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("app.log"))
            .unwrap();
        let mut noise = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("noise.txt"))
            .unwrap();
        app.write_all(b"1\n").unwrap();
        noise.write_all(b"1\n").unwrap();
        assert_eq!(disc.changes().modified, vec![d.join("app.log")]);
        // Rotated: the logger still writes through its open handle.
        std::fs::rename(d.join("app.log"), d.join("app.log.1")).unwrap();
        let ch = disc.changes();
        assert_eq!(ch.renamed, vec![(d.join("app.log"), d.join("app.log.1"))]);
        app.write_all(b"2\n").unwrap();
        noise.write_all(b"2\n").unwrap();
        assert_eq!(disc.changes().modified, vec![d.join("app.log.1")]);
        // Gone: its name is forgotten.
        std::fs::remove_file(d.join("app.log.1")).unwrap();
        assert!(disc.changes().rescan);
        assert!(disc.rotated_names.is_empty());
    }

    #[test]
    fn event_flood_is_bounded_and_deduplicated() {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let names = ["a.log", "b.log", "c.log"];
        for n in names {
            std::fs::write(d.join(n), "").unwrap();
        }
        let mut disc = Discovery::new(&[Patterns {
            include: vec![format!("{}/*.log", d.display())],
            exclude: vec![],
        }])
        .unwrap();
        disc.scan();
        // A writer alternating between the files: every write is an event
        // the kernel cannot merge with the previous one.
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = {
            let (d, stop, progress) = (d.clone(), stop.clone(), progress.clone());
            std::thread::spawn(move || {
                let mut files: Vec<std::fs::File> = names
                    .iter()
                    .map(|n| {
                        std::fs::OpenOptions::new()
                            .append(true)
                            .open(d.join(n))
                            .unwrap()
                    })
                    .collect();
                let mut writes = 0u64;
                while !stop.load(Ordering::Relaxed) && writes < 2_000_000 {
                    let f = &mut files[(writes % 3) as usize];
                    f.write_all(b"x\n").unwrap();
                    writes += 1;
                    progress.store(writes, Ordering::Relaxed);
                }
                writes
            })
        };
        for _ in 0..10_000 {
            if progress.load(Ordering::Relaxed) >= 10_000 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut calls = 0;
        let mut seen = 0;
        while calls < 20 {
            let ch = disc.changes();
            assert!(
                ch.modified.len() <= names.len(),
                "each modified path once per call, got {}",
                ch.modified.len()
            );
            seen += ch.modified.len();
            calls += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(writes > 0);
        assert!(seen > 0, "the writes were reported");
    }
}
