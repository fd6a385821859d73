//! What a `kafka` sink with `exactly_once` needs from the `kafka` source of
//! its pipeline: the consumer group's metadata (so that a transaction's
//! offset commit fences an instance that lost the partitions), and a way
//! to tell the source that offsets are committed inside transactions, not
//! by the source itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;
use rdkafka::consumer::ConsumerGroupMetadata;

/// The consumer's side of the link.
pub trait GroupMember: Send + Sync {
    /// The group's current metadata (member id, generation), when the
    /// consumer is in the group.
    fn group_metadata(&self) -> Option<ConsumerGroupMetadata>;

    /// True while partition `partition` of `topic` is assigned to this
    /// consumer: a transaction must not commit offsets of partitions that
    /// moved to another instance.
    fn owns(&self, topic: &str, partition: i32) -> bool;
}

/// One `kafka` source as seen by the sinks of its pipeline.
pub struct ConsumerLink {
    /// The consumer.
    pub member: Arc<dyn GroupMember>,
    /// Set by a transactional sink: the source must not commit offsets
    /// itself (a late commit of its own could move the group's offset
    /// back behind a transaction's and cause duplicates).
    pub transactional: AtomicBool,
}

impl ConsumerLink {
    /// True once a transactional sink took over committing.
    pub fn is_transactional(&self) -> bool {
        self.transactional.load(Ordering::Acquire)
    }
}

static LINKS: LazyLock<Mutex<HashMap<String, Vec<Weak<ConsumerLink>>>>> =
    LazyLock::new(Default::default);

/// Registers `link` as a kafka source of `pipeline`, for as long as it
/// lives.
pub fn register(pipeline: &str, link: &Arc<ConsumerLink>) {
    let mut m = LINKS.lock();
    let v = m.entry(pipeline.to_string()).or_default();
    v.retain(|w| w.strong_count() > 0);
    v.push(Arc::downgrade(link));
}

/// The kafka sources of `pipeline` that are running.
pub fn sources_of(pipeline: &str) -> Vec<Arc<ConsumerLink>> {
    LINKS
        .lock()
        .get(pipeline)
        .map(|v| v.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default()
}
