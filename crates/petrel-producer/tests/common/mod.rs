//! Runs a real `petrel run` (HTTP source → ndjson file sink) for the
//! producer's end-to-end tests.

#![allow(dead_code)] // each test file uses a different part

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Generous bound for waits on a loaded 2-core machine.
pub const LONG: Duration = Duration::from_secs(60);
/// Bound for things that should happen within a few seconds.
pub const MEDIUM: Duration = Duration::from_secs(30);

/// The agent binary: PETREL_TEST_BIN, else `petrel` next to this test's
/// target directory (`cargo test --workspace --release` builds it).
pub fn petrel_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PETREL_TEST_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test> → target/<profile>/petrel
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = profile_dir.join("petrel");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release -p petrel` (or set PETREL_TEST_BIN)",
        p.display()
    );
    p
}

/// One of the crate's examples. `cargo test -p petrel-producer` builds
/// them; `cargo test --test e2e` alone does not (it may run a stale one).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = profile_dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release -p petrel-producer --examples`",
        p.display()
    );
    p
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("petrel-producer-e2e-")
        .tempdir()
        .expect("create temp dir")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` every 50 ms until it returns `Ok`, or panics after
/// `timeout` with `what` and the last reason.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) => {
                if start.elapsed() >= timeout {
                    panic!("timed out after {timeout:?} waiting for {what}: {why}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `petrel run` with `type: http` on `port` writing ndjson to
/// `out`; killed on drop.
pub struct Agent {
    child: Child,
    stderr: Arc<Mutex<String>>,
    pub port: u16,
}

impl Agent {
    pub fn start(dir: &Path, port: u16, out: &Path) -> Agent {
        let cfg = dir.join("agent.yaml");
        std::fs::write(
            &cfg,
            format!(
                "sources:\n  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n    max_body_bytes: 16MiB\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
                out.display()
            ),
        )
        .expect("write config");
        let mut cmd = Command::new(petrel_bin());
        // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .arg("run")
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.join("agent-data"))
            .args(["--api-addr", "127.0.0.1:0", "--log-level", "info"])
            .env_remove("PETREL_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn petrel run");
        let pipe = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let s = stderr.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                s.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let agent = Agent {
            child,
            stderr,
            port,
        };
        wait_for(MEDIUM, "the HTTP source to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(|_| ())
                .map_err(|e| format!("{e}; stderr: {}", agent.stderr()))
        });
        agent
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGTERM and wait (the sink flushes what was admitted).
    pub fn stop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + MEDIUM;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "petrel did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- petrel stderr ----\n{}", self.stderr());
        }
    }
}

/// The values of field `n` in the ndjson lines of `out`, counted.
pub fn numbers(out: &Path) -> HashMap<u64, u32> {
    let text = match std::fs::read(out) {
        Ok(t) => t,
        Err(_) => return HashMap::new(),
    };
    let mut h = HashMap::new();
    for line in text.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue; // a line still being written
        };
        if let Some(n) = v["n"].as_str().and_then(|s| s.parse().ok()) {
            *h.entry(n).or_insert(0) += 1;
        }
    }
    h
}

/// Waits until `0..n` each arrived, then asserts exactly once.
pub fn wait_exactly_once(out: &Path, n: u64, timeout: Duration) {
    let h = wait_for(timeout, "every record in the sink", || {
        let h = numbers(out);
        let missing = (0..n).filter(|i| !h.contains_key(i)).count();
        if missing == 0 {
            Ok(h)
        } else {
            Err(format!("{missing} of {n} missing"))
        }
    });
    let dups: Vec<_> = h.iter().filter(|(_, &c)| c > 1).take(5).collect();
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    assert_eq!(h.len() as u64, n, "unexpected extra records");
}
