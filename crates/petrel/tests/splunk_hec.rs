//! The `splunk_hec` source against real HEC clients on 127.0.0.1:
//! Splunk's own Node.js library `splunk-logging` (npm, installed by
//! scripts/install-hec-clients.sh into .cache/hec-clients) sending batches,
//! and `curl` for tokens, errors, gzip, raw lines, health and indexer
//! acknowledgements; what an ack id reported true survives `kill -9`.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Where scripts/install-hec-clients.sh put the Node.js modules.
fn node_modules() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/hec-clients/node_modules");
    assert!(
        p.join("splunk-logging").is_dir(),
        "splunk-logging is not installed in {}; run scripts/install-hec-clients.sh",
        p.display()
    );
    p
}

/// Runs a short-lived client command to completion, at most `limit`.
fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait for the client").is_some() {
            return child.wait_with_output().expect("client output");
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("client output");
            panic!(
                "{what} did not finish within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(POLL);
    }
}

/// `curl` to the source: (HTTP status, parsed JSON answer).
fn curl(port: u16, path: &str, args: &[&str]) -> (u16, serde_json::Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("http://127.0.0.1:{port}{path}"));
    let out = run_bounded(cmd, MEDIUM);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, code) = text.rsplit_once('\n').expect("curl's status line");
    let json = serde_json::from_str(body.trim())
        .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {body:?}"));
    (code.trim().parse().expect("status"), json)
}

fn hec_config(dir: &Path, name: &str, port: u16, extra: &str, out: &Path) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            "sources:\n  - type: splunk_hec\n    address: 127.0.0.1:{port}\n    tokens:\n      - \"${{HEC_TEST_TOKEN}}\"\n      - {{ token: team-a-token, fields: {{ team: a }} }}\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            out.display()
        ),
    )
}

fn start(config: &Path, data: &Path) -> Agent {
    Agent::start_with(
        config,
        data,
        AgentOptions {
            env: vec![("HEC_TEST_TOKEN".into(), "main-token".into())],
            ..Default::default()
        },
    )
}

#[test]
fn splunk_logging_batches_arrive_with_their_metadata_and_the_tokens_fields() {
    const N: usize = 3000;
    let modules = node_modules();
    let dir = tempdir();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let cfg = hec_config(dir.path(), "hec", port, "", &out);
    let agent = start(&cfg, &dir.path().join("data"));
    // Two loggers (one per token), batches of 100 events; every callback
    // must report success.
    let script = dir.path().join("send.js");
    std::fs::write(
        &script,
        format!(
            r#"
const SplunkLogger = require("splunk-logging").Logger;
const url = "http://127.0.0.1:{port}";
// With batching, a send's callback runs only for the send that fills a
// batch: one answer per batch of 100.
const expected = {N} / 100;
let answered = 0, failed = 0;
function logger(token) {{
  const l = new SplunkLogger({{ token, url, maxBatchCount: 100, maxRetries: 0 }});
  l.error = (err, ctx) => {{ failed++; console.error("error:", err && err.message); }};
  l.eventFormatter = (m, severity) => ({{ message: m.text, seq: m.seq, severity }});
  return l;
}}
const main = logger("main-token"), team = logger("team-a-token");
for (let i = 0; i < {N}; i++) {{
  const l = i % 2 ? team : main;
  l.send({{
    message: {{ text: "event " + i, seq: i }},
    metadata: {{ host: "web-" + (i % 3), source: "app.js", sourcetype: "node", index: "main" }},
    severity: "info",
  }}, (err, resp, body) => {{
    answered++;
    if (err || !body || body.code !== 0) {{ failed++; console.error("bad answer:", err, body); }}
  }});
}}
const done = () => {{
  if (answered < expected) return setTimeout(done, 20);
  console.log(JSON.stringify({{ answered, failed }}));
  process.exit(failed ? 1 : 0);
}};
done();
"#
        ),
    )
    .unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&script).env("NODE_PATH", &modules);
    let res = run_bounded(cmd, LONG);
    assert!(
        res.status.success(),
        "splunk-logging reported failures: {}{}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    wait_lines(&out, N);
    let events = json_lines(&out);
    assert_eq!(events.len(), N, "every event once");
    let mut seen = vec![0u32; N];
    for e in &events {
        let seq = e["seq"].as_u64().expect("seq field from the event object") as usize;
        seen[seq] += 1;
        assert_eq!(e["message"], format!("event {seq}"), "{e}");
        assert_eq!(e["splunk.source"], "app.js", "{e}");
        assert_eq!(e["splunk.sourcetype"], "node", "{e}");
        assert_eq!(e["splunk.index"], "main", "{e}");
        assert_eq!(e["splunk.host"], format!("web-{}", seq % 3), "{e}");
        assert_eq!(e["severity"], "info", "{e}");
        if seq % 2 == 1 {
            assert_eq!(e["team"], "a", "the token's field: {e}");
        } else {
            assert!(e.get("team").is_none(), "{e}");
        }
    }
    assert!(seen.iter().all(|&n| n == 1));
    drop(agent);
}

