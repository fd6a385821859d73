//! Processors: the steps of a pipeline's chain, one file per plugin, applied
//! in order to each batch on the shared processing pool.

pub mod common;
pub mod condition;
pub mod dedupe;
pub mod fields;
pub mod filter;
pub mod keys;
pub mod mask;
pub mod parse_delimiter;
pub mod parse_json;
pub mod parse_regex;
pub mod parse_timestamp;
#[cfg(feature = "remap")]
pub mod remap;
pub mod sample;
pub mod throttle;
pub mod when;
