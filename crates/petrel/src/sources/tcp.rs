//! `type: tcp` — newline-delimited text over TCP (optionally TLS) or a
//! Unix stream socket, one event per line.
//!
//! ```yaml
//! sources:
//!   - type: tcp
//!     address: 127.0.0.1:9000      # or an absolute Unix socket path
//!     max_message_bytes: 1MiB      # longer lines are cut (counted as too_long)
//!     max_connections: 1024
//!     idle_timeout_secs: 600
//!     tls: { cert_file: ..., key_file: ..., ca_file: ... }
//!     buffer: { type: disk, max_bytes: 256MiB, when_full: block }
//! ```
//! Events carry `source_address` (the peer's `ip:port`).

use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};

use super::net::stream::{self, LineSplitter, StreamCounters, StreamSpec};
use super::net::tls::TlsOptions;
use super::net::{
    intake, parse_address, BufferOptions, ConnLimits, ListenAddr, NetRuntime, RawDecode, Receiver,
    RunningNet,
};

/// Keys accepted by the tcp source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "max_message_bytes",
    "max_connections",
    "idle_timeout_secs",
    "socket_mode",
    "tls",
    "buffer",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives newline-delimited text over TCP or a Unix stream socket, one event per line, with `source_address`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: `host:port`, or an absolute Unix socket path."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_message_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"1MiB"#),
        doc: r#"Longer lines are cut and counted; 64 to 64MiB."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    SOCKET_MODE_DOC,
    crate::sources::net::tls::TLS_DOC,
    crate::sources::net::BUFFER_DOC,
];

/// The `socket_mode` key, documented once for every plugin that reads it.
pub const SOCKET_MODE_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "socket_mode",
    kind: petrel_core::plugin::KeyKind::String,
    default: Some(r#""0666""#),
    doc: r#"Unix socket addresses: the mode of the created socket, octal in quotes (`"0660"`)."#,
};

/// Registration of `type: tcp`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "tcp",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| TcpSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Configuration of the tcp source.
#[derive(Debug, Clone)]
pub struct TcpSourceConfig {
    address: ListenAddr,
    max_message_bytes: usize,
    limits: ConnLimits,
    socket_mode: u32,
    tls: Option<TlsOptions>,
    buffer: BufferOptions,
}

/// Reads `socket_mode` (octal text such as `"0660"`, default 0666).
pub fn parse_socket_mode(map: &Map<'_>) -> Option<u32> {
    let Some(n) = map.get("socket_mode") else {
        return Some(0o666);
    };
    let s = n.as_str()?;
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Some(m),
        _ => {
            n.error(format!(
                "`socket_mode` must be an octal mode in quotes, e.g. \"0660\"; got `{s}`"
            ));
            None
        }
    }
}

/// Reads `max_message_bytes` (at least 64).
pub fn parse_max_message(map: &Map<'_>, default: usize) -> Option<usize> {
    let v = map
        .u64("max_message_bytes", true)
        .map(|v| v as usize)
        .unwrap_or(default);
    if v < 64 {
        if let Some(n) = map.get("max_message_bytes") {
            n.error("`max_message_bytes` must be at least 64");
        }
        return None;
    }
    Some(v.min(64 << 20))
}

impl TcpSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let unix = map.str("address").is_some_and(|a| a.starts_with('/'));
        let address = parse_address(&map, unix, "127.0.0.1:9000");
        let max_message_bytes = parse_max_message(&map, 1 << 20);
        let socket_mode = parse_socket_mode(&map);
        let tls = TlsOptions::parse(&map);
        let buffer = BufferOptions::parse(&map);
        if unix && matches!(tls, Some(Some(_))) {
            if let Some(n) = map.get("tls") {
                n.error("`tls` applies to TCP addresses, not to a Unix socket");
            }
            return None;
        }
        Some(Self {
            address: address?,
            max_message_bytes: max_message_bytes?,
            limits: ConnLimits::parse(&map),
            socket_mode: socket_mode?,
            tls: tls?,
            buffer: buffer?,
        })
    }
}

impl petrel_core::plugin::SourceConfig for TcpSourceConfig {
    fn type_name(&self) -> &'static str {
        "tcp"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let (intake, runner) = intake::start(&ctx, Arc::new(RawDecode), &self.buffer, "tcp")?;
        let too_long = ctx.metrics.discarded_counter("too_long");
        let max = self.max_message_bytes;
        let spec = StreamSpec {
            addr: self.address.clone(),
            limits: self.limits,
            tls: match self
                .tls
                .as_ref()
                .map(|t| t.one_way_server_config(&crate::tls::Owner::of(&ctx.metrics)))
                .transpose()
            {
                Ok(t) => t,
                Err(e) => {
                    let _ = runner.wait_stopped(std::time::Instant::now());
                    return Err(e);
                }
            },
            socket_mode: self.socket_mode,
            splitter: Arc::new(move || Box::new(LineSplitter::new(max, too_long.clone()))),
            counters: StreamCounters::new(&ctx),
        };
        let listener = match stream::listen(rt.handle(), spec, intake) {
            Ok(l) => l,
            Err(e) => {
                let _ = runner.wait_stopped(std::time::Instant::now());
                return Err(e);
            }
        };
        tracing::info!(source = %ctx.key, address = %self.address, "listening (tcp)");
        Ok(Box::new(RunningNet::new(
            vec![Receiver::Stream(listener)],
            runner,
            Some(rt),
        )))
    }
}
