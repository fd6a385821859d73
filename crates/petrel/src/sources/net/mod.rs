//! Machinery shared by the sources that receive data (sockets, HTTP, a
//! spool written by `petrel pipe`): listening options, the buffer that
//! makes accepted data durable, and delivery with retries.
//!
//! Data moves in [`Block`]s: one buffer, the frames (messages) found in it
//! and the peer that sent them. A connection hands blocks to its source's
//! [`intake::Intake`]; with `buffer.type: memory` the intake charges the
//! pipeline budget and emits them, keeping each block until every sink
//! acknowledged it; with `disk` it appends them to a spool and a reader
//! thread emits them from there, committing delivered ranges. The
//! source's [`Decode`] turns a block into events either way, so what is
//! spooled is the raw frames and replay decodes exactly like live data.

pub mod body;
pub mod dgram;
pub mod intake;
pub mod record;
pub mod server;
pub mod stream;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use petrel_core::config::Map;
use petrel_core::{EventBatch, Span};

/// A buffer of received data and the messages in it.
#[derive(Debug, Clone)]
pub struct Block {
    /// The received bytes; `frames` point into it.
    pub buf: Bytes,
    /// One span per message.
    pub frames: Vec<Span>,
    /// Who sent it (`ip:port`, a socket path), when known.
    pub peer: Option<Arc<str>>,
    /// When it was received, nanoseconds since the epoch.
    pub received_ns: i64,
    /// The frames are JSON objects (HTTP with a JSON content type) rather
    /// than text.
    pub json: bool,
}

/// Turns a block's frames into events.
pub trait Decode: Send + Sync + 'static {
    /// Appends one event per frame of `block` to `batch`, whose buffer is
    /// `block.buf`.
    fn decode(&self, block: &Block, batch: &mut EventBatch);
}

/// Frames are the messages as they are.
#[derive(Debug, Default)]
pub struct RawDecode;

impl Decode for RawDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        batch.events.extend(
            block
                .frames
                .iter()
                .map(|s| petrel_core::Event::from_span(*s)),
        );
    }
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// What happens when the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Stop reading (TCP pushes back; HTTP answers 503 with `Retry-After`).
    Block,
    /// Drop what arrives, counted as `buffer_full`.
    DropNewest,
}

/// `buffer:` of a receiving source.
#[derive(Debug, Clone)]
pub struct BufferOptions {
    /// `true` for `type: disk`.
    pub disk: bool,
    /// Disk only: spool size cap.
    pub max_bytes: u64,
    /// What to do when full.
    pub when_full: WhenFull,
    /// Disk only: data read from a socket is durable within this time
    /// (HTTP requests wait for their own sync and are never delayed by it).
    pub sync_interval: Duration,
}

impl Default for BufferOptions {
    fn default() -> Self {
        Self {
            disk: false,
            max_bytes: 256 << 20,
            when_full: WhenFull::Block,
            sync_interval: Duration::from_millis(100),
        }
    }
}

/// Keys of `buffer:`.
pub const BUFFER_KEYS: &[&str] = &[
    "type",
    "max_size",
    "max_bytes",
    "when_full",
    "sync_interval_ms",
];

/// The `buffer` key, documented once for every plugin that reads it.
pub const BUFFER_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "buffer",
    kind: petrel_core::plugin::KeyKind::Map,
    default: Some(r#"{type: memory}"#),
    doc: r#"Where received data waits until every sink acknowledged it: `{type, max_size, when_full, sync_interval_ms}`, as a sink's `buffer`. `type: memory` (the default) charges it to the pipeline's memory budget (lost if the agent is killed); `type: disk` appends it to a spool under the data dir before it counts as accepted. `max_size` (disk only, default `256MiB`, at least `1MiB`; the older name `max_bytes` is read with a deprecation warning) bounds undelivered data; `when_full`: `block` (default: stop reading, HTTP answers 503) or `drop_newest` (counted, `reason=buffer_full`); `sync_interval_ms` (disk only, default `100`, at most 60000): socket data is synced within this time. See the delivery guarantee chapter of the book."#,
};

