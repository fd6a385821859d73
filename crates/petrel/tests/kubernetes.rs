//! `kubernetes_logs` on files written exactly as container runtimes write
//! them (kubelet's CRI layout, Docker's json-file), with metadata from the
//! path only (`runtime: none`): partials merged across writes and
//! rotation, streams, selection, checkpoints across kill -9. The same
//! source against a real containerd is in `containerd.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const T: &str = "2024-03-01T10:20:30.123456789Z";
const UID: &str = "5f0c3a1e-1111-2222-3333-444455556666";

fn pod_log(pods: &Path, ns: &str, pod: &str, container: &str) -> PathBuf {
    let d = pods.join(format!("{ns}_{pod}_{UID}")).join(container);
    std::fs::create_dir_all(&d).unwrap();
    d.join("0.log")
}

fn config(dir: &Path, pods: &Path, docker: &Path, out: &Path, extra: &str) -> PathBuf {
    write_config(
        dir,
        "k8s",
        &format!(
            "sources:\n  - type: kubernetes_logs\n    id: pods\n    pods_dir: {}\n    docker_dir: {}\n    runtime: none\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            pods.display(),
            docker.display(),
            out.display()
        ),
    )
}

/// One container `shop/web-1/app` whose log goes to `out.ndjson`, with
/// `partial_line_timeout_ms`: (out, the container's 0.log, the config).
fn one_container(dir: &Path, partial_ms: u64) -> (PathBuf, PathBuf, PathBuf) {
    let (pods, out) = (dir.join("pods"), dir.join("out.ndjson"));
    let log = pod_log(&pods, "shop", "web-1", "app");
    let extra = format!("    partial_line_timeout_ms: {partial_ms}\n");
    let cfg = config(dir, &pods, &dir.join("none"), &out, &extra);
    (out, log, cfg)
}

fn by_message(out: &Path) -> Vec<serde_json::Value> {
    json_lines(out)
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

#[test]
fn cri_and_docker_records_become_messages_with_pod_metadata() {
    let dir = tempdir();
    let (pods, docker, out) = (
        dir.path().join("pods"),
        dir.path().join("docker"),
        dir.path().join("out.ndjson"),
    );
    std::fs::create_dir_all(&docker).unwrap();
    let web = pod_log(&pods, "shop", "web-1", "nginx");
    let sys = pod_log(&pods, "kube-system", "dns-1", "coredns");
    let id = "4b825dc642cb6eb9a060e54bf8d69288fbee4904aaaabbbbccccddddeeeeffff";
    std::fs::create_dir_all(docker.join(id)).unwrap();
    let dlog = docker.join(id).join(format!("{id}-json.log"));
    let cfg = config(
        dir.path(),
        &pods,
        &docker,
        &out,
        "    exclude: { namespaces: [kube-system] }\n    partial_line_timeout_ms: 300\n",
    );
    let data = dir.path().join("data");
    let agent = Agent::start(&cfg, &data);
    append(&sys, format!("{T} stdout F excluded\n").as_bytes());
    // A chain split across writes, with stderr records in between.
    append(
        &web,
        format!("{T} stdout F first\n{T} stdout P long-a|\n{T} stderr F an error\n").as_bytes(),
    );
    wait_lines(&out, 2);
    append(
        &web,
        format!("{T} stdout P long-b|\nnot a record\n").as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(400));
    append(&web, format!("{T} stdout F long-c\n").as_bytes());
    // Docker: a 16 KiB x 3 partial chain, then a short stderr line.
    let chunk = "d".repeat(16384);
    let mut d = String::new();
    for _ in 0..3 {
        d.push_str(&format!(
            "{{\"log\":\"{chunk}\",\"stream\":\"stdout\",\"time\":\"2024-03-01T10:20:31Z\"}}\n"
        ));
    }
    d.push_str("{\"log\":\"end\\n\",\"stream\":\"stdout\",\"time\":\"2024-03-01T10:20:31Z\"}\n");
    d.push_str(
        "{\"log\":\"warn \\\"x\\\"\\n\",\"stream\":\"stderr\",\"time\":\"2024-03-01T10:20:32Z\"}\n",
    );
    append(&dlog, d.as_bytes());
    wait_lines(&out, 6);
    std::thread::sleep(Duration::from_millis(500));
    let got = by_message(&out);
    let msgs: Vec<&str> = got.iter().map(|v| field(v, "message")).collect();
    assert_eq!(got.len(), 6, "{msgs:?}");
    assert!(!msgs.contains(&"excluded"), "{msgs:?}");
    let first = &got[msgs.iter().position(|m| *m == "first").unwrap()];
    assert_eq!(field(first, "stream"), "stdout");
    assert_eq!(field(first, "k8s.namespace"), "shop");
    assert_eq!(field(first, "k8s.pod_name"), "web-1");
    assert_eq!(field(first, "k8s.pod_uid"), UID);
    assert_eq!(field(first, "k8s.container_name"), "nginx");
    assert_eq!(field(first, "k8s.restart_count"), "0");
    assert_eq!(field(first, "timestamp"), "2024-03-01T10:20:30.123456789Z");
    assert_eq!(field(first, "source_type"), "", "not written as a field");
    let err = &got[msgs.iter().position(|m| *m == "an error").unwrap()];
    assert_eq!(field(err, "stream"), "stderr");
    assert!(msgs.contains(&"long-a|long-b|long-c"), "{msgs:?}");
    assert!(msgs.contains(&"not a record"), "{msgs:?}");
    let big = got
        .iter()
        .find(|v| field(v, "message").len() == 3 * 16384 + 3)
        .expect("the merged docker line");
    assert_eq!(field(big, "container.id"), id);
    assert_eq!(field(big, "stream"), "stdout");
    assert!(msgs.contains(&"warn \"x\""), "{msgs:?}");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("k8s", "pods", "container_record_invalid")
        ),
        1.0
    );
}

