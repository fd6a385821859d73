//! `type: s3` — archives events as objects in AWS S3 or an S3-compatible
//! store (MinIO, Versity, Ceph, ...), with the key names of Vector's
//! `aws_s3` sink where they mean the same.
//!
//! Encoding (on the processing pool) writes each event as `text` or
//! `ndjson`, groups a batch's events by object (their rendered
//! `key_prefix` and the stream they were read from) and compresses each
//! group into one gzip member or zstd frame: an object is those pieces
//! appended, itself one valid gzip or zstd stream. Delivery ([`objects`])
//! appends the pieces to the open objects, holding compressed bytes only;
//! an object whose compressed bytes reach 5 MiB becomes a multipart upload
//! and sends its parts as it grows. An object is closed by size
//! (`batch.max_bytes` before compression, `batch.max_events`) or by time
//! (`batch.timeout_ms` after it was opened), and its events are
//! acknowledged only once it is complete in the store. Every call goes
//! through the driver's policy ([`super::driver::Calls`]): retried with
//! backoff on no answer, 408, 429, 5xx and `SlowDown`; held loudly on 403
//! naming the bucket and key.
//!
//! Keys: `<key_prefix><filename_time_format>-<id>.<filename_extension>`,
//! where the prefix's strftime conversions and the file name's time are
//! the first event's time, and `<id>` is derived from the source position
//! of the first event (as the elasticsearch sink's document ids:
//! [`super::origin`]), so that an object sent again after a crash has the
//! same key. [`journal`] keeps the lines of an object sent again out of
//! any other object.

pub mod auth;
pub mod journal;
mod objects;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, EngineOptions, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::client::{build_client, env_str, parse_tls, Tls};
use super::driver::{Calls, Compression, Wording};
use super::template::{strftime, TimeTemplate};
use auth::{CredentialSource, Provider};
use journal::Journal;
use objects::{Chunk, Chunks, GroupKey};

/// Keys accepted by the s3 sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "bucket",
    "region",
    "endpoint",
    "force_path_style",
    "key_prefix",
    "filename_time_format",
    "filename_extension",
    "encoding",
    "compression",
    "content_type",
    "auth",
    "storage_class",
    "server_side_encryption",
    "ssekms_key_id",
    "tls",
    "batch",
    "timeout_ms",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Archives events as objects in AWS S3 or an S3-compatible store (MinIO, Versity, Ceph), with the key names of Vector's `aws_s3` sink. An object is closed by size or time, uploaded in parts as it grows once it passes 5 MiB compressed, and its events are acknowledged only once it is complete in the store. Its key holds the source position of its first event, and a record of completed objects in the data dir keeps lines read again after a crash out of a second object (see "Archiving to S3" and "Delivery guarantees"). Cargo feature `s3` (default)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "bucket",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: the bucket's name."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "region",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"us-east-1"#),
        doc: r#"The region requests are signed for (and of the default endpoint and STS endpoint)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "endpoint",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"https://s3.<region>.amazonaws.com"#),
        doc: r#"The store's URL, for S3-compatible stores (`http://127.0.0.1:7070`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "force_path_style",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"true"#),
        doc: r#"`true`: `<endpoint>/<bucket>/<key>`; `false`: virtual-hosted `<bucket>.<endpoint host>/<key>`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "key_prefix",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"date=%F/"#),
        doc: r#"The start of every key: `{{ field }}` templates and strftime conversions (`%Y %m %d %H %M %S %j %F %T %s`) of the first event's time (UTC; the time it was encoded when it has none). Events whose prefixes differ go to different objects."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "filename_time_format",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"%s"#),
        doc: r#"The time of the first event at the start of the file name, in strftime conversions; the file name goes on with `-` and an id derived from the first event's source position (random for sources without stable positions)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "filename_extension",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"log, log.gz or log.zst by compression"#),
        doc: r#"The end of every key, after a dot."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["text", "ndjson"]),
        default: Some(r#"text"#),
        doc: r#"`text`: the message and a newline; `ndjson`: one JSON object per event."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(&["gzip", "zstd", "none"]),
        default: Some(r#"gzip"#),
        doc: r#"Of the objects (sent with `Content-Encoding`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "content_type",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"text/x-log"#),
        doc: r#"The objects' `Content-Type`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "auth",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"`{access_key_id, secret_access_key, session_token}` (`${ENV}` expanded). Without it: a web identity token (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`, exchanged at STS, `AWS_ENDPOINT_URL_STS` to override; IRSA), else `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` of the environment."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "storage_class",
        kind: petrel_core::plugin::KeyKind::OneOf(STORAGE_CLASSES),
        default: None,
        doc: r#"The objects' storage class (`x-amz-storage-class`); the bucket's default without it."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "server_side_encryption",
        kind: petrel_core::plugin::KeyKind::OneOf(&["AES256", "aws:kms", "aws:kms:dsse"]),
        default: None,
        doc: r#"Server-side encryption of the objects (`x-amz-server-side-encryption`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "ssekms_key_id",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"The KMS key of `server_side_encryption: aws:kms` (`x-amz-server-side-encryption-aws-kms-key-id`)."#,
    },
    crate::sinks::tls::TLS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "batch",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{max_bytes: 10MiB, max_events: 10000000, timeout_ms: 300000}"#),
        doc: r#"When an object is closed: once it holds `max_bytes` of encoded events (before compression; Vector's `batch.max_bytes`) or `max_events` events, or `timeout_ms` after it was opened (Vector's `batch.timeout_secs`). Its events are acknowledged only then, so `timeout_ms` also bounds how long a source waits for them (see "Archiving to S3")."#,
    },
    crate::sinks::http::timeout_doc(r#"60000"#),
    crate::sinks::METADATA_DOC,
    crate::sinks::ONLY_FIELDS_DOC,
    crate::sinks::EXCEPT_FIELDS_DOC,
    crate::sinks::TIMESTAMP_FORMAT_DOC,
    crate::sinks::TIMESTAMP_KEY_DOC,
];

