//! What the agent keeps on disk for fleet management, under
//! `<data-dir>/opamp/`:
//!
//! - `instance_uid`: the agent's uid (UUID v7), made once;
//! - `pipelines/` (or `remote.dir`): the managed directory, one file per
//!   remote pipeline, as applied last (the agent starts from it);
//! - `good/`: the last remote set that stayed healthy through its watch
//!   (the last known good);
//! - `staging/`: files of an offer being validated;
//! - `state.json`: the last offer's hash and status, each remote
//!   pipeline's status, the pending marker of an apply not yet proven
//!   healthy (and how many starts it saw), and the offers reverted after
//!   a crash loop.
//!
//! Every file is written to a temporary name and renamed, so a crash
//! leaves the old or the new version, never half of one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// An apply not yet proven healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    /// The offer's hash (hex).
    pub hash: String,
    /// Starts of the agent since the apply began.
    pub starts: u32,
}

/// One remote pipeline's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PipelineStatus {
    /// `APPLYING`, `APPLIED` or `FAILED`.
    pub status: String,
    /// Why it failed (the validation lines).
    #[serde(default)]
    pub error: String,
}

/// `state.json`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// Hash (hex) of the last offer processed.
    #[serde(default)]
    pub hash: String,
    /// Its status: `APPLYING`, `APPLIED` or `FAILED` (empty: none yet).
    #[serde(default)]
    pub status: String,
    /// Why it failed, one pipeline per line.
    #[serde(default)]
    pub error: String,
    /// Each remote pipeline of the offer, by name.
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineStatus>,
    /// Hash (hex) of the last known good set.
    #[serde(default)]
    pub good_hash: String,
    /// The apply not yet proven healthy.
    #[serde(default)]
    pub pending: Option<Pending>,
    /// Offers reverted after a crash loop, with why: never applied again.
    #[serde(default)]
    pub refused: BTreeMap<String, String>,
}

/// The fleet state on disk.
#[derive(Debug)]
pub struct Store {
    /// The fleet state's directory (`<data_dir>/opamp`).
    pub root: PathBuf,
    /// The managed directory.
    pub dir: PathBuf,
    good: PathBuf,
    staging: PathBuf,
    /// The state, as last saved (or about to be).
    pub state: State,
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        if let Ok(f) = std::fs::File::open(d) {
            let _ = f.sync_all();
        }
    }
    Ok(())
}

/// Writes `data` to `path` through a temporary name, without syncing:
/// for many files at once, made durable together by [`sync_fs`]. (One
/// fsync per file made applying 1,000 remote pipelines take 3 s, almost
/// all of it waiting for the disk.)
fn write_unsynced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// Makes everything written under `dir` durable at once: `syncfs(2)` on
/// its file system (files, renames and directory entries), instead of one
/// fsync per file.
fn sync_fs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    // SAFETY: a valid descriptor, open for the duration of the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The pipeline files (`*.yaml`, `*.yml`) of `dir`, sorted, as (file
/// name, path).
pub fn list(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
        .collect();
    v.sort();
    v
}

/// True when `a` and `b` hold the same bytes: the same inode (linked by
/// an earlier mirror), or equal contents.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    if ma.dev() == mb.dev() && ma.ino() == mb.ino() {
        return true;
    }
    ma.len() == mb.len() && matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
}

/// Makes `to`'s pipeline files those of `from`: files `from` lacks are
/// removed, files that differ are hard-linked (copied across file
/// systems) through a temporary name, and files already the same are left
/// alone. Links are safe because no pipeline file is ever written in
/// place (each is replaced by a rename), and they spare the new inodes
/// that made keeping the last known good set of 1,000 pipelines take
/// half a second (ext4's inode allocation after many deletions).
fn mirror(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    let want: BTreeMap<String, PathBuf> = list(from).into_iter().collect();
    for (name, p) in list(to) {
        if !want.contains_key(&name) {
            std::fs::remove_file(p)?;
        }
    }
    for (name, src) in &want {
        let dst = to.join(name);
        if same_file(src, &dst) {
            continue;
        }
        let tmp = dst.with_extension("tmp~");
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if std::fs::hard_link(src, &tmp).is_err() {
            std::fs::copy(src, &tmp)?;
        }
        std::fs::rename(&tmp, &dst)?;
    }
    sync_fs(to)
}

