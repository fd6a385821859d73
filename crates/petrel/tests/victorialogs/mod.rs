//! A real VictoriaLogs v1.52.1 server on 127.0.0.1 for the tests, built by
//! `scripts/victorialogs.sh` into `.cache/victorialogs/bin`, and a small
//! client for its LogsQL query API. It takes the Loki push API (JSON and
//! protobuf+snappy) and OTLP logs, and answers exact counts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server with its own data directory; killed when dropped.
pub struct VictoriaLogs {
    dir: tempfile::TempDir,
    /// HTTP port.
    pub port: u16,
    child: Option<Child>,
}

fn binary() -> PathBuf {
    let b =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/victorialogs/bin/victoria-logs");
    assert!(
        b.exists(),
        "VictoriaLogs missing at {}: run scripts/victorialogs.sh (scripts/test.sh does)",
        b.display()
    );
    b
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One request: (status, body). Connection errors are status 0.
fn request(url: &str, form: Option<&[(&str, &str)]>) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let rb = match form {
            Some(f) => {
                let body: String = f
                    .iter()
                    .map(|(k, v)| format!("{k}={}", urlencode(v)))
                    .collect::<Vec<_>>()
                    .join("&");
                client
                    .post(url)
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body(body)
            }
            None => client.get(url),
        };
        match rb.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            }
            Err(e) => (0, e.to_string()),
        }
    })
}

fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl VictoriaLogs {
    /// Starts a server on a free port (keeping any timestamp, however old)
    /// and waits until it answers `/health`.
    pub fn start() -> VictoriaLogs {
        let dir = tempfile::Builder::new()
            .prefix("petrel-victorialogs-")
            .tempdir()
            .expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log");
        let mut cmd = Command::new(binary());
        cmd.arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!(
                "-storageDataPath={}",
                dir.path().join("data").display()
            ))
            .arg("-retentionPeriod=100y")
            .arg("-futureRetention=100y")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log fd")))
            .stderr(Stdio::from(log));
        // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut vl = VictoriaLogs {
            dir,
            port,
            child: Some(cmd.spawn().expect("start victoria-logs")),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if request(&format!("{}/health", vl.url()), None).0 == 200 {
                return vl;
            }
            if let Some(Ok(Some(st))) = vl.child.as_mut().map(|c| c.try_wait()) {
                panic!("victoria-logs exited early ({st}); log:\n{}", vl.log());
            }
            assert!(
                Instant::now() < deadline,
                "victoria-logs not ready within 60 s; log:\n{}",
                vl.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let mut from = s.len().saturating_sub(4096);
        while !s.is_char_boundary(from) {
            from += 1;
        }
        s[from..].to_string()
    }

    /// Runs a LogsQL query over all time (after making everything received
    /// searchable) and returns its rows.
    pub fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let (s, t) = request(&format!("{}/internal/force_flush", self.url()), None);
        assert_eq!(s, 200, "force_flush: {t}");
        let (s, text) = request(
            &format!("{}/select/logsql/query", self.url()),
            Some(&[("query", q)]),
        );
        assert_eq!(s, 200, "query `{q}`: {text}");
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("a JSON row"))
            .collect()
    }

    /// The number of logs matching the LogsQL filter `filter`.
    pub fn count(&self, filter: &str) -> u64 {
        let rows = self.query(&format!("{filter} | stats count() as n"));
        rows.first()
            .and_then(|r| r["n"].as_str())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for VictoriaLogs {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
