//! `exactly_once: true`: a transactional producer that commits the offsets
//! its `kafka` source consumed inside the same transaction as the records
//! it wrote (Kafka's consume-transform-produce pattern, KIP-98 and
//! KIP-447). A `read_committed` consumer of the output then sees every
//! input record once: a transaction is either committed with its offsets
//! or aborted without them, and the offsets are passed with the consumer
//! group's metadata, so an instance that lost its partitions in a
//! rebalance is fenced instead of committing them.
//!
//! Payloads are grouped into one transaction while more are queued (up to
//! [`MAX_GROUP_PAYLOADS`] or [`MAX_GROUP_BYTES`]); a failed transaction is
//! aborted and the same payloads sent again in a new one, without end;
//! payloads of partitions the source no longer owns are dropped unanswered
//! (their new owner reads them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::plugin::{Encoded, Payload, PayloadReceiver};
use petrel_core::{AckPart, ComponentMetrics, EventBatch, MemoryCharge};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::producer::{Routes, SharedProducer};
use crate::sinks::congestion::Backoff;
use crate::sources::kafka::link;

/// Payloads put into one transaction at most.
pub const MAX_GROUP_PAYLOADS: usize = 256;
/// Encoded bytes put into one transaction at most.
pub const MAX_GROUP_BYTES: usize = 16 << 20;

/// Where the source resumes after a payload's batch: the next offset of
/// its partition. Computed by the encoder from the batch's origin.
#[derive(Debug, Clone)]
pub struct SourceOffset {
    /// Topic read.
    pub topic: String,
    /// Partition read.
    pub partition: i32,
    /// The offset after the batch's last record.
    pub next: i64,
}

impl SourceOffset {
    /// The position of `batch` in a Kafka partition, when it came from a
    /// `kafka` source.
    pub fn of(batch: &EventBatch) -> Option<Self> {
        let o = batch.origin.as_ref().filter(|o| o.per_record)?;
        let topic = std::str::from_utf8(batch.source.field("kafka.topic")?).ok()?;
        let partition = std::str::from_utf8(batch.source.field("kafka.partition")?)
            .ok()?
            .parse()
            .ok()?;
        Some(Self {
            topic: topic.to_string(),
            partition,
            next: i64::try_from(o.last_position()).ok()?.checked_add(1)?,
        })
    }
}

/// The encoder's attachment in exactly-once mode.
pub struct Attachment {
    /// Where each record goes.
    pub routes: Routes,
    /// Where the source resumes after this payload.
    pub offset: Option<SourceOffset>,
}

/// Why a transaction did not commit.
enum Failure {
    /// Try the same payloads again after a pause.
    Retry(String),
    /// The producer can no more be used: make a new one, then retry.
    Fatal(String),
}

/// A payload of the transaction being sent: its encoded records shared
/// with librdkafka's messages, which point into them (see
/// [`SharedProducer::produce`]), so that nothing is copied per record.
struct Held {
    data: Arc<Encoded>,
    events: u64,
    ack: AckPart,
    /// Memory held by the encoded data, released with it.
    _charge: MemoryCharge,
}

impl Held {
    fn attachment(&self) -> Option<&Attachment> {
        self.data
            .attachment
            .as_ref()
            .and_then(|a| a.downcast_ref::<Attachment>())
    }
}

/// The transactional side of a `kafka` sink.
pub struct Transactional {
    client: Vec<(String, String)>,
    pipeline: String,
    /// Bytes handed to librdkafka and not yet delivered, at most (the
    /// sink's `max_buffered_bytes`).
    buffered_bytes: usize,
    producer: Mutex<Option<Arc<SharedProducer>>>,
    metrics: ComponentMetrics,
}

impl Transactional {
    /// Settings for producer `transactional_id` of `pipeline`'s sink.
    pub fn new(
        client: &[(String, String)],
        transactional_id: &str,
        pipeline: &str,
        buffered_bytes: usize,
        metrics: ComponentMetrics,
    ) -> Self {
        let mut client = client.to_vec();
        client.push(("transactional.id".into(), transactional_id.into()));
        client.push(("enable.idempotence".into(), "true".into()));
        client.push(("transaction.timeout.ms".into(), "60000".into()));
        Self {
            client,
            pipeline: pipeline.to_string(),
            buffered_bytes,
            producer: Mutex::new(None),
            metrics,
        }
    }

