//! Sources: where events enter the agent. One module per plugin, plus the
//! machinery receiving sources share (`net`).

pub mod file;
pub mod fluent;
pub mod http;
pub mod kafka;
pub mod kubernetes;
pub mod net;
#[cfg(feature = "opentelemetry")]
pub mod opentelemetry;
pub mod spool;
pub mod stdin;
pub mod syslog;
pub mod tcp;
