//! The `elasticsearch` sink against a real OpenSearch 2.19.6 (built from
//! Maven Central by scripts/opensearch.sh): no duplicates after `kill -9`,
//! refused documents set aside with the server's reason, nothing lost while
//! the server is down or answers 429, data streams.

mod common;
mod opensearch;
mod server;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use opensearch::{request, OpenSearch};

/// `n` numbered lines `line-0000000 ...` from `from`.
fn numbered(from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 24);
    for i in from..from + n {
        out.extend_from_slice(format!("line-{i:07} petrel\n").as_bytes());
    }
    out
}

fn es_config(log: &Path, sink: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: elasticsearch\n{sink}",
        log.display()
    )
}

fn sink_metric(agent: &Agent, name: &str) -> f64 {
    agent.metric_or_zero(name, &[("component_type", "elasticsearch")])
}

/// Waits until `index` holds `n` documents and the agent committed the
/// whole file, then checks that it stays at `n` with no message twice.
fn assert_exactly(os: &OpenSearch, index: &str, n: u64, data_dir: &Path, log: &Path) {
    let size = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    wait_for(
        Duration::from_secs(120),
        "every line committed",
        || match checkpoint_offset(data_dir, log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    let count = os.count(index);
    assert_eq!(count, n, "documents in {index}");
    let dups = os.repeated(index, "message.keyword");
    assert!(dups.is_empty(), "messages indexed twice: {dups:?}");
}

#[test]
fn kill_9_three_times_while_delivering_leaves_no_duplicate() {
    const N: usize = 200_000;
    let os = OpenSearch::start(&[]);
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, &numbered(0, N));
    let data = dir.path().join("data");
    // Small requests, so that each kill lands between many of them, some
    // answered and not yet committed.
    let cfg = write_config(
        dir.path(),
        "es",
        &es_config(
            &log,
            &format!(
                "    endpoints: [\"{}\"]\n    index: \"kill9-%Y\"\n    compression: gzip\n    batch: {{ max_events: 2000, timeout_ms: 200 }}\n",
                os.url()
            ),
        ),
    );
    let mut dups_seen = 0.0;
    for (round, at) in [20_000u64, 70_000, 130_000].into_iter().enumerate() {
        let mut agent = Agent::start(&cfg, &data);
        wait_for(Duration::from_secs(120), "documents arriving", || {
            let c = os.count("kill9-*");
            if c >= at {
                Ok(())
            } else {
                Err(format!("{c} documents"))
            }
        });
        dups_seen += sink_metric(&agent, "petrel_component_duplicates_skipped_total");
        agent.kill9();
        eprintln!(
            "kill -9 #{} at {} documents",
            round + 1,
            os.count("kill9-*")
        );
    }
    let agent = Agent::start(&cfg, &data);
    assert_exactly(&os, "kill9-*", N as u64, &data, &log);
    dups_seen += sink_metric(&agent, "petrel_component_duplicates_skipped_total");
    assert!(
        dups_seen > 0.0,
        "batches sent again after kill -9 must have met their own ids (409)"
    );
    assert_eq!(
        sink_metric(&agent, "petrel_component_discarded_events_total"),
        0.0
    );
}

#[test]
fn documents_refused_by_the_mapping_go_to_the_dead_letter_with_the_reason() {
    const N: usize = 20_000;
    // Requests of the default size (up to 5 MiB) are too large here: the
    // sink must split them on 413.
    let os = OpenSearch::start(&["http.max_content_length=256kb"]);
    os.ok(
        "PUT",
        "/typed",
        r#"{"mappings":{"properties":{"n":{"type":"long"},"k":{"type":"keyword"}}}}"#,
    );
    let dir = tempdir();
    let log = dir.path().join("app.json");
    let mut text = String::new();
    let mut bad = HashSet::new();
    for i in 0..N {
        if i % 100 == 37 {
            text.push_str(&format!("{{\"k\":\"{i}\",\"n\":\"not-a-number-{i}\"}}\n"));
            bad.insert(i.to_string());
        } else {
            text.push_str(&format!("{{\"k\":\"{i}\",\"n\":{i}}}\n"));
        }
    }
    append(&log, text.as_bytes());
    let dead = dir.path().join("dead.ndjson");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "es",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\nsinks:\n  - type: elasticsearch\n    endpoints: [\"{}\"]\n    index: typed\n    dead_letter: \"{}\"\n",
            log.display(),
            os.url(),
            dead.display()
        ),
    );
    let agent = Agent::start(&cfg, &data);
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    wait_for(
        Duration::from_secs(120),
        "every line committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    assert_eq!(os.count("typed"), (N - bad.len()) as u64);
    let records = json_lines(&dead);
    let mut set_aside = HashSet::new();
    for r in &records {
        assert_eq!(r["status"], 400, "{r}");
        assert_eq!(r["reason"], "refused by the endpoint");
        let answer = r["answer"].as_str().unwrap_or_default();
        assert!(
            answer.contains("mapper_parsing_exception") && answer.contains("[n]"),
            "the server's reason is kept: {answer}"
        );
        let k = r["record"]["k"].as_str().unwrap_or_default().to_string();
        assert!(
            r["record"]["n"]
                .as_str()
                .is_some_and(|n| n.starts_with("not-a-number")),
            "{r}"
        );
        assert!(set_aside.insert(k), "set aside once: {r}");
    }
    assert_eq!(
        set_aside, bad,
        "exactly the conflicting lines are set aside"
    );
    assert_eq!(
        sink_metric(&agent, "petrel_component_discarded_events_total"),
        bad.len() as f64
    );
    assert!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("error_type", "request_too_large")]
        ) > 0.0,
        "requests over http.max_content_length were answered 413 and split"
    );
}

