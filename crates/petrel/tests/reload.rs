//! Hot reload: pipelines added, changed and removed under a steady writer
//! lose nothing and duplicate nothing; unchanged pipelines are not
//! touched; an invalid configuration keeps the running one; many reloads
//! do not grow memory.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn pipeline(input: &Path, out: &Path, extra: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n{extra}sinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
        input.display(),
        out.display()
    )
}

/// Writes numbered lines to each file at a steady rate until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(files: Vec<PathBuf>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicUsize::new(0));
        let (s, w) = (stop.clone(), written.clone());
        let handle = std::thread::spawn(move || {
            let mut outs: Vec<std::fs::File> = files
                .iter()
                .map(|f| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(f)
                        .unwrap()
                })
                .collect();
            let mut i = 0usize;
            while !s.load(Ordering::SeqCst) {
                // About 2,000 lines per second per file, in small writes.
                for _ in 0..20 {
                    for (n, o) in outs.iter_mut().enumerate() {
                        writeln!(o, "f{n}-{i:08} steady writer line").unwrap();
                    }
                    i += 1;
                }
                w.store(i, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Self {
            stop,
            written,
            handle: Some(handle),
        }
    }

    fn lines(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        self.lines()
    }
}

fn counts(path: &Path) -> HashMap<Vec<u8>, usize> {
    histogram(read_lines(path))
}

fn reload(agent: &Agent) -> String {
    let (status, body) = agent.http("POST", "/reload").expect("POST /reload");
    assert_eq!(status, 200, "reload answered {status}: {body}");
    body
}

fn started(agent: &Agent, pipeline: &str) -> usize {
    agent
        .stderr()
        .lines()
        .filter(|l| l.contains("pipeline started") && l.contains(&format!("pipeline={pipeline} ")))
        .count()
}

#[test]
fn pipelines_added_changed_and_removed_under_a_steady_writer() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    let out = dir.path().join("out");
    let conf = dir.path().join("conf");
    for d in [&logs, &out, &conf] {
        std::fs::create_dir(d).unwrap();
    }
    let (a_log, b_log) = (logs.join("a.log"), logs.join("b.log"));
    let writer = Writer::start(vec![a_log.clone(), b_log.clone()]);
    std::fs::write(
        conf.join("a.yaml"),
        pipeline(&a_log, &out.join("a.out"), ""),
    )
    .unwrap();
    std::fs::write(
        conf.join("b.yaml"),
        pipeline(&b_log, &out.join("b.out"), ""),
    )
    .unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start_with(
        &conf,
        &data,
        AgentOptions {
            args: vec!["--no-watch-config".into()],
            ..Default::default()
        },
    );
    let grows = |f: &str, n: usize| wait_lines(&out.join(f), n);
    grows("a.out", 2000);
    grows("b.out", 2000);

    // Change a: drained and rebuilt; b untouched.
    std::fs::write(
        conf.join("a.yaml"),
        pipeline(&a_log, &out.join("a.out"), "    read_block_bytes: 65536\n"),
    )
    .unwrap();
    let body = reload(&agent);
    assert!(body.contains("changed [\"a\"]"), "{body}");
    // The agent's stderr reaches the test through a reader thread: the
    // line may trail the HTTP answer (this assert failed once in a full
    // run with the line in the log).
    wait_for(MEDIUM, "a rebuilt", || match started(&agent, "a") {
        2 => Ok(()),
        n => Err(format!("started {n} times")),
    });
    assert_eq!(started(&agent, "b"), 1, "b untouched");
    let at = count_lines(&out.join("a.out"));
    grows("a.out", at + 2000);

    // An invalid configuration changes nothing.
    std::fs::write(
        conf.join("bad.yaml"),
        "sources: [{ type: nope }]\nsinks: []\n",
    )
    .unwrap();
    let (status, body) = agent.http("POST", "/reload").unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("bad.yaml:1:"),
        "errors name file and line: {body}"
    );
    assert_eq!(
        agent.metric_or_zero("petrel_config_reload_total", &[("result", "failed")]),
        1.0
    );
    let at = count_lines(&out.join("b.out"));
    grows("b.out", at + 2000);
    std::fs::remove_file(conf.join("bad.yaml")).unwrap();

    // Remove b, add c reading b's file under a new name (its own offsets).
    std::fs::remove_file(conf.join("b.yaml")).unwrap();
    std::fs::write(
        conf.join("c.yaml"),
        pipeline(&b_log, &out.join("c.out"), ""),
    )
    .unwrap();
    let body = reload(&agent);
    assert!(
        body.contains("added [\"c\"]") && body.contains("removed [\"b\"]"),
        "{body}"
    );
    assert_eq!(started(&agent, "a"), 2, "a untouched by the second reload");
    let b_final = count_lines(&out.join("b.out"));
    grows("c.out", 2000);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        count_lines(&out.join("b.out")),
        b_final,
        "b stopped writing"
    );

    let total = writer.finish();
    grows("a.out", total);
    grows("c.out", total);
    let a = counts(&out.join("a.out"));
    let c = counts(&out.join("c.out"));
    let b = counts(&out.join("b.out"));
    for i in 0..total {
        let la = format!("f0-{i:08} steady writer line").into_bytes();
        let lb = format!("f1-{i:08} steady writer line").into_bytes();
        // A changed pipeline is drained before it is rebuilt, and resumes
        // at its committed offsets: every line exactly once.
        assert_eq!(a.get(&la), Some(&1), "a: line {i}");
        assert_eq!(c.get(&lb), Some(&1), "c: line {i}");
        // b was removed after draining: a prefix of the file, once each.
        if i < b_final {
            assert_eq!(b.get(&lb), Some(&1), "b: line {i}");
        }
    }
    assert_eq!(b.len(), b_final, "b holds a prefix, no duplicates");
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn two_hundred_reloads_leave_memory_flat() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    let conf = dir.path().join("conf");
    std::fs::create_dir(&logs).unwrap();
    std::fs::create_dir(&conf).unwrap();
    let input = logs.join("app.log");
    append(&input, b"one\ntwo\n");
    let out = dir.path().join("out.log");
    let data = dir.path().join("data");
    let write = |n: usize| {
        // Each version differs (a processor with a changing value), so
        // every reload drains and rebuilds the pipeline and re-parses
        // the whole configuration.
        let extra = format!(
            "processors:\n  - type: fields\n    add: {{ version: \"{n}\" }}\n  - type: parse_regex\n    pattern: '^(?P<word>\\w+)$'\n"
        );
        let text = pipeline(&input, &out, "").replace("sinks:", &format!("{extra}sinks:"));
        std::fs::write(conf.join("p.yaml"), text).unwrap();
    };
    write(0);
    let agent = Agent::start_with(
        &conf,
        &data,
        AgentOptions {
            args: vec!["--no-watch-config".into()],
            ..Default::default()
        },
    );
    wait_lines(&out, 2);
    let mut baseline = 0;
    for n in 1..=200 {
        write(n);
        let body = reload(&agent);
        assert!(body.contains("changed [\"p\"]"), "reload {n}: {body}");
        if n == 20 {
            baseline = rss_kib(agent.pid());
        }
    }
    let after = rss_kib(agent.pid());
    assert_eq!(
        agent.metric_or_zero("petrel_config_reload_total", &[("result", "applied")]),
        200.0
    );
    // Leaks per reload (config strings, metric handles, threads) would
    // show as steady growth over 180 reloads.
    assert!(
        after <= baseline + 4096,
        "RSS grew from {baseline} KiB after 20 reloads to {after} KiB after 200"
    );
    append(&input, b"three\n");
    wait_lines(&out, 3);
    assert_eq!(
        count_lines(&out),
        3,
        "nothing read twice across 200 reloads"
    );
}

