//! Sinks: where events leave the agent. One file per plugin.
//!
//! Each sink encodes on the processing pool ([`petrel_core::plugin::Sink::encode`])
//! and delivers on the shared sink runtime, acknowledging every payload only
//! after its data reached the destination.

pub mod blackhole;
pub mod client;
pub mod congestion;
pub mod dead_letter;
pub mod driver;
#[cfg(feature = "elasticsearch")]
pub mod elasticsearch;
pub mod file;
pub mod http;
pub mod kafka;
#[cfg(feature = "loki")]
pub mod loki;
#[cfg(feature = "opentelemetry")]
pub mod opentelemetry;
pub mod origin;
#[cfg(feature = "s3")]
pub mod s3;
pub mod stdout;
pub mod template;
pub mod tls;
mod writer;

use petrel_core::config::Map;
use petrel_core::encode::Encoding;

/// Reads the common `encoding:` key (default `text`).
fn parse_encoding(map: &Map<'_>) -> Option<Encoding> {
    match map.get("encoding") {
        None => Some(Encoding::Text),
        Some(n) => n.as_choice(Encoding::NAMES).and_then(Encoding::from_name),
    }
}
