//! End-to-end tests of the `remap` processor (VRL) through the real
//! binary: real programs on events read from files (Apache and nginx
//! lines, grok, logfmt, JSON with nested assignment, `abort`, runtime
//! errors with `drop_on_error` both ways), exact output and counters; bad
//! input (a line that is not UTF-8, a 10 MB line, a program building a
//! huge value) gives counted errors, never a crash; `petrel validate`
//! reports a VRL compile error at its line and column and exits 2.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

/// Writes pipeline `name` (in `dir/conf`) reading `dir/name.log` from the
/// beginning through one `remap` with `keys` (YAML lines indented by four
/// spaces) into `dir/name.ndjson`; returns the output path.
fn pipeline(dir: &Path, name: &str, input: &[u8], keys: &str, source_keys: &str) -> PathBuf {
    let input_path = dir.join(format!("{name}.log"));
    std::fs::write(&input_path, input).expect("write input");
    let out = dir.join(format!("{name}.ndjson"));
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).expect("conf dir");
    write_config(
        &conf,
        name,
        &format!(
            "sources:\n  - type: file\n    id: in\n    include: [\"{}\"]\n    read_from: beginning\n{source_keys}processors:\n  - type: remap\n    id: vrl\n    timezone: UTC\n{keys}sinks:\n  - type: file\n    id: out\n    path: \"{}\"\n    encoding: ndjson\n",
            input_path.display(),
            out.display()
        ),
    );
    out
}

