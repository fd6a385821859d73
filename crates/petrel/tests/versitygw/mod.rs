//! A real Versity S3 gateway (versitygw v1.8.0) on 127.0.0.1 for the
//! tests, built by `scripts/versitygw.sh` into `.cache/versitygw/bin`,
//! serving a POSIX directory of its own, and a small S3 client (list, get)
//! that signs its requests with the same crate as the sink.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use rusty_s3::actions::S3Action;
use rusty_s3::{Bucket, Credentials, UrlStyle};

use super::server::{cached_binary, free_port, ServerProcess};

/// The gateway's root keys.
pub const ACCESS_KEY: &str = "petrel-test-key";
/// The secret of [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "petrel-test-secret-0123456789";
/// The bucket the tests write to (created before the gateway starts).
pub const BUCKET: &str = "logs";

/// A running gateway with its own directory; killed when dropped.
pub struct Versity {
    server: ServerProcess,
    /// Its port.
    pub port: u16,
}

/// One object as listed.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag, without quotes (`<md5>-<parts>` for a multipart upload).
    pub etag: String,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

impl Versity {
    /// Starts a gateway on a free port over a fresh directory holding the
    /// bucket [`BUCKET`], and waits until it answers.
    pub fn start() -> Versity {
        let server = ServerProcess::new("versitygw", "petrel-versitygw-", "server.log");
        std::fs::create_dir_all(server.dir().join("root").join(BUCKET)).expect("bucket dir");
        let mut v = Versity {
            server,
            port: free_port(),
        };
        v.run();
        v
    }

    fn run(&mut self) {
        let mut cmd = Command::new(cached_binary(
            "versitygw/bin/versitygw",
            "scripts/versitygw.sh",
        ));
        cmd.arg("--access")
            .arg(ACCESS_KEY)
            .arg("--secret")
            .arg(SECRET_KEY)
            .arg("--port")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("posix")
            .arg(self.server.dir().join("root"));
        let url = self.url();
        self.server.start(
            cmd,
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                runtime().block_on(async {
                    reqwest::Client::new()
                        .get(&url)
                        .timeout(Duration::from_secs(2))
                        .send()
                        .await
                        .is_ok()
                })
            },
        );
    }

    /// Stops the gateway (the directory stays).
    pub fn stop(&mut self) {
        self.server.stop(Duration::from_secs(10));
    }

    /// Starts it again on the same port over the same directory.
    pub fn restart(&mut self) {
        self.run();
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The gateway's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The sink's YAML lines for this gateway (indented for a sink entry).
    pub fn sink_keys(&self) -> String {
        format!(
            "    bucket: {BUCKET}\n    endpoint: \"{}\"\n    auth: {{ access_key_id: {ACCESS_KEY}, secret_access_key: {SECRET_KEY} }}\n",
            self.url()
        )
    }

    fn bucket(&self) -> Bucket {
        Bucket::new(
            self.url().parse().expect("url"),
            UrlStyle::Path,
            BUCKET,
            "us-east-1",
        )
        .expect("bucket")
    }

    /// Every object of the bucket.
    pub fn list(&self) -> Vec<Object> {
        let bucket = self.bucket();
        let creds = Credentials::new(ACCESS_KEY, SECRET_KEY);
        let client = reqwest::Client::new();
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        runtime().block_on(async {
            loop {
                let mut action = bucket.list_objects_v2(Some(&creds));
                if let Some(t) = &token {
                    action.with_continuation_token(t.clone());
                }
                let url = action.sign(Duration::from_secs(600));
                let resp = client.get(url).send().await.expect("list");
                let status = resp.status();
                let text = resp.text().await.expect("list body");
                assert!(status.is_success(), "list: {status} {text}");
                let parsed =
                    rusty_s3::actions::ListObjectsV2::parse_response(&text).expect("list answer");
                for c in parsed.contents {
                    out.push(Object {
                        key: c.key,
                        size: c.size,
                        etag: c.etag.trim_matches('"').to_string(),
                    });
                }
                match parsed.next_continuation_token {
                    Some(t) => token = Some(t),
                    None => break,
                }
            }
        });
        out
    }

    /// The lines of object `key`, decompressed by its extension (`.gz`,
    /// `.zst`, else as stored).
    pub fn object_lines(&self, key: &str) -> Vec<String> {
        use std::io::Read;
        let raw = self.get(key);
        let mut text = String::new();
        if key.ends_with(".gz") {
            flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_string(&mut text)
                .unwrap_or_else(|e| panic!("{key} is not gzip: {e}"));
        } else if key.ends_with(".zst") {
            let bytes = zstd::stream::decode_all(&raw[..])
                .unwrap_or_else(|e| panic!("{key} is not zstd: {e}"));
            text = String::from_utf8(bytes).expect("utf-8");
        } else {
            text = String::from_utf8(raw).expect("utf-8");
        }
        text.lines().map(str::to_string).collect()
    }

    /// The bytes of object `key` (as stored: still compressed).
    pub fn get(&self, key: &str) -> Vec<u8> {
        let bucket = self.bucket();
        let creds = Credentials::new(ACCESS_KEY, SECRET_KEY);
        let url = bucket
            .get_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        runtime().block_on(async {
            let resp = reqwest::Client::new().get(url).send().await.expect("get");
            assert!(resp.status().is_success(), "get {key}: {}", resp.status());
            resp.bytes().await.expect("object body").to_vec()
        })
    }
}
