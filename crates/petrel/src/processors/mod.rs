//! Processors: the steps of a pipeline's chain, one file per plugin, applied
//! in order to each batch on the shared processing pool.

pub mod common;
pub mod fields;
pub mod filter;
pub mod mask;
pub mod parse_delimiter;
pub mod parse_json;
pub mod parse_regex;
pub mod parse_timestamp;

use petrel_core::config::Node;
use petrel_core::plugin::Processor;
use petrel_core::ComponentMetrics;

/// Processor types that can appear in `processors:`.
pub const PROCESSOR_TYPES: &[&str] = &[
    "parse_regex",
    "parse_json",
    "parse_delimiter",
    "parse_timestamp",
    "filter",
    "fields",
    "mask",
];

/// A parsed processor entry.
#[derive(Debug, Clone)]
pub enum ProcessorConfig {
    /// Named regex captures into fields.
    ParseRegex(parse_regex::Config),
    /// A JSON object into fields.
    ParseJson(parse_json::Config),
    /// Separated values into fields.
    ParseDelimiter(parse_delimiter::Config),
    /// A field into the event time.
    ParseTimestamp(parse_timestamp::Config),
    /// Keep or drop events by field regexes.
    Filter(filter::Config),
    /// Add, remove, rename, copy fields.
    Fields(fields::Config),
    /// Replace sensitive text.
    Mask(mask::Config),
}

impl ProcessorConfig {
    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            ProcessorConfig::ParseRegex(_) => "parse_regex",
            ProcessorConfig::ParseJson(_) => "parse_json",
            ProcessorConfig::ParseDelimiter(_) => "parse_delimiter",
            ProcessorConfig::ParseTimestamp(_) => "parse_timestamp",
            ProcessorConfig::Filter(_) => "filter",
            ProcessorConfig::Fields(_) => "fields",
            ProcessorConfig::Mask(_) => "mask",
        }
    }

    /// Creates the running processor; `metrics` are its counters.
    pub fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Box<dyn Processor>> {
        Ok(match self {
            ProcessorConfig::ParseRegex(c) => Box::new(parse_regex::ParseRegex::new(c, metrics)?),
            ProcessorConfig::ParseJson(c) => Box::new(parse_json::ParseJson::new(c, metrics)?),
            ProcessorConfig::ParseDelimiter(c) => {
                Box::new(parse_delimiter::ParseDelimiter::new(c, metrics)?)
            }
            ProcessorConfig::ParseTimestamp(c) => {
                Box::new(parse_timestamp::ParseTimestamp::new(c, metrics)?)
            }
            ProcessorConfig::Filter(c) => Box::new(filter::Filter::new(c, metrics)?),
            ProcessorConfig::Fields(c) => Box::new(fields::Fields::new(c, metrics)?),
            ProcessorConfig::Mask(c) => Box::new(mask::Mask::new(c, metrics)?),
        })
    }
}

/// Parses one entry of `processors:`; problems go to the node's error list.
pub fn parse(node: Node<'_>) -> Option<ProcessorConfig> {
    use ProcessorConfig as P;
    match crate::config::component_type(node, PROCESSOR_TYPES, "processor")? {
        "parse_regex" => {
            parse_regex::Config::parse(node.as_map(parse_regex::KEYS)?).map(P::ParseRegex)
        }
        "parse_json" => parse_json::Config::parse(node.as_map(parse_json::KEYS)?).map(P::ParseJson),
        "parse_delimiter" => parse_delimiter::Config::parse(node.as_map(parse_delimiter::KEYS)?)
            .map(P::ParseDelimiter),
        "parse_timestamp" => parse_timestamp::Config::parse(node.as_map(parse_timestamp::KEYS)?)
            .map(P::ParseTimestamp),
        "filter" => filter::Config::parse(node.as_map(filter::KEYS)?).map(P::Filter),
        "fields" => fields::Config::parse(node.as_map(fields::KEYS)?).map(P::Fields),
        "mask" => mask::Config::parse(node.as_map(mask::KEYS)?).map(P::Mask),
        _ => None,
    }
}
