//! The dead-letter file of the sinks that talk to a store (http,
//! elasticsearch, loki, opentelemetry): records a destination refused for
//! good, set aside one JSON object per line with the status and answer.
//!
//! A line is there whole or not at all, so that `jq`, a replay or any
//! reader sees only complete records:
//! - all lines of one call are written with one positioned write at the
//!   end of the last whole line, then synced;
//! - a failed or short write (a full disk: `ENOSPC` after a partial write)
//!   is cut back to where it started before the error is returned, so the
//!   retry does not append to a fragment;
//! - a fragment left by a crash mid-write is cut away before the next
//!   write (it was never acknowledged: its record is still retried).
//!
//! One lock serialises the writers of the whole process: two sinks (or two
//! requests of one sink) may share a file, and one writer's cut must never
//! remove another's line.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;

/// Serialises every dead-letter write of the process (they are rare).
static WRITE_LOCK: Mutex<()> = Mutex::new(());

/// The context written with each refused record.
#[derive(Debug, Clone, Copy)]
pub struct Refusal<'a> {
    /// Why the record is here: `refused by the endpoint`, or `retries
    /// exhausted` (the sink's `retry` limits).
    pub reason: &'a str,
    /// The HTTP (or protocol) status the destination answered (0 when
    /// there was no answer to give up on).
    pub status: u16,
    /// Its answer, as text (at most what the sink kept of it).
    pub answer: &'a str,
    /// The sink's health key (`pipeline/sink`).
    pub sink: &'a str,
    /// Where the records were sent.
    pub url: &'a str,
}

/// Appends one line per record of `records` to the dead-letter file
/// `path`, all or none of them.
pub fn write<'r>(
    path: &Path,
    records: impl IntoIterator<Item = &'r [u8]>,
    refusal: Refusal<'_>,
) -> io::Result<()> {
    write_each(path, records.into_iter().map(|r| (r, refusal)))
}

/// Appends one line per `(record, refusal)` of `records` to the
/// dead-letter file `path`, all or none of them: records of one request
/// refused for different reasons are set aside in one write.
pub fn write_each<'r, 'a>(
    path: &Path,
    records: impl IntoIterator<Item = (&'r [u8], Refusal<'a>)>,
) -> io::Result<()> {
    let mut lines = Vec::new();
    for (record, refusal) in records {
        line(&mut lines, record, refusal);
    }
    if lines.is_empty() {
        return Ok(());
    }
    let _guard = WRITE_LOCK.lock();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .open(path)?;
    let end = whole_lines_end(&f)?;
    let written = f.write_all_at(&lines, end).and_then(|()| f.sync_data());
    if let Err(e) = written {
        // Whatever part of the lines reached the file goes: the caller
        // retries them all.
        if let Err(cut) = f.set_len(end).and_then(|()| f.sync_data()) {
            tracing::error!(path = %path.display(), error = %cut, "dead letter: cannot cut back a failed write; the next write will");
        }
        return Err(e);
    }
    Ok(())
}

/// One JSON line for `record`: the record itself when it is JSON, else as
/// a string.
fn line(out: &mut Vec<u8>, record: &[u8], r: Refusal<'_>) {
    let record = serde_json::from_slice::<serde_json::Value>(record).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(record).into_owned())
    });
    let v = serde_json::json!({
        "reason": r.reason,
        "status": r.status,
        "answer": r.answer,
        "sink": r.sink,
        "url": r.url,
        "record": record,
    });
    // Serialising a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &v);
    out.push(b'\n');
}

/// The length of the file's whole lines: a trailing fragment (a write cut
/// short by a crash) is cut away.
fn whole_lines_end(f: &File) -> io::Result<u64> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    f.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    // Find the last newline, reading backwards.
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    let mut keep = 0;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact_at(chunk, start)?;
        if let Some(i) = memchr::memrchr(b'\n', chunk) {
            keep = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    tracing::warn!(
        bytes = len - keep,
        "dead letter: a line left incomplete by an earlier failed write is removed (its record was retried)"
    );
    f.set_len(keep)?;
    f.sync_data()?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Refusal<'static> = Refusal {
        reason: "refused by the endpoint",
        status: 400,
        answer: "bad",
        sink: "p/s",
        url: "http://x",
    };

    #[test]
    fn a_fragment_left_by_a_crash_is_cut_before_the_next_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dl.ndjson");
        write(&p, [&b"{\"a\":1}"[..]], R).unwrap();
        // A crash in the middle of the second line.
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        io::Write::write_all(&mut f, b"{\"reason\":\"refused by the en").unwrap();
        write(&p, [&b"{\"a\":2}"[..], &b"not json"[..]], R).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["record"]["a"], 1);
        assert_eq!(lines[1]["record"]["a"], 2);
        assert_eq!(lines[2]["record"], "not json");
        assert_eq!(lines[2]["status"], 400);
    }

    #[test]
    fn a_file_that_is_only_a_fragment_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dl.ndjson");
        std::fs::write(&p, b"{\"reason\":").unwrap();
        write(&p, [&b"{}"[..]], R).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with("{\""), "{text}");
    }
}
