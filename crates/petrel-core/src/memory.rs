//! Byte budgets that bound the memory held by in-flight data.
//!
//! Sources must obtain a [`MemoryCharge`] before reading; when the global or
//! their pipeline's budget is exhausted they pause and the data waits on
//! disk. Charges are released when the data they cover is dropped, which
//! happens once every sink acknowledged it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The process-wide budget set by `--memory-limit`.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    /// Threads waiting for memory to be released; releases notify only
    /// when there are any, so the common path stays two atomics.
    waiters: AtomicUsize,
    /// Counts releases, so a waiter can tell whether one happened since
    /// it last looked (no lost wake-ups).
    epoch: std::sync::atomic::AtomicU64,
    lock: Mutex<()>,
    released: Condvar,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            epoch: std::sync::atomic::AtomicU64::new(0),
            lock: Mutex::new(()),
            released: Condvar::new(),
        })
    }

    /// A number that changes whenever a charge is released.
    pub fn release_epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Waits until a charge is released after [`MemoryBudget::release_epoch`]
    /// returned `since` (at once if one was), or `timeout` passed. Sources
    /// paused on a full budget use it instead of polling.
    pub fn wait_for_release(&self, since: u64, timeout: Duration) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock();
        if self.epoch.load(Ordering::SeqCst) == since {
            self.released.wait_for(&mut g, timeout);
        }
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    fn notify_release(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.released.notify_all();
        }
    }

    /// Total limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One pipeline's share of the global budget, so that a stalled pipeline
/// cannot take all memory from the healthy ones.
#[derive(Debug)]
pub struct PipelineBudget {
    global: Arc<MemoryBudget>,
    limit: usize,
    used: AtomicUsize,
    /// Memory a batch needs at its peak per byte read, in thousandths:
    /// the read buffer, event descriptors and one encoded copy per sink.
    /// Learned from the batches processed, so that a source reserves
    /// everything a batch will need before reading it.
    amplification: AtomicUsize,
    /// The ratio the last batch showed, in thousandths: the estimate only
    /// rises to what two batches in a row show (see [`Self::learn`]).
    last_ratio: AtomicUsize,
}

/// A batch read from at least this many bytes (or from the largest read
/// the budget allowed, when that is smaller) counts as a full read in
/// [`PipelineBudget::learn`]; a smaller one moves the ratio in proportion.
pub const LEARN_WEIGHT_BYTES: usize = 64 << 10;

/// Until a batch was measured: the data, its event descriptors, and two
/// encoded copies.
const INITIAL_AMPLIFICATION: usize = 3000;

impl PipelineBudget {
    /// A pipeline budget of at most `limit` bytes drawn from `global`.
    pub fn new(global: Arc<MemoryBudget>, limit: usize) -> Arc<Self> {
        Arc::new(Self {
            global,
            limit,
            used: AtomicUsize::new(0),
            amplification: AtomicUsize::new(INITIAL_AMPLIFICATION),
            last_ratio: AtomicUsize::new(INITIAL_AMPLIFICATION),
        })
    }

    /// Sets the first estimate of [`PipelineBudget::reservation`]'s ratio
    /// before any batch was measured: the data and its event descriptors,
    /// plus each sink's encoded copy (`sink_hints`, in thousandths per
    /// byte read, see `Sink::expansion_hint`), so that the first reads do
    /// not overshoot the limit many times over.
    pub fn expect_sinks(&self, sink_hints: impl IntoIterator<Item = usize>) {
        let sinks: usize = sink_hints.into_iter().sum();
        self.amplification.store(1500 + sinks, Ordering::Relaxed);
        self.last_ratio.store(1500 + sinks, Ordering::Relaxed);
    }

    /// The largest read whose reservation fits in half this pipeline's
    /// limit (at least 16 KiB). An empty budget accepts any single charge
    /// (see [`Self::try_charge`]), so without this bound one read of small
    /// lines for a verbose sink encoding (a reservation many times the
    /// read) could alone exceed the limit; half leaves room for the next
    /// read while one is delivered.
    pub fn largest_read(&self) -> usize {
        let amp = self.amplification.load(Ordering::Relaxed).max(1000) as u128;
        ((self.limit as u128 / 2 * 1000 / amp).min(usize::MAX as u128) as usize).max(16 << 10)
    }

    /// Bytes to reserve before reading `input` bytes: enough for the whole
    /// life of the batch (processing and every sink's encoded copy).
    pub fn reservation(&self, input: usize) -> usize {
        let amp = self.amplification.load(Ordering::Relaxed);
        (input as u128 * amp as u128 / 1000).min(usize::MAX as u128) as usize
    }

