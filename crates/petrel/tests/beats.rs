//! The `beats` source against Elastic's own Lumberjack v2 client,
//! go-lumber's `tst-send` (the library Filebeat's `output.logstash` uses;
//! built by `scripts/install-beats-clients.sh`), windowed, compressed and
//! pipelined; and against frames written here for what `tst-send` cannot
//! show: the exact fields of Filebeat-shaped events, v1 key/value frames,
//! partial and keep-alive ACKs, ACKs sent only once the sinks have the
//! events, garbage, oversized and silent clients, and `kill -9` after
//! acknowledged windows with the disk buffer.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tst_send() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/beats-clients/bin/tst-send");
    assert!(
        p.exists(),
        "go-lumber's tst-send is missing at {}: run scripts/install-beats-clients.sh",
        p.display()
    );
    p
}

/// Pipeline `beats`: source `lj` on `port` with `extra` keys (lines
/// indented by four spaces) into an ndjson file.
fn config(dir: &Path, port: u16, extra: &str, out: &Path) -> PathBuf {
    write_config(
        dir,
        "beats",
        &format!(
            "sources:\n  - type: beats\n    id: lj\n    address: 127.0.0.1:{port}\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            out.display()
        ),
    )
}

fn window(v: u8, n: u32) -> Vec<u8> {
    let mut f = vec![v, b'W'];
    f.extend_from_slice(&n.to_be_bytes());
    f
}

fn json_frame(v: u8, seq: u32, doc: &str) -> Vec<u8> {
    let mut f = vec![v, b'J'];
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&(doc.len() as u32).to_be_bytes());
    f.extend_from_slice(doc.as_bytes());
    f
}

fn pairs_frame(v: u8, seq: u32, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut f = vec![v, b'D'];
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
    for (k, val) in pairs {
        for s in [k, val] {
            f.extend_from_slice(&(s.len() as u32).to_be_bytes());
            f.extend_from_slice(s.as_bytes());
        }
    }
    f
}

fn compressed(v: u8, frames: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(3));
    z.write_all(frames).unwrap();
    let z = z.finish().unwrap();
    let mut f = vec![v, b'C'];
    f.extend_from_slice(&(z.len() as u32).to_be_bytes());
    f.extend_from_slice(&z);
    f
}

/// A Filebeat-shaped event numbered `i` of `label`.
fn filebeat_doc(label: &str, i: u32) -> String {
    format!(
        r#"{{"@timestamp":"2024-05-06T07:08:09.{:03}Z","@metadata":{{"beat":"filebeat","type":"_doc","version":"8.15.0"}},"message":"{label}-{i}","log":{{"offset":{},"file":{{"path":"/var/log/app.log"}}}},"input":{{"type":"filestream"}},"host":{{"name":"node-1"}}}}"#,
        i % 1000,
        i * 100
    )
}

/// One ACK frame: its version and sequence number.
fn read_ack(s: &mut TcpStream) -> (u8, u32) {
    let mut a = [0u8; 6];
    s.read_exact(&mut a).expect("an ACK frame");
    assert_eq!(a[1], b'A', "an ACK frame: {a:?}");
    (a[0], u32::from_be_bytes([a[2], a[3], a[4], a[5]]))
}

/// ACKs read until one says `seq`; all of them.
fn acks_until(s: &mut TcpStream, seq: u32) -> Vec<u32> {
    let mut got = Vec::new();
    loop {
        let (_, n) = read_ack(s);
        got.push(n);
        if n == seq {
            return got;
        }
        assert!(n < seq, "ACK {n} past the window's last sequence {seq}");
    }
}

fn client(port: u16) -> TcpStream {
    let s = connect(port);
    s.set_read_timeout(Some(MEDIUM)).unwrap();
    s
}

/// How often each `message` value arrived.
fn counts(events: &[serde_json::Value]) -> HashMap<String, usize> {
    let mut h = HashMap::new();
    for e in events {
        *h.entry(e["message"].as_str().unwrap_or("<none>").to_string())
            .or_default() += 1;
    }
    h
}

fn lines_now(out: &Path) -> Vec<serde_json::Value> {
    if out.exists() {
        json_lines(out)
    } else {
        Vec::new()
    }
}

