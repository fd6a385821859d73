//! Routing with `when:` on sinks: each event goes only to the sinks whose
//! condition it meets, a stalled sink holds only its own events, events no
//! sink takes are counted as unrouted, and `when: unmatched` catches them.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// `n` lines cycling through the levels error, info and debug.
fn levels(n: usize) -> (String, [Vec<String>; 3]) {
    let mut text = String::new();
    let mut by: [Vec<String>; 3] = Default::default();
    for i in 0..n {
        let (k, level) = match i % 3 {
            0 => (0, "error"),
            1 => (1, "info"),
            _ => (2, "debug"),
        };
        let line = format!("level={level} n={i:06}");
        text.push_str(&line);
        text.push('\n');
        by[k].push(line);
    }
    (text, by)
}

/// `n` such lines written to `dir/logs/app.log`: its path, its text, the
/// lines by level, and a `sources:` section reading it from the start.
fn input_of_levels(
    dir: &std::path::Path,
    n: usize,
) -> (std::path::PathBuf, String, [Vec<String>; 3], String) {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let input = logs.join("app.log");
    let (text, by) = levels(n);
    std::fs::write(&input, &text).unwrap();
    let source = format!(
        "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\n",
        logs.display()
    );
    (input, text, by, source)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn texts(path: &std::path::Path) -> Vec<String> {
    read_lines(path)
        .into_iter()
        .map(|l| String::from_utf8(l).expect("utf-8"))
        .collect()
}

/// Messages the stalled HTTP server answered, from its ndjson bodies.
fn posted(s: &Stalled) -> Vec<String> {
    let mut out = Vec::new();
    for body in s.bodies.lock().unwrap().iter() {
        for l in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson");
            out.push(v["message"].as_str().expect("message").to_string());
        }
    }
    out
}

#[test]
fn a_stalled_sink_holds_only_its_own_events_and_unmatched_catches_the_rest() {
    let dir = tempdir();
    let (input, text, [errors, infos, debugs], source) = input_of_levels(dir.path(), 3000);
    let stalled = Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let errors_out = dir.path().join("errors.out");
    let rest_out = dir.path().join("rest.out");
    let cfg = write_config(
        dir.path(),
        "route",
        &format!(
            r#"{source}sinks:
  - type: file
    id: errors
    path: "{}"
    encoding: text
    when: {{ include: {{ message: "level=error" }} }}
  - type: http
    id: infos
    url: "http://{addr}/ingest"
    encoding: ndjson
    when:
      include: {{ message: "level=info" }}
      exclude: {{ message: "level=(error|debug)" }}
  - type: file
    id: rest
    path: "{}"
    encoding: text
    when: unmatched
"#,
            errors_out.display(),
            rest_out.display()
        ),
    );
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    // The healthy sinks get all of their events while the other is held.
    wait_for(
        Duration::from_secs(30),
        "errors and the rest delivered",
        || {
            let (e, r) = (count_lines(&errors_out), count_lines(&rest_out));
            if e == errors.len() && r == debugs.len() {
                Ok(())
            } else {
                Err(format!(
                    "errors {e}/{}, rest {r}/{}",
                    errors.len(),
                    debugs.len()
                ))
            }
        },
    );
    wait_for(
        Duration::from_secs(30),
        "the http sink waiting on the stalled server",
        || {
            if stalled.held.load(Ordering::SeqCst) > 0 {
                Ok(())
            } else {
                Err("no request held yet".into())
            }
        },
    );
    assert_eq!(sorted(texts(&errors_out)), sorted(errors.clone()));
    assert_eq!(sorted(texts(&rest_out)), sorted(debugs.clone()));
    // Nothing is committed past what the stalled sink has not delivered.
    let committed = checkpoint_offset(&data, &input).unwrap_or(0);
    assert!(
        committed < text.len() as u64,
        "offset {committed} committed while info events were undelivered"
    );
    stalled.released.store(true, Ordering::SeqCst);
    wait_for(Duration::from_secs(30), "info events delivered", || {
        let n = posted(&stalled).len();
        if n >= infos.len() {
            Ok(())
        } else {
            Err(format!("{n}/{}", infos.len()))
        }
    });
    assert_eq!(sorted(posted(&stalled)), sorted(infos.clone()));
    let labels = component("route", "sink", "infos");
    wait_metric(
        &agent,
        "petrel_component_sent_events_total",
        &labels,
        infos.len() as f64,
        false,
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_received_events_total",
            &component("route", "sink", "errors")
        ),
        errors.len() as f64
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &[("pipeline", "route"), ("reason", "unrouted")]
        ),
        0.0
    );
    agent.stop();
    assert_eq!(checkpoint_offset(&data, &input), Some(text.len() as u64));
}

#[test]
fn events_no_sink_takes_are_counted_and_do_not_hold_the_source() {
    let dir = tempdir();
    let (input, text, [errors, infos, debugs], source) = input_of_levels(dir.path(), 900);
    let a = dir.path().join("a.out");
    let b = dir.path().join("b.out");
    let cfg = write_config(
        dir.path(),
        "partial",
        &format!(
            r#"{source}sinks:
  - type: file
    path: "{}"
    encoding: text
    when: {{ include: {{ message: "level=(error|info)" }} }}
  - type: file
    path: "{}"
    encoding: text
    when: {{ include: {{ message: "level=info" }}, exclude: {{ file: "nothing-matches-this" }} }}
"#,
            a.display(),
            b.display()
        ),
    );
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    wait_lines(&a, errors.len() + infos.len());
    wait_lines(&b, infos.len());
    let unrouted = [
        ("pipeline", "partial"),
        ("component_kind", "router"),
        ("reason", "unrouted"),
    ];
    wait_metric(
        &agent,
        "petrel_component_discarded_events_total",
        &unrouted,
        debugs.len() as f64,
        false,
    );
    // An event taken by two sinks reaches both.
    assert_eq!(
        sorted(texts(&a)),
        sorted(errors.iter().chain(&infos).cloned().collect())
    );
    assert_eq!(sorted(texts(&b)), sorted(infos.clone()));
    agent.stop();
    assert_eq!(checkpoint_offset(&data, &input), Some(text.len() as u64));
}

#[test]
fn when_errors_name_the_line_and_the_fix() {
    let dir = tempdir();
    write_config(
        dir.path(),
        "lonely",
        "sources:\n  - type: stdin\nsinks:\n  - type: stdout\n    when: unmatched\n",
    );
    let (code, out, err) = run_to_end(dir.path(), &["validate", "--config", "lonely.yaml"]);
    let stderr = out + &err;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("lonely.yaml:5:11") && stderr.contains("no sink of this pipeline has one"),
        "{stderr}"
    );
    write_config(
        dir.path(),
        "bad",
        "sources:\n  - type: stdin\nsinks:\n  - type: stdout\n    when: {include: {level: \"(\"}}\n  - type: stdout\n    when: sometimes\n  - type: stdout\n    when: {inclde: {a: b}}\n",
    );
    let (code, out, err) = run_to_end(dir.path(), &["validate", "--config", "bad.yaml"]);
    let stderr = out + &err;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml:5:") && stderr.contains("invalid regex `(`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml:7:11")
            && stderr.contains("`when` must be `unmatched` or a condition"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml:9:") && stderr.contains("did you mean `include`"),
        "{stderr}"
    );
}