    /// Delivers payloads in transactions until the queue closes.
    pub async fn run(self: Arc<Self>, mut rx: PayloadReceiver) {
        let dm = self.metrics.delivery();
        // At once, not at the first payload: the transaction this instance
        // left open before a crash holds its offsets, and a read_committed
        // consumer's offset fetch waits for it to end; initialising the
        // producer aborts it.
        if let Err(Failure::Retry(e) | Failure::Fatal(e)) = self.producer().await {
            tracing::warn!(error = %e, "kafka: transactional producer not ready yet; retrying with the first records");
        }
        while let Some(first) = rx.recv().await {
            let mut bytes = first.data.bytes.len();
            let mut group = vec![Held::from(first)];
            while group.len() < MAX_GROUP_PAYLOADS && bytes < MAX_GROUP_BYTES {
                match rx.try_recv() {
                    Ok(p) => {
                        bytes += p.data.bytes.len();
                        group.push(Held::from(p));
                    }
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            let mut backoff = Backoff::default();
            dm.in_flight.set(group.len() as i64);
            loop {
                match self.transact(&mut group).await {
                    Ok(()) => {
                        let events: u64 = group.iter().map(|p| p.events).sum();
                        self.metrics.sent_events.inc_by(events);
                        self.metrics.sent_bytes.inc_by(bytes as u64);
                        dm.latency.observe(started.elapsed().as_secs_f64());
                        self.metrics.recovered();
                        for p in group.drain(..) {
                            p.ack.ack();
                        }
                        break;
                    }
                    Err(f) => {
                        let (why, fatal) = match f {
                            Failure::Retry(w) => (w, false),
                            Failure::Fatal(w) => (w, true),
                        };
                        if fatal {
                            *self.producer.lock() = None;
                        }
                        let events: u64 = group.iter().map(|p| p.events).sum();
                        self.metrics.error("transaction_failed", 1);
                        dm.retried_events.inc_by(events);
                        self.metrics
                            .failing(format!("kafka transaction failed: {why}"));
                        let d = backoff.next_delay();
                        tracing::warn!(error = %why, retry_in_ms = d.as_millis() as u64,
                            "kafka: transaction failed; sending its records again in a new one");
                        tokio::time::sleep(d).await;
                        if group.is_empty() {
                            break;
                        }
                    }
                }
            }
            dm.in_flight.set(0);
        }
    }

    /// The producer, created (and its transactions initialised) on first
    /// use and after a fatal error.
    async fn producer(self: &Arc<Self>) -> Result<Arc<SharedProducer>, Failure> {
        if let Some(p) = self.producer.lock().as_ref() {
            return Ok(p.clone());
        }
        let (client, buffered) = (self.client.clone(), self.buffered_bytes);
        let owner = self.metrics.health_key().to_string();
        let p = blocking(move || {
            let p = SharedProducer::private(&client, buffered, &owner)
                .map_err(|e| Failure::Retry(format!("cannot create the producer: {e}")))?;
            // Fences an earlier producer with the same transactional id
            // (this instance before a crash) and aborts its open
            // transaction.
            p.client()
                .init_transactions(Duration::from_secs(30))
                .map_err(|e| Failure::Retry(format!("init_transactions: {e}")))?;
            Ok(p)
        })
        .await?;
        *self.producer.lock() = Some(p.clone());
        Ok(p)
    }

    /// One transaction for `group`; payloads of partitions the source no
    /// longer owns are removed (dropped unanswered).
    async fn transact(self: &Arc<Self>, group: &mut Vec<Held>) -> Result<(), Failure> {
        let sources = link::sources_of(&self.pipeline);
        let [source] = sources.as_slice() else {
            return Err(Failure::Retry(format!(
                "`exactly_once` needs exactly one `kafka` source in pipeline {}, found {}",
                self.pipeline,
                sources.len()
            )));
        };
        source
            .transactional
            .store(true, std::sync::atomic::Ordering::Release);
        let mut offsets: BTreeMap<(String, i32), i64> = BTreeMap::new();
        group.retain(|p| {
            let Some(a) = p.attachment() else {
                return true;
            };
            match &a.offset {
                Some(o) if !source.member.owns(&o.topic, o.partition) => false,
                Some(o) => {
                    let e = offsets
                        .entry((o.topic.clone(), o.partition))
                        .or_insert(o.next);
                    *e = (*e).max(o.next);
                    true
                }
                None => true,
            }
        });
        if group.is_empty() {
            return Ok(());
        }
        let Some(cgm) = source.member.group_metadata() else {
            return Err(Failure::Retry(
                "the kafka source is not in its group yet".into(),
            ));
        };
        let producer = self.producer().await?;
        let p = producer.clone();
        blocking(move || p.client().begin_transaction().map_err(classify)).await?;
        let mut tpl = TopicPartitionList::new();
        for ((t, p), next) in &offsets {
            let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*next));
        }
        let result = match send_all(&producer, group).await {
            Ok(rejected) => {
                let p = producer.clone();
                blocking(move || {
                    let c = p.client();
                    c.send_offsets_to_transaction(&tpl, &cgm, Duration::from_secs(30))
                        .map_err(classify)?;
                    // Every record is delivered (send_all waited for the
                    // reports), so the flush inside finds nothing to wait
                    // for: rust-rdkafka's flush polls 100 ms at a time.
                    c.commit_transaction(Duration::from_secs(60))
                        .map_err(classify)
                })
                .await
                .map(|()| rejected)
            }
            Err(f) => Err(f),
        };
        match result {
            Ok(rejected) => {
                if rejected > 0 {
                    tracing::error!(
                        messages = rejected,
                        "kafka rejected messages larger than its size limit (message.max.bytes); counted as discarded `message_too_large`"
                    );
                    self.metrics.discarded("message_too_large", rejected);
                }
                Ok(())
            }
            Err(Failure::Retry(why)) => {
                // An abortable error: the transaction must be aborted
                // before a new one begins; if that fails too, start over
                // with a new producer.
                let p = producer.clone();
                match blocking(move || {
                    p.client()
                        .abort_transaction(Duration::from_secs(30))
                        .map_err(|e| Failure::Fatal(format!("abort failed: {e}")))
                })
                .await
                {
                    Ok(()) => Err(Failure::Retry(why)),
                    Err(f) => Err(f),
                }
            }
            Err(f) => Err(f),
        }
    }
}

