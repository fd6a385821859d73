//! What `/health` reports: problems raised by components and threads.
//!
//! A problem is either *fatal* (a dead thread, checkpoints that cannot be
//! written: unhealthy at once) or *failing* (a sink whose deliveries fail:
//! unhealthy only once it has been failing for longer than
//! `unhealthy_after`, so that one timeout does not page anybody). Each is
//! keyed by who raised it and cleared by the same key when it recovers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One open problem.
#[derive(Debug, Clone)]
struct Problem {
    reason: String,
    since: Instant,
    fatal: bool,
    /// Clears itself then (a problem seen once, such as a panic that was
    /// isolated, is reported for a while and then forgotten).
    expires: Option<Instant>,
}

/// The agent's open problems.
#[derive(Debug)]
pub struct Health {
    problems: Mutex<BTreeMap<String, Problem>>,
    unhealthy_after: Mutex<Duration>,
}

/// One unhealthy entry as reported by [`Health::report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    /// Who raised it, e.g. `pipeline/sink/out` or `thread/petrel-input`.
    pub component: String,
    /// What is wrong, in words an operator can act on.
    pub reason: String,
    /// How long it has been wrong.
    pub for_secs: u64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            problems: Mutex::new(BTreeMap::new()),
            unhealthy_after: Mutex::new(Duration::from_secs(30)),
        }
    }
}

impl Health {
    /// Sets how long a `failing` problem may last before it counts.
    pub fn set_unhealthy_after(&self, d: Duration) {
        *self.unhealthy_after.lock() = d;
    }

    /// Records that `component` is failing now (a delivery error). The
    /// start of the failure is kept across repeated calls; the reason is
    /// updated.
    pub fn failing(&self, component: &str, reason: impl Into<String>) {
        self.raise(component, reason.into(), false);
    }

    /// Records a problem that makes the agent unhealthy at once.
    pub fn fatal(&self, component: &str, reason: impl Into<String>) {
        self.raise(component, reason.into(), true);
    }

    /// Records a problem that makes the agent unhealthy at once and clears
    /// itself after `d` unless raised again.
    pub fn unhealthy_for(&self, component: &str, reason: impl Into<String>, d: Duration) {
        self.raise_until(
            component,
            reason.into(),
            true,
            Instant::now().checked_add(d),
        );
    }

    fn raise(&self, component: &str, reason: String, fatal: bool) {
        self.raise_until(component, reason, fatal, None);
    }

    fn raise_until(&self, component: &str, reason: String, fatal: bool, expires: Option<Instant>) {
        let mut p = self.problems.lock();
        match p.get_mut(component) {
            Some(e) if e.expires.is_none_or(|t| t > Instant::now()) => {
                e.reason = reason;
                e.fatal |= fatal;
                e.expires = expires;
            }
            _ => {
                p.insert(
                    component.to_string(),
                    Problem {
                        reason,
                        since: Instant::now(),
                        fatal,
                        expires,
                    },
                );
            }
        }
    }

    /// Clears the problem of `component`, if any.
    pub fn recovered(&self, component: &str) {
        let mut p = self.problems.lock();
        if !p.is_empty() {
            p.remove(component);
        }
    }

    /// Clears every problem whose key starts with `prefix` (a pipeline
    /// that was removed).
    pub fn forget_prefix(&self, prefix: &str) {
        self.problems.lock().retain(|k, _| !k.starts_with(prefix));
    }

    /// The problems that make the agent unhealthy now; empty when healthy.
    pub fn report(&self) -> Vec<Unhealthy> {
        let after = *self.unhealthy_after.lock();
        let now = Instant::now();
        let mut problems = self.problems.lock();
        problems.retain(|_, p| p.expires.is_none_or(|t| t > now));
        problems
            .iter()
            .filter(|(_, p)| p.fatal || p.since.elapsed() >= after)
            .map(|(k, p)| Unhealthy {
                component: k.clone(),
                reason: p.reason.clone(),
                for_secs: p.since.elapsed().as_secs(),
            })
            .collect()
    }

    /// True when a problem that is unhealthy at once is open.
    pub fn has_fatal(&self) -> bool {
        let now = Instant::now();
        self.problems
            .lock()
            .values()
            .any(|p| p.fatal && p.expires.is_none_or(|t| t > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_counts_only_after_the_grace_period() {
        let h = Health::default();
        h.set_unhealthy_after(Duration::from_millis(30));
        h.failing("p/sink/out", "HTTP 503");
        assert!(h.report().is_empty());
        std::thread::sleep(Duration::from_millis(40));
        h.failing("p/sink/out", "HTTP 502");
        let r = h.report();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].reason, "HTTP 502");
        h.recovered("p/sink/out");
        assert!(h.report().is_empty());
    }

    #[test]
    fn fatal_counts_at_once() {
        let h = Health::default();
        h.fatal("thread/petrel-input", "panicked");
        assert_eq!(h.report().len(), 1);
        assert!(h.has_fatal());
        h.forget_prefix("thread/");
        assert!(!h.has_fatal());
        h.unhealthy_for("p/processor/x", "panicked", Duration::from_millis(20));
        assert_eq!(h.report().len(), 1);
        std::thread::sleep(Duration::from_millis(30));
        assert!(h.report().is_empty());
    }
}
