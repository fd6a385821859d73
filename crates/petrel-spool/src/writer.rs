//! Appending records to segments.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{list_segments, segment_name, try_lock_exclusive, MAX_RECORD, RECORD_HEADER};

/// Bytes buffered in memory before they are written to the segment: large
/// enough to make one `write` per network block, small enough that a
/// reader sees data promptly.
const WRITE_BUFFER: usize = 64 << 10;

/// How often a writer that believes the spool is full looks at the disk
/// again (a reader may have deleted segments meanwhile).
const RESCAN_INTERVAL: Duration = Duration::from_millis(10);

/// The largest segment: big enough that creating segments costs nothing
/// at speed, small enough that a finished one is reclaimed soon.
pub const MAX_SEGMENT_BYTES: u64 = 32 << 20;

/// The smallest cap a spool accepts: a few segments of useful size.
pub const MIN_MAX_BYTES: u64 = 1 << 20;

/// Limits of a writer.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// A new segment is started once the current one reaches this size.
    pub segment_bytes: u64,
    /// Appends are refused with [`AppendError::Full`] while the spool's
    /// undelivered bytes (all writers', as the reader's committed
    /// positions say) would exceed this.
    pub max_bytes: u64,
    /// A record larger than `max_bytes` is appended once the spool holds
    /// nothing undelivered (instead of [`AppendError::TooLarge`]), so a
    /// caller that waits for room is never refused for good.
    pub allow_oversized: bool,
}

impl WriterOptions {
    /// Options for a spool capped at `max_bytes`, with segments sized from
    /// the cap: at most a quarter of it (and [`MAX_SEGMENT_BYTES`]), so
    /// that the delivered part of the open segment, which stays on disk
    /// until the segment is rolled, adds at most that much to the cap.
    pub fn for_cap(max_bytes: u64) -> Self {
        Self {
            segment_bytes: (max_bytes / 4).clamp(64 << 10, MAX_SEGMENT_BYTES),
            max_bytes,
            allow_oversized: false,
        }
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self::for_cap(256 << 20)
    }
}

/// Why a record was not appended.
#[derive(Debug)]
pub enum AppendError {
    /// The spool reached its `max_bytes`; nothing was written.
    Full,
    /// The payload is larger than [`crate::MAX_RECORD`], or than the
    /// spool's `max_bytes`: it could never be appended.
    TooLarge,
    /// Writing to the segment fails (a full or read-only disk) and
    /// [`MAX_UNWRITTEN`] bytes already wait in memory; nothing was added.
    Unwritable(String),
}

impl std::fmt::Display for AppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppendError::Full => f.write_str("spool is full"),
            AppendError::TooLarge => write!(
                f,
                "record larger than the spool can hold (at most {MAX_RECORD} bytes and the spool's max_bytes)"
            ),
            AppendError::Unwritable(e) => write!(f, "cannot write the spool: {e}"),
        }
    }
}

/// Records kept in memory while writing to the segment fails: beyond
/// this, appends are refused ([`AppendError::Unwritable`]) instead of
/// growing memory up to the spool's cap.
pub const MAX_UNWRITTEN: usize = 1 << 20;

impl std::error::Error for AppendError {}

/// Appends records to the segments of one spool directory.
pub struct Writer {
    dir: PathBuf,
    opts: WriterOptions,
    /// The segment being appended to, locked; shared with the syncer of
    /// a [`crate::SharedWriter`] so it can sync without the writer's lock.
    file: Option<Arc<File>>,
    seq: u64,
    /// Bytes written to the current segment: its exact length, since
    /// every write appends (`O_APPEND`) and a failed one is cut back.
    seg_len: u64,
    /// Bytes of the current segment known durable: a failure never cuts
    /// the segment below this.
    synced_len: u64,
    /// Records not yet written to the segment.
    buf: Vec<u8>,
    /// Undelivered bytes of the spool as last measured, plus what was
    /// appended since.
    usage: u64,
    last_scan: Instant,
    /// The last write to the segment failed with this (cleared by the
    /// next one that succeeds).
    write_error: Option<String>,
}

