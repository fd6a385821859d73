//! `type: tcp` — writes encoded events as lines to a TCP or TLS receiver
//! (Fluent Bit's `tcp` output, Vector's `socket` sink in TCP mode), through
//! the syslog sink's transport (`sinks/socket.rs`): reconnected with
//! backoff, acknowledged once the receiver's TCP took the bytes.

use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::socket::{self, Transport};

/// Keys accepted by the tcp sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "mode",
    "tls",
    "encoding",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Writes events as lines (`encoding`: the message, JSON, or a template) to a TCP or TLS receiver. The connection is reopened with backoff when it fails; an event is acknowledged once the receiver's TCP acknowledged its bytes (TCP has no application acknowledgement: what a receiver took but never processed is lost), and after a broken connection everything unacknowledged is sent again (duplicates counted in `retried_events`)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    socket::ADDRESS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "mode",
        kind: petrel_core::plugin::KeyKind::OneOf(&["tcp", "tls"]),
        default: Some(r#"tcp"#),
        doc: r#"The transport."#,
    },
    socket::TLS_DOC,
    super::ENCODING_DOC,
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// Registration of `type: tcp`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "tcp",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| TcpSinkConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Configuration of the tcp sink.
#[derive(Debug, Clone)]
pub struct TcpSinkConfig {
    transport: Transport,
    encoding: Encoding,
}

impl TcpSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let transport = socket::parse_transport(&map, &["tcp", "tls"]);
        let encoding = super::parse_encoding(&map);
        Some(Self {
            transport: transport?,
            encoding: encoding?,
        })
    }
}

impl petrel_core::plugin::SinkConfig for TcpSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![crate::sinks::host_of(&self.transport.address)])
    }

    fn type_name(&self) -> &'static str {
        "tcp"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(TcpSink {
            transport: self.transport.prepare(&crate::tls::Owner::of(&metrics))?,
            config: self.clone(),
            metrics,
        }))
    }
}

/// The running tcp sink.
pub struct TcpSink {
    /// Ready to connect (TLS files read at build).
    transport: Arc<Transport>,
    config: TcpSinkConfig,
    metrics: ComponentMetrics,
}

impl Sink for TcpSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        let stats = encode_batch(&self.config.encoding, batch, &mut out.bytes, None);
        super::count_encode_stats(&self.metrics, &stats);
        out.invalid_utf8 = stats.invalid_utf8;
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(socket::run(
            self.transport.clone(),
            rx,
            self.metrics.clone(),
        ))
    }
}
