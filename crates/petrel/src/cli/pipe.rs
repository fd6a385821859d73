//! `petrel pipe`: standard input to a spool directory, for programs that
//! log to a pipe (Apache `CustomLog "|..."`, cron jobs) and must never
//! wait for the log pipeline.
//!
//! Input is read in large blocks and appended, as records of whole lines,
//! to spool segments under `--spool-dir`; a `petrel run` with
//! `sources: [{type: spool, path: DIR}]` ingests them whenever it runs.
//! Each block is written to the file at once (a process kill loses
//! nothing that was read) and synced by a background thread every
//! `--sync-interval-ms` and at the end of input. The writer is never
//! made to wait by the pipeline: when the spool holds `--max-bytes` of
//! undelivered data (or the disk refuses writes), new lines are dropped,
//! counted on stderr and in `DIR/pipe-dropped.NAME` (`DIR/pipe-dropped`
//! without `--name`).

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use petrel_spool::{AppendError, SharedWriter, Writer, WriterOptions};

use crate::sources::net::{now_ns, record};

/// Options of `petrel pipe`.
#[derive(Debug, Clone)]
pub struct PipeOptions {
    /// The spool directory.
    pub spool_dir: PathBuf,
    /// Written as the events' `source_address` (`pipe:NAME`).
    pub name: Option<String>,
    /// Spool size cap.
    pub max_bytes: u64,
    /// Longest time written data waits for `fsync`.
    pub sync_interval: Duration,
    /// Lines longer than this are cut into pieces.
    pub max_line_bytes: usize,
}

/// Bytes asked of one read.
const READ_BYTES: usize = 1 << 20;

/// A read shorter than this means the writer is slower than the pipe...
const SHORT_READ: usize = 16 << 10;

/// ...so the next read waits this long, to find more lines at once.
const SHORT_READ_PAUSE: Duration = Duration::from_millis(1);

/// The pipe buffer asked for (see [`grow_pipe_buffer`]).
const PIPE_BUFFER_BYTES: libc::c_int = 1 << 20;

/// What was dropped because the spool was full.
#[derive(Default)]
struct Dropped {
    lines: u64,
    bytes: u64,
    last_report: Option<Instant>,
    /// Why the last lines were dropped, when not because the spool was
    /// full (a disk that refuses writes).
    reason: Option<String>,
}

/// Bytes of `data` (whole lines, except a last cut piece) to put in the
/// next record: at most `limit` unless a single line is longer.
fn next_piece(data: &[u8], limit: usize) -> usize {
    if data.len() <= limit {
        return data.len();
    }
    match memchr::memrchr(b'\n', &data[..limit]) {
        Some(i) => i + 1,
        None => memchr::memchr(b'\n', &data[limit..]).map_or(data.len(), |i| limit + i + 1),
    }
}

/// Checks that the options can work: a record must always fit in the
/// spool, or the pipe would drop everything.
pub fn validate(opts: &PipeOptions) -> anyhow::Result<()> {
    if opts.max_bytes < petrel_spool::MIN_MAX_BYTES {
        anyhow::bail!(
            "--max-bytes {} is below the smallest spool (1MiB); give at least --max-bytes 1MiB",
            opts.max_bytes
        );
    }
    if opts.max_line_bytes as u64 > opts.max_bytes / 2 {
        anyhow::bail!(
            "--max-line-bytes {} is more than half of --max-bytes {}: one long line could fill the spool; lower --max-line-bytes or raise --max-bytes",
            opts.max_line_bytes,
            opts.max_bytes
        );
    }
    Ok(())
}

/// The largest record of whole lines the pipe appends: a small part of
/// the cap, so that a small spool holds many records and frees room as
/// soon as some are delivered.
fn record_limit(opts: &PipeOptions) -> usize {
    ((opts.max_bytes / 8) as usize).clamp(64 << 10, READ_BYTES)
}

