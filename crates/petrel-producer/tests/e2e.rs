//! The producer against a real `petrel run` (HTTP source → file sink).

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use petrel_producer::{CloseReport, Compression, Config, Outcome, Producer, Record, SendError};

fn endpoint(port: u16) -> String {
    format!("http://127.0.0.1:{port}/ingest")
}

const PAD: &str = "the quick brown fox jumps over the lazy dog, again and again and again";

#[test]
fn a_million_records_from_eight_threads_arrive_exactly_once() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let _agent = Agent::start(dir.path(), port, &out);
    let mut cfg = Config::new(endpoint(port));
    cfg.io_thread_count = 2;
    cfg.linger_ms = 100;
    cfg.compression = Compression::Lz4;
    let p = Producer::new(cfg).unwrap();
    const THREADS: u64 = 8;
    const PER: u64 = 125_000;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let p = &p;
            s.spawn(move || {
                for i in 0..PER {
                    let n = (t * PER + i).to_string();
                    let fields = [("n", n.as_str()), ("msg", PAD)];
                    let rec = Record::new(&fields).time_ns(i);
                    let rec = if i % 2 == 0 { rec.stream("even") } else { rec };
                    p.send(&rec).unwrap();
                }
            });
        }
    });
    let report = p.close(LONG);
    assert_eq!(report, CloseReport::default());
    let c = p.counters();
    assert_eq!((c.sent, c.failed, c.rejected_full), (THREADS * PER, 0, 0));
    assert_eq!(c.queued_bytes, 0);
    wait_exactly_once(&out, THREADS * PER, LONG);
}

/// Nothing listens on the port: every batch fails to connect.
fn unreachable_config(max_block_ms: u64) -> Config {
    let mut cfg = Config::new(endpoint(free_port()));
    cfg.total_size_in_bytes = 64 << 10;
    cfg.batch_size_threshold_in_bytes = 16 << 10;
    cfg.max_block_ms = max_block_ms;
    cfg.linger_ms = 10;
    cfg.retries = 1000;
    cfg.base_retry_backoff_ms = 50;
    cfg.max_retry_backoff_ms = 200;
    cfg
}

