//! End-to-end tests of the HTTP sink against a real HTTP server (axum on
//! hyper) started by the test on 127.0.0.1.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::*;

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// Decoded bodies of accepted requests.
    bodies: Mutex<Vec<Vec<u8>>>,
    /// Arrival time of every request.
    times: Mutex<Vec<Instant>>,
    /// Requests so far.
    requests: AtomicUsize,
    /// Authorization headers seen.
    auth: Mutex<Vec<String>>,
}

/// How the server answers: `fail_first` requests get `status` (with
/// `Retry-After: retry_after` if set), later ones 200.
#[derive(Clone, Default)]
struct Behaviour {
    fail_first: usize,
    status: u16,
    retry_after: Option<u64>,
    /// Every request gets `status` until then.
    fail_until: Option<Instant>,
    /// Requests whose body contains this text get 413.
    refuse_marker: Option<&'static str>,
}

fn decode(headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    match headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
    {
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .expect("valid gzip body");
            out
        }
        Some("zstd") => zstd::stream::decode_all(body).expect("valid zstd body"),
        _ => body.to_vec(),
    }
}

/// Runs a server on `addr` (port 0: any) in its own thread; returns its
/// address. It lives until the test process ends.
fn serve(addr: SocketAddr, behaviour: Behaviour, seen: Arc<Seen>) -> SocketAddr {
    let listener = std::net::TcpListener::bind(addr).expect("bind test server");
    listener.set_nonblocking(true).unwrap();
    let local = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new().route(
                "/ingest",
                post(move |headers: HeaderMap, body: Bytes| {
                    let seen = seen.clone();
                    let b = behaviour.clone();
                    async move {
                        seen.times.lock().unwrap().push(Instant::now());
                        if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok())
                        {
                            seen.auth.lock().unwrap().push(a.to_string());
                        }
                        let n = seen.requests.fetch_add(1, Ordering::SeqCst);
                        let plain = decode(&headers, &body);
                        if let Some(m) = b.refuse_marker {
                            if plain.windows(m.len()).any(|w| w == m.as_bytes()) {
                                return (StatusCode::PAYLOAD_TOO_LARGE, "record too large")
                                    .into_response();
                            }
                        }
                        if n < b.fail_first || b.fail_until.is_some_and(|t| Instant::now() < t) {
                            let mut r: Response = (
                                StatusCode::from_u16(b.status).unwrap(),
                                format!("refused on purpose, request {n}"),
                            )
                                .into_response();
                            if let Some(s) = b.retry_after {
                                r.headers_mut()
                                    .insert("retry-after", s.to_string().parse().unwrap());
                            }
                            return r;
                        }
                        seen.bodies.lock().unwrap().push(plain);
                        StatusCode::OK.into_response()
                    }
                }),
            );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    local
}

fn lines_file(dir: &std::path::Path, n: usize) -> (std::path::PathBuf, Vec<String>) {
    let p = dir.join("app.log");
    let lines: Vec<String> = (0..n).map(|i| format!("http line {i:06}")).collect();
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&p, text).unwrap();
    (p, lines)
}

fn http_config(include: &std::path::Path, addr: SocketAddr, extra: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n\
         sinks:\n  - type: http\n    url: \"http://{addr}/ingest\"\n    batch: {{ max_events: 500, timeout_ms: 200 }}\n{extra}",
        include.display()
    )
}

/// Messages received, from ndjson or JSON-array bodies.
fn received_messages(seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    for b in seen.bodies.lock().unwrap().iter() {
        let values: Vec<serde_json::Value> = if b.first() == Some(&b'[') {
            serde_json::from_slice(b).expect("JSON array body")
        } else {
            b.split(|c| *c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).expect("ndjson line"))
                .collect()
        };
        for v in values {
            out.push(v["message"].as_str().expect("message field").to_string());
        }
    }
    out
}