    /// Records that a batch read from `input` bytes needed `needed` bytes
    /// at its peak.
    ///
    /// One odd batch must not set the estimate: a source that presizes its
    /// event vectors makes a batch cut short (a linger flush) look many
    /// times more expensive per byte than it is, and an estimate of 100x
    /// cuts every later read to the minimum, where each small batch then
    /// barely moved the estimate back (the kafka source crawled at one
    /// 16 KiB batch at a time after a stall). So:
    /// - the estimate rises only to the smaller of this batch's ratio and
    ///   the previous batch's: a real change in cost shows on every batch
    ///   and is taken from the second one, a single odd batch is ignored
    ///   (its shortfall is charged when it is encoded, so a late rise
    ///   costs a late reservation, never the accounting);
    /// - a batch's weight is its share of a full read, squared, where a
    ///   full read is [`LEARN_WEIGHT_BYTES`] or the largest read the
    ///   budget allows now if that is smaller: a full batch takes the rise
    ///   at once and a quarter of a fall, a small flush hardly moves
    ///   either, and reads held small by a high estimate still count as
    ///   full reads, so the estimate comes down within a few batches.
    pub fn learn(&self, input: usize, needed: usize) {
        if input == 0 {
            return;
        }
        let ratio = (needed as u128 * 1000 / input as u128).clamp(1000, 1_000_000) as usize;
        let previous = self.last_ratio.swap(ratio, Ordering::Relaxed);
        let old = self.amplification.load(Ordering::Relaxed) as i128;
        let full = LEARN_WEIGHT_BYTES.min(self.largest_read()).max(1);
        // Weight in thousandths: a batch of 1/32 of a full read (a 2 KiB
        // linger flush) moves the estimate by 0.1 % of the difference.
        let f = (input.min(full) as u128 * 1000 / full as u128) as i128;
        let w = f * f / 1000;
        let seen = ratio.min(previous) as i128;
        let new = if seen > old {
            old + (seen - old) * w / 1000
        } else if (ratio as i128) < old {
            old + (ratio as i128 - old) * (w / 4) / 1000
        } else {
            old
        };
        self.amplification
            .store(new.clamp(1000, 1_000_000) as usize, Ordering::Relaxed);
    }

    /// The process-wide budget this one draws from.
    pub fn global(&self) -> &Arc<MemoryBudget> {
        &self.global
    }

