//! Faults round 2 (issue 19) against the receiving sources and the spool:
//! a spool capped below its old segment size with a healthy sink, a full
//! disk under the HTTP source, a damaged spool record, and a UDP source
//! behind a stalled sink (loss counted during the outage, shutdown within
//! its deadline).

mod common;

use std::io::Write;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn numbered_body(from: usize, n: usize, pad: &str) -> String {
    (from..from + n)
        .map(|i| format!("line {i:08} {pad}\n"))
        .collect()
}

/// Writes pipeline `name`: the `sources` YAML (list items) into a file
/// sink at `out` with `encoding`.
fn to_file(dir: &Path, name: &str, sources: &str, out: &Path, encoding: &str) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            "sources:\n{sources}sinks:\n  - type: file\n    path: {}\n    encoding: {encoding}\n",
            out.display()
        ),
    )
}

/// Every `line NNNNNNNN` number found in the `message` of the ndjson
/// lines of `out`, with how often it was seen.
fn numbers_seen(out: &Path) -> std::collections::HashMap<u64, u32> {
    let mut seen = std::collections::HashMap::new();
    for l in read_lines(out) {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&l) else {
            continue;
        };
        let m = v["message"].as_str().unwrap_or("");
        if let Some(n) = m
            .strip_prefix("line ")
            .and_then(|r| r.split(' ').next())
            .and_then(|d| d.parse().ok())
        {
            *seen.entry(n).or_insert(0) += 1;
        }
    }
    seen
}

/// Issue 19.1: an HTTP source whose spool is capped at 4 MiB (below the
/// old fixed 32 MiB segment), with a healthy sink, accepts far more than
/// 4 MiB in total: only undelivered data counts against the cap. Before
/// the fix it answered 503 forever after ~4 MiB.
#[test]
fn http_spool_capped_below_a_segment_keeps_accepting_with_a_healthy_sink() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = to_file(
        dir.path(),
        "small",
        &format!("  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n    max_body_bytes: 1MiB\n    buffer: {{ type: disk, max_bytes: 4MiB }}\n"),
        &out,
        "ndjson",
    );
    let mut agent = Agent::start(&cfg, &data);
    let pad = "p".repeat(180);
    // 16 MiB in all: four times the cap.
    let per_request = 500;
    let requests = 16 * 1024 * 1024 / (per_request * 200);
    let mut refused_in_a_row = 0;
    for r in 0..requests {
        let body = numbered_body(r * per_request, per_request, &pad);
        loop {
            let (code, answer) = post(port, "/ingest", &[], body.as_bytes());
            if code == 200 {
                refused_in_a_row = 0;
                break;
            }
            assert_eq!(code, 503, "{answer}");
            refused_in_a_row += 1;
            // A healthy sink drains the spool: a short wait must do, not
            // a spool that stays full for good.
            assert!(
                refused_in_a_row < 600,
                "request {r}: refused 600 times in a row with a healthy sink: {answer}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let total = requests * per_request;
    wait_for(LONG, "every accepted line delivered", || {
        let seen = numbers_seen(&out);
        (seen.len() == total)
            .then_some(())
            .ok_or(format!("{} of {total}", seen.len()))
    });
    let (code, body) = agent.http_get("/health").unwrap();
    assert_eq!(code, 200, "{body}");
    agent.stop();
}

/// Issue 19.1: a TCP source with a 2 MiB spool and a healthy sink reads
/// all of 50,000 lines (about 10 MiB). Before the fix it stopped reading
/// for good after about 19,000.
#[test]
fn tcp_spool_capped_at_2_mib_delivers_everything_with_a_healthy_sink() {
    let dir = tempdir();
    let out = dir.path().join("out.log");
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = to_file(
        dir.path(),
        "tcp2m",
        &format!("  - type: tcp\n    address: 127.0.0.1:{port}\n    buffer: {{ type: disk, max_bytes: 2MiB }}\n"),
        &out,
        "text",
    );
    let mut agent = Agent::start(&cfg, &data);
    let pad = "t".repeat(185);
    let mut s = connect(port);
    let writer = std::thread::spawn(move || {
        for chunk in 0..50 {
            s.write_all(numbered_body(chunk * 1000, 1000, &pad).as_bytes())
                .unwrap();
        }
    });
    wait_lines(&out, 50_000);
    writer.join().unwrap();
    agent.stop();
    let lines = read_lines(&out);
    assert_eq!(lines.len(), 50_000);
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(format!("line {i:08} ").as_bytes()),
            "line {i}: {}",
            String::from_utf8_lossy(l)
        );
    }
}

