//! The s3 sink's delivery: open objects, their parts and their closing.
//!
//! One task receives the payloads (compressed chunks, see the sink's
//! `encode`) and appends each chunk to the open object of its group. An
//! object holds only compressed bytes not yet uploaded: at [`PART_SIZE`]
//! it becomes a multipart upload and sends them as a part. It is closed
//! when it reaches the size limits or its age limit, or when the sink
//! stops: its last bytes are sent (PutObject, or the last part and
//! CompleteMultipartUpload), and only then are the payloads whose events
//! it holds acknowledged, last first (so that a source committing in
//! order moves past the whole object at once). An upload abandoned (the
//! sink cancelled at a shutdown deadline) is aborted and its events are
//! read again.
//!
//! Calls are made one at a time, each until it succeeds (the driver's
//! [`Calls`](crate::sinks::driver::Calls) policy): while the store is down
//! or refuses, payloads wait in the queue, charged to the pipeline's
//! memory budget, and the sources pause when it is full.
//!
//! Memory: a payload's charge is cut to its compressed size when it
//! arrives, and each object keeps the charges of the bytes it still holds;
//! they are released when those bytes are uploaded. The acknowledgements
//! of an open object hold no memory, but a source may wait for them: an
//! object is closed at the latest `batch.timeout_ms` after it was opened.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use petrel_core::plugin::{Payload, PayloadReceiver};
use petrel_core::MemoryCharge;

use super::journal::{Entry, Segment};
use super::S3Sink;
use crate::sinks::driver::SharedAck;

/// Size of the parts of a multipart upload (S3's smallest but the last).
pub const PART_SIZE: usize = 5 << 20;

/// What puts events in the same object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// The rendered key prefix.
    pub prefix: Arc<str>,
    /// The stream the events were read from, for sources with stable
    /// positions.
    pub stream: Option<u128>,
    /// Where they fall among the objects recorded before this start.
    pub segment: Option<Segment>,
}

/// A batch's events of one group, compressed.
#[derive(Debug)]
pub struct Chunk {
    /// Their group.
    pub group: GroupKey,
    /// Source position of the first event.
    pub first: Option<u64>,
    /// Source position of the last event.
    pub last: Option<u64>,
    /// Time of the first event.
    pub time_ns: i64,
    /// The compressed bytes in the payload.
    pub bytes: Range<usize>,
    /// Their size before compression.
    pub raw: usize,
    /// How many events.
    pub events: u64,
}

/// The encoder's attachment to a payload.
#[derive(Debug)]
pub enum Chunks {
    /// The chunks, in payload order.
    Ok(Vec<Chunk>),
    /// Encoding failed: the payload is failed and read again.
    Failed,
}

/// An upload in progress.
struct Upload {
    id: String,
    etags: Vec<String>,
}

/// An open object.
struct Object {
    key: String,
    prefix: Arc<str>,
    stream: Option<u128>,
    first: Option<u64>,
    last: Option<u64>,
    deadline: Instant,
    opened: Instant,
    /// Compressed bytes not uploaded yet.
    buf: Vec<u8>,
    /// The charges of `buf`.
    charges: Vec<MemoryCharge>,
    /// Bytes before compression, events, compressed bytes in all.
    raw: usize,
    events: u64,
    size: u64,
    /// The recorded object it sends again and that object's last line,
    /// where it closes.
    replay: Option<(u32, u64)>,
    full: bool,
    upload: Option<Upload>,
    /// The payloads whose events it holds, acknowledged once it is
    /// complete.
    acks: Vec<Arc<SharedAck>>,
    /// To abort an abandoned upload.
    sink: Arc<S3Sink>,
}

impl Drop for Object {
    fn drop(&mut self) {
        // Still holding an upload: the object was abandoned (the sink was
        // cancelled). Its parts are aborted; its events, never
        // acknowledged, are read again.
        if let Some(u) = self.upload.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let sink = self.sink.clone();
                let key = std::mem::take(&mut self.key);
                rt.spawn(async move { sink.store.abort(&key, &u.id).await });
            }
        }
    }
}

/// Delivers the payloads of `rx` until the queue closes and every object
/// is complete.
pub async fn run(sink: Arc<S3Sink>, mut rx: PayloadReceiver) {
    let mut objects: HashMap<GroupKey, Object> = HashMap::new();
    // Recorded objects met since the start.
    let mut met: HashSet<u32> = HashSet::new();
    let mut open = true;
    while open || !objects.is_empty() {
        let next = objects.values().map(|o| o.deadline).min();
        if open {
            // Wait for more, but no longer than the oldest object may
            // stay open.
            let got = match next {
                Some(d) => tokio::time::timeout_at(d.into(), rx.recv()).await.ok(),
                None => Some(rx.recv().await),
            };
            match got {
                Some(Some(p)) => sink.add(&mut objects, &mut met, p).await,
                Some(None) => open = false,
                None => {} // an object's time is up
            }
        }
        let now = Instant::now();
        let due: Vec<GroupKey> = objects
            .iter()
            .filter(|(_, o)| !open || o.full || o.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(o) = objects.remove(&k) {
                sink.close(o).await;
            }
        }
    }
}