impl Writer {
    /// A writer for `dir` (created when missing). No segment is created
    /// before the first record.
    pub fn open(dir: &Path, opts: WriterOptions) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let usage = undelivered_bytes(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            opts,
            file: None,
            seq: 0,
            seg_len: 0,
            synced_len: 0,
            buf: Vec::new(),
            usage,
            last_scan: Instant::now(),
            write_error: None,
        })
    }

    /// The error of the last failed write to the segment, while writing
    /// fails.
    pub fn write_error(&self) -> Option<&str> {
        self.write_error.as_deref()
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Undelivered bytes of the spool as this writer knows them (its
    /// unwritten records included).
    pub fn usage(&self) -> u64 {
        self.usage
    }

    /// Appends one record with `payload`.
    pub fn append(&mut self, payload: &[u8]) -> Result<(), AppendError> {
        self.append_with(|b| b.extend_from_slice(payload))
    }

    /// Appends one record whose payload `fill` writes at the end of the
    /// vector it is given (so a caller can encode straight into the
    /// write buffer). On an error nothing of the record remains.
    pub fn append_with(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> Result<(), AppendError> {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; RECORD_HEADER]);
        fill(&mut self.buf);
        let len = self.buf.len() - start - RECORD_HEADER;
        if len > MAX_RECORD {
            self.buf.truncate(start);
            return Err(AppendError::TooLarge);
        }
        let size = (RECORD_HEADER + len) as u64;
        let oversized = size > self.opts.max_bytes;
        if oversized && !self.opts.allow_oversized {
            self.buf.truncate(start);
            return Err(AppendError::TooLarge);
        }
        if let Some(e) = &self.write_error {
            if start >= MAX_UNWRITTEN {
                let e = e.clone();
                self.buf.truncate(start);
                // The disk may have room again (or the reader deleted the
                // segment we rolled away from): try once more later.
                self.retry_write();
                return Err(AppendError::Unwritable(e));
            }
        }
        if self.usage + size > self.opts.max_bytes && !self.has_room(size, oversized) {
            self.buf.truncate(start);
            return Err(AppendError::Full);
        }
        let crc = crc32c::crc32c(&self.buf[start + RECORD_HEADER..]);
        self.buf[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        self.usage += size;
        if self.buf.len() >= WRITE_BUFFER
            || self.seg_len + self.buf.len() as u64 >= self.opts.segment_bytes
        {
            // The record is appended either way: a failed write leaves it
            // buffered for the next flush or sync, which reports the error.
            // The buffer stays bounded by `max_bytes`.
            let _ = self.flush();
        }
        Ok(())
    }

    /// Measures the spool again (throttled) and says whether `size` more
    /// bytes fit. `buf` already holds the new record's bytes.
    fn has_room(&mut self, size: u64, oversized: bool) -> bool {
        if self.last_scan.elapsed() >= RESCAN_INTERVAL {
            self.last_scan = Instant::now();
            self.rescan(size);
        }
        self.usage + size <= self.opts.max_bytes || (oversized && self.usage == 0)
    }

    /// Measures the undelivered bytes of the spool; rolls the open segment
    /// when everything in it was delivered, so the reader can delete it
    /// (its bytes would otherwise stay on disk until it filled up).
    /// `pending` bytes at the end of `buf` are not appended yet.
    fn rescan(&mut self, pending: u64) {
        let Ok((undelivered, committed)) = measure(&self.dir) else {
            return;
        };
        let buffered = self.buf.len() as u64 - pending.min(self.buf.len() as u64);
        self.usage = undelivered + buffered;
        if self.file.is_some()
            && self.seg_len > 0
            && committed.get(&self.seq).is_some_and(|&c| c >= self.seg_len)
        {
            // Nothing of it is undelivered: no sync needed before letting go.
            self.file = None;
        }
    }

    /// After a failed write: roll a fully delivered segment away (its
    /// deletion frees the disk) and try writing again (throttled).
    fn retry_write(&mut self) {
        if self.last_scan.elapsed() < RESCAN_INTERVAL {
            return;
        }
        self.last_scan = Instant::now();
        // The record being refused was already taken out of `buf`.
        self.rescan(0);
        let _ = self.flush();
    }

    /// Writes the buffered records to the segment (no sync). On an error
    /// the segment is cut back to its last whole record and the records
    /// stay buffered for the next attempt.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            // What failed to be written earlier has been written since.
            self.write_error = None;
            return Ok(());
        }
        if self.file.is_none() {
            if let Err(e) = self.new_segment() {
                self.write_error = Some(e.to_string());
                return Err(e);
            }
        }
        let Some(file) = self.file.clone() else {
            return Err(io::Error::other("no segment open"));
        };
        if let Err(e) = append_all(&file, &self.buf) {
            // Part of the buffer may have reached the file: cut it back to
            // the last whole record, which is at least what was synced.
            // Every write appends, so the next one starts there: no hole,
            // no torn record that a later record would follow.
            let cut = file.set_len(self.seg_len).and_then(|()| file.metadata());
            if cut.map_or(true, |m| m.len() != self.seg_len) {
                // The segment cannot be put right: leave it (its torn end
                // was never acknowledged) and write to a new one.
                self.file = None;
            }
            self.write_error = Some(e.to_string());
            if self.seg_len > 0 {
                // A full disk: once the reader committed this segment,
                // rolling lets it be deleted, which frees the room.
                let now = Instant::now();
                if now.duration_since(self.last_scan) >= RESCAN_INTERVAL {
                    self.last_scan = now;
                    self.rescan(0);
                }
            }
            return Err(e);
        }
        self.write_error = None;
        self.seg_len += self.buf.len() as u64;
        self.buf.clear();
        if self.buf.capacity() > WRITE_BUFFER * 2 {
            // A burst while the disk failed must not pin its memory.
            self.buf.shrink_to(WRITE_BUFFER * 2);
        }
        if self.seg_len >= self.opts.segment_bytes {
            // The finished segment is made durable before its lock goes.
            if let Err(e) = file.sync_data() {
                self.sync_failed(self.seq, self.seg_len);
                return Err(e);
            }
            self.file = None;
        }
        Ok(())
    }

    /// Writes and makes durable every appended record.
    pub fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        if let Some(f) = self.file.clone() {
            if let Err(e) = f.sync_data() {
                self.sync_failed(self.seq, self.seg_len);
                return Err(e);
            }
            self.synced_len = self.seg_len;
        }
        Ok(())
    }

    /// Writes the buffered records and returns the segment to sync, with
    /// its number and length, so the sync itself can run without holding
    /// the writer (then [`Writer::synced`] or [`Writer::sync_failed`]).
    pub(crate) fn flush_for_sync(&mut self) -> io::Result<Option<(Arc<File>, u64, u64)>> {
        self.flush()?;
        Ok(self.file.clone().map(|f| (f, self.seq, self.seg_len)))
    }

    /// Segment `seq` is durable up to `len`.
    pub(crate) fn synced(&mut self, seq: u64, len: u64) {
        if self.file.is_some() && self.seq == seq {
            self.synced_len = self.synced_len.max(len);
        }
    }

    /// Syncing segment `seq` up to `len` failed. After a failed
    /// `fdatasync` the kernel may have dropped the written pages, so what
    /// was written since the last good sync cannot be trusted to reach
    /// the disk: it is read back (the page cache still has it), the
    /// segment is cut to its synced length and left, and the records are
    /// written again to a new segment by the next flush. They were never
    /// acknowledged, so nothing is lost and at most they are read twice.
    pub(crate) fn sync_failed(&mut self, seq: u64, len: u64) {
        let Some(file) = self.file.clone() else {
            return;
        };
        if self.seq != seq || len <= self.synced_len {
            return;
        }
        let from = self.synced_len;
        let mut unsynced = vec![0u8; (self.seg_len - from) as usize];
        let read_back = crate::reader::read_full_at(&file, &mut unsynced, from)
            .is_ok_and(|n| n == unsynced.len());
        if !read_back {
            // Keep the segment as it is: its records may still reach the
            // disk, and a new segment after it keeps the order.
            self.file = None;
            return;
        }
        let _ = file.set_len(from);
        self.file = None;
        unsynced.extend_from_slice(&self.buf);
        self.buf = unsynced;
    }

    /// Drops the writer like a crash would: buffered records are written,
    /// nothing is synced, the lock goes with the descriptor. For tests
    /// of what a reader makes of a writer that died.
    #[doc(hidden)]
    pub fn crash(mut self) {
        let _ = self.flush();
        self.file = None;
        self.buf.clear();
    }

    /// Creates the next segment: under a temporary name, locked, then
    /// renamed without replacing anything, so readers only ever see
    /// segments that are locked or finished.
    fn new_segment(&mut self) -> io::Result<()> {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let newest = crate::list_segments(&self.dir)?
            .last()
            .map(|(s, _)| s + 1)
            .unwrap_or(0);
        let mut seq = now_us.max(newest).max(self.seq + 1);
        let tmp = self
            .dir
            .join(format!(".{}.{}.new", std::process::id(), seq));
        // O_APPEND: every write goes to the end, wherever a failed write
        // left the file position.
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o640)
            .open(&tmp)?;
        if !try_lock_exclusive(&file)? {
            let _ = std::fs::remove_file(&tmp);
            return Err(io::Error::other("cannot lock a new spool segment"));
        }
        loop {
            let target = self.dir.join(segment_name(seq));
            match rename_noreplace(&tmp, &target) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => seq += 1,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            }
        }
        File::open(&self.dir)?.sync_all()?;
        self.file = Some(Arc::new(file));
        self.seq = seq;
        self.seg_len = 0;
        self.synced_len = 0;
        Ok(())
    }
}

