//! `type: blackhole` — counts events and discards them; acknowledges at once.
//! The reference sink for measuring the rest of the pipeline.

use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

/// Keys accepted by the blackhole sink.
pub const KEYS: &[&str] = &["type", "id"];

/// What this plugin does, for the component reference.
pub const DOC: &str =
    r#"Counts events and discards them, acknowledging at once; measures the rest of a pipeline."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
];

/// Configuration of the blackhole sink (it has no options).
#[derive(Debug, Clone)]
pub struct BlackholeSinkConfig;

impl BlackholeSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(_map: Map<'_>) -> Option<Self> {
        Some(Self)
    }
}

/// The running blackhole sink.
pub struct BlackholeSink {
    metrics: ComponentMetrics,
}

impl BlackholeSink {
    /// A sink that counts and discards.
    pub fn new(metrics: ComponentMetrics) -> Self {
        Self { metrics }
    }
}

impl Sink for BlackholeSink {
    fn encode(&self, _batch: &EventBatch, _out: &mut Encoded) {
        // Nothing is written, so nothing is encoded; the input size stands
        // in for the bytes "sent".
    }

    fn run(self: Arc<Self>, mut rx: PayloadReceiver) -> BoxFuture {
        Box::pin(async move {
            // Grows on first use only: a sink that never receives (one of
            // many pipelines whose selector matches nothing) holds no
            // buffer; 256 preallocated payloads were 30 KB per sink.
            let mut buf = Vec::new();
            while rx.recv_many(&mut buf, 256).await > 0 {
                for p in buf.drain(..) {
                    self.metrics.sent_events.inc_by(p.events);
                    self.metrics.sent_bytes.inc_by(p.input_bytes);
                    p.ack.ack();
                }
            }
        })
    }
}

/// Registration of `type: blackhole`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "blackhole",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| BlackholeSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for BlackholeSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    fn type_name(&self) -> &'static str {
        "blackhole"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(BlackholeSink::new(metrics)))
    }
}
