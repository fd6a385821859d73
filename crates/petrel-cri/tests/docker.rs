//! RuntimeWatcher against a real private Docker daemon started by `scripts/docker-lab.sh`
//! (Debian's docker.io; `scripts/docker-lab.sh setup` installs it). Pods are containers
//! labelled as kubelet's dockershim / cri-dockerd labels them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{wait_for, LONG};
use petrel_cri::lab::Dockerd;
use petrel_cri::{Runtime, RuntimeWatcher, WatcherOptions};

const IMAGE: &str = Dockerd::IMAGE;

/// Runs the docker CLI against the lab daemon, failing the test on error.
fn docker(d: &Dockerd, args: &[&str]) -> String {
    d.docker(args).expect("docker CLI")
}

#[test]
fn watcher_reports_kubernetes_containers_of_a_real_docker() {
    let t0 = Instant::now();
    let d = Dockerd::start().expect("start dockerd");
    eprintln!("dockerd ready after {:?}", t0.elapsed());
    let watcher = RuntimeWatcher::start(WatcherOptions {
        runtime: Runtime::Docker(d.socket()),
        refresh_interval: Duration::from_secs(3600),
        grace: Duration::from_secs(3),
        call_timeout: Duration::from_secs(10),
    })
    .expect("start watcher");

    let uid = "7d1e0b7c-3a55-4f0e-8f57-5c0b9e2a1d44";
    let pod_labels = [
        "io.kubernetes.pod.uid=7d1e0b7c-3a55-4f0e-8f57-5c0b9e2a1d44",
        "io.kubernetes.pod.name=web-1",
        "io.kubernetes.pod.namespace=shop",
    ];
    let mut args = vec![
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        "io.kubernetes.docker.type=podsandbox",
    ];
    for l in &pod_labels {
        args.extend_from_slice(&["--label", l]);
    }
    args.extend_from_slice(&[
        "--label",
        "io.kubernetes.container.name=POD",
        "--label",
        "app=web",
        "--label",
        "annotation.team=logs",
        IMAGE,
        "sleep",
        "300",
    ]);
    let sandbox = docker(&d, &args);

    let run_main = |attempt: &str, script: &str| {
        let restart = format!("annotation.io.kubernetes.container.restartCount={attempt}");
        let mut args = vec!["run", "-d", "--network", "none"];
        for l in &pod_labels {
            args.extend_from_slice(&["--label", l]);
        }
        args.extend_from_slice(&[
            "--label",
            "io.kubernetes.container.name=main",
            "--label",
            &restart,
            IMAGE,
            "sh",
            "-c",
            script,
        ]);
        docker(&d, &args)
    };
    let script = "i=1; while [ $i -le 5 ]; do echo line-$i; i=$((i+1)); done; \
                  head -c 40000 /dev/zero | tr '\\0' x; echo; echo line-6; exec sleep 300";
    let c0 = run_main("0", script);
    let plain = docker(
        &d,
        &[
            "run",
            "-d",
            "--network",
            "none",
            "--name",
            "plain",
            IMAGE,
            "sleep",
            "300",
        ],
    );

    let snap = wait_for(LONG, "the three containers, main with its pid", || {
        watcher.request_refresh();
        let s = watcher.snapshot();
        s.container(uid, "main", 0).filter(|c| c.pid.is_some())?;
        s.container_by_id(&plain)?;
        Some(s)
    });
    let p = snap.pod(uid).expect("pod");
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("shop", "web-1"));
    assert!(p.ready);
    assert_eq!(p.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(p.annotations.get("team").map(String::as_str), Some("logs"));
    assert!(!p.labels.contains_key("annotation.team"));
    assert!(
        snap.container_by_id(&sandbox).is_none(),
        "the sandbox is a pod, not a container"
    );

    let c = snap.container(uid, "main", 0).expect("main");
    assert_eq!(c.id, c0);
    assert_eq!(c.image, IMAGE);
    assert!(c.running);
    assert!(
        c.log_path.ends_with(&format!("{c0}-json.log")),
        "{}",
        c.log_path
    );
    let pid = c.pid.expect("pid");
    assert!(Path::new(&format!("/proc/{pid}/root/bin/busybox")).exists());

    let pl = snap.container_by_id(&plain).expect("plain container");
    assert_eq!(
        (pl.pod_uid.as_str(), pl.name.as_str(), pl.attempt),
        ("", "plain", 0)
    );
    assert!(snap.container("", "plain", 0).is_some());

    // json-file: the 40000-byte line is written as 16 KiB partials (no trailing \n) then the rest.
    let log_path = PathBuf::from(&c.log_path);
    let logs: Vec<String> = wait_for(LONG, "line-6 in the json-file log", || {
        let text = std::fs::read_to_string(&log_path).ok()?;
        let logs: Vec<String> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json-file record");
                v["log"].as_str().expect("log").to_string()
            })
            .collect();
        logs.iter().any(|l| l == "line-6\n").then_some(logs)
    });
    let first = logs
        .iter()
        .position(|l| !l.ends_with('\n'))
        .expect("a partial record");
    let mut long = String::new();
    for l in &logs[first..] {
        long.push_str(l);
        if l.ends_with('\n') {
            break;
        }
    }
    assert_eq!(long.len(), 40001);
    assert!(logs[first..].len() >= 3);

    // Steady: one list call per refresh, no inspect calls, same snapshot.
    let stats = watcher.stats();
    let (inspects, gen0, r0) = (
        stats.status_calls.load(Ordering::Relaxed),
        watcher.generation(),
        stats.refreshes.load(Ordering::Relaxed),
    );
    wait_for(LONG, "three more refreshes", || {
        watcher.request_refresh();
        (stats.refreshes.load(Ordering::Relaxed) >= r0 + 3).then_some(())
    });
    assert_eq!(stats.status_calls.load(Ordering::Relaxed), inspects);
    assert_eq!(watcher.generation(), gen0);

    // Restart: attempt 0 exits, attempt 1 runs.
    docker(&d, &["stop", "-t", "0", &c0]);
    let c1 = run_main("1", "echo second-run; exec sleep 300");
    let snap = wait_for(LONG, "attempt 1 running and attempt 0 not", || {
        watcher.request_refresh();
        let s = watcher.snapshot();
        s.container(uid, "main", 1).filter(|c| c.running)?;
        s.container(uid, "main", 0)
            .filter(|c| !c.running && c.pid.is_none())?;
        Some(s)
    });
    assert_eq!(
        snap.container(uid, "main", 1).map(|c| c.id.as_str()),
        Some(c1.as_str())
    );

    // Everything removed: gone once `grace` passed.
    docker(&d, &["rm", "-f", &sandbox, &c0, &c1, &plain]);
    wait_for(
        LONG,
        "the removed pod and containers to leave the snapshot",
        || {
            watcher.request_refresh();
            let s = watcher.snapshot();
            (s.pod(uid).is_none() && s.containers().count() == 0).then_some(())
        },
    );
    watcher.shutdown();
    eprintln!("test body done after {:?}", t0.elapsed());
}

#[test]
fn absent_docker_socket_counts_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let watcher = RuntimeWatcher::start(WatcherOptions {
        runtime: Runtime::Docker(dir.path().join("docker.sock")),
        refresh_interval: Duration::from_millis(200),
        grace: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
    })
    .expect("start");
    assert_eq!(watcher.snapshot().containers().count(), 0);
    let stats = watcher.stats();
    wait_for(LONG, "two failures", || {
        (stats.failures.load(Ordering::Relaxed) >= 2).then_some(())
    });
    assert!(!stats.connected.load(Ordering::Relaxed));
    let err = stats.last_error.lock().clone().expect("last error");
    assert!(err.contains("docker.sock"), "{err}");
    watcher.shutdown();
}
