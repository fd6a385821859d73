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
//! made to wait by the pipeline: when the spool reaches `--max-bytes`,
//! new lines are dropped, counted on stderr and in `DIR/pipe-dropped.NAME`
//! (`DIR/pipe-dropped` without `--name`).

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

/// What was dropped because the spool was full.
#[derive(Default)]
struct Dropped {
    lines: u64,
    bytes: u64,
    last_report: Option<Instant>,
}

/// Copies standard input into the spool until it ends.
pub fn run(opts: &PipeOptions) -> anyhow::Result<()> {
    let writer = Writer::open(
        &opts.spool_dir,
        WriterOptions {
            max_bytes: opts.max_bytes,
            ..WriterOptions::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("cannot use spool {}: {e}", opts.spool_dir.display()))?;
    let writer = SharedWriter::new(writer, opts.sync_interval)?;
    let peer = opts.name.as_ref().map(|n| format!("pipe:{n}"));
    let mut stdin = std::io::stdin().lock();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BYTES * 2);
    let mut dropped = Dropped::default();
    let mut failed_since: Option<Instant> = None;
    loop {
        let have = buf.len();
        buf.resize(have + READ_BYTES, 0);
        let n = match stdin.read(&mut buf[have..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                buf.truncate(have);
                continue;
            }
            Err(e) => {
                buf.truncate(have);
                eprintln!("petrel pipe: cannot read standard input: {e}; stopping");
                0
            }
        };
        buf.truncate(have + n);
        let eof = n == 0;
        // Whole lines now; an unfinished line waits for its end, unless it
        // is too long or input ended.
        let cut = if eof {
            buf.len()
        } else {
            match memchr::memrchr(b'\n', &buf) {
                Some(i) => i + 1,
                None if buf.len() >= opts.max_line_bytes => opts.max_line_bytes,
                None => 0,
            }
        };
        if cut > 0 {
            let lines = &buf[..cut];
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
                Err(AppendError::Full) | Err(AppendError::TooLarge) => {
                    dropped.lines += memchr::memchr_iter(b'\n', lines).count().max(1) as u64;
                    dropped.bytes += lines.len() as u64;
                    report_dropped(opts, &mut dropped, false);
                }
            }
            buf.drain(..cut);
        }
        if eof {
            break;
        }
    }
    report_dropped(opts, &mut dropped, true);
    writer
        .close()
        .map_err(|e| anyhow::anyhow!("cannot sync the spool {}: {e}", opts.spool_dir.display()))?;
    Ok(())
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
    eprintln!(
        "petrel pipe: spool {} is full (--max-bytes {}): {} line(s), {} byte(s) dropped so far",
        opts.spool_dir.display(),
        opts.max_bytes,
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
