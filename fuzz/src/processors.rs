//! The parsing processors, compiled from the agent's own sources.

#[path = "../../crates/petrel/src/processors/common.rs"]
pub mod common;
#[path = "../../crates/petrel/src/processors/parse_delimiter.rs"]
pub mod parse_delimiter;
#[path = "../../crates/petrel/src/processors/parse_json/mod.rs"]
pub mod parse_json;
#[path = "../../crates/petrel/src/processors/parse_regex.rs"]
pub mod parse_regex;
