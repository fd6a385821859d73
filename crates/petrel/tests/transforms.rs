//! End-to-end tests of `when:` on processors and of the `throttle`,
//! `dedupe` and `sample` processors, through the real binary (a `file`
//! source, an `ndjson` file sink, counters read from `/metrics`), and of
//! the shipped example `examples/pipelines/parser-by-annotation.yaml`
//! (through `petrel test`, and its exact output through the pipeline's
//! real processor chain). Every expected value is computed in the test
//! from the input.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A pipeline `name` reading `input` from the beginning, with
/// `processors` (YAML lines of the list, indented by two spaces), into an
/// ndjson file `out`.
fn pipeline(dir: &Path, name: &str, input: &Path, processors: &str, out: &Path) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            "sources:\n  - type: file\n    id: in\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n{processors}sinks:\n  - type: file\n    id: out\n    path: \"{}\"\n    encoding: ndjson\n",
            input.display(),
            out.display()
        ),
    )
}

/// The records of an ndjson file, without `host` and `file` (the same on
/// every record) and `timestamp`.
fn records(path: &Path) -> Vec<serde_json::Map<String, Value>> {
    json_lines(path)
        .into_iter()
        .map(|v| {
            let mut m = match v {
                Value::Object(m) => m,
                other => panic!("not an object: {other}"),
            };
            m.remove("host");
            m.remove("file");
            m
        })
        .collect()
}

fn discarded(agent: &Agent, p: &str, id: &str, reason: &str) -> f64 {
    let mut l = component(p, "processor", id);
    l.push(("reason", reason));
    agent.metric_or_zero("petrel_component_discarded_events_total", &l)
}

#[test]
fn when_runs_a_parser_on_half_the_events_and_passes_the_others_unchanged_in_order() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.ndjson");
    // Even lines are JSON with kind "json"; odd lines look like JSON too
    // but must not be parsed, and are not tagged.
    let n = 200;
    let mut text = String::new();
    let mut lines = Vec::new();
    for i in 0..n {
        let l = if i % 2 == 0 {
            format!("{{\"kind\":\"json\",\"n\":{i}}}")
        } else {
            format!("{{\"kind\":\"other\",\"n\":{i}}}")
        };
        text.push_str(&l);
        text.push('\n');
        lines.push(l);
    }
    std::fs::write(&input, text).expect("write input");
    let conf = pipeline(
        dir.path(),
        "half",
        &input,
        "  - type: parse_json\n    id: json\n    when: {include: {message: '\"kind\":\"json\"'}}\n  - type: fields\n    id: tag\n    when: {include: {kind: '^json$'}}\n    add: {parsed: \"yes\"}\n",
        &out,
    );
    let mut agent = Agent::start(&conf, &dir.path().join("data"));
    wait_lines(&out, n);
    agent.stop();
    let got = records(&out);
    assert_eq!(got.len(), n);
    for (i, (rec, line)) in got.iter().zip(&lines).enumerate() {
        let mut want = serde_json::Map::new();
        want.insert("message".into(), json!(line));
        if i % 2 == 0 {
            want.insert("kind".into(), json!("json"));
            want.insert("n".into(), json!(i));
            want.insert("parsed".into(), json!("yes"));
        }
        assert_eq!(rec, &want, "record {i}");
    }
}