#[test]
fn a_chain_cut_by_rotation_is_flushed_and_the_new_file_read() {
    let dir = tempdir();
    let (out, log, cfg) = one_container(dir.path(), 300);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    append(
        &log,
        format!("{T} stdout F before\n{T} stdout P cut-").as_bytes(),
    );
    append(&log, b"by-rotation\n");
    wait_lines(&out, 1);
    // kubelet's rotation: rename, then a new 0.log.
    std::fs::rename(&log, log.with_file_name("0.log.20240301-102031")).unwrap();
    append(
        &log,
        format!("{T} stdout F rest\n{T} stdout F after\n").as_bytes(),
    );
    wait_lines(&out, 4);
    let got = by_message(&out);
    let msgs: Vec<&str> = got.iter().map(|v| field(v, "message")).collect();
    for m in ["before", "cut-by-rotation", "rest", "after"] {
        assert!(msgs.contains(&m), "{m} missing from {msgs:?}");
    }
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("k8s", "pods", "container_partial_unfinished"),
        1.0,
        false,
    );
}

/// A line whose last part comes long after its first ones, in the file
/// the runtime still writes to, comes out whole (issue 19: it came out in
/// two events once the file had been idle for `partial_line_timeout_ms`).
#[test]
fn a_slowly_finished_line_in_a_live_file_comes_out_whole() {
    let dir = tempdir();
    let (out, log, cfg) = one_container(dir.path(), 200);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    append(
        &log,
        format!("{T} stdout F before\n{T} stdout P slow-a|\n{T} stdout P slow-b|\n").as_bytes(),
    );
    wait_lines(&out, 1);
    // The writer pauses for many times `partial_line_timeout_ms`.
    std::thread::sleep(Duration::from_secs(3));
    append(
        &log,
        format!("{T} stdout F slow-c\n{T} stdout F after\n").as_bytes(),
    );
    wait_for(LONG, "the line after the slow one", || {
        let msgs: Vec<String> = by_message(&out)
            .iter()
            .map(|v| field(v, "message").to_string())
            .collect();
        if msgs.iter().any(|m| m == "after") {
            Ok(msgs)
        } else {
            Err(format!("{msgs:?}"))
        }
    });
    let msgs: Vec<String> = by_message(&out)
        .iter()
        .map(|v| field(v, "message").to_string())
        .collect();
    assert_eq!(msgs, vec!["before", "slow-a|slow-b|slow-c", "after"]);
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("k8s", "pods", "container_partial_unfinished")
        ),
        0.0
    );
}