/// Issue 19.1: a long-running `petrel pipe --max-bytes 2MiB` (the Apache
/// case) beside a running agent: what the agent delivered frees room, so
/// nothing is dropped while the agent keeps up. Before the fix 30,673 of
/// 50,000 lines were dropped.
#[test]
fn a_long_running_pipe_with_a_2_mib_cap_drops_nothing_while_the_agent_keeps_up() {
    let dir = tempdir();
    let spool = dir.path().join("spool");
    let out = dir.path().join("out.log");
    let cfg = to_file(
        dir.path(),
        "piped",
        &format!("  - type: spool\n    path: {}\n", spool.display()),
        &out,
        "text",
    );
    std::fs::create_dir_all(&spool).unwrap();
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut pipe = Command::new(bin())
        .args([
            "pipe",
            "--name",
            "web",
            "--max-bytes",
            "2MiB",
            "--spool-dir",
        ])
        .arg(&spool)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = pipe.stdin.take().unwrap();
    let pad = "a".repeat(185);
    for chunk in 0..50 {
        stdin
            .write_all(numbered_body(chunk * 1000, 1000, &pad).as_bytes())
            .unwrap();
        stdin.flush().unwrap();
        // The agent keeps up: each thousand lines is delivered before
        // the next is written.
        wait_lines(&out, (chunk + 1) * 1000);
    }
    drop(stdin);
    let st = wait_child(&mut pipe, "petrel pipe");
    let mut stderr = String::new();
    std::io::Read::read_to_string(pipe.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(st.success(), "{stderr}");
    assert!(
        !spool.join("pipe-dropped.web").exists(),
        "lines were dropped: {stderr}"
    );
    agent.stop();
    assert_eq!(count_lines(&out), 50_000);
}

/// Issue 19.4: with the spool's disk full, an HTTP request is refused at
/// once with the reason (not after the admission timeout as "buffer
/// full"), and `/health` says the source cannot accept data.
#[test]
fn a_full_disk_under_the_http_source_is_refused_with_its_reason_and_unhealthy() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _fs = Tmpfs::mount(&data, "16m");
    let port = free_port();
    let cfg = to_file(
        dir.path(),
        "fulldisk",
        &format!("  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n    max_body_bytes: 1MiB\n    buffer: {{ type: disk, max_bytes: 64MiB }}\n"),
        &out,
        "ndjson",
    );
    let mut agent = Agent::start(&cfg, &data);
    let (code, _) = post(port, "/ingest", &[], b"before the disk filled\n");
    assert_eq!(code, 200);
    wait_lines(&out, 1);
    // Fill the file system that holds the spool.
    let filler = fill_disk(&data);
    let body = numbered_body(0, 2000, &"d".repeat(100));
    let mut refused = None;
    for _ in 0..20 {
        let (code, answer) = post(port, "/ingest", &[], body.as_bytes());
        if code == 503 {
            refused = Some(answer);
            break;
        }
    }
    let answer = refused.expect("a request on a full disk was refused");
    assert!(
        answer.contains("cannot write the spool"),
        "the answer says why: {answer}"
    );
    wait_for(MEDIUM, "/health unhealthy", || {
        let (code, body) = agent.http_get("/health").map_err(|e| e.to_string())?;
        (code == 503 && body.contains("cannot write the spool"))
            .then_some(())
            .ok_or(format!("{code} {body}"))
    });
    // Room again: accepted and healthy again.
    std::fs::remove_file(&filler).unwrap();
    wait_for(LONG, "accepted once the disk has room", || {
        let (code, answer) = post(port, "/ingest", &[], b"after the disk was freed\n");
        (code == 200).then_some(()).ok_or(answer)
    });
    wait_for(MEDIUM, "/health ok", || {
        let (code, body) = agent.http_get("/health").map_err(|e| e.to_string())?;
        (code == 200).then_some(()).ok_or(format!("{code} {body}"))
    });
    agent.stop();
}

