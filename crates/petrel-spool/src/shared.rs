//! A writer shared by many threads, with group commit on its own thread.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::writer::{AppendError, Writer};

type Listener = Box<dyn Fn(u64) + Send + Sync>;
type FailureListener = Box<dyn Fn(&str) + Send + Sync>;

struct SyncState {
    /// Records appended so far (the ticket of the last one).
    appended: u64,
    /// Records known durable.
    durable: u64,
    /// Someone waits for a record: sync without waiting for the interval.
    urgent: bool,
    stop: bool,
    /// The last sync failed with this; cleared by the next success.
    error: Option<String>,
}

struct Inner {
    writer: Mutex<Writer>,
    state: Mutex<SyncState>,
    /// Signals the syncer (work to do) and waiters (progress).
    changed: Condvar,
    interval: Duration,
    listeners: Mutex<Vec<Listener>>,
    failure_listeners: Mutex<Vec<FailureListener>>,
}

/// A [`Writer`] behind a lock, whose records are made durable by a
/// background thread: one `fdatasync` covers every record appended while
/// the previous one ran (group commit). Appending never waits for a sync.
pub struct SharedWriter {
    inner: Arc<Inner>,
    syncer: Mutex<Option<JoinHandle<()>>>,
}

impl SharedWriter {
    /// Starts the syncer for `writer`: it syncs at most every
    /// `sync_interval`, or at once when someone waits for a record.
    pub fn new(writer: Writer, sync_interval: Duration) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            writer: Mutex::new(writer),
            state: Mutex::new(SyncState {
                appended: 0,
                durable: 0,
                urgent: false,
                stop: false,
                error: None,
            }),
            changed: Condvar::new(),
            interval: sync_interval,
            listeners: Mutex::new(Vec::new()),
            failure_listeners: Mutex::new(Vec::new()),
        });
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("petrel-spool-sync".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            inner,
            syncer: Mutex::new(Some(handle)),
        })
    }

    /// Appends one record (see [`Writer::append_with`]) and returns its
    /// ticket for [`Self::wait_durable`].
    pub fn append_with(&self, fill: impl FnOnce(&mut Vec<u8>)) -> Result<u64, AppendError> {
        let mut w = self.inner.writer.lock();
        w.append_with(fill)?;
        // Counted under the writer's lock, so a ticket the syncer saw is
        // always in the buffer it flushes next.
        let mut s = self.inner.state.lock();
        // Only the first record after a sync has to wake the syncer (it
        // then waits for the interval, or for `urgent`); waking it for
        // every record cost a futex wake and a context switch per append,
        // the largest cost of `petrel pipe` behind a line-per-write logger.
        let wake = s.appended == s.durable;
        s.appended += 1;
        let ticket = s.appended;
        drop(s);
        drop(w);
        if wake {
            self.inner.changed.notify_all();
        }
        Ok(ticket)
    }

    /// Waits until record `ticket` is durable, at most `timeout`.
    pub fn wait_durable(&self, ticket: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.inner.state.lock();
        while s.durable < ticket {
            s.urgent = true;
            self.inner.changed.notify_all();
            if self.inner.changed.wait_until(&mut s, deadline).timed_out() {
                return s.durable >= ticket;
            }
        }
        true
    }

    /// Asks the syncer to make everything appended durable now, without
    /// waiting for it.
    pub fn request_sync(&self) {
        self.inner.state.lock().urgent = true;
        self.inner.changed.notify_all();
    }

    /// Writes buffered records to the segment (no sync), so a reader sees
    /// them.
    pub fn flush(&self) -> std::io::Result<()> {
        self.inner.writer.lock().flush()
    }

    /// Records durable so far (the last durable ticket).
    pub fn durable(&self) -> u64 {
        self.inner.state.lock().durable
    }

    /// The error of the last failed sync, while the failure lasts.
    pub fn last_error(&self) -> Option<String> {
        self.inner.state.lock().error.clone()
    }

    /// Calls `f` with the durable ticket after every sync (from the
    /// syncer thread; keep it short).
    pub fn on_durable(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        self.inner.listeners.lock().push(Box::new(f));
    }

    /// Calls `f` with the error after every failed write or sync (from the
    /// syncer thread), so that callers waiting for durability can be
    /// answered at once instead of at their timeout.
    pub fn on_failure(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.inner.failure_listeners.lock().push(Box::new(f));
    }

    /// Runs `f` on the writer (to read its usage, say).
    pub fn with_writer<T>(&self, f: impl FnOnce(&mut Writer) -> T) -> T {
        f(&mut self.inner.writer.lock())
    }

    /// Makes everything durable and stops the syncer.
    pub fn close(&self) -> std::io::Result<()> {
        self.inner.state.lock().stop = true;
        self.inner.changed.notify_all();
        if let Some(h) = self.syncer.lock().take() {
            let _ = h.join();
        }
        self.inner.writer.lock().sync()
    }
}

impl Drop for SharedWriter {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Inner {
    fn run(&self) {
        let mut last_sync = Instant::now();
        loop {
            let target = {
                let mut s = self.state.lock();
                loop {
                    if s.stop {
                        return;
                    }
                    if s.appended > s.durable {
                        if s.urgent || last_sync.elapsed() >= self.interval {
                            break;
                        }
                        let at = last_sync + self.interval;
                        self.changed.wait_until(&mut s, at);
                    } else {
                        self.changed.wait_for(&mut s, Duration::from_secs(1));
                    }
                }
                s.urgent = false;
                s.appended
            };
            last_sync = Instant::now();
            let flushed = self.writer.lock().flush_for_sync();
            let result = flushed.and_then(|f| match f {
                // The sync runs without the writer's lock: appends go on.
                Some((f, seq, len)) => match f.sync_data() {
                    Ok(()) => {
                        self.writer.lock().synced(seq, len);
                        Ok(())
                    }
                    Err(e) => {
                        self.writer.lock().sync_failed(seq, len);
                        Err(e)
                    }
                },
                None => Ok(()),
            });
            match result {
                Ok(()) => {
                    // Listeners hear of the new position before any waiter
                    // can see it (a waiter wakes on notify or on its own
                    // timeout), so one that returns from `wait_durable`
                    // may rely on them (a test saw 399 of 400 otherwise).
                    let durable = self.state.lock().durable.max(target);
                    for l in self.listeners.lock().iter() {
                        l(durable);
                    }
                    let mut s = self.state.lock();
                    s.durable = s.durable.max(durable);
                    s.error = None;
                }
                Err(e) => {
                    let e = e.to_string();
                    for l in self.failure_listeners.lock().iter() {
                        l(&e);
                    }
                    self.state.lock().error = Some(e);
                    self.changed.notify_all();
                    // Retry after a pause rather than spinning on a failing disk.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            self.changed.notify_all();
        }
    }
}
