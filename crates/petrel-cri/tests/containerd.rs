//! RuntimeWatcher against a real private containerd started by `scripts/cri-lab.sh`
//! (run `scripts/cri-lab.sh setup` once first), and
//! against absent or hung sockets.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{wait_for, LONG};
use petrel_cri::lab::{ContainerState, Containerd};
use petrel_cri::{Runtime, RuntimeWatcher, WatcherOptions};

const IMAGE: &str = "localhost/crilab/busybox:1";

/// CRI records of a log file: (stream, tag, message).
fn records(path: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(4, ' ');
            let (_ts, stream, tag) = (it.next()?, it.next()?, it.next()?);
            Some((
                stream.to_string(),
                tag.to_string(),
                it.next().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

#[test]
fn watcher_reports_pods_and_containers_of_a_real_containerd() {
    let t0 = Instant::now();
    let cd = Containerd::start().expect("start containerd");
    let lab = cd.client().expect("connect lab client");
    let version = lab.version().expect("CRI Version");
    eprintln!("runtime: {version} (started in {:?})", t0.elapsed());

    // Periodic refresh effectively off: every refresh below comes from request_refresh().
    let watcher = RuntimeWatcher::start(WatcherOptions {
        runtime: Runtime::Containerd(cd.socket()),
        refresh_interval: Duration::from_secs(3600),
        grace: Duration::from_secs(3),
        call_timeout: Duration::from_secs(5),
    })
    .expect("start watcher");

    let uid = "0f9c2a4e-6d51-4a7b-9e0c-2b7f3c1d5e88";
    let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "front")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let annotations: BTreeMap<String, String> = [("petrel.io/exclude", "false"), ("team", "logs")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let log_dir = cd.pods_dir().join(format!("shop_web-1_{uid}"));
    let pod = lab
        .run_pod_sandbox("web-1", "shop", uid, &labels, &annotations, &log_dir)
        .expect("RunPodSandbox");
    // Numbered lines, one of 20000 bytes (containerd splits it at 16 KiB: P then F), then
    // stay running so that the init PID can be checked.
    let script = "i=1; while [ $i -le 5 ]; do echo line-$i; i=$((i+1)); done; \
                  head -c 20000 /dev/zero | tr '\\0' x; echo; echo line-6; exec sleep 300";
    let c0 = lab
        .create_and_start_container(&pod, "main", IMAGE, &["sh", "-c", script], "main/0.log", 0)
        .expect("start container");

    let snap = wait_for(LONG, "the running container with its pid", || {
        watcher.request_refresh();
        let s = watcher.snapshot();
        s.container(uid, "main", 0).filter(|c| c.pid.is_some())?;
        Some(s)
    });
    let p = snap.pod(uid).expect("pod in snapshot");
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
        ("shop", "web-1", uid)
    );
    assert_eq!(p.attempt, 0);
    assert!(p.ready);
    assert_eq!(p.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(p.labels.get("tier").map(String::as_str), Some("front"));
    assert_eq!(
        p.labels.get("io.kubernetes.pod.uid").map(String::as_str),
        Some(uid)
    );
    assert_eq!(
        p.annotations.get("petrel.io/exclude").map(String::as_str),
        Some("false")
    );
    assert_eq!(p.annotations.get("team").map(String::as_str), Some("logs"));
    assert_eq!(Path::new(&p.log_directory), log_dir);

    let c = snap.container(uid, "main", 0).expect("container");
    assert_eq!(c.id, c0);
    assert!(std::sync::Arc::ptr_eq(
        c,
        snap.container_by_id(&c0).expect("by id")
    ));
    assert_eq!(
        (c.name.as_str(), c.pod_uid.as_str(), c.attempt),
        ("main", uid, 0)
    );
    assert_eq!(c.image, IMAGE);
    assert_eq!(Path::new(&c.log_path), log_dir.join("main/0.log"));
    assert!(c.running);
    assert_eq!(
        c.labels
            .get("io.kubernetes.container.name")
            .map(String::as_str),
        Some("main")
    );
    let pid = c.pid.expect("pid");
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert!(root.exists(), "{} missing", root.display());
    // The container's own filesystem, seen from the host: the image's busybox.
    assert!(
        root.join("bin/busybox").exists(),
        "{} is not the container's root",
        root.display()
    );
    assert!(snap.pods().count() >= 1 && snap.containers().count() >= 1);

    // The log file, written by containerd: numbered lines, and the long line as P + F.
    let log0 = log_dir.join("main/0.log");
    let recs = wait_for(LONG, "line-6 in 0.log", || {
        let r = records(&log0);
        r.iter().any(|(_, _, m)| m == "line-6").then_some(r)
    });
    for i in 1..=5 {
        assert!(
            recs.contains(&("stdout".into(), "F".into(), format!("line-{i}"))),
            "line-{i}: {recs:?}"
        );
    }
    let long_start = recs
        .iter()
        .position(|(_, t, _)| t == "P")
        .expect("a P record");
    let mut long = String::new();
    let mut parts = 0;
    for (stream, tag, msg) in &recs[long_start..] {
        assert_eq!(stream, "stdout");
        long.push_str(msg);
        parts += 1;
        if tag == "F" {
            break;
        }
    }
    assert!(parts >= 2, "expected P then F");
    assert_eq!(long.len(), 20000);
    assert!(long.bytes().all(|b| b == b'x'));

    // A steady node: refreshes make list calls only, and the snapshot does not change.
    let stats = watcher.stats();
    let (status0, gen0, refreshes0) = (
        stats.status_calls.load(Ordering::Relaxed),
        watcher.generation(),
        stats.refreshes.load(Ordering::Relaxed),
    );
    assert!(gen0 > 0);
    let lists0 = stats.list_calls.load(Ordering::Relaxed);
    wait_for(LONG, "three more refreshes", || {
        watcher.request_refresh();
        (stats.refreshes.load(Ordering::Relaxed) >= refreshes0 + 3).then_some(())
    });
    assert_eq!(
        stats.status_calls.load(Ordering::Relaxed),
        status0,
        "status calls on a steady node"
    );
    // Two list calls per refresh; the first of the three may have been under way already.
    assert!(stats.list_calls.load(Ordering::Relaxed) >= lists0 + 4);
    assert_eq!(watcher.generation(), gen0);
    assert!(stats.connected.load(Ordering::Relaxed));

    // containerd frozen (SIGSTOP): refreshes time out and are counted, readers keep the
    // last snapshot without waiting; thawed, the watcher reconnects.
    let pid = cd.pid().expect("containerd pid");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    };
    let failures0 = stats.failures.load(Ordering::Relaxed);
    signal("-STOP");
    let frozen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(LONG, "a failed refresh while containerd is frozen", || {
            watcher.request_refresh();
            assert!(watcher.snapshot().pod(uid).is_some());
            (stats.failures.load(Ordering::Relaxed) > failures0).then_some(())
        });
        assert!(!stats.connected.load(Ordering::Relaxed));
        let err = stats.last_error.lock().clone().unwrap_or_default();
        assert!(err.contains("5s"), "{err}");
    }));
    signal("-CONT");
    if let Err(p) = frozen {
        std::panic::resume_unwind(p);
    }
    let refreshes1 = stats.refreshes.load(Ordering::Relaxed);
    wait_for(LONG, "a successful refresh after thawing", || {
        watcher.request_refresh();
        (stats.refreshes.load(Ordering::Relaxed) > refreshes1
            && stats.connected.load(Ordering::Relaxed))
        .then_some(())
    });
    assert_eq!(
        watcher.generation(),
        gen0,
        "same content after reconnecting"
    );

    // A restart as kubelet does it: the old container exits, attempt 1 starts, logs to 1.log.
    lab.stop_container(&c0, 0).expect("stop container");
    wait_for(LONG, "attempt 0 exited", || {
        matches!(lab.container_state(&c0).ok()?, ContainerState::Exited(_)).then_some(())
    });
    let c1 = lab
        .create_and_start_container(
            &pod,
            "main",
            IMAGE,
            &["sh", "-c", "echo second-run"],
            "main/1.log",
            1,
        )
        .expect("start attempt 1");
    let snap = wait_for(
        LONG,
        "attempt 1 in the snapshot and attempt 0 not running",
        || {
            watcher.request_refresh();
            let s = watcher.snapshot();
            s.container(uid, "main", 1)?;
            s.container(uid, "main", 0).filter(|c| !c.running)?;
            Some(s)
        },
    );
    let a1 = snap.container(uid, "main", 1).expect("attempt 1");
    assert_eq!(a1.id, c1);
    assert_eq!(Path::new(&a1.log_path), log_dir.join("main/1.log"));
    let a0 = snap.container(uid, "main", 0).expect("attempt 0");
    assert_eq!(a0.id, c0);
    assert_eq!(a0.pid, None);
    wait_for(LONG, "second-run in 1.log", || {
        records(&log_dir.join("main/1.log"))
            .iter()
            .any(|(_, _, m)| m == "second-run")
            .then_some(())
    });

    // Removing the pod: its entries go once `grace` has passed.
    lab.stop_pod(&pod).expect("StopPodSandbox");
    lab.remove_pod(&pod).expect("RemovePodSandbox");
    wait_for(LONG, "the removed pod to leave the snapshot", || {
        watcher.request_refresh();
        let s = watcher.snapshot();
        (s.pod(uid).is_none()
            && s.container_by_id(&c0).is_none()
            && s.container_by_id(&c1).is_none())
        .then_some(())
    });
    assert!(watcher.snapshot().container(uid, "main", 1).is_none());
    assert!(log0.exists(), "log files stay after the pod is removed");
    watcher.shutdown();
    eprintln!("test body done after {:?}", t0.elapsed());
}

