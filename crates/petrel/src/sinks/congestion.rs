//! Congestion control for network sinks: an AIMD window of batches in
//! flight. Failures shrink it fast (halving), successes grow it (doubling
//! up to the threshold, then by one), so a failing destination soon has a
//! single batch in flight, being retried, while the rest waits on disk.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use petrel_core::DeliveryMetrics;
use tokio::sync::Notify;

/// A shared AIMD window.
pub struct Window {
    state: Mutex<State>,
    changed: Notify,
    metrics: DeliveryMetrics,
}

struct State {
    window: usize,
    threshold: usize,
    max: usize,
    in_flight: usize,
}

impl Window {
    /// A window starting at `initial` batches, never above `max`.
    pub fn new(initial: usize, max: usize, metrics: DeliveryMetrics) -> Arc<Self> {
        let w = initial.clamp(1, max.max(1));
        metrics.window.set(w as i64);
        Arc::new(Self {
            state: Mutex::new(State {
                window: w,
                threshold: max.max(1),
                max: max.max(1),
                in_flight: 0,
            }),
            changed: Notify::new(),
            metrics,
        })
    }

    /// Waits for room in the window and takes one slot.
    pub async fn acquire(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let mut s = self.state.lock();
                if s.in_flight < s.window {
                    s.in_flight += 1;
                    self.metrics.in_flight.set(s.in_flight as i64);
                    return;
                }
            }
            notified.await;
        }
    }

    /// Gives a slot back.
    pub fn release(&self) {
        let mut s = self.state.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        self.metrics.in_flight.set(s.in_flight as i64);
        drop(s);
        self.changed.notify_waiters();
    }

    /// A batch was delivered: grow.
    pub fn on_success(&self) {
        let mut s = self.state.lock();
        s.window = if s.window < s.threshold {
            (s.window * 2).min(s.max)
        } else {
            (s.window + 1).min(s.max)
        };
        self.metrics.window.set(s.window as i64);
        drop(s);
        self.changed.notify_waiters();
    }

    /// A delivery attempt failed: shrink.
    pub fn on_failure(&self) {
        let mut s = self.state.lock();
        s.threshold = (s.window / 2).max(1);
        s.window = (s.window / 2).max(1);
        self.metrics.window.set(s.window as i64);
    }

    /// Current window size.
    pub fn size(&self) -> usize {
        self.state.lock().window
    }
}

/// Exponential backoff between retries: 100 ms doubling up to 30 s.
#[derive(Debug, Clone, Copy)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(100))
    }
}

impl Backoff {
    /// The next delay; doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(30));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinks_fast_grows_back() {
        let m = petrel_core::Metrics::new()
            .component("p", "sink", "k", "kafka")
            .delivery();
        let w = Window::new(16, 64, m);
        w.on_failure();
        assert_eq!(w.size(), 8);
        w.on_failure();
        w.on_failure();
        w.on_failure();
        w.on_failure();
        assert_eq!(w.size(), 1);
        w.on_success();
        assert_eq!(w.size(), 2, "past the threshold growth is additive");
        w.on_success();
        assert_eq!(w.size(), 3);
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        assert_eq!(b.next_delay(), Duration::from_millis(200));
        for _ in 0..20 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::from_secs(30));
    }
}
