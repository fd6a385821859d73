//! Reading records back and committing what was delivered.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
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
/// The spool's identity: 32 hex digits, random, made once per directory.
const ID_FILE: &str = "spool.id";

/// Where damaged segments are moved once read, for an operator to look
/// at, instead of being deleted.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Damaged segments kept in [`QUARANTINE_DIR`]; older ones are deleted so
/// a disk that keeps damaging data cannot fill up with them.
const QUARANTINE_KEEP: usize = 8;

/// The committed positions in `dir`'s state file (segment → offset), and
/// what was wrong with the file: a line that is not `<16 hex digits>
/// <offset>` (garbage, a torn write by another tool) is skipped and
/// described, never a reason to refuse the spool.
pub(crate) fn read_state(dir: &Path) -> io::Result<(BTreeMap<u64, u64>, Vec<String>)> {
    let mut committed = BTreeMap::new();
    let mut problems = Vec::new();
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(raw) => {
            let mut bad = 0usize;
            let mut first_bad = None;
            for (no, line) in raw.split(|&b| b == b'\n').enumerate() {
                if line.is_empty() {
                    continue;
                }
                let parsed = std::str::from_utf8(line).ok().and_then(|l| {
                    let mut it = l.split_whitespace();
                    let seq = u64::from_str_radix(it.next()?, 16).ok()?;
                    let off: u64 = it.next()?.parse().ok()?;
                    it.next().is_none().then_some((seq, off))
                });
                match parsed {
                    Some((seq, off)) => {
                        committed.insert(seq, off);
                    }
                    None => {
                        bad += 1;
                        first_bad.get_or_insert(no + 1);
                    }
                }
            }
            if bad > 0 {
                problems.push(format!(
                    "{}: {bad} unreadable line(s), the first at line {}: their segments are read again from their start",
                    path.display(),
                    first_bad.unwrap_or(0)
                ));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok((committed, problems))
}

/// Keeps the committed positions the segments prove: a position past its
/// segment's end, or one where no valid record begins (a damaged state
/// file), is replaced by the segment's start, so its records are read
/// again (duplicates, never a loss), and described in `damage`.
/// Positions of segments that are gone are dropped.
fn prove_committed(
    dir: &Path,
    committed: BTreeMap<u64, u64>,
    damage: &mut Vec<Damage>,
) -> io::Result<BTreeMap<u64, u64>> {
    let mut proven = BTreeMap::new();
    for (seq, off) in committed {
        let path = dir.join(segment_name(seq));
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        let problem = if off > len {
            Some(format!(
                "the read position {off} is past the segment's end ({len} bytes)"
            ))
        } else if off < len && !record_starts_at(&file, off, len)? {
            Some(format!("no valid record begins at the read position {off}"))
        } else {
            None
        };
        match problem {
            None => {
                proven.insert(seq, off);
            }
            Some(p) => damage.push(Damage {
                path: dir.join(STATE_FILE),
                offset: off,
                bytes: 0,
                records: 0,
                what: format!(
                    "{p} of {}: the state file is damaged; the segment is read again from its start (records already delivered may be sent twice)",
                    path.display()
                ),
            }),
        }
    }
    Ok(proven)
}

/// Whether a record can begin at `off` of a segment of `len` bytes: a
/// header with a possible length whose payload, when the file holds all
/// of it, matches its checksum. An incomplete record counts as possible:
/// a live writer may be completing it, or a crash tore it (judged when
/// it is read).
fn record_starts_at(file: &File, off: u64, len: u64) -> io::Result<bool> {
    let mut h = [0u8; RECORD_HEADER];
    if read_full_at(file, &mut h, off)? < RECORD_HEADER {
        return Ok(true);
    }
    let rlen = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as u64;
    if rlen == 0 || rlen > MAX_RECORD as u64 {
        return Ok(false);
    }
    if off + RECORD_HEADER as u64 + rlen > len {
        return Ok(true);
    }
    let mut payload = vec![0u8; rlen as usize];
    let n = read_full_at(file, &mut payload, off + RECORD_HEADER as u64)?;
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    Ok(n == payload.len() && crc32c::crc32c(&payload) == crc)
}

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

/// Damage a reader found, for its caller to log and count: the spool
/// itself only skips it and keeps what follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The segment file (or the state file).
    pub path: PathBuf,
    /// Where in the file the damage begins.
    pub offset: u64,
    /// Bytes skipped (0 for a state file problem).
    pub bytes: u64,
    /// Damaged places: each a record whose length or checksum was wrong,
    /// or an incomplete record at a segment's end.
    pub records: u64,
    /// What it is, in words an operator can act on.
    pub what: String,
}

#[derive(Debug)]
struct Segment {
    file: File,
    /// Next byte to read.
    read_off: u64,
    /// Everything before this was delivered.
    committed: u64,
    /// Records handed out and not yet committed: start → (end,
    /// delivered). Per record, not per chunk, so that a delivered record
    /// is committed without waiting for the rest of its chunk.
    pending: BTreeMap<u64, (u64, bool)>,
    /// No writer holds the segment any more; `end` is where its good
    /// records end.
    end: Option<u64>,
    /// Records were skipped as damaged: quarantined instead of deleted.
    damaged: bool,
}

/// Reads a spool directory; only one reader per directory at a time.
pub struct Reader {
    /// See [`Reader::identity`].
    identity: Option<u128>,
    dir: PathBuf,
    _lock: File,
    segments: BTreeMap<u64, Segment>,
    state_dirty: bool,
    last_state: Instant,
    last_list: Option<Instant>,
    corrupt_bytes: u64,
    damaged_records: u64,
    quarantined: u64,
    /// Damage found and not yet taken by [`Reader::take_damage`].
    damage: Vec<Damage>,
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
        let (committed, problems) = read_state(dir)?;
        let mut damage: Vec<Damage> = problems
            .into_iter()
            .map(|what| Damage {
                path: dir.join(STATE_FILE),
                offset: 0,
                bytes: 0,
                records: 0,
                what,
            })
            .collect();
        let committed = prove_committed(dir, committed, &mut damage)?;
        let identity = match load_or_create_identity(dir) {
            Ok(id) => Some(id),
            Err(e) => {
                // Ids of documents then fall back to server-assigned ones:
                // worse for duplicates, never for loss.
                eprintln!("petrel-spool: no identity for {}: {e}", dir.display());
                None
            }
        };
        let mut reader = Self {
            identity,
            dir: dir.to_path_buf(),
            _lock: lock,
            segments: BTreeMap::new(),
            state_dirty: false,
            last_state: Instant::now(),
            last_list: None,
            corrupt_bytes: 0,
            damaged_records: 0,
            quarantined: 0,
            damage,
        };
        reader.list(&committed)?;
        // A position that was replaced is written back at once, so a
        // restart does not report it again.
        reader.state_dirty = !reader.damage.is_empty();
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

    /// Damaged places skipped since opening: each is a record whose
    /// length or checksum was wrong, after which reading went on at the
    /// next valid record.
    pub fn damaged_records(&self) -> u64 {
        self.damaged_records
    }

    /// Damaged segments moved to [`QUARANTINE_DIR`] since opening.
    pub fn quarantined_segments(&self) -> u64 {
        self.quarantined
    }

    /// The damage found since the last call (a damaged record, a torn or
    /// truncated segment end, a state file that was garbage or named a
    /// position the segments do not hold), oldest first.
    pub fn take_damage(&mut self) -> Vec<Damage> {
        std::mem::take(&mut self.damage)
    }

    /// Looks for segments created since the last listing (at most every
    /// 50 ms), so that [`Reader::backlog_bytes`] counts them before they
    /// are read.
    pub fn refresh(&mut self) -> io::Result<()> {
        if self.last_list.is_none_or(|t| t.elapsed() >= LIST_INTERVAL) {
            self.list(&BTreeMap::new())?;
        }
        Ok(())
    }

    fn report(&mut self, seq: u64, offset: u64, bytes: u64, records: u64, what: String) {
        self.damage.push(Damage {
            path: self.dir.join(segment_name(seq)),
            offset,
            bytes,
            records,
            what,
        });
    }

    /// The spool directory's identity (`spool.id`, made on first open):
    /// with a segment number and an offset it names one record for the
    /// directory's life, so sinks can give what they read stable ids.
    /// `None` when it could neither be read nor written.
    pub fn identity(&self) -> Option<u128> {
        self.identity
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
                    damaged: false,
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
            // Read into spare capacity: zeroing a megabyte before every
            // read was 5 % of a disk-buffered sink's CPU (BENCHMARKS.md).
            let mut buf = BytesMut::with_capacity(want);
            read_full_at_uninit(&seg.file, &mut buf, want, seg.read_off)?;
            let (records, used, problem) = scan(&buf);
            if !records.is_empty() {
                let start = seg.read_off;
                let end = start + used as u64;
                seg.read_off = end;
                for r in &records {
                    seg.pending.insert(
                        start + (r.start - RECORD_HEADER) as u64,
                        (start + r.end as u64, false),
                    );
                }
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
                    // the segment, the rest is judged.
                    if seg.end.is_none() && unlocked(&seg.file)? {
                        let len = seg.file.metadata()?.len();
                        if len > seg.read_off + avail {
                            // It grew before the writer let go: read again.
                            return self.read_segment(seq, max_bytes);
                        }
                        let from = seg.read_off;
                        match next_valid_record(&seg.file, from + 1, len)? {
                            Some(next) => {
                                // Damage in the middle: the records after it
                                // are intact. The skipped bytes count as
                                // delivered so the committed position can
                                // pass them.
                                self.corrupt_bytes += next - from;
                                self.damaged_records += 1;
                                seg.damaged = true;
                                seg.read_off = next;
                                seg.pending.insert(from, (next, true));
                                if seg.committed == from {
                                    seg.pending.remove(&from);
                                    seg.committed = next;
                                    self.state_dirty = true;
                                }
                                self.report(
                                    seq,
                                    from,
                                    next - from,
                                    1,
                                    "a damaged record (wrong length or checksum) was skipped; reading goes on at the next valid record".into(),
                                );
                                return self.read_segment(seq, max_bytes);
                            }
                            None => {
                                // A torn tail (a crash mid-write) or damage
                                // with nothing valid after it.
                                let bytes = len.saturating_sub(from);
                                if matches!(problem, Scan::Corrupt) {
                                    seg.damaged = true;
                                }
                                self.damaged_records += 1;
                                self.corrupt_bytes += bytes;
                                seg.end = Some(from);
                                let what = if matches!(problem, Scan::Corrupt) {
                                    "damaged bytes with no valid record after them were skipped"
                                        .to_string()
                                } else {
                                    "the segment ends inside a record: a crash in the middle of a write (that record was never acknowledged) or a truncated file (its data is lost)".to_string()
                                };
                                self.report(seq, from, bytes, 1, what);
                            }
                        }
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
        // A chunk's range covers its records' entries; one record's
        // range covers just its own.
        for (_, p) in seg.pending.range_mut(start..end) {
            if p.0 <= end {
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
            let damaged = self.segments.get(&seq).is_some_and(|s| s.damaged);
            let path = self.dir.join(segment_name(seq));
            let gone = if damaged {
                self.quarantine(seq, &path)
            } else {
                std::fs::remove_file(&path)
            };
            match gone {
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

    /// Moves a damaged, fully read segment to the quarantine directory
    /// (keeping the newest [`QUARANTINE_KEEP`]).
    fn quarantine(&mut self, seq: u64, path: &Path) -> io::Result<()> {
        let qdir = self.dir.join(QUARANTINE_DIR);
        std::fs::create_dir_all(&qdir)?;
        std::fs::rename(path, qdir.join(segment_name(seq)))?;
        self.quarantined += 1;
        let mut kept = list_segments(&qdir)?;
        while kept.len() > QUARANTINE_KEEP {
            let (old, _) = kept.remove(0);
            let _ = std::fs::remove_file(qdir.join(segment_name(old)));
        }
        File::open(&self.dir)?.sync_all()
    }

    /// Calls `f` with the first `prefix` bytes (fewer for a shorter
    /// record) of every record not yet read, oldest first: to count what
    /// a spool holds at start (its events, say) without reading it all.
    /// A segment is walked up to its first record that is not whole and
    /// valid in length; the checksum is not checked (reading does that).
    pub fn for_each_unread_prefix(
        &self,
        prefix: usize,
        mut f: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut buf = vec![0u8; RECORD_HEADER + prefix];
        for seg in self.segments.values() {
            let len = seg.file.metadata()?.len();
            let mut off = seg.read_off;
            while off + RECORD_HEADER as u64 <= len {
                let n = read_full_at(&seg.file, &mut buf, off)?;
                if n < RECORD_HEADER {
                    break;
                }
                let rlen = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as u64;
                if rlen == 0 || rlen > MAX_RECORD as u64 || off + RECORD_HEADER as u64 + rlen > len
                {
                    break;
                }
                let have = (n - RECORD_HEADER).min(rlen as usize);
                f(&buf[RECORD_HEADER..RECORD_HEADER + have]);
                off += RECORD_HEADER as u64 + rlen;
            }
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

#[derive(Clone, Copy)]
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
        // Writers never append an empty record, and eight zero bytes (a
        // hole left by a failed write, a zero-filled tail after a crash)
        // would pass as one: the checksum of nothing is 0.
        if len == 0 || len > MAX_RECORD {
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

/// How much of a damaged segment is examined at a time when looking for
/// the next valid record.
const RESYNC_WINDOW: usize = 1 << 20;

/// The offset of the first valid record at or after `from` in a finished
/// segment of `len` bytes: a header whose length fits in the segment and
/// whose checksum matches its payload. A random match would need the 32-bit
/// CRC to agree by chance, and most damaged positions are rejected by their
/// length alone, so this costs little even over a large damaged range.
fn next_valid_record(file: &File, from: u64, len: u64) -> io::Result<Option<u64>> {
    let mut base = from;
    while base + RECORD_HEADER as u64 <= len {
        let want = ((len - base) as usize).min(RESYNC_WINDOW + RECORD_HEADER);
        let mut buf = vec![0u8; want];
        let n = read_full_at(file, &mut buf, base)?;
        buf.truncate(n);
        if n < RECORD_HEADER {
            break;
        }
        let last = n - RECORD_HEADER;
        for i in 0..=last.min(RESYNC_WINDOW - 1) {
            let h = &buf[i..i + RECORD_HEADER];
            let rlen = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as u64;
            let at = base + i as u64;
            // Writers never append empty records, and eight zero bytes
            // (a zero-filled tail after a crash) would pass as one.
            if rlen == 0 || rlen > MAX_RECORD as u64 || at + RECORD_HEADER as u64 + rlen > len {
                continue;
            }
            let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            let start = i + RECORD_HEADER;
            let end = start + rlen as usize;
            let ok = if end <= buf.len() {
                crc32c::crc32c(&buf[start..end]) == crc
            } else {
                let mut payload = vec![0u8; rlen as usize];
                read_full_at(file, &mut payload, at + RECORD_HEADER as u64)? == payload.len()
                    && crc32c::crc32c(&payload) == crc
            };
            if ok {
                return Ok(Some(at));
            }
        }
        if n <= RECORD_HEADER {
            break;
        }
        base += (last.min(RESYNC_WINDOW - 1) + 1) as u64;
    }
    Ok(None)
}

/// Appends up to `want` bytes of `file` from `off` to `buf` (whose spare
/// capacity is at least `want`) without initialising them first; stops
/// early at the end of the file.
fn read_full_at_uninit(
    file: &File,
    buf: &mut BytesMut,
    want: usize,
    mut off: u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    buf.reserve(want);
    let end = buf.len() + want;
    while buf.len() < end {
        let left = end - buf.len();
        let spare = buf.spare_capacity_mut();
        let len = left.min(spare.len());
        // SAFETY: pread writes at most `len` bytes into the spare
        // capacity, which has room for `len`; only the bytes it reports
        // written are then counted as initialised.
        let r = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                len,
                off as libc::off_t,
            )
        };
        match r {
            0 => break,
            k if k > 0 => {
                // SAFETY: pread initialised these `k` bytes.
                unsafe { buf.set_len(buf.len() + k as usize) };
                off += k as u64;
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn read_full_at(file: &File, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
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

/// Reads the spool's identity, or makes one (random, written atomically)
/// for a directory that has none. Segment numbers are microsecond times,
/// so (identity, segment, offset) names one record for the directory's
/// whole life; a directory deleted and made again gets a new identity.
fn load_or_create_identity(dir: &Path) -> io::Result<u128> {
    let path = dir.join(ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return u128::from_str_radix(text.trim(), 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not 32 hex digits", path.display()),
                )
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut raw = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let id = u128::from_le_bytes(raw);
    let tmp = dir.join(format!(".{ID_FILE}.{}", std::process::id()));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(format!("{id:032x}\n").as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(id)
}