/// `source: |` with the program's lines.
fn source(program: &str) -> String {
    let mut s = String::from("    source: |\n");
    for l in program.lines() {
        s.push_str("      ");
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// The records of an ndjson file without `host` and `file` (the same on
/// every record).
fn records(path: &Path) -> Vec<Value> {
    json_lines(path)
        .into_iter()
        .map(|mut v| {
            if let Value::Object(m) = &mut v {
                m.remove("file");
                if m.get("host").and_then(Value::as_str) == Some(hostname().as_str()) {
                    m.remove("host");
                }
            }
            v
        })
        .collect()
}

fn counter(agent: &Agent, p: &str, name: &str, label: (&str, &str)) -> f64 {
    let mut l = component(p, "processor", "vrl");
    l.push(label);
    agent.metric_or_zero(name, &l)
}

#[test]
fn real_programs_on_real_lines_exact_output_and_counters() {
    let dir = tempdir();
    let d = dir.path();
    let apache = pipeline(
        d,
        "apache",
        b"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326\n",
        &source(". = merge(., parse_apache_log!(.message, \"common\"))"),
        "",
    );
    let nginx = pipeline(
        d,
        "nginx",
        b"172.17.0.1 - alice [01/Apr/2021:12:02:31 +0000] \"POST /not-found HTTP/1.1\" 404 153 \"http://localhost/somewhere\" \"Mozilla/5.0\" \"2.75\"\n",
        &source(". = merge(., parse_nginx_log!(.message, \"combined\"))\ndel(.message)"),
        "",
    );
    let grok = pipeline(
        d,
        "grok",
        b"2020-10-02T23:22:12.223222Z info Hello world\n",
        &source(
            ". = merge(., parse_grok!(.message, \"%{TIMESTAMP_ISO8601:ts} %{LOGLEVEL:level} %{GREEDYDATA:msg}\"))",
        ),
        "",
    );
    let logfmt = pipeline(
        d,
        "logfmt",
        b"level=warn msg=\"disk full\" pct=97\n",
        &source(". = merge(., parse_logfmt!(.message))\n.pct = to_int!(.pct)"),
        "",
    );
    let json = pipeline(
        d,
        "json",
        b"{\"level\":\"info\",\"user\":{\"id\":7}}\n{\"level\":\"debug\"}\n",
        &source(
            ". = merge(., object!(parse_json!(.message)))\n.level = upcase!(.level)\n.user.name = \"u\" + to_string!(.user.id)\nif .level == \"DEBUG\" { abort }",
        ),
        "",
    );
    let keep = pipeline(
        d,
        "err_keep",
        b"12\nnot a number\n",
        &source(".n = to_int!(.message)"),
        "",
    );
    let drop = pipeline(
        d,
        "err_drop",
        b"12\nnot a number\n",
        &format!(
            "{}    drop_on_error: true\n",
            source(".n = to_int!(.message)")
        ),
        "",
    );
    let conf = d.join("conf");
    let mut agent = Agent::start(&conf, &d.join("data"));
    for (out, n) in [
        (&apache, 1),
        (&nginx, 1),
        (&grok, 1),
        (&logfmt, 1),
        (&json, 1),
        (&keep, 2),
        (&drop, 1),
    ] {
        wait_lines(out, n);
    }
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &[
            ("pipeline", "err_drop"),
            ("component_kind", "processor"),
            ("component_id", "vrl"),
            ("error_type", "remap"),
        ],
        1.0,
        false,
    );
    assert_eq!(
        counter(
            &agent,
            "json",
            "petrel_component_discarded_events_total",
            ("reason", "remap_abort")
        ),
        1.0
    );
    assert_eq!(
        counter(
            &agent,
            "err_keep",
            "petrel_component_errors_total",
            ("error_type", "remap")
        ),
        1.0
    );
    assert_eq!(
        counter(
            &agent,
            "err_keep",
            "petrel_component_discarded_events_total",
            ("reason", "remap_error")
        ),
        0.0
    );
    assert_eq!(
        counter(
            &agent,
            "err_drop",
            "petrel_component_discarded_events_total",
            ("reason", "remap_error")
        ),
        1.0
    );
    for p in ["apache", "nginx", "grok", "logfmt"] {
        assert_eq!(
            counter(
                &agent,
                p,
                "petrel_component_errors_total",
                ("error_type", "remap")
            ),
            0.0,
            "{p}"
        );
    }
    agent.stop();

    assert_eq!(
        records(&apache),
        vec![json!({
            // parse_apache_log's own `message` (the request) replaces it.
            "message": "GET /apache_pb.gif HTTP/1.0",
            "timestamp": "2000-10-10T20:55:36.000000000Z",
            "host": "127.0.0.1", "method": "GET", "path": "/apache_pb.gif",
            "protocol": "HTTP/1.0", "size": 2326, "status": 200, "user": "frank"
        })]
    );
    assert_eq!(
        records(&nginx),
        vec![json!({
            // A deleted message is not written (it used to be `null`).
            "timestamp": "2021-04-01T12:02:31.000000000Z",
            "agent": "Mozilla/5.0", "client": "172.17.0.1", "compression": "2.75",
            "referer": "http://localhost/somewhere", "request": "POST /not-found HTTP/1.1",
            "size": 153, "status": 404, "user": "alice"
        })]
    );
    assert_eq!(
        records(&grok),
        vec![json!({
            "message": "2020-10-02T23:22:12.223222Z info Hello world",
            "level": "info", "msg": "Hello world", "ts": "2020-10-02T23:22:12.223222Z"
        })]
    );
    assert_eq!(
        records(&logfmt),
        vec![json!({
            "message": "level=warn msg=\"disk full\" pct=97",
            "level": "warn", "msg": "disk full", "pct": 97
        })]
    );
    assert_eq!(
        records(&json),
        vec![json!({
            "message": "{\"level\":\"info\",\"user\":{\"id\":7}}",
            "level": "INFO", "user": {"id": 7, "name": "u7"}
        })]
    );
    assert_eq!(
        records(&keep),
        vec![
            json!({"message": "12", "n": 12}),
            json!({"message": "not a number"})
        ]
    );
    assert_eq!(records(&drop), vec![json!({"message": "12", "n": 12})]);
}

#[test]
fn bad_input_is_a_counted_error_never_a_crash() {
    let dir = tempdir();
    let d = dir.path();
    // Not UTF-8: a line that is not JSON fails, counted, and passes
    // unchanged; JSON with an invalid byte in a string is parsed (VRL
    // reads it lossily).
    let utf8 = pipeline(
        d,
        "utf8",
        b"\xff\xfenot json\n{\"a\":\"\xff\"}\n",
        &source(". = merge(., object!(parse_json!(.message)))"),
        "",
    );
    // A 10 MB line: copying it, then doubling it, is over the run's
    // working-memory limit (a quarter of the pipeline's share of the 64
    // MiB limit); the next line is small.
    let mut big = vec![b'x'; 10 << 20];
    big.push(b'\n');
    big.extend_from_slice(b"small\n");
    let big_out = pipeline(
        d,
        "big",
        &big,
        &source("s = string!(.message)\n.copy = s + s"),
        "    max_line_bytes: 16MiB\n",
    );
    // A program building a huge value out of a short line: 2^20 copies
    // (16 MiB), over the same limit before it is done.
    let mut doubling = String::from("s = string!(.message)\n");
    for _ in 0..20 {
        doubling.push_str("s = s + s\n");
    }
    doubling.push_str(".big = s\n");
    let huge = pipeline(d, "huge", b"0123456789abcdef\nx\n", &source(&doubling), "");
    let conf = d.join("conf");
    let mut agent = Agent::start_with(
        &conf,
        &d.join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "64MiB".into()],
            ..AgentOptions::default()
        },
    );
    wait_lines(&utf8, 2);
    wait_lines(&big_out, 1);
    let mut l = component("utf8", "processor", "vrl");
    l.push(("error_type", "remap"));
    wait_metric(&agent, "petrel_component_errors_total", &l, 1.0, false);
    // Runs over a limit are interrupted, counted, and handled as aborts:
    // dropped (drop_on_abort), the other events go on.
    for p in ["big", "huge"] {
        let mut l = component(p, "processor", "vrl");
        l.push(("reason", "remap_limit"));
        wait_metric(
            &agent,
            "petrel_component_discarded_events_total",
            &l,
            1.0,
            false,
        );
        let mut l = component(p, "processor", "vrl");
        l.push(("error_type", "remap_limit"));
        wait_metric(&agent, "petrel_component_errors_total", &l, 1.0, false);
    }
    assert!(
        agent.stderr().contains("max_memory_bytes"),
        "{}",
        agent.stderr()
    );
    agent.stop();
    let got = records(&big_out);
    assert_eq!(got, vec![json!({"message": "small", "copy": "smallsmall"})]);
    let got = records(&huge);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["message"], "x");
    assert_eq!(got[0]["big"].as_str().map(str::len), Some(1 << 20));
    let got = records(&utf8);
    assert_eq!(
        got,
        vec![
            json!({"message": "\u{fffd}\u{fffd}not json"}),
            json!({"message": "{\"a\":\"\u{fffd}\"}", "a": "\u{fffd}"}),
        ]
    );
}

