//! The `loki` sink pushing into a real VictoriaLogs v1.52.1 (built by
//! scripts/victorialogs.sh), which takes the Loki push API in protobuf
//! (snappy) and JSON: exact counts per label set, the cardinality guard,
//! and entries older than what was already sent for their stream.

mod common;
mod server;
mod victorialogs;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use victorialogs::VictoriaLogs;

const LEVELS: [&str; 3] = ["info", "warn", "error"];
const APPS: [&str; 2] = ["web", "api"];

/// `n` JSON lines with a level, an app and a sequence number; returns the
/// count per (level, app).
fn write_app_log(path: &Path, n: usize) -> HashMap<(String, String), u64> {
    let mut counts = HashMap::new();
    let mut text = String::with_capacity(n * 80);
    for i in 0..n {
        // Not periodic in (level, app) together, so the counts differ.
        let level = LEVELS[(i * 7 / 5) % 3];
        let app = APPS[(i / 3) % 2];
        *counts
            .entry((level.to_string(), app.to_string()))
            .or_insert(0u64) += 1;
        text.push_str(&format!(
            "{{\"level\":\"{level}\",\"app\":\"{app}\",\"seq\":{i},\"msg\":\"request served\"}}\n"
        ));
    }
    std::fs::write(path, text).expect("write log");
    counts
}

fn loki_pipeline(log: &Path, processors: &str, sink: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n{processors}sinks:\n  - type: loki\n{sink}",
        log.display()
    )
}

