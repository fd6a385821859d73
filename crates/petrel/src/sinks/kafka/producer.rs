//! The librdkafka side of the Kafka sink.
//!
//! Measured on this host, the per-message path of the rdkafka crate's
//! `FutureProducer` (a oneshot channel, a boxed opaque and a topic `CString`
//! per message, plus librdkafka's payload copy) cost about 2.5 µs of agent
//! CPU per event: 12× the file sink per GB on 128-byte lines. So a batch is
//! produced here with one `rd_kafka_produce_batch` call per topic, its
//! payloads pointing straight into the encoded buffer (librdkafka copies
//! nothing, the buffer is kept alive until the last delivery report), and
//! the delivery reports count down one shared [`Attempt`] per batch.
//!
//! Safety rests on one rule: a message handed to librdkafka carries, as its
//! opaque, a pointer to a [`Slot`] of an `Attempt`, and the `Attempt` (which
//! owns the payload bytes through `data`) holds one strong reference on
//! behalf of all its enqueued messages until the last of their delivery
//! reports (librdkafka reports every enqueued message exactly once).

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::plugin::Encoded;
use rdkafka::bindings as rd;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::IntoOpaque;
use rdkafka::ClientContext;
use tokio::sync::{Notify, Semaphore};

pub use crate::kafka_client::client_config;

/// librdkafka's "let the partitioner choose" partition.
const PARTITION_UA: i32 = -1;

/// Where one batch's records go: computed by the sink's encoder on the
/// processing pool, read here.
#[derive(Clone)]
pub struct Routes {
    /// Index into `topics` per record.
    pub topic_of: Vec<u16>,
    /// Distinct topics of this payload.
    pub topics: Vec<String>,
    /// Key bytes, back to back (librdkafka copies keys).
    pub keys: Vec<u8>,
    /// Each record's range in `keys`; empty when no key field is configured,
    /// `None` for a record without the key field.
    pub key_ranges: Vec<Option<(u32, u32)>>,
    /// Message headers, back to back: per header its name's length (u16
    /// little-endian), the name, its value's length (u32), the value.
    pub headers: Vec<u8>,
    /// Each record's range in `headers`; empty when the sink sets no
    /// headers.
    pub header_ranges: Vec<(u32, u32)>,
}

/// Appends one header to `out` in the layout of [`Routes::headers`].
pub fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(&(name.len().min(u16::MAX as usize) as u16).to_le_bytes());
    out.extend_from_slice(&name.as_bytes()[..name.len().min(u16::MAX as usize)]);
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
}

/// The headers of a record's range of [`Routes::headers`]: (name, value).
fn headers_of(b: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut out = Vec::new();
    let mut rest = b;
    while rest.len() >= 2 {
        let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let Some(name) = rest.get(2..2 + n) else {
            break;
        };
        let Some(len) = rest.get(2 + n..6 + n) else {
            break;
        };
        let v = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(value) = rest.get(6 + n..6 + n + v) else {
            break;
        };
        out.push((name, value));
        rest = &rest[6 + n + v..];
    }
    out
}