/// The storage classes S3 knows.
const STORAGE_CLASSES: &[&str] = &[
    "STANDARD",
    "REDUCED_REDUNDANCY",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER",
    "GLACIER_IR",
    "DEEP_ARCHIVE",
    "EXPRESS_ONEZONE",
];

/// Keys given in the config (`auth:`).
#[derive(Clone)]
pub struct StaticKeys {
    /// `access_key_id`.
    pub access_key_id: String,
    /// `secret_access_key`.
    pub secret_access_key: String,
    /// `session_token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        write!(f, "StaticKeys({}, ..)", self.access_key_id)
    }
}

/// Configuration of the s3 sink.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// The signing region.
    pub region: String,
    /// The store's URL.
    pub endpoint: reqwest::Url,
    /// Path-style URLs.
    pub force_path_style: bool,
    /// The start of every key.
    pub key_prefix: TimeTemplate,
    /// The time at the start of a file name (strftime).
    pub filename_time_format: String,
    /// The end of every key.
    pub filename_extension: String,
    /// How events are written.
    pub encoding: Encoding,
    /// Of the objects.
    pub compression: Compression,
    /// `Content-Type` of the objects.
    pub content_type: String,
    /// Keys from the config; the environment's without.
    pub auth: Option<StaticKeys>,
    /// `x-amz-storage-class`.
    pub storage_class: Option<String>,
    /// `x-amz-server-side-encryption`.
    pub server_side_encryption: Option<String>,
    /// `x-amz-server-side-encryption-aws-kms-key-id`.
    pub ssekms_key_id: Option<String>,
    /// TLS settings.
    pub tls: Tls,
    /// An object is closed at this many encoded bytes.
    pub max_bytes: usize,
    /// An object is closed at this many events.
    pub max_events: usize,
    /// An object is closed this long after it was opened.
    pub max_age: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
}

