//! End-to-end checks of what operators get around the agent: `--log-format
//! json`, the shipped examples (checked with `petrel validate`), the
//! Grafana dashboard and Prometheus alert rules (every metric name in their
//! queries must be exported by a live agent), and the probes
//! (`/health/live`, `/health/ready`).

mod common;
mod pki;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;

/// The repository root (two levels above this crate).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Asserts that `stderr` is one JSON object per line, each with a string
/// `level` and a string `message`; returns the objects.
fn json_log_lines(stderr: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for line in stderr.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
            panic!("stderr line is not JSON ({e}): {line:?}\nstderr:\n{stderr}")
        });
        assert!(
            v.get("level").and_then(|l| l.as_str()).is_some(),
            "no string `level` in {line}"
        );
        assert!(
            v.get("message").and_then(|l| l.as_str()).is_some(),
            "no string `message` in {line}"
        );
        out.push(v);
    }
    out
}

fn messages(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|v| v["message"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn log_format_json_writes_one_object_per_stderr_line() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.log");
    append(&input, b"one\ntwo\n");
    let cfg = write_config(
        dir.path(),
        "app",
        &simple_config(input.to_str().expect("utf-8 path"), &out, ""),
    );
    let data = dir.path().join("data");
    let mut agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec!["--log-format".into(), "json".into()],
            ..Default::default()
        },
    );
    wait_lines(&out, 2);
    // A refused reload logs errors with the configuration problem in them;
    // they must stay one JSON object per line too.
    std::fs::write(&cfg, "sources: [\n").expect("break config");
    agent.signal(libc::SIGHUP);
    wait_for(MEDIUM, "the refused reload to be logged", || {
        let s = agent.stderr();
        if s.contains("reload refused") {
            Ok(())
        } else {
            Err(s)
        }
    });
    agent.stop();
    let stderr = agent.stderr();
    let lines = json_log_lines(&stderr);
    let msgs = messages(&lines);
    for expected in [
        "API listening on http://",
        "petrel started",
        "reload refused",
        "stopped",
    ] {
        assert!(
            msgs.iter().any(|m| m.contains(expected)),
            "no log message containing {expected:?} in:\n{stderr}"
        );
    }
    // Fields are at the top level, next to `message`, where collectors look.
    let started = lines
        .iter()
        .find(|v| v["message"] == "petrel started")
        .expect("`petrel started` record");
    assert_eq!(started["pipelines"], 1, "{started}");
    assert_eq!(started["level"], "INFO", "{started}");
    assert!(started["timestamp"].is_string(), "{started}");
    assert!(
        lines.iter().any(|v| v["level"] == "ERROR"),
        "the refused reload logs at ERROR:\n{stderr}"
    );
}

#[test]
fn log_format_json_keeps_a_panic_on_one_json_line() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.log");
    append(&input, b"before\nPOISON-EVENT\nafter\n");
    let cfg = write_config(
        dir.path(),
        "app",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: fields\n    add: {{ stage: one }}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
            input.display(),
            out.display()
        ),
    );
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--log-format".into(), "json".into()],
            // The agent's test hook: processing an event holding this text
            // panics (the pipeline isolates and drops that event).
            env: vec![
                ("PETREL_TEST_PANIC_ON".into(), "POISON-EVENT".into()),
                ("RUST_BACKTRACE".into(), "1".into()),
            ],
            ..Default::default()
        },
    );
    wait_lines(&out, 2);
    wait_for(MEDIUM, "the panic to be logged", || {
        let s = agent.stderr();
        if s.contains("panicked") {
            Ok(())
        } else {
            Err(s)
        }
    });
    agent.stop();
    let stderr = agent.stderr();
    let lines = json_log_lines(&stderr);
    let panic = lines
        .iter()
        .find(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("panicked"))
        })
        .unwrap_or_else(|| panic!("no panic record:\n{stderr}"));
    assert_eq!(panic["level"], "ERROR", "{panic}");
}