#[test]
fn full_queue_rejects_without_blocking_and_close_reports_the_rest() {
    let p = Producer::new(unreachable_config(0)).unwrap();
    let outcome = Arc::new(Mutex::new(None));
    let o = outcome.clone();
    p.send_with_callback(&Record::new(&[("n", "first")]), move |r| {
        *o.lock().unwrap() = Some(r.clone())
    })
    .unwrap();
    let (mut accepted, mut rejected) = (1u64, 0u64);
    let mut slowest = Duration::ZERO;
    for i in 0..20_000u64 {
        let n = i.to_string();
        let t = Instant::now();
        let r = p.send(&Record::new(&[("n", &n), ("msg", PAD)]));
        slowest = slowest.max(t.elapsed());
        match r {
            Ok(()) => accepted += 1,
            Err(SendError::Full) => rejected += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    // A correctness bound on blocking (never waits for room), not speed.
    assert!(
        slowest < Duration::from_millis(100),
        "a send blocked {slowest:?}"
    );
    assert!(rejected > 0, "64 KiB cannot hold 20,000 records");
    let c = p.counters();
    assert_eq!(c.rejected_full, rejected);
    assert_eq!(c.sent, 0);
    let report = p.close(Duration::from_millis(500));
    assert_eq!(report.undelivered_records, accepted);
    assert!(report.undelivered_bytes > 0);
    let c = p.counters();
    assert_eq!((c.sent, c.failed, c.queued_bytes), (0, accepted, 0));
    match outcome.lock().unwrap().clone() {
        Some(Outcome::Failed { reason, attempts }) => {
            assert!(attempts >= 1, "{attempts}");
            assert!(!reason.is_empty());
        }
        other => panic!("the callback got {other:?}"),
    }
    assert_eq!(p.send(&Record::new(&[])), Err(SendError::Closed));
}

#[test]
fn max_block_ms_bounds_the_wait_for_room() {
    let p = Producer::new(unreachable_config(200)).unwrap();
    let mut waits = Vec::new();
    let mut i = 0u64;
    while waits.len() < 5 {
        let n = i.to_string();
        i += 1;
        let t = Instant::now();
        let r = p.send(&Record::new(&[("n", &n), ("msg", PAD)]));
        let took = t.elapsed();
        assert!(took < Duration::from_secs(3), "send {i} blocked {took:?}");
        if r == Err(SendError::Full) {
            waits.push(took);
        }
        assert!(i < 100_000, "never full");
    }
    // Rejected only after waiting for room (the agent never frees any).
    for w in &waits {
        assert!(*w >= Duration::from_millis(190), "gave up early: {waits:?}");
    }
    assert_eq!(p.counters().rejected_full, 5);
    p.close(Duration::ZERO);
}

#[test]
fn agent_down_ten_seconds_then_up_gets_everything() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let mut cfg = Config::new(endpoint(port));
    cfg.linger_ms = 50;
    cfg.batch_count_threshold = 1000;
    cfg.base_retry_backoff_ms = 100;
    cfg.max_retry_backoff_ms = 2000;
    cfg.retries = 30;
    cfg.compression = Compression::Zstd;
    let p = Producer::new(cfg).unwrap();
    const N: u64 = 20_000;
    let mut first = None;
    for i in 0..N {
        let n = i.to_string();
        let fields = [("n", n.as_str()), ("msg", PAD)];
        let rec = Record::new(&fields);
        if i == 0 {
            // Its batch is the first an IO thread takes: it sees the outage.
            first = Some(p.send_future(&rec).unwrap());
        } else {
            p.send(&rec).unwrap();
        }
    }
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(p.counters().sent, 0);
    assert!(p.counters().retried > 0);
    let _agent = Agent::start(dir.path(), port, &out);
    match first.unwrap().wait() {
        Outcome::Delivered { attempts } => assert!(attempts > 1, "{attempts}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.close(LONG), CloseReport::default());
    assert_eq!(p.counters().sent, N);
    wait_exactly_once(&out, N, LONG);
}

#[test]
fn spooled_records_survive_kill_9_and_a_restart() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let spool = dir.path().join("spool");
    let port = free_port();
    const FLUSHED: u64 = 20_000;
    // The agent is down: the child spools everything.
    let mut cmd = Command::new(example_bin("spool_child"));
    // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .arg(endpoint(port))
        .arg(&spool)
        .arg(FLUSHED.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn examples/spool_child (cargo test builds it)");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(LONG).expect("the child flushed");
    assert_eq!(line, format!("FLUSHED {FLUSHED}"));
    // Mid-stream: it keeps sending (and spooling) after the flush.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    // Every record the child was told is spooled must arrive too.
    let mut promised: HashSet<u64> = (0..FLUSHED).collect();
    let mut later = 0;
    for line in rx.try_iter() {
        if let Some(n) = line.strip_prefix("S ").and_then(|n| n.parse().ok()) {
            promised.insert(n);
            later += 1;
        }
    }
    assert!(
        later > 0,
        "killed before anything after the flush was spooled"
    );
    assert!(
        later < FLUSHED,
        "the child finished before the kill: not mid-stream"
    );
    assert!(petrel_spool::spool_bytes(&spool).unwrap() > 0);

    let _agent = Agent::start(dir.path(), port, &out);
    let mut cfg = Config::new(endpoint(port));
    cfg.spool_dir = Some(spool.clone());
    let p = Producer::new(cfg).unwrap();
    let h = wait_for(LONG, "the spool to be sent", || {
        let h = numbers(&out);
        let missing = promised.iter().filter(|i| !h.contains_key(i)).count();
        let arrived: u64 = h.values().map(|&c| c as u64).sum();
        if missing == 0 && p.counters().sent_from_spool == arrived {
            Ok(h)
        } else {
            Err(format!(
                "{missing} of {} spooled records missing, counters {:?}",
                promised.len(),
                p.counters()
            ))
        }
    });
    // Nothing was ever delivered before the crash, so nothing twice.
    let dups: HashSet<_> = h.iter().filter(|(_, &c)| c > 1).map(|(n, _)| *n).collect();
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    assert!(p.counters().sent_from_spool >= FLUSHED);
    p.close(MEDIUM);
}
