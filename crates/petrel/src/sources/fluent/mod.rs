//! `type: fluent` — the Fluent Forward protocol v1 (Fluentd's
//! `in_forward`, Fluent Bit's `forward` input): what Fluent Bit, Fluentd,
//! the fluent-logger libraries and Docker's `fluentd` log driver send.
//!
//! ```yaml
//! sources:
//!   - type: fluent
//!     address: 0.0.0.0:24224
//!     max_entry_bytes: 16MiB        # a larger message closes the connection (counted)
//!     tls: { cert_file: ..., key_file: ..., ca_file: ... }
//!     security: { shared_key: secret, self_hostname: agg-1, users: [{username: a, password: b}] }
//!     buffer: { type: disk }
//! ```
//!
//! All four modes are read (Message, Forward, PackedForward and
//! CompressedPackedForward with gzip). A message with `option.chunk` is
//! answered `{"ack": chunk}` once its entries were delivered to every
//! sink (memory buffer) or are durable in the spool (disk buffer); without
//! `chunk` nothing is answered, as the protocol says.
//!
//! Each accepted message is one frame of a block, as received (a
//! compressed one inflated first), so the spool holds msgpack and replay
//! decodes exactly like live data. Each entry becomes one event: the
//! record's `message` (or else `log`) is the message, its other keys the
//! fields (maps as objects), the tag the field `fluent.tag`, and the
//! entry's time (EventTime's nanoseconds kept) the event time.

mod conn;
pub mod msgpack;

use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::{EventBatch, LazyCounter};

use super::net::stream;
use super::net::tls::TlsOptions;
use super::net::{intake, parse_address, Block, BufferOptions, ConnLimits, ListenAddr, NetRuntime};

/// Keys accepted by the fluent source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "max_entry_bytes",
    "max_connections",
    "idle_timeout_secs",
    "tls",
    "security",
    "buffer",
];

/// Keys of `security:` (as Fluentd's `<security>` section).
pub const SECURITY_KEYS: &[&str] = &["shared_key", "self_hostname", "user_auth", "users"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives the Fluent Forward protocol v1 (Fluent Bit, Fluentd, fluent-logger libraries, Docker's `fluentd` log driver): Message, Forward, PackedForward and gzip CompressedPackedForward modes, `chunk` acknowledged once delivered (memory buffer) or durable (disk buffer), the `shared_key` handshake and user authentication. Each entry is one event: the record's `message` (or else `log`) is the message, its other keys are fields, the tag is `fluent.tag`, EventTime keeps nanoseconds."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: `host:port` to listen on (Fluentd's port is 24224), or an absolute Unix socket path."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_entry_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"16MiB"#),
        doc: r#"Largest message (a whole Forward/PackedForward chunk; a compressed one also once inflated), 1KiB to 256MiB. A larger one is counted (`petrel_component_errors_total{error_type="entry_too_large"}`) and closes the connection; its earlier messages are kept and acknowledged, and the client sends the rest again."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    crate::sources::net::tls::TLS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "security",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"The Forward protocol's handshake, as Fluentd's `<security>`: `{shared_key, self_hostname, user_auth, users: [{username, password}]}`. With it, each connection starts with HELO/PING/PONG: the client proves it knows `shared_key` (sha512 digests with a nonce and salt) and, with `users` (`user_auth` defaults to true when `users` is set), a username and password. A failed handshake is answered with the reason, closes the connection and is counted `handshake_failed`. `self_hostname` defaults to the host name."#,
    },
    crate::sources::net::BUFFER_DOC,
];

/// Registration of `type: fluent`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "fluent",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| FluentSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// The handshake's secrets.
#[derive(Debug, Clone)]
pub struct Security {
    /// The key both ends know.
    pub shared_key: String,
    /// This server's name in PONG.
    pub self_hostname: String,
    /// Username and password pairs; empty: no user authentication.
    pub users: Vec<(String, String)>,
}

/// Configuration of the fluent source.
#[derive(Debug, Clone)]
pub struct FluentSourceConfig {
    address: ListenAddr,
    max_entry_bytes: usize,
    limits: ConnLimits,
    tls: Option<TlsOptions>,
    security: Option<Arc<Security>>,
    buffer: BufferOptions,
}

