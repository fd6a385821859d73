//! A real OpenSearch 2.19.6 node on 127.0.0.1 for the tests, run from the
//! jars `scripts/opensearch.sh` builds into `.cache/opensearch/lib`, and a
//! small client for its REST API.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use super::server::{free_port, ServerProcess};

/// A running (or stopped) node with its own data directory.
pub struct OpenSearch {
    server: ServerProcess,
    /// HTTP port.
    pub port: u16,
    settings: Vec<String>,
}

fn java_cp() -> String {
    let lib = super::server::cached_entry("opensearch", "scripts/opensearch.sh").join("lib");
    format!("{}/*", lib.display())
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
        let mut os = OpenSearch {
            server: ServerProcess::new("OpenSearch", "petrel-opensearch-", "node.log"),
            port: free_port(),
            settings: settings.iter().map(|s| s.to_string()).collect(),
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
        .arg(self.server.dir().join("home"))
        .arg(self.port.to_string())
        .args(&self.settings);
        let port = self.port;
        self.server.start(
            cmd,
            Duration::from_secs(180),
            Duration::from_millis(250),
            || {
                let (status, body) = request(port, "GET", "/_cluster/health", None);
                status == 200 && !body.contains("\"red\"")
            },
        );
    }

    /// Stops the node (SIGTERM, then SIGKILL after 30 s).
    pub fn stop(&mut self) {
        self.server.stop(Duration::from_secs(30));
    }

    /// The node's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
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
        self.server.kill();
        if std::thread::panicking() {
            eprintln!("---- OpenSearch log (tail) ----\n{}\n----", self.log());
        }
    }
}