fn wait_committed(data: &Path, log: &Path) {
    let size = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    wait_for(
        Duration::from_secs(120),
        "every line committed",
        || match checkpoint_offset(data, log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
}

/// Counts per `_stream` among the logs matching `filter`.
fn stream_counts(vl: &VictoriaLogs, filter: &str) -> HashMap<String, u64> {
    vl.query(&format!("{filter} | stats by (_stream) count() as n"))
        .into_iter()
        .map(|r| {
            (
                r["_stream"].as_str().unwrap_or_default().to_string(),
                r["n"].as_str().and_then(|n| n.parse().ok()).unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn exact_counts_per_label_set_in_protobuf_and_json() {
    const N: usize = 30_000;
    let vl = VictoriaLogs::start();
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let data = dir.path().join("data");
    let mut expected = Vec::new();
    for enc in ["protobuf", "json"] {
        let log = dir.path().join(format!("{enc}.log"));
        expected.push((enc, log.clone(), write_app_log(&log, N)));
        write_config(
            &conf,
            enc,
            &loki_pipeline(
                &log,
                "processors:\n  - type: parse_json\n",
                &format!(
                    "    endpoint: \"{}\"\n    path: /insert/loki/api/v1/push\n    encoding: {enc}\n    labels: {{ level: \"{{{{ level }}}}\", app: \"{{{{ app }}}}\", enc: {enc} }}\n    structured_metadata: {{ seq: \"{{{{ seq }}}}\" }}\n    remove_label_fields: true\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n",
                    vl.url()
                ),
            ),
        );
    }
    let agent = Agent::start(&conf, &data);
    for (_, log, _) in &expected {
        wait_committed(&data, log);
    }
    for (enc, _, counts) in &expected {
        let got = stream_counts(&vl, &format!("enc:={enc}"));
        let want: HashMap<String, u64> = counts
            .iter()
            .map(|((level, app), n)| {
                (
                    format!("{{app=\"{app}\",enc=\"{enc}\",level=\"{level}\"}}"),
                    *n,
                )
            })
            .collect();
        assert_eq!(got, want, "counts per label set ({enc})");
        // Every line once: as many distinct sequence numbers (structured
        // metadata) as lines.
        let uniq = vl.query(&format!("enc:={enc} | stats count_uniq(seq) as u"));
        assert_eq!(
            uniq[0]["u"].as_str(),
            Some(N.to_string().as_str()),
            "distinct lines ({enc})"
        );
        // The rest of the event is in the line (VictoriaLogs unpacks a
        // JSON line into fields, beside the stream labels; that the label
        // fields left the line is checked by the sink's unit tests).
        let one = vl.query(&format!("enc:={enc} seq:=17"));
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(one[0]["msg"], "request served", "{:?}", one[0]);
    }
    let sent: f64 = ["protobuf", "json"]
        .iter()
        .map(|enc| {
            agent.metric_or_zero(
                "petrel_component_sent_events_total",
                &component(enc, "sink", "loki_0"),
            )
        })
        .sum();
    assert_eq!(sent as usize, 2 * N, "sent events");
}

#[test]
fn the_cardinality_guard_bounds_streams_and_counts_the_overflow() {
    const IDS: usize = 50;
    const PER_ID: usize = 40;
    const MAX: usize = 10;
    let vl = VictoriaLogs::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    // A label from a field with unbounded values (a request id).
    let mut text = String::new();
    for round in 0..PER_ID {
        for id in 0..IDS {
            text.push_str(&format!("req-{id:03} round {round}\n"));
        }
    }
    std::fs::write(&log, text).unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "guard",
        &loki_pipeline(
            &log,
            "processors:\n  - type: parse_regex\n    pattern: '^(?P<rid>\\S+) '\n",
            &format!(
                "    endpoint: \"{}\"\n    path: /insert/loki/api/v1/push\n    labels: {{ rid: \"{{{{ rid }}}}\" }}\n    line_format: text\n    max_streams: {MAX}\n",
                vl.url()
            ),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    let counts = stream_counts(&vl, "*");
    let overflow = counts
        .get("{rid=\"petrel_overflow\"}")
        .copied()
        .unwrap_or(0);
    assert_eq!(counts.len(), MAX + 1, "streams: {counts:?}");
    assert_eq!(
        counts.values().sum::<u64>(),
        (IDS * PER_ID) as u64,
        "every line stored"
    );
    for (stream, n) in &counts {
        if !stream.contains("petrel_overflow") {
            assert_eq!(
                *n, PER_ID as u64,
                "{stream}: all its lines under its own labels"
            );
        }
    }
    assert_eq!(overflow, ((IDS - MAX) * PER_ID) as u64);
    let metric = agent.metric_or_zero(
        "petrel_component_stream_overflow_events_total",
        &component("guard", "sink", "loki_0"),
    );
    assert_eq!(metric as u64, overflow, "overflow counted");
}

#[test]
fn entries_older_than_their_stream_are_rewritten_or_dropped_and_counted() {
    let vl = VictoriaLogs::start();
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let data = dir.path().join("data");
    let line = |t: u32, what: &str| {
        format!("{{\"ts\":\"2024-03-01T10:00:{t:02}Z\",\"msg\":\"{what}\"}}\n")
    };
    let mut logs = Vec::new();
    for mode in ["rewrite_timestamp", "drop"] {
        let log = dir.path().join(format!("{mode}.log"));
        std::fs::write(&log, format!("{}{}", line(30, "first"), line(40, "second"))).unwrap();
        write_config(
            &conf,
            mode,
            &loki_pipeline(
                &log,
                "processors:\n  - type: parse_json\n  - type: parse_timestamp\n    field: ts\n",
                &format!(
                    "    endpoint: \"{}\"\n    path: /insert/loki/api/v1/push\n    labels: {{ mode: {mode} }}\n    out_of_order: {mode}\n    batch: {{ timeout_ms: 50 }}\n",
                    vl.url()
                ),
            ),
        );
        logs.push((mode, log));
    }
    let agent = Agent::start(&conf, &data);
    for (_, log) in &logs {
        wait_committed(&data, log);
    }
    // Later lines, one older than what each stream already got.
    for (_, log) in &logs {
        append(
            log,
            format!("{}{}", line(10, "late"), line(50, "third")).as_bytes(),
        );
    }
    for (_, log) in &logs {
        wait_committed(&data, log);
    }
    let times = |mode: &str| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = vl
            .query(&format!("mode:={mode} | fields _time, msg"))
            .into_iter()
            .map(|r| {
                // The JSON line is unpacked into fields.
                (
                    r["msg"].as_str().unwrap_or_default().to_string(),
                    r["_time"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        times("rewrite_timestamp"),
        vec![
            ("first".to_string(), "2024-03-01T10:00:30Z".to_string()),
            // Sent with the newest time its stream already had.
            ("late".to_string(), "2024-03-01T10:00:40Z".to_string()),
            ("second".to_string(), "2024-03-01T10:00:40Z".to_string()),
            ("third".to_string(), "2024-03-01T10:00:50Z".to_string()),
        ]
    );
    assert_eq!(
        times("drop"),
        vec![
            ("first".to_string(), "2024-03-01T10:00:30Z".to_string()),
            ("second".to_string(), "2024-03-01T10:00:40Z".to_string()),
            ("third".to_string(), "2024-03-01T10:00:50Z".to_string()),
        ]
    );
    for mode in ["rewrite_timestamp", "drop"] {
        let c = component(mode, "sink", "loki_0");
        assert_eq!(
            agent.metric_or_zero("petrel_component_out_of_order_events_total", &c),
            1.0,
            "{mode}: the late entry counted"
        );
    }
    let mut dropped = component("drop", "sink", "loki_0");
    dropped.push(("reason", "out_of_order"));
    assert_eq!(
        agent.metric_or_zero("petrel_component_discarded_events_total", &dropped),
        1.0,
        "the dropped entry counted as discarded"
    );
}

/// A server that answers every request `400` with `reason`, as Loki does
/// for entries it will never take; returns its address.
fn serve_400(reason: &'static str) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn);
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let answer = format!(
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{reason}",
                        reason.len()
                    );
                    if r.get_mut().write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn refused_entries_go_to_the_dead_letter_file_with_the_reason() {
    const N: usize = 500;
    let addr = serve_400("entry for stream '{app=\"web\"}' has timestamp too old");
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let text: String = (0..N).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&log, text).unwrap();
    let data = dir.path().join("data");
    let dead = dir.path().join("dead.ndjson");
    let cfg = write_config(
        dir.path(),
        "dead",
        &loki_pipeline(
            &log,
            "",
            &format!(
                "    endpoint: \"http://{addr}\"\n    labels: {{ app: web }}\n    line_format: text\n    dead_letter: \"{}\"\n",
                dead.display()
            ),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    // Set aside, then committed: the file does not wait forever.
    wait_committed(&data, &log);
    let records = json_lines(&dead);
    assert_eq!(records.len(), N, "every refused entry set aside");
    let mut lines: Vec<String> = records
        .iter()
        .map(|r| {
            assert_eq!(r["status"], 400);
            assert!(
                r["answer"].as_str().unwrap_or_default().contains("too old"),
                "{r}"
            );
            assert_eq!(r["record"]["labels"], "{app=\"web\"}");
            r["record"]["line"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    lines.sort_by_key(|l| l[5..].parse::<usize>().unwrap_or(usize::MAX));
    let want: Vec<String> = (0..N).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, want);
    let mut c = component("dead", "sink", "loki_0");
    c.push(("reason", "dead_letter"));
    assert_eq!(
        agent.metric_or_zero("petrel_component_discarded_events_total", &c),
        N as f64
    );
}

/// A JSON line without the fields a processor removed or `except_fields`
/// names, with a renamed one under its new name; structured metadata
/// named in `except_fields` is not sent either. VictoriaLogs unpacks the
/// line into fields, so what it stores is what the line held.
#[test]
fn removed_and_excluded_fields_are_absent_from_lines_and_metadata() {
    let vl = VictoriaLogs::start();
    let dir = tempdir();
    let log = dir.path().join("rm.log");
    write_app_log(&log, 30);
    let cfg = write_config(
        dir.path(),
        "rm",
        &loki_pipeline(
            &log,
            "processors:\n  - type: parse_json\n  - type: fields\n    remove: [host, msg]\n    rename: { file: path }\n",
            &format!(
                "    endpoint: \"{}\"\n    path: /insert/loki/api/v1/push\n    encoding: json\n    labels: {{ t: rm }}\n    structured_metadata: {{ seq: \"{{{{ seq }}}}\", lvl: \"{{{{ level }}}}\" }}\n    except_fields: [app, lvl, message]\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n",
                vl.url()
            ),
        ),
    );
    let data = dir.path().join("data");
    let _agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    let one = vl.query("t:=rm seq:=7");
    assert_eq!(one.len(), 1, "{one:?}");
    let r = &one[0];
    assert_eq!(r["path"], log.display().to_string(), "{r:?}");
    assert_eq!(r["level"], "info", "{r:?}");
    for gone in ["host", "file", "msg", "app", "lvl"] {
        assert!(r.get(gone).is_none(), "`{gone}` in {r:?}");
    }
}
