//! The delivery loop the elasticsearch, loki and opentelemetry sinks used
//! before the driver (`super::driver`): kept only while they move onto it,
//! one commit at a time, and removed with the last of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::plugin::{Payload, PayloadReceiver};
use petrel_core::{AckPart, DeliveryMetrics};

use super::congestion::Window;
use super::driver::Compression;
use super::http::BodyEncoding;
/// One request: its body (uncompressed), where each record is in it, and
/// the acknowledgements it completes. A source batch split over several
/// requests is acknowledged through a part that each of its requests
/// holds.
pub(super) struct Request {
    pub(super) body: Vec<u8>,
    /// Each record's JSON text in `body` (without separator or newline).
    pub(super) records: Vec<std::ops::Range<usize>>,
    events: u64,
    pub(super) acks: RequestAcks,
}

/// The acknowledgements a request holds. Unless the request marks itself
/// delivered, dropping it (an error, a cancelled or panicking task) marks
/// every payload it carries as failed: undelivered data is never reported
/// as delivered.
pub(super) struct RequestAcks {
    acks: Vec<Arc<SharedAck>>,
    pub(super) delivered: bool,
}

impl Drop for RequestAcks {
    fn drop(&mut self) {
        if !self.delivered {
            for a in &self.acks {
                a.failed.store(true, std::sync::atomic::Ordering::Release);
            }
        }
    }
}

/// An acknowledgement shared by the requests carrying one payload's events.
/// Answered when the last holder drops it: delivered only if no request
/// carrying its events failed.
struct SharedAck {
    part: parking_lot::Mutex<Option<AckPart>>,
    failed: std::sync::atomic::AtomicBool,
    _charge: petrel_core::MemoryCharge,
}

impl Drop for SharedAck {
    fn drop(&mut self) {
        if let Some(p) = self.part.lock().take() {
            if self.failed.load(std::sync::atomic::Ordering::Acquire) {
                p.nack();
            } else {
                p.ack();
            }
        }
    }
}

/// How requests are cut and sent by [`run_batched`].
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchShape {
    /// Body layout.
    pub encoding: BodyEncoding,
    /// Largest request body before compression.
    pub max_bytes: usize,
    /// Most events per request.
    pub max_events: usize,
    /// Longest wait of the first event of a request.
    pub linger: Duration,
    /// Upper bound of the congestion window.
    pub max_in_flight: usize,
}

/// A sink that delivers the requests [`run_batched`] builds.
pub(super) trait RequestSender: Send + Sync + 'static {
    /// Delivers `req` (retrying as the sink's answers table says) and
    /// acknowledges its payloads.
    fn send_request(
        self: Arc<Self>,
        req: Request,
        window: Arc<Window>,
        dm: DeliveryMetrics,
    ) -> impl std::future::Future<Output = ()> + Send;
}

