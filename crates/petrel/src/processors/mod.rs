//! Processors: the steps of a pipeline's chain, one file per plugin.
//!
//! No processor types exist yet; `processors:` must be empty. Parsing,
//! filtering and masking processors plug in here.

use petrel_core::config::Node;
use petrel_core::plugin::Processor;

/// Processor types that can appear in `processors:`.
pub const PROCESSOR_TYPES: &[&str] = &[];

/// A parsed processor entry.
#[derive(Debug, Clone)]
pub enum ProcessorConfig {}

impl ProcessorConfig {
    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match *self {}
    }

    /// Creates the running processor.
    pub fn build(
        &self,
        _metrics: petrel_core::ComponentMetrics,
    ) -> anyhow::Result<Box<dyn Processor>> {
        match *self {}
    }
}

/// Parses one entry of `processors:`.
pub fn parse(node: Node<'_>) -> Option<ProcessorConfig> {
    crate::config::component_type(node, PROCESSOR_TYPES, "processor")?;
    None
}