impl S3Config {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let bucket = map.required("bucket", "my-logs")?.as_str()?.to_string();
        if bucket.is_empty() || bucket.contains('/') {
            if let Some(n) = map.get("bucket") {
                n.error(format!(
                    "`bucket` must be a bucket's name, without `/`, e.g. `my-logs`; found `{bucket}`"
                ));
            }
            return None;
        }
        let region = match map.get("region") {
            Some(n) => env_str(n, "region")?,
            None => "us-east-1".to_string(),
        };
        let endpoint = match map.get("endpoint") {
            None => format!("https://s3.{region}.amazonaws.com"),
            Some(n) => env_str(n, "endpoint")?,
        };
        let endpoint = match reqwest::Url::parse(&endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => u,
            Ok(u) => {
                map.node().error(format!(
                    "`endpoint` must be http:// or https://, found `{}`",
                    u.scheme()
                ));
                return None;
            }
            Err(e) => {
                map.node()
                    .error(format!("`endpoint` is not a valid URL ({e}): `{endpoint}`"));
                return None;
            }
        };
        let key_prefix = match map.get("key_prefix") {
            Some(n) => {
                let text = n.as_str()?;
                // A `..` segment makes a key that names a place outside
                // the prefix for every store that maps keys to paths (a
                // POSIX-backed gateway, `aws s3 sync` to a disk).
                if text.split('/').any(|seg| seg == "..") || text.starts_with('/') {
                    n.error(format!(
                        "`key_prefix` must stay inside the bucket's key space: no `..` segment and no leading `/` (got `{text}`)"
                    ));
                    return None;
                }
                TimeTemplate::parse(text, n, "key_prefix")?
            }
            None => TimeTemplate::parse("date=%F/", map.node(), "key_prefix")?,
        };
        let filename_time_format = match map.get("filename_time_format") {
            Some(n) => {
                let text = n.as_str()?;
                let t = TimeTemplate::parse(text, n, "filename_time_format")?;
                if !t.is_static() {
                    n.error("`filename_time_format` takes strftime conversions only, no `{{ field }}`; put fields in `key_prefix`");
                    return None;
                }
                text.to_string()
            }
            None => "%s".to_string(),
        };
        let compression = match map.choice("compression", &["gzip", "zstd", "none"]) {
            Some("zstd") => Compression::Zstd,
            Some("none") => Compression::None,
            Some(_) => Compression::Gzip,
            None if map.get("compression").is_some() => return None,
            None => Compression::Gzip,
        };
        let filename_extension = match map.str("filename_extension") {
            Some(e) => e.trim_start_matches('.').to_string(),
            None => match compression {
                Compression::Gzip => "log.gz".into(),
                Compression::Zstd => "log.zst".into(),
                Compression::None => "log".into(),
            },
        };
        let encoding = super::parse_encoding(&map)?;
        let auth = match map.get("auth") {
            None => None,
            Some(n) => {
                let m = n.as_map(&["access_key_id", "secret_access_key", "session_token"])?;
                let key = env_str(
                    m.required("access_key_id", "\"${AWS_ACCESS_KEY_ID}\"")?,
                    "access_key_id",
                )?;
                let secret = env_str(
                    m.required("secret_access_key", "\"${AWS_SECRET_ACCESS_KEY}\"")?,
                    "secret_access_key",
                )?;
                let token = match m.get("session_token") {
                    Some(t) => Some(env_str(t, "session_token")?),
                    None => None,
                };
                Some(StaticKeys {
                    access_key_id: key,
                    secret_access_key: secret,
                    session_token: token,
                })
            }
        };
        let storage_class = match map.get("storage_class") {
            Some(n) => Some(n.as_choice(STORAGE_CLASSES)?.to_string()),
            None => None,
        };
        let server_side_encryption = match map.get("server_side_encryption") {
            Some(n) => Some(
                n.as_choice(&["AES256", "aws:kms", "aws:kms:dsse"])?
                    .to_string(),
            ),
            None => None,
        };
        let ssekms_key_id = match map.get("ssekms_key_id") {
            Some(n) => {
                if !server_side_encryption
                    .as_deref()
                    .is_some_and(|s| s.starts_with("aws:kms"))
                {
                    n.error("`ssekms_key_id` needs `server_side_encryption: aws:kms`");
                    return None;
                }
                Some(env_str(n, "ssekms_key_id")?)
            }
            None => None,
        };
        let tls = match map.get("tls") {
            Some(n) => parse_tls(n)?,
            None => Tls {
                verify: true,
                ..Tls::default()
            },
        };
        let (max_bytes, max_events, max_age) =
            super::http::parse_batch(&map, (10 << 20, 10_000_000, 300_000));
        Some(Self {
            bucket,
            region,
            endpoint,
            force_path_style: map.bool("force_path_style").unwrap_or(true),
            key_prefix,
            filename_time_format,
            filename_extension,
            encoding,
            compression,
            content_type: map.str("content_type").unwrap_or("text/x-log").to_string(),
            auth,
            storage_class,
            server_side_encryption,
            ssekms_key_id,
            tls,
            max_bytes,
            max_events,
            max_age: max_age.max(Duration::from_millis(100)),
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(60_000)),
        })
    }

    /// The signed headers of the calls that create an object.
    fn object_headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![("content-type", self.content_type.clone())];
        if let Some(e) = self.compression.content_encoding() {
            h.push(("content-encoding", e.to_string()));
        }
        if let Some(c) = &self.storage_class {
            h.push(("x-amz-storage-class", c.clone()));
        }
        if let Some(s) = &self.server_side_encryption {
            h.push(("x-amz-server-side-encryption", s.clone()));
        }
        if let Some(k) = &self.ssekms_key_id {
            h.push(("x-amz-server-side-encryption-aws-kms-key-id", k.clone()));
        }
        h
    }

    /// Where the keys come from: `auth:`, else the environment.
    fn credentials(&self) -> anyhow::Result<CredentialSource> {
        if let Some(k) = &self.auth {
            let c = match &k.session_token {
                Some(t) => {
                    rusty_s3::Credentials::new_with_token(&k.access_key_id, &k.secret_access_key, t)
                }
                None => rusty_s3::Credentials::new(&k.access_key_id, &k.secret_access_key),
            };
            return Ok(CredentialSource::Static(Arc::new(c)));
        }
        CredentialSource::from_env(&self.region, |k| std::env::var(k).ok()).ok_or_else(|| {
            anyhow::anyhow!(
                "no credentials for bucket {}: set `auth: {{access_key_id, secret_access_key}}`, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN in the agent's environment",
                self.bucket
            )
        })
    }
}