#[test]
fn a_server_stopped_for_30_s_mid_stream_loses_nothing_within_the_memory_limit() {
    const FIRST: usize = 25_000;
    // About 6 MB written while the server is down: more than the memory
    // limit, so the pipeline must hold back on the file, not in memory.
    const WHILE_DOWN: usize = 250_000;
    const LIMIT: u64 = 4 << 20;
    let mut os = OpenSearch::start(&[]);
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, &numbered(0, FIRST));
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "es",
        &es_config(
            &log,
            &format!(
                "    endpoints: [\"{}\"]\n    index: outage\n    batch: {{ max_events: 1000, timeout_ms: 200 }}\n",
                os.url()
            ),
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec!["--memory-limit".into(), LIMIT.to_string()],
            ..Default::default()
        },
    );
    wait_for(Duration::from_secs(120), "the first part delivered", || {
        let c = os.count("outage");
        if c >= 10_000 {
            Ok(())
        } else {
            Err(format!("{c} documents"))
        }
    });
    os.stop();
    append(&log, &numbered(FIRST, WHILE_DOWN));
    let down = std::time::Instant::now();
    let mut peak = 0.0f64;
    while down.elapsed() < Duration::from_secs(30) {
        peak = peak.max(agent.metric_or_zero("petrel_memory_used_bytes", &[]));
        std::thread::sleep(Duration::from_millis(250));
    }
    // The limit plus one batch's misestimate (2 MiB), as for
    // every sink (tests/faults.rs).
    assert!(
        peak <= (LIMIT + (2 << 20)) as f64,
        "in-flight memory {peak} above the limit {LIMIT} while the server is down"
    );
    assert!(
        agent.metric_or_zero("petrel_backpressure_pauses_total", &[]) > 0.0,
        "the reader paused on the full budget"
    );
    assert!(
        sink_metric(&agent, "petrel_component_errors_total") > 0.0,
        "failed attempts are counted while the server is down"
    );
    os.restart();
    assert_exactly(&os, "outage", (FIRST + WHILE_DOWN) as u64, &data, &log);
}

