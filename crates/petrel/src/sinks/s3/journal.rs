//! The s3 sink's record of the objects it completes, so that lines read
//! again after a crash land in no second object.
//!
//! Before the call that completes an object (PutObject or
//! CompleteMultipartUpload), one fsynced line records its key, the stream
//! its events came from, its rendered key prefix and the source positions
//! of its first and last events. A source re-reads after a crash only what
//! it had not committed, and commits a line only once the object holding
//! it is complete; so when a restarted sink meets a line inside a recorded
//! object's range:
//! - if it is the object's first line, the object may or may not have
//!   been completed: the lines of its range are sent again as that same
//!   key (an overwrite), and the object is closed at its recorded last
//!   line;
//! - if the first line it meets is a later one, the object's first line
//!   was committed, which only its completion allows: the object is in the
//!   store, and its lines are acknowledged without being sent again;
//! - lines between recorded objects go to new objects that never span a
//!   recorded one.
//!
//! Records older than [`KEEP`] are dropped when the sink starts: a source
//! commits within seconds of an acknowledgement, and only uncommitted
//! lines are read again.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How long a record is kept.
pub const KEEP: Duration = Duration::from_secs(3600);

/// One object as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The stream its events came from (hex).
    #[serde(with = "hex_u128")]
    pub stream: u128,
    /// Its rendered key prefix.
    pub prefix: String,
    /// Source position of its first event.
    pub first: u64,
    /// Source position of its last event.
    pub last: u64,
    /// Its key.
    pub key: String,
    /// When it was recorded (unix seconds).
    pub at: u64,
}

mod hex_u128 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:032x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        let s = String::deserialize(d)?;
        u128::from_str_radix(&s, 16).map_err(serde::de::Error::custom)
    }
}

/// Where a line falls among the recorded objects of its stream and prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Segment {
    /// Inside recorded object `n` (an index of [`Journal::entry`]).
    Entry(u32),
    /// Before recorded object `n` (or after all of them): between two
    /// recorded objects, which a new object must not span.
    Gap(u32),
}

/// The records loaded at start, and the file new ones are appended to.
pub struct Journal {
    path: Option<PathBuf>,
    file: parking_lot::Mutex<Option<std::fs::File>>,
    /// Sorted by stream, prefix and first position.
    entries: Vec<Entry>,
    /// The range of `entries` of each stream and prefix.
    index: HashMap<(u128, String), (u32, u32)>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Journal {
    /// No record at all (no data dir: `petrel test`).
    pub fn none() -> Self {
        Self {
            path: None,
            file: parking_lot::Mutex::new(None),
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Loads the records of `path` younger than [`KEEP`] and rewrites the
    /// file with only those. A torn last line (a crash while appending)
    /// is skipped: its object was never completed.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let oldest = unix_now().saturating_sub(KEEP.as_secs());
        // The latest record of an object (the same stream, prefix and
        // first line) wins: it was sent again after the earlier one.
        let mut latest: HashMap<(u128, String, u64), Entry> = HashMap::new();
        for line in text.lines() {
            if let Ok(e) = serde_json::from_str::<Entry>(line) {
                if e.at >= oldest {
                    latest.insert((e.stream, e.prefix.clone(), e.first), e);
                }
            }
        }
        let mut entries: Vec<Entry> = latest.into_values().collect();
        entries.sort_by(|a, b| (a.stream, &a.prefix, a.first).cmp(&(b.stream, &b.prefix, b.first)));
        let mut kept = Vec::new();
        for e in &entries {
            serde_json::to_writer(&mut kept, e)?;
            kept.push(b'\n');
        }
        petrel_core::state::write_atomic(path, &kept)?;
        let mut index: HashMap<(u128, String), (u32, u32)> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let r = index
                .entry((e.stream, e.prefix.clone()))
                .or_insert((i as u32, i as u32));
            r.1 = i as u32 + 1;
        }
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            file: parking_lot::Mutex::new(Some(file)),
            entries,
            index,
        })
    }

    /// True when no object was recorded before this start.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Recorded object `i`.
    pub fn entry(&self, i: u32) -> &Entry {
        &self.entries[i as usize]
    }

    /// Where the line at `pos` of `stream` under `prefix` falls.
    pub fn segment(&self, stream: u128, prefix: &str, pos: u64) -> Segment {
        // A lookup without allocating: most sinks have no records.
        if self.entries.is_empty() {
            return Segment::Gap(0);
        }
        let Some(&(lo, hi)) = self.index.get(&(stream, prefix.to_string())) else {
            return Segment::Gap(0);
        };
        let slice = &self.entries[lo as usize..hi as usize];
        let after = slice.partition_point(|e| e.first <= pos);
        if after > 0 && slice[after - 1].last >= pos {
            return Segment::Entry(lo + after as u32 - 1);
        }
        Segment::Gap(lo + after as u32)
    }

    /// Appends `e` and syncs it to disk, before the object is completed.
    pub fn record(&self, e: &Entry) -> std::io::Result<()> {
        let mut f = self.file.lock();
        let Some(file) = f.as_mut() else {
            return Ok(());
        };
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        file.write_all(&line)?;
        file.sync_data()
    }

    /// The file, for log lines.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(stream: u128, first: u64, last: u64, key: &str) -> Entry {
        Entry {
            stream,
            prefix: "p/".into(),
            first,
            last,
            key: key.into(),
            at: unix_now(),
        }
    }

    #[test]
    fn records_survive_a_restart_and_place_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s3").join("j");
        let j = Journal::open(&path).expect("open");
        assert!(j.is_empty());
        j.record(&entry(7, 100, 200, "a")).expect("record");
        j.record(&entry(7, 300, 400, "b")).expect("record");
        let mut old = entry(7, 500, 600, "old");
        old.at = 0;
        j.record(&old).expect("record");
        // Sent again, ending earlier: the latest record wins.
        j.record(&entry(7, 100, 150, "a")).expect("record");
        drop(j);
        // A torn last line.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"stream\":"))
            .expect("append");
        let j = Journal::open(&path).expect("reopen");
        assert_eq!(j.entry(0).last, 150);
        assert_eq!(j.segment(7, "p/", 50), Segment::Gap(0));
        assert_eq!(j.segment(7, "p/", 100), Segment::Entry(0));
        assert_eq!(j.segment(7, "p/", 150), Segment::Entry(0));
        assert_eq!(j.segment(7, "p/", 151), Segment::Gap(1));
        assert_eq!(j.segment(7, "p/", 350), Segment::Entry(1));
        assert_eq!(
            j.segment(7, "p/", 550),
            Segment::Gap(2),
            "old records are dropped"
        );
        assert_eq!(j.segment(7, "q/", 120), Segment::Gap(0), "another prefix");
        assert_eq!(j.segment(8, "p/", 120), Segment::Gap(0), "another stream");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 2, "compacted: {text}");
    }
}
