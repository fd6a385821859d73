//! What `/health`, `/health/live` and `/health/ready` report: problems
//! raised by components and threads.
//!
//! A problem is *stuck* (a thread that died or makes no progress: the
//! process itself is broken, unhealthy at once), *fatal* (checkpoints or a
//! spool that cannot be written, a panic being isolated: unhealthy at
//! once) or *failing* (a sink whose deliveries fail: unhealthy only once
//! it has been failing for longer than `unhealthy_after`, so that one
//! timeout does not page anybody). Each is keyed by who raised it and
//! cleared by the same key when it recovers.
//!
//! Liveness ([`Health::liveness`]) sees only stuck problems: it is what a
//! restart can fix. A full disk, a down collector or a poison event are
//! still there after a restart, and restarting would only lose what is
//! buffered in memory and re-read work; they fail readiness
//! ([`Health::readiness`], which also fails while the pipelines start or
//! drain) and the combined view ([`Health::report`]) instead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One open problem.
#[derive(Debug, Clone)]
struct Problem {
    reason: String,
    since: Instant,
    fatal: bool,
    /// A thread is dead or stuck: fails liveness too.
    stuck: bool,
    /// Clears itself then (a problem seen once, such as a panic that was
    /// isolated, is reported for a while and then forgotten).
    expires: Option<Instant>,
    /// Degraded only: the agent works with less (metadata missing), so
    /// it is reported but fails no check.
    degraded: bool,
}

/// Where the agent is in its life, for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The API answers but the pipelines are not started yet.
    Starting,
    /// The pipelines run.
    Running,
    /// Stopping: sources no longer read, in-flight data is drained.
    Stopping,
}

/// The agent's open problems.
#[derive(Debug)]
pub struct Health {
    problems: Mutex<BTreeMap<String, Problem>>,
    unhealthy_after: Mutex<Duration>,
    phase: Mutex<Phase>,
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

/// One open problem and its state, as reported by [`Health::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemState {
    /// Who raised it (`pipeline/sink/out`, `thread/petrel-input`).
    pub component: String,
    /// `stuck`, `unhealthy`, `failing` or `degraded`.
    pub state: &'static str,
    /// What is wrong.
    pub reason: String,
    /// How long it has been open.
    pub for_secs: u64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            problems: Mutex::new(BTreeMap::new()),
            unhealthy_after: Mutex::new(Duration::from_secs(30)),
            phase: Mutex::new(Phase::Starting),
        }
    }
}

impl Health {
    /// Sets how long a `failing` problem may last before it counts.
    pub fn set_unhealthy_after(&self, d: Duration) {
        *self.unhealthy_after.lock() = d;
    }