/// Waits until `app`'s committed offset is `len`.
fn wait_checkpoint_at(data: &std::path::Path, app: &std::path::Path, len: u64) {
    wait_for(
        LONG,
        "the checkpoint at the end",
        || match checkpoint_offset(data, app) {
            Some(o) if o == len => Ok(()),
            o => Err(format!("{o:?}")),
        },
    );
}

fn wait_all(seen: &Seen, lines: &[String]) {
    wait_for(LONG, "every line at the HTTP server", || {
        let got = received_messages(seen);
        let set: std::collections::HashSet<&String> = got.iter().collect();
        let missing = lines.iter().filter(|l| !set.contains(l)).count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of {} missing", lines.len()))
        }
    });
}

#[test]
fn delivers_gzip_ndjson_with_headers() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 3000);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            fail_first: 0,
            status: 200,
            retry_after: None,
            ..Default::default()
        },
        seen.clone(),
    );
    let cfg = write_config(
        dir.path(),
        "gz",
        &http_config(&app, addr, "    compression: gzip\n    headers: { Authorization: \"Bearer ${PETREL_TEST_TOKEN}\" }\n"),
    );
    std::env::set_var("PETREL_TEST_TOKEN", "s3cret");
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_all(&seen, &lines);
    assert!(seen
        .auth
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Bearer s3cret"));
    assert!(
        seen.requests.load(Ordering::SeqCst) >= 6,
        "3000 events in requests of at most 500"
    );
    assert_eq!(
        received_messages(&seen).len(),
        3000,
        "no duplicates without failures"
    );
}

#[test]
fn retries_500_then_succeeds_zstd_json_array() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 1000);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            fail_first: 3,
            status: 500,
            retry_after: None,
            ..Default::default()
        },
        seen.clone(),
    );
    let cfg = write_config(
        dir.path(),
        "five",
        &http_config(
            &app,
            addr,
            "    compression: zstd\n    encoding: json_array\n",
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_all(&seen, &lines);
    let retried = agent.metric_or_zero(
        "petrel_component_retried_events_total",
        &component("five", "sink", "http_0"),
    );
    assert!(retried > 0.0, "the 500 answers were retried");
}

#[test]
fn honours_retry_after_on_429() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 100);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            fail_first: 1,
            status: 429,
            retry_after: Some(2),
            ..Default::default()
        },
        seen.clone(),
    );
    let cfg = write_config(dir.path(), "tmr", &http_config(&app, addr, ""));
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_all(&seen, &lines);
    let times = seen.times.lock().unwrap().clone();
    assert!(times.len() >= 2);
    let gap = times[1] - times[0];
    assert!(
        gap >= Duration::from_millis(1900),
        "retried after {gap:?}, Retry-After said 2 s"
    );
}

#[test]
fn connection_refused_then_server_up() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 500);
    // Reserve a port, then leave it closed while the agent starts.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = write_config(dir.path(), "late", &http_config(&app, addr, ""));
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let sink = component("late", "sink", "http_0");
    // A closed port is said to be one: `connection_refused`, not a
    // generic failure that reads the same as a timeout.
    wait_for(LONG, "a refused connection", || {
        match agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("pipeline", "late"), ("error_type", "connection_refused")],
        ) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} failures")),
        }
    });
    assert_eq!(
        agent.metric_or_zero("petrel_component_sent_events_total", &sink),
        0.0
    );
    let seen = Arc::new(Seen::default());
    serve(
        addr,
        Behaviour {
            fail_first: 0,
            status: 200,
            retry_after: None,
            ..Default::default()
        },
        seen.clone(),
    );
    wait_all(&seen, &lines);
}