impl Routes {
    /// Writes the routes for a disk buffer (little-endian lengths).
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.topics.len() as u32).to_le_bytes());
        for t in &self.topics {
            out.extend_from_slice(&(t.len() as u32).to_le_bytes());
            out.extend_from_slice(t.as_bytes());
        }
        out.extend_from_slice(&(self.topic_of.len() as u32).to_le_bytes());
        for i in &self.topic_of {
            out.extend_from_slice(&i.to_le_bytes());
        }
        out.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.keys);
        out.extend_from_slice(&(self.key_ranges.len() as u32).to_le_bytes());
        for r in &self.key_ranges {
            let (flag, (a, b)) = match r {
                Some(r) => (1u8, *r),
                None => (0u8, (0, 0)),
            };
            out.push(flag);
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
        }
        // Written only when there are headers, so that routes buffered by
        // an agent without them still read back.
        if !self.header_ranges.is_empty() {
            out.extend_from_slice(&(self.headers.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.headers);
            out.extend_from_slice(&(self.header_ranges.len() as u32).to_le_bytes());
            for (a, b) in &self.header_ranges {
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
    }

    /// Reads what [`Routes::write`] wrote; `None` when `b` is not that.
    pub fn read(mut b: &[u8]) -> Option<Routes> {
        use petrel_core::le::{take, take_u32 as u32_};
        let n = u32_(&mut b)? as usize;
        let mut topics = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let len = u32_(&mut b)? as usize;
            topics.push(std::str::from_utf8(take(&mut b, len)?).ok()?.to_string());
        }
        let n = u32_(&mut b)? as usize;
        let raw = take(&mut b, n.checked_mul(2)?)?;
        let topic_of: Vec<u16> = raw
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if topic_of.iter().any(|&i| i as usize >= topics.len()) {
            return None;
        }
        let len = u32_(&mut b)? as usize;
        let keys = take(&mut b, len)?.to_vec();
        let n = u32_(&mut b)? as usize;
        let mut key_ranges = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let flag = take(&mut b, 1)?[0];
            let a = u32_(&mut b)?;
            let e = u32_(&mut b)?;
            if flag == 1 && (a > e || e as usize > keys.len()) {
                return None;
            }
            key_ranges.push((flag == 1).then_some((a, e)));
        }
        let (mut headers, mut header_ranges) = (Vec::new(), Vec::new());
        if !b.is_empty() {
            let len = u32_(&mut b)? as usize;
            headers = take(&mut b, len)?.to_vec();
            let n = u32_(&mut b)? as usize;
            header_ranges = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let a = u32_(&mut b)?;
                let e = u32_(&mut b)?;
                if a > e || e as usize > headers.len() {
                    return None;
                }
                header_ranges.push((a, e));
            }
        }
        b.is_empty().then_some(Routes {
            topic_of,
            topics,
            keys,
            key_ranges,
            headers,
            header_ranges,
        })
    }
}

/// The result of producing a set of records until each has a delivery
/// report.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Records whose delivery failed and must be sent again (sorted).
    pub failed: Vec<u32>,
    /// Records the broker can never take (larger than its size limit).
    pub rejected: u64,
    /// Records whose topic does not exist or may not be written (sorted):
    /// the sink sends them to its fallback topic.
    pub unroutable: Vec<u32>,
    /// The first error seen, for the log.
    pub first_error: Option<KafkaError>,
}

/// One message's opaque: which record it is and which attempt it counts
/// down.
struct Slot {
    record: u32,
    owner: *const Attempt,
}

/// The messages of one batch produced together, with their payload bytes.
struct Attempt {
    /// Keeps the bytes librdkafka points into alive.
    data: Arc<Encoded>,
    /// Bytes of the producer's budget, held until the attempt is gone
    /// (its last delivery report, and its task finished or cancelled).
    _permit: tokio::sync::OwnedSemaphorePermit,
    slots: Box<[Slot]>,
    /// Messages without a delivery report yet, plus one while producing.
    remaining: AtomicUsize,
    rejected: AtomicU64,
    failed: Mutex<(Vec<u32>, Option<KafkaError>)>,
    unroutable: Mutex<Vec<u32>>,
    done: Notify,
}

// SAFETY: `Slot::owner` points at the `Attempt` containing the slot; it is
// only dereferenced while that `Attempt` is alive (see the module docs), and
// everything it reaches is itself `Sync`.
unsafe impl Send for Attempt {}
unsafe impl Sync for Attempt {}

impl Attempt {
    fn fail(&self, record: u32, error: KafkaError) {
        if is_permanent(&error) {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if is_unroutable(&error) {
            self.unroutable.lock().push(record);
            return;
        }
        let mut f = self.failed.lock();
        f.0.push(record);
        if f.1.is_none() {
            f.1 = Some(error);
        }
    }

    /// One message (or the producing guard) is accounted for. The last one
    /// wakes the waiting task and gives up the messages' strong reference.
    ///
    /// # Safety
    /// `this` must point into an `Arc` holding the strong reference leaked
    /// for the messages in [`SharedProducer::produce`]; each message and the
    /// guard call this exactly once.
    unsafe fn complete_one(this: *const Attempt) {
        let a = &*this;
        if a.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.done.notify_one();
            Arc::decrement_strong_count(this);
        }
    }
}

