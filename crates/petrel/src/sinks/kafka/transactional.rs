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
use petrel_core::plugin::{Payload, PayloadReceiver};
use petrel_core::{ComponentMetrics, EventBatch};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::producer::{client_config, record_range, Routes};
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

/// The transactional side of a `kafka` sink.
pub struct Transactional {
    client: Vec<(String, String)>,
    pipeline: String,
    producer: Mutex<Option<Arc<ThreadedProducer<DefaultProducerContext>>>>,
    metrics: ComponentMetrics,
}

impl Transactional {
    /// Settings for producer `transactional_id` of `pipeline`'s sink.
    pub fn new(
        client: &[(String, String)],
        transactional_id: &str,
        pipeline: &str,
        metrics: ComponentMetrics,
    ) -> Self {
        let mut client = client.to_vec();
        client.push(("transactional.id".into(), transactional_id.into()));
        client.push(("enable.idempotence".into(), "true".into()));
        client.push(("transaction.timeout.ms".into(), "60000".into()));
        Self {
            client,
            pipeline: pipeline.to_string(),
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
        let this = self.clone();
        if let Ok(Err(Failure::Retry(e) | Failure::Fatal(e))) =
            tokio::task::spawn_blocking(move || this.producer().map(drop)).await
        {
            tracing::warn!(error = %e, "kafka: transactional producer not ready yet; retrying with the first records");
        }
        while let Some(first) = rx.recv().await {
            let mut bytes = first.data.bytes.len();
            let mut group = vec![first];
            while group.len() < MAX_GROUP_PAYLOADS && bytes < MAX_GROUP_BYTES {
                match rx.try_recv() {
                    Ok(p) => {
                        bytes += p.data.bytes.len();
                        group.push(p);
                    }
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            let mut backoff = Backoff::default();
            dm.in_flight.set(group.len() as i64);
            loop {
                let this = self.clone();
                let joined = tokio::task::spawn_blocking(move || {
                    let r = this.transact(&mut group);
                    (group, r)
                })
                .await;
                let Ok((back, result)) = joined else {
                    // The blocking task panicked: its payloads went with
                    // it, unanswered, and are read again.
                    self.metrics.error("panic", 1);
                    break;
                };
                group = back;
                match result {
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

    fn producer(&self) -> Result<Arc<ThreadedProducer<DefaultProducerContext>>, Failure> {
        if let Some(p) = self.producer.lock().as_ref() {
            return Ok(p.clone());
        }
        let p: ThreadedProducer<DefaultProducerContext> = client_config(&self.client)
            .create()
            .map_err(|e| Failure::Retry(format!("cannot create the producer: {e}")))?;
        // Fences an earlier producer with the same transactional id (this
        // instance before a crash) and aborts its open transaction.
        p.init_transactions(Duration::from_secs(30))
            .map_err(|e| Failure::Retry(format!("init_transactions: {e}")))?;
        let p = Arc::new(p);
        *self.producer.lock() = Some(p.clone());
        Ok(p)
    }

    /// One transaction for `group`; payloads of partitions the source no
    /// longer owns are removed (dropped unanswered).
    fn transact(&self, group: &mut Vec<Payload>) -> Result<(), Failure> {
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
            let Some(a) = attachment(p) else {
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
        let producer = self.producer()?;
        producer.begin_transaction().map_err(classify)?;
        let mut rejected = 0u64;
        let sent = self.send_all(&producer, group, &mut rejected);
        let mut tpl = TopicPartitionList::new();
        for ((t, p), next) in &offsets {
            let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*next));
        }
        let result = sent
            .and_then(|()| {
                producer
                    .send_offsets_to_transaction(&tpl, &cgm, Duration::from_secs(30))
                    .map_err(classify)
            })
            .and_then(|()| wait_delivered(&producer, Duration::from_secs(60)))
            .and_then(|()| {
                producer
                    .commit_transaction(Duration::from_secs(60))
                    .map_err(classify)
            });
        if let Err(f) = result {
            if let Failure::Retry(_) = f {
                // An abortable error: the transaction must be aborted
                // before a new one begins; if that fails too, start over
                // with a new producer.
                if let Err(e) = producer.abort_transaction(Duration::from_secs(30)) {
                    return Err(Failure::Fatal(format!("abort failed: {e}")));
                }
            }
            return Err(f);
        }
        if rejected > 0 {
            tracing::error!(
                messages = rejected,
                "kafka rejected messages larger than its size limit (message.max.bytes); counted as discarded `message_too_large`"
            );
            self.metrics.discarded("message_too_large", rejected);
        }
        Ok(())
    }

    fn send_all(
        &self,
        producer: &ThreadedProducer<DefaultProducerContext>,
        group: &[Payload],
        rejected: &mut u64,
    ) -> Result<(), Failure> {
        for p in group {
            let Some(a) = attachment(p) else {
                continue;
            };
            let r = &a.routes;
            for i in 0..p.data.record_ends.len() {
                let topic = r
                    .topic_of
                    .get(i)
                    .and_then(|&t| r.topics.get(t as usize))
                    .or_else(|| r.topics.first());
                let Some(topic) = topic else {
                    continue;
                };
                let value = &p.data.bytes[record_range(&p.data, i)];
                let key = r
                    .key_ranges
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|(a, b)| &r.keys[a as usize..b as usize]);
                let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(value);
                if let Some(k) = key {
                    record = record.key(k);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            record = back;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err((
                            KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
                            _,
                        )) => {
                            *rejected += 1;
                            break;
                        }
                        Err((e, _)) => return Err(Failure::Retry(format!("produce: {e}"))),
                    }
                }
            }
        }
        Ok(())
    }
}

/// Waits until librdkafka has delivered every record of the transaction.
/// `commit_transaction` does it too, but through rust-rdkafka's `flush`,
/// which polls 100 ms at a time, and so made every commit last 100 ms or
/// more (exactly once reached 0.57× the records/s of at least once at the
/// default memory limit; each transaction's records hold the budget until
/// it commits). The producer's own thread serves the delivery reports, so
/// the count goes down without us polling.
fn wait_delivered(
    producer: &ThreadedProducer<DefaultProducerContext>,
    timeout: Duration,
) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(Failure::Retry(format!(
                "{} records not delivered within {} s",
                producer.in_flight_count(),
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn attachment(p: &Payload) -> Option<&Attachment> {
    p.data
        .attachment
        .as_ref()
        .and_then(|a| a.downcast_ref::<Attachment>())
}

fn classify(e: KafkaError) -> Failure {
    match &e {
        KafkaError::Transaction(t) if t.is_fatal() => Failure::Fatal(e.to_string()),
        _ => Failure::Retry(e.to_string()),
    }
}
