//! Sources: where events enter the agent. One module per plugin.

pub mod file;

use petrel_core::config::Node;

/// Source types that can appear in `sources:`.
pub const SOURCE_TYPES: &[&str] = &["file"];

/// A parsed source entry.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// Tails files.
    File(file::FileSourceConfig),
}

impl SourceConfig {
    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            SourceConfig::File(_) => "file",
        }
    }
}

/// Parses one entry of `sources:`; problems go to the node's error list.
pub fn parse(node: Node<'_>) -> Option<SourceConfig> {
    match crate::config::component_type(node, SOURCE_TYPES, "source")? {
        "file" => file::FileSourceConfig::parse(node.as_map(file::KEYS)?).map(SourceConfig::File),
        _ => None,
    }
}