#[test]
fn absent_socket_never_blocks_readers_and_counts_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let watcher = RuntimeWatcher::start(WatcherOptions {
        runtime: Runtime::Containerd(dir.path().join("absent.sock")),
        refresh_interval: Duration::from_millis(200),
        grace: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
    })
    .expect("start");
    assert_eq!(watcher.snapshot().pods().count(), 0);
    watcher.request_refresh();
    let stats = watcher.stats();
    wait_for(LONG, "two failures", || {
        (stats.failures.load(Ordering::Relaxed) >= 2).then_some(())
    });
    assert!(!stats.connected.load(Ordering::Relaxed));
    assert_eq!(stats.refreshes.load(Ordering::Relaxed), 0);
    let err = stats.last_error.lock().clone().expect("last error");
    assert!(err.contains("absent.sock"), "{err}");
    assert_eq!(watcher.snapshot().containers().count(), 0);
    assert_eq!(watcher.generation(), 0);
    watcher.shutdown();
}

#[test]
fn hung_socket_never_blocks_readers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hung.sock");
    // Bound and listening, never accepting: connect succeeds, nothing ever answers.
    let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let watcher = RuntimeWatcher::start(WatcherOptions {
        runtime: Runtime::Containerd(path),
        refresh_interval: Duration::from_millis(100),
        grace: Duration::from_secs(1),
        call_timeout: Duration::from_millis(500),
    })
    .expect("start");
    let stats = watcher.stats();
    // Readers are served while the refresh thread is stuck in a call.
    for _ in 0..10 {
        assert_eq!(watcher.snapshot().pods().count(), 0);
        watcher.request_refresh();
    }
    wait_for(LONG, "a timed-out refresh", || {
        (stats.failures.load(Ordering::Relaxed) >= 1).then_some(())
    });
    let err = stats.last_error.lock().clone().expect("last error");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("timeout") || lower.contains("timed out") || lower.contains("within"),
        "{err}"
    );
    watcher.shutdown();
}