#[test]
fn log_format_json_reports_an_invalid_configuration_as_json() {
    let dir = tempdir();
    let cfg = write_config(dir.path(), "bad", "sources:\n  - type: nope\nsinks: []\n");
    let data = dir.path().join("data");
    let (code, _, stderr) = run_to_end(
        dir.path(),
        &[
            "run",
            "--config",
            cfg.to_str().expect("utf-8 path"),
            "--data-dir",
            data.to_str().expect("utf-8 path"),
            "--api-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
    );
    assert_eq!(code, Some(2), "stderr:\n{stderr}");
    let lines = json_log_lines(&stderr);
    assert!(
        lines.iter().any(|v| v["level"] == "ERROR"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("bad.yaml:"))),
        "no ERROR record naming bad.yaml:\n{stderr}"
    );
}

#[test]
fn log_format_text_stays_the_default() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.log");
    append(&input, b"one\n");
    let cfg = write_config(
        dir.path(),
        "app",
        &simple_config(input.to_str().expect("utf-8 path"), &out, ""),
    );
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_lines(&out, 1);
    agent.stop();
    let stderr = agent.stderr();
    assert!(stderr.contains("petrel started"), "{stderr}");
    assert!(
        stderr.lines().all(|l| !l.trim_start().starts_with('{')),
        "text logs by default:\n{stderr}"
    );
}

/// Every pipeline under `examples/` (and the commented example the Debian
/// package installs) passes `petrel validate`.
#[test]
fn shipped_examples_validate() {
    let root = repo_root();
    let dir = tempdir();
    let mut checked = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("examples/pipelines"))
        .expect("examples/pipelines")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        // `petrel test` files beside the pipelines (tests/petrel_test_cmd.rs).
        .filter(|p| !p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "examples/pipelines holds {files:?}");
    files.push(root.join("examples/quickstart.yaml"));
    // Installed as example.yaml.disabled (ignored in the directory); check
    // it under the name an operator gives it when enabling it.
    let packaged = dir.path().join("system.yaml");
    std::fs::copy(
        root.join("crates/petrel/debian/example.yaml.disabled"),
        &packaged,
    )
    .expect("copy the packaged example");
    files.push(packaged);
    for f in &files {
        let (code, stdout, stderr) = run_to_end(
            dir.path(),
            &["validate", "--config", f.to_str().expect("utf-8 path")],
        );
        assert_eq!(
            code,
            Some(0),
            "{} does not validate:\n{stdout}{stderr}",
            f.display()
        );
        checked.push(f.clone());
    }
    // The configuration directory layout: one pipeline per file.
    let conf_dir = root.join("examples/config-dir/pipelines");
    let (code, stdout, stderr) = run_to_end(
        dir.path(),
        &[
            "validate",
            "--config",
            conf_dir.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("2 pipeline(s) valid"), "{stdout}");
    // And a broken copy is caught, so this test can fail.
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(&files[0]).expect("read example");
    std::fs::write(&broken, text.replace("type: file", "type: flie")).expect("write");
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["validate", "--config", broken.to_str().expect("utf-8 path")],
    );
    assert_eq!(code, Some(2), "{stdout}");
}

/// PromQL words that are not metric names.
const PROMQL_WORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
];

/// Metric names a PromQL expression selects: label matchers, ranges,
/// grouping clauses, strings, numbers and function calls are removed and
/// the identifiers that remain are metric names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"#).expect("regex");
    let braces = regex::Regex::new(r"\{[^}]*\}").expect("regex");
    let ranges = regex::Regex::new(r"\[[^\]]*\]").expect("regex");
    let grouping =
        regex::Regex::new(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
            .expect("regex");
    let ident = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?").expect("regex");
    let e = strings.replace_all(expr, "\"\"");
    let e = braces.replace_all(&e, " ");
    let e = ranges.replace_all(&e, " ");
    let e = grouping.replace_all(&e, " ");
    let mut out = BTreeSet::new();
    for m in ident.captures_iter(&e) {
        let whole = m.get(0).expect("match");
        if m.get(1).is_some() {
            continue; // a function call
        }
        // Part of a number such as 1e3 or 0x10.
        let before = e[..whole.start()].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '$') {
            continue;
        }
        let w = whole.as_str().trim();
        if PROMQL_WORDS.contains(&w.to_ascii_lowercase().as_str()) {
            continue;
        }
        out.insert(w.to_string());
    }
    out
}