/// Appends `buf` to `file`. Tests can make it fail part way
/// ([`fault::fail_writes_after`]), as a disk that fills up does.
fn append_all(mut file: &File, buf: &[u8]) -> io::Result<()> {
    #[cfg(test)]
    if let Some(n) = fault::take_write_budget(buf.len()) {
        file.write_all(&buf[..n])?;
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    file.write_all(buf)
}

/// Undelivered bytes of the spool in `dir`: every segment's length less
/// what its reader committed.
pub fn undelivered_bytes(dir: &Path) -> io::Result<u64> {
    measure(dir).map(|(u, _)| u)
}

/// Undelivered bytes and the reader's committed positions.
fn measure(dir: &Path) -> io::Result<(u64, std::collections::BTreeMap<u64, u64>)> {
    // A damaged state file is the reader's to report; a position past a
    // segment's end counts that segment as empty here, which only makes
    // the cap look roomier until the reader replaces the position.
    let (committed, _) = crate::reader::read_state(dir)?;
    let undelivered = list_segments(dir)?
        .iter()
        .map(|(seq, len)| len.saturating_sub(committed.get(seq).copied().unwrap_or(0)))
        .sum();
    Ok((undelivered, committed))
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.sync();
    }
}

fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from = CString::new(from.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let to = CString::new(to.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: two valid NUL-terminated paths for the duration of the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    // File systems without RENAME_NOREPLACE: a hard link also refuses to
    // replace, and the temporary name is then removed.
    let (from, to) = (
        Path::new(std::ffi::OsStr::from_bytes(from.as_bytes())),
        Path::new(std::ffi::OsStr::from_bytes(to.as_bytes())),
    );
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
}

/// Faults injected by the unit tests (this thread only).
#[cfg(test)]
pub(crate) mod fault {
    use std::cell::Cell;

    thread_local! {
        static WRITE_BUDGET: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// The next writes succeed for `n` bytes in all, then one fails with
    /// ENOSPC after writing what was left of the `n`.
    pub fn fail_writes_after(n: usize) {
        WRITE_BUDGET.with(|b| b.set(Some(n)));
    }

    /// For a write of `len` bytes: `Some(k)` to write `k` and fail.
    pub(super) fn take_write_budget(len: usize) -> Option<usize> {
        WRITE_BUDGET.with(|b| {
            let left = b.get()?;
            if len <= left {
                b.set(Some(left - len));
                None
            } else {
                b.set(None);
                Some(left)
            }
        })
    }
}
