//! Step 1 of the driver: payloads gathered into requests, and the
//! acknowledgements a request completes.
//!
//! A source batch may be cut over several requests; each request then
//! holds a share of the batch's acknowledgement, answered when the last
//! share goes: delivered only if every request carrying its events was.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use petrel_core::plugin::Payload;
use petrel_core::{AckPart, MemoryCharge};

/// How records are laid out in a request body: what opens and closes it,
/// what stands between two records and after each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// Before the first record.
    pub open: &'static [u8],
    /// Between two records.
    pub between: &'static [u8],
    /// After every record.
    pub after_each: &'static [u8],
    /// After the last record.
    pub close: &'static [u8],
}

impl Framing {
    /// One record per line.
    pub const NDJSON: Framing = Framing {
        open: b"",
        between: b"",
        after_each: b"\n",
        close: b"",
    };
    /// One JSON array of the records.
    pub const JSON_ARRAY: Framing = Framing {
        open: b"[",
        between: b",",
        after_each: b"",
        close: b"]",
    };
}

/// The records of one request as the sink encoded them, in one body
/// laid out by the sink's [`Framing`].
#[derive(Debug)]
pub struct Batch {
    /// The framed records; shared, not copied, by every attempt that
    /// sends all of them.
    pub body: Bytes,
    /// Each record's range in `body` (without framing and without the
    /// newline that ends an encoded record).
    pub records: Vec<Range<usize>>,
}

impl Batch {
    /// How many records the batch holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Record `i`.
    pub fn record(&self, i: usize) -> &[u8] {
        &self.body[self.records[i].clone()]
    }

    /// The body of the records `items` (indices of records) laid out by
    /// `framing`: the batch's own body when that is all of them.
    pub fn framed(&self, items: Selection<'_>, framing: Framing) -> Bytes {
        if items.is_all() {
            return self.body.clone();
        }
        let size: usize = items
            .iter()
            .map(|i| self.records[i].len() + framing.between.len() + framing.after_each.len())
            .sum();
        let mut body = Vec::with_capacity(size + framing.open.len() + framing.close.len());
        body.extend_from_slice(framing.open);
        for (n, i) in items.iter().enumerate() {
            if n > 0 {
                body.extend_from_slice(framing.between);
            }
            body.extend_from_slice(self.record(i));
            body.extend_from_slice(framing.after_each);
        }
        body.extend_from_slice(framing.close);
        body.into()
    }
}

/// The items of a request that one attempt sends: indices into what the
/// sink's plan made of the request (its records, unless the sink says
/// otherwise), in ascending order.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    items: &'a [u32],
    all: bool,
}

impl<'a> Selection<'a> {
    /// `items` (ascending) of a request of `total` items.
    pub fn new(items: &'a [u32], total: usize) -> Self {
        // Ascending and unique, so as many as the total are all of them.
        Self {
            items,
            all: items.len() == total,
        }
    }

    /// The item indices.
    pub fn iter(&self) -> impl Iterator<Item = usize> + 'a {
        self.items.iter().map(|&i| i as usize)
    }

    /// How many items are selected.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// True when every item of the request is selected, in order.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// The first selected item.
    pub fn first(&self) -> Option<usize> {
        self.items.first().map(|&i| i as usize)
    }
}

/// One request as the builder cut it: its body, where each record is in
/// it, and the acknowledgements it completes.
pub(super) struct Request {
    pub(super) body: Vec<u8>,
    /// Each record's text in `body` (without framing or newline).
    pub(super) records: Vec<Range<usize>>,
    events: u64,
    pub(super) acks: RequestAcks,
}

/// The acknowledgements a request holds. Unless the request marks itself
/// delivered, dropping it (an error, a cancelled or panicking task) marks
/// every payload it carries as failed: undelivered data is never reported
/// as delivered.
pub(crate) struct RequestAcks {
    pub(crate) acks: Vec<Arc<SharedAck>>,
    pub(crate) delivered: bool,
}