/// Gathers payloads into requests of `shape` and sends each through
/// `sink`, as many at once as the congestion window allows, until the
/// queue closes and everything was answered.
pub(super) async fn run_batched<S: RequestSender>(
    sink: Arc<S>,
    mut rx: PayloadReceiver,
    shape: BatchShape,
    dm: DeliveryMetrics,
) {
    let window = Window::new(2, shape.max_in_flight, dm.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let mut open = true;
    let mut builder = Builder::new(shape.encoding, shape.max_bytes, shape.max_events);
    while open || !builder.is_empty() {
        // Wait for more data, but no longer than the linger time of the
        // oldest event waiting.
        let got = match builder.deadline(shape.linger) {
            Some(d) if open => tokio::time::timeout_at(d.into(), rx.recv()).await.ok(),
            None if open => Some(rx.recv().await),
            _ => Some(None),
        };
        match got {
            Some(Some(p)) => builder.push(p),
            Some(None) => open = false,
            None => {} // linger expired
        }
        let flush_all = !open
            || builder
                .deadline(shape.linger)
                .is_some_and(|d| d <= Instant::now());
        while let Some(req) = builder.take(flush_all) {
            window.acquire().await;
            let (sink, window, dm) = (sink.clone(), window.clone(), dm.clone());
            tasks.spawn(async move {
                sink.send_request(req, window.clone(), dm).await;
                window.release();
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Gathers payloads into requests.
pub(super) struct Builder {
    encoding: BodyEncoding,
    max_bytes: usize,
    max_events: usize,
    /// (payload bytes, record ends, next record, shared ack) waiting.
    queue: std::collections::VecDeque<(Payload, usize, Arc<SharedAck>)>,
    bytes: usize,
    events: usize,
    since: Option<Instant>,
}

impl Builder {
    pub(super) fn new(encoding: BodyEncoding, max_bytes: usize, max_events: usize) -> Self {
        Self {
            encoding,
            max_bytes,
            max_events,
            queue: Default::default(),
            bytes: 0,
            events: 0,
            since: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn deadline(&self, linger: Duration) -> Option<Instant> {
        self.since.map(|s| s + linger)
    }

    pub(super) fn push(&mut self, mut p: Payload) {
        let ack = std::mem::replace(&mut p.ack, AckPart::detached());
        let charge = std::mem::take(&mut p.charge);
        if p.data.record_ends.is_empty() {
            // Nothing to send (every event filtered out): done at once.
            ack.ack();
            return;
        }
        self.bytes += p.data.bytes.len();
        self.events += p.data.record_ends.len();
        self.since.get_or_insert_with(Instant::now);
        let shared = Arc::new(SharedAck {
            part: parking_lot::Mutex::new(Some(ack)),
            failed: Default::default(),
            _charge: charge,
        });
        self.queue.push_back((p, 0, shared));
    }

    /// The next request if one is full, or any waiting data when `all`.
    pub(super) fn take(&mut self, all: bool) -> Option<Request> {
        if self.queue.is_empty()
            || (!all && self.bytes < self.max_bytes && self.events < self.max_events)
        {
            return None;
        }
        let mut req = Request {
            body: Vec::with_capacity(self.bytes.min(self.max_bytes) + 2),
            records: Vec::new(),
            events: 0,
            acks: RequestAcks {
                acks: Vec::new(),
                delivered: false,
            },
        };
        if self.encoding == BodyEncoding::JsonArray {
            req.body.push(b'[');
        }
        while let Some((p, next, ack)) = self.queue.front_mut() {
            let ends = &p.data.record_ends;
            let mut i = *next;
            let mut added = false;
            while i < ends.len() {
                let start = if i == 0 { 0 } else { ends[i - 1] as usize };
                let end = ends[i] as usize;
                let len = end - start;
                let full =
                    req.events as usize >= self.max_events || req.body.len() + len > self.max_bytes;
                if full && req.events > 0 {
                    break;
                }
                // Records end with a newline; an array wants none.
                let text_end = if p.data.bytes[start..end].ends_with(b"\n") {
                    end - 1
                } else {
                    end
                };
                if self.encoding == BodyEncoding::JsonArray && req.events > 0 {
                    req.body.push(b',');
                }
                let at = req.body.len();
                req.body.extend_from_slice(&p.data.bytes[start..text_end]);
                req.records.push(at..req.body.len());
                if self.encoding == BodyEncoding::Ndjson {
                    req.body.push(b'\n');
                }
                req.events += 1;
                self.bytes = self.bytes.saturating_sub(len);
                self.events = self.events.saturating_sub(1);
                added = true;
                i += 1;
            }
            *next = i;
            if added {
                req.acks.acks.push(ack.clone());
            }
            if i >= ends.len() {
                self.queue.pop_front();
            } else {
                break; // request full
            }
        }
        if self.encoding == BodyEncoding::JsonArray {
            req.body.push(b']');
        }
        self.since = if self.queue.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        Some(req)
    }
}

/// Like [`compress`], for a body that may be sent as it is: without
/// compression it is passed on, not copied.
pub(super) fn compress_shared(c: Compression, body: bytes::Bytes) -> std::io::Result<bytes::Bytes> {
    match c {
        Compression::None => Ok(body),
        _ => compress(c, &body).map(Into::into),
    }
}

pub(super) fn compress(c: Compression, body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    match c {
        Compression::None => Ok(body.to_vec()),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 4),
                flate2::Compression::fast(),
            );
            e.write_all(body)?;
            e.finish()
        }
        Compression::Zstd => zstd::bulk::compress(body, 3),
    }
}
