//! A real VictoriaLogs v1.52.1 server on 127.0.0.1 for the tests, built by
//! `scripts/victorialogs.sh` into `.cache/victorialogs/bin`, and a small
//! client for its LogsQL query API. It takes the Loki push API (JSON and
//! protobuf+snappy) and OTLP logs, and answers exact counts.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use super::server::{cached_binary, free_port, ServerProcess};

/// A running server with its own data directory; killed when dropped.
pub struct VictoriaLogs {
    server: ServerProcess,
    /// HTTP port.
    pub port: u16,
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
        let mut server = ServerProcess::new("victoria-logs", "petrel-victorialogs-", "server.log");
        let port = free_port();
        let mut cmd = Command::new(cached_binary(
            "victorialogs/bin/victoria-logs",
            "scripts/victorialogs.sh",
        ));
        cmd.arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!(
                "-storageDataPath={}",
                server.dir().join("data").display()
            ))
            .arg("-retentionPeriod=100y")
            .arg("-futureRetention=100y");
        let health = format!("http://127.0.0.1:{port}/health");
        server.start(
            cmd,
            Duration::from_secs(60),
            Duration::from_millis(100),
            || request(&health, None).0 == 200,
        );
        VictoriaLogs { server, port }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
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