/// A message larger than the broker accepts will never be delivered:
/// counted and logged by the sink, not retried forever.
fn is_permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// The topic does not exist (and is not created), is invalid, or may not
/// be written: retrying will not help, the fallback topic may.
fn is_unroutable(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    )
}

/// Gives up the messages' reference to an [`Attempt`] for the producing
/// task when dropped: on the normal path after everything was handed to
/// librdkafka, and also when the task is cancelled or unwinds half way,
/// so an attempt (and the budget it holds) can never leak.
struct ProducingGuard(*const Attempt);

// SAFETY: the pointer is only used to call `complete_one`, which is
// thread-safe; the attempt outlives the guard (the guard's own count in
// `remaining` keeps the messages' reference alive).
unsafe impl Send for ProducingGuard {}

impl Drop for ProducingGuard {
    fn drop(&mut self) {
        // SAFETY: the guard's own completion, exactly once.
        unsafe { Attempt::complete_one(self.0) };
    }
}

/// The delivery opaque: a pointer to the message's [`Slot`].
pub struct SlotRef(*const Slot);

// SAFETY: a `SlotRef` is only a token passed through librdkafka; see
// `Attempt`.
unsafe impl Send for SlotRef {}
unsafe impl Sync for SlotRef {}

impl IntoOpaque for SlotRef {
    fn into_ptr(self) -> *mut c_void {
        self.0 as *mut c_void
    }

    unsafe fn from_ptr(p: *mut c_void) -> Self {
        SlotRef(p as *const Slot)
    }
}

/// Client context: counts delivery reports down, fetches OAUTHBEARER
/// tokens (OIDC), and keeps librdkafka's stream of connection errors
/// during an outage to one line per kind every 30 s, naming the sinks that
/// use the producer and, for a refusal (credentials, certificates), the
/// cause in words (the sink's own retry warnings say what is held).
pub struct Context {
    last: Mutex<HashMap<String, Instant>>,
    /// The sinks sharing this producer (`pipeline/sink id`), for the logs.
    owners: Mutex<Vec<String>>,
    oidc: Option<crate::kafka_client::Oidc>,
}

impl Context {
    /// The context of a producer for `pairs`, used first by `owner`.
    pub fn new(pairs: &[(String, String)], owner: &str) -> Context {
        Context {
            last: Mutex::default(),
            owners: Mutex::new(vec![owner.to_string()]),
            oidc: crate::kafka_client::Oidc::from_settings(pairs),
        }
    }

    fn owners(&self) -> String {
        self.owners.lock().join(", ")
    }

    /// Whether a message of `kind` is logged now: not when one was in the
    /// last 30 s (an outage repeats the same error many times a second).
    fn first_in_30s(&self, kind: &str) -> bool {
        let mut last = self.last.lock();
        let now = Instant::now();
        if last
            .get(kind)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(30))
        {
            return false;
        }
        last.insert(kind.to_string(), now);
        true
    }
}

impl ClientContext for Context {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel as L;
        if let Some(cause) = crate::kafka_client::explain_log(fac, log_message) {
            if self.first_in_30s(cause) {
                tracing::error!(sink = %self.owners(), fac,
                    "kafka sink {}: {cause}: {log_message} (repeats are logged every 30 s)", self.owners());
            }
            return;
        }
        // Connection failures also arrive through `error`, rate limited
        // there; librdkafka's own log is for debugging.
        match level {
            L::Emerg | L::Alert | L::Critical => {
                tracing::error!(sink = %self.owners(), fac, "librdkafka: {log_message}")
            }
            _ => tracing::debug!(sink = %self.owners(), fac, "librdkafka: {log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let cause = crate::kafka_client::explain(&error, reason);
        let kind = match cause {
            Some(c) => c.to_string(),
            None => format!("{:?}", error.rdkafka_error_code()),
        };
        if !self.first_in_30s(&kind) {
            return;
        }
        match cause {
            Some(cause) => tracing::error!(sink = %self.owners(), error = %error, reason,
                "kafka sink {}: cannot connect: {cause}; nothing is acknowledged until it can (repeats are logged every 30 s)", self.owners()),
            None => tracing::warn!(sink = %self.owners(), error = %error, reason,
                "kafka client error (repeats are logged every 30 s)"),
        }
    }

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        let Some(oidc) = &self.oidc else {
            return Err("no OAUTHBEARER token source (sasl.oauthbearer.method: oidc)".into());
        };
        oidc.token().map_err(|e| {
            tracing::error!(sink = %self.owners(), "kafka sink {}: cannot get an OAUTHBEARER token: {e}", self.owners());
            e.into()
        })
    }
}

