//! Petrel's core: the types every source, processor and sink plugin shares.
//!
//! Data flows as [`event::EventBatch`]es: one read buffer plus events that
//! point into it. Each batch carries a [`ack::BatchAck`] so that sinks can
//! tell the source when its bytes are safely delivered, and a
//! [`memory::MemoryCharge`] that keeps the agent under its memory limit.
//! Plugins depend on this crate; it depends on none of them.

pub mod ack;
pub mod config;
pub mod encode;
pub mod event;
pub mod exposition;
pub mod health;
pub mod json;
pub mod le;
pub mod memory;
pub mod metrics;
pub mod plugin;
pub mod schema;
pub mod state;
pub mod tap;
pub mod template;
pub mod yaml;

pub use ack::{AckPart, AckReceiver, BatchAck};
pub use config::{ConfigError, ConfigErrors, Node};
pub use event::{Event, EventBatch, Hidden, Key, Origin, Rerouted, SourceInfo, Span, Value};
pub use memory::{MemoryBudget, MemoryCharge, PipelineBudget};
pub use metrics::{
    BufferGauges, ComponentMetrics, DamageReporter, DeliveryMetrics, LazyCounter, Metrics,
};