/// The `max_connections` key, documented once for every plugin that reads it.
pub const MAX_CONNECTIONS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "max_connections",
    kind: petrel_core::plugin::KeyKind::Int,
    default: Some(r#"1024"#),
    doc: r#"Connections open at once; more are closed at accept and counted `connection_refused`."#,
};

/// The `idle_timeout_secs` key, documented once for every plugin that reads it.
pub const IDLE_TIMEOUT_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "idle_timeout_secs",
    kind: petrel_core::plugin::KeyKind::Duration,
    default: Some(r#"600"#),
    doc: r#"A connection silent for this many seconds is closed (counted `idle_timeout`)."#,
};

impl BufferOptions {
    /// Reads `buffer:` of `map`, if present.
    pub fn parse(map: &Map<'_>) -> Option<Self> {
        let mut b = Self::default();
        let Some(node) = map.get("buffer") else {
            return Some(b);
        };
        let m = node.as_map(BUFFER_KEYS)?;
        let mut ok = true;
        match m.choice("type", &["memory", "disk"]) {
            Some(t) => b.disk = t == "disk",
            None if m.get("type").is_some() => ok = false,
            None => {}
        }
        // `max_size`, as a sink's buffer says it; `max_bytes` is its old
        // name here, still read.
        let size_key = match (m.get("max_size"), m.get("max_bytes")) {
            (Some(_), Some(old)) => {
                old.error("`max_bytes` is the old name of `max_size`; keep only `max_size`");
                ok = false;
                None
            }
            (Some(_), None) => Some("max_size"),
            (None, Some(old)) => {
                old.warn("`buffer.max_bytes` is deprecated: write `max_size` (the name a sink's disk buffer uses)");
                Some("max_bytes")
            }
            (None, None) => None,
        };
        if let Some(key) = size_key {
            if let Some(n) = m.get(key) {
                match n.as_u64(true) {
                    Some(v) if v >= 1 << 20 => b.max_bytes = v,
                    Some(_) => {
                        n.error(format!("`{key}` must be at least 1MiB"));
                        ok = false;
                    }
                    None => ok = false,
                }
            }
        }
        match m.choice("when_full", &["block", "drop_newest"]) {
            Some("drop_newest") => b.when_full = WhenFull::DropNewest,
            Some(_) => {}
            None if m.get("when_full").is_some() => ok = false,
            None => {}
        }
        if let Some(n) = m.get("sync_interval_ms") {
            match n.as_u64(false) {
                Some(v) => b.sync_interval = Duration::from_millis(v.min(60_000)),
                None => ok = false,
            }
        }
        if let (false, Some(key)) = (b.disk, size_key) {
            if let Some(n) = m.get(key) {
                n.error(format!("`{key}` applies to `type: disk`; a memory buffer is bounded by `--memory-limit`"));
            }
            ok = false;
        }
        ok.then_some(b)
    }
}

/// Where a socket source listens.
#[derive(Debug, Clone)]
pub enum ListenAddr {
    /// An IP address and port.
    Inet(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Inet(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Reads `address:` as `host:port` (`unix` false) or a socket path.
pub fn parse_address(map: &Map<'_>, unix: bool, example: &str) -> Option<ListenAddr> {
    let node = map.required("address", example)?;
    let s = node.as_str()?;
    if unix {
        if !s.starts_with('/') {
            node.error(format!(
                "`address` must be an absolute socket path for this mode, e.g. `/run/petrel/syslog.sock`; got `{s}`"
            ));
            return None;
        }
        return Some(ListenAddr::Unix(PathBuf::from(s)));
    }
    match s.parse::<SocketAddr>() {
        Ok(a) => Some(ListenAddr::Inet(a)),
        Err(_) => {
            node.error(format!(
                "`address` must be `ip:port`, e.g. `{example}` (use `0.0.0.0:PORT` to listen on every interface); got `{s}`"
            ));
            None
        }
    }
}

/// Connection limits of a stream source.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections beyond this are closed at accept (counted).
    pub max_connections: usize,
    /// A connection silent for this long is closed (counted).
    pub idle_timeout: Duration,
}

/// Keys of the connection limits.
pub const CONN_KEYS: &[&str] = &["max_connections", "idle_timeout_secs"];

impl ConnLimits {
    /// Reads `max_connections` (1024) and `idle_timeout_secs` (600).
    pub fn parse(map: &Map<'_>) -> Self {
        Self {
            max_connections: map.u64("max_connections", false).unwrap_or(1024).max(1) as usize,
            idle_timeout: Duration::from_secs(
                map.u64("idle_timeout_secs", false).unwrap_or(600).max(1),
            ),
        }
    }
}

/// The data directory's spool for source `key`.
pub fn spool_dir(data_dir: &std::path::Path, key: &str) -> PathBuf {
    let mut name = String::new();
    for c in key.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => name.push(c),
            other => name.push_str(&format!("%{:02X}", other as u32)),
        }
    }
    data_dir.join("spool").join(name)
}