#[test]
fn an_edited_pipeline_file_is_reloaded_by_itself() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    let conf = dir.path().join("conf");
    std::fs::create_dir(&logs).unwrap();
    std::fs::create_dir(&conf).unwrap();
    let input = logs.join("app.log");
    append(&input, b"first\n");
    let (out1, out2) = (dir.path().join("one.log"), dir.path().join("two.log"));
    std::fs::write(conf.join("p.yaml"), pipeline(&input, &out1, "")).unwrap();
    let agent = Agent::start(&conf, &dir.path().join("data"));
    wait_for(LONG, "first line", || {
        (count_lines(&out1) == 1)
            .then_some(())
            .ok_or("waiting".to_string())
    });
    // Written like an editor does: a new file renamed over the old one.
    let tmp = conf.join(".p.yaml.swp");
    std::fs::write(&tmp, pipeline(&input, &out2, "")).unwrap();
    std::fs::rename(&tmp, conf.join("p.yaml")).unwrap();
    wait_for(LONG, "the reload", || {
        let n = agent.metric_or_zero("petrel_config_reload_total", &[("result", "applied")]);
        (n >= 1.0).then_some(()).ok_or(format!("{n} reloads"))
    });
    append(&input, b"second\n");
    wait_for(LONG, "the second line in the new output", || {
        (count_lines(&out2) == 1)
            .then_some(())
            .ok_or("waiting".to_string())
    });
    assert_eq!(read_lines(&out2), vec![b"second".to_vec()]);
    assert_eq!(read_lines(&out1), vec![b"first".to_vec()]);
}

