//! An application-side log producer for Petrel.
//!
//! [`Producer::send`] encodes a record as one ndjson line straight into the
//! batch of its stream (no other copy, no allocation in the common case).
//! A batch is sealed once it reaches `batch_size_threshold_in_bytes`,
//! `batch_count_threshold` records, or `linger_ms` of age; IO threads
//! compress sealed batches and POST them to Petrel's HTTP source, which
//! answers 2xx only once they are admitted. Failed requests are retried
//! with exponential backoff (honouring `Retry-After`).
//!
//! Delivery guarantee: at least once for every record `send` accepted,
//! as long as the process lives and the retry budget lasts (every record
//! ends up counted as `sent` or `failed`, and its callback says which);
//! with `spool_dir`, batches the agent cannot take go to a crash-safe disk
//! spool and survive a crash or restart of the application. A batch may
//! arrive twice when an answer was lost after the agent admitted it.
//!
//! ```no_run
//! use petrel_producer::{Config, Producer, Record};
//! let producer = Producer::new(Config::new("http://127.0.0.1:8088/ingest")).unwrap();
//! producer.send(&Record::new(&[("level", "info"), ("message", "hello")])).unwrap();
//! let report = producer.close(std::time::Duration::from_secs(10));
//! assert_eq!(report.undelivered_records, 0);
//! ```

#![deny(missing_docs)]

mod config;
mod encode;
mod http;
mod spool;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

pub use config::{Compression, Config};
pub use encode::Record;

/// What became of a record (reported to callbacks and futures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The agent admitted it (2xx), after this many attempts.
    Delivered {
        /// Requests made for its batch.
        attempts: u32,
    },
    /// It is durable in the producer's spool and will be sent from there
    /// (by this process or a later one with the same `spool_dir`).
    Spooled {
        /// Requests made for its batch before it was spooled.
        attempts: u32,
    },
    /// It was given up.
    Failed {
        /// Why (the last error or answer).
        reason: String,
        /// Requests made for its batch.
        attempts: u32,
    },
}

/// Why `send` did not take a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The memory cap (and the spool, if any) is full: `max_block_ms` is 0
    /// or passed. Counted in `rejected_full`.
    Full,
    /// The producer is closed.
    Closed,
    /// The record alone is larger than `total_size_in_bytes`.
    TooLarge,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full => "the producer's queue is full (total_size_in_bytes)",
            SendError::Closed => "the producer is closed",
            SendError::TooLarge => "the record is larger than total_size_in_bytes",
        })
    }
}

impl std::error::Error for SendError {}

/// Counters of a producer (records unless said otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Admitted by the agent (from memory or from the spool).
    pub sent: u64,
    /// Given up (retries exhausted, refused, or closed before delivery).
    pub failed: u64,
    /// Refused by `send` because the queue was full.
    pub rejected_full: u64,
    /// Requests retried (per batch attempt, not per record).
    pub retried: u64,
    /// Encoded bytes queued in memory (open and sealed batches).
    pub queued_bytes: u64,
    /// Written to the disk spool.
    pub spooled: u64,
    /// Sent from the disk spool (included in `sent`).
    pub sent_from_spool: u64,
}

/// What [`Producer::close`] could not deliver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Records queued at close that were not delivered (failed or given up
    /// when the timeout passed).
    pub undelivered_records: u64,
    /// Their encoded bytes.
    pub undelivered_bytes: u64,
    /// Records queued at close that went to the spool instead (not lost:
    /// a later producer with the same `spool_dir` sends them).
    pub spooled_records: u64,
}

type Callback = Box<dyn FnOnce(&Outcome) + Send>;

struct Batch {
    seq: u64,
    buf: Vec<u8>,
    count: u32,
    created: Instant,
    callbacks: Vec<Callback>,
}

enum Msg {
    Batch(Batch),
    Stop,
}

#[derive(Default)]
struct Acc {
    default: Option<Batch>,
    streams: HashMap<Box<str>, Batch>,
    next_seq: u64,
    closed: bool,
}

