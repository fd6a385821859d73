//! `type: beats` — the Lumberjack protocol (v2, and v1's key/value data
//! frames): what Filebeat, Winlogbeat and the other Beats send with their
//! `output.logstash`, and what Logstash's `beats` input and Vector's
//! `logstash` source receive.
//!
//! ```yaml
//! sources:
//!   - type: beats
//!     address: 0.0.0.0:5044
//!     max_frame_bytes: 64MiB        # a larger frame closes the connection (counted)
//!     tls: { cert_file: ..., key_file: ..., ca_file: ... }
//!     buffer: { type: disk }
//! ```
//!
//! A client announces a window of N events (`W`), sends them as JSON data
//! frames (`J`), v1 key/value frames (`D`) or zlib-compressed frames
//! holding either (`C`), and waits for `A` with the sequence number of
//! the last event. The source sends that acknowledgement only once the
//! events were delivered to every sink (memory buffer) or are durable in
//! the spool (disk buffer). A window is handed over in parts of at most
//! 1 MiB; each part is acknowledged (a partial ACK, as Logstash sends) as
//! soon as it is safe, so a client whose connection breaks resends only
//! what was not acknowledged. While a part waits, an ACK of what is
//! already acknowledged goes out every 5 s, so the client's timeout (30 s
//! by default in Filebeat) never fires on a slow sink.
//!
//! Each data frame is one event: its JSON object's `message` is the
//! message, `@timestamp` the event time, and every other key (Beats'
//! `@metadata`, `host`, `log`, `agent`, …) a field, nested objects kept
//! as objects.

mod conn;

use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::{Event, EventBatch, LazyCounter, Value};

use super::net::stream;
use super::net::tls::TlsOptions;
use super::net::{
    intake, parse_address, Block, BufferOptions, ConnLimits, Decode, ListenAddr, NetRuntime,
};
use crate::processors::parse_json::JsonParser;

/// Keys accepted by the beats source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "max_frame_bytes",
    "max_connections",
    "idle_timeout_secs",
    "tls",
    "buffer",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives the Lumberjack protocol v2 (Filebeat, Winlogbeat and the other Beats' `output.logstash`, Logstash forwarders; v1 key/value frames too): windows of JSON data frames, zlib-compressed frames, and the ACK of a window's last sequence number sent only once its events were delivered (memory buffer) or are durable (disk buffer), in parts of at most 1 MiB (partial ACKs) with keep-alive ACKs every 5 s. Each data frame is one event: `message` is the message, `@timestamp` the event time, every other key (`@metadata` included) a field, nested objects kept as objects."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: `host:port` to listen on (Logstash's beats port is 5044), or an absolute Unix socket path."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_frame_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"64MiB"#),
        doc: r#"Largest frame, 1KiB to 1GiB: a data frame, or a compressed frame once inflated (a whole window of Filebeat's `bulk_max_size` events). A larger one is counted (`petrel_component_errors_total{error_type="frame_too_large"}`) and closes the connection; the window's earlier events are kept and acknowledged, and the client sends the rest again."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    crate::sources::net::tls::TLS_DOC,
    crate::sources::net::BUFFER_DOC,
];

/// Registration of `type: beats`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "beats",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| BeatsSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Configuration of the beats source.
#[derive(Debug, Clone)]
pub struct BeatsSourceConfig {
    address: ListenAddr,
    max_frame_bytes: usize,
    limits: ConnLimits,
    tls: Option<TlsOptions>,
    buffer: BufferOptions,
}

impl BeatsSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let unix = map.str("address").is_some_and(|a| a.starts_with('/'));
        let address = parse_address(&map, unix, "0.0.0.0:5044");
        let max_frame_bytes = match map.get("max_frame_bytes") {
            None => Some(64 << 20),
            Some(n) => match n.as_u64(true) {
                Some(v) if (1024..=1 << 30).contains(&v) => Some(v as usize),
                Some(_) => {
                    n.error("`max_frame_bytes` must be between 1KiB and 1GiB");
                    None
                }
                None => None,
            },
        };
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
            max_frame_bytes: max_frame_bytes?,
            limits: ConnLimits::parse(&map),
            tls: tls?,
            buffer: buffer?,
        })
    }
}

/// Frames are the JSON objects of data frames (v1 key/value frames turned
/// into JSON objects when received), so the spool holds JSON and replay
/// decodes exactly like live data.
struct BeatsDecode {
    /// A buffered frame that is not a JSON object: kept whole as the
    /// message, counted.
    bad: LazyCounter,
}