/// A proxy in front of OpenSearch that answers 429 for every `every`-th
/// successful bulk item (the document was in fact indexed, like a lost
/// answer), so the sink must send those alone and meet its own ids.
struct Proxy {
    upstream: u16,
    /// Every this many successful items is answered 429.
    every: u64,
    /// The `Authorization` header every request must carry (else 401).
    auth: String,
    /// The first this many requests are answered 401 whatever they carry.
    deny_first: u64,
    requests: AtomicU64,
    seen: AtomicU64,
    rewritten: AtomicU64,
    unauthorized: AtomicU64,
}

fn serve_proxy(p: Arc<Proxy>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let p = p.clone();
            std::thread::spawn(move || proxy_conn(conn, &p));
        }
    });
    port
}

fn proxy_conn(conn: TcpStream, p: &Proxy) {
    let mut w = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut head = String::new();
        if r.read_line(&mut head).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = head.split_whitespace();
        let (method, path) = match (parts.next(), parts.next()) {
            (Some(m), Some(p)) => (m.to_string(), p.to_string()),
            _ => return,
        };
        let mut len = 0usize;
        let mut auth = String::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if k.eq_ignore_ascii_case("authorization") {
                    auth = v.trim().to_string();
                }
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        if p.requests.fetch_add(1, Ordering::SeqCst) < p.deny_first || auth != p.auth {
            p.unauthorized.fetch_add(1, Ordering::SeqCst);
            let text = r#"{"error":"unauthorized by the test proxy"}"#;
            let resp = format!(
                "HTTP/1.1 401 X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if w.write_all(resp.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let (status, mut text) = request(
            p.upstream,
            &method,
            &path,
            (!body.is_empty()).then_some(body.as_str()),
        );
        if status == 200 && path.starts_with("/_bulk") {
            if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(items) = v["items"].as_array_mut() {
                    for item in items.iter_mut() {
                        let Some(op) = item.as_object_mut().and_then(|o| o.values_mut().next())
                        else {
                            continue;
                        };
                        let ok = op["status"]
                            .as_u64()
                            .is_some_and(|s| (200..300).contains(&s));
                        if ok && p.seen.fetch_add(1, Ordering::SeqCst) % p.every == 0 {
                            op["status"] = 429.into();
                            op["error"] = serde_json::json!({
                                "type": "es_rejected_execution_exception",
                                "reason": "rejected by the test proxy"
                            });
                            p.rewritten.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    v["errors"] = true.into();
                }
                text = v.to_string();
            }
        }
        let resp = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn items_answered_429_are_sent_again_without_loss_or_duplicates_and_401_holds_the_data() {
    const N: usize = 20_000;
    let os = OpenSearch::start(&[]);
    // Basic auth of petrel:s3cret, the password from the environment.
    let proxy_state = Arc::new(Proxy {
        upstream: os.port,
        every: 10,
        auth: "Basic cGV0cmVsOnMzY3JldA==".into(),
        deny_first: 3,
        requests: AtomicU64::new(0),
        seen: AtomicU64::new(0),
        rewritten: AtomicU64::new(0),
        unauthorized: AtomicU64::new(0),
    });
    let proxy = serve_proxy(proxy_state.clone());
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, &numbered(0, N));
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "es",
        &es_config(
            &log,
            &format!(
                "    endpoints: [\"http://127.0.0.1:{proxy}\"]\n    index: throttled\n    mode: create\n    auth: {{ strategy: basic, user: petrel, password: \"${{ES_TEST_PASSWORD}}\" }}\n    batch: {{ max_events: 1000, timeout_ms: 200 }}\n"
            ),
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            env: vec![("ES_TEST_PASSWORD".into(), "s3cret".into())],
            ..Default::default()
        },
    );
    assert_exactly(&os, "throttled", N as u64, &data, &log);
    // The first answers were 401: the data waited and was sent again.
    assert_eq!(proxy_state.unauthorized.load(Ordering::SeqCst), 3);
    assert!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("error_type", "unauthorized")]
        ) >= 3.0
    );
    let r = proxy_state.rewritten.load(Ordering::SeqCst) as f64;
    assert!(r >= (N / 10) as f64, "the proxy answered 429 {r} times");
    let dups = sink_metric(&agent, "petrel_component_duplicates_skipped_total");
    assert!(
        dups >= r,
        "every item answered 429 (yet indexed) came back 409 when sent again: {dups} of {r}"
    );
    assert!(sink_metric(&agent, "petrel_component_retried_events_total") >= r);
    assert_eq!(
        sink_metric(&agent, "petrel_component_sent_events_total") + dups,
        N as f64,
        "each line indexed once or found indexed"
    );
}

