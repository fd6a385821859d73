//! What a sink writes of its events (issue 41): the source metadata is
//! the user's (removed, renamed, moved by `fields` and `remap`, absent
//! once removed, never `null`), and each sink's output decides the rest:
//! `metadata: {layout, dedot}`, `only_fields`, `except_fields`,
//! `timestamp_format`, `timestamp_key`. Through the real binary, with
//! container logs written as kubelet writes them (`kubernetes_logs`,
//! `runtime: none`: the pod's metadata comes from the path) and plain
//! files; every expected object is spelled out in full.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};

const T: &str = "2024-03-01T10:20:30.123456789Z";
const UID: &str = "5f0c3a1e-1111-2222-3333-444455556666";

/// A pod's container log under `pods` (kubelet's layout).
fn pod_log(pods: &Path, ns: &str, pod: &str, container: &str) -> PathBuf {
    let d = pods.join(format!("{ns}_{pod}_{UID}")).join(container);
    std::fs::create_dir_all(&d).unwrap();
    d.join("0.log")
}

/// A pipeline from the container logs under `pods` through `processors`
/// into one ndjson file sink per `(name, extra sink keys)`; returns the
/// config and the output of each sink.
fn pods_config(
    dir: &Path,
    pods: &Path,
    processors: &str,
    sinks: &[(&str, &str)],
) -> (PathBuf, Vec<PathBuf>) {
    let mut yaml = format!(
        "sources:\n  - type: kubernetes_logs\n    pods_dir: {}\n    docker_dir: {}\n    runtime: none\n    read_from: beginning\n{processors}sinks:\n",
        pods.display(),
        dir.join("no-docker").display(),
    );
    let mut outs = Vec::new();
    for (name, extra) in sinks {
        let out = dir.join(format!("{name}.ndjson"));
        yaml.push_str(&format!(
            "  - type: file\n    id: {name}\n    path: {}\n    encoding: ndjson\n{extra}",
            out.display()
        ));
        outs.push(out);
    }
    (write_config(dir, "out", &yaml), outs)
}

/// Runs `cfg` until every output has `n` lines; their records.
fn run(dir: &Path, cfg: &Path, outs: &[PathBuf], n: usize) -> Vec<Vec<Value>> {
    let mut agent = Agent::start(cfg, &dir.join("data"));
    for o in outs {
        wait_lines(o, n);
    }
    agent.stop();
    outs.iter().map(|o| json_lines(o)).collect()
}

/// The metadata `kubernetes_logs` gives a container of `shop/web-1/app`
/// from its path, and the host.
fn k8s_flat(log: &Path) -> Value {
    json!({
        "file": log.to_string_lossy(),
        "host": hostname(),
        "stream": "stdout",
        "k8s.namespace": "shop",
        "k8s.pod_name": "web-1",
        "k8s.pod_uid": UID,
        "k8s.container_name": "app",
        "k8s.restart_count": "0",
    })
}

