//! Durable file offsets.
//!
//! One JSON file in the data directory holds, for every pipeline's file
//! source, the acknowledged offset of each file by identity. It is replaced
//! atomically (write a temporary file, fsync, rename, fsync the directory),
//! so a crash leaves either the old or the new version, never a torn one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::identity::{FileId, Fingerprint};

/// The acknowledged state of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Identity.
    pub id: FileId,
    /// Fingerprint when the offset was committed.
    pub fingerprint: Fingerprint,
    /// Every byte below this was delivered.
    pub offset: u64,
    /// Last known path (informational).
    pub path: String,
    /// When the file was last seen (unix seconds, to the hour); entries
    /// of files not seen for `checkpoint_ttl` are forgotten.
    pub seen: u64,
}

/// Entries keyed by source key (`pipeline/source id`) then identity.
pub type Snapshot = HashMap<String, HashMap<FileId, Entry>>;

/// Reads and writes the checkpoint file.
#[derive(Debug)]
pub struct CheckpointStore {
    path: PathBuf,
    last_written: Option<String>,
}

impl CheckpointStore {
    /// The store in `data_dir` (created if missing).
    pub fn open(data_dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        Ok(Self {
            path: data_dir.join("checkpoints.json"),
            last_written: None,
        })
    }

    /// Path of the checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the last written snapshot; a missing file is an empty one. A
    /// corrupt file is an error, so that it is never silently replaced.
    pub fn load(&self) -> std::io::Result<Snapshot> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Snapshot::new()),
            Err(e) => return Err(e),
        };
        let bad = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: {what}; move the file away to start over (files are then read per `read_from`)",
                    self.path.display()
                ),
            )
        };
        let v: Value =
            serde_json::from_str(&text).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
        let mut out = Snapshot::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let sources = v
            .get("sources")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("missing `sources` object"))?;
        for (key, files) in sources {
            let mut map = HashMap::new();
            for f in files
                .as_array()
                .ok_or_else(|| bad("`sources.*` must be a list"))?
            {
                let num = |k: &str| {
                    f.get(k)
                        .and_then(Value::as_u64)
                        .ok_or_else(|| bad(&format!("entry without `{k}`")))
                };
                let e = Entry {
                    id: FileId {
                        dev: num("dev")?,
                        ino: num("ino")?,
                    },
                    fingerprint: Fingerprint {
                        len: num("fp_len")? as u32,
                        hash: num("fp_hash")?,
                    },
                    offset: num("offset")?,
                    path: f
                        .get("path")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    // Older checkpoints have no stamp: count from now.
                    seen: f.get("seen").and_then(Value::as_u64).unwrap_or(now),
                };
                map.insert(e.id, e);
            }
            out.insert(key.clone(), map);
        }
        Ok(out)
    }

    /// Writes `snap` atomically if it differs from the last write. Returns
    /// true when a write happened.
    pub fn save(&mut self, snap: &Snapshot) -> std::io::Result<bool> {
        let mut keys: Vec<&String> = snap.keys().collect();
        keys.sort();
        let mut sources = serde_json::Map::new();
        for k in keys {
            let mut entries: Vec<&Entry> = snap[k].values().collect();
            entries.sort_by_key(|e| e.id);
            let list: Vec<Value> = entries
                .iter()
                .map(|e| {
                    json!({
                        "dev": e.id.dev, "ino": e.id.ino,
                        "fp_len": e.fingerprint.len, "fp_hash": e.fingerprint.hash,
                        "offset": e.offset, "path": e.path, "seen": e.seen,
                    })
                })
                .collect();
            sources.insert(k.clone(), Value::Array(list));
        }
        let text = serde_json::to_string_pretty(&json!({ "version": 1, "sources": sources }))
            .unwrap_or_default();
        if self.last_written.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        // The file source keeps every source's offsets in one file (one
        // write per second for all of them), with the shared atomic write.
        petrel_core::state::write_atomic(&self.path, text.as_bytes())?;
        self.last_written = Some(text);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_skip_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = CheckpointStore::open(dir.path()).unwrap();
        assert!(s.load().unwrap().is_empty());
        let id = FileId { dev: 1, ino: 2 };
        let mut snap = Snapshot::new();
        snap.entry("p/file_0".into()).or_default().insert(
            id,
            Entry {
                id,
                fingerprint: Fingerprint { len: 3, hash: 99 },
                offset: 1234,
                path: "/x".into(),
                seen: 1_700_000_000,
            },
        );
        assert!(s.save(&snap).unwrap());
        assert!(!s.save(&snap).unwrap());
        let back = CheckpointStore::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(back, snap);
    }

    #[test]
    fn corrupt_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("checkpoints.json"), "{oops").unwrap();
        let err = CheckpointStore::open(dir.path())
            .unwrap()
            .load()
            .unwrap_err();
        assert!(err.to_string().contains("move the file away"), "{err}");
    }
}