#[test]
fn a_data_stream_gets_every_event_once_even_when_the_file_is_read_again() {
    const N: usize = 3_000;
    let os = OpenSearch::start(&[]);
    os.ok(
        "PUT",
        "/_index_template/petrel-logs",
        r#"{"index_patterns":["logs-petrel-*"],"priority":10,"data_stream":{},"template":{"settings":{"number_of_replicas":0}}}"#,
    );
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, &numbered(0, N));
    // A first endpoint where nothing listens: it is skipped while it fails.
    let dead = free_port();
    let sink = format!(
        "    endpoints: [\"http://127.0.0.1:{dead}\", \"{}\"]\n    mode: data_stream\n    data_stream: {{ dataset: petrel, namespace: test }}\n",
        os.url()
    );
    let cfg = write_config(dir.path(), "es", &es_config(&log, &sink));
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    assert_exactly(&os, "logs-petrel-test", N as u64, &data, &log);
    agent.stop();
    let ds = os.ok("GET", "/_data_stream/logs-petrel-test", "");
    assert_eq!(ds["data_streams"][0]["name"], "logs-petrel-test", "{ds}");
    // A new data directory forgets the offsets: the whole file is read
    // and sent again, and every document is recognised by its id.
    let data2 = dir.path().join("data2");
    let agent = Agent::start(&cfg, &data2);
    assert_exactly(&os, "logs-petrel-test", N as u64, &data2, &log);
    wait_metric(
        &agent,
        "petrel_component_duplicates_skipped_total",
        &[("component_type", "elasticsearch")],
        N as f64,
        false,
    );
    assert_eq!(
        sink_metric(&agent, "petrel_component_sent_events_total"),
        0.0
    );
    let (s, hit) = request(
        os.port,
        "POST",
        "/logs-petrel-test/_search",
        Some(r#"{"query":{"term":{"message.keyword":"line-0000042 petrel"}}}"#),
    );
    assert_eq!(s, 200, "{hit}");
    let v: serde_json::Value = serde_json::from_str(&hit).unwrap_or_default();
    let src = &v["hits"]["hits"][0]["_source"];
    assert_eq!(src["file"], log.display().to_string(), "{v}");
    assert!(src["@timestamp"].is_string(), "{v}");
}