#[test]
fn refused_records_go_to_the_dead_letter_file() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 1000);
    // One record the endpoint refuses with 413; the others are fine.
    let poison = "http line 000377";
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            status: 200,
            refuse_marker: Some(poison),
            ..Default::default()
        },
        seen.clone(),
    );
    let dead = dir.path().join("dead.ndjson");
    let cfg = write_config(
        dir.path(),
        "dl",
        &http_config(
            &app,
            addr,
            &format!("    dead_letter: \"{}\"\n", dead.display()),
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let others: Vec<String> = lines.iter().filter(|l| *l != poison).cloned().collect();
    wait_all(&seen, &others);
    wait_for(LONG, "the dead letter", || {
        let n = count_lines(&dead);
        (n == 1).then_some(()).ok_or(format!("{n} lines"))
    });
    let v: serde_json::Value = serde_json::from_slice(&read_lines(&dead)[0]).unwrap();
    assert_eq!(v["record"]["message"], poison, "{v}");
    assert_eq!(v["status"], 413, "{v}");
    assert!(!received_messages(&seen).iter().any(|m| m == poison));
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &[("pipeline", "dl"), ("reason", "dead_letter")],
        ),
        1.0
    );
    // Everything else was delivered, and the file is committed to its end.
    let len = std::fs::metadata(&app).unwrap().len();
    wait_checkpoint_at(&dir.path().join("data"), &app, len);
}

#[test]
fn unauthorized_data_waits_and_is_delivered_when_the_token_works() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 500);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            status: 401,
            fail_until: Some(Instant::now() + Duration::from_secs(20)),
            ..Default::default()
        },
        seen.clone(),
    );
    let cfg = write_config(dir.path(), "auth", &http_config(&app, addr, ""));
    let data = dir.path().join("data");
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec!["--unhealthy-after".into(), "2".into()],
            ..Default::default()
        },
    );
    wait_for(LONG, "401 answers counted", || {
        let n = agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("pipeline", "auth"), ("error_type", "unauthorized")],
        );
        (n >= 2.0).then_some(()).ok_or(format!("{n}"))
    });
    // While the endpoint refuses, nothing is committed.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        checkpoint_offset(&data, &app).unwrap_or(0),
        0,
        "offsets must not be committed while the endpoint answers 401"
    );
    assert!(
        agent.stderr().contains("answers 401 (unauthorized)"),
        "a loud error"
    );
    let (code, body) = agent.http_get("/health").unwrap();
    assert_eq!(
        code, 503,
        "a sink failing for longer than --unhealthy-after: {body}"
    );
    assert!(
        body.contains("auth/sink/http_0") && body.contains("401"),
        "{body}"
    );
    wait_all(&seen, &lines);
    assert_eq!(received_messages(&seen).len(), 500, "each line once");
    wait_for(LONG, "/health healthy again", || {
        match agent.http_get("/health") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let len = std::fs::metadata(&app).unwrap().len();
    wait_for(
        LONG,
        "the checkpoint at the end",
        || match checkpoint_offset(&data, &app) {
            Some(o) if o == len => Ok(()),
            o => Err(format!("{o:?}")),
        },
    );
}

#[test]
fn a_refused_record_without_dead_letter_is_retried_not_committed() {
    let dir = tempdir();
    let (app, _lines) = lines_file(dir.path(), 10);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            fail_first: usize::MAX,
            status: 400,
            ..Default::default()
        },
        seen.clone(),
    );
    let cfg = write_config(dir.path(), "rej", &http_config(&app, addr, ""));
    let data = dir.path().join("data");
    let agent = Agent::start(&cfg, &data);
    wait_for(LONG, "refusals counted", || {
        match agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("pipeline", "rej"), ("error_type", "rejected")],
        ) {
            n if n >= 2.0 => Ok(()),
            n => Err(format!("{n} counted")),
        }
    });
    assert!(
        agent.stderr().contains("configure `dead_letter`"),
        "the log says what to do"
    );
    assert_eq!(
        checkpoint_offset(&data, &app).unwrap_or(0),
        0,
        "nothing committed"
    );
    assert!(seen.requests.load(Ordering::SeqCst) > 1, "retried");
}