#[test]
fn validate_reports_vrl_errors_at_their_place_and_exits_2() {
    let dir = tempdir();
    let d = dir.path();
    std::fs::write(
        d.join("bad.yaml"),
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    source: |\n      .a = 1\n      .b = parse_json(.message)\nsinks:\n  - type: blackhole\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run_to_end(d, &["validate", "--config", "bad.yaml"]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    // As VRL prints it: several lines, the caret under the expression.
    assert!(
        stdout.starts_with("bad.yaml:8:12: remap: error[E103]: unhandled fallible assignment\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 │ .b = parse_json(.message)\n  │ ---- ^^^^^^^^^^^^^^^^^^^^"),
        "{stdout}"
    );

    // A program in a file: the position is in that file.
    std::fs::write(d.join("p.vrl"), ".a = 1\n.b = (\n").unwrap();
    std::fs::write(
        d.join("file.yaml"),
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    file: p.vrl\nsinks:\n  - type: blackhole\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(d, &["validate", "--config", "file.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.starts_with("file.yaml:6:11: remap: "), "{stdout}");
    assert!(stdout.contains("p.vrl:2:7: error[E203]"), "{stdout}");

    // The environment is off by default.
    std::fs::write(
        d.join("env.yaml"),
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    source: .k = get_env_var!(\"HOME\")\nsinks:\n  - type: blackhole\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(d, &["validate", "--config", "env.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("allow_env: true"), "{stdout}");
}

#[test]
fn petrel_test_runs_remap_pipelines() {
    let dir = tempdir();
    let d = dir.path();
    let conf = d.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    write_config(
        &conf,
        "app",
        "sources:\n  - type: file\n    id: in\n    include: [\"/var/log/app/*.log\"]\nprocessors:\n  - type: remap\n    id: vrl\n    source: |\n      . = merge(., object!(parse_json!(.message)))\n      .level = upcase!(.level)\n      if .level == \"DEBUG\" { abort }\n      .app = %k8s.labels.app\nsinks:\n  - type: blackhole\n    id: out\n",
    );
    std::fs::write(
        conf.join("app.test.yaml"),
        "tests:\n  - name: json becomes fields, debug is dropped\n    input:\n      - '{\"level\":\"info\",\"n\":1}'\n      - '{\"level\":\"debug\"}'\n      - 'not json'\n    meta: {k8s.labels.app: shop}\n    at: vrl\n    expect:\n      count: 2\n      dropped: {remap_abort: 1}\n      events:\n        - equals: {level: INFO, n: 1, app: shop}\n        - equals: {message: not json}\n          absent: [level, app]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run_to_end(d, &["test", "--config", "conf"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("ok   conf/app.test.yaml: json becomes fields, debug is dropped"),
        "{stdout}"
    );
    // The same test with a wrong expectation fails.
    let failing = std::fs::read_to_string(conf.join("app.test.yaml"))
        .unwrap()
        .replace("level: INFO", "level: info");
    std::fs::write(d.join("fail.test.yaml"), failing).unwrap();
    let (code, stdout, _) = run_to_end(d, &["test", "--config", "conf", "fail.test.yaml"]);
    assert_eq!(code, Some(1), "{stdout}");
}

#[test]
fn reroute_dropped_sends_failed_events_to_their_sink_alone() {
    let dir = tempdir();
    let d = dir.path();
    let input = d.join("in.log");
    std::fs::write(&input, "12\nnot a number\nstop\n7\n").unwrap();
    let (out, dead) = (d.join("out.ndjson"), d.join("dead.ndjson"));
    let conf = d.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    write_config(
        &conf,
        "p",
        &format!(
            "sources:\n  - type: file\n    id: in\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: remap\n    id: vrl\n    drop_on_error: true\n    reroute_dropped: dead\n    source: |\n      if .message == \"stop\" {{ abort \"told to stop\" }}\n      .n = to_int!(.message)\n  - type: fields\n    id: after\n    add: {{seen: \"yes\"}}\nsinks:\n  - type: file\n    id: out\n    path: \"{}\"\n    encoding: ndjson\n  - type: file\n    id: dead\n    path: \"{}\"\n    encoding: ndjson\n",
            input.display(),
            out.display(),
            dead.display()
        ),
    );
    let mut agent = Agent::start(&conf, &d.join("data"));
    wait_lines(&out, 2);
    wait_lines(&dead, 2);
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &[
            ("pipeline", "p"),
            ("component_kind", "processor"),
            ("component_id", "vrl"),
            ("error_type", "remap"),
        ],
        1.0,
        false,
    );
    // Rerouted, so not discarded.
    for reason in ["remap_error", "remap_abort"] {
        assert_eq!(
            counter(
                &agent,
                "p",
                "petrel_component_discarded_events_total",
                ("reason", reason)
            ),
            0.0,
            "{reason}"
        );
    }
    agent.stop();
    assert_eq!(
        records(&out),
        vec![
            json!({"message": "12", "n": 12, "seen": "yes"}),
            json!({"message": "7", "n": 7, "seen": "yes"})
        ]
    );
    let dead = records(&dead);
    assert_eq!(dead.len(), 2, "{dead:?}");
    // As read, without the later processor's field, with why it was dropped.
    assert_eq!(dead[0]["message"], "not a number");
    assert_eq!(dead[0]["dropped"]["reason"], "remap_error");
    assert_eq!(dead[0]["dropped"]["component_id"], "vrl");
    assert_eq!(dead[0]["dropped"]["component_type"], "remap");
    assert!(
        dead[0]["dropped"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("to_int")),
        "{dead:?}"
    );
    assert!(dead[0].get("n").is_none() && dead[0].get("seen").is_none());
    assert_eq!(dead[1]["message"], "stop");
    assert_eq!(dead[1]["dropped"]["reason"], "remap_abort");
    assert!(
        dead[1]["dropped"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("told to stop")),
        "{dead:?}"
    );
}

#[test]
fn reroute_dropped_must_name_a_sink_without_when() {
    let dir = tempdir();
    let d = dir.path();
    std::fs::write(
        d.join("r.yaml"),
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    source: .a = 1\n    reroute_dropped: nowhere\nsinks:\n  - type: blackhole\n    id: out\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(d, &["validate", "--config", "r.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(
        stdout.contains("r.yaml:7:22: ")
            && stdout.contains("sink `nowhere`")
            && stdout.contains("(out)"),
        "{stdout}"
    );
    std::fs::write(
        d.join("w.yaml"),
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    source: .a = 1\n    reroute_dropped: dead\nsinks:\n  - type: blackhole\n    id: out\n  - type: blackhole\n    id: dead\n    when: {include: {a: \"1\"}}\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(d, &["validate", "--config", "w.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(
        stdout.contains("w.yaml:13:") && stdout.contains("cannot also have `when`"),
        "{stdout}"
    );
}

/// Issue 32: a program kept in a file beside the pipeline is reloaded when
/// that file alone is edited, and a syntax error in it keeps the running
/// pipeline and logs the error at its place in the program file.
#[test]
fn an_edited_program_file_reloads_and_a_broken_one_keeps_the_running_pipeline() {
    let dir = tempdir();
    let d = dir.path();
    let conf = d.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let input = d.join("in.log");
    let out = d.join("out.ndjson");
    append(&input, b"one\n");
    std::fs::write(conf.join("p.vrl"), ".version = 1\n").unwrap();
    write_config(
        &conf,
        "p",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: remap\n    file: p.vrl\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            input.display(),
            out.display()
        ),
    );
    let agent = Agent::start(&conf, &d.join("data"));
    wait_lines(&out, 1);
    let reloads =
        |result: &str| agent.metric_or_zero("petrel_config_reload_total", &[("result", result)]);

    // Edited as an editor does: a new file renamed over the old one.
    std::fs::write(conf.join(".p.vrl.tmp"), ".version = 2\n").unwrap();
    std::fs::rename(conf.join(".p.vrl.tmp"), conf.join("p.vrl")).unwrap();
    wait_for(LONG, "the reload", || {
        (reloads("applied") >= 1.0)
            .then_some(())
            .ok_or(format!("{} reloads", reloads("applied")))
    });
    append(&input, b"two\n");
    wait_lines(&out, 2);

    // A syntax error on line 2, column 12 of the program.
    std::fs::write(conf.join("p.vrl"), ".version = 3\n.broken = (\n").unwrap();
    wait_for(LONG, "the failed reload", || {
        (reloads("failed") >= 1.0)
            .then_some(())
            .ok_or(format!("{} failed reloads", reloads("failed")))
    });
    append(&input, b"three\n");
    wait_lines(&out, 3);
    let versions: Vec<(String, i64)> = records(&out)
        .iter()
        .map(|r| {
            (
                r["message"].as_str().unwrap_or_default().to_string(),
                r["version"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![
            ("one".to_string(), 1),
            ("two".to_string(), 2),
            // The pipeline with the last good program kept running.
            ("three".to_string(), 2)
        ]
    );
    let log = agent.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("p.vrl:2:12: error") || l.contains("p.vrl:2:11: error")),
        "{log}"
    );
}

/// Issue 32: the VRL form of a condition serves in `filter` and on sinks
/// (routing), as it does in a processor's `when:`.
#[test]
fn vrl_conditions_in_filter_and_on_sinks() {
    let dir = tempdir();
    let d = dir.path();
    let input = d.join("in.log");
    std::fs::write(
        &input,
        "{\"status\":200,\"n\":1}\n{\"status\":503,\"n\":2}\n{\"status\":404,\"n\":3}\n{\"status\":\"x\",\"n\":4}\n{\"status\":500,\"n\":5}\n",
    )
    .unwrap();
    let (errors, rest) = (d.join("errors.ndjson"), d.join("rest.ndjson"));
    let conf = d.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    write_config(
        &conf,
        "p",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\n  - type: filter\n    id: no_ok\n    vrl: '.status != 200'\nsinks:\n  - type: file\n    id: errors\n    path: \"{}\"\n    encoding: ndjson\n    when: {{vrl: 'is_integer(.status) && int!(.status) >= 500'}}\n  - type: file\n    id: rest\n    path: \"{}\"\n    encoding: ndjson\n    when: unmatched\n",
            input.display(),
            errors.display(),
            rest.display()
        ),
    );
    let agent = Agent::start(&conf, &d.join("data"));
    wait_lines(&errors, 2);
    wait_lines(&rest, 2);
    let filtered = agent.metric_or_zero(
        "petrel_component_discarded_events_total",
        &[
            ("pipeline", "p"),
            ("component_id", "no_ok"),
            ("reason", "filtered"),
        ],
    );
    assert_eq!(filtered, 1.0);
    drop(agent);
    let ns = |p: &Path| -> Vec<i64> {
        records(p)
            .iter()
            .map(|r| r["n"].as_i64().unwrap_or(-1))
            .collect()
    };
    assert_eq!(ns(&errors), vec![2, 5]);
    // Not an integer: the errors sink's condition is false.
    assert_eq!(ns(&rest), vec![3, 4]);
}

#[test]
fn a_program_that_doubles_an_array_stays_within_the_memory_limit() {
    let dir = tempdir();
    // 3,000 lines of 512 bytes; each run makes an array of the line's
    // characters and doubles it eight times: 131,072 values, well over
    // the run's working-memory limit (a quarter of the pipeline's 16 MiB).
    // Without limits such a program held hundreds of MB.
    let line = format!("{}\n", "z".repeat(511));
    let input = line.repeat(3_000);
    let program = "a = split(string!(.message), \"\")\n".to_string()
        + &"a = append(a, a)\n".repeat(8)
        + ".a = a";
    let out = pipeline(
        dir.path(),
        "doubling",
        input.as_bytes(),
        &source(&program),
        "",
    );
    let agent = Agent::start_with(
        &dir.path().join("conf"),
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "16MiB".into()],
            ..Default::default()
        },
    );
    // Every event is written or counted as over a limit.
    wait_for(LONG, "every event written or counted", || {
        let written = count_lines(&out) as f64;
        let limited = counter(
            &agent,
            "doubling",
            "petrel_component_discarded_events_total",
            ("reason", "remap_limit"),
        );
        if written + limited >= 3_000.0 {
            Ok(())
        } else {
            Err(format!("{written} written, {limited} over a limit"))
        }
    });
    let limited = counter(
        &agent,
        "doubling",
        "petrel_component_discarded_events_total",
        ("reason", "remap_limit"),
    );
    assert_eq!(
        limited, 3_000.0,
        "every run over its working-memory limit is interrupted and counted"
    );
    // The limit plus the documented overhead: twice the pipeline's share
    // for the program, and the agent's own (about 30 MB).
    let peak = proc_rss(agent.pid(), true);
    assert!(
        peak < 100 << 20,
        "peak RSS {} MiB at a 16 MiB limit",
        peak >> 20
    );
}
