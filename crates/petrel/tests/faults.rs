//! Faults injected by hand in review, each reproduced end to end: a log
//! directory mounted late, running out of file descriptors, a data dir
//! that fills up, and API clients that never finish their request.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::*;

fn numbered(tag: &str, from: usize, to: usize) -> String {
    (from..to).map(|i| format!("{tag}-{i:06}\n")).collect()
}

fn assert_exactly_once(out: &Path, tag: &str, n: usize) {
    let h = histogram(read_lines(out));
    for i in 0..n {
        let l = format!("{tag}-{i:06}").into_bytes();
        assert_eq!(h.get(&l), Some(&1), "line {tag}-{i:06}");
    }
    assert_eq!(h.values().sum::<usize>(), n, "nothing else in the output");
}

/// The log directory is not there when the agent starts (a volume mounted
/// late) and comes back 2 s later: its files resume at their checkpointed
/// offsets instead of being read again from the start.
#[test]
fn a_log_dir_mounted_late_resumes_at_its_offsets() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let out = dir.path().join("out.log");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "late",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    append(&input, numbered("l", 0, 1000).as_bytes());
    {
        let mut agent = Agent::start(&cfg, &data);
        wait_for(LONG, "the first 1000 lines", || {
            let n = count_lines(&out);
            (n == 1000).then_some(()).ok_or(format!("{n} lines"))
        });
        agent.stop();
    }
    let away = dir.path().join("logs.away");
    std::fs::rename(&logs, &away).unwrap();
    let agent = Agent::start(&cfg, &data);
    // Several scans pass without the directory.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::rename(&away, &logs).unwrap();
    append(&input, numbered("l", 1000, 2000).as_bytes());
    wait_lines(&out, 2000);
    std::thread::sleep(Duration::from_millis(500));
    let err = agent.stderr();
    drop(agent);
    assert_exactly_once(&out, "l", 2000);
    assert!(
        err.contains("nothing matches yet"),
        "a missing directory is reported as such: {err}"
    );
    assert!(
        !err.contains("falling back to 1 s polling"),
        "a missing directory is not an inotify limit: {err}"
    );
}

/// 20,000 files under `ulimit -n 1024` (hard limit too, so the agent
/// cannot raise it): listings that fail with EMFILE keep the files known,
/// finished files are closed to make room, and every line arrives exactly
/// once.
#[test]
fn twenty_thousand_files_under_a_1024_descriptor_limit() {
    const FILES: usize = 20_000;
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    for f in 0..FILES {
        std::fs::write(
            logs.join(format!("f{f:05}.log")),
            format!("f{f:05}-a\nf{f:05}-b\n"),
        )
        .unwrap();
    }
    let out = dir.path().join("out.log");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "many",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            nofile: Some(1024),
            ..Default::default()
        },
    );
    wait_for(Duration::from_secs(240), "every line", || {
        let n = count_lines(&out);
        (n >= 2 * FILES).then_some(()).ok_or(format!("{n} lines"))
    });
    // Room for a late duplicate to show.
    std::thread::sleep(Duration::from_secs(2));
    let h = histogram(read_lines(&out));
    for f in 0..FILES {
        for s in ["a", "b"] {
            let l = format!("f{f:05}-{s}").into_bytes();
            assert_eq!(h.get(&l), Some(&1), "line f{f:05}-{s}");
        }
    }
    assert!(
        agent.stderr().contains("out of file descriptors"),
        "the limit was really hit"
    );
}

/// The data dir fills up: checkpoint writes fail, which is counted, makes
/// `/health` unhealthy, and makes the exit status non-zero (a final
/// checkpoint that was not written must not be reported as written).
#[test]
fn a_full_data_dir_is_reported_not_hidden() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let out = dir.path().join("out.log");
    let data = dir.path().join("data");
    let _fs = Tmpfs::mount(&data, "256k");
    let cfg = write_config(
        dir.path(),
        "full",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    append(&input, numbered("c", 0, 100).as_bytes());
    let mut agent = Agent::start(&cfg, &data);
    wait_for(LONG, "the first lines", || {
        let n = count_lines(&out);
        (n == 100).then_some(()).ok_or(format!("{n} lines"))
    });
    // Fill the data dir, then give the checkpoint something new to write.
    let filler = data.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![b'x'; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    append(&input, numbered("c", 100, 200).as_bytes());
    wait_for(LONG, "checkpoint errors", || {
        let n = agent.metric_or_zero("petrel_checkpoint_errors_total", &[]);
        (n >= 1.0).then_some(()).ok_or(format!("{n} errors"))
    });
    let (code, body) = agent.http_get("/health").unwrap();
    assert_eq!(code, 503, "unhealthy while checkpoints fail: {body}");
    assert!(body.contains("checkpoint"), "{body}");
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(LONG);
    assert!(
        !st.success(),
        "a final checkpoint that could not be written is a failure: {st}\n{}",
        agent.stderr()
    );
    assert!(
        !agent.stderr().contains("final checkpoint written"),
        "{}",
        agent.stderr()
    );
}

/// Clients that open connections to the API and never finish a request
/// are closed after the header timeout, connections beyond the cap are
/// refused at once, and the API keeps answering.
#[test]
fn half_sent_api_requests_are_timed_out() {
    let dir = tempdir();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "api",
        &simple_config(&format!("{}/logs/*.log", dir.path().display()), &out, ""),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
        held.push(s);
    }
    // Every one of them is closed by the server: EOF (or a reset, or a
    // 408 answer) rather than our read timeout.
    let mut closed = 0;
    for s in &mut held {
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(_) => closed += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ) =>
            {
                closed += 1
            }
            Err(e) => panic!("a half-sent request was held open: {e}"),
        }
    }
    assert_eq!(closed, 300);
    let (code, _) = agent.http_get("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        agent.metric_or_zero("petrel_api_refused_connections_total", &[]) >= 1.0,
        "connections beyond the cap were refused"
    );
}

/// Twelve sinks that never deliver (`/dev/full`) under `--memory-limit
/// 8MiB`: every encoded copy is paid from the reservation the reader took
/// before reading, so the charged memory stays within the limit plus one
/// batch's misestimate (documented as 2 MiB), and RSS stays bounded.
#[test]
fn the_memory_limit_holds_with_twelve_sinks() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let line = "x".repeat(100);
    let text: String = (0..200_000).map(|i| format!("{i:08} {line}\n")).collect();
    append(&input, text.as_bytes());
    let mut cfg = format!(
        "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nsinks:\n",
        logs.display()
    );
    for i in 0..12 {
        cfg.push_str(&format!(
            "  - type: file\n    id: full_{i}\n    path: /dev/full\n    encoding: ndjson\n"
        ));
    }
    let cfg = write_config(dir.path(), "mem", &cfg);
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "8MiB".into()],
            ..Default::default()
        },
    );
    const LIMIT: f64 = 8.0 * 1048576.0;
    const SLACK: f64 = 2.0 * 1048576.0;
    let mut peak: f64 = 0.0;
    for _ in 0..60 {
        let used = agent.metric_or_zero("petrel_memory_used_bytes", &[]);
        peak = peak.max(used);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(peak > 0.0, "data was in flight");
    assert!(
        peak <= LIMIT + SLACK,
        "charged memory peaked at {peak} bytes with an 8 MiB limit"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        rss_kib < 80.0 * 1024.0,
        "peak RSS {rss_kib} KiB with an 8 MiB limit"
    );
}
