//! Sources: where events enter the agent. One module per plugin, plus the
//! machinery receiving sources share (`net`).

pub mod beats;
pub mod file;
pub mod fluent;
pub mod http;
pub mod internal_logs;
pub mod journald;
pub mod kafka;
pub mod kernel;
pub mod kubernetes;
pub mod net;
#[cfg(feature = "opentelemetry")]
pub mod opentelemetry;
pub mod ordered;
pub mod splunk_hec;
pub mod spool;
pub mod stdin;
pub mod syslog;
pub mod tcp;