/// The running s3 sink.
pub struct S3Sink {
    config: S3Config,
    metrics: ComponentMetrics,
    store: store::Store,
    journal: Journal,
    calls: Calls,
}

/// The words of the s3 sink's log lines.
const WORDING: Wording = Wording {
    sink: "s3 sink",
    peer: "the bucket",
    items: ("event", "events"),
    hold_fix:
        "the credentials (`auth`, the environment or the role), the bucket's name or its policy",
};

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl S3Sink {
    /// Builds the client; `journal` is the record of completed objects.
    pub fn new(c: &S3Config, metrics: ComponentMetrics, journal: Journal) -> anyhow::Result<Self> {
        let style = if c.force_path_style {
            rusty_s3::UrlStyle::Path
        } else {
            rusty_s3::UrlStyle::VirtualHost
        };
        let bucket = rusty_s3::Bucket::new(
            c.endpoint.clone(),
            style,
            c.bucket.clone(),
            c.region.clone(),
        )
        .map_err(|e| anyhow::anyhow!("bucket {} at {}: {e}", c.bucket, c.endpoint))?;
        let client = build_client(&c.tls, c.timeout, &crate::tls::Owner::of(&metrics))?;
        let store = store::Store::new(
            bucket,
            client,
            Provider::new(c.credentials()?),
            c.object_headers(),
            c.timeout,
        );
        let calls = Calls::new(WORDING, format!("s3://{}", c.bucket), metrics.clone());
        Ok(Self {
            config: c.clone(),
            metrics,
            store,
            journal,
            calls,
        })
    }

    /// The key of a new object whose first event is at `origin` (or
    /// nowhere stable) with time `time_ns`, under `prefix`.
    fn new_key(&self, prefix: &str, origin: Option<(u128, u64)>, time_ns: i64) -> String {
        let mut key = String::with_capacity(prefix.len() + 48);
        key.push_str(prefix);
        strftime(&self.config.filename_time_format, time_ns, &mut key);
        key.push('-');
        match origin {
            Some((stream, first)) => key.push_str(&super::origin::origin_name(stream, first)),
            None => {
                let mut b = [0u8; 16];
                // A clock-based name if the system has no randomness.
                let r = match getrandom::fill(&mut b) {
                    Ok(()) => u128::from_le_bytes(b),
                    Err(_) => now_ns() as u128,
                };
                let mut text = Vec::with_capacity(22);
                super::origin::id_text(r, &mut text);
                key.push_str(&String::from_utf8_lossy(&text));
            }
        }
        key.push('.');
        key.push_str(&self.config.filename_extension);
        key
    }
}