#[test]
fn curl_gets_hecs_codes_for_tokens_bad_input_gzip_raw_and_health() {
    let dir = tempdir();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let cfg = hec_config(dir.path(), "hec", port, "    max_body_bytes: 64KiB\n", &out);
    let agent = start(&cfg, &dir.path().join("data"));
    let ev = "/services/collector/event";
    let auth = ["-H", "Authorization: Splunk main-token"];
    let body = r#"{"event":"one","time":1700000000.25,"host":"h1"}"#;

    let (st, j) = curl(port, ev, &["-d", body]);
    assert_eq!((st, &j["code"]), (401, &2.into()), "{j}");
    assert_eq!(j["text"], "Token is required");
    let (st, j) = curl(port, ev, &["-H", "Authorization: Splunk wrong", "-d", body]);
    assert_eq!((st, &j["code"]), (403, &4.into()), "{j}");
    assert_eq!(j["text"], "Invalid token");
    let (st, j) = curl(port, &format!("{ev}?token=main-token"), &["-d", body]);
    assert_eq!(
        (st, &j["code"]),
        (400, &16.into()),
        "query tokens are off: {j}"
    );

    let (st, j) = curl(port, ev, &[auth[0], auth[1], "-d", body]);
    assert_eq!(
        (st, j.clone()),
        (200, serde_json::json!({"text":"Success","code":0}))
    );
    // Bad input: the whole request is refused with the bad event's index.
    let (st, j) = curl(
        port,
        ev,
        &[auth[0], auth[1], "-d", r#"{"event":"ok"}{"event":"#],
    );
    assert_eq!(
        (st, &j["code"], &j["invalid-event-number"]),
        (400, &6.into(), &1.into()),
        "{j}"
    );
    let (st, j) = curl(
        port,
        ev,
        &[auth[0], auth[1], "-d", r#"{"event":"ok"} {"time":1}"#],
    );
    assert_eq!((st, &j["code"]), (400, &12.into()), "{j}");
    let (st, j) = curl(port, ev, &[auth[0], auth[1], "-d", r#"{"event":""}"#]);
    assert_eq!((st, &j["code"]), (400, &13.into()), "{j}");
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"\xff\xfe{\x00garbage").unwrap();
    let (st, j) = curl(
        port,
        ev,
        &[
            auth[0],
            auth[1],
            "--data-binary",
            &format!("@{}", garbage.display()),
        ],
    );
    assert_eq!((st, &j["code"]), (400, &6.into()), "{j}");
    let (st, j) = curl(
        port,
        ev,
        &[
            auth[0],
            auth[1],
            "-H",
            "Content-Encoding: gzip",
            "-d",
            "not gzip",
        ],
    );
    assert_eq!((st, &j["code"]), (400, &6.into()), "{j}");
    let (st, j) = curl(port, ev, &[auth[0], auth[1], "-d", "  "]);
    assert_eq!((st, &j["code"]), (400, &5.into()), "{j}");
    let big = dir.path().join("big.json");
    std::fs::write(&big, format!(r#"{{"event":"{}"}}"#, "x".repeat(100_000))).unwrap();
    let (st, _) = curl(
        port,
        ev,
        &[
            auth[0],
            auth[1],
            "--data-binary",
            &format!("@{}", big.display()),
        ],
    );
    assert_eq!(st, 413);

    // A gzip body with two events, an object event and `fields`.
    let gz = dir.path().join("body.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(
        br#"{"event":{"log":"from gzip","level":"warn"},"fields":{"region":"eu"},"source":"s"}
{"event":{"a":1,"b":"two"},"sourcetype":"json"}"#,
    )
    .unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let (st, j) = curl(
        port,
        "/services/collector",
        &[
            "-H",
            "Authorization: Splunk team-a-token",
            "-H",
            "Content-Encoding: gzip",
            "--data-binary",
            &format!("@{}", gz.display()),
        ],
    );
    assert_eq!((st, &j["code"]), (200, &0.into()), "{j}");
    // Raw lines with a channel and query metadata.
    let (st, j) = curl(
        port,
        "/services/collector/raw?channel=11111111-2222-3333-4444-555555555555&sourcetype=access&host=edge",
        &[auth[0], auth[1], "--data-binary", "raw one\r\nraw two\n\n"],
    );
    assert_eq!((st, &j["code"]), (200, &0.into()), "{j}");
    let (st, j) = curl(port, "/services/collector/health", &[]);
    assert_eq!(
        (st, j),
        (200, serde_json::json!({"text":"HEC is healthy","code":17}))
    );
    let (st, j) = curl(
        port,
        "/services/collector/ack",
        &[
            auth[0],
            auth[1],
            "-H",
            "X-Splunk-Request-Channel: c",
            "-d",
            r#"{"acks":[0]}"#,
        ],
    );
    assert_eq!((st, &j["code"]), (400, &14.into()), "acks are off: {j}");

    wait_lines(&out, 5);
    let events = json_lines(&out);
    assert_eq!(
        events.len(),
        5,
        "only accepted requests were delivered: {events:?}"
    );
    let by_msg: HashMap<String, &serde_json::Value> = events
        .iter()
        .map(|e| (e["message"].as_str().unwrap_or_default().to_string(), e))
        .collect();
    let one = by_msg["one"];
    assert_eq!(one["splunk.host"], "h1");
    assert!(
        one["timestamp"]
            .as_str()
            .is_some_and(|t| t.starts_with("2023-11-14T22:13:20.25")),
        "{one}"
    );
    let g = by_msg["from gzip"];
    assert_eq!(
        (&g["level"], &g["region"], &g["splunk.source"], &g["team"]),
        (&"warn".into(), &"eu".into(), &"s".into(), &"a".into()),
        "{g}"
    );
    let obj = events
        .iter()
        .find(|e| e["splunk.sourcetype"] == "json")
        .expect("the object event");
    assert_eq!((&obj["a"], &obj["b"]), (&1.into(), &"two".into()), "{obj}");
    let m: serde_json::Value = serde_json::from_str(obj["message"].as_str().unwrap()).unwrap();
    assert_eq!(
        m,
        serde_json::json!({"a":1,"b":"two"}),
        "an object without message is its JSON"
    );
    for line in ["raw one", "raw two"] {
        let r = by_msg[line];
        assert_eq!(
            r["splunk.channel"], "11111111-2222-3333-4444-555555555555",
            "{r}"
        );
        assert_eq!(
            (&r["splunk.sourcetype"], &r["splunk.host"]),
            (&"access".into(), &"edge".into()),
            "{r}"
        );
    }
    // Every refusal was counted.
    let err = |t| {
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("hec", "splunk_hec_0", t),
        )
    };
    assert_eq!(
        err("token_required"),
        2.0,
        "no token, and a query token while they are off"
    );
    assert_eq!(err("invalid_token"), 1.0);
    assert_eq!(err("invalid_data"), 6.0);
    assert_eq!(err("body_too_large"), 1.0);
}

/// POSTs `n` events with `channel`; the ack id.
fn send_acked(port: u16, channel: &str, first: usize, n: usize) -> u64 {
    let body: String = (first..first + n)
        .map(|i| format!(r#"{{"event":"acked {i}"}}"#))
        .collect();
    let (st, answer) = post(
        port,
        "/services/collector/event",
        &[
            ("Authorization", "Splunk main-token"),
            ("X-Splunk-Request-Channel", channel),
        ],
        body.as_bytes(),
    );
    assert_eq!(st, 200, "{answer}");
    let j: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(j["code"], 0, "{j}");
    j["ackId"]
        .as_u64()
        .unwrap_or_else(|| panic!("no ackId in {j}"))
}

/// Asks (with curl) for `ids` on `channel` until all are true.
fn wait_acks(port: u16, channel: &str, ids: &[u64]) {
    let mut left: Vec<u64> = ids.to_vec();
    wait_for(LONG, "every ack id true", || {
        let q = serde_json::json!({ "acks": left }).to_string();
        let (st, j) = curl(
            port,
            "/services/collector/ack",
            &[
                "-H",
                "Authorization: Splunk main-token",
                "-H",
                &format!("X-Splunk-Request-Channel: {channel}"),
                "-d",
                &q,
            ],
        );
        assert_eq!(st, 200, "{j}");
        left.retain(|id| j["acks"][id.to_string()] != true);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} pending: {j}", left.len()))
        }
    });
}

#[test]
fn indexer_acks_turn_true_only_once_the_sink_wrote_the_events() {
    let dir = tempdir();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let cfg = hec_config(
        dir.path(),
        "hec",
        port,
        "    ack: { enabled: true }\n",
        &out,
    );
    let agent = start(&cfg, &dir.path().join("data"));
    // Without a channel: HEC code 10.
    let (st, j) = curl(
        port,
        "/services/collector/event",
        &[
            "-H",
            "Authorization: Splunk main-token",
            "-d",
            r#"{"event":"x"}"#,
        ],
    );
    assert_eq!((st, &j["code"]), (400, &10.into()), "{j}");
    let ch = "6a1f0f5e-8a33-4c8e-9d0c-5a3f1c2b7e10";
    let ids: Vec<u64> = (0..20).map(|r| send_acked(port, ch, r * 50, 50)).collect();
    assert_eq!(
        ids,
        (0..20).collect::<Vec<u64>>(),
        "ack ids count up per channel"
    );
    // An id is true only when its events are in the file: check each as
    // soon as it is reported.
    let mut left = ids.clone();
    wait_for(LONG, "every ack id true", || {
        let q = serde_json::json!({ "acks": left }).to_string();
        let (_, j) = curl(
            port,
            "/services/collector/ack",
            &[
                "-H",
                "Authorization: Splunk main-token",
                "-H",
                &format!("X-Splunk-Request-Channel: {ch}"),
                "-d",
                &q,
            ],
        );
        let written: std::collections::HashSet<String> = json_lines(&out)
            .iter()
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect();
        for id in left.clone() {
            if j["acks"][id.to_string()] == true {
                for i in id * 50..id * 50 + 50 {
                    assert!(
                        written.contains(&format!("acked {i}")),
                        "ack {id} true before event {i} was written"
                    );
                }
                left.retain(|x| *x != id);
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    // Reported once: asked again, a true id is forgotten (false).
    let (_, j) = curl(
        port,
        "/services/collector/ack",
        &[
            "-H",
            "Authorization: Splunk main-token",
            "-H",
            &format!("X-Splunk-Request-Channel: {ch}"),
            "-d",
            r#"{"acks":[0,999]}"#,
        ],
    );
    assert_eq!(j, serde_json::json!({"acks":{"0":false,"999":false}}));
    assert_eq!(count_lines(&out), 1000);
    drop(agent);
}

/// The messages in the stalled server's ndjson bodies.
fn stalled_messages(server: &Stalled) -> Vec<String> {
    server
        .bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| split_lines(&[b.as_slice(), b"\n"].concat()))
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(&l).expect("ndjson body");
            v["message"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
fn what_an_ack_reported_true_survives_kill_9() {
    const REQUESTS: usize = 40;
    const PER: usize = 250;
    let dir = tempdir();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    // Two sinks: the file writes at once, the HTTP server holds every
    // request, so nothing is committed in the spool when the agent dies.
    let server = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let cfg = write_config(
        dir.path(),
        "hec",
        &format!(
            "sources:\n  - type: splunk_hec\n    address: 127.0.0.1:{port}\n    tokens: [\"${{HEC_TEST_TOKEN}}\"]\n    ack: {{ enabled: true }}\n    buffer: {{ type: disk }}\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n  - type: http\n    url: http://{addr}/ingest\n    timeout_ms: 600000\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n",
            out.display()
        ),
    );
    let mut agent = start(&cfg, &data);
    let ch = "0b6c1d2e-3f40-4a5b-8c6d-7e8f9a0b1c2d";
    let ids: Vec<u64> = (0..REQUESTS)
        .map(|r| send_acked(port, ch, r * PER, PER))
        .collect();
    wait_acks(port, ch, &ids);
    let total = REQUESTS * PER;
    // Every id is true: the events are durable. The file has them (so the
    // restart duplicates them there), the stalled server has none.
    wait_lines(&out, total);
    agent.kill9();
    let before = count_lines(&out);
    assert!(stalled_messages(&server).is_empty());
    server
        .released
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut agent = start(&cfg, &data);
    let want: Vec<String> = (0..total).map(|i| format!("acked {i}")).collect();
    let missing = |have: Vec<String>| {
        let have: std::collections::HashSet<String> = have.into_iter().collect();
        let n = want.iter().filter(|m| !have.contains(*m)).count();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} missing"))
        }
    };
    wait_for(LONG, "every acknowledged event in the file", || {
        missing(
            read_lines(&out)
                .iter()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_slice(l).unwrap();
                    v["message"].as_str().unwrap_or_default().to_string()
                })
                .collect(),
        )
    });
    wait_for(LONG, "every acknowledged event at the http server", || {
        missing(stalled_messages(&server))
    });
    agent.stop();
    let lines = count_lines(&out);
    let dups = lines - total;
    eprintln!("kill -9 after every ack was true: {before} events written to the file before the kill, {lines} after the restart: {dups} duplicates");
    // The spool replays what no sink had committed, once: the file's
    // copies from before the kill come again, nothing more.
    assert_eq!(before, total);
    assert!(
        dups <= before,
        "{dups} duplicates, more than the {before} written before the kill"
    );
    assert_eq!(
        dups, total,
        "nothing was committed (the http sink held everything), so all of it is replayed"
    );
}

#[test]
fn json_nested_deeper_than_the_parser_goes_is_refused_not_stored_raw() {
    let dir = tempdir();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let cfg = hec_config(dir.path(), "hec", port, "", &out);
    let agent = start(&cfg, &dir.path().join("data"));
    let auth = [("Authorization", "Splunk main-token")];
    for depth in [100_000usize, 65] {
        let body = format!(r#"{{"event":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
        let (st, answer) = post(port, "/services/collector/event", &auth, body.as_bytes());
        assert_eq!(st, 400, "depth {depth}: {answer}");
        let j: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            (&j["code"], &j["invalid-event-number"]),
            (&6.into(), &0.into()),
            "{j}"
        );
    }
    // Within the limit: taken and parsed.
    let ok = format!(
        r#"{{"event":{{"a":{}1{}}}}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    let (st, answer) = post(port, "/services/collector/event", &auth, ok.as_bytes());
    assert_eq!(st, 200, "{answer}");
    wait_lines(&out, 1);
    let v = &json_lines(&out)[0];
    assert!(v["a"].is_array(), "parsed, not kept raw: {v}");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("error_type", "parse_failed")]
        ),
        0.0
    );
}

#[test]
fn a_spool_on_a_disk_that_fills_and_frees_again_delivers_every_event_it_answered_200() {
    let dir = tempdir();
    let port = free_port();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _fs = Tmpfs::mount(&data, "8m");
    let server = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let cfg = write_config(
        dir.path(),
        "hec",
        &format!(
            "sources:\n  - type: splunk_hec\n    address: 127.0.0.1:{port}\n    tokens: [\"${{HEC_TEST_TOKEN}}\"]\n    max_body_bytes: 1MiB\n    buffer: {{ type: disk, max_bytes: 4MiB }}\nsinks:\n  - type: http\n    url: http://{addr}/ingest\n    timeout_ms: 600000\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n"
        ),
    );
    let agent = start(&cfg, &data);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flapper = {
        let (stop, data) = (stop.clone(), data.clone());
        std::thread::spawn(move || flap_disk(&data, &stop))
    };
    // Requests of 100 events for 15 s: some answered 200 (durable in the
    // spool), some 503 (not taken: the client keeps them).
    let auth = [("Authorization", "Splunk main-token")];
    let mut answered = Vec::new();
    let started = std::time::Instant::now();
    let mut r = 0usize;
    while started.elapsed() < Duration::from_secs(15) {
        let body: String = (0..100)
            .map(|i| format!(r#"{{"event":"flap {r} {i}"}}"#))
            .collect();
        let (st, _) = post(port, "/services/collector/event", &auth, body.as_bytes());
        if st == 200 {
            answered.push(r);
        }
        r += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(flapper.join().unwrap() >= 3, "the disk flapped");
    assert!(
        !answered.is_empty() && answered.len() < r,
        "{} of {r} answered 200",
        answered.len()
    );
    server
        .released
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let want: Vec<String> = answered
        .iter()
        .flat_map(|r| (0..100).map(move |i| format!("flap {r} {i}")))
        .collect();
    wait_for(
        Duration::from_secs(120),
        "every event answered 200 delivered",
        || {
            let have: std::collections::HashSet<String> =
                stalled_messages(&server).into_iter().collect();
            let n = want.iter().filter(|m| !have.contains(*m)).count();
            (n == 0)
                .then_some(())
                .ok_or(format!("{n} of {} missing", want.len()))
        },
    );
    let _ = agent;
}