#[test]
fn throttle_dedupe_and_sample_drop_exactly_and_count_in_metrics() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.ndjson");
    // 600 lines: user u0..u5 in turn, each line twice in a row (so dedupe
    // drops 300), then throttle lets 20 per user through (120 of 300),
    // then sample keeps 1 in 4 by a counter, except errors.
    let mut text = String::new();
    let mut distinct = Vec::new();
    for i in 0..300 {
        let level = if i % 10 == 0 { "error" } else { "info" };
        let l = format!(
            "{{\"user\":\"u{}\",\"level\":\"{level}\",\"seq\":{i}}}",
            i % 6
        );
        text.push_str(&format!("{l}\n{l}\n"));
        distinct.push((i, l));
    }
    std::fs::write(&input, text).expect("write input");
    let conf = pipeline(
        dir.path(),
        "tds",
        &input,
        "  - type: parse_json\n    id: json\n  - type: dedupe\n    id: dedupe\n    fields: {match: [message]}\n    cache: {num_events: 1000}\n  - type: throttle\n    id: throttle\n    key_field: \"user-{{ user }}\"\n    threshold: 20\n    window_secs: 3600\n  - type: sample\n    id: sample\n    rate: 4\n    always_keep: {include: {level: '^error$'}}\n",
        &out,
    );
    // Expected, computed from the input: after dedupe, each user's first
    // 20 lines pass the throttle; of those, errors are kept and the others
    // by a counter that keeps the 1st of every 4 (in input order: one
    // file, one reader, batches processed in order by one pipeline).
    let mut per_user = [0u32; 6];
    let throttled: Vec<&(usize, String)> = distinct
        .iter()
        .filter(|(i, _)| {
            per_user[i % 6] += 1;
            per_user[i % 6] <= 20
        })
        .collect();
    assert_eq!(throttled.len(), 120);
    let mut counter = 0u64;
    let mut want = Vec::new();
    for (i, l) in &throttled {
        if i % 10 == 0 {
            want.push(l.clone());
            continue;
        }
        if counter % 4 == 0 {
            want.push(l.clone());
        }
        counter += 1;
    }
    let errors = throttled.iter().filter(|(i, _)| i % 10 == 0).count();
    let sampled_out = 120 - want.len();

    let mut agent = Agent::start_with(
        &conf,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--threads".into(), "1".into()],
            ..AgentOptions::default()
        },
    );
    wait_metric(
        &agent,
        "petrel_component_received_events_total",
        &component("tds", "sink", "out"),
        want.len() as f64,
        false,
    );
    wait_lines(&out, want.len());
    assert_eq!(discarded(&agent, "tds", "dedupe", "duplicate"), 300.0);
    assert_eq!(discarded(&agent, "tds", "throttle", "throttled"), 180.0);
    assert_eq!(
        discarded(&agent, "tds", "sample", "sampled"),
        sampled_out as f64,
        "{errors} errors always kept"
    );
    let evictions = agent.metric_or_zero(
        "petrel_component_cache_evictions_total",
        &component("tds", "processor", "dedupe"),
    );
    assert_eq!(evictions, 0.0, "300 distinct lines fit in 1000");
    agent.stop();
    let got: Vec<String> = records(&out)
        .iter()
        .map(|r| r["message"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn the_keys_of_throttle_are_bounded_and_evictions_are_counted() {
    let dir = tempdir();
    let input = dir.path().join("in.log");
    let out = dir.path().join("out.ndjson");
    // 5000 distinct keys, max_keys 100: every first event of a key passes
    // (threshold 1) and 4900 keys are evicted.
    let n = 5000;
    let text: String = (0..n).map(|i| format!("key-{i}\n")).collect();
    std::fs::write(&input, text).expect("write input");
    let conf = pipeline(
        dir.path(),
        "bounded",
        &input,
        "  - type: throttle\n    id: t\n    key_field: \"{{ message }}\"\n    threshold: 1\n    window_secs: 3600\n    max_keys: 100\n",
        &out,
    );
    let mut agent = Agent::start(&conf, &dir.path().join("data"));
    wait_lines(&out, n);
    let labels = component("bounded", "processor", "t");
    wait_metric(
        &agent,
        "petrel_component_cache_evictions_total",
        &labels,
        (n - 100) as f64,
        false,
    );
    assert_eq!(discarded(&agent, "bounded", "t", "throttled"), 0.0);
    agent.stop();
    assert_eq!(count_lines(&out), n);
}

#[test]
fn config_errors_of_when_and_the_new_processors_name_file_line_and_key() {
    let dir = tempdir();
    let conf = write_config(
        dir.path(),
        "bad",
        "sources:\n  - type: stdin\nprocessors:\n  - type: parse_json\n    when: {include: {level: '('}}\n  - type: throttle\n    threshold: 0\n    window_secs: 1\n  - type: sample\n    rate: 2\n    when: yes\n  - type: dedupe\n    fields: {match: []}\nsinks:\n  - type: stdout\n",
    );
    let (code, stdout, stderr) = run_to_end(
        dir.path(),
        &["validate", "--config", conf.to_str().expect("utf-8 path")],
    );
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let all = format!("{stdout}{stderr}");
    for want in [
        "bad.yaml:5:",
        "invalid regex `(`",
        "bad.yaml:7:",
        "`threshold` must be at least 1",
        "bad.yaml:11:",
        "`when` must be a condition",
        "bad.yaml:13:",
        "`fields` needs exactly one of `match`",
    ] {
        assert!(all.contains(want), "missing {want:?} in\n{all}");
    }
}

#[test]
fn the_parser_by_annotation_example_passes_its_petrel_tests() {
    let root = repo_root();
    let config = "examples/pipelines/parser-by-annotation.yaml";
    let (code, stdout, stderr) = run_to_end(&root, &["test", "--config", config]);
    assert_eq!(code, Some(0), "{config}:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("\n4 passed, 0 failed (1 test file(s))\n"),
        "{config}:\n{stdout}"
    );
}

/// The example's processor chain, on one batch per pod as the kubernetes
/// source emits them (one container file, its annotation in the batch's
/// metadata), gives exactly these ndjson records.
#[test]
fn the_parser_by_annotation_example_gives_exactly_the_expected_records() {
    use petrel_core::encode::{encode_batch, Encoding};
    use petrel_core::{Event, EventBatch, Key, Metrics, SourceInfo, Span};

    let path = repo_root().join("examples/pipelines/parser-by-annotation.yaml");
    let p = petrel::config::load_file(&path).expect("the example loads");
    let metrics = Metrics::new();
    let chain = petrel::topology::build_processors(&p, &metrics).expect("builds");
    let run = |parser: Option<&str>, lines: &[&str]| -> Vec<String> {
        let mut buf = Vec::new();
        let mut events = Vec::new();
        for l in lines {
            events.push(Event::from_span(Span::new(buf.len(), l.len())));
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        let meta: Vec<(Key, Arc<str>)> = parser
            .map(|v| {
                (
                    Key::Borrowed("k8s.annotations.petrel.dev/parser"),
                    Arc::from(v),
                )
            })
            .into_iter()
            .collect();
        let mut batch = EventBatch::new(
            buf.into(),
            Arc::new(SourceInfo {
                path: "".into(),
                meta: meta.into(),
                source_type: "kubernetes_logs",
            }),
        );
        batch.events = events;
        for slot in &chain {
            slot.processor.process(&mut batch);
        }
        let mut out = Vec::new();
        let mut ends = Vec::new();
        encode_batch(
            &Encoding::Ndjson(Default::default()),
            &batch,
            &mut out,
            Some(&mut ends),
        );
        String::from_utf8(out)
            .expect("utf-8")
            .lines()
            .map(str::to_string)
            .collect()
    };
    let json_line = r#"{"level":"info","msg":"order placed","order_id":42}"#;
    let nginx_line = r#"203.0.113.7 - alice [23/Nov/2026:10:02:06 +0000] "GET /api/orders?id=42 HTTP/1.1" 200 512 "-" "curl/8.5.0""#;
    let ann = r#""k8s.annotations.petrel.dev/parser""#;
    let q = |s: &str| serde_json::to_string(s).expect("json string");
    // json: the JSON line parsed; a line that is not JSON is marked.
    assert_eq!(
        run(Some("json"), &[json_line, "not json"]),
        [
            format!(
                r#"{{"message":{},{ann}:"json","level":"info","msg":"order placed","order_id":42}}"#,
                q(json_line)
            ),
            format!(
                r#"{{"message":"not json",{ann}:"json","parse_error":"parse_json: invalid JSON: not a JSON object"}}"#
            ),
        ]
    );
    // nginx: the combined format parsed and its time read; the JSON line
    // is no nginx line (marked), and is not parsed as JSON.
    assert_eq!(
        run(Some("nginx"), &[nginx_line, json_line]),
        [
            format!(
                r#"{{"message":{},{ann}:"nginx","timestamp":"2026-11-23T10:02:06.000000000Z","client":"203.0.113.7","user":"alice","method":"GET","path":"/api/orders?id=42","protocol":"HTTP/1.1","status":"200","bytes":"512","referer":"-","user_agent":"curl/8.5.0"}}"#,
                q(nginx_line)
            ),
            format!(
                r#"{{"message":{},{ann}:"nginx","parse_error":"parse_regex: pattern does not match; parse_timestamp: field is missing"}}"#,
                q(json_line)
            ),
        ]
    );
    // No annotation, or a parser name the pipeline does not know: untouched.
    assert_eq!(
        run(None, &[json_line, nginx_line]),
        [
            format!(r#"{{"message":{}}}"#, q(json_line)),
            format!(r#"{{"message":{}}}"#, q(nginx_line)),
        ]
    );
    assert_eq!(
        run(Some("logfmt"), &[json_line]),
        [format!(r#"{{"message":{},{ann}:"logfmt"}}"#, q(json_line))]
    );
}