#[test]
fn an_unfinished_chain_survives_kill_9_and_comes_out_once() {
    let dir = tempdir();
    let (out, log, cfg) = one_container(dir.path(), 60000);
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    append(
        &log,
        format!("{T} stdout F one\n{T} stdout P two-a|\n").as_bytes(),
    );
    wait_lines(&out, 1);
    // The committed offset stops before the open chain.
    wait_for(LONG, "checkpoint at the chain start", || {
        let want = format!("{T} stdout F one\n").len() as u64;
        match checkpoint_offset(&data, &log) {
            Some(o) if o == want => Ok(()),
            o => Err(format!("{o:?}, want {want}")),
        }
    });
    agent.kill9();
    append(&log, format!("{T} stdout F two-b\n").as_bytes());
    let agent = Agent::start(&cfg, &data);
    wait_lines(&out, 2);
    std::thread::sleep(Duration::from_millis(500));
    let msgs: Vec<String> = by_message(&out)
        .iter()
        .map(|v| field(v, "message").to_string())
        .collect();
    assert_eq!(msgs, vec!["one".to_string(), "two-a|two-b".to_string()]);
    drop(agent);
}

#[test]
fn label_selection_without_a_runtime_is_a_config_error() {
    let dir = tempdir();
    let cfg = config(
        dir.path(),
        &dir.path().join("pods"),
        &dir.path().join("docker"),
        &dir.path().join("out"),
        "    include: { pod_labels: { app: web } }\n",
    );
    let o = std::process::Command::new(bin())
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("runtime"), "{err}");
    assert!(err.contains("k8s.yaml"), "{err}");
}

#[test]
fn a_live_files_wait_shorter_than_a_rotated_ones_is_a_config_error() {
    let dir = tempdir();
    let cfg = config(
        dir.path(),
        &dir.path().join("pods"),
        &dir.path().join("docker"),
        &dir.path().join("out"),
        "    partial_line_timeout_ms: 5000\n    unfinished_line_timeout_ms: 1000\n",
    );
    let o = std::process::Command::new(bin())
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("k8s.yaml:"), "{err}");
    assert!(err.contains("unfinished_line_timeout_ms"), "{err}");
}

/// `2026-11-23T12:20:47.9715223Z` and `…47.971522300Z` are the same time.
fn norm_time(t: &str) -> String {
    match t.split_once('.') {
        Some((head, frac)) => {
            let digits: String = frac.chars().take_while(|c| c.is_ascii_digit()).collect();
            format!("{head}.{digits:0<9}{}", &frac[digits.len()..])
        }
        None => t.to_string(),
    }
}

/// (stream, timestamp, message) of events, in order.
fn triples(vals: &[serde_json::Value]) -> Vec<(String, String, String)> {
    vals.iter()
        .map(|v| {
            (
                field(v, "stream").to_string(),
                norm_time(field(v, "timestamp")),
                field(v, "message").to_string(),
            )
        })
        .collect()
}

fn expected(name: &str) -> Vec<(String, String, String)> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/docker/{name}.expected.ndjson"));
    triples(&json_lines(&p))
}

fn sample(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/docker/{name}")))
        .unwrap()
}

