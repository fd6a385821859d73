//! What the watcher's daemon tests share.

use std::time::{Duration, Instant};

/// The bound of every wait on a daemon.
pub const LONG: Duration = Duration::from_secs(60);

/// Polls `f` every 100 ms until it returns Some, for at most `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