impl Acc {
    fn take_all(&mut self) -> Vec<Batch> {
        let mut v: Vec<Batch> = self.default.take().into_iter().collect();
        v.extend(self.streams.drain().map(|(_, b)| b));
        v
    }
}

#[derive(Default)]
struct Atomics {
    sent: AtomicU64,
    failed: AtomicU64,
    failed_bytes: AtomicU64,
    rejected_full: AtomicU64,
    retried: AtomicU64,
    queued_bytes: AtomicU64,
    spooled: AtomicU64,
    sent_from_spool: AtomicU64,
}

#[derive(Default)]
struct Stop {
    /// Give up retrying: close's timeout passed.
    abort: bool,
    /// Threads should exit.
    stop: bool,
}

pub(crate) struct Shared {
    cfg: Config,
    acc: Mutex<Acc>,
    /// Signalled (with `acc` locked) when queued bytes drop.
    room: Condvar,
    room_waiters: AtomicUsize,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    counters: Atomics,
    /// Sequence numbers of batches not yet delivered, failed or spooled.
    outstanding: Mutex<BTreeSet<u64>>,
    done: Condvar,
    stop: Mutex<Stop>,
    stop_cv: Condvar,
    spool: Option<spool::Spool>,
    endpoint: http::Endpoint,
    /// Until this instant (ms since `epoch`), batches go to the spool
    /// without trying the agent.
    down_until_ms: AtomicU64,
    epoch: Instant,
    closed: AtomicBool,
}

/// A producer: cheap `send`, background IO threads. Share it by reference
/// or `Arc` between threads.
pub struct Producer {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    report: Mutex<Option<CloseReport>>,
}

