//! Sources: where events enter the agent. One module per plugin.

pub mod file;
pub mod stdin;