#[test]
fn windows_of_json_pairs_and_compressed_frames_are_acked_once_the_file_has_them() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "", &out);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut s = client(port);

    // Three JSON frames: acknowledged with the last sequence number, and
    // the file already has them when the ACK arrives.
    let mut w = window(b'2', 3);
    for i in 1..=3 {
        w.extend(json_frame(b'2', i, &filebeat_doc("plain", i)));
    }
    s.write_all(&w).unwrap();
    assert_eq!(read_ack(&mut s), (b'2', 3));
    let events = lines_now(&out);
    assert_eq!(events.len(), 3, "an ACK means delivered: {events:?}");
    let e = &events[1];
    assert_eq!(e["message"], "plain-2");
    assert_eq!(e["timestamp"], "2024-05-06T07:08:09.002000000Z", "{e}");
    assert!(e.get("@timestamp").is_none(), "the time became the event's");
    assert_eq!(
        e["@metadata"],
        serde_json::json!({"beat": "filebeat", "type": "_doc", "version": "8.15.0"})
    );
    assert_eq!(e["log"]["offset"], 200);
    assert_eq!(e["log"]["file"]["path"], "/var/log/app.log");
    assert_eq!(e["host"]["name"], "node-1");
    assert!(e["source_address"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));

    // v1 (logstash-forwarder): key/value frames, answered in v1.
    let mut w = window(b'1', 2);
    w.extend(pairs_frame(
        b'1',
        1,
        &[("line", "forwarded-1"), ("file", "/var/log/x")],
    ));
    w.extend(pairs_frame(b'1', 2, &[("line", "forwarded-2")]));
    s.write_all(&w).unwrap();
    assert_eq!(read_ack(&mut s), (b'1', 2));

    // A window of 1,000 in one compressed frame, as Filebeat sends.
    let mut inner = Vec::new();
    for i in 1..=1000 {
        inner.extend(json_frame(b'2', i, &filebeat_doc("zipped", i)));
    }
    let mut w = window(b'2', 1000);
    w.extend(compressed(b'2', &inner));
    s.write_all(&w).unwrap();
    assert_eq!(read_ack(&mut s), (b'2', 1000));
    assert_eq!(lines_now(&out).len(), 3 + 2 + 1000);

    // A window of 3,000 events of ~600 bytes uncompressed (about 1.8 MB):
    // handed over in parts, each acknowledged as it is safe.
    let pad = "p".repeat(500);
    let mut w = window(b'2', 3000);
    for i in 1..=3000 {
        w.extend(json_frame(
            b'2',
            i,
            &format!(r#"{{"message":"big-{i}","pad":"{pad}"}}"#),
        ));
    }
    s.write_all(&w).unwrap();
    let acks = acks_until(&mut s, 3000);
    assert!(
        acks.len() >= 2 && acks[0] < 3000,
        "partial ACKs before the last: {acks:?}"
    );
    assert!(acks.windows(2).all(|p| p[0] <= p[1]), "in order: {acks:?}");

    let events = lines_now(&out);
    assert_eq!(events.len(), 3 + 2 + 1000 + 3000);
    let c = counts(&events);
    for (label, n) in [
        ("plain", 3),
        ("forwarded", 2),
        ("zipped", 1000),
        ("big", 3000),
    ] {
        for i in 1..=n {
            assert_eq!(c.get(&format!("{label}-{i}")), Some(&1), "{label}-{i} once");
        }
    }
    let fwd = events
        .iter()
        .find(|e| e["message"] == "forwarded-1")
        .unwrap();
    assert_eq!(fwd["file"], "/var/log/x");
}

