//! Reloading without a signal: watches `--config` and asks for a reload
//! when what the loader would read changes.
//!
//! Pipeline files are often symlinks: Kubernetes mounts a ConfigMap as
//! `app.yaml -> ..data/app.yaml`, `..data -> ..2026_11_25_03_00_00.123`,
//! and updates it by writing a new timestamped directory, pointing a
//! temporary `..data_tmp` at it, renaming that over `..data` and deleting
//! the old directory. No event names `app.yaml` then. So every event in
//! the watched directories counts, and the decision is made on content:
//! a fingerprint of every pipeline file as the loader reads it (through
//! symlinks). The directories that symlinked files point into are watched
//! too, so an edit of a symlink's target elsewhere is seen as well.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

/// Changes are gathered this long before the content is compared: editors
/// and kubelet change files in several steps.
const SETTLE: Duration = Duration::from_millis(300);

/// A fingerprint of the pipeline files under `path` (one file, or the
/// `*.yaml`/`*.yml` of a directory), read through symlinks: names and
/// contents, and the error of any that cannot be read.
pub fn fingerprint(path: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in pipeline_files(path).into_iter().chain(program_files(path)) {
        f.hash(&mut h);
        match std::fs::read(&f) {
            Ok(bytes) => bytes.hash(&mut h),
            Err(e) => e.kind().hash(&mut h),
        }
    }
    h.finish()
}

/// The files the loader reads for `path`, sorted.
fn pipeline_files(path: &Path) -> Vec<PathBuf> {
    if !path.is_dir() {
        return vec![path.to_path_buf()];
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The VRL programs (`*.vrl`) beside the pipeline files: `remap`'s
/// `file:` usually names one there (a ConfigMap holds both), and editing
/// it alone must reload the pipeline. Programs elsewhere are reread on
/// `SIGHUP`.
fn program_files(path: &Path) -> Vec<PathBuf> {
    let home = if path.is_dir() {
        path
    } else {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    };
    let mut v: Vec<PathBuf> = std::fs::read_dir(home)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("vrl"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The directories to watch for `path`: the directory holding the
/// pipeline files, and the directories their symlinks resolve into.
fn watched_dirs(path: &Path) -> Vec<PathBuf> {
    let home = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    let mut dirs = vec![home];
    for f in pipeline_files(path) {
        let is_link = std::fs::symlink_metadata(&f).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            continue;
        }
        if let Some(parent) = std::fs::canonicalize(&f)
            .ok()
            .and_then(|t| t.parent().map(Path::to_path_buf))
        {
            if !dirs.contains(&parent) {
                dirs.push(parent);
            }
        }
    }
    dirs
}

/// Watches `path` on a thread of its own and calls `changed` after every
/// change of the pipeline files' content; stops when `changed` returns
/// false.
pub fn watch(path: &Path, changed: impl Fn() -> bool + Send + 'static) -> std::io::Result<()> {
    let mut w = Watcher {
        path: path.to_path_buf(),
        ino: Inotify::init()?,
        watched: HashMap::new(),
    };
    w.add_watches();
    if w.watched.is_empty() {
        return Err(std::io::Error::other(
            "no configuration directory could be watched",
        ));
    }
    let mut last = fingerprint(path);
    std::thread::Builder::new()
        .name("petrel-config-watch".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match w.ino.read_events_blocking(&mut buf) {
                    Ok(events) => {
                        let gone: Vec<_> = events
                            .filter(|ev| ev.mask.contains(EventMask::IGNORED))
                            .map(|ev| ev.wd)
                            .collect();
                        w.forget(gone);
                    }
                    Err(_) => return,
                }
                std::thread::sleep(SETTLE);
                loop {
                    let gone: Vec<_> = match w.ino.read_events(&mut buf) {
                        Ok(events) => events
                            .filter(|ev| ev.mask.contains(EventMask::IGNORED))
                            .map(|ev| ev.wd)
                            .collect(),
                        Err(_) => break,
                    };
                    if gone.is_empty() {
                        break;
                    }
                    w.forget(gone);
                }
                w.add_watches();
                let now = fingerprint(&w.path);
                if now == last {
                    continue;
                }
                last = now;
                if !changed() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// The inotify instance and what it watches.
struct Watcher {
    path: PathBuf,
    ino: Inotify,
    watched: HashMap<WatchDescriptor, PathBuf>,
}

impl Watcher {
    /// Watches the directories `path` needs now (new symlink targets).
    fn add_watches(&mut self) {
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::ATTRIB;
        for d in watched_dirs(&self.path) {
            if self.watched.values().any(|w| *w == d) {
                continue;
            }
            match self.ino.watches().add(&d, mask) {
                Ok(wd) => {
                    self.watched.insert(wd, d);
                }
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e, "cannot watch a configuration directory");
                }
            }
        }
    }

    /// Forgets watches the kernel dropped (their directory was deleted,
    /// as kubelet deletes the previous version of a ConfigMap).
    fn forget(&mut self, gone: Vec<WatchDescriptor>) {
        for wd in gone {
            self.watched.remove(&wd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lays out `dir` as kubelet does for a ConfigMap with `app.yaml`.
    fn configmap(dir: &Path, version: u32, content: &str) {
        let ts = format!("..2026_11_25_03_00_{version:02}.000");
        std::fs::create_dir(dir.join(&ts)).unwrap();
        std::fs::write(dir.join(&ts).join("app.yaml"), content).unwrap();
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        let link = dir.join("app.yaml");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("..data/app.yaml", &link).unwrap();
        }
        if version > 0 {
            let old = format!("..2026_11_25_03_00_{:02}.000", version - 1);
            std::fs::remove_dir_all(dir.join(old)).unwrap();
        }
    }

    #[test]
    fn the_fingerprint_follows_a_configmap_swap() {
        let dir = tempfile::tempdir().unwrap();
        configmap(dir.path(), 0, "a: 1\n");
        let first = fingerprint(dir.path());
        configmap(dir.path(), 1, "a: 2\n");
        assert_ne!(fingerprint(dir.path()), first);
        let second = fingerprint(dir.path());
        assert_eq!(fingerprint(dir.path()), second);
    }

    #[test]
    fn symlink_targets_elsewhere_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("conf");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("p.yaml"), "x: 1\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("p.yaml"), conf.join("p.yaml")).unwrap();
        let dirs = watched_dirs(&conf);
        assert_eq!(dirs.len(), 2);
        assert_eq!(dirs[1], std::fs::canonicalize(&elsewhere).unwrap());
    }
}