/// A dead-letter disk that fills: every line in the file stays whole JSON
/// (before, the write that hit ENOSPC left a fragment and the retry
/// appended the whole record to it on the same line), the records wait
/// with a loud error and `/health` says why, and once there is room each
/// refused record is in the file exactly once.
#[test]
fn a_full_dead_letter_disk_holds_records_and_never_tears_a_line() {
    const N: usize = 200;
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let pad = "x".repeat(900);
    let lines: Vec<String> = (0..N).map(|i| format!("refuse me {i:06} {pad}")).collect();
    std::fs::write(&app, lines.join("\n") + "\n").unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            status: 200,
            refuse_marker: Some("refuse me"),
            ..Default::default()
        },
        seen.clone(),
    );
    // Room for about 50 of the 200 dead letters (~1.1 KB each).
    let disk = dir.path().join("dl");
    let tmpfs = Tmpfs::mount(&disk, "64k");
    let dead = disk.join("dead.ndjson");
    let cfg = write_config(
        dir.path(),
        "full",
        &http_config(
            &app,
            addr,
            &format!("    dead_letter: \"{}\"\n", dead.display()),
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--unhealthy-after".into(), "1".into()],
            ..Default::default()
        },
    );
    let failed = [("pipeline", "full"), ("error_type", "dead_letter_failed")];
    wait_for(
        LONG,
        "a dead-letter write failing on the full disk",
        || match agent.metric_or_zero("petrel_component_errors_total", &failed) {
            n if n >= 2.0 => Ok(()),
            n => Err(format!("{n} failures")),
        },
    );
    let whole = |what: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read(&dead).unwrap_or_default();
        assert!(
            text.is_empty() || text.ends_with(b"\n"),
            "{what}: the dead-letter file ends in a fragment"
        );
        split_lines(&text)
            .iter()
            .map(|l| {
                serde_json::from_slice(l).unwrap_or_else(|e| {
                    panic!(
                        "{what}: a torn dead-letter line ({e}): {}",
                        String::from_utf8_lossy(&l[..l.len().min(200)])
                    )
                })
            })
            .collect()
    };
    let held = whole("while the disk is full");
    assert!(held.len() < N, "{} lines fit on a 64k disk?", held.len());
    wait_for(LONG, "/health to name the dead-letter file", || {
        let (status, body) = agent.http_get("/health").map_err(|e| e.to_string())?;
        if status == 503 && body.contains("dead letter") {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    });
    assert!(
        agent.stderr().contains("cannot write the dead letter file"),
        "no loud error"
    );
    // Nothing was committed past what is set aside: the file's checkpoint
    // is short of its end while records wait.
    let len = std::fs::metadata(&app).unwrap().len();
    assert!(checkpoint_offset(&dir.path().join("data"), &app).is_none_or(|o| o < len));
    // Room again: every refused record arrives, once.
    let st = std::process::Command::new("mount")
        .args(["-o", "remount,size=8m"])
        .arg(&disk)
        .status()
        .expect("remount");
    assert!(st.success(), "remount the tmpfs larger");
    wait_for(LONG, "every refused record in the dead-letter file", || {
        let n = count_lines(&dead);
        (n >= N).then_some(()).ok_or(format!("{n} of {N}"))
    });
    let all = whole("after the disk had room");
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    for v in &all {
        let m = v["record"]["message"]
            .as_str()
            .expect("record.message")
            .to_string();
        *counts.entry(m).or_default() += 1;
    }
    for l in &lines {
        assert_eq!(
            counts.get(l).copied(),
            Some(1),
            "record `{}` in the file",
            &l[..16]
        );
    }
    assert_eq!(all.len(), N);
    assert!(received_messages(&seen).is_empty());
    wait_checkpoint_at(&dir.path().join("data"), &app, len);
    drop(agent);
    drop(tmpfs);
}

