//! Which records of each assigned partition were delivered, as a commit
//! watermark: the offset before which every record emitted was
//! acknowledged by every sink it was routed to. Acknowledgements arrive
//! in any order (sinks and workers run in parallel); one that arrives
//! before its predecessors is held until the gap closes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use petrel_core::ack::AckReceiver;

/// A topic and partition.
pub type Tp = (Arc<str>, i32);

/// One emitted batch of a partition: its records' offsets `start..end`.
#[derive(Debug)]
struct Pending {
    seq: u64,
    start: i64,
    end: i64,
    done: bool,
}

#[derive(Debug, Default)]
struct Part {
    /// Bumped when the partition is (re)assigned or rewound, so that
    /// answers for batches of an earlier life are ignored.
    generation: u64,
    pending: VecDeque<Pending>,
    /// Every record before it was delivered; `None` until the first
    /// batch of this assignment was delivered.
    watermark: Option<i64>,
}

#[derive(Default)]
struct Inner {
    parts: HashMap<Tp, Part>,
    /// Batch sequence number → its partition and that partition's
    /// generation when it was emitted.
    seqs: HashMap<u64, (Tp, u64)>,
    next_seq: u64,
    next_generation: u64,
    /// Partitions whose batch failed: read again from here.
    rewinds: Vec<(Tp, i64)>,
}

/// The delivery state of every assigned partition, shared by the
/// consumer thread and the threads that acknowledge.
#[derive(Default)]
pub struct Tracker {
    inner: Mutex<Inner>,
    changed: Condvar,
    /// Changes with every assignment and revocation, so the consumer
    /// thread can keep its last partition's check without the lock.
    assignments: AtomicU64,
}

impl Tracker {
    /// Starts tracking `tp` (newly assigned): nothing in flight, no
    /// watermark.
    pub fn assign(&self, tp: Tp) {
        let mut g = self.inner.lock();
        self.assignments.fetch_add(1, Ordering::AcqRel);
        g.next_generation += 1;
        let generation = g.next_generation;
        g.parts.insert(
            tp,
            Part {
                generation,
                ..Part::default()
            },
        );
    }

    /// Stops tracking `tp`; late answers for it are ignored.
    pub fn revoke(&self, tp: &Tp) {
        let mut g = self.inner.lock();
        self.assignments.fetch_add(1, Ordering::AcqRel);
        g.parts.remove(tp);
        g.rewinds.retain(|(t, _)| t != tp);
    }

    /// A number that changes whenever a partition is assigned or revoked.
    pub fn assignment_epoch(&self) -> u64 {
        self.assignments.load(Ordering::Acquire)
    }

    /// True while `tp` is assigned.
    pub fn is_assigned(&self, tp: &Tp) -> bool {
        self.inner.lock().parts.contains_key(tp)
    }

    /// Registers a batch of `tp`'s records `start..end` about to be
    /// emitted; returns its sequence number, or `None` when `tp` is not
    /// assigned (the records are then not emitted).
    pub fn emitted(&self, tp: &Tp, start: i64, end: i64) -> Option<u64> {
        let mut g = self.inner.lock();
        let seq = g.next_seq;
        let part = g.parts.get_mut(tp)?;
        part.pending.push_back(Pending {
            seq,
            start,
            end,
            done: false,
        });
        let generation = part.generation;
        g.next_seq += 1;
        g.seqs.insert(seq, (tp.clone(), generation));
        Some(seq)
    }

    /// Batches of `tp` emitted and not yet answered.
    pub fn in_flight(&self, tp: &Tp) -> usize {
        self.inner
            .lock()
            .parts
            .get(tp)
            .map_or(0, |p| p.pending.len())
    }