impl Producer {
    /// Starts the IO threads (and, with `spool_dir`, opens the spool and
    /// starts sending what an earlier process left there).
    pub fn new(cfg: Config) -> Result<Self, String> {
        let endpoint = http::Endpoint::parse(&cfg.endpoint)?;
        if cfg.io_thread_count == 0 {
            return Err("io_thread_count must be at least 1".into());
        }
        let spool = match &cfg.spool_dir {
            Some(dir) => Some(
                spool::Spool::open(dir, cfg.spool_max_bytes)
                    .map_err(|e| format!("cannot open spool_dir {}: {e}", dir.display()))?,
            ),
            None => None,
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            cfg,
            acc: Mutex::new(Acc::default()),
            room: Condvar::new(),
            room_waiters: AtomicUsize::new(0),
            tx,
            rx,
            counters: Atomics::default(),
            outstanding: Mutex::new(BTreeSet::new()),
            done: Condvar::new(),
            stop: Mutex::new(Stop::default()),
            stop_cv: Condvar::new(),
            spool,
            endpoint,
            down_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            closed: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| format!("cannot start a producer thread: {e}"))
        };
        for i in 0..shared.cfg.io_thread_count {
            let s = shared.clone();
            threads.push(spawn(
                format!("petrel-producer-io-{i}"),
                Box::new(move || s.io_loop()),
            )?);
        }
        let s = shared.clone();
        threads.push(spawn(
            "petrel-producer-linger".into(),
            Box::new(move || s.linger_loop()),
        )?);
        if shared.spool.is_some() {
            let s = shared.clone();
            threads.push(spawn(
                "petrel-producer-spool".into(),
                Box::new(move || spool::sender_loop(&s)),
            )?);
        }
        Ok(Self {
            shared,
            threads: Mutex::new(threads),
            report: Mutex::new(None),
        })
    }

    /// Queues `rec`. Waits at most `max_block_ms` for room when the memory
    /// cap is reached.
    pub fn send(&self, rec: &Record<'_>) -> Result<(), SendError> {
        self.shared.append(rec, None, true)
    }

    /// Like [`send`](Self::send) but never waits for room (nor moves
    /// batches to the spool to make some), and a refusal is not counted in
    /// `rejected_full`: for callers that try first and then `send` outside
    /// a lock of their own (the Python binding does, without the GIL).
    pub fn try_send(&self, rec: &Record<'_>) -> Result<(), SendError> {
        self.shared.append(rec, None, false)
    }

    /// [`try_send`](Self::try_send) with a callback (see
    /// [`send_with_callback`](Self::send_with_callback)); on refusal the
    /// callback is handed back.
    #[allow(clippy::type_complexity)]
    pub fn try_send_with_callback(
        &self,
        rec: &Record<'_>,
        cb: Box<dyn FnOnce(&Outcome) + Send>,
    ) -> Result<(), (SendError, Box<dyn FnOnce(&Outcome) + Send>)> {
        let mut slot = Some(cb);
        self.shared
            .append_slot(rec, &mut slot, false)
            .map_err(|e| (e, slot.take().unwrap_or_else(|| Box::new(|_| {}))))
    }

    /// Queues `rec`; `cb` is called once with its outcome (from an IO
    /// thread; keep it short). Not called when `send` refuses the record.
    pub fn send_with_callback(
        &self,
        rec: &Record<'_>,
        cb: impl FnOnce(&Outcome) + Send + 'static,
    ) -> Result<(), SendError> {
        self.shared.append(rec, Some(Box::new(cb)), true)
    }

    /// Queues `rec` and returns a future of its outcome (also usable
    /// without an executor: [`DeliveryFuture::wait`]).
    pub fn send_future(&self, rec: &Record<'_>) -> Result<DeliveryFuture, SendError> {
        let state = Arc::new(FutState::default());
        let s = state.clone();
        self.shared
            .append(rec, Some(Box::new(move |o| s.complete(o))), true)?;
        Ok(DeliveryFuture { state })
    }

    /// Sends every batch now and waits until each batch queued before the
    /// call is delivered, failed or spooled (durably), at most `timeout`.
    /// True when all were.
    pub fn flush(&self, timeout: Duration) -> bool {
        let target = self.shared.seal_all();
        self.shared.wait_done(target, Instant::now() + timeout)
    }

    /// Current counters.
    pub fn counters(&self) -> Counters {
        let c = &self.shared.counters;
        Counters {
            sent: c.sent.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            rejected_full: c.rejected_full.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            queued_bytes: c.queued_bytes.load(Ordering::Relaxed),
            spooled: c.spooled.load(Ordering::Relaxed),
            sent_from_spool: c.sent_from_spool.load(Ordering::Relaxed),
        }
    }

    /// Stops taking records, delivers what is queued within `timeout`
    /// (retrying as configured), then gives up the rest — to the spool
    /// when there is one — and says what was not delivered. A request
    /// in flight at the deadline is waited for (`request_timeout_ms`).
    /// Later calls return the first report.
    pub fn close(&self, timeout: Duration) -> CloseReport {
        let mut report = self.report.lock();
        if let Some(r) = *report {
            return r;
        }
        let s = &self.shared;
        let deadline = Instant::now() + timeout;
        let failed0 = s.counters.failed.load(Ordering::SeqCst);
        let failed_bytes0 = s.counters.failed_bytes.load(Ordering::SeqCst);
        let spooled0 = s.counters.spooled.load(Ordering::SeqCst);
        s.closed.store(true, Ordering::SeqCst);
        {
            let mut acc = s.acc.lock();
            acc.closed = true;
            s.room.notify_all();
        }
        let target = s.seal_all();
        if !s.wait_done(target, deadline) {
            s.stop.lock().abort = true;
            s.stop_cv.notify_all();
        }
        for _ in 0..s.cfg.io_thread_count {
            let _ = s.tx.send(Msg::Stop);
        }
        let mut threads = self.threads.lock();
        let (io, rest): (Vec<_>, Vec<_>) = threads
            .drain(..)
            .enumerate()
            .partition(|(i, _)| *i < s.cfg.io_thread_count);
        for (_, t) in io {
            let _ = t.join();
        }
        {
            let mut st = s.stop.lock();
            st.stop = true;
            st.abort = true;
        }
        s.stop_cv.notify_all();
        for (_, t) in rest {
            let _ = t.join();
        }
        if let Some(sp) = &s.spool {
            sp.close();
        }
        let r = CloseReport {
            undelivered_records: s.counters.failed.load(Ordering::SeqCst) - failed0,
            undelivered_bytes: s.counters.failed_bytes.load(Ordering::SeqCst) - failed_bytes0,
            spooled_records: s.counters.spooled.load(Ordering::SeqCst) - spooled0,
        };
        *report = Some(r);
        r
    }
}

