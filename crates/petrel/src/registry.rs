//! Every plugin kind the agent knows, listed once. The config loader, the
//! topology and `validate` iterate these lists and never name a concrete
//! plugin: adding a kind is its own module plus one line here.

use petrel_core::plugin::{ProcessorPlugin, SinkPlugin, SourcePlugin};

use crate::{processors, sinks, sources};

/// Source kinds (`sources:`).
pub static SOURCES: &[&SourcePlugin] = &[
    &sources::file::PLUGIN,
    &sources::kubernetes::PLUGIN,
    &sources::kubernetes::files::PLUGIN,
    &sources::stdin::PLUGIN,
    &sources::syslog::PLUGIN,
    &sources::tcp::PLUGIN,
    &sources::http::PLUGIN,
    &sources::spool::PLUGIN,
    &sources::kafka::PLUGIN,
    #[cfg(feature = "opentelemetry")]
    &sources::opentelemetry::PLUGIN,
];

/// Processor kinds (`processors:`), in the order `validate` lists them.
pub static PROCESSORS: &[&ProcessorPlugin] = &[
    &processors::parse_regex::PLUGIN,
    &processors::parse_json::PLUGIN,
    &processors::parse_delimiter::PLUGIN,
    &processors::parse_timestamp::PLUGIN,
    &processors::filter::PLUGIN,
    &processors::fields::PLUGIN,
    &processors::mask::PLUGIN,
];

/// Sink kinds (`sinks:`).
pub static SINKS: &[&SinkPlugin] = &[
    &sinks::file::PLUGIN,
    &sinks::stdout::PLUGIN,
    &sinks::blackhole::PLUGIN,
    &sinks::kafka::PLUGIN,
    &sinks::http::PLUGIN,
    #[cfg(feature = "elasticsearch")]
    &sinks::elasticsearch::PLUGIN,
    #[cfg(feature = "loki")]
    &sinks::loki::PLUGIN,
    #[cfg(feature = "opentelemetry")]
    &sinks::opentelemetry::PLUGIN,
];

/// Type names of `plugins`, for messages.
pub fn type_names<C: ?Sized>(plugins: &[&petrel_core::plugin::Plugin<C>]) -> Vec<&'static str> {
    plugins.iter().map(|p| p.type_name).collect()
}