/// `retry: {max_attempts}`: a store that answers 500 forever gets each
/// request that many times; then its records are set aside in the dead
/// letter file with the reason, counted, and the source commits past
/// them and goes on (nothing dropped silently, nothing held forever).
#[test]
fn retry_limits_end_in_the_dead_letter_and_the_source_goes_on() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 300);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour {
            status: 500,
            fail_until: Some(Instant::now() + Duration::from_secs(3600)),
            ..Default::default()
        },
        seen.clone(),
    );
    let dead = dir.path().join("dead.ndjson");
    let cfg = write_config(
        dir.path(),
        "lim",
        &http_config(
            &app,
            addr,
            &format!(
                "    dead_letter: \"{}\"\n    retry: {{ max_attempts: 3, max_duration: 1h }}\n",
                dead.display()
            ),
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "every record in the dead letter", || {
        let n = count_lines(&dead);
        (n == lines.len()).then_some(()).ok_or(format!("{n} lines"))
    });
    let len = std::fs::metadata(&app).unwrap().len();
    wait_checkpoint_at(&dir.path().join("data"), &app, len);
    let mut set_aside = Vec::new();
    for l in read_lines(&dead) {
        let v: serde_json::Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["reason"], "retries exhausted", "{v}");
        let answer = v["answer"].as_str().unwrap_or_default();
        assert!(answer.contains("3 attempts"), "{v}");
        assert!(answer.contains("500"), "the last failure is named: {v}");
        set_aside.push(v["record"]["message"].as_str().unwrap().to_string());
    }
    set_aside.sort();
    assert_eq!(set_aside, lines);
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &[("pipeline", "lim"), ("reason", "retries_exhausted")],
        ),
        lines.len() as f64
    );
    // Three attempts per request, no more: 300 records in requests of at
    // most 500 are one request (or a few, cut by the linger).
    let requests = seen.requests.load(Ordering::SeqCst);
    assert!(requests % 3 == 0 && requests >= 3, "{requests} requests");
    // Lines appended later go the same way: the source was not stopped.
    append(&app, b"http line after\n");
    wait_for(LONG, "the later line in the dead letter", || {
        let n = count_lines(&dead);
        (n == lines.len() + 1)
            .then_some(())
            .ok_or(format!("{n} lines"))
    });
}

/// `retry` limits need a dead letter file: nothing is dropped silently.
#[test]
fn retry_limits_without_a_dead_letter_are_refused() {
    let dir = tempdir();
    let (app, _) = lines_file(dir.path(), 1);
    let cfg = write_config(
        dir.path(),
        "nodl",
        &http_config(
            &app,
            "127.0.0.1:9".parse().unwrap(),
            "    retry: { max_attempts: 3 }\n",
        ),
    );
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["validate", "--config", &cfg.to_string_lossy()],
    );
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("add `dead_letter:"), "{stdout}");
}

/// Metadata removed or renamed by a processor is absent from the
/// records, and `except_fields` leaves out what it names.
#[test]
fn removed_and_renamed_fields_are_absent_from_the_records() {
    let dir = tempdir();
    let (app, lines) = lines_file(dir.path(), 50);
    let seen = Arc::new(Seen::default());
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        Behaviour::default(),
        seen.clone(),
    );
    let cfg = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: fields\n    rename: {{ file: path }}\n    remove: [host]\n    add: {{ env: prod, tmp: x }}\nsinks:\n  - type: http\n    url: \"http://{addr}/ingest\"\n    batch: {{ max_events: 500, timeout_ms: 200 }}\n    except_fields: [tmp]\n",
        app.display()
    );
    let cfg = write_config(dir.path(), "rm", &cfg);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_all(&seen, &lines);
    let app_path = app.to_string_lossy().into_owned();
    for b in seen.bodies.lock().unwrap().iter() {
        for l in b.split(|c| *c == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
            keys.sort();
            assert_eq!(keys, ["env", "message", "path"], "{v}");
            assert_eq!(v["path"], app_path.as_str(), "{v}");
        }
    }
}