/// Copies standard input into the spool until it ends.
pub fn run(opts: &PipeOptions) -> anyhow::Result<()> {
    validate(opts)?;
    let writer = Writer::open(&opts.spool_dir, WriterOptions::for_cap(opts.max_bytes))
        .map_err(|e| anyhow::anyhow!("cannot use spool {}: {e}", opts.spool_dir.display()))?;
    let writer = SharedWriter::new(writer, opts.sync_interval)?;
    let peer = opts.name.as_ref().map(|n| format!("pipe:{n}"));
    let mut stdin = std::io::stdin().lock();
    grow_pipe_buffer();
    // buf[..have] holds input not yet in the spool; the rest of buf is
    // zeroed once and reused. Growing and truncating the vector around
    // every read zeroed 1 MiB per read, which for a writer that sends one
    // line per write() (Apache) was most of the pipe's CPU.
    let mut buf: Vec<u8> = Vec::new();
    let mut have = 0;
    let mut dropped = Dropped::default();
    let mut failed_since: Option<Instant> = None;
    loop {
        if buf.len() < have + READ_BYTES {
            buf.resize(have + READ_BYTES, 0);
        }
        let n = match stdin.read(&mut buf[have..have + READ_BYTES]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("petrel pipe: cannot read standard input: {e}; stopping");
                0
            }
        };
        have += n;
        let eof = n == 0;
        // Whole lines now; an unfinished line waits for its end, unless it
        // is too long or input ended.
        let cut = if eof {
            have
        } else {
            match memchr::memrchr(b'\n', &buf[..have]) {
                Some(i) => i + 1,
                None if have >= opts.max_line_bytes => opts.max_line_bytes,
                None => 0,
            }
        };
        let limit = record_limit(opts);
        let mut done = 0;
        while done < cut {
            let piece = next_piece(&buf[done..cut], limit);
            let lines = &buf[done..done + piece];
            done += piece;
            let appended = writer.append_with(|out| {
                record::encode_lines_header(now_ns(), peer.as_deref(), out);
                out.extend_from_slice(lines);
                if *lines.last().unwrap_or(&b'\n') != b'\n' {
                    out.push(b'\n');
                }
            });
            match appended {
                Ok(_) => {
                    // In the file now: killing this process loses nothing.
                    match writer.flush() {
                        Ok(()) => failed_since = None,
                        Err(e) => {
                            if failed_since.is_none() {
                                eprintln!("petrel pipe: cannot write the spool ({e}); keeping data in memory and retrying");
                                failed_since = Some(Instant::now());
                            }
                        }
                    }
                }
                Err(e) => {
                    if let AppendError::Unwritable(_) = e {
                        if failed_since.is_none() {
                            failed_since = Some(Instant::now());
                        }
                        dropped.reason = Some(e.to_string());
                    }
                    dropped.lines += memchr::memchr_iter(b'\n', lines).count().max(1) as u64;
                    dropped.bytes += lines.len() as u64;
                    report_dropped(opts, &mut dropped, false);
                }
            }
        }
        if cut > 0 {
            buf.copy_within(cut..have, 0);
            have -= cut;
        }
        if eof {
            break;
        }
        if n < SHORT_READ {
            // A writer that sends a line per write() (Apache does) would
            // otherwise cost a read, a spool record and a write per line;
            // meanwhile its lines wait in the pipe's buffer (1 MiB, see
            // grow_pipe_buffer: full only above about 1 GB/s).
            std::thread::sleep(SHORT_READ_PAUSE);
        }
    }
    report_dropped(opts, &mut dropped, true);
    writer
        .close()
        .map_err(|e| anyhow::anyhow!("cannot sync the spool {}: {e}", opts.spool_dir.display()))?;
    Ok(())
}

/// Asks for a 1 MiB pipe buffer on standard input (the kernel's default
/// is 64 KiB; 1 MiB is the default `fs.pipe-max-size` an unprivileged
/// process may ask for), so that the pause after a short read makes a
/// writer wait only above about 1 GB/s instead of 64 MB/s. Not a pipe, or
/// refused: nothing changes.
fn grow_pipe_buffer() {
    // SAFETY: fcntl on this process's own standard input; F_SETPIPE_SZ
    // only changes the kernel buffer of a pipe and fails on anything else.
    unsafe {
        libc::fcntl(libc::STDIN_FILENO, libc::F_SETPIPE_SZ, PIPE_BUFFER_BYTES);
    }
}

/// Says on stderr (at most every 10 s) and in `DIR/pipe-dropped.NAME`
/// (`DIR/pipe-dropped` without a name) how much was dropped.
fn report_dropped(opts: &PipeOptions, d: &mut Dropped, last: bool) {
    if d.lines == 0 {
        return;
    }
    let due = last
        || d.last_report
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
    if !due {
        return;
    }
    d.last_report = Some(Instant::now());
    let why = match &d.reason {
        Some(r) => r.clone(),
        None => format!("undelivered data reached --max-bytes {}", opts.max_bytes),
    };
    eprintln!(
        "petrel pipe: spool {}: {why}: {} line(s), {} byte(s) dropped so far",
        opts.spool_dir.display(),
        d.lines,
        d.bytes
    );
    let name = match &opts.name {
        Some(n) => format!("pipe-dropped.{n}"),
        None => "pipe-dropped".into(),
    };
    let text = format!(
        "{{\"lines\":{},\"bytes\":{},\"pid\":{}}}\n",
        d.lines,
        d.bytes,
        std::process::id()
    );
    let _ = petrel_core::state::write_atomic(&opts.spool_dir.join(name), text.as_bytes());
}