/// The `expr:` values of a Prometheus rule file (inline or `|` blocks).
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            let rest = rest.trim();
            if rest.starts_with('|') || rest.starts_with('>') {
                let mut block = String::new();
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    let ind = l.len() - l.trim_start().len();
                    if !l.trim().is_empty() && ind <= indent {
                        break;
                    }
                    block.push_str(l);
                    block.push('\n');
                    i += 1;
                }
                out.push(block);
                continue;
            }
            out.push(rest.to_string());
        }
        i += 1;
    }
    out
}

/// Every `expr` of a Grafana dashboard, and the metrics of its
/// `label_values(metric, label)` variables.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, val) in m {
                match (k.as_str(), val) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("definition", serde_json::Value::String(s)) => {
                        if let Some(arg) = s
                            .strip_prefix("label_values(")
                            .and_then(|r| r.rsplit_once(',').map(|(a, _)| a))
                        {
                            out.push(arg.to_string());
                        }
                    }
                    _ => dashboard_exprs(val, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// Sample names of an OpenMetrics/Prometheus text exposition.
fn exported_names(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
        .collect()
}

/// Labels a PromQL expression relies on: (label, Some(value)) for an
/// equality matcher on a constant, (label, None) for other matchers and
/// grouping clauses. `job` and `instance` (Prometheus's own) are left out.
fn label_refs(expr: &str) -> BTreeSet<(String, Option<String>)> {
    let braces = regex::Regex::new(r"\{([^}]*)\}").expect("regex");
    let matcher =
        regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)""#)
            .expect("regex");
    let grouping = regex::Regex::new(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)").expect("regex");
    let mut out = BTreeSet::new();
    for b in braces.captures_iter(expr) {
        for m in matcher.captures_iter(&b[1]) {
            let value = (&m[2] == "=" && !m[3].contains('$')).then(|| m[3].to_string());
            out.insert((m[1].to_string(), value));
        }
    }
    for g in grouping.captures_iter(expr) {
        for l in g[1].split(',').map(str::trim).filter(|l| !l.is_empty()) {
            out.insert((l.to_string(), None));
        }
    }
    out.retain(|(l, _)| l != "job" && l != "instance");
    out
}

/// Every (label, value) pair of the samples of an exposition.
fn exported_labels(metrics: &str) -> BTreeSet<(String, String)> {
    let pair = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)""#).expect("regex");
    let mut out = BTreeSet::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        if let Some((_, rest)) = line.split_once('{') {
            let block = rest.rsplit_once('}').map_or(rest, |(b, _)| b);
            for p in pair.captures_iter(block) {
                out.insert((p[1].to_string(), p[2].to_string()));
            }
        }
    }
    out
}

#[test]
fn label_extraction() {
    let refs = label_refs(
        r#"sum by (pipeline, le) (rate(m_bucket{instance=~"$i", kind="sink", reason!="filtered", p=~"$p"}[5m])) and on (instance) x"#,
    );
    let want: BTreeSet<(String, Option<String>)> = [
        ("kind", Some("sink")),
        ("le", None),
        ("p", None),
        ("pipeline", None),
        ("reason", None),
    ]
    .iter()
    .map(|(l, v)| (l.to_string(), v.map(str::to_string)))
    .collect();
    assert_eq!(refs, want);
}

#[test]
fn metric_name_extraction() {
    let names = metric_names(
        r#"sum by (instance, pipeline) (rate(petrel_a_total{x="y{z}", k=~"$v"}[$__rate_interval])) / on (instance) petrel_b > 64 * 1024 and deriv(c:d[5m]) > 1e3 unless up{job="petrel"} == 0"#,
    );
    let want: BTreeSet<String> = ["petrel_a_total", "petrel_b", "c:d", "up"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want);
}

