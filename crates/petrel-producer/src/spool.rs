//! The optional disk spool: batches the agent cannot take now, in
//! petrel-spool segments, sent by a background thread (of this process or
//! of a later one with the same directory).

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use petrel_spool::{AppendError, Reader, SharedWriter, Writer, WriterOptions};

use crate::{compress, http, Shared};

/// Payload format version (first byte of every spool record).
const VERSION: u8 = 1;
/// Version, then the record count (u32 LE), then the ndjson lines.
const HEADER: usize = 5;
/// How long a spooled batch may take to become durable.
const DURABLE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Spool {
    writer: SharedWriter,
}

impl Spool {
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> io::Result<Self> {
        let w = Writer::open(
            dir,
            WriterOptions {
                segment_bytes: (max_bytes / 8).clamp(1 << 20, 64 << 20),
                max_bytes,
                allow_oversized: false,
            },
        )?;
        Ok(Self {
            writer: SharedWriter::new(w, Duration::from_millis(10))?,
        })
    }

    /// Appends one batch and waits until it is durable.
    pub(crate) fn append(&self, ndjson: &[u8], count: u32) -> Result<(), String> {
        let ticket = self
            .writer
            .append_with(|v| {
                v.push(VERSION);
                v.extend_from_slice(&count.to_le_bytes());
                v.extend_from_slice(ndjson);
            })
            .map_err(|e: AppendError| e.to_string())?;
        if self.writer.wait_durable(ticket, DURABLE_TIMEOUT) {
            Ok(())
        } else {
            Err(self
                .writer
                .last_error()
                .unwrap_or_else(|| "the spool did not sync in time".into()))
        }
    }

    pub(crate) fn close(&self) {
        let _ = self.writer.close();
    }
}

/// Sends spooled batches one at a time, committing each once the agent
/// admitted it, until the producer stops.
pub(crate) fn sender_loop(s: &Shared) {
    let Some(dir) = s.cfg.spool_dir.clone() else {
        return;
    };
    let mut client = http::Client::new(
        s.endpoint.clone(),
        s.cfg.compression.content_encoding(),
        s.cfg.bearer_token.as_deref(),
        Duration::from_millis(s.cfg.request_timeout_ms),
    );
    let mut out = Vec::new();
    let mut reader: Option<Reader> = None;
    let idle = Duration::from_millis(50);
    loop {
        if s.stop.lock().stop {
            break;
        }
        let r = match &mut reader {
            Some(r) => r,
            None => match Reader::open(&dir) {
                Ok(r) => reader.insert(r),
                // Another producer process reads this spool: try again later.
                Err(_) => {
                    if !s.sleep(Duration::from_secs(1)) {
                        break;
                    }
                    continue;
                }
            },
        };
        let chunk = match r.read(1) {
            Ok(Some(c)) => c,
            Ok(None) => {
                let _ = r.maintain(false);
                if !s.sleep(idle) {
                    break;
                }
                continue;
            }
            Err(_) => {
                if !s.sleep(Duration::from_secs(1)) {
                    break;
                }
                continue;
            }
        };
        let mut stopped = false;
        for range in &chunk.records {
            let rec = &chunk.buf[range.clone()];
            if rec.len() < HEADER || rec[0] != VERSION {
                // Not ours (or a future format): skip rather than loop on it.
                continue;
            }
            let count = u32::from_le_bytes([rec[1], rec[2], rec[3], rec[4]]) as u64;
            let ndjson = &rec[HEADER..];
            let body = match compress(s.cfg.compression, ndjson, &mut out) {
                Ok(()) => &out[..],
                Err(_) => ndjson,
            };
            if !send_until_admitted(s, &mut client, body, count) {
                stopped = true;
                break;
            }
        }
        if stopped {
            break;
        }
        r.complete(chunk.segment, chunk.start, chunk.end);
        let _ = r.maintain(false);
    }
    if let Some(r) = &mut reader {
        let _ = r.maintain(true);
    }
}

/// Retries until admitted (true) or the producer stops (false). A batch
/// the agent refuses for good is counted failed and dropped (true).
fn send_until_admitted(s: &Shared, client: &mut http::Client, body: &[u8], count: u64) -> bool {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let retry_after = match client.post(body) {
            Ok(r) if (200..300).contains(&r.status) => {
                s.counters.sent.fetch_add(count, Ordering::Relaxed);
                s.counters
                    .sent_from_spool
                    .fetch_add(count, Ordering::Relaxed);
                s.down_until_ms.store(0, Ordering::Relaxed);
                return true;
            }
            Ok(r) if matches!(r.status, 408 | 429) || r.status >= 500 => r.retry_after,
            Ok(_) => {
                s.counters.failed.fetch_add(count, Ordering::Relaxed);
                return true;
            }
            Err(_) => None,
        };
        s.counters.retried.fetch_add(1, Ordering::Relaxed);
        // Keep probing at least every 5 s: the spool waits for the agent.
        let wait = s
            .backoff(attempt, retry_after)
            .min(Duration::from_secs(5).max(Duration::from_secs(retry_after.unwrap_or(0))));
        if !s.sleep(wait) {
            return false;
        }
    }
}
