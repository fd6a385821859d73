//! Petrel, a log collection agent: sources → processor chain → sinks on
//! shared threads, with delivery-acknowledged checkpoints.
//!
//! The modules are the engine (`sources`, `processors`, `topology`,
//! `sinks`, and what they share) and the command line (`cli`, one module
//! per subcommand); the binary (`main.rs`) only calls [`cli::main`].

pub mod alloc;
pub mod api;
pub mod cli;
pub mod config;
pub mod config_watch;
pub mod convert;
pub mod data_dir;
pub mod fleet;
pub mod host;
pub mod kafka_client;
pub mod paths;
pub mod processors;
pub mod registry;
pub mod sinks;
pub mod sources;
pub mod tls;
pub mod topology;

// The library's own unit tests measure allocations too (the binary sets
// the same allocator in main.rs).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: alloc::Counting = alloc::Counting;
