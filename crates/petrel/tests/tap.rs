//! `petrel tap` against a running agent: what it prints is what the sink
//! wrote, a component can be named, a client that stops reading never
//! holds the pipeline back (its events are skipped and counted), and a
//! component that does not exist is a clear error.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn config(dir: &Path, log: &Path, out: &Path) -> std::path::PathBuf {
    write_config(
        dir,
        "web",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\n    id: json\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            log.display(),
            out.display()
        ),
    )
}

fn tap(agent: &Agent, args: &[&str]) -> std::process::Child {
    Command::new(bin())
        .arg("tap")
        .args(["--api-addr", &format!("127.0.0.1:{}", agent.port)])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run petrel tap")
}

fn finish(child: std::process::Child) -> (i32, String, String) {
    let mut child = child;
    wait_child(&mut child, "petrel tap");
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Waits until the agent has `want` taps open (it offers events only
/// then).
fn wait_tap_open(agent: &Agent, want: usize) {
    wait_metric(agent, "petrel_tap_open", &[], want as f64, true);
}

#[test]
fn tapped_events_are_what_the_sink_wrote() {
    let dir = tempdir();
    let (log, out) = (dir.path().join("app.log"), dir.path().join("out.ndjson"));
    append(&log, b"{\"n\":-1}\n");
    let agent = Agent::start(&config(dir.path(), &log, &out), &dir.path().join("data"));
    wait_lines(&out, 1);
    let at_sink = tap(&agent, &["web", "--limit", "50"]);
    let after_json = tap(&agent, &["web/json", "--limit", "20", "--format", "ndjson"]);
    let messages = tap(&agent, &["web/file_0", "--limit", "10", "--format", "text"]);
    wait_tap_open(&agent, 3);
    let lines: String = (0..2000)
        .map(|i| format!("{{\"n\":{i},\"user\":\"u{i}\"}}\n"))
        .collect();
    append(&log, lines.as_bytes());
    wait_lines(&out, 2001);
    let written: HashSet<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (child, want) in [(at_sink, 50), (after_json, 20)] {
        let (code, stdout, stderr) = finish(child);
        assert_eq!(code, 0, "{stderr}");
        let got: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(got.len(), want, "{stdout}");
        for e in &got {
            assert!(written.contains(e), "tapped {e} is not what the sink wrote");
            assert!(e["user"].is_string(), "parsed fields are there: {e}");
        }
    }
    // The source's output: the raw lines, before parse_json.
    let (code, stdout, stderr) = finish(messages);
    assert_eq!(code, 0, "{stderr}");
    let got: Vec<&str> = stdout.lines().collect();
    assert_eq!(got.len(), 10, "{stdout}");
    assert!(
        got.iter().all(|m| m.starts_with("{\"n\":")),
        "messages as read: {got:?}"
    );
}

#[test]
fn a_tap_client_that_stops_reading_never_blocks_the_pipeline() {
    let dir = tempdir();
    let (log, out) = (dir.path().join("app.log"), dir.path().join("out.ndjson"));
    append(&log, b"{\"n\":-1}\n");
    let agent = Agent::start(&config(dir.path(), &log, &out), &dir.path().join("data"));
    wait_lines(&out, 1);
    // A client that asks for everything and never reads.
    let mut stalled = std::net::TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
    stalled
        .write_all(b"GET /tap?pipeline=web HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    wait_tap_open(&agent, 1);
    let n = 300_000;
    let mut lines = String::with_capacity(n * 40);
    for i in 0..n {
        lines.push_str(&format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(40)));
    }
    append(&log, lines.as_bytes());
    wait_lines(&out, n + 1);
    let skipped = agent.metric_or_zero("petrel_tap_skipped_events_total", &[]);
    assert!(
        skipped > 0.0,
        "the stalled client's events were skipped and counted"
    );
    // The client did get the start of the stream.
    let mut head = [0u8; 64];
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let k = stalled.read(&mut head).unwrap();
    assert!(
        String::from_utf8_lossy(&head[..k]).starts_with("HTTP/1."),
        "{:?}",
        String::from_utf8_lossy(&head[..k])
    );
}

#[test]
fn an_unknown_component_is_a_clear_error() {
    let dir = tempdir();
    let (log, out) = (dir.path().join("app.log"), dir.path().join("out.ndjson"));
    append(&log, b"{}\n");
    let agent = Agent::start(&config(dir.path(), &log, &out), &dir.path().join("data"));
    let (code, _, stderr) = finish(tap(&agent, &["web/nope", "--limit", "1"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("pipeline `web` has no component `nope`"),
        "{stderr}"
    );
    let (code, _, stderr) = finish(tap(&agent, &["nothere"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("no pipeline `nothere`"), "{stderr}");
}