/// Lays out `dir` the way kubelet mounts a ConfigMap holding `name`, and
/// updates it the way kubelet does: a new timestamped directory, a
/// `..data_tmp` symlink to it renamed over `..data`, the old directory
/// deleted. `app.yaml` itself is a symlink that never changes.
fn configmap_update(dir: &Path, name: &str, version: u32, content: &str) {
    let ts = format!("..2026_11_25_03_{version:02}_00.000000001");
    std::fs::create_dir(dir.join(&ts)).unwrap();
    std::fs::write(dir.join(&ts).join(name), content).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join(name);
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
    }
    if version > 0 {
        let old = format!("..2026_11_25_03_{:02}_00.000000001", version - 1);
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// Issue 23 (reloads): a ConfigMap updated by kubelet's `..data` swap is
/// picked up without a signal, several swaps in a row, and a steady
/// writer's lines are delivered exactly once across them.
#[test]
fn a_configmap_updated_by_kubelets_data_swap_is_reloaded_without_a_signal() {
    let dir = tempdir();
    let conf = dir.path().join("pipelines");
    std::fs::create_dir(&conf).unwrap();
    let input = dir.path().join("app.log");
    let outs: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("out{i}.log")))
        .collect();
    std::fs::write(&input, b"").unwrap();
    configmap_update(&conf, "app.yaml", 0, &pipeline(&input, &outs[0], ""));
    let mut agent = Agent::start(&conf, &dir.path().join("data"));
    let writer = Writer::start(vec![input.clone()]);
    wait_for(LONG, "lines in the first output", || {
        let n = count_lines(&outs[0]);
        (n > 100).then_some(()).ok_or(format!("{n}"))
    });
    for v in 1..3u32 {
        configmap_update(
            &conf,
            "app.yaml",
            v,
            &pipeline(&input, &outs[v as usize], ""),
        );
        let out = &outs[v as usize];
        wait_for(LONG, &format!("lines in output {v} after swap {v}"), || {
            let n = count_lines(out);
            (n > 100).then_some(()).ok_or(format!("{n} lines"))
        });
    }
    let applied = agent.metric_or_zero("petrel_config_reload_total", &[("result", "applied")]);
    assert_eq!(applied, 2.0, "one reload per swap");
    let written = writer.finish();
    wait_for(LONG, "every line delivered", || {
        let n: usize = outs.iter().map(|o| count_lines(o)).sum();
        (n >= written)
            .then_some(())
            .ok_or(format!("{n} of {written}"))
    });
    agent.stop();
    let mut all: HashMap<Vec<u8>, usize> = HashMap::new();
    for o in &outs {
        for l in read_lines(o) {
            *all.entry(l).or_default() += 1;
        }
    }
    assert_eq!(all.len(), written, "every line once");
    assert!(all.values().all(|&c| c == 1), "no line twice");
}