impl Drop for Producer {
    /// Closes with a 5 s timeout when `close` was not called.
    fn drop(&mut self) {
        self.close(Duration::from_secs(5));
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn append(
        &self,
        rec: &Record<'_>,
        mut cb: Option<Callback>,
        block: bool,
    ) -> Result<(), SendError> {
        self.append_slot(rec, &mut cb, block)
    }

    /// Appends `rec` (taking `cb` only when it succeeds).
    fn append_slot(
        &self,
        rec: &Record<'_>,
        cb: &mut Option<Callback>,
        block: bool,
    ) -> Result<(), SendError> {
        let cap = self.cfg.total_size_in_bytes as u64;
        let mut deadline: Option<Instant> = None;
        let mut acc = self.acc.lock();
        loop {
            if acc.closed {
                return Err(SendError::Closed);
            }
            let b = self.batch_for(&mut acc, rec.stream);
            match self.try_append(b, rec, cap) {
                Ok(()) => {
                    if let Some(cb) = cb.take() {
                        b.callbacks.push(cb);
                    }
                    if self.is_full(b) {
                        let sealed = match rec.stream {
                            None => acc.default.take(),
                            Some(name) => acc.streams.remove(name),
                        };
                        drop(acc);
                        if let Some(b) = sealed {
                            self.dispatch(b);
                        }
                    }
                    return Ok(());
                }
                Err(len) => self.wait_room(&mut acc, len, &mut deadline, block)?,
            }
        }
    }

    /// The open batch of `stream`, created when missing.
    fn batch_for<'a>(&self, acc: &'a mut Acc, stream: Option<&str>) -> &'a mut Batch {
        let seq = acc.next_seq;
        let fresh = |acc_seq: &mut u64| {
            *acc_seq += 1;
            self.outstanding.lock().insert(seq);
            self.new_batch(seq)
        };
        match stream {
            None => {
                if acc.default.is_none() {
                    acc.default = Some(fresh(&mut acc.next_seq));
                }
                acc.default.get_or_insert_with(|| self.new_batch(seq))
            }
            Some(name) => {
                if !acc.streams.contains_key(name) {
                    let b = fresh(&mut acc.next_seq);
                    acc.streams.insert(name.into(), b);
                }
                acc.streams
                    .entry(name.into())
                    .or_insert_with(|| self.new_batch(seq))
            }
        }
    }

    fn new_batch(&self, seq: u64) -> Batch {
        Batch {
            seq,
            buf: Vec::with_capacity(self.cfg.batch_size_threshold_in_bytes.min(1 << 20) + 4096),
            count: 0,
            created: Instant::now(),
            callbacks: Vec::new(),
        }
    }

    fn is_full(&self, b: &Batch) -> bool {
        b.buf.len() >= self.cfg.batch_size_threshold_in_bytes
            || b.count as usize >= self.cfg.batch_count_threshold
    }

    /// Encodes `rec` into `b` if it fits under the cap; else the record's
    /// encoded length.
    fn try_append(&self, b: &mut Batch, rec: &Record<'_>, cap: u64) -> Result<(), u64> {
        let start = b.buf.len();
        encode::encode(&mut b.buf, rec);
        let len = (b.buf.len() - start) as u64;
        let q = &self.counters.queued_bytes;
        // Only appenders (under `acc`) add, so the check cannot race with
        // another add; IO threads only subtract.
        if q.load(Ordering::SeqCst) + len > cap {
            b.buf.truncate(start);
            return Err(len);
        }
        q.fetch_add(len, Ordering::SeqCst);
        b.count += 1;
        Ok(())
    }

    /// The cap is reached: make room (spool), wait, or refuse.
    fn wait_room(
        &self,
        acc: &mut parking_lot::MutexGuard<'_, Acc>,
        len: u64,
        deadline: &mut Option<Instant>,
        block: bool,
    ) -> Result<(), SendError> {
        if len > self.cfg.total_size_in_bytes as u64 {
            return Err(SendError::TooLarge);
        }
        if !block {
            return Err(SendError::Full);
        }
        if self.spool.is_some() {
            // Sealed batches waiting for an IO thread go to disk instead.
            if let Ok(msg) = self.rx.try_recv() {
                match msg {
                    Msg::Batch(b) => {
                        parking_lot::MutexGuard::unlocked(acc, || {
                            if let Err(b) = self.spool_batch(b, 0) {
                                let _ = self.tx.send(Msg::Batch(b));
                            }
                        });
                        return Ok(());
                    }
                    Msg::Stop => {
                        let _ = self.tx.send(Msg::Stop);
                    }
                }
            }
        }
        if self.cfg.max_block_ms == 0 {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Full);
        }
        let d = *deadline
            .get_or_insert_with(|| Instant::now() + Duration::from_millis(self.cfg.max_block_ms));
        if Instant::now() >= d {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Full);
        }
        self.room_waiters.fetch_add(1, Ordering::SeqCst);
        // Bounded slices: room made by a spool drain is not signalled.
        let until = d.min(Instant::now() + Duration::from_millis(50));
        self.room.wait_until(acc, until);
        self.room_waiters.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// Seals every open batch; returns the first sequence number of the
    /// batches opened after.
    fn seal_all(&self) -> u64 {
        let (batches, target) = {
            let mut acc = self.acc.lock();
            (acc.take_all(), acc.next_seq)
        };
        for b in batches {
            self.dispatch(b);
        }
        target
    }

    fn wait_done(&self, target: u64, deadline: Instant) -> bool {
        let mut o = self.outstanding.lock();
        loop {
            if o.first().is_none_or(|&s| s >= target) {
                return true;
            }
            if self.done.wait_until(&mut o, deadline).timed_out() {
                return o.first().is_none_or(|&s| s >= target);
            }
        }
    }

    fn dispatch(&self, b: Batch) {
        if b.count == 0 {
            self.finish(b, &Outcome::Delivered { attempts: 0 });
            return;
        }
        if let Err(crossbeam_channel::SendError(Msg::Batch(b))) = self.tx.send(Msg::Batch(b)) {
            self.fail(b, "the producer stopped".into(), 0);
        }
    }

    /// Ends a batch: counters, memory, callbacks, flush waiters.
    fn finish(&self, b: Batch, outcome: &Outcome) {
        let n = b.count as u64;
        let c = &self.counters;
        match outcome {
            Outcome::Delivered { .. } => c.sent.fetch_add(n, Ordering::Relaxed),
            Outcome::Spooled { .. } => c.spooled.fetch_add(n, Ordering::Relaxed),
            Outcome::Failed { .. } => {
                c.failed_bytes
                    .fetch_add(b.buf.len() as u64, Ordering::Relaxed);
                c.failed.fetch_add(n, Ordering::Relaxed)
            }
        };
        c.queued_bytes
            .fetch_sub(b.buf.len() as u64, Ordering::SeqCst);
        if self.room_waiters.load(Ordering::SeqCst) > 0 {
            // Under the lock, so a waiter between its check and its wait
            // cannot miss this.
            let _g = self.acc.lock();
            self.room.notify_all();
        }
        for cb in b.callbacks {
            cb(outcome);
        }
        self.outstanding.lock().remove(&b.seq);
        self.done.notify_all();
    }

    fn fail(&self, b: Batch, reason: String, attempts: u32) {
        self.finish(b, &Outcome::Failed { reason, attempts });
    }

    /// Appends `b` to the spool (durably); gives it back when that fails.
    fn spool_batch(&self, b: Batch, attempts: u32) -> Result<(), Batch> {
        let Some(sp) = &self.spool else {
            return Err(b);
        };
        match sp.append(&b.buf, b.count) {
            Ok(()) => {
                self.finish(b, &Outcome::Spooled { attempts });
                Ok(())
            }
            Err(_) => Err(b),
        }
    }

    fn aborting(&self) -> bool {
        self.stop.lock().abort
    }

    /// Sleeps `d`, or less when close gives up; false when it did.
    fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut st = self.stop.lock();
        while !st.abort {
            if self.stop_cv.wait_until(&mut st, until).timed_out() {
                return !st.abort;
            }
        }
        false
    }

    fn linger_loop(&self) {
        let linger = Duration::from_millis(self.cfg.linger_ms);
        let tick = (linger / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
        loop {
            {
                let mut st = self.stop.lock();
                if st.stop {
                    return;
                }
                self.stop_cv.wait_for(&mut st, tick);
                if st.stop {
                    return;
                }
            }
            let now = Instant::now();
            let old = {
                let mut acc = self.acc.lock();
                let mut v = Vec::new();
                if acc
                    .default
                    .as_ref()
                    .is_some_and(|b| now - b.created >= linger)
                {
                    v.extend(acc.default.take());
                }
                if !acc.streams.is_empty() {
                    let names: Vec<Box<str>> = acc
                        .streams
                        .iter()
                        .filter(|(_, b)| now - b.created >= linger)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in names {
                        v.extend(acc.streams.remove(&k));
                    }
                }
                v
            };
            for b in old {
                self.dispatch(b);
            }
        }
    }

    fn io_loop(&self) {
        let enc = self.cfg.compression.content_encoding();
        let mut client = http::Client::new(
            self.endpoint.clone(),
            enc,
            self.cfg.bearer_token.as_deref(),
            Duration::from_millis(self.cfg.request_timeout_ms),
        );
        let mut out = Vec::new();
        while let Ok(msg) = self.rx.recv() {
            let b = match msg {
                Msg::Batch(b) => b,
                Msg::Stop => break,
            };
            self.deliver(&mut client, &mut out, b);
        }
    }

    fn deliver(&self, client: &mut http::Client, out: &mut Vec<u8>, b: Batch) {
        let b =
            if self.spool.is_some() && self.now_ms() < self.down_until_ms.load(Ordering::Relaxed) {
                match self.spool_batch(b, 0) {
                    Ok(()) => return,
                    Err(b) => b,
                }
            } else {
                b
            };
        if self.aborting() {
            if let Err(b) = self.spool_batch(b, 0) {
                self.fail(b, "the producer was closed before delivery".into(), 0);
            }
            return;
        }
        let body = match compress(self.cfg.compression, &b.buf, out) {
            Ok(()) => &out[..],
            Err(e) => {
                self.fail(b, format!("compression failed: {e}"), 0);
                return;
            }
        };
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let (reason, retry_after, unreachable) = match client.post(body) {
                Ok(r) if (200..300).contains(&r.status) => {
                    self.finish(b, &Outcome::Delivered { attempts });
                    return;
                }
                Ok(r) if matches!(r.status, 408 | 429) || r.status >= 500 => (
                    format!("HTTP {}: {}", r.status, r.body),
                    r.retry_after,
                    r.status == 503,
                ),
                Ok(r) => {
                    // The agent refuses this body for good (400, 401, 413...).
                    self.fail(b, format!("HTTP {}: {}", r.status, r.body), attempts);
                    return;
                }
                Err(e) => (format!("{e}"), None, true),
            };
            if unreachable && self.spool.is_some() {
                // Later batches go straight to disk for a while.
                self.down_until_ms
                    .store(self.now_ms() + 1000, Ordering::Relaxed);
                match self.spool_batch(b, attempts) {
                    Ok(()) => return,
                    Err(back) => {
                        return self.retry_or_fail(
                            client,
                            body,
                            back,
                            attempts,
                            reason,
                            retry_after,
                        )
                    }
                }
            }
            if attempts > self.cfg.retries || self.aborting() {
                self.fail(b, reason, attempts);
                return;
            }
            self.counters.retried.fetch_add(1, Ordering::Relaxed);
            if !self.sleep(self.backoff(attempts, retry_after)) {
                self.fail(b, reason, attempts);
                return;
            }
        }
    }

    /// The spool could not take a batch: retry in memory as without one.
    fn retry_or_fail(
        &self,
        client: &mut http::Client,
        body: &[u8],
        b: Batch,
        mut attempts: u32,
        mut reason: String,
        mut retry_after: Option<u64>,
    ) {
        loop {
            if attempts > self.cfg.retries || self.aborting() {
                self.fail(b, reason, attempts);
                return;
            }
            self.counters.retried.fetch_add(1, Ordering::Relaxed);
            if !self.sleep(self.backoff(attempts, retry_after)) {
                self.fail(b, reason, attempts);
                return;
            }
            attempts += 1;
            match client.post(body) {
                Ok(r) if (200..300).contains(&r.status) => {
                    self.finish(b, &Outcome::Delivered { attempts });
                    return;
                }
                Ok(r) if matches!(r.status, 408 | 429) || r.status >= 500 => {
                    reason = format!("HTTP {}: {}", r.status, r.body);
                    retry_after = r.retry_after;
                }
                Ok(r) => {
                    self.fail(b, format!("HTTP {}: {}", r.status, r.body), attempts);
                    return;
                }
                Err(e) => {
                    reason = e.to_string();
                    retry_after = None;
                }
            }
        }
    }

    /// Delay before retry number `attempt` (1-based).
    fn backoff(&self, attempt: u32, retry_after: Option<u64>) -> Duration {
        let exp = self
            .cfg
            .base_retry_backoff_ms
            .saturating_mul(1u64 << (attempt.saturating_sub(1)).min(30));
        let ms = exp.min(
            self.cfg
                .max_retry_backoff_ms
                .max(self.cfg.base_retry_backoff_ms),
        );
        let ms = ms.max(retry_after.unwrap_or(0).saturating_mul(1000));
        Duration::from_millis(ms)
    }
}

