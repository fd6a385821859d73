//! Sinks: where events leave the agent. One file per plugin.
//!
//! Each sink encodes on the processing pool ([`petrel_core::plugin::Sink::encode`])
//! and delivers on the shared sink runtime, acknowledging every payload only
//! after its data reached the destination.

pub mod blackhole;
pub mod congestion;
pub mod file;
pub mod http;
pub mod kafka;
pub mod stdout;
pub mod template;
mod writer;

use std::sync::Arc;

use petrel_core::config::{Map, Node};
use petrel_core::encode::Encoding;
use petrel_core::plugin::Sink;
use petrel_core::ComponentMetrics;

/// Sink types that can appear in `sinks:`.
pub const SINK_TYPES: &[&str] = &["file", "stdout", "blackhole", "kafka", "http"];

/// A parsed sink entry.
#[derive(Debug, Clone)]
pub enum SinkConfig {
    /// Appends to a local file.
    File(file::FileSinkConfig),
    /// Writes to the agent's standard output.
    Stdout(stdout::StdoutSinkConfig),
    /// Counts and discards.
    Blackhole(blackhole::BlackholeSinkConfig),
    /// Produces to Kafka.
    Kafka(Box<kafka::KafkaSinkConfig>),
    /// POSTs to an HTTP endpoint.
    Http(Box<http::HttpSinkConfig>),
}

impl SinkConfig {
    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            SinkConfig::File(_) => "file",
            SinkConfig::Stdout(_) => "stdout",
            SinkConfig::Blackhole(_) => "blackhole",
            SinkConfig::Kafka(_) => "kafka",
            SinkConfig::Http(_) => "http",
        }
    }

    /// Creates the running sink.
    pub fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(match self {
            SinkConfig::File(c) => Arc::new(file::FileSink::new(c, metrics)?),
            SinkConfig::Stdout(c) => Arc::new(stdout::StdoutSink::new(c, metrics)),
            SinkConfig::Blackhole(_) => Arc::new(blackhole::BlackholeSink::new(metrics)),
            SinkConfig::Kafka(c) => Arc::new(kafka::KafkaSink::new(c, metrics)?),
            SinkConfig::Http(c) => Arc::new(http::HttpSink::new(c, metrics)?),
        })
    }
}

/// Parses one entry of `sinks:`; problems go to the node's error list.
pub fn parse(node: Node<'_>) -> Option<SinkConfig> {
    let ty = crate::config::component_type(node, SINK_TYPES, "sink")?;
    match ty {
        "file" => file::FileSinkConfig::parse(node.as_map(file::KEYS)?).map(SinkConfig::File),
        "stdout" => {
            stdout::StdoutSinkConfig::parse(node.as_map(stdout::KEYS)?).map(SinkConfig::Stdout)
        }
        "blackhole" => blackhole::BlackholeSinkConfig::parse(node.as_map(blackhole::KEYS)?)
            .map(SinkConfig::Blackhole),
        "kafka" => kafka::KafkaSinkConfig::parse(node.as_map(kafka::KEYS)?)
            .map(|c| SinkConfig::Kafka(Box::new(c))),
        "http" => http::HttpSinkConfig::parse(node.as_map(http::KEYS)?)
            .map(|c| SinkConfig::Http(Box::new(c))),
        _ => None,
    }
}

/// Reads the common `encoding:` key (default `text`).
fn parse_encoding(map: &Map<'_>) -> Option<Encoding> {
    match map.get("encoding") {
        None => Some(Encoding::Text),
        Some(n) => n.as_choice(Encoding::NAMES).and_then(Encoding::from_name),
    }
}
