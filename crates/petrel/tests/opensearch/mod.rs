//! A real OpenSearch 2.19.6 node on 127.0.0.1 for the tests, run from the
//! jars `scripts/opensearch.sh` builds into `.cache/opensearch/lib`, and a
//! small client for its REST API.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) node with its own data directory.
pub struct OpenSearch {
    dir: tempfile::TempDir,
    /// HTTP port.
    pub port: u16,
    settings: Vec<String>,
    child: Option<Child>,
}

fn lib_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/opensearch/lib")
}

fn java_cp() -> String {
    let lib = lib_dir();
    let built = std::fs::read_dir(&lib)
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(".complete-"))
        })
        .unwrap_or(false);
    assert!(
        built,
        "OpenSearch jars missing in {}: run scripts/opensearch.sh (scripts/test.sh does)",
        lib.display()
    );
    format!("{}/*", lib.display())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One request to `port`: (status, body). Connection errors are status 0.
pub fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let url = format!("http://127.0.0.1:{port}{path}");
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut rb = client.request(m, url);
        if let Some(b) = body {
            rb = rb
                .header("Content-Type", "application/json")
                .body(b.to_string());
        }
        match rb.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            }
            Err(e) => (0, e.to_string()),
        }
    })
}

impl OpenSearch {
    /// Starts a node on a free port with extra `key=value` settings and
    /// waits until it answers `GET /`; sets new indices to no replicas.
    pub fn start(settings: &[&str]) -> OpenSearch {
        let dir = tempfile::Builder::new()
            .prefix("petrel-opensearch-")
            .tempdir()
            .expect("temp dir");
        let mut os = OpenSearch {
            dir,
            port: free_port(),
            settings: settings.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        os.restart();
        // A single node never assigns replicas: without this every index
        // stays yellow.
        os.ok(
            "PUT",
            "/_index_template/petrel-test-defaults",
            r#"{"index_patterns":["*"],"priority":0,"template":{"settings":{"number_of_replicas":0}}}"#,
        );
        os
    }

    /// Starts the node process again (after [`OpenSearch::stop`]), on the
    /// same port and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "node already running");
        let log = std::fs::File::create(self.dir.path().join("node.log")).expect("node log");
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xms512m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            &java_cp(),
            "dev.petrel.opensearch.TestNode",
        ])
        .arg(self.dir.path().join("home"))
        .arg(self.port.to_string())
        .args(&self.settings)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("log fd")))
        .stderr(Stdio::from(log));
        // The node must not outlive a test process that dies without
        // dropping it.
        // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("start java (OpenSearch)"));
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let (status, body) = request(self.port, "GET", "/_cluster/health", None);
            if status == 200 && !body.contains("\"red\"") {
                return;
            }
            if let Some(ch) = self.child.as_mut() {
                if let Ok(Some(st)) = ch.try_wait() {
                    panic!("OpenSearch exited early ({st}); log:\n{}", self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "OpenSearch not ready within 180 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Stops the node (SIGTERM, then SIGKILL after 30 s).
    pub fn stop(&mut self) {
        let Some(mut ch) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(ch.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = ch.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = ch.kill();
        let _ = ch.wait();
    }

    /// The node's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default();
        let mut from = s.len().saturating_sub(4096);
        while !s.is_char_boundary(from) {
            from += 1;
        }
        s[from..].to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A request that must succeed; returns the answer as JSON.
    pub fn ok(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let (status, text) = request(self.port, method, path, (!body.is_empty()).then_some(body));
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {text}"
        );
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Documents in `index` (refreshed first, so all are counted).
    pub fn count(&self, index: &str) -> u64 {
        let (s, _) = request(self.port, "POST", &format!("/{index}/_refresh"), None);
        if s != 200 {
            return 0;
        }
        let (s, text) = request(self.port, "GET", &format!("/{index}/_count"), None);
        if s != 200 {
            return 0;
        }
        serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["count"].as_u64())
            .unwrap_or(0)
    }

    /// Values of keyword field `field` found in more than one document of
    /// `index` (at most 20).
    pub fn repeated(&self, index: &str, field: &str) -> Vec<String> {
        let v = self.ok(
            "POST",
            &format!("/{index}/_search"),
            &format!(
                r#"{{"size":0,"aggs":{{"d":{{"terms":{{"field":"{field}","min_doc_count":2,"size":20}}}}}}}}"#
            ),
        );
        v["aggregations"]["d"]["buckets"]
            .as_array()
            .map(|b| {
                b.iter()
                    .map(|x| format!("{} x{}", x["key"], x["doc_count"]))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for OpenSearch {
    fn drop(&mut self) {
        if let Some(mut ch) = self.child.take() {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- OpenSearch log (tail) ----\n{}\n----", self.log());
        }
    }
}