/// Compresses `data` into `out` (a copy for `None`: the batch itself is
/// still needed when a request fails).
pub(crate) fn compress(c: Compression, data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Write;
    out.clear();
    match c {
        Compression::None => out.extend_from_slice(data),
        Compression::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(std::mem::take(out));
            e.write_all(data)?;
            *out = e.finish().map_err(std::io::Error::other)?;
        }
        Compression::Zstd => {
            let bound = zstd::zstd_safe::compress_bound(data.len());
            out.reserve(bound);
            zstd::stream::copy_encode(data, &mut *out, 1)?;
        }
        Compression::Gzip => {
            let mut e =
                flate2::write::GzEncoder::new(std::mem::take(out), flate2::Compression::fast());
            e.write_all(data)?;
            *out = e.finish()?;
        }
    }
    Ok(())
}

#[derive(Default)]
struct FutState {
    m: Mutex<(Option<Outcome>, Option<Waker>)>,
    cv: Condvar,
}

impl FutState {
    fn complete(&self, o: &Outcome) {
        let w = {
            let mut g = self.m.lock();
            g.0 = Some(o.clone());
            g.1.take()
        };
        self.cv.notify_all();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// The outcome of one record, to `.await` or to [`wait`](Self::wait) for.
pub struct DeliveryFuture {
    state: Arc<FutState>,
}

impl DeliveryFuture {
    /// Blocks until the outcome is known.
    pub fn wait(self) -> Outcome {
        let mut g = self.state.m.lock();
        loop {
            if let Some(o) = g.0.take() {
                return o;
            }
            self.state.cv.wait(&mut g);
        }
    }

    /// Blocks at most `timeout`; `None` when the outcome is not known yet.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = Instant::now() + timeout;
        let mut g = self.state.m.lock();
        loop {
            if let Some(o) = &g.0 {
                return Some(o.clone());
            }
            if self.state.cv.wait_until(&mut g, deadline).timed_out() {
                return g.0.clone();
            }
        }
    }
}

impl Future for DeliveryFuture {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut g = self.state.m.lock();
        match g.0.take() {
            Some(o) => Poll::Ready(o),
            None => {
                g.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