/// One group of a batch's events on its way to being a chunk.
struct Group {
    key: GroupKey,
    first: Option<u64>,
    last: Option<u64>,
    time_ns: i64,
    events: Vec<u32>,
}

impl Sink for S3Sink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        let now = now_ns();
        let mut raw = Vec::with_capacity(batch.buf.len() + batch.buf.len() / 8);
        let mut ends = Vec::with_capacity(batch.events.len());
        out.invalid_utf8 =
            encode_batch(&self.config.encoding, batch, &mut raw, Some(&mut ends)).invalid_utf8;
        // A prefix without fields depends only on the time, to the
        // second: rendered once per second that occurs in the batch.
        let static_prefix = self.config.key_prefix.is_static();
        let mut prefix: Arc<str> = Arc::from("");
        let mut prefix_second: Option<i64> = None;
        let mut text = String::new();
        let mut missing = 0u64;
        let mut groups: Vec<Group> = Vec::new();
        for (i, ev) in batch.events.iter().enumerate() {
            let t = ev.time_ns.unwrap_or(now);
            let second = t.div_euclid(1_000_000_000);
            if !static_prefix || prefix_second != Some(second) {
                if !self.config.key_prefix.render(ev, batch, t, &mut text) {
                    missing += 1;
                }
                if *prefix != *text {
                    prefix = Arc::from(text.as_str());
                }
                prefix_second = Some(second);
            }
            let origin = batch.event_origin(ev);
            let key = GroupKey {
                prefix: prefix.clone(),
                stream: origin.map(|o| o.0),
                segment: origin.map(|(s, p)| self.journal.segment(s, &prefix, p)),
            };
            let g = match groups.iter().rposition(|g| g.key == key) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        key,
                        first: origin.map(|o| o.1),
                        last: None,
                        time_ns: t,
                        events: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            groups[g].last = origin.map(|o| o.1);
            groups[g].events.push(i as u32);
        }
        if missing > 0 {
            self.metrics.error("template_field_missing", missing);
        }
        let mut chunks = Vec::with_capacity(groups.len());
        let single = groups.len() == 1;
        let mut body = Vec::new();
        for g in groups {
            let data: &[u8] = if single {
                &raw
            } else {
                body.clear();
                for &i in &g.events {
                    let start = if i == 0 {
                        0
                    } else {
                        ends[i as usize - 1] as usize
                    };
                    body.extend_from_slice(&raw[start..ends[i as usize] as usize]);
                }
                &body
            };
            let start = out.bytes.len();
            if let Err(e) = self.config.compression.append(data, &mut out.bytes) {
                // Compressing into memory does not fail; if it did, the
                // batch is failed and read again rather than lost.
                tracing::error!(error = %e, "s3 sink: cannot compress a batch");
                out.bytes.truncate(start);
                out.attachment = Some(Box::new(Chunks::Failed));
                return;
            }
            chunks.push(Chunk {
                group: g.key,
                first: g.first,
                last: g.last,
                time_ns: g.time_ns,
                bytes: start..out.bytes.len(),
                raw: data.len(),
                events: g.events.len() as u64,
            });
        }
        out.attachment = Some(Box::new(Chunks::Ok(chunks)));
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(objects::run(self, rx))
    }

    fn expansion_hint(&self) -> usize {
        // The encoded copy is compressed before it is kept.
        match self.config.compression {
            Compression::None => 1200,
            _ => 400,
        }
    }
}

/// The journal's file for the sink `health_key` (`pipeline/id`) under
/// `data_dir`.
fn journal_path(data_dir: &std::path::Path, health_key: &str) -> std::path::PathBuf {
    let name: String = health_key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '.'
            }
        })
        .collect();
    data_dir.join("s3").join(format!("{name}.journal"))
}