/// A spool-backed source (`petrel pipe` into a spool directory, read by
/// `type: spool`) has stable ids too: the spool's identity, the segment
/// and the record's offset. Two `kill -9` while delivering, then exactly
/// one document per line.
#[test]
fn a_spool_backed_source_leaves_no_duplicate_after_kill_9() {
    const N: usize = 100_000;
    let os = OpenSearch::start(&[]);
    let dir = tempdir();
    let spool = dir.path().join("spool");
    let mut pipe = std::process::Command::new(bin())
        .args(["pipe", "--spool-dir"])
        .arg(&spool)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("petrel pipe");
    pipe.stdin
        .take()
        .expect("stdin")
        .write_all(&numbered(0, N))
        .expect("write to the pipe");
    assert!(pipe.wait().expect("pipe exit").success());
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "spool-es",
        &format!(
            "sources:\n  - type: spool\n    path: \"{}\"\nsinks:\n  - type: elasticsearch\n    endpoints: [\"{}\"]\n    index: spool9\n    batch: {{ max_events: 2000, timeout_ms: 200 }}\n",
            spool.display(),
            os.url()
        ),
    );
    let mut dups_seen = 0.0;
    for at in [15_000u64, 50_000] {
        let mut agent = Agent::start(&cfg, &data);
        wait_for(Duration::from_secs(120), "documents arriving", || {
            let c = os.count("spool9");
            if c >= at {
                Ok(())
            } else {
                Err(format!("{c} documents"))
            }
        });
        dups_seen += sink_metric(&agent, "petrel_component_duplicates_skipped_total");
        agent.kill9();
    }
    let agent = Agent::start(&cfg, &data);
    wait_for(
        Duration::from_secs(120),
        "every line indexed",
        || match os.count("spool9") {
            c if c >= N as u64 => Ok(()),
            c => Err(format!("{c} documents")),
        },
    );
    // What the agent still had in flight is answered (409 or 201) before
    // the count is final.
    wait_for(Duration::from_secs(60), "the spool delivered", || {
        let sent = sink_metric(&agent, "petrel_component_sent_events_total")
            + sink_metric(&agent, "petrel_component_duplicates_skipped_total");
        let inflight = sink_metric(&agent, "petrel_component_in_flight_batches");
        if sent > 0.0 && inflight == 0.0 {
            Ok(())
        } else {
            Err(format!("{sent} answered, {inflight} in flight"))
        }
    });
    assert_eq!(os.count("spool9"), N as u64, "documents");
    let dups = os.repeated("spool9", "message.keyword");
    assert!(dups.is_empty(), "messages indexed twice: {dups:?}");
    dups_seen += sink_metric(&agent, "petrel_component_duplicates_skipped_total");
    assert!(
        dups_seen > 0.0,
        "records read again after kill -9 must have met their own ids (409)"
    );
    assert!(spool.join("spool.id").exists(), "the spool has an identity");
}

/// The documents as the `ecs` layout names them (Filebeat's
/// `log.file.path`, `host.name`, `@timestamp`), without what a processor
/// removed, with what it renamed under its new name, and without what
/// `except_fields` names: OpenSearch stores exactly that.
#[test]
fn documents_in_the_ecs_layout_without_removed_fields() {
    let os = OpenSearch::start(&[]);
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, &numbered(0, 20));
    let sink = format!(
        "    endpoints: [\"{}\"]\n    index: ecs-test\n    metadata: {{ layout: ecs }}\n    except_fields: [tmp]\n",
        os.url()
    );
    let cfg = es_config(&log, &sink).replace(
        "sinks:\n",
        "processors:\n  - type: fields\n    rename: { message: text }\n    add: { tmp: x, env: prod }\n  - type: fields\n    remove: [host]\nsinks:\n",
    );
    let cfg = write_config(dir.path(), "ecs", &cfg);
    let data = dir.path().join("data");
    let _agent = Agent::start(&cfg, &data);
    let size = std::fs::metadata(&log).unwrap().len();
    wait_for(
        Duration::from_secs(120),
        "every line committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    os.ok("POST", "/ecs-test/_refresh", "");
    let (s, hit) = request(
        os.port,
        "POST",
        "/ecs-test/_search",
        Some(r#"{"query":{"term":{"text.keyword":"line-0000007 petrel"}}}"#),
    );
    assert_eq!(s, 200, "{hit}");
    let v: serde_json::Value = serde_json::from_str(&hit).unwrap_or_default();
    let src = v["hits"]["hits"][0]["_source"].clone();
    let mut keys: Vec<String> = src
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    assert_eq!(keys, ["@timestamp", "env", "log", "text"], "{v}");
    assert_eq!(src["log"]["file"]["path"], log.display().to_string(), "{v}");
    assert_eq!(src["text"], "line-0000007 petrel", "{v}");
    // The mapping OpenSearch made: `log.file.path` an object path.
    let m = os.ok("GET", "/ecs-test/_mapping", "");
    assert!(
        m["ecs-test"]["mappings"]["properties"]["log"]["properties"]["file"]["properties"]["path"]
            .is_object(),
        "{m}"
    );
}
