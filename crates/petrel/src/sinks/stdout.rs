//! `type: stdout` — writes encoded events to the agent's standard output.

use std::io::Write;
use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::encode::Encoding;
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::writer::{self, Target};

/// Keys accepted by the stdout sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "encoding",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Writes events to standard output and acknowledges after the write."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    super::ENCODING_DOC,
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// Configuration of the stdout sink.
#[derive(Debug, Clone)]
pub struct StdoutSinkConfig {
    /// `text`, `ndjson` or a line template.
    pub encoding: Encoding,
}

impl StdoutSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        Some(Self {
            encoding: super::parse_encoding(&map)?,
        })
    }
}

/// The running stdout sink.
pub struct StdoutSink {
    encoding: Encoding,
    metrics: ComponentMetrics,
}

impl StdoutSink {
    /// A sink writing to this process's stdout.
    pub fn new(c: &StdoutSinkConfig, metrics: ComponentMetrics) -> Self {
        Self {
            encoding: c.encoding.clone(),
            metrics,
        }
    }
}

struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        std::io::stdout().lock().write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

impl Target for Stdout {
    fn sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink for StdoutSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        writer::encode(&self.encoding, batch, out, &self.metrics);
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(writer::run(Stdout, rx, false, self.metrics.clone()))
    }
}

/// Registration of `type: stdout`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "stdout",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| StdoutSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for StdoutSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(Vec::new())
    }

    fn type_name(&self) -> &'static str {
        "stdout"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(StdoutSink::new(self, metrics)))
    }
}
