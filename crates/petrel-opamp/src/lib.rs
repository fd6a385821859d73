//! An OpAMP client (Open Agent Management Protocol, specification v0.18.0)
//! for the agent: it connects to a management server over WebSocket, or
//! over plain HTTP polling when WebSocket is not available, sends the
//! agent's status as the protocol's `AgentToServer` messages and hands
//! what the server sends (remote configuration, connection settings,
//! commands) to the agent as [`Event`]s.
//!
//! The agent keeps one up-to-date status in a [`Reporter`]; the client
//! sends what changed since it last sent each part (the specification's
//! status compression) and all of it on a new connection or when the
//! server asks for it (`ReportFullState`). Nothing is queued: a status
//! changed twice while disconnected is sent once, as it is now.
//!
//! Knows nothing of pipelines: the agent decides what a configuration
//! means. Everything the server sends is bounded (message size) and
//! checked (frame header, protobuf, instance uid); what is refused is
//! reported as [`Event::Refused`] with a reason, and the connection goes
//! on where the protocol allows it.

pub mod client;
pub mod frame;
pub mod report;

/// The OpAMP messages, generated from the vendored `proto/opamp.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/opamp.proto.v1.rs"));
}

pub use client::{spawn, ClientHandle, Event, Refusal, Settings, Transport};
pub use report::Reporter;

/// A new instance uid: a UUID version 7 (time-ordered, random below the
/// millisecond), as the specification recommends.
pub fn new_instance_uid() -> [u8; 16] {
    *uuid::Uuid::now_v7().as_bytes()
}

/// `uid` in the canonical text form (`0190c9a2-...`).
pub fn uid_text(uid: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*uid).hyphenated().to_string()
}

/// Parses a uid written by [`uid_text`].
pub fn parse_uid(s: &str) -> Option<[u8; 16]> {
    uuid::Uuid::parse_str(s.trim()).ok().map(|u| *u.as_bytes())
}

/// Agent capabilities (`AgentCapabilities` bits).
pub mod caps {
    #![allow(missing_docs)]
    pub const REPORTS_STATUS: u64 = 0x1;
    pub const ACCEPTS_REMOTE_CONFIG: u64 = 0x2;
    pub const REPORTS_EFFECTIVE_CONFIG: u64 = 0x4;
    pub const ACCEPTS_PACKAGES: u64 = 0x8;
    pub const REPORTS_PACKAGE_STATUSES: u64 = 0x10;
    pub const REPORTS_OWN_TRACES: u64 = 0x20;
    pub const REPORTS_OWN_METRICS: u64 = 0x40;
    pub const REPORTS_OWN_LOGS: u64 = 0x80;
    pub const ACCEPTS_OPAMP_CONNECTION_SETTINGS: u64 = 0x100;
    pub const ACCEPTS_OTHER_CONNECTION_SETTINGS: u64 = 0x200;
    pub const ACCEPTS_RESTART_COMMAND: u64 = 0x400;
    pub const REPORTS_HEALTH: u64 = 0x800;
    pub const REPORTS_REMOTE_CONFIG: u64 = 0x1000;
    pub const REPORTS_HEARTBEAT: u64 = 0x2000;
    pub const REPORTS_AVAILABLE_COMPONENTS: u64 = 0x4000;
    pub const REPORTS_CONNECTION_SETTINGS_STATUS: u64 = 0x8000;
    /// Every server capability bit v0.18.0 defines; others are unknown.
    pub const KNOWN_SERVER: u64 = 0x7f;
}

/// Builds a `KeyValue` with a string value.
pub fn kv(key: &str, value: &str) -> proto::KeyValue {
    proto::KeyValue {
        key: key.to_string(),
        value: Some(proto::AnyValue {
            value: Some(proto::any_value::Value::StringValue(value.to_string())),
        }),
    }
}
