//! Delivery loop shared by sinks that write bytes to a blocking writer
//! (files, stdout).

use std::io::Write;
use std::time::Duration;

use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{Encoded, Payload, PayloadReceiver};
use petrel_core::{ComponentMetrics, EventBatch};

/// Most payloads written per blocking call; bounds the latency of acks.
const MAX_PAYLOADS_PER_WRITE: usize = 64;

/// Something the loop can write to and, if asked, make durable.
pub trait Target: Write + Send + 'static {
    /// Makes written data durable (fdatasync for files).
    fn sync(&mut self) -> std::io::Result<()>;

    /// Called before writing a group of payloads: a file remembers its
    /// length, so that a write that fails half way can be undone.
    fn begin(&mut self) -> std::io::Result<()> {
        Ok(())
    }

    /// Undoes a group that failed part way (a short write on a full disk),
    /// so the retry does not leave a torn record and duplicates behind.
    fn rollback(&mut self) {}

    /// After a successful write: is the data where the destination's name
    /// points? A file whose path was deleted, replaced or repointed answers
    /// `Ok(false)` after reopening the path, and the group is written
    /// again there; it is never acknowledged while only in an unlinked
    /// file.
    fn verify(&mut self) -> std::io::Result<bool> {
        Ok(true)
    }
}

/// Encodes `batch` for a sink that writes through [`run`]. Raw lines in
/// the text encoding are the batch's read buffer itself, so the payload
/// shares it instead of copying it: that copy was the worker's largest
/// cost on raw-line pipelines (BENCHMARKS.md section 21).
pub fn encode(encoding: &Encoding, batch: &EventBatch, out: &mut Encoded, m: &ComponentMetrics) {
    if matches!(encoding, Encoding::Text) && batch.verbatim_lines {
        out.shared = Some(batch.buf.clone());
        return;
    }
    let stats = encode_batch(encoding, batch, &mut out.bytes, None);
    super::count_encode_stats(m, &stats);
    out.invalid_utf8 = stats.invalid_utf8;
}

/// Writes payloads until the queue closes. The writes run on tokio's
/// blocking pool so that a stalled destination (a full pipe, a slow disk)
/// never holds a sink runtime thread. Failed writes are retried with
/// backoff; payloads are acknowledged only after a successful write (and
/// sync, when `sync` is set).
pub async fn run<T: Target>(
    mut target: T,
    mut rx: PayloadReceiver,
    sync: bool,
    m: ComponentMetrics,
) {
    // Grows on first use only, as in the blackhole sink: an idle sink of
    // one of many pipelines holds no buffer (64 payloads were 7.7 KB).
    let mut batch: Vec<Payload> = Vec::new();
    let errors = m.error_counter("write_failed");
    loop {
        if rx.recv_many(&mut batch, MAX_PAYLOADS_PER_WRITE).await == 0 {
            return;
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            let work = std::mem::take(&mut batch);
            let joined = tokio::task::spawn_blocking(move || {
                let res = write_group(&mut target, &work, sync);
                (target, work, res)
            })
            .await;
            let Ok((t, work, res)) = joined else {
                // The blocking task panicked: its payloads are dropped
                // unanswered, which reports failed delivery to the sources.
                tracing::error!("sink writer task panicked");
                return;
            };
            target = t;
            batch = work;
            match res {
                Ok(true) => break,
                Ok(false) => {
                    m.error("output_replaced", 1);
                    tracing::warn!("the sink's output was deleted or replaced; reopened it and writing the data again there");
                }
                Err(e) => {
                    errors.inc();
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "sink write failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        for p in batch.drain(..) {
            m.sent_events.inc_by(p.events);
            m.sent_bytes.inc_by(p.data.data().len() as u64);
            p.ack.ack();
        }
    }
}

/// Writes a group; `Ok(false)` when it must be written again (the output
/// was replaced and reopened). On an error the partial group is undone and
/// the output reopened if its path changed, so the retry starts clean.
fn write_group<T: Target>(target: &mut T, work: &[Payload], sync: bool) -> std::io::Result<bool> {
    let res = (|| {
        target.begin()?;
        for p in work {
            target.write_all(p.data.data())?;
        }
        target.flush()?;
        if sync {
            target.sync()?;
        }
        Ok(())
    })();
    match res {
        Ok(()) => target.verify(),
        Err(e) => {
            target.rollback();
            // A path repointed away from a failing device (a symlink to
            // /dev/full, a full disk replaced) is picked up by the retry.
            let _ = target.verify();
            Err(e)
        }
    }
}
