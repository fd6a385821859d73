//! Reading records back and committing what was delivered.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::{
    list_segments, segment_name, try_lock_exclusive, unlocked, write_atomic, MAX_RECORD,
    RECORD_HEADER,
};

const STATE_FILE: &str = "reader.state";
const LOCK_FILE: &str = "reader.lock";

/// The state file is rewritten at most this often (each write syncs).
const STATE_INTERVAL: Duration = Duration::from_millis(100);

/// The directory is listed again at most this often when nothing new is
/// known (new segments of other writers).
const LIST_INTERVAL: Duration = Duration::from_millis(50);

/// Records read from one segment, in one buffer.
#[derive(Debug)]
pub struct Chunk {
    /// The segment they come from.
    pub segment: u64,
    /// Offset of the first record's header in the segment.
    pub start: u64,
    /// Offset just after the last record.
    pub end: u64,
    /// The bytes read; `records` point into it.
    pub buf: Bytes,
    /// Each record's payload.
    pub records: Vec<Range<usize>>,
}

#[derive(Debug)]
struct Segment {
    file: File,
    /// Next byte to read.
    read_off: u64,
    /// Everything before this was delivered.
    committed: u64,
    /// Chunks handed out and not yet committed: start → (end, delivered).
    pending: BTreeMap<u64, (u64, bool)>,
    /// No writer holds the segment any more; `end` is where its good
    /// records end.
    end: Option<u64>,
}

/// Reads a spool directory; only one reader per directory at a time.
pub struct Reader {
    dir: PathBuf,
    _lock: File,
    segments: BTreeMap<u64, Segment>,
    state_dirty: bool,
    last_state: Instant,
    last_list: Option<Instant>,
    corrupt_bytes: u64,
}