/// The field whose value is the event's message.
const MESSAGE: &str = "message";
/// The field whose value is the event's time.
const TIMESTAMP: &str = "@timestamp";

impl Decode for BeatsDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        let parser = JsonParser::new(None);
        let mut top = Vec::new();
        for s in &block.frames {
            top.clear();
            if parser
                .parse(s.get(&block.buf), Some(s.start), &mut top)
                .is_err()
            {
                // Received frames are checked to be `{...}`; one that does
                // not parse is kept whole, never dropped.
                self.bad.inc();
                batch.events.push(Event::from_span(*s));
                continue;
            }
            let mut ev = Event {
                message: Value::Null,
                fields: Vec::with_capacity(top.len()),
                time_ns: None,
                hidden: petrel_core::Hidden::NONE,
            };
            for (k, v) in top.drain(..) {
                match &*k {
                    MESSAGE if matches!(ev.message, Value::Null) => ev.message = v,
                    TIMESTAMP if ev.time_ns.is_none() => match time_ns(&v, &block.buf) {
                        Some(t) => ev.time_ns = Some(t),
                        None => ev.fields.push((k, v)),
                    },
                    _ => ev.fields.push((k, v)),
                }
            }
            batch.events.push(ev);
        }
    }
}

/// `@timestamp` as Beats write it (RFC 3339, `2024-05-06T07:08:09.123Z`).
fn time_ns(v: &Value, buf: &[u8]) -> Option<i64> {
    let text = v.as_bytes(buf)?;
    match petrel_time::parse_any_prefix(text) {
        Some((t, used)) if used == text.len() => Some(t),
        _ => None,
    }
}

/// Counters of the protocol.
#[derive(Clone)]
pub(crate) struct BeatsCounters {
    /// Not a Lumberjack frame, or a data frame that is not a JSON object.
    pub invalid: LazyCounter,
    /// Frames over `max_frame_bytes`.
    pub too_large: LazyCounter,
    /// Compressed frames that do not inflate.
    pub inflate_failed: LazyCounter,
}

impl petrel_core::plugin::SourceConfig for BeatsSourceConfig {
    fn type_name(&self) -> &'static str {
        "beats"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let decode = Arc::new(BeatsDecode {
            bad: ctx.metrics.error_counter("bad_buffered_message"),
        });
        let intake = intake::start(&ctx, decode, &self.buffer, "beats")?;
        let shared = Arc::new(conn::Shared {
            max: self.max_frame_bytes,
            counters: BeatsCounters {
                invalid: ctx.metrics.error_counter("invalid_frame"),
                too_large: ctx.metrics.error_counter("frame_too_large"),
                inflate_failed: ctx.metrics.error_counter("decompression_failed"),
            },
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
            "beats",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use petrel_core::Span;

    fn decode(frames: &[&str]) -> (Vec<Event>, Bytes) {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for f in frames {
            spans.push(Span::new(buf.len(), f.len()));
            buf.extend_from_slice(f.as_bytes());
        }
        let buf = Bytes::from(buf);
        let block = Block {
            buf: buf.clone(),
            frames: spans,
            peer: None,
            received_ns: 0,
            json: true,
        };
        let info = Arc::new(petrel_core::SourceInfo {
            path: "".into(),
            meta: Vec::new().into(),
            source_type: "beats",
        });
        let mut batch = EventBatch::new(buf.clone(), info);
        BeatsDecode {
            bad: LazyCounter::default(),
        }
        .decode(&block, &mut batch);
        (batch.events, buf)
    }

    #[test]
    fn message_timestamp_and_metadata() {
        let (ev, buf) = decode(&[
            r#"{"@timestamp":"2024-05-06T07:08:09.123Z","@metadata":{"beat":"filebeat","version":"8.15.0"},"message":"hello","log":{"offset":7}}"#,
            r#"{"message":"no time","@timestamp":"yesterday"}"#,
            r#"not json"#,
        ]);
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].message.as_bytes(&buf), Some(&b"hello"[..]));
        assert_eq!(ev[0].time_ns, Some(1_714_979_289_123_000_000));
        let names: Vec<&str> = ev[0].fields.iter().map(|(k, _)| &**k).collect();
        assert_eq!(names, ["@metadata", "log"]);
        assert!(matches!(ev[0].fields[0].1, Value::Object(ref o) if o.len() == 2));
        // A time that does not parse stays a field.
        assert_eq!(ev[1].time_ns, None);
        assert_eq!(&*ev[1].fields[0].0, "@timestamp");
        // A damaged frame is kept whole.
        assert_eq!(ev[2].message.as_bytes(&buf), Some(&b"not json"[..]));
    }
}