impl S3Sink {
    /// Appends the chunks of `p` to their objects.
    async fn add(
        self: &Arc<Self>,
        objects: &mut HashMap<GroupKey, Object>,
        met: &mut HashSet<u32>,
        p: Payload,
    ) {
        let Payload {
            mut data,
            ack,
            mut charge,
            ..
        } = p;
        let chunks = match data.attachment.take().map(|a| a.downcast::<Chunks>()) {
            Some(Ok(c)) => match *c {
                Chunks::Ok(c) => c,
                // Dropping the acknowledgement unanswered fails it.
                Chunks::Failed => return,
            },
            _ => return,
        };
        charge.shrink_to(data.bytes.len());
        let shared = Arc::new(SharedAck {
            part: parking_lot::Mutex::new(Some(ack)),
            failed: AtomicBool::new(false),
            charge: MemoryCharge::none(),
        });
        for c in chunks {
            if !objects.contains_key(&c.group) {
                let Some(o) = self.open(&c, met) else {
                    // Already in a complete object: acknowledged (when
                    // `shared` goes) without being sent again.
                    self.metrics.duplicates_skipped().inc_by(c.events);
                    continue;
                };
                objects.insert(c.group.clone(), o);
            }
            let Some(o) = objects.get_mut(&c.group) else {
                continue;
            };
            o.buf.extend_from_slice(&data.bytes[c.bytes.clone()]);
            o.charges.push(charge.split(c.bytes.len()));
            o.raw += c.raw;
            o.events += c.events;
            o.last = c.last.or(o.last);
            if !o.acks.last().is_some_and(|a| Arc::ptr_eq(a, &shared)) {
                o.acks.push(shared.clone());
            }
            let c = &self.config;
            o.full = o.raw >= c.max_bytes
                || o.events >= c.max_events as u64
                || o.replay
                    .is_some_and(|(_, end)| o.last.is_some_and(|l| l >= end));
            if o.buf.len() >= PART_SIZE {
                self.send_part(o).await;
            }
        }
    }

    /// The object a chunk opens; `None` when its events are in an object
    /// recorded and complete already.
    fn open(self: &Arc<Self>, c: &Chunk, met: &mut HashSet<u32>) -> Option<Object> {
        let origin = c.group.stream.zip(c.first);
        let mut key = None;
        let mut replay = None;
        if let Some(Segment::Entry(i)) = c.group.segment {
            let e = self.journal.entry(i);
            if met.insert(i) {
                if c.first != Some(e.first) {
                    // The object's first line was not read again: it was
                    // committed, which only the object's completion
                    // allows.
                    met.remove(&i);
                    return None;
                }
                // Sent again as the same key, closed at the same line.
                key = Some(e.key.clone());
                replay = Some((i, e.last));
            }
            // Met before: the rest of its lines go to a new object.
        }
        let now = Instant::now();
        Some(Object {
            key: key.unwrap_or_else(|| self.new_key(&c.group.prefix, origin, c.time_ns)),
            prefix: c.group.prefix.clone(),
            stream: c.group.stream,
            first: c.first,
            last: c.first,
            deadline: now + self.config.max_age,
            opened: now,
            buf: Vec::new(),
            charges: Vec::new(),
            raw: 0,
            events: 0,
            size: 0,
            replay,
            full: false,
            upload: None,
            acks: Vec::new(),
            sink: self.clone(),
        })
    }

    /// Sends the bytes `o` holds as its next part.
    async fn send_part(&self, o: &mut Object) {
        if o.upload.is_none() {
            let id = self
                .calls
                .until_done(o.events, &o.key, || self.store.create(&o.key))
                .await;
            o.upload = Some(Upload {
                id,
                etags: Vec::new(),
            });
        }
        let Some(u) = o.upload.as_mut() else {
            return;
        };
        let body = Bytes::from(std::mem::take(&mut o.buf));
        let number = u.etags.len() as u16 + 1;
        let etag = self
            .calls
            .until_done(o.events, &o.key, || {
                self.store.upload_part(&o.key, &u.id, number, body.clone())
            })
            .await;
        u.etags.push(etag);
        o.size += body.len() as u64;
        // Those bytes are in the store now.
        o.charges.clear();
    }

    /// Sends the rest of `o`, completes it and acknowledges its events.
    async fn close(&self, mut o: Object) {
        if o.events == 0 {
            return;
        }
        if let (Some(stream), Some(first), Some(last)) = (o.stream, o.first, o.last) {
            let entry = Entry {
                stream,
                prefix: o.prefix.to_string(),
                first,
                last,
                key: o.key.clone(),
                at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            };
            if let Err(e) = self.journal.record(&entry) {
                self.metrics.error("journal", 1);
                tracing::error!(error = %e, path = ?self.journal.path(), key = %o.key, "s3 sink: cannot record an object before completing it; after a crash its lines may be sent in a second object");
            }
        }
        if o.upload.is_none() {
            let body = Bytes::from(std::mem::take(&mut o.buf));
            o.size += body.len() as u64;
            self.calls
                .until_done(o.events, &o.key, || self.store.put(&o.key, body.clone()))
                .await;
        } else {
            if !o.buf.is_empty() {
                self.send_part(&mut o).await;
            }
            if let Some(u) = &o.upload {
                self.calls
                    .until_done(o.events, &o.key, || {
                        self.store.complete(&o.key, &u.id, &u.etags)
                    })
                    .await;
            }
            o.upload = None;
        }
        self.calls.delivered(o.events, o.size, o.opened);
        tracing::debug!(key = %o.key, events = o.events, bytes = o.size, raw = o.raw, "s3 sink: object complete");
        // Last first: see the module's documentation.
        while let Some(a) = o.acks.pop() {
            drop(a);
        }
    }
}
