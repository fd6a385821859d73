//! The one way the end-to-end tests start a server process (Kafka,
//! OpenSearch, VictoriaLogs, the OpenTelemetry Collector and every server
//! added later): its own temporary directory, its output in a log file
//! there, killed with the test process (`PR_SET_PDEATHSIG`) and on drop, a
//! bounded wait until it is ready that fails with the server's log, and a
//! stop that escalates from SIGTERM to SIGKILL.
//!
//! Each server's module keeps only what is its own: the command line, the
//! readiness probe and its client helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process with its own directory; killed when dropped.
pub struct ServerProcess {
    /// What it is, for messages ("kafka broker", "OpenSearch" ...).
    name: String,
    dir: tempfile::TempDir,
    log_name: String,
    child: Option<Child>,
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The test cache entry `.cache/<name>` (a link into the test cache,
/// scripts/lib/cache.sh), complete, or a failure that says which script
/// builds it.
pub fn cached_entry(name: &str, script: &str) -> PathBuf {
    let e = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache")
        .join(name);
    assert!(
        e.join(".complete").exists(),
        "{} is missing or was not built to the end: run {script} (scripts/test.sh does)",
        e.display()
    );
    e
}

/// A server binary under the repository's `.cache/`, or a failure that
/// says which script builds it.
pub fn cached_binary(rel: &str, script: &str) -> PathBuf {
    let b = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache")
        .join(rel);
    assert!(
        b.exists(),
        "{} missing: run {script} (scripts/test.sh does)",
        b.display()
    );
    b
}

impl ServerProcess {
    /// A server not yet started, with a fresh directory named after
    /// `prefix`; its output goes to `log_name` in that directory.
    pub fn new(name: &str, prefix: &str, log_name: &str) -> ServerProcess {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir");
        ServerProcess {
            name: name.to_string(),
            dir,
            log_name: log_name.to_string(),
            child: None,
        }
    }

    /// The server's own directory (data, configuration, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the process was started and not stopped.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Starts `cmd` (its output into the log file, appended, so the log of
    /// every run since `new` stays readable), then polls `ready` every
    /// `poll` until it returns true; fails with the log if the process
    /// exits first or `timeout` passes.
    pub fn start(
        &mut self,
        mut cmd: Command,
        timeout: Duration,
        poll: Duration,
        mut ready: impl FnMut() -> bool,
    ) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(&self.log_name))
            .expect("server log");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log fd")))
            .stderr(Stdio::from(log));
        // The server must not outlive a test process that dies without
        // dropping it.
        // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.name));
        self.child = Some(child);
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                panic!("{} exited early ({st}); log:\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready within {timeout:?}; log:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(poll);
        }
    }

    /// Stops the server: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut ch) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(ch.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = ch.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = ch.kill();
        let _ = ch.wait();
    }

    /// Kills the server at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut ch) = self.child.take() {
            let _ = ch.kill();
            let _ = ch.wait();
        }
    }

    /// The last 4 KiB of the server's log.
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join(&self.log_name)).unwrap_or_default();
        let mut from = s.len().saturating_sub(4096);
        while !s.is_char_boundary(from) {
            from += 1;
        }
        s[from..].to_string()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
