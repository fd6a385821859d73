//! Petrel, a log collection agent: sources → processor chain → sinks on
//! shared threads, with delivery-acknowledged checkpoints.
//!
//! The binary (`main.rs`) is a thin command line over this library.

pub mod api;
pub mod config;
pub mod config_watch;
pub mod data_dir;
pub mod paths;
pub mod pipe;
pub mod processors;
pub mod registry;
pub mod sinks;
pub mod sources;
pub mod tapcmd;
pub mod testcmd;
pub mod top;
pub mod topology;