    /// Sets where the agent is in its life (see [`Health::readiness`]).
    pub fn set_phase(&self, phase: Phase) {
        *self.phase.lock() = phase;
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

    /// Records that `component` works in a degraded way (for example
    /// without the metadata of an unreachable service): `/health` lists it
    /// with the status `degraded` and still answers 200, since nothing is
    /// lost and a restart would not help. Cleared with
    /// [`Health::recovered`].
    pub fn degraded(&self, component: &str, reason: impl Into<String>) {
        let mut p = self.problems.lock();
        match p.get_mut(component) {
            Some(e) => e.reason = reason.into(),
            None => {
                p.insert(
                    component.to_string(),
                    Problem {
                        reason: reason.into(),
                        since: Instant::now(),
                        fatal: false,
                        stuck: false,
                        expires: None,
                        degraded: true,
                    },
                );
            }
        }
    }

    /// The degraded components (see [`Health::degraded`]): reported by
    /// `/health` beside a 200.
    pub fn degradations(&self) -> Vec<Unhealthy> {
        self.select(|p| p.degraded)
    }

    /// Records that a thread of the process (`thread/NAME`) died or makes
    /// no progress: the agent is not live, and so not healthy, at once.
    pub fn stuck(&self, component: &str, reason: impl Into<String>) {
        self.insert(component, reason.into(), true, true, None);
    }

    fn raise(&self, component: &str, reason: String, fatal: bool) {
        self.raise_until(component, reason, fatal, None);
    }

    fn raise_until(&self, component: &str, reason: String, fatal: bool, expires: Option<Instant>) {
        self.insert(component, reason, fatal, false, expires);
    }

    fn insert(
        &self,
        component: &str,
        reason: String,
        fatal: bool,
        stuck: bool,
        expires: Option<Instant>,
    ) {
        let mut p = self.problems.lock();
        match p.get_mut(component) {
            Some(e) if e.expires.is_none_or(|t| t > Instant::now()) => {
                e.reason = reason;
                e.fatal |= fatal;
                e.stuck |= stuck;
                e.expires = expires;
                e.degraded = false;
            }
            _ => {
                p.insert(
                    component.to_string(),
                    Problem {
                        reason,
                        since: Instant::now(),
                        fatal,
                        stuck,
                        expires,
                        degraded: false,
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
    /// The combined view of `/health`: every open problem that counts,
    /// whatever the phase.
    pub fn report(&self) -> Vec<Unhealthy> {
        let after = *self.unhealthy_after.lock();
        self.select(|p| !p.degraded && (p.fatal || p.since.elapsed() >= after))
    }

    /// The problems that make the process not live (`/health/live`): a
    /// dead or stuck thread. Sinks that cannot deliver, disks that cannot
    /// be written and panics being isolated are left out: a restart fixes
    /// none of them.
    pub fn liveness(&self) -> Vec<Unhealthy> {
        self.select(|p| p.stuck)
    }

    /// The problems that make the agent not ready (`/health/ready`): those
    /// of [`Health::report`], and an `agent` entry while the pipelines are
    /// starting or stopping.
    pub fn readiness(&self) -> Vec<Unhealthy> {
        let mut r = self.report();
        let reason = match *self.phase.lock() {
            Phase::Running => return r,
            Phase::Starting => "the pipelines are starting",
            Phase::Stopping => "stopping: sources no longer read, in-flight data is drained",
        };
        r.insert(
            0,
            Unhealthy {
                component: "agent".into(),
                reason: reason.into(),
                for_secs: 0,
            },
        );
        r
    }

    fn select(&self, counts: impl Fn(&Problem) -> bool) -> Vec<Unhealthy> {
        let now = Instant::now();
        let mut problems = self.problems.lock();
        problems.retain(|_, p| p.expires.is_none_or(|t| t > now));
        problems
            .iter()
            .filter(|(_, p)| counts(p))
            .map(|(k, p)| Unhealthy {
                component: k.clone(),
                reason: p.reason.clone(),
                for_secs: p.since.elapsed().as_secs(),
            })
            .collect()
    }

    /// Every open problem with its state, for the health tree a
    /// management server is sent (the same states `/health` reports):
    /// `stuck` (a dead or stuck thread), `unhealthy` (counts now: fatal,
    /// or failing for longer than the grace period), `failing` (within the
    /// grace period), `degraded`.
    pub fn snapshot(&self) -> Vec<ProblemState> {
        let after = *self.unhealthy_after.lock();
        let now = Instant::now();
        let mut problems = self.problems.lock();
        problems.retain(|_, p| p.expires.is_none_or(|t| t > now));
        problems
            .iter()
            .map(|(k, p)| ProblemState {
                component: k.clone(),
                state: if p.stuck {
                    "stuck"
                } else if p.degraded {
                    "degraded"
                } else if p.fatal || p.since.elapsed() >= after {
                    "unhealthy"
                } else {
                    "failing"
                },
                reason: p.reason.clone(),
                for_secs: p.since.elapsed().as_secs(),
            })
            .collect()
    }

    /// The phase (see [`Health::set_phase`]).
    pub fn phase(&self) -> Phase {
        *self.phase.lock()
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
    fn degraded_is_reported_apart_and_fails_no_check() {
        let h = Health::default();
        h.set_unhealthy_after(Duration::ZERO);
        h.set_phase(Phase::Running);
        h.degraded("kubernetes/api", "API server unreachable");
        assert!(h.report().is_empty());
        assert!(h.readiness().is_empty());
        assert!(h.liveness().is_empty());
        let d = h.degradations();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].component, "kubernetes/api");
        h.recovered("kubernetes/api");
        assert!(h.degradations().is_empty());
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

    #[test]
    fn only_stuck_threads_fail_liveness() {
        let h = Health::default();
        h.set_phase(Phase::Running);
        h.set_unhealthy_after(Duration::ZERO);
        h.failing("p/sink/out", "HTTP 503");
        h.fatal("checkpoint", "cannot write: No space left on device");
        h.unhealthy_for("p/processor/x", "panicked", Duration::from_secs(60));
        assert!(h.liveness().is_empty(), "{:?}", h.liveness());
        assert_eq!(h.readiness().len(), 3);
        assert_eq!(h.report().len(), 3);
        h.stuck("thread/petrel-worker-0", "busy with one batch for 40s");
        let live = h.liveness();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].component, "thread/petrel-worker-0");
        assert_eq!(h.readiness().len(), 4, "a stuck thread is not ready either");
        assert_eq!(h.report().len(), 4);
        assert!(h.has_fatal());
        h.recovered("thread/petrel-worker-0");
        assert!(h.liveness().is_empty());
    }

    #[test]
    fn a_stuck_thread_stays_stuck_when_raised_again_as_fatal() {
        let h = Health::default();
        h.stuck("thread/petrel-input", "thread died");
        h.fatal("thread/petrel-input", "thread died");
        assert_eq!(h.liveness().len(), 1);
    }

    #[test]
    fn snapshot_names_each_problem_state() {
        let h = Health::default();
        h.set_unhealthy_after(Duration::from_secs(60));
        h.failing("p/sink/a", "HTTP 503");
        h.fatal("p/sink/b", "disk full");
        h.degraded("p/reload", "refused");
        h.stuck("thread/w", "busy");
        let s: Vec<(String, &str)> = h
            .snapshot()
            .into_iter()
            .map(|p| (p.component, p.state))
            .collect();
        assert_eq!(
            s,
            vec![
                ("p/reload".to_string(), "degraded"),
                ("p/sink/a".to_string(), "failing"),
                ("p/sink/b".to_string(), "unhealthy"),
                ("thread/w".to_string(), "stuck"),
            ]
        );
    }

    #[test]
    fn readiness_follows_the_phase() {
        let h = Health::default();
        let r = h.readiness();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].component, "agent");
        assert!(r[0].reason.contains("starting"), "{r:?}");
        assert!(h.report().is_empty(), "/health is as before while starting");
        assert!(h.liveness().is_empty());
        h.set_phase(Phase::Running);
        assert!(h.readiness().is_empty());
        h.set_phase(Phase::Stopping);
        let r = h.readiness();
        assert_eq!(r.len(), 1);
        assert!(r[0].reason.contains("stopping"), "{r:?}");
        assert!(h.liveness().is_empty(), "draining is progress");
    }
}