/// The runtime that drives every network source's sockets, shared.
pub struct NetRuntime(tokio::runtime::Runtime);

impl NetRuntime {
    /// The shared runtime of the sources of `ctx`'s topology.
    pub fn get(ctx: &petrel_core::plugin::SourceContext) -> anyhow::Result<Arc<Self>> {
        ctx.shared.get_or_try_init(|| {
            Ok(Self(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("petrel-net")
                    .enable_all()
                    .build()?,
            ))
        })
    }

    /// A handle to spawn on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.0.handle()
    }
}

/// Something that receives: stops receiving on request.
pub enum Receiver {
    /// TCP or Unix stream listener.
    Stream(stream::StreamListener),
    /// UDP or Unix datagram receiver.
    Dgram(dgram::DgramReceiver),
    /// Anything else with a stop flag and liveness (the HTTP server).
    Other(Box<dyn OtherReceiver>),
}

/// A receiver of another kind.
pub trait OtherReceiver: Send {
    /// Stops receiving.
    fn stop(&mut self);
    /// True while it receives.
    fn is_alive(&self) -> bool;
}

impl Receiver {
    fn stop(&mut self) {
        match self {
            Receiver::Stream(s) => s.stop(),
            Receiver::Dgram(d) => d.stop(),
            Receiver::Other(o) => o.stop(),
        }
    }

    fn is_alive(&self) -> bool {
        match self {
            Receiver::Stream(s) => s.is_alive(),
            Receiver::Dgram(d) => d.is_alive(),
            Receiver::Other(o) => o.is_alive(),
        }
    }
}

/// A running receiving source: its receivers and its intake.
pub struct RunningNet {
    receivers: Vec<Receiver>,
    runner: Option<intake::IntakeRunner>,
    /// Kept so the runtime outlives the receivers that use it.
    _runtime: Option<Arc<NetRuntime>>,
}

impl RunningNet {
    /// A source made of `receivers` feeding `runner`.
    pub fn new(
        receivers: Vec<Receiver>,
        runner: intake::IntakeRunner,
        runtime: Option<Arc<NetRuntime>>,
    ) -> Self {
        Self {
            receivers,
            runner: Some(runner),
            _runtime: runtime,
        }
    }
}

impl petrel_core::plugin::Source for RunningNet {
    fn begin_stop(&mut self, _deadline: std::time::Instant) {
        for r in &mut self.receivers {
            r.stop();
        }
        if let Some(r) = &self.runner {
            r.begin_stop();
        }
    }

    fn wait_stopped(mut self: Box<Self>, deadline: std::time::Instant) -> anyhow::Result<()> {
        for r in &mut self.receivers {
            r.stop();
        }
        match self.runner.take() {
            Some(r) => r.wait_stopped(deadline),
            None => Ok(()),
        }
    }

    fn is_alive(&self) -> bool {
        self.receivers.iter().all(|r| r.is_alive())
            && self.runner.as_ref().is_none_or(|r| r.is_alive())
    }
}