impl ProducerContext for Context {
    type DeliveryOpaque = SlotRef;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: SlotRef) {
        if opaque.0.is_null() {
            return;
        }
        // SAFETY: every message this producer carries was produced by
        // `SharedProducer::produce` with a live slot as opaque.
        unsafe {
            let slot = &*opaque.0;
            if let Err((e, _)) = result {
                (*slot.owner).fail(slot.record, e.clone());
            }
            Attempt::complete_one(slot.owner);
        }
    }
}

/// A librdkafka topic handle, with what the sink knows of its partitions.
struct Topic {
    raw: NonNull<rd::rd_kafka_topic_t>,
    /// Partitions with a leader at the last metadata fetch; empty while
    /// unknown.
    partitions: Mutex<Vec<i32>>,
    /// Some partitions had no leader at the last fetch (a topic just
    /// created, a broker restarting): fetch again soon, or key-less
    /// batches would skip those partitions for the whole refresh period.
    incomplete: std::sync::atomic::AtomicBool,
    /// Round-robin position for key-less batches.
    next: AtomicU32,
    /// When partitions were last asked for (fetches run in the background).
    asked: Mutex<Option<Instant>>,
}

// SAFETY: librdkafka topic handles are thread-safe and reference counted.
unsafe impl Send for Topic {}
unsafe impl Sync for Topic {}

impl Drop for Topic {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_topic_new, destroyed once; messages
        // in flight hold their own references to the topic.
        unsafe { rd::rd_kafka_topic_destroy(self.raw.as_ptr()) }
    }
}

/// Topic handles kept per producer; templated topics could name many, so
/// the cache is emptied when it grows past this.
const MAX_TOPIC_HANDLES: usize = 4096;

/// How often a topic's partition count is fetched again (partitions can be
/// added to a topic).
const PARTITIONS_REFRESH: Duration = Duration::from_secs(60);

impl Topic {
    /// The partition for a batch of key-less messages: the next one in
    /// turn, or librdkafka's partitioner while the count is unknown.
    ///
    /// librdkafka's partitioner runs per message (a topic lock, partition
    /// lookups, the sticky state): about a third of the sink thread's time
    /// on 128-byte events. A whole batch to one partition, partitions in
    /// turn, spreads load like its sticky partitioner does, for one lookup.
    fn partition_for_batch(&self) -> i32 {
        let parts = self.partitions.lock();
        match parts.len() {
            0 => PARTITION_UA,
            n => parts[self.next.fetch_add(1, Ordering::Relaxed) as usize % n],
        }
    }

    /// True when the partition count should be fetched (and marks it
    /// asked for).
    fn wants_partitions(&self) -> bool {
        let mut asked = self.asked.lock();
        // A topic that does not exist yet (created by the first produce)
        // has no partitions in its first answer: ask again soon.
        let every =
            match self.partitions.lock().is_empty() || self.incomplete.load(Ordering::Relaxed) {
                true => Duration::from_secs(1),
                false => PARTITIONS_REFRESH,
            };
        let due = asked.is_none_or(|t| t.elapsed() >= every);
        if due {
            *asked = Some(Instant::now());
        }
        due
    }
}

/// A producer shared by every sink with the same client settings, so many
/// pipelines writing to one cluster do not each start librdkafka threads.
pub struct SharedProducer {
    /// Bytes handed to librdkafka and not yet reported, at most
    /// `buffered_bytes` (see [`SharedProducer::get`]).
    budget: Arc<Semaphore>,
    budget_bytes: usize,
    /// One metadata fetch at a time: during an outage each waits its full
    /// timeout on the blocking pool, which the file sinks share.
    fetching: Arc<std::sync::atomic::AtomicBool>,
    // Declared before `inner`: topic handles go before the client.
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    inner: ThreadedProducer<Context>,
}