impl Store {
    /// Opens (creating) the store under `data_dir`; `dir` overrides the
    /// managed directory.
    pub fn open(data_dir: &Path, dir: Option<&Path>) -> std::io::Result<Store> {
        let root = data_dir.join("opamp");
        let dir = dir.map_or_else(|| root.join("pipelines"), Path::to_path_buf);
        let good = root.join("good");
        let staging = root.join("staging");
        for d in [&root, &dir, &good, &staging] {
            std::fs::create_dir_all(d)?;
        }
        let state = match std::fs::read(root.join("state.json")) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::error!(error = %e, "opamp/state.json is damaged; starting from an empty fleet state (the managed pipelines stay)");
                State::default()
            }),
            Err(_) => State::default(),
        };
        Ok(Store {
            root,
            dir,
            good,
            staging,
            state,
        })
    }

    /// Writes `state.json`.
    pub fn save(&self) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(&self.state).map_err(std::io::Error::other)?;
        write_atomic(&self.root.join("state.json"), &data)
    }

    /// The instance uid, made (UUID v7) and kept on first use.
    pub fn instance_uid(&self) -> std::io::Result<[u8; 16]> {
        let path = self.root.join("instance_uid");
        if let Ok(t) = std::fs::read_to_string(&path) {
            if let Some(uid) = petrel_opamp::parse_uid(&t) {
                return Ok(uid);
            }
            tracing::warn!(path = %path.display(), "the instance uid file is damaged; a new uid is made");
        }
        let uid = petrel_opamp::new_instance_uid();
        self.set_instance_uid(&uid)?;
        Ok(uid)
    }

    /// Keeps `uid` (one the server assigned).
    pub fn set_instance_uid(&self, uid: &[u8; 16]) -> std::io::Result<()> {
        let text = format!("{}\n", petrel_opamp::uid_text(uid));
        write_atomic(&self.root.join("instance_uid"), text.as_bytes())
    }

    /// Empties the staging directory.
    pub fn clear_staging(&self) -> std::io::Result<()> {
        for (_, p) in list(&self.staging) {
            std::fs::remove_file(p)?;
        }
        Ok(())
    }

    /// Writes an offered file into staging; returns its path. Not synced:
    /// what is committed from staging is made durable by [`Store::sync`].
    pub fn stage(&self, key: &str, body: &[u8]) -> std::io::Result<PathBuf> {
        let p = self.staging.join(key);
        write_unsynced(&p, body)?;
        Ok(p)
    }

    /// Makes the managed directory's files and renames durable, once
    /// after an apply's commits and removals.
    pub fn sync(&self) -> std::io::Result<()> {
        sync_fs(&self.dir)
    }

    /// Moves a staged file into the managed directory, replacing the
    /// pipeline's file of either extension.
    pub fn commit(&self, key: &str, name: &str) -> std::io::Result<()> {
        self.remove(name)?;
        std::fs::rename(self.staging.join(key), self.dir.join(key))
    }

    /// Writes `text` as pipeline `name`'s file `key` (a rollback).
    pub fn restore(&self, key: &str, name: &str, text: &[u8]) -> std::io::Result<()> {
        self.remove(name)?;
        write_atomic(&self.dir.join(key), text)
    }

    /// Removes pipeline `name`'s file from the managed directory.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        for ext in ["yaml", "yml"] {
            match std::fs::remove_file(self.dir.join(format!("{name}.{ext}"))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// The managed directory becomes the last known good.
    pub fn promote(&self) -> std::io::Result<()> {
        mirror(&self.dir, &self.good)
    }

    /// The last known good becomes the managed directory again.
    pub fn revert(&self) -> std::io::Result<()> {
        mirror(&self.good, &self.dir)
    }

    /// The file name (`app.yaml`) pipeline `name` has in the managed
    /// directory, if any.
    pub fn key_of(&self, name: &str) -> Option<String> {
        ["yaml", "yml"]
            .iter()
            .map(|e| format!("{name}.{e}"))
            .find(|k| self.dir.join(k).exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_survives_and_files_move_between_directories() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(d.path(), None).unwrap();
        let uid = s.instance_uid().unwrap();
        assert_eq!(s.instance_uid().unwrap(), uid, "kept");
        s.state.hash = "ab".into();
        s.state.pending = Some(Pending {
            hash: "ab".into(),
            starts: 2,
        });
        s.save().unwrap();
        s.stage("a.yaml", b"x: 1\n").unwrap();
        std::fs::write(s.dir.join("a.yml"), "old").unwrap();
        s.commit("a.yaml", "a").unwrap();
        assert_eq!(
            list(&s.dir)
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            vec!["a.yaml"]
        );
        s.promote().unwrap();
        s.remove("a").unwrap();
        assert!(list(&s.dir).is_empty());
        s.revert().unwrap();
        assert_eq!(
            std::fs::read_to_string(s.dir.join("a.yaml")).unwrap(),
            "x: 1\n"
        );
        let s2 = Store::open(d.path(), None).unwrap();
        assert_eq!(s2.state.pending.as_ref().map(|p| p.starts), Some(2));
        assert_eq!(s2.key_of("a").as_deref(), Some("a.yaml"));
    }

    #[test]
    fn the_last_known_good_set_is_kept_apart_from_later_commits() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), None).unwrap();
        for (k, body) in [("a.yaml", "a: 1\n"), ("b.yaml", "b: 1\n")] {
            s.stage(k, body.as_bytes()).unwrap();
            s.commit(k, k.trim_end_matches(".yaml")).unwrap();
        }
        s.promote().unwrap();
        // A later apply replaces a, removes b and adds c; until it is
        // promoted, the good set is the one before.
        s.stage("a.yaml", b"a: 2\n").unwrap();
        s.commit("a.yaml", "a").unwrap();
        s.remove("b").unwrap();
        s.stage("c.yaml", b"c: 1\n").unwrap();
        s.commit("c.yaml", "c").unwrap();
        let read = |dir: &Path| -> Vec<(String, String)> {
            list(dir)
                .into_iter()
                .map(|(n, p)| (n, std::fs::read_to_string(p).unwrap()))
                .collect()
        };
        assert_eq!(
            read(&s.good),
            vec![
                ("a.yaml".into(), "a: 1\n".into()),
                ("b.yaml".into(), "b: 1\n".into())
            ]
        );
        s.promote().unwrap();
        assert_eq!(read(&s.good), read(&s.dir));
        // Reverting puts the good set back, and the managed directory can
        // be changed again without touching it.
        s.revert().unwrap();
        s.stage("c.yaml", b"c: 2\n").unwrap();
        s.commit("c.yaml", "c").unwrap();
        assert_eq!(
            read(&s.good),
            vec![
                ("a.yaml".into(), "a: 2\n".into()),
                ("c.yaml".into(), "c: 1\n".into())
            ]
        );
    }
}