/// Issue 19.5: one flipped byte in a spool record loses that record only;
/// the records after it are delivered, the skip is counted, and the
/// damaged segment is kept in the quarantine directory.
#[test]
fn a_damaged_spool_record_loses_only_itself_and_its_segment_is_quarantined() {
    let dir = tempdir();
    let spool = dir.path().join("spool");
    let out = dir.path().join("out.log");
    // Small records: a read of 4 KiB per record.
    let input: String = (0..20_000)
        .map(|i| format!("access line {i:06}\n"))
        .collect();
    let mut child = Command::new(bin())
        .args(["pipe", "--spool-dir"])
        .arg(&spool)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for chunk in input.as_bytes().chunks(4096) {
            stdin.write_all(chunk).unwrap();
            stdin.flush().unwrap();
            // One read per write, so records stay small: `petrel pipe`
            // waits 1 ms after a short read to gather more, so the writes
            // are spaced well beyond that.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(wait_child(&mut child, "petrel pipe").success());
    let seg = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&seg).unwrap();
    // A payload byte in the middle of the segment.
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&seg, &bytes).unwrap();
    let cfg = to_file(
        dir.path(),
        "damaged",
        &format!("  - type: spool\n    path: {}\n", spool.display()),
        &out,
        "text",
    );
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut l = component("damaged", "source", "spool_0");
    l.push(("error_type", "spool_damaged_records"));
    wait_metric(&agent, "petrel_component_errors_total", &l, 1.0, false);
    let quarantined = spool.join("quarantine").join(seg.file_name().unwrap());
    wait_for(LONG, "the damaged segment quarantined", || {
        quarantined
            .exists()
            .then_some(())
            .ok_or("not yet".to_string())
    });
    let got = read_lines(&out);
    let lost = 20_000 - got.len();
    // At most the damaged record (one read of at most 4 KiB of input).
    assert!(
        lost > 0 && lost <= 4096 / 19 + 1,
        "{lost} lines lost, {} delivered",
        got.len()
    );
    // Everything after the damage arrived, in order.
    assert_eq!(
        got.last().map(|l| l.as_slice()),
        Some(b"access line 019999".as_slice())
    );
    agent.stop();
}

/// Issues 19.2 and 19.3: a UDP syslog source behind a sink that accepts
/// connections but never answers. While the memory budget is full, what
/// the kernel drops is counted during the outage; SIGTERM with
/// `--shutdown-timeout 5` ends the agent (before the fix it hung: the
/// receiver waited forever for room in a queue nobody drained).
#[test]
fn udp_behind_a_stalled_sink_counts_its_loss_and_shuts_down_in_time() {
    let dir = tempdir();
    let stalled = Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let cfg = write_config(
        dir.path(),
        "udp",
        &format!(
            "sources:\n  - type: syslog\n    mode: udp\n    address: 127.0.0.1:{port}\n    receive_buffer_bytes: 262144\nsinks:\n  - type: http\n    url: http://{addr}/ingest\n    timeout_ms: 600000\n"
        ),
    );
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec![
                "--memory-limit".into(),
                "16MiB".into(),
                "--shutdown-timeout".into(),
                "5".into(),
            ],
            ..AgentOptions::default()
        },
    );
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let msg = format!("<14>Nov 25 03:00:00 host app: {}", "u".repeat(400));
    let send_gently = |n: usize| {
        for i in 0..n {
            let _ = sender.send_to(msg.as_bytes(), ("127.0.0.1", port));
            if i % 50 == 49 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let accepted = component("udp", "source", "syslog_0");
    // Fill the memory budget behind the stalled sink: the source stops
    // taking datagrams once nothing more fits.
    let mut last = -1.0;
    let mut unchanged = 0;
    wait_for(LONG, "the source to stop taking datagrams", || {
        send_gently(2000);
        let now = agent.metric_or_zero("petrel_component_sent_events_total", &accepted);
        if now == last && stalled.held.load(Ordering::SeqCst) > 0 {
            unchanged += 1;
        } else {
            unchanged = 0;
        }
        last = now;
        (unchanged >= 5)
            .then_some(())
            .ok_or(format!("{now} accepted"))
    });
    // During the outage, what arrives is lost, and the loss must show
    // now (before the fix the drop count was only read with datagrams
    // received later, and none were).
    let dropped = source_error("udp", "syslog_0", "kernel_dropped");
    let before = agent.metric_or_zero("petrel_component_errors_total", &dropped);
    send_gently(20_000);
    wait_for(MEDIUM, "the loss counted during the outage", || {
        let now = agent.metric_or_zero("petrel_component_errors_total", &dropped);
        (now >= before + 1000.0)
            .then_some(())
            .ok_or(format!("kernel_dropped {before} -> {now}"))
    });
    assert!(
        stalled.held.load(Ordering::SeqCst) > 0,
        "the sink is stalled"
    );
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(LONG);
    // Memory-buffered data that was not delivered is reported.
    assert!(!st.success(), "{}", agent.stderr());
    stalled.released.store(true, Ordering::SeqCst);
}

/// Issue 19.1: a pipe whose options cannot work (a line longer than half
/// the spool) refuses to start and says how to fix it, instead of
/// dropping lines later.
#[test]
fn a_pipe_whose_lines_cannot_fit_its_spool_refuses_to_start() {
    let dir = tempdir();
    let o = Command::new(bin())
        .args(["pipe", "--max-bytes", "1MiB", "--spool-dir"])
        .arg(dir.path().join("spool"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--max-line-bytes 1048576 is more than half of --max-bytes 1048576"),
        "{err}"
    );
}