impl RequestAcks {
    /// A charge of `bytes` to the memory budget of the request's first
    /// payload (a sink's payloads all come from its pipeline): within the
    /// budget's limits, or regardless of them when `force`.
    pub(crate) fn charge(&self, bytes: usize, force: bool) -> Option<MemoryCharge> {
        let Some(first) = self.acks.first() else {
            return Some(MemoryCharge::none());
        };
        if force {
            Some(first.charge.more(bytes))
        } else {
            first.charge.try_more(bytes)
        }
    }
}

impl Drop for RequestAcks {
    fn drop(&mut self) {
        if !self.delivered {
            for a in &self.acks {
                a.failed.store(true, Ordering::Release);
            }
        }
    }
}

/// An acknowledgement shared by the requests carrying one payload's events.
/// Answered when the last holder drops it: delivered only if no request
/// carrying its events failed.
pub(crate) struct SharedAck {
    pub(crate) part: parking_lot::Mutex<Option<AckPart>>,
    pub(crate) failed: AtomicBool,
    /// The payload's memory, held until the last request carrying its
    /// events is answered; request bodies are charged to its budget.
    pub(crate) charge: MemoryCharge,
}

impl Drop for SharedAck {
    fn drop(&mut self) {
        if let Some(p) = self.part.lock().take() {
            if self.failed.load(Ordering::Acquire) {
                p.nack();
            } else {
                p.ack();
            }
        }
    }
}

/// Gathers payloads into requests.
pub(super) struct Builder {
    framing: Framing,
    max_bytes: usize,
    max_events: usize,
    /// (payload, next record, shared ack) waiting.
    queue: VecDeque<(Payload, usize, Arc<SharedAck>)>,
    bytes: usize,
    events: usize,
    since: Option<Instant>,
}

impl Builder {
    pub(super) fn new(framing: Framing, max_bytes: usize, max_events: usize) -> Self {
        Self {
            framing,
            max_bytes,
            max_events,
            queue: VecDeque::new(),
            bytes: 0,
            events: 0,
            since: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// When the oldest waiting event has waited `linger`.
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
            failed: AtomicBool::new(false),
            charge,
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
        let f = self.framing;
        let mut req = Request {
            body: Vec::with_capacity(self.bytes.min(self.max_bytes) + 2),
            records: Vec::new(),
            events: 0,
            acks: RequestAcks {
                acks: Vec::new(),
                delivered: false,
            },
        };
        req.body.extend_from_slice(f.open);
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
                // Encoded records end with a newline; the framing says
                // what stands after each in the body.
                let text_end = if p.data.bytes[start..end].ends_with(b"\n") {
                    end - 1
                } else {
                    end
                };
                if req.events > 0 {
                    req.body.extend_from_slice(f.between);
                }
                let at = req.body.len();
                req.body.extend_from_slice(&p.data.bytes[start..text_end]);
                req.records.push(at..req.body.len());
                req.body.extend_from_slice(f.after_each);
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
        req.body.extend_from_slice(f.close);
        self.since = if self.queue.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        Some(req)
    }
}

/// Request body compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// As is.
    None,
    /// `Content-Encoding: gzip`.
    Gzip,
    /// `Content-Encoding: zstd`.
    Zstd,
}

impl Compression {
    /// The `Content-Encoding` of a body compressed so, if any.
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Gzip => Some("gzip"),
            Compression::Zstd => Some("zstd"),
        }
    }

    /// `body` compressed; without compression it is passed on, not
    /// copied.
    pub fn apply(self, body: Bytes) -> std::io::Result<Bytes> {
        match self {
            Compression::None => Ok(body),
            _ => self.apply_to(&body).map(Into::into),
        }
    }

    /// `body` compressed, appended to `out` (a gzip member or a zstd
    /// frame: such pieces appended one after the other are one valid
    /// stream).
    pub fn append(self, body: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::io::Write;
        match self {
            Compression::None => {
                out.extend_from_slice(body);
                Ok(())
            }
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
                e.write_all(body)?;
                e.finish().map(drop)
            }
            Compression::Zstd => zstd::stream::copy_encode(body, out, 3),
        }
    }

    /// `body` compressed into a new buffer.
    pub fn apply_to(self, body: &[u8]) -> std::io::Result<Vec<u8>> {
        use std::io::Write;
        match self {
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
}
