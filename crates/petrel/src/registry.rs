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
    &sources::journald::PLUGIN,
    &sources::kernel::PLUGIN,
    &sources::internal_logs::PLUGIN,
    &sources::fluent::PLUGIN,
    &sources::beats::PLUGIN,
    &sources::syslog::PLUGIN,
    &sources::tcp::PLUGIN,
    &sources::http::PLUGIN,
    &sources::splunk_hec::PLUGIN,
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
    &processors::throttle::PLUGIN,
    &processors::dedupe::PLUGIN,
    &processors::sample::PLUGIN,
    #[cfg(feature = "remap")]
    &processors::remap::PLUGIN,
];

/// Sink kinds (`sinks:`).
pub static SINKS: &[&SinkPlugin] = &[
    &sinks::file::PLUGIN,
    &sinks::stdout::PLUGIN,
    &sinks::blackhole::PLUGIN,
    &sinks::kafka::PLUGIN,
    &sinks::http::PLUGIN,
    &sinks::syslog::PLUGIN,
    &sinks::tcp::PLUGIN,
    #[cfg(feature = "elasticsearch")]
    &sinks::elasticsearch::PLUGIN,
    #[cfg(feature = "loki")]
    &sinks::loki::PLUGIN,
    #[cfg(feature = "s3")]
    &sinks::s3::PLUGIN,
    #[cfg(feature = "opentelemetry")]
    &sinks::opentelemetry::PLUGIN,
];

/// Type names of `plugins`, for messages.
pub fn type_names<C: ?Sized>(plugins: &[&petrel_core::plugin::Plugin<C>]) -> Vec<&'static str> {
    plugins.iter().map(|p| p.type_name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::plugin::Plugin;

    /// The loader checks entries against `keys` and the reference lists
    /// `key_docs`: the two must name the same keys, each once.
    fn check<C: ?Sized>(plugins: &[&Plugin<C>]) {
        for p in plugins {
            assert!(!p.doc.trim().is_empty(), "`{}` has no DOC", p.type_name);
            let documented: Vec<&str> = p.key_docs.iter().map(|k| k.name).collect();
            for k in p.keys {
                assert_eq!(
                    documented.iter().filter(|d| *d == k).count(),
                    1,
                    "`{}`: key `{k}` must be documented exactly once in KEY_DOCS",
                    p.type_name
                );
            }
            for d in &documented {
                assert!(
                    p.keys.contains(d),
                    "`{}`: KEY_DOCS documents `{d}`, which is not among its KEYS",
                    p.type_name
                );
            }
            for k in p.key_docs {
                assert!(
                    !k.doc.trim().is_empty(),
                    "`{}`.`{}`: empty doc",
                    p.type_name,
                    k.name
                );
            }
        }
    }

    #[test]
    fn every_key_is_documented_and_every_documented_key_exists() {
        check(SOURCES);
        check(PROCESSORS);
        check(SINKS);
    }
}