/// The bytes a real dockerd wrote (tests/data/docker, see its README):
/// 16 KiB partials merged per stream with a stderr record inside a stdout
/// chain, lines of 16383/16384/16385 bytes, escapes, a last line without
/// newline, and a chain that rotation split across two files.
#[test]
fn real_docker_json_file_samples_give_the_reference_events() {
    let dir = tempdir();
    let docker = dir.path().join("docker");
    let out = dir.path().join("out.ndjson");
    let id = |n: u8| format!("{:064x}", n as u128 + 0xabc);
    let cfg = config(
        dir.path(),
        &dir.path().join("pods"),
        &docker,
        &out,
        // The last line without newline waits in its live file for
        // `unfinished_line_timeout_ms`.
        "    partial_line_timeout_ms: 300\n    unfinished_line_timeout_ms: 300\n",
    );
    let log_of = |n: u8| {
        let d = docker.join(id(n));
        std::fs::create_dir_all(&d).unwrap();
        d.join(format!("{}-json.log", id(n)))
    };
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    append(&log_of(1), &sample("interleaved-json.log"));
    append(&log_of(2), &sample("boundaries-json.log"));
    // Rotation as dockerd does it: the full file renamed to `.1`, then a
    // new file; the 49152-byte line's chain spans both.
    let rot = log_of(3);
    append(&rot, &sample("rotation-json.log.1"));
    let old_n = expected("rotation").len();
    wait_for(LONG, "the rotated file's complete lines", || {
        let n = json_lines(&out)
            .iter()
            .filter(|v| field(v, "file").contains(&id(3)))
            .count();
        if n >= 1 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    std::fs::rename(&rot, rot.with_extension("log.1")).unwrap();
    append(&rot, &sample("rotation-json.log"));
    let want = expected("interleaved").len() + expected("boundaries").len() + old_n;
    // The rotation-split chain comes out in two pieces (counted).
    wait_lines(&out, want + 1);
    std::thread::sleep(Duration::from_millis(500));
    let all = json_lines(&out);
    let of = |n: u8| -> Vec<serde_json::Value> {
        all.iter()
            .filter(|v| field(v, "file").starts_with(docker.join(id(n)).to_str().unwrap()))
            .cloned()
            .collect()
    };
    assert_eq!(triples(&of(1)), expected("interleaved"));
    assert_eq!(triples(&of(2)), expected("boundaries"));
    // Per stream, the same bytes in the same order; one event more where
    // rotation cut the chain.
    let rotated = triples(&of(3));
    let want_rot = expected("rotation");
    assert_eq!(rotated.len(), want_rot.len() + 1, "{rotated:?}");
    // Every reference event comes out whole, except the one rotation cut,
    // which comes out as its two halves.
    let mut left: Vec<(String, String)> =
        rotated.iter().map(|t| (t.0.clone(), t.2.clone())).collect();
    let mut split = 0;
    for (stream, _, msg) in &want_rot {
        if let Some(i) = left.iter().position(|(s, m)| s == stream && m == msg) {
            left.remove(i);
            continue;
        }
        let halves = left.iter().enumerate().find_map(|(i, (s, a))| {
            let rest = msg
                .strip_prefix(a.as_str())
                .filter(|_| s == stream && !a.is_empty())?;
            let j = left.iter().position(|(s2, b)| s2 == stream && b == rest)?;
            Some((i, j))
        });
        let (i, j) = halves.unwrap_or_else(|| panic!("{stream} {msg:.60} not found in {left:?}"));
        split += 1;
        for k in [i.max(j), i.min(j)] {
            left.remove(k);
        }
    }
    assert!(left.is_empty(), "unexpected events {left:?}");
    assert_eq!(split, 1);
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("k8s", "pods", "container_partial_unfinished")
        ),
        2.0,
        "the rotated chain's first half, and interleaved's last line without newline"
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("k8s", "pods", "container_record_invalid")
        ),
        0.0
    );
}
