//! Durable state of sources: a small blob per source, replaced atomically.
//!
//! Any source can keep what it needs to resume after a restart (offsets
//! of files, the sequence numbers of a spool, container bookkeeping) as
//! one blob under its key. A write goes to a temporary file that is
//! synced, renamed over the old one and followed by a sync of the
//! directory, so a crash leaves either the old or the new state, never a
//! torn one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` atomically (write a temporary file, sync,
/// rename, sync the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        if let Err(e) = f.write_all(bytes).and_then(|_| f.sync_all()) {
            // Leave no half-written temporary behind on a full disk.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The state blob of one source, kept under `<data dir>/state/`.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    /// The store of source `key` (`pipeline/source id`) in `data_dir`.
    /// The key is escaped into one file name.
    pub fn new(data_dir: &Path, key: &str) -> Self {
        let mut name = String::with_capacity(key.len() + 6);
        for c in key.chars() {
            match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => name.push(c),
                other => name.push_str(&format!("%{:02X}", other as u32)),
            }
        }
        name.push_str(".state");
        Self {
            path: data_dir.join("state").join(name),
        }
    }

    /// Where the blob lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last saved blob, or `None` when there is none yet.
    pub fn load(&self) -> std::io::Result<Option<Vec<u8>>> {
        match std::fs::read(&self.path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the blob atomically.
    pub fn save(&self, blob: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_atomic(&self.path, blob)
    }

    /// Forgets the blob (a source removed for good).
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_replace_remove() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::new(dir.path(), "web/syslog in");
        assert!(s.path().ends_with("state/web%2Fsyslog%20in.state"));
        assert_eq!(s.load().unwrap(), None);
        s.save(b"seq=1").unwrap();
        s.save(b"seq=2").unwrap();
        assert_eq!(s.load().unwrap().as_deref(), Some(&b"seq=2"[..]));
        assert!(!s.path().with_extension("state.tmp").exists());
        s.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
    }
}
