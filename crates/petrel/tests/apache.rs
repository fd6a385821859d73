//! Seed 004 end to end: a real Apache httpd (Debian's apache2, started with
//! its own config on 127.0.0.1 by `bench/lib/apache.sh`) logs every request
//! through `CustomLog "|petrel pipe ..."`, driven by ApacheBench (`ab`),
//! while the agent that reads the spool sends to an HTTP server that holds
//! every request unanswered. Apache must serve every request with nothing
//! delivered downstream (the logging path does not wait for the sink), and
//! once the sink recovers every access-log line arrives exactly once.
//!
//! Requests per second against a plain log file are compared in
//! `bench/apache.sh` (figures in BENCHMARKS.md), never here.
//! `scripts/install-syslog-tools.sh` (run by the test command) installs
//! apache2 and ab.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;

const APACHE_BIN: &str = "/usr/sbin/apache2";
const REQUESTS: usize = 3000;

/// `bench/lib/apache.sh`, the same helper the benchmark uses.
fn apache_lib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/lib/apache.sh")
}

/// A private httpd for a test; stopped (with its piped logger) on drop.
struct Httpd {
    conf_dir: PathBuf,
}

impl Httpd {
    fn start(conf_dir: &Path, port: u16, log_directive: &str) -> Httpd {
        let o = Command::new("bash")
            .arg(apache_lib())
            .arg("start")
            .arg(conf_dir)
            .arg(port.to_string())
            .arg(log_directive)
            .stdin(Stdio::null())
            .output()
            .expect("run bench/lib/apache.sh");
        assert!(
            o.status.success(),
            "httpd did not start: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Httpd {
            conf_dir: conf_dir.to_path_buf(),
        }
    }

    /// Stops httpd and waits for its piped loggers to exit.
    fn stop(&mut self) {
        let o = Command::new("bash")
            .arg(apache_lib())
            .arg("stop")
            .arg(&self.conf_dir)
            .output()
            .expect("run bench/lib/apache.sh stop");
        assert!(
            o.status.success(),
            "httpd stop: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Httpd {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(apache_lib())
            .arg("stop")
            .arg(&self.conf_dir)
            .output();
    }
}

/// Runs `ab`, bounded in time; returns (complete, failed) requests.
fn ab(port: u16, requests: usize, concurrency: usize) -> (usize, usize) {
    let mut child = Command::new("ab")
        .args(["-q", "-n", &requests.to_string()])
        .args(["-c", &concurrency.to_string()])
        .args(["-s", "60"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ab (ApacheBench, package apache2-utils)");
    let status = wait_child(&mut child, "ab");
    let o = child.wait_with_output().expect("ab output");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        status.success(),
        "ab failed: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let field = |name: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` in ab's output: {text}"))
    };
    (field("Complete requests:"), field("Failed requests:"))
}

#[test]
fn apache_logging_through_petrel_pipe_never_waits_for_a_stalled_sink_and_loses_nothing() {
    assert!(
        Path::new(APACHE_BIN).exists(),
        "{APACHE_BIN} missing: scripts/install-syslog-tools.sh installs apache2 (the test command runs it)"
    );
    let dir = tempdir();
    // httpd's workers (www-data) must reach the document root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let spool = dir.path().join("spool");
    let out_dir = dir.path().join("httpd");
    std::fs::create_dir_all(&spool).unwrap();

    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let cfg = write_config(
        dir.path(),
        "apache",
        &format!(
            "sources:\n  - type: spool\n    path: {}\nsinks:\n  - type: http\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n    batch: {{ max_events: 500, timeout_ms: 200 }}\n",
            spool.display()
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));

    let port = free_port();
    let mut httpd = Httpd::start(
        &out_dir,
        port,
        &format!(
            "CustomLog \"|{} pipe --spool-dir {} --name apache\" bench",
            bin().display(),
            spool.display()
        ),
    );
    // One request first: once the agent has sent it and the server holds
    // it, the sink is stalled before the load starts.
    assert_eq!(ab(port, 1, 1), (1, 0));
    wait_for(LONG, "the sink's first request held", || {
        if server.held.load(Ordering::SeqCst) > 0 {
            Ok(())
        } else {
            Err("nothing sent yet".to_string())
        }
    });

    let (complete, failed) = ab(port, REQUESTS, 10);
    assert_eq!((complete, failed), (REQUESTS, 0), "every request served");
    assert!(
        server.bodies.lock().unwrap().is_empty() && server.held.load(Ordering::SeqCst) > 0,
        "the sink stayed stalled while Apache served every request"
    );

    // httpd stops; `petrel pipe` sees EOF and makes its final fsync.
    httpd.stop();
    server.released.store(true, Ordering::SeqCst);
    let want = REQUESTS + 1;
    let count_ids = || -> HashMap<String, usize> {
        let mut ids = HashMap::new();
        for body in server.bodies.lock().unwrap().iter() {
            for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let v: serde_json::Value =
                    serde_json::from_slice(line).expect("ndjson from the sink");
                let msg = v["message"].as_str().expect("message field");
                // LogFormat `bench` ends with mod_unique_id's UNIQUE_ID.
                let id = msg.rsplit(' ').next().unwrap_or_default().to_string();
                *ids.entry(id).or_default() += 1;
            }
        }
        ids
    };
    wait_for(LONG, "every access-log line delivered", || {
        let n: usize = count_ids().values().sum();
        if n >= want {
            Ok(())
        } else {
            Err(format!("{n} of {want}"))
        }
    });
    // Anything beyond (a duplicate) would arrive now.
    std::thread::sleep(Duration::from_millis(1500));
    let ids = count_ids();
    let dups: Vec<_> = ids.iter().filter(|(_, &n)| n != 1).collect();
    assert!(dups.is_empty(), "lines delivered more than once: {dups:?}");
    assert_eq!(ids.len(), want, "every request's line, exactly once");
    assert!(
        ids.keys().all(|id| id.len() >= 20 && id != "-"),
        "every line carries its UNIQUE_ID"
    );
}
