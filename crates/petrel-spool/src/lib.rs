//! A crash-safe disk spool: what a source accepted from a socket (or a
//! pipe) is appended here before it counts as accepted, and read back by
//! the pipeline like a file is tailed.
//!
//! # Layout
//! A spool is a directory of segment files `<seq:016x>.seg`. A segment is a
//! sequence of records, each `len: u32 LE | crc32c(payload): u32 LE |
//! payload`; a record never spans segments. The payload is opaque here.
//!
//! * A [`Writer`] appends to a segment it holds an exclusive `flock` on,
//!   and starts a new segment after `segment_bytes` (from the cap:
//!   [`WriterOptions::for_cap`]). The cap bounds *undelivered* bytes: the
//!   writer measures the segments less what the reader committed (its
//!   `reader.state`), and lets go of its open segment once everything in
//!   it was delivered, so the reader can delete it. Sequence numbers grow
//!   (at least the current time in microseconds), so a name is never
//!   reused even after every segment was deleted. A segment is created
//!   under a temporary name, locked, then renamed into place, so a reader
//!   never sees a segment that is neither locked nor finished. Several
//!   writers (processes) may share a directory.
//! * A [`Reader`] (one per directory, `reader.lock`) reads records from
//!   every segment, and is told which byte ranges were delivered
//!   ([`Reader::complete`]). Per segment, the delivered prefix is the
//!   committed position, persisted in `reader.state`; a segment no writer
//!   holds any more, fully committed, is deleted.
//! * A crash mid-write leaves a torn last record. A segment whose writer
//!   is gone (its lock released by the kernel) is final: a record that is
//!   incomplete or fails its checksum is skipped up to the next record
//!   whose length fits and whose checksum matches, the skipped bytes are
//!   counted ([`Reader::corrupt_bytes`], [`Reader::damaged_records`]), and
//!   a segment with damaged records is moved to [`QUARANTINE_DIR`] once
//!   read instead of being deleted. A torn tail never causes a crash loop.
//!
//! # Durability
//! [`Writer::sync`] makes every appended record durable (`fdatasync`).
//! [`SharedWriter`] does this as a group commit on its own thread: all the
//! records appended while one sync runs are made durable by the next one,
//! at most every `sync_interval` unless a caller waits for its record
//! ([`SharedWriter::wait_durable`]), which asks for a sync at once.

#![deny(missing_docs)]

mod reader;
mod shared;
mod writer;

pub use reader::{Chunk, Reader, QUARANTINE_DIR};
pub use shared::SharedWriter;
pub use writer::{
    undelivered_bytes, AppendError, Writer, WriterOptions, MAX_SEGMENT_BYTES, MAX_UNWRITTEN,
    MIN_MAX_BYTES,
};

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Bytes before each record's payload: its length and its checksum.
pub const RECORD_HEADER: usize = 8;

/// The largest payload a record may have. Larger appends are refused and
/// a larger length read from disk is corruption.
pub const MAX_RECORD: usize = 256 << 20;

const SEGMENT_SUFFIX: &str = ".seg";

fn segment_name(seq: u64) -> String {
    format!("{seq:016x}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(SEGMENT_SUFFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Segments in `dir` with their sizes, oldest first.
pub fn list_segments(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(seq) = entry.file_name().to_str().and_then(parse_segment_name) else {
            continue;
        };
        // A segment deleted between the listing and the stat is gone.
        if let Ok(m) = entry.metadata() {
            out.push((seq, m.len()));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Bytes of all segments in `dir`.
pub fn spool_bytes(dir: &Path) -> io::Result<u64> {
    Ok(list_segments(dir)?.iter().map(|(_, len)| len).sum())
}

/// Tries to take an exclusive lock on `file` without waiting.
fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    flock(file, libc::LOCK_EX | libc::LOCK_NB)
}

/// True when no other open file description holds a lock on `file`.
fn unlocked(file: &File) -> io::Result<bool> {
    if flock(file, libc::LOCK_SH | libc::LOCK_NB)? {
        flock(file, libc::LOCK_UN)?;
        Ok(true)
    } else {
        Ok(false)
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    // SAFETY: a valid descriptor owned by `file` for the whole call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Replaces `path` with `bytes` atomically (temporary file, sync, rename,
/// directory sync): a crash leaves the old or the new content.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        if let Err(e) = f.write_all(bytes).and_then(|_| f.sync_all()) {
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

#[cfg(test)]
mod tests;