    /// Charges `bytes`, waiting for room until `deadline`; `None` when
    /// there was none by then. For sources that may block their own
    /// thread (a socket reader) rather than pause and come back.
    pub fn charge_blocking(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Instant,
    ) -> Option<MemoryCharge> {
        loop {
            if let Some(c) = self.try_charge(bytes) {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // Re-checked under the lock releases notify under, so a
            // release between the check and the wait is not missed.
            let g = &self.global;
            g.waiters.fetch_add(1, Ordering::SeqCst);
            let mut lock = g.lock.lock();
            let room = self.try_charge(bytes);
            if room.is_none() {
                g.released.wait_for(&mut lock, deadline - now);
            }
            drop(lock);
            g.waiters.fetch_sub(1, Ordering::SeqCst);
            if room.is_some() {
                return room;
            }
        }
    }

    /// This pipeline's limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes this pipeline holds now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that could be charged right now without exceeding either limit.
    pub fn available(&self) -> usize {
        let mine = self.limit.saturating_sub(self.used());
        let global = self.global.limit.saturating_sub(self.global.used());
        mine.min(global)
    }

    /// Charges `bytes` if both this pipeline and the process have room.
    ///
    /// A budget holding nothing accepts any single charge, so that one item
    /// larger than the limit (a long line) still makes progress instead of
    /// waiting forever; memory then stays bounded by one such item.
    pub fn try_charge(self: &Arc<Self>, bytes: usize) -> Option<MemoryCharge> {
        let used = self.used();
        let gused = self.global.used();
        let fits = used == 0 || used + bytes <= self.limit;
        let gfits = gused == 0 || gused + bytes <= self.global.limit;
        if !(fits && gfits) {
            return None;
        }
        Some(self.charge_held(bytes))
    }

    /// Charges `bytes` without checking the limits. Only for memory that
    /// is already held (a partial line the reader carried), or for the
    /// part of a batch its reservation fell short of (then
    /// [`PipelineBudget::learn`] makes the next reservations cover it):
    /// the excess is bounded by one batch per worker.
    pub fn charge_held(self: &Arc<Self>, bytes: usize) -> MemoryCharge {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.global.used.fetch_add(bytes, Ordering::Relaxed);
        MemoryCharge {
            budget: Some(self.clone()),
            bytes,
        }
    }
}

/// Bytes held against a [`PipelineBudget`]; released on drop.
#[derive(Debug, Default)]
pub struct MemoryCharge {
    budget: Option<Arc<PipelineBudget>>,
    bytes: usize,
}

impl MemoryCharge {
    /// A charge against nothing (tests, synthetic data).
    pub fn none() -> Self {
        Self::default()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limit of the pipeline budget this charge is against (`None`
    /// for a charge against nothing): what a processor sizes its own
    /// limits from.
    pub fn budget_limit(&self) -> Option<usize> {
        self.budget.as_ref().map(|b| b.limit())
    }

    /// Adds `other`'s bytes to this charge (both must come from the same
    /// budget, or `self` must be empty).
    pub fn merge(&mut self, mut other: MemoryCharge) {
        if self.budget.is_none() {
            std::mem::swap(self, &mut other);
            return;
        }
        self.bytes += other.bytes;
        other.bytes = 0;
    }

    /// Takes up to `bytes` of this charge into a separate charge (the
    /// share of a reservation that an encoded copy uses).
    pub fn split(&mut self, bytes: usize) -> MemoryCharge {
        let take = bytes.min(self.bytes);
        self.bytes -= take;
        MemoryCharge {
            budget: self.budget.clone(),
            bytes: take,
        }
    }

    /// A further charge of `bytes` against the same budget, if both its
    /// limits have room (see [`PipelineBudget::try_charge`]); nothing is
    /// charged, and `Some` returned, when this charge is against no
    /// budget.
    pub fn try_more(&self, bytes: usize) -> Option<MemoryCharge> {
        match &self.budget {
            Some(b) if bytes > 0 => b.try_charge(bytes),
            _ => Some(MemoryCharge::none()),
        }
    }

    /// A further charge of `bytes` against the same budget, taken without
    /// checking the limits: for memory about to be held whatever the
    /// budget says (the only copy that lets data move on), whose excess
    /// the caller bounds.
    pub fn more(&self, bytes: usize) -> MemoryCharge {
        match &self.budget {
            Some(b) if bytes > 0 => b.charge_held(bytes),
            _ => MemoryCharge::none(),
        }
    }

    /// Gives back all but `keep` bytes early (e.g. a read buffer that turned
    /// out shorter than reserved).
    pub fn shrink_to(&mut self, keep: usize) {
        if let Some(b) = &self.budget {
            if keep < self.bytes {
                let give = self.bytes - keep;
                b.used.fetch_sub(give, Ordering::Relaxed);
                b.global.used.fetch_sub(give, Ordering::Relaxed);
                self.bytes = keep;
                b.global.notify_release();
            }
        }
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_respect_both_limits() {
        let g = MemoryBudget::new(100);
        let a = PipelineBudget::new(g.clone(), 60);
        let b = PipelineBudget::new(g.clone(), 60);
        let c1 = a.try_charge(60).expect("fits");
        assert!(a.try_charge(1).is_none(), "pipeline limit");
        let c2 = b.try_charge(40).expect("fits global");
        assert!(b.try_charge(1).is_none(), "global limit");
        drop(c1);
        assert_eq!(g.used(), 40);
        let mut c3 = b.try_charge(20).expect("room again");
        c3.shrink_to(5);
        assert_eq!(b.used(), 45);
        drop((c2, c3));
        assert_eq!(g.used(), 0);
        let big = a
            .try_charge(1000)
            .expect("an empty budget takes one oversized item");
        assert!(a.try_charge(1).is_none());
        drop(big);
    }

    #[test]
    fn reads_are_sized_so_their_reservation_fits_the_limit() {
        let g = MemoryBudget::new(64 << 20);
        let p = PipelineBudget::new(g, 4 << 20);
        assert!(p.reservation(p.largest_read()) <= p.limit() / 2);
        // Small lines into a verbose encoding: 16 bytes held per byte read
        // (a rise is taken when two batches in a row show it).
        for _ in 0..2 {
            p.learn(64 << 10, 16 << 16);
        }
        assert_eq!(p.largest_read(), 128 << 10);
        assert!(p.reservation(p.largest_read()) <= p.limit() / 2);
        for _ in 0..2 {
            p.learn(64 << 10, 1000 << 16);
        }
        assert_eq!(p.largest_read(), 16 << 10, "never below one small read");
    }

    /// The aggregator's throttling: a small batch flushed by the linger,
    /// whose event vector was presized, looks 100x as expensive per byte.
    /// Taken at once, that cut every later read to 16 KiB; now it barely
    /// moves the estimate, while full batches still set it.
    #[test]
    fn one_odd_small_batch_does_not_throttle_the_reads() {
        let g = MemoryBudget::new(64 << 20);
        let p = PipelineBudget::new(g, 16 << 20);
        for _ in 0..30 {
            p.learn(1 << 20, 2 << 20);
        }
        let steady = p.largest_read();
        assert!(
            (4000 << 10..=4300 << 10).contains(&steady),
            "about 8 MiB / 2x: {steady}"
        );
        p.learn(2 << 10, 200 << 10);
        assert!(
            p.largest_read() >= steady * 3 / 4,
            "{} after one odd batch (was {steady})",
            p.largest_read()
        );
        // A real change in cost, seen on full batches, is taken from the
        // second such batch when it grows, and within a few batches when
        // it shrinks.
        p.learn(1 << 20, 8 << 20);
        p.learn(1 << 20, 8 << 20);
        assert_eq!(p.largest_read(), 1 << 20);
        for _ in 0..12 {
            p.learn(1 << 20, 2 << 20);
        }
        assert!(p.largest_read() >= 3 << 20, "{}", p.largest_read());
    }

    /// What the aggregator saw at a small limit: one linger flush of a
    /// full 64 KiB whose presized event vector held 100x its bytes set the
    /// estimate to 100x, reads were cut to 20 KiB, and each of those small
    /// batches (weighed against 64 KiB) moved the estimate back by 2.5 %
    /// of the way: eight batches later the reads were 26 KiB, against
    /// 1 MiB before the odd batch.
    #[test]
    fn one_odd_full_batch_does_not_throttle_the_reads() {
        let g = MemoryBudget::new(64 << 20);
        let p = PipelineBudget::new(g, 4 << 20);
        for _ in 0..30 {
            p.learn(1 << 20, 2 << 20);
        }
        let steady = p.largest_read();
        assert!(
            (1000 << 10..=1 << 20).contains(&steady),
            "about 2 MiB / 2x: {steady}"
        );
        p.learn(64 << 10, 100 * (64 << 10));
        // The source reads what the budget allows, at the usual cost.
        for _ in 0..8 {
            let read = p.largest_read();
            p.learn(read, 2 * read);
        }
        assert!(
            p.largest_read() >= steady / 2,
            "reads of {} after one odd batch (was {steady})",
            p.largest_read()
        );
    }

    /// An estimate that was high for real (a burst of verbose events) comes
    /// down within a few batches once the cost falls, although the reads
    /// it allows are far below 64 KiB.
    #[test]
    fn reads_held_small_by_a_high_estimate_still_bring_it_down() {
        let g = MemoryBudget::new(64 << 20);
        let p = PipelineBudget::new(g, 4 << 20);
        for _ in 0..4 {
            p.learn(1 << 20, 100 << 20);
        }
        assert_eq!(p.largest_read(), 20971, "2 MiB / 100x");
        // Weighed against 64 KiB, eight such batches left the reads at
        // 26 KiB; as full reads, they bring the estimate down to 12x.
        for _ in 0..8 {
            let read = p.largest_read();
            p.learn(read, 2 * read);
        }
        assert!(p.largest_read() >= 128 << 10, "{}", p.largest_read());
    }

    #[test]
    fn a_blocked_charge_proceeds_when_memory_is_released() {
        let g = MemoryBudget::new(100);
        let a = PipelineBudget::new(g.clone(), 100);
        let held = a.try_charge(100).expect("fits");
        let a2 = a.clone();
        let waiter = std::thread::spawn(move || {
            a2.charge_blocking(50, Instant::now() + Duration::from_secs(30))
                .map(|c| c.bytes())
        });
        // Give the waiter time to block (not needed for correctness).
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(waiter.join().unwrap(), Some(50));
        assert!(
            a.charge_blocking(200, Instant::now())
                .is_some_and(|c| c.bytes() == 200),
            "empty budget takes one big item"
        );
        let _h = a.try_charge(100).expect("fits");
        assert!(
            a.charge_blocking(1, Instant::now()).is_none(),
            "deadline passed"
        );
    }
}