    /// Waits until none of `tps` has a batch in flight or `deadline`
    /// passes; true when all were answered.
    pub fn wait_drained(&self, tps: &[Tp], deadline: Instant) -> bool {
        let mut g = self.inner.lock();
        loop {
            let busy = tps
                .iter()
                .any(|tp| g.parts.get(tp).is_some_and(|p| !p.pending.is_empty()));
            if !busy {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            self.changed.wait_for(&mut g, wait);
        }
    }

    /// Waits until nothing at all is in flight or `deadline` passes.
    pub fn wait_all_drained(&self, deadline: Instant) -> bool {
        let tps: Vec<Tp> = self.inner.lock().parts.keys().cloned().collect();
        self.wait_drained(&tps, deadline)
    }

    /// The watermark of every assigned partition that has one.
    pub fn watermarks(&self) -> Vec<(Tp, i64)> {
        let g = self.inner.lock();
        g.parts
            .iter()
            .filter_map(|(tp, p)| p.watermark.map(|w| (tp.clone(), w)))
            .collect()
    }

    /// The watermark of `tp`.
    pub fn watermark(&self, tp: &Tp) -> Option<i64> {
        self.inner.lock().parts.get(tp).and_then(|p| p.watermark)
    }

    /// Partitions to read again from an offset (a batch failed), taken.
    pub fn take_rewinds(&self) -> Vec<(Tp, i64)> {
        std::mem::take(&mut self.inner.lock().rewinds)
    }

    fn answer(&self, seq: u64, delivered: bool) {
        let mut g = self.inner.lock();
        let Some((tp, generation)) = g.seqs.remove(&seq) else {
            return;
        };
        let inner = &mut *g;
        let Some(part) = inner.parts.get_mut(&tp) else {
            return;
        };
        if part.generation != generation {
            return;
        }
        if delivered {
            if let Some(p) = part.pending.iter_mut().find(|p| p.seq == seq) {
                p.done = true;
            }
            while part.pending.front().is_some_and(|p| p.done) {
                if let Some(p) = part.pending.pop_front() {
                    part.watermark = Some(p.end);
                }
            }
        } else {
            // Everything not yet delivered is read again, from the first
            // record the watermark does not cover; later batches in
            // flight become duplicates at worst (their answers are
            // ignored from now on).
            let from = part
                .watermark
                .or_else(|| part.pending.front().map(|p| p.start));
            for p in part.pending.drain(..) {
                inner.seqs.remove(&p.seq);
            }
            inner.next_generation += 1;
            part.generation = inner.next_generation;
            if let Some(from) = from {
                inner.rewinds.push((tp, from));
            }
        }
        drop(g);
        self.changed.notify_all();
    }
}

/// Receives the outcome of the batches a [`Tracker`] numbered.
pub struct TrackerAcks(pub Arc<Tracker>);

impl AckReceiver for TrackerAcks {
    fn complete(&self, seq: u64, delivered: bool) {
        self.0.answer(seq, delivered);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        ("t".into(), p)
    }

    #[test]
    fn out_of_order_answers_wait_for_the_gap() {
        let t = Tracker::default();
        t.assign(tp(0));
        let a = t.emitted(&tp(0), 10, 20).unwrap();
        let b = t.emitted(&tp(0), 20, 25).unwrap();
        let c = t.emitted(&tp(0), 30, 31).unwrap();
        t.answer(c, true);
        t.answer(b, true);
        assert_eq!(t.watermark(&tp(0)), None, "10..20 not yet delivered");
        assert_eq!(t.in_flight(&tp(0)), 3);
        t.answer(a, true);
        assert_eq!(t.watermark(&tp(0)), Some(31));
        assert_eq!(t.in_flight(&tp(0)), 0);
    }

    #[test]
    fn a_failure_rewinds_to_the_watermark_and_ignores_later_answers() {
        let t = Tracker::default();
        t.assign(tp(1));
        let a = t.emitted(&tp(1), 0, 5).unwrap();
        let b = t.emitted(&tp(1), 5, 9).unwrap();
        let c = t.emitted(&tp(1), 9, 12).unwrap();
        t.answer(a, true);
        t.answer(b, false);
        assert_eq!(t.take_rewinds(), vec![(tp(1), 5)]);
        t.answer(c, true);
        assert_eq!(t.watermark(&tp(1)), Some(5), "c belongs to the old life");
        assert_eq!(t.in_flight(&tp(1)), 0);
        // A failure before anything was delivered rewinds to the start.
        t.assign(tp(2));
        let d = t.emitted(&tp(2), 40, 50).unwrap();
        t.answer(d, false);
        assert_eq!(t.take_rewinds(), vec![(tp(2), 40)]);
    }

    #[test]
    fn revoked_partitions_take_nothing_and_drain_waits() {
        let t = Arc::new(Tracker::default());
        t.assign(tp(0));
        let a = t.emitted(&tp(0), 0, 1).unwrap();
        assert!(!t.wait_drained(&[tp(0)], Instant::now() + Duration::from_millis(50)));
        let t2 = t.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            TrackerAcks(t2).complete(a, true);
        });
        assert!(t.wait_drained(&[tp(0)], Instant::now() + Duration::from_secs(5)));
        h.join().unwrap();
        t.revoke(&tp(0));
        assert!(!t.is_assigned(&tp(0)));
        assert_eq!(t.emitted(&tp(0), 1, 2), None);
        assert!(t.watermarks().is_empty());
    }
}