impl From<Payload> for Held {
    fn from(p: Payload) -> Self {
        Held {
            data: Arc::new(p.data),
            events: p.events,
            ack: p.ack,
            _charge: p.charge,
        }
    }
}

/// Produces every record of `group` (one `rd_kafka_produce_batch` per
/// payload and topic, payloads pointing into the encoded bytes, as the
/// at-least-once sink does) and waits for their delivery reports; the
/// count of records the broker can never take. Any other failed record
/// fails the transaction: it is aborted and sent again whole.
async fn send_all(producer: &Arc<SharedProducer>, group: &[Held]) -> Result<u64, Failure> {
    let mut tasks = tokio::task::JoinSet::new();
    for h in group {
        if h.attachment().is_none() {
            continue;
        }
        let (p, data) = (producer.clone(), h.data.clone());
        tasks.spawn(async move {
            let Some(a) = data
                .attachment
                .as_ref()
                .and_then(|a| a.downcast_ref::<Attachment>())
            else {
                return super::producer::Outcome::default();
            };
            let records: Vec<u32> = (0..data.record_ends.len() as u32).collect();
            p.produce(&data, &a.routes, &records).await
        });
    }
    let mut rejected = 0;
    let mut failure = None;
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.map_err(|e| Failure::Retry(format!("produce task: {e}")))?;
        rejected += outcome.rejected;
        if failure.is_none() && !(outcome.failed.is_empty() && outcome.unroutable.is_empty()) {
            failure = Some(
                outcome
                    .first_error
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "topic does not exist or may not be written".into()),
            );
        }
    }
    match failure {
        Some(why) => Err(Failure::Retry(format!("produce: {why}"))),
        None => Ok(rejected),
    }
}

/// Runs a blocking librdkafka call (transactions wait on the broker) on
/// the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(Failure::Retry(format!("transaction call: {e}"))))
}

fn classify(e: KafkaError) -> Failure {
    match &e {
        KafkaError::Transaction(t) if t.is_fatal() => Failure::Fatal(e.to_string()),
        _ => Failure::Retry(e.to_string()),
    }
}