/// A reload whose changed pipeline cannot be built (`Some(port)`: its
/// new source cannot start, after the old version was stopped; `None`:
/// its sink's disk buffer holds data of another sink type, refused before
/// anything stops) keeps that pipeline running with its old
/// configuration, and says so in the log, `/health` and the metrics; the
/// other pipeline applies.
fn a_refused_reload_keeps_the_pipeline_flowing(busy_port: Option<u16>) {
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    let input = dir.path().join("app.log");
    let other_in = dir.path().join("other.log");
    let out = dir.path().join("out.log");
    let other_out = dir.path().join("other.out");
    let (other_new, held_out) = (
        dir.path().join("other-new.out"),
        dir.path().join("held.out"),
    );
    append(&input, b"before\n");
    append(&other_in, b"o1\n");
    let buffered = format!(
        "  - type: file\n    id: held\n    path: \"{}\"\n    encoding: text\n    buffer: {{ type: disk, max_size: 8MiB }}\n",
        held_out.display()
    );
    let first = pipeline(&input, &out, "") + &buffered;
    std::fs::write(conf.join("p.yaml"), &first).unwrap();
    std::fs::write(conf.join("q.yaml"), pipeline(&other_in, &other_out, "")).unwrap();
    let agent = Agent::start(&conf, &dir.path().join("data"));
    // q's first line too: a q stopped before it read o1 leaves o1 to the
    // new q, which then writes it again (at least once, as it should).
    wait_for(LONG, "the first line", || {
        (count_lines(&out) == 1 && count_lines(&held_out) == 1 && count_lines(&other_out) == 1)
            .then_some(())
            .ok_or("waiting".to_string())
    });
    let changed = match busy_port {
        // A second source on a port already taken: built, but it cannot
        // start once the old version has stopped.
        Some(port) => {
            pipeline(&input, &out, &format!("  - type: tcp\n    address: \"127.0.0.1:{port}\"\n"))
                + &buffered
        }
        // The buffered sink's type changed under the same id.
        None => {
            pipeline(&input, &out, "")
                + "  - type: stdout\n    id: held\n    encoding: text\n    buffer: { type: disk, max_size: 8MiB }\n"
        }
    };
    std::fs::write(conf.join("p.yaml"), changed).unwrap();
    std::fs::write(conf.join("q.yaml"), pipeline(&other_in, &other_new, "")).unwrap();
    let (status, body) = agent.http("POST", "/reload").expect("POST /reload");
    assert_eq!(status, 422, "a refused pipeline fails the reload: {body}");
    assert!(body.contains("pipeline p"), "{body}");
    // The refused pipeline runs as before; the other one changed.
    append(&input, b"after\n");
    append(&other_in, b"o2\n");
    wait_for(LONG, "a line after the refused reload", || {
        (read_lines(&out) == vec![b"before".to_vec(), b"after".to_vec()])
            .then_some(())
            .ok_or(format!("{:?}", read_lines(&out)))
    });
    wait_for(LONG, "the other pipeline's new output", || {
        (read_lines(&other_new) == vec![b"o2".to_vec()])
            .then_some(())
            .ok_or(format!("{:?}", read_lines(&other_new)))
    });
    let (code, health) = agent.http_get("/health").unwrap();
    assert_eq!(code, 200, "{health}");
    assert!(
        health.contains("degraded") && health.contains("p/reload"),
        "{health}"
    );
    // The file watcher reloads too: once or twice.
    assert!(agent.metric_or_zero("petrel_reload_failures_total", &[("pipeline", "p")]) >= 1.0);
    assert!(agent
        .stderr()
        .contains("keeps running with its previous configuration"));
    // Fixed: applied, and healthy again.
    std::fs::write(conf.join("p.yaml"), &first).unwrap();
    reload(&agent);
    let (_, health) = agent.http_get("/health").unwrap();
    assert!(!health.contains("p/reload"), "{health}");
}

#[test]
fn a_reload_refused_for_a_buffer_of_another_sink_type_keeps_the_pipeline_flowing() {
    a_refused_reload_keeps_the_pipeline_flowing(None);
}

#[test]
fn a_reload_whose_new_source_cannot_start_restores_the_old_pipeline() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    a_refused_reload_keeps_the_pipeline_flowing(Some(port));
    drop(taken);
}