#[test]
fn dashboard_and_alert_rules_use_only_exported_metrics() {
    let root = repo_root();
    let mut exprs = Vec::new();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("contrib/grafana/petrel.json")).expect("dashboard"),
    )
    .expect("dashboard is JSON");
    dashboard_exprs(&dash, &mut exprs);
    let dash_count = exprs.len();
    assert!(
        dash_count >= 10,
        "only {dash_count} queries in the dashboard"
    );
    let rules = std::fs::read_to_string(root.join("contrib/prometheus/alerts.yml")).expect("rules");
    let rule_exprs = rule_exprs(&rules);
    assert_eq!(
        rule_exprs.len(),
        rules.matches("- alert:").count(),
        "{rule_exprs:?}"
    );
    exprs.extend(rule_exprs);
    let mut wanted = BTreeSet::new();
    let mut wanted_labels = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric found in {e:?}");
        wanted.extend(names);
        wanted_labels.extend(label_refs(e));
    }
    // Made by Prometheus itself for every scrape target.
    wanted.remove("up");

    // A live agent, driven so that the metrics that appear only after
    // activity exist: a file read through a parser (parse failures), a
    // filter (discarded events), a file sink, an HTTP sink whose first
    // request fails (delivery loop metrics, retries), a reload; the TCP
    // source gets a connection; and more input than the memory limit
    // holds while that first request waits for its retry, so that the
    // file source pauses (the backpressure series appears at the first
    // pause).
    let http_addr = http_server_failing_once();
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.log");
    let mut text = b"{\"level\":\"info\"}\nnot json\n{\"level\":\"debug\"}\n".to_vec();
    for i in 0..20_000 {
        text.extend_from_slice(
            format!("{{\"level\":\"info\",\"n\":{i},\"pad\":\"{:x<48}\"}}\n", "").as_bytes(),
        );
    }
    append(&input, &text);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    // A TLS listener too: the certificate expiry gauge exists only for a
    // component that loaded a certificate.
    let tls_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let server = pki::Ca::new(dir.path(), "ca").issue("server", "127.0.0.1", 2, true);
    let cfg = write_config(
        dir.path(),
        "app",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n  - type: tcp\n    address: 127.0.0.1:{port}\n  - type: tcp\n    address: 127.0.0.1:{tls_port}\n    tls: {{ cert_file: \"{}\", key_file: \"{}\" }}\nprocessors:\n  - type: parse_json\n  - type: filter\n    exclude:\n      level: debug\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n  - type: http\n    url: \"http://{http_addr}/ingest\"\n    batch: {{ timeout_ms: 100 }}\n",
            input.display(),
            server.cert.display(),
            server.key.display(),
            out.display()
        ),
    );
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "1MiB".into()],
            ..Default::default()
        },
    );
    wait_lines(&out, 2);
    let _conn = wait_for(MEDIUM, "a connection to the tcp source", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())
    });
    let (status, body) = agent.http("POST", "/reload").expect("POST /reload");
    assert_eq!(status, 200, "{body}");
    wait_for(
        MEDIUM,
        "every dashboard and alert metric and label in /metrics",
        || {
            let text = agent.metrics();
            let have = exported_names(&text);
            let missing: Vec<&String> = wanted.iter().filter(|n| !have.contains(*n)).collect();
            if !missing.is_empty() {
                return Err(format!("missing {missing:?}; exported: {have:?}"));
            }
            // A misspelt label or value would make a panel empty and an
            // alert never fire.
            let labels = exported_labels(&text);
            let missing: Vec<_> = wanted_labels
                .iter()
                .filter(|(l, v)| match v {
                    Some(v) => !labels.contains(&(l.clone(), v.clone())),
                    None => !labels.iter().any(|(have, _)| have == l),
                })
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("labels not exported: {missing:?}"))
            }
        },
    );
    agent.stop();
}

/// An HTTP server on 127.0.0.1 that answers 500 to its first request and
/// 200 to every other one (keep-alive), for as long as the test runs.
fn http_server_failing_once() -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let failed = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let failed = failed.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().expect("clone stream");
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
                        if let Some((k, v)) = line.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let status = if failed.swap(true, Ordering::SeqCst) {
                        "200 OK"
                    } else {
                        "500 Internal Server Error"
                    };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    if w.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// `(status, body)` of `GET path`, or the error as text.