impl SharedProducer {
    /// The producer for `pairs`, created on first use.
    ///
    /// `buffered_bytes` bounds what the sinks hand to librdkafka before its
    /// delivery reports. librdkafka's idempotent producer keeps a single
    /// produce request in flight per partition (2.12: it compares the
    /// 5-request limit with the count of *messages* in flight) and, while
    /// that request is out, busy-polls as soon as the oldest queued message
    /// is older than `linger.ms`. Measured here with a saturated broker:
    /// 0.95 CPU s in the broker thread per million messages against 0.28
    /// without the spin. Keeping the queue behind the in-flight requests
    /// short (a few batches) and the linger above a request's round trip
    /// avoids the spin without costing throughput.
    pub fn get(
        pairs: &[(String, String)],
        buffered_bytes: usize,
        owner: &str,
    ) -> anyhow::Result<Arc<SharedProducer>> {
        static PRODUCERS: OnceLock<Mutex<HashMap<String, Arc<SharedProducer>>>> = OnceLock::new();
        let mut sorted = pairs.to_vec();
        sorted.sort();
        let key = sorted
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("\n")
            + &format!("\nbuffered={buffered_bytes}");
        let mut map = PRODUCERS.get_or_init(Default::default).lock();
        if let Some(p) = map.get(&key) {
            p.inner.context().owners.lock().push(owner.to_string());
            return Ok(p.clone());
        }
        let p = Self::private(pairs, buffered_bytes, owner)?;
        map.insert(key, p.clone());
        Ok(p)
    }

    /// A producer of its own for `pairs`, shared with no other sink: the
    /// transactional one of `exactly_once`, whose `transactional.id` is
    /// its sink's alone and which is replaced after a fatal error.
    pub fn private(
        pairs: &[(String, String)],
        buffered_bytes: usize,
        owner: &str,
    ) -> anyhow::Result<Arc<SharedProducer>> {
        let inner: ThreadedProducer<Context> =
            client_config(pairs).create_with_context(Context::new(pairs, owner))?;
        let budget_bytes = buffered_bytes.clamp(1 << 16, u32::MAX as usize);
        Ok(Arc::new(SharedProducer {
            budget: Arc::new(Semaphore::new(budget_bytes)),
            budget_bytes,
            fetching: Arc::default(),
            topics: Mutex::new(HashMap::new()),
            inner,
        }))
    }

    /// The librdkafka producer itself, for the transaction calls.
    pub fn client(&self) -> &ThreadedProducer<Context> {
        &self.inner
    }

