//! The producer's knobs (named and meant as in the seed's producers).

use std::path::PathBuf;

/// How batches are compressed on the wire (`Content-Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    None,
    /// LZ4 frame format: the cheapest on CPU (the default).
    Lz4,
    /// zstd level 1: smaller bodies for a little more CPU.
    Zstd,
    /// gzip (fastest level), for agents behind proxies that only know it.
    Gzip,
}

impl Compression {
    /// `none`, `lz4`, `zstd` or `gzip`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Self::None),
            "lz4" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd),
            "gzip" => Ok(Self::Gzip),
            other => Err(format!(
                "unknown compression `{other}`; use zstd, lz4, gzip or none"
            )),
        }
    }

    pub(crate) fn content_encoding(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Lz4 => Some("lz4"),
            Self::Zstd => Some("zstd"),
            Self::Gzip => Some("gzip"),
        }
    }
}

/// Producer configuration. Start from [`Config::new`] and change fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// Petrel's HTTP source, `http://host:port/path`.
    pub endpoint: String,
    /// `Authorization: Bearer` token, when the source has `auth`.
    pub bearer_token: Option<String>,
    /// Memory cap of queued records (encoded bytes, before compression).
    pub total_size_in_bytes: usize,
    /// How long `send` may wait for room when the cap is reached; 0: it
    /// never waits, the record is rejected and counted (`rejected_full`).
    pub max_block_ms: u64,
    /// A batch is sent once it holds this many bytes...
    pub batch_size_threshold_in_bytes: usize,
    /// ...or this many records...
    pub batch_count_threshold: usize,
    /// ...or is this old.
    pub linger_ms: u64,
    /// Threads compressing and sending batches (one connection each).
    pub io_thread_count: usize,
    /// Retries of a batch after its first attempt failed.
    pub retries: u32,
    /// First retry delay; doubled for every further retry...
    pub base_retry_backoff_ms: u64,
    /// ...up to this. A `Retry-After` answer waits at least that long.
    pub max_retry_backoff_ms: u64,
    /// Wire compression.
    pub compression: Compression,
    /// Bound of one request (connect, send, answer).
    pub request_timeout_ms: u64,
    /// When set, batches that cannot be sent (agent unreachable or full)
    /// or that do not fit in memory go to a crash-safe disk spool here,
    /// and are sent from it later, also by a later process.
    pub spool_dir: Option<PathBuf>,
    /// Cap of the spool on disk.
    pub spool_max_bytes: u64,
}

impl Config {
    /// The defaults (the seed's, with lz4) for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            bearer_token: None,
            total_size_in_bytes: 100 << 20,
            max_block_ms: 60_000,
            batch_size_threshold_in_bytes: 1 << 20,
            batch_count_threshold: 40_960,
            linger_ms: 2_000,
            io_thread_count: 2,
            retries: 10,
            base_retry_backoff_ms: 100,
            max_retry_backoff_ms: 50_000,
            compression: Compression::Lz4,
            request_timeout_ms: 30_000,
            spool_dir: None,
            spool_max_bytes: 1 << 30,
        }
    }
}