#[test]
fn the_ack_waits_for_a_stalled_sink_with_keepalives_and_comes_once_it_delivers() {
    use std::sync::atomic::Ordering;
    let dir = tempdir();
    let port = free_port();
    let stalled = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let cfg = write_config(
        dir.path(),
        "beats",
        &format!(
            "sources:\n  - type: beats\n    id: lj\n    address: 127.0.0.1:{port}\nsinks:\n  - type: http\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n"
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut s = client(port);
    let mut w = window(b'2', 10);
    for i in 1..=10 {
        w.extend(json_frame(b'2', i, &filebeat_doc("held", i)));
    }
    s.write_all(&w).unwrap();
    // Nothing delivered: only keep-alive ACKs of nothing (0), the first
    // within 5 s, so that the client's own timeout never fires.
    s.set_read_timeout(Some(Duration::from_secs(12))).unwrap();
    let started = Instant::now();
    let (_, seq) = read_ack(&mut s);
    assert_eq!(seq, 0, "a keep-alive, not an acknowledgement");
    assert!(started.elapsed() < Duration::from_secs(11));
    assert!(stalled.bodies.lock().unwrap().is_empty());
    stalled.released.store(true, Ordering::SeqCst);
    let acks = acks_until(&mut s, 10);
    assert!(acks.iter().all(|&a| a == 0 || a == 10), "{acks:?}");
    let delivered = stalled.lines();
    assert_eq!(delivered, 10, "acknowledged once the sink had all ten");
}

#[test]
fn garbage_oversized_bad_json_bad_zlib_and_silent_clients_are_counted_and_earlier_events_acked() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(
        dir.path(),
        port,
        "    max_frame_bytes: 4KiB\n    idle_timeout_secs: 2\n",
        &out,
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    fn errors(t: &str) -> Vec<(&str, &str)> {
        source_error("beats", "lj", t)
    }
    let read_to_close = |s: &mut TcpStream| {
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .expect("the server closes the connection");
        got
    };
    let ack = |seq: u32| {
        let mut a = vec![b'2', b'A'];
        a.extend_from_slice(&seq.to_be_bytes());
        a
    };

    // Two good events, then garbage: the two are acknowledged, then closed.
    let mut s = client(port);
    let mut w = window(b'2', 5);
    w.extend(json_frame(b'2', 1, r#"{"message":"before-garbage-1"}"#));
    w.extend(json_frame(b'2', 2, r#"{"message":"before-garbage-2"}"#));
    w.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    s.write_all(&w).unwrap();
    assert_eq!(read_to_close(&mut s), ack(2));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("invalid_frame"),
        1.0,
        false,
    );

    // A frame declaring 1 MiB against max_frame_bytes 4KiB.
    let mut s = client(port);
    let mut w = window(b'2', 2);
    w.extend(json_frame(b'2', 1, r#"{"message":"before-oversized-1"}"#));
    w.extend_from_slice(&[b'2', b'J', 0, 0, 0, 2, 0, 0x10, 0, 0]);
    s.write_all(&w).unwrap();
    assert_eq!(read_to_close(&mut s), ack(1));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("frame_too_large"),
        1.0,
        false,
    );

    // A data frame that is no JSON object.
    let mut s = client(port);
    let mut w = window(b'2', 2);
    w.extend(json_frame(b'2', 1, r#"{"message":"before-array-1"}"#));
    w.extend(json_frame(b'2', 2, "[1,2,3]"));
    s.write_all(&w).unwrap();
    assert_eq!(read_to_close(&mut s), ack(1));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("invalid_frame"),
        2.0,
        false,
    );

    // A compressed frame that is not zlib.
    let mut s = client(port);
    let mut w = window(b'2', 1);
    w.extend_from_slice(&[b'2', b'C', 0, 0, 0, 8]);
    w.extend_from_slice(b"notzlib!");
    s.write_all(&w).unwrap();
    assert_eq!(read_to_close(&mut s), Vec::<u8>::new());
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("decompression_failed"),
        1.0,
        false,
    );

    // A compressed frame that inflates past max_frame_bytes (a zip bomb).
    let mut s = client(port);
    let mut w = window(b'2', 1);
    w.extend(compressed(b'2', &vec![b' '; 1 << 20]));
    s.write_all(&w).unwrap();
    assert_eq!(read_to_close(&mut s), Vec::<u8>::new());
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("frame_too_large"),
        2.0,
        false,
    );

    // A client that sends half a frame and then nothing: closed once idle.
    let mut s = client(port);
    let mut w = window(b'2', 1);
    w.extend_from_slice(&json_frame(b'2', 1, r#"{"message":"never finished"}"#)[..12]);
    s.write_all(&w).unwrap();
    let started = Instant::now();
    assert_eq!(read_to_close(&mut s), Vec::<u8>::new());
    assert!(started.elapsed() < Duration::from_secs(20));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &errors("idle_timeout"),
        1.0,
        true,
    );

    // Each good event once; nothing of the refused frames.
    let events = wait_for(LONG, "the four good events", || {
        let v = lines_now(&out);
        if v.len() >= 4 {
            Ok(v)
        } else {
            Err(format!("{} so far", v.len()))
        }
    });
    let mut messages: Vec<&str> = events
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    messages.sort();
    assert_eq!(
        messages,
        [
            "before-array-1",
            "before-garbage-1",
            "before-garbage-2",
            "before-oversized-1"
        ]
    );
    // The agent still serves.
    let mut s = client(port);
    let mut w = window(b'2', 1);
    w.extend(json_frame(b'2', 1, r#"{"message":"after"}"#));
    s.write_all(&w).unwrap();
    assert_eq!(read_ack(&mut s), (b'2', 1));
}

#[test]
fn kill_9_after_acknowledged_windows_loses_none_with_the_disk_buffer() {
    use std::sync::atomic::Ordering;
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let port = free_port();
    // Two sinks: the file, and an HTTP receiver that holds every request
    // until released, so nothing is committed in the spool before the
    // kill: acknowledgements can only come from the spool's durability.
    let stalled = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let cfg = write_config(
        dir.path(),
        "beats",
        &format!(
            "sources:\n  - type: beats\n    id: lj\n    address: 127.0.0.1:{port}\n    buffer: {{type: disk, sync_interval_ms: 50}}\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n  - type: http\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n",
            out.display()
        ),
    );
    let mut agent = Agent::start(&cfg, &data);
    let mut s = client(port);
    let (windows, per) = (20u32, 500u32);
    for k in 0..windows {
        let mut inner = Vec::new();
        for i in 1..=per {
            inner.extend(json_frame(
                b'2',
                i,
                &format!(r#"{{"message":"rec-{k}-{i}","k":{k}}}"#),
            ));
        }
        let mut w = window(b'2', per);
        w.extend(compressed(b'2', &inner));
        s.write_all(&w).unwrap();
        assert_eq!(acks_until(&mut s, per).last(), Some(&per));
    }
    assert!(
        stalled.bodies.lock().unwrap().is_empty(),
        "the HTTP receiver answered nothing yet"
    );
    agent.kill9();
    stalled.released.store(true, Ordering::SeqCst);
    let _agent = Agent::start(&cfg, &data);
    let total = (windows * per) as usize;
    let http_count = || stalled.lines();
    wait_for(
        LONG,
        "every acknowledged event at the HTTP receiver",
        || {
            let n = http_count();
            if n >= total {
                Ok(())
            } else {
                Err(format!("{n} of {total}"))
            }
        },
    );
    let events = wait_for(LONG, "every acknowledged event in the file", || {
        let v = lines_now(&out);
        if v.len() >= total {
            Ok(v)
        } else {
            Err(format!("{} of {total}", v.len()))
        }
    });
    let c = counts(&events);
    let mut dups = 0;
    for k in 0..windows {
        for i in 1..=per {
            let n = c.get(&format!("rec-{k}-{i}")).copied().unwrap_or(0);
            assert!(n >= 1, "acknowledged rec-{k}-{i} was lost");
            assert!(n <= 2, "rec-{k}-{i} arrived {n} times");
            dups += n - 1;
        }
    }
    eprintln!(
        "kill -9 after {total} acknowledged events: file {} lines ({dups} duplicates), http {}",
        events.len(),
        http_count()
    );
    // The HTTP sink had acknowledged nothing, so it gets each event once.
    assert_eq!(http_count(), total);
}

/// `tst-send`'s count of acknowledged events, from its expvar page.
fn acked(http: u16) -> Option<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", http)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /debug/vars HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let json = body.split("\r\n\r\n").nth(1)?;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v["ACKed"].as_u64()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn go_lumber_tst_send_windowed_compressed_and_pipelined_every_acked_event_arrives() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "", &out);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    connect(port);
    // tst-send repeats one batch of events drawn from these lines.
    let text = "Lorem ipsum dolor sit amet, consetetur sadipscing elitr,\nsed diam nonumy eirmod tempor invidunt ut labore et dolore magna aliquyam erat,\nsed diam voluptua. At vero eos et accusam et justo duo dolores et ea rebum. Stet\nclita kasd gubergren, no sea takimata sanctus est Lorem ipsum dolor sit amet.\nLorem ipsum dolor sit amet, consetetur sadipscing elitr, sed diam nonumy eirmod\ntempor invidunt ut labore et dolore magna aliquyam erat, sed diam voluptua. At\nvero eos et accusam et justo duo dolores et ea rebum. Stet clita kasd gubergren,\nno sea takimata sanctus est Lorem ipsum dolor sit amet.";
    let lines: std::collections::HashSet<&str> = text.lines().collect();
    let mut before = 0usize;
    // (compression level, window, batches in flight)
    for (compress, batch, pipeline) in [(0u32, 100u64, 0u32), (3, 2048, 0), (3, 512, 2)] {
        let http = free_port();
        let child = Command::new(tst_send())
            .args([
                "-c",
                &format!("127.0.0.1:{port}"),
                "-compress",
                &compress.to_string(),
                "-batch",
                &batch.to_string(),
                "-pipeline",
                &pipeline.to_string(),
                "-httpprof",
                &format!("127.0.0.1:{http}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("tst-send.err")).unwrap())
            .spawn()
            .expect("start tst-send");
        let mut child = Killed(child);
        let want = 20 * batch;
        let acked_seen = wait_for(LONG, "tst-send to have 20 windows acknowledged", || {
            if let Ok(Some(st)) = child.0.try_wait() {
                let err =
                    std::fs::read_to_string(dir.path().join("tst-send.err")).unwrap_or_default();
                panic!("tst-send exited ({st}): {err}");
            }
            match acked(http) {
                Some(n) if n >= want => Ok(n),
                n => Err(format!("{n:?} acknowledged")),
            }
        });
        drop(child);
        // Every event tst-send saw acknowledged is in the file; events
        // sent but not yet acknowledged when it was killed may be too.
        let events = wait_for(LONG, "the acknowledged events in the file", || {
            let v = lines_now(&out);
            if (v.len() - before) as u64 >= acked_seen {
                Ok(v)
            } else {
                Err(format!("{} of {acked_seen}", v.len() - before))
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        let events_after = lines_now(&out);
        let got = events_after.len() - before;
        for e in &events[before..] {
            let m = e["message"].as_str().unwrap_or_default();
            assert!(lines.contains(m), "a line of tst-send's text: {e}");
            assert_eq!(e["type"], "filebeat", "{e}");
            assert_eq!(e["offset"], 1000, "{e}");
            assert!(
                e["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
                "{e}"
            );
            assert!(e.get("@timestamp").is_none(), "{e}");
        }
        eprintln!(
            "tst-send compress {compress} batch {batch} pipeline {pipeline}: {acked_seen} acknowledged seen, {got} delivered"
        );
        before = events_after.len();
    }
}

#[test]
fn sinks_route_on_the_nested_metadata_beat() {
    let dir = tempdir();
    let (win, other) = (
        dir.path().join("win.ndjson"),
        dir.path().join("other.ndjson"),
    );
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        "beats",
        &format!(
            "sources:\n  - type: beats\n    address: 127.0.0.1:{port}\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n    when:\n      include: {{ \"@metadata.beat\": '^winlogbeat$' }}\n  - type: file\n    path: {}\n    encoding: ndjson\n    when:\n      exclude: {{ \"@metadata.beat\": '^winlogbeat$' }}\n",
            win.display(),
            other.display()
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut s = client(port);
    let mut w = window(b'2', 3);
    for (i, beat) in [(1, "winlogbeat"), (2, "filebeat"), (3, "winlogbeat")] {
        w.extend(json_frame(
            b'2',
            i,
            &format!(r#"{{"message":"m{i}","@metadata":{{"beat":"{beat}"}}}}"#),
        ));
    }
    s.write_all(&w).unwrap();
    assert_eq!(read_ack(&mut s), (b'2', 3));
    let names = |p: &Path| -> Vec<String> {
        lines_now(p)
            .iter()
            .map(|e| e["message"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&win), ["m1", "m3"]);
    assert_eq!(names(&other), ["m2"]);
}