    fn topic(&self, name: &str) -> Result<Arc<Topic>, KafkaError> {
        let mut topics = self.topics.lock();
        if let Some(t) = topics.get(name) {
            return Ok(t.clone());
        }
        let c = CString::new(name)
            .map_err(|_| KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic))?;
        // SAFETY: the client pointer is valid for the producer's lifetime;
        // a null topic configuration means the producer's defaults.
        let raw = unsafe {
            rd::rd_kafka_topic_new(
                self.inner.client().native_ptr(),
                c.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        let t = Arc::new(Topic {
            raw: NonNull::new(raw).ok_or(KafkaError::MessageProduction(
                RDKafkaErrorCode::InvalidTopic,
            ))?,
            partitions: Mutex::new(Vec::new()),
            incomplete: std::sync::atomic::AtomicBool::new(false),
            next: AtomicU32::new(0),
            asked: Mutex::new(None),
        });
        if topics.len() >= MAX_TOPIC_HANDLES {
            topics.clear();
        }
        topics.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// Fetches the partition count of `topic` on the blocking pool (a
    /// metadata request must not stall the sink runtime).
    fn fetch_partitions(self: &Arc<Self>, name: &str, topic: &Arc<Topic>) {
        if self
            .fetching
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Asked again after its refresh period.
            return;
        }
        let (this, name, topic) = (self.clone(), name.to_string(), topic.clone());
        tokio::task::spawn_blocking(move || {
            let _done = ClearOnDrop(this.fetching.clone());
            let md = this
                .inner
                .client()
                .fetch_metadata(Some(&name), Duration::from_secs(10));
            match md {
                Ok(md) => {
                    // Partitions without a leader (their broker is down)
                    // are left out, as librdkafka's partitioner does.
                    let t = md
                        .topics()
                        .iter()
                        .find(|t| t.name() == name && t.error().is_none());
                    let all = t.map_or(0, |t| t.partitions().len());
                    let parts: Vec<i32> = t
                        .map(|t| {
                            t.partitions()
                                .iter()
                                .filter(|p| p.leader() >= 0 && p.error().is_none())
                                .map(|p| p.id())
                                .collect()
                        })
                        .unwrap_or_default();
                    topic.incomplete.store(parts.len() < all, Ordering::Relaxed);
                    *topic.partitions.lock() = parts;
                }
                Err(e) => {
                    tracing::debug!(topic = %name, error = %e, "kafka: partition count unknown; librdkafka partitions for now");
                }
            }
        });
    }

    /// Produces `records` of `data` (one message per record, routed by
    /// `routes`) and waits until each has a delivery report.
    pub async fn produce(
        self: &Arc<Self>,
        data: &Arc<Encoded>,
        routes: &Routes,
        records: &[u32],
    ) -> Outcome {
        let bytes: usize = records
            .iter()
            .map(|&i| record_range(data, i as usize).len())
            .sum();
        // Larger than the whole budget: wait until librdkafka is empty.
        let permits = bytes.clamp(1, self.budget_bytes) as u32;
        let permit = match self.budget.clone().acquire_many_owned(permits).await {
            Ok(p) => p,
            // The budget is never closed; if it were, nothing was sent.
            Err(_) => {
                return Outcome {
                    failed: records.to_vec(),
                    ..Outcome::default()
                }
            }
        };
        let attempt = Arc::new_cyclic(|weak| Attempt {
            data: data.clone(),
            _permit: permit,
            slots: records
                .iter()
                .map(|&record| Slot {
                    record,
                    owner: weak.as_ptr(),
                })
                .collect(),
            remaining: AtomicUsize::new(1),
            rejected: AtomicU64::new(0),
            failed: Mutex::new((Vec::new(), None)),
            unroutable: Mutex::new(Vec::new()),
            done: Notify::new(),
        });
        // The strong reference owned by the messages and the guard in
        // `remaining`, given up by `Attempt::complete_one`.
        let guard = ProducingGuard(Arc::into_raw(attempt.clone()));
        let mut todo: Vec<u32> = (0..records.len() as u32).collect();
        loop {
            let queue_full = self.enqueue(&attempt, routes, &todo);
            if queue_full.is_empty() {
                break;
            }
            // librdkafka's queue (`queue.buffering.max.*`) is full: let it
            // drain into the broker.
            todo = queue_full;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(guard);
        while attempt.remaining.load(Ordering::Acquire) != 0 {
            attempt.done.notified().await;
        }
        let (mut failed, first_error) = std::mem::take(&mut *attempt.failed.lock());
        failed.sort_unstable();
        if !failed.is_empty() {
            // A partition may have lost its leader: ask again before the
            // retry picks partitions.
            let topics = self.topics.lock();
            for name in &routes.topics {
                if let Some(t) = topics.get(name) {
                    *t.asked.lock() = None;
                }
            }
        }
        let mut unroutable = std::mem::take(&mut *attempt.unroutable.lock());
        unroutable.sort_unstable();
        Outcome {
            failed,
            rejected: attempt.rejected.load(Ordering::Relaxed),
            unroutable,
            first_error,
        }
    }

    /// Produces slot `s` of `attempt`, which has headers, alone; the
    /// error code when librdkafka refused it (it then gets no report).
    fn produce_with_headers(
        &self,
        attempt: &Attempt,
        routes: &Routes,
        topic: &Topic,
        partition: i32,
        s: u32,
    ) -> Option<RDKafkaErrorCode> {
        let data = &attempt.data;
        let slot = &attempt.slots[s as usize];
        let i = slot.record as usize;
        let value = record_range(data, i);
        let (a, b) = routes.header_ranges.get(i).copied().unwrap_or((0, 0));
        let hdrs = headers_of(
            routes
                .headers
                .get(a as usize..b as usize)
                .unwrap_or_default(),
        );
        // librdkafka reads header names as C strings.
        let names: Vec<std::ffi::CString> = hdrs
            .iter()
            .map(|(n, _)| std::ffi::CString::new(n.to_vec()).unwrap_or_default())
            .collect();
        let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
        use rd::rd_kafka_vtype_t as T;
        let mut vus = vec![
            vu(
                T::RD_KAFKA_VTYPE_RKT,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    rkt: topic.raw.as_ptr(),
                },
            ),
            vu(
                T::RD_KAFKA_VTYPE_PARTITION,
                rd::rd_kafka_vu_s__bindgen_ty_1 { i32_: partition },
            ),
            vu(
                T::RD_KAFKA_VTYPE_VALUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: data.bytes[value.start..].as_ptr() as *mut c_void,
                        size: value.len(),
                    },
                },
            ),
            vu(
                T::RD_KAFKA_VTYPE_OPAQUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    ptr: SlotRef(slot as *const Slot).into_ptr(),
                },
            ),
        ];
        if let Some(Some((ks, ke))) = routes.key_ranges.get(i) {
            vus.push(vu(
                T::RD_KAFKA_VTYPE_KEY,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: routes.keys[*ks as usize..].as_ptr() as *mut c_void,
                        size: (*ke - *ks) as usize,
                    },
                },
            ));
        }
        for ((_, v), name) in hdrs.iter().zip(&names) {
            vus.push(vu(
                T::RD_KAFKA_VTYPE_HEADER,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    header: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                        name: name.as_ptr(),
                        val: v.as_ptr() as *const c_void,
                        size: v.len() as isize,
                    },
                },
            ));
        }
        // Counted before producing: the report can arrive before the call
        // returns.
        attempt.remaining.fetch_add(1, Ordering::AcqRel);
        // SAFETY: every pointer in `vus` is valid for the call: the topic
        // handle, the key and header bytes (copied by librdkafka during
        // the call), and the payload, which points into `attempt.data`,
        // alive until the message's delivery report (no copy flag, as in
        // `rd_kafka_produce_batch` below).
        let err = unsafe {
            rd::rd_kafka_produceva(self.inner.client().native_ptr(), vus.as_ptr(), vus.len())
        };
        if err.is_null() {
            return None;
        }
        // SAFETY: a non-null error from produceva is ours to read and free.
        let code = unsafe {
            let c = rd::rd_kafka_error_code(err);
            rd::rd_kafka_error_destroy(err);
            c
        };
        attempt.remaining.fetch_sub(1, Ordering::AcqRel);
        Some(RDKafkaErrorCode::from(code))
    }

    /// Hands the slots `todo` of `attempt` to librdkafka, one
    /// `rd_kafka_produce_batch` call per topic. Returns the slots refused
    /// because librdkafka's queue is full; other refusals are recorded in
    /// the attempt.
    fn enqueue(self: &Arc<Self>, attempt: &Attempt, routes: &Routes, todo: &[u32]) -> Vec<u32> {
        let data = &attempt.data;
        let mut queue_full = Vec::new();
        let mut by_topic: Vec<Vec<u32>> = vec![Vec::new(); routes.topics.len()];
        if routes.topics.len() == 1 {
            by_topic[0] = todo.to_vec();
        } else {
            for &s in todo {
                let record = attempt.slots[s as usize].record as usize;
                let t = routes.topic_of.get(record).copied().unwrap_or(0) as usize;
                if let Some(list) = by_topic.get_mut(t) {
                    list.push(s);
                }
            }
        }
        for (t, slots) in by_topic.iter().enumerate() {
            if slots.is_empty() {
                continue;
            }
            let topic = match self.topic(&routes.topics[t]) {
                Ok(h) => h,
                Err(e) => {
                    for &s in slots {
                        attempt.fail(attempt.slots[s as usize].record, e.clone());
                    }
                    continue;
                }
            };
            // Keyed messages need librdkafka's key hash per message.
            let partition = if routes.key_ranges.is_empty() {
                if topic.wants_partitions() {
                    self.fetch_partitions(&routes.topics[t], &topic);
                }
                topic.partition_for_batch()
            } else {
                PARTITION_UA
            };
            // Records with headers go one by one through
            // `rd_kafka_produceva` (`rd_kafka_produce_batch` takes no
            // headers); the others together.
            let with_headers = |s: u32| {
                let i = attempt.slots[s as usize].record as usize;
                routes.header_ranges.get(i).is_some_and(|(a, b)| b > a)
            };
            let mut batch_slots: Vec<u32> = Vec::with_capacity(slots.len());
            for &s in slots {
                if !with_headers(s) {
                    batch_slots.push(s);
                    continue;
                }
                if let Some(code) = self.produce_with_headers(attempt, routes, &topic, partition, s)
                {
                    if code == RDKafkaErrorCode::QueueFull {
                        queue_full.push(s);
                    } else {
                        attempt.fail(
                            attempt.slots[s as usize].record,
                            KafkaError::MessageProduction(code),
                        );
                    }
                }
            }
            let slots = &batch_slots;
            if slots.is_empty() {
                continue;
            }
            let mut msgs: Vec<rd::rd_kafka_message_t> = slots
                .iter()
                .map(|&s| {
                    let slot = &attempt.slots[s as usize];
                    let i = slot.record as usize;
                    let value = record_range(data, i);
                    let (key, key_len) = match routes.key_ranges.get(i) {
                        Some(Some((ks, ke))) => (
                            routes.keys[*ks as usize..].as_ptr() as *mut c_void,
                            (*ke - *ks) as usize,
                        ),
                        _ => (std::ptr::null_mut(), 0),
                    };
                    rd::rd_kafka_message_t {
                        err: rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
                        rkt: std::ptr::null_mut(),
                        partition,
                        payload: data.bytes[value.start..].as_ptr() as *mut c_void,
                        len: value.len(),
                        key,
                        key_len,
                        offset: 0,
                        _private: SlotRef(slot as *const Slot).into_ptr(),
                    }
                })
                .collect();
            // Counted before producing: reports can arrive before the call
            // returns.
            attempt.remaining.fetch_add(msgs.len(), Ordering::AcqRel);
            // SAFETY: `msgs` is a valid array; payloads point into
            // `attempt.data`, which outlives every message (no copy flag:
            // librdkafka reads them until their delivery reports); keys are
            // copied by librdkafka during the call.
            unsafe {
                rd::rd_kafka_produce_batch(
                    topic.raw.as_ptr(),
                    partition,
                    0,
                    msgs.as_mut_ptr(),
                    msgs.len() as i32,
                );
            }
            let mut refused = 0;
            for (m, &s) in msgs.iter().zip(slots) {
                if m.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    continue;
                }
                refused += 1;
                let code = RDKafkaErrorCode::from(m.err);
                if code == RDKafkaErrorCode::QueueFull {
                    queue_full.push(s);
                } else {
                    attempt.fail(
                        attempt.slots[s as usize].record,
                        KafkaError::MessageProduction(code),
                    );
                }
            }
            // Refused messages get no report; the guard keeps this above 0.
            attempt.remaining.fetch_sub(refused, Ordering::AcqRel);
        }
        queue_full
    }
}

/// Where record `i` of `data` is, without the newline that ends it.
pub fn record_range(data: &Encoded, i: usize) -> std::ops::Range<usize> {
    let start = match i {
        0 => 0,
        _ => data.record_ends[i - 1] as usize,
    };
    let end = (data.record_ends[i] as usize).saturating_sub(1).max(start);
    start..end
}

/// Clears a flag when dropped (also if the task unwinds).
struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_read_back_as_written() {
        let r = Routes {
            topic_of: vec![0, 1, 0],
            topics: vec!["a".into(), "b-2".into()],
            keys: b"k1k2".to_vec(),
            key_ranges: vec![Some((0, 2)), None, Some((2, 4))],
            headers: Vec::new(),
            header_ranges: Vec::new(),
        };
        let mut out = Vec::new();
        r.write(&mut out);
        let back = Routes::read(&out).expect("reads back");
        assert_eq!(back.topic_of, r.topic_of);
        assert_eq!(back.topics, r.topics);
        assert_eq!(back.keys, r.keys);
        assert_eq!(back.key_ranges, r.key_ranges);
        assert!(Routes::read(&out[..out.len() - 1]).is_none());
    }
}