fn parse_security(map: &Map<'_>) -> Option<Option<Arc<Security>>> {
    let Some(node) = map.get("security") else {
        return Some(None);
    };
    let m = node.as_map(SECURITY_KEYS)?;
    let key = m.required("shared_key", "a long random secret")?;
    let shared_key = key.as_str()?.to_string();
    if shared_key.is_empty() {
        key.error("`shared_key` must not be empty");
        return None;
    }
    let self_hostname = match m.get("self_hostname") {
        Some(n) => n.as_str()?.to_string(),
        None => crate::host::hostname().to_string(),
    };
    let mut users = Vec::new();
    let mut ok = true;
    if let Some(list) = m.get("users") {
        for u in list.as_list() {
            let Some(um) = u.as_map(&["username", "password"]) else {
                ok = false;
                continue;
            };
            let name = um
                .required("username", "fluentbit")
                .and_then(|n| n.as_str());
            let pass = um.required("password", "a secret").and_then(|n| n.as_str());
            match (name, pass) {
                (Some(n), Some(p)) => users.push((n.to_string(), p.to_string())),
                _ => ok = false,
            }
        }
    }
    if let Some(n) = m.get("user_auth") {
        match n.as_bool() {
            Some(true) if users.is_empty() => {
                n.error("`user_auth: true` needs `users: [{username, password}]`");
                ok = false;
            }
            Some(false) => users.clear(),
            Some(true) => {}
            None => ok = false,
        }
    }
    ok.then(|| {
        Some(Arc::new(Security {
            shared_key,
            self_hostname,
            users,
        }))
    })
}

impl FluentSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let unix = map.str("address").is_some_and(|a| a.starts_with('/'));
        let address = parse_address(&map, unix, "0.0.0.0:24224");
        let max_entry_bytes = match map.get("max_entry_bytes") {
            None => Some(16 << 20),
            Some(n) => match n.as_u64(true) {
                Some(v) if (1024..=256 << 20).contains(&v) => Some(v as usize),
                Some(_) => {
                    n.error("`max_entry_bytes` must be between 1KiB and 256MiB");
                    None
                }
                None => None,
            },
        };
        let tls = TlsOptions::parse(&map);
        let security = parse_security(&map);
        let buffer = BufferOptions::parse(&map);
        if unix && matches!(tls, Some(Some(_))) {
            if let Some(n) = map.get("tls") {
                n.error("`tls` applies to TCP addresses, not to a Unix socket");
            }
            return None;
        }
        Some(Self {
            address: address?,
            max_entry_bytes: max_entry_bytes?,
            limits: ConnLimits::parse(&map),
            tls: tls?,
            security: security?,
            buffer: buffer?,
        })
    }
}

/// Frames are accepted Forward protocol messages.
struct FluentDecode {
    bad: LazyCounter,
}

impl super::net::Decode for FluentDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        for s in &block.frames {
            if let Err(why) = msgpack::events(&block.buf, *s, &mut batch.events) {
                // Only messages that were checked are spooled: a damaged
                // record. Counted, never silently.
                self.bad.inc();
                tracing::error!(
                    error = why,
                    "fluent source: a buffered message does not decode"
                );
            }
        }
    }
}

/// Counters of the protocol.
#[derive(Clone)]
pub(crate) struct FluentCounters {
    /// Not msgpack, or not a Forward protocol message.
    pub invalid: LazyCounter,
    /// Messages over `max_entry_bytes`.
    pub too_large: LazyCounter,
    /// Compressed entries that do not inflate.
    pub inflate_failed: LazyCounter,
    /// Failed handshakes.
    pub handshake_failed: LazyCounter,
    /// Messages refused for a chunk id over `conn::MAX_CHUNK_ID`.
    pub chunk_id_too_long: LazyCounter,
    /// Connections closed because the client did not read its
    /// acknowledgements.
    pub acks_not_read: LazyCounter,
}

impl petrel_core::plugin::SourceConfig for FluentSourceConfig {
    fn type_name(&self) -> &'static str {
        "fluent"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let decode = Arc::new(FluentDecode {
            bad: ctx.metrics.error_counter("bad_buffered_message"),
        });
        let intake = intake::start(&ctx, decode, &self.buffer, "fluent")?;
        let counters = FluentCounters {
            invalid: ctx.metrics.error_counter("invalid_message"),
            too_large: ctx.metrics.error_counter("entry_too_large"),
            inflate_failed: ctx.metrics.error_counter("decompression_failed"),
            handshake_failed: ctx.metrics.error_counter("handshake_failed"),
            chunk_id_too_long: ctx.metrics.error_counter("chunk_id_too_long"),
            acks_not_read: ctx.metrics.error_counter("acks_not_read"),
        };
        let shared = Arc::new(conn::Shared {
            max: self.max_entry_bytes,
            security: self.security.clone(),
            counters,
            key: ctx.key.clone().into(),
        });
        let handler: stream::Serve = Arc::new(move |c| Box::pin(conn::serve(c, shared.clone())));
        stream::start_protocol(
            &ctx,
            rt,
            &self.address,
            self.limits,
            self.tls.as_ref(),
            intake,
            handler,
            "fluent",
        )
    }
}