/// Every named layout writes the same event in its own names and shape;
/// `dedot` is on by default for `ecs` only. The event is unchanged by any
/// processor: the metadata comes from the batch.
#[test]
fn each_layout_names_and_shapes_the_metadata() {
    let dir = tempdir();
    let pods = dir.path().join("pods");
    let log = pod_log(&pods, "shop", "web-1", "app");
    append(&log, format!("{T} stdout F hello\n").as_bytes());
    let layouts = ["flat", "nested", "ecs", "otel", "fluent-bit", "vector"];
    let sinks: Vec<(String, String)> = layouts
        .iter()
        .map(|l| {
            (
                l.replace('-', "_"),
                format!("    metadata: {{layout: {l}}}\n"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = sinks
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (cfg, outs) = pods_config(dir.path(), &pods, "", &refs);
    let got = run(dir.path(), &cfg, &outs, 1);
    let file = log.to_string_lossy().into_owned();
    let host = hostname();
    let mut flat = k8s_flat(&log);
    flat["message"] = json!("hello");
    flat["timestamp"] = json!(T);
    let want = [
        flat,
        json!({
            "message": "hello",
            "file": file,
            "host": host,
            "stream": "stdout",
            "k8s": {"namespace": "shop", "pod_name": "web-1", "pod_uid": UID,
                    "container_name": "app", "restart_count": "0"},
            "timestamp": T,
        }),
        json!({
            "message": "hello",
            "log": {"file": {"path": file}},
            "host": {"name": host},
            "stream": "stdout",
            "kubernetes": {"namespace": "shop", "pod": {"name": "web-1", "uid": UID},
                           "container": {"name": "app", "restart_count": "0"}},
            "@timestamp": T,
        }),
        json!({
            "message": "hello",
            "log.file.path": file,
            "host.name": host,
            "log.iostream": "stdout",
            "k8s.namespace.name": "shop",
            "k8s.pod.name": "web-1",
            "k8s.pod.uid": UID,
            "k8s.container.name": "app",
            "k8s.container.restart_count": "0",
            "timestamp": T,
        }),
        json!({
            "log": "hello",
            "file": file,
            "host": host,
            "stream": "stdout",
            "kubernetes": {"namespace_name": "shop", "pod_name": "web-1", "pod_id": UID,
                           "container_name": "app", "restart_count": "0"},
            "time": T,
        }),
        json!({
            "message": "hello",
            "file": file,
            "host": host,
            "stream": "stdout",
            "kubernetes": {"pod_namespace": "shop", "pod_name": "web-1", "pod_uid": UID,
                           "container_name": "app", "container_restart_count": "0"},
            "source_type": "kubernetes_logs",
            "timestamp": T,
        }),
    ];
    for ((layout, got), want) in layouts.iter().zip(&got).zip(&want) {
        assert_eq!(&got[0], want, "layout {layout}");
    }
}

/// Metadata removed or renamed by `fields` is absent from the output
/// (never `null`); a group name covers what lies below it; a removed
/// message leaves no `message` key, and an empty line in `text`.
#[test]
fn fields_remove_rename_and_copy_metadata() {
    let dir = tempdir();
    let pods = dir.path().join("pods");
    let log = pod_log(&pods, "shop", "web-1", "app");
    append(
        &log,
        format!("{T} stdout F hello\n{T} stdout F world\n").as_bytes(),
    );
    let processors = "processors:\n  - type: fields\n    copy: {k8s.pod_name: pod}\n    rename: {file: path, k8s: kubernetes}\n    remove: [host, message, kubernetes.restart_count, stream]\n";
    let (cfg, mut outs) = pods_config(
        dir.path(),
        &pods,
        processors,
        &[("all", ""), ("ecs", "    metadata: {layout: ecs}\n")],
    );
    // The same pipeline's text sink: the message was removed.
    let text_out = dir.path().join("text.log");
    let yaml = std::fs::read_to_string(&cfg).unwrap()
        + &format!(
            "  - type: file\n    id: text\n    path: {}\n",
            text_out.display()
        );
    std::fs::write(&cfg, yaml).unwrap();
    outs.push(text_out.clone());
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    for o in &outs {
        wait_lines(o, 2);
    }
    agent.stop();
    let file = log.to_string_lossy().into_owned();
    let want = json!({
        "pod": "web-1",
        "path": file,
        "kubernetes": {"namespace": "shop", "pod_name": "web-1", "pod_uid": UID,
                       "container_name": "app"},
        "timestamp": T,
    });
    for out in &outs[..2] {
        let got = json_lines(out);
        assert_eq!(got.len(), 2);
        for v in &got {
            // The fields a processor named are the event's own now: every
            // layout writes them as they are.
            let mut want = want.clone();
            if out.ends_with("ecs.ndjson") {
                want["@timestamp"] = want["timestamp"].take();
                want.as_object_mut().unwrap().remove("timestamp");
            }
            assert_eq!(v, &want, "{}", out.display());
        }
    }
    let raw = std::fs::read_to_string(&outs[0]).unwrap();
    assert!(!raw.contains("null"), "{raw}");
    assert_eq!(std::fs::read(&text_out).unwrap(), b"\n\n");
}

/// `remap` sees the metadata in `.`: `del(.host)` removes it, `.k8s`
/// moves as one object, a changed value keeps the metadata's name in the
/// layout, and `. = merge(., ...)` leaves untouched metadata as it was.
#[test]
fn remap_moves_deletes_and_changes_metadata() {
    let dir = tempdir();
    let pods = dir.path().join("pods");
    let log = pod_log(&pods, "shop", "web-1", "app");
    append(
        &log,
        format!("{T} stdout F {{\"level\":\"info\",\"n\":1}}\n{T} stdout F {{\"level\":\"warn\",\"n\":2}}\n").as_bytes(),
    );
    let processors = "processors:\n  - type: remap\n    source: |\n      . = merge(., object!(parse_json!(.message)))\n      del(.host)\n      del(.stream)\n      del(.message)\n      if .level == \"warn\" {\n        .kubernetes = del(.k8s)\n      } else {\n        .k8s.namespace = upcase!(.k8s.namespace)\n        del(.k8s.restart_count)\n        .k8s.cluster = \"c1\"\n      }\n";
    let (cfg, outs) = pods_config(
        dir.path(),
        &pods,
        processors,
        &[("flat", ""), ("ecs", "    metadata: {layout: ecs}\n")],
    );
    let got = run(dir.path(), &cfg, &outs, 2);
    let file = log.to_string_lossy().into_owned();
    assert_eq!(
        got[0][0],
        json!({
            "file": file,
            "k8s.pod_name": "web-1",
            "k8s.pod_uid": UID,
            "k8s.container_name": "app",
            "timestamp": T,
            "level": "info",
            "n": 1,
            "k8s.namespace": "SHOP",
            "k8s.cluster": "c1",
        })
    );
    assert_eq!(
        got[0][1],
        json!({
            "file": file,
            "timestamp": T,
            "level": "warn",
            "n": 2,
            "kubernetes": {"namespace": "shop", "pod_name": "web-1", "pod_uid": UID,
                           "container_name": "app", "restart_count": "0"},
        })
    );
    // The changed namespace is still the pod's namespace in `ecs`.
    assert_eq!(
        got[1][0],
        json!({
            "log": {"file": {"path": file}},
            "kubernetes": {"namespace": "SHOP", "pod": {"name": "web-1", "uid": UID},
                           "container": {"name": "app"}},
            "@timestamp": T,
            "level": "info",
            "n": 1,
            "k8s.cluster": "c1",
        })
    );
}

/// `only_fields` and `except_fields` name event fields, groups, paths
/// into object fields or the layout's names; `timestamp_format` and
/// `timestamp_key` write the time as asked; `dedot` replaces the dots
/// of label keys. Conditions see what processors removed as absent.
#[test]
fn selection_time_format_and_conditions() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("a.log");
    append(&input, b"{\"level\":\"info\",\"user\":{\"id\":7,\"name\":\"ann\"},\"t\":\"2024-03-01T10:20:30.5Z\"}\n");
    let sink = |name: &str, extra: &str| {
        format!(
            "  - type: file\n    id: {name}\n    path: {}\n    encoding: ndjson\n{extra}",
            dir.path().join(format!("{name}.ndjson")).display()
        )
    };
    let yaml = format!(
        "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\n  - type: parse_timestamp\n    field: t\n  - type: fields\n    remove: [t, host]\nsinks:\n{}{}{}{}{}",
        logs.display(),
        sink("only", "    only_fields: [message, user.name, timestamp]\n    timestamp_format: unix_ms\n"),
        sink("except", "    except_fields: [file, user.id, message]\n    timestamp_format: unix\n    timestamp_key: ts\n"),
        sink("ecs", "    metadata: {layout: ecs}\n    except_fields: [log.file.path, message, user]\n    timestamp_format: unix_float\n"),
        sink("nohost", "    when: {include: {host: \".\"}}\n"),
        sink("withfile", "    when: {include: {file: \"a.log$\"}}\n    only_fields: [level]\n"),
    );
    let cfg = write_config(dir.path(), "sel", &yaml);
    let outs: Vec<PathBuf> = ["only", "except", "ecs", "withfile"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.ndjson")))
        .collect();
    let got = run(dir.path(), &cfg, &outs, 1);
    let line = String::from_utf8(read_lines(&input).remove(0)).unwrap();
    assert_eq!(
        got[0][0],
        json!({"message": line, "user": {"name": "ann"}, "timestamp": 1_709_288_430_500i64})
    );
    assert_eq!(
        got[1][0],
        json!({"ts": 1_709_288_430i64, "level": "info", "user": {"name": "ann"}})
    );
    assert_eq!(
        got[2][0],
        json!({"@timestamp": 1_709_288_430.5, "level": "info"})
    );
    assert_eq!(got[3][0], json!({"level": "info"}));
    // The host was removed before the sinks: no event meets `host: "."`.
    let nohost = dir.path().join("nohost.ndjson");
    assert!(!nohost.exists() || count_lines(&nohost) == 0);
}