impl Reader {
    /// Opens `dir` (created when missing) and resumes from the committed
    /// positions. Fails when another reader has it open.
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))?;
        if !try_lock_exclusive(&lock)? {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "spool {} is already read by another process (or another source); give each reader its own spool directory",
                    dir.display()
                ),
            ));
        }
        let mut committed = BTreeMap::new();
        match std::fs::read_to_string(dir.join(STATE_FILE)) {
            Ok(text) => {
                for line in text.lines() {
                    let mut it = line.split_whitespace();
                    if let (Some(seq), Some(off)) = (it.next(), it.next()) {
                        if let (Ok(seq), Ok(off)) = (u64::from_str_radix(seq, 16), off.parse()) {
                            committed.insert(seq, off);
                        }
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut reader = Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            segments: BTreeMap::new(),
            state_dirty: false,
            last_state: Instant::now(),
            last_list: None,
            corrupt_bytes: 0,
        };
        reader.list(&committed)?;
        Ok(reader)
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes after the good prefix of segments whose writer died
    /// mid-record (or whose data was damaged), skipped since opening.
    pub fn corrupt_bytes(&self) -> u64 {
        self.corrupt_bytes
    }

    /// Segments currently known.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Picks up segments created since the last listing.
    fn list(&mut self, committed: &BTreeMap<u64, u64>) -> io::Result<()> {
        self.last_list = Some(Instant::now());
        for (seq, _) in list_segments(&self.dir)? {
            if self.segments.contains_key(&seq) {
                continue;
            }
            let file = match File::open(self.dir.join(segment_name(seq))) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let start = committed.get(&seq).copied().unwrap_or(0);
            self.segments.insert(
                seq,
                Segment {
                    file,
                    read_off: start,
                    committed: start,
                    pending: BTreeMap::new(),
                    end: None,
                },
            );
        }
        Ok(())
    }

    /// The next records (at most about `max_bytes`, at least one whole
    /// record), from the oldest segment that has any; `None` when nothing
    /// new is there.
    pub fn read(&mut self, max_bytes: usize) -> io::Result<Option<Chunk>> {
        if let Some(c) = self.read_known(max_bytes)? {
            return Ok(Some(c));
        }
        if self.last_list.is_none_or(|t| t.elapsed() >= LIST_INTERVAL) {
            self.list(&BTreeMap::new())?;
            return self.read_known(max_bytes);
        }
        Ok(None)
    }

    fn read_known(&mut self, max_bytes: usize) -> io::Result<Option<Chunk>> {
        let seqs: Vec<u64> = self.segments.keys().copied().collect();
        for seq in seqs {
            if let Some(c) = self.read_segment(seq, max_bytes)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    fn read_segment(&mut self, seq: u64, max_bytes: usize) -> io::Result<Option<Chunk>> {
        let Some(seg) = self.segments.get_mut(&seq) else {
            return Ok(None);
        };
        if seg.end.is_some_and(|e| seg.read_off >= e) {
            return Ok(None);
        }
        let len = seg.file.metadata()?.len();
        let avail = len.saturating_sub(seg.read_off);
        if avail == 0 {
            // At the end: finished if no writer holds it any more. Look
            // at the length again after the lock, so bytes written just
            // before the writer let go are not mistaken for missing.
            if seg.end.is_none() && unlocked(&seg.file)? {
                let len = seg.file.metadata()?.len();
                // Shorter than committed: the system crashed before the
                // segment's tail reached the disk, after it was delivered.
                if len <= seg.read_off {
                    seg.end = Some(seg.read_off);
                    return Ok(None);
                }
                return self.read_segment(seq, max_bytes);
            }
            return Ok(None);
        }
        let mut want = avail.min(max_bytes.max(RECORD_HEADER) as u64) as usize;
        loop {
            let mut buf = BytesMut::zeroed(want);
            let n = read_full_at(&seg.file, &mut buf, seg.read_off)?;
            buf.truncate(n);
            let (records, used, problem) = scan(&buf);
            if !records.is_empty() {
                let start = seg.read_off;
                let end = start + used as u64;
                seg.read_off = end;
                seg.pending.insert(start, (end, false));
                buf.truncate(used);
                return Ok(Some(Chunk {
                    segment: seq,
                    start,
                    end,
                    buf: buf.freeze(),
                    records,
                }));
            }
            match problem {
                // The first record is larger than what was read: read it
                // whole.
                Scan::NeedMore(total) if total <= avail as usize && total > want => {
                    want = total;
                    continue;
                }
                Scan::NeedMore(_) | Scan::Corrupt => {
                    // A writer may still be completing it; once none holds
                    // the segment, the rest is a torn or damaged tail.
                    if seg.end.is_none() && unlocked(&seg.file)? {
                        let len = seg.file.metadata()?.len();
                        if len > seg.read_off + avail {
                            // It grew before the writer let go: read again.
                            return self.read_segment(seq, max_bytes);
                        }
                        self.corrupt_bytes += len.saturating_sub(seg.read_off);
                        seg.end = Some(seg.read_off);
                    }
                    return Ok(None);
                }
                Scan::Done => return Ok(None),
            }
        }
    }

    /// Says that the chunk `start..end` of `segment` was delivered. Its
    /// bytes count as committed once every earlier chunk was delivered too.
    pub fn complete(&mut self, segment: u64, start: u64, end: u64) {
        let Some(seg) = self.segments.get_mut(&segment) else {
            return;
        };
        if let Some(p) = seg.pending.get_mut(&start) {
            if p.0 == end {
                p.1 = true;
            }
        }
        while let Some((&s, &(e, done))) = seg.pending.first_key_value() {
            if !done || s != seg.committed {
                break;
            }
            seg.pending.remove(&s);
            seg.committed = e;
            self.state_dirty = true;
        }
    }

    /// Deletes finished, fully committed segments and persists the
    /// committed positions (at most every 100 ms unless `force`).
    pub fn maintain(&mut self, force: bool) -> io::Result<()> {
        let done: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.end.is_some_and(|e| s.committed >= e) && s.pending.is_empty())
            .map(|(q, _)| *q)
            .collect();
        for seq in done {
            match std::fs::remove_file(self.dir.join(segment_name(seq))) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.segments.remove(&seq);
            self.state_dirty = true;
        }
        if self.state_dirty && (force || self.last_state.elapsed() >= STATE_INTERVAL) {
            let mut text = String::new();
            for (seq, s) in &self.segments {
                if s.committed > 0 {
                    text.push_str(&format!("{seq:016x} {}\n", s.committed));
                }
            }
            write_atomic(&self.dir.join(STATE_FILE), text.as_bytes())?;
            self.state_dirty = false;
            self.last_state = Instant::now();
        }
        Ok(())
    }

    /// Bytes read but not yet committed.
    pub fn uncommitted_bytes(&self) -> u64 {
        self.segments
            .values()
            .map(|s| s.read_off - s.committed)
            .sum()
    }

    /// Bytes in segments not read yet (as of the last look at the files).
    pub fn backlog_bytes(&self) -> u64 {
        self.segments
            .values()
            .map(|s| {
                let len = s.file.metadata().map(|m| m.len()).unwrap_or(0);
                s.end.unwrap_or(len).saturating_sub(s.read_off)
            })
            .sum()
    }

    /// Nothing unread, nothing pending, and every segment deleted or
    /// still held by a writer.
    pub fn is_idle(&self) -> bool {
        self.segments.values().all(|s| s.pending.is_empty())
    }
}

enum Scan {
    /// Every byte formed whole records.
    Done,
    /// The next record needs this many bytes in all (header included).
    NeedMore(usize),
    /// The next record has an impossible length or a wrong checksum.
    Corrupt,
}

/// Whole, valid records at the start of `buf`: their payload ranges, the
/// bytes they cover, and what stopped the scan.
fn scan(buf: &[u8]) -> (Vec<Range<usize>>, usize, Scan) {
    let mut records = Vec::new();
    let mut p = 0;
    loop {
        let rest = &buf[p..];
        if rest.is_empty() {
            return (records, p, Scan::Done);
        }
        if rest.len() < RECORD_HEADER {
            return (records, p, Scan::NeedMore(RECORD_HEADER));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD {
            return (records, p, Scan::Corrupt);
        }
        let total = RECORD_HEADER + len;
        if rest.len() < total {
            return (records, p, Scan::NeedMore(total));
        }
        if crc32c::crc32c(&rest[RECORD_HEADER..total]) != crc {
            return (records, p, Scan::Corrupt);
        }
        records.push(p + RECORD_HEADER..p + total);
        p += total;
    }
}

fn read_full_at(file: &File, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                off += k as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