fn get(agent: &Agent, path: &str) -> Result<(u16, String), String> {
    agent.http_get(path).map_err(|e| format!("GET {path}: {e}"))
}

#[test]
fn a_failing_sink_fails_readiness_but_not_liveness() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    append(&input, b"one\ntwo\n");
    // Nothing listens there: every delivery fails.
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        "down",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: http\n    url: \"http://127.0.0.1:{port}/ingest\"\n    batch: {{ max_events: 10, timeout_ms: 100 }}\n",
            input.display()
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
    wait_for(LONG, "/health/ready to fail", || {
        match get(&agent, "/health/ready")? {
            (503, body) if body.contains("down/sink/http_0") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (code, body) = get(&agent, "/health").expect("GET /health");
    assert_eq!(code, 503, "the combined view keeps the sink: {body}");
    assert!(body.contains("down/sink/http_0"), "{body}");
    let v: serde_json::Value =
        serde_json::from_str(&get(&agent, "/health/ready").expect("GET /health/ready").1)
            .expect("JSON");
    assert_eq!(v["status"], "unhealthy", "{v}");
    assert_eq!(v["problems"][0]["component"], "down/sink/http_0", "{v}");
    // Restarting the agent would not bring the collector back.
    let (code, body) = get(&agent, "/health/live").expect("GET /health/live");
    assert_eq!(code, 200, "a down sink is not a reason to restart: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["status"], "ok", "{v}");
}

#[test]
fn a_stuck_worker_fails_liveness() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.log");
    append(&input, b"before\n");
    let cfg = write_config(
        dir.path(),
        "app",
        &simple_config(&input.display().to_string(), &out, ""),
    );
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--unhealthy-after".into(), "1".into()],
            // The agent's test hook: the worker processing an event
            // holding this text never returns.
            env: vec![("PETREL_TEST_HANG_ON".into(), "HANG-EVENT".into())],
            ..Default::default()
        },
    );
    wait_lines(&out, 1);
    for path in ["/health/live", "/health/ready", "/health"] {
        wait_for(MEDIUM, path, || match get(&agent, path)? {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }
    append(&input, b"HANG-EVENT\n");
    wait_for(LONG, "/health/live to fail", || {
        match get(&agent, "/health/live")? {
            (503, body) if body.contains("thread/petrel-worker-") => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    let (code, body) = get(&agent, "/health/live").expect("GET /health/live");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("does not return"), "says why: {body}");
    let (code, body) = get(&agent, "/health").expect("GET /health");
    assert_eq!(code, 503, "the combined view has it too: {body}");
    assert!(body.contains("thread/petrel-worker-"), "{body}");
}

#[test]
fn a_draining_agent_is_not_ready_but_live() {
    use std::sync::atomic::Ordering;
    let dir = tempdir();
    let input = dir.path().join("in.log");
    append(&input, b"one\ntwo\n");
    // Holds the deliveries: the shutdown has data to drain.
    let stalled = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let cfg = write_config(
        dir.path(),
        "drain",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: http\n    url: \"http://{addr}/ingest\"\n    batch: {{ max_events: 10, timeout_ms: 100 }}\n",
            input.display()
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--shutdown-timeout".into(), "60".into()],
            ..Default::default()
        },
    );
    wait_for(MEDIUM, "a delivery held", || {
        match stalled.held.load(Ordering::SeqCst) {
            0 => Err("none yet".to_string()),
            _ => Ok(()),
        }
    });
    let (code, body) = get(&agent, "/health/ready").expect("GET /health/ready");
    assert_eq!(code, 200, "running, the sink has not failed yet: {body}");
    agent.signal(libc::SIGTERM);
    wait_for(MEDIUM, "/health/ready to say stopping", || {
        match get(&agent, "/health/ready")? {
            (503, body) if body.contains("stopping") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (code, body) = get(&agent, "/health/live").expect("GET /health/live");
    assert_eq!(code, 200, "draining is progress: {body}");
    stalled.released.store(true, Ordering::SeqCst);
}