/// Registration of `type: s3`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "s3",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| S3Config::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for S3Config {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![self
            .endpoint
            .host_str()
            .unwrap_or_default()
            .to_string()])
    }

    fn type_name(&self) -> &'static str {
        "s3"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(S3Sink::new(self, metrics, Journal::none())?))
    }

    fn build_with(
        &self,
        metrics: ComponentMetrics,
        engine: &EngineOptions,
    ) -> anyhow::Result<Arc<dyn Sink>> {
        let path = journal_path(&engine.data_dir, metrics.health_key());
        let journal = Journal::open(&path).map_err(|e| {
            anyhow::anyhow!("the record of completed objects {}: {e}", path.display())
        })?;
        Ok(Arc::new(S3Sink::new(self, metrics, journal)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};

    fn config(yaml: &str) -> Result<S3Config, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, yaml).map_err(|e| e.to_string())?;
        let errs = ConfigErrors::new();
        let node = Node::root(&f, &raw, &errs);
        let map = node.as_map(KEYS).ok_or("not a map")?;
        let c = S3Config::parse(map);
        match (c, errs.is_empty()) {
            (Some(c), true) => Ok(c),
            _ => Err(format!("{:?}", errs.into_vec())),
        }
    }

    #[test]
    fn defaults_follow_vector() {
        let c = config("bucket: logs\nauth: {access_key_id: a, secret_access_key: b}").expect("ok");
        assert_eq!(c.endpoint.as_str(), "https://s3.us-east-1.amazonaws.com/");
        assert!(c.force_path_style);
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(c.filename_extension, "log.gz");
        assert_eq!(c.max_bytes, 10 << 20);
        assert_eq!(c.max_age, Duration::from_secs(300));
        let mut key = String::new();
        strftime("date=%F/", 1_700_000_000_000_000_000, &mut key);
        assert_eq!(key, "date=2023-11-14/");
        assert_eq!(
            c.object_headers(),
            vec![
                ("content-type", "text/x-log".to_string()),
                ("content-encoding", "gzip".to_string()),
            ]
        );
    }

    #[test]
    fn encryption_and_storage_class_are_signed_headers() {
        let c = config(
            "bucket: logs\ncompression: none\nstorage_class: STANDARD_IA\nserver_side_encryption: aws:kms\nssekms_key_id: k1",
        )
        .expect("ok");
        let h = c.object_headers();
        assert!(h.contains(&("x-amz-storage-class", "STANDARD_IA".into())));
        assert!(h.contains(&("x-amz-server-side-encryption", "aws:kms".into())));
        assert!(h.contains(&("x-amz-server-side-encryption-aws-kms-key-id", "k1".into())));
        assert!(!h.iter().any(|(k, _)| *k == "content-encoding"));
    }

    #[test]
    fn config_errors_name_the_key() {
        let e = config("bucket: logs\nssekms_key_id: k").expect_err("needs aws:kms");
        assert!(e.contains("server_side_encryption: aws:kms"), "{e}");
        for bad in ["../x/", "logs/../../etc/", "/abs/", "a/.."] {
            let e = config(&format!("bucket: logs\nkey_prefix: \"{bad}\"")).expect_err(bad);
            assert!(e.contains("`..` segment"), "{bad}: {e}");
        }
        assert!(config("bucket: logs\nkey_prefix: \"a..b/..c/\"").is_ok());
        let e = config("bucket: logs\nkey_prefix: \"%Q/\"").expect_err("bad conversion");
        assert!(e.contains("`%Q`") && e.contains("key_prefix"), "{e}");
        let e = config("bucket: a/b").expect_err("a path");
        assert!(e.contains("bucket"), "{e}");
        let e = config("bucket: logs\nfilename_time_format: \"{{ x }}\"").expect_err("fields");
        assert!(e.contains("filename_time_format"), "{e}");
        assert!(config("region: x").is_err());
    }

    #[test]
    fn journal_files_are_named_by_the_sink() {
        let p = journal_path(std::path::Path::new("/d"), "main/s3 out");
        assert_eq!(p, std::path::Path::new("/d/s3/main.s3.out.journal"));
    }
}
