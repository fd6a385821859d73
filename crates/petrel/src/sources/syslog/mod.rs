//! `type: syslog` — syslog over TCP (optionally TLS), UDP or Unix sockets.
//!
//! ```yaml
//! sources:
//!   - type: syslog
//!     mode: tcp                  # tcp | udp | unix_stream | unix_datagram
//!     address: 127.0.0.1:5140    # or a socket path for the unix modes
//!     format: auto               # auto | rfc5424 | rfc3164 | raw
//!     framing: auto              # stream modes: auto | octet_counting | newline
//!     max_message_bytes: 65536   # longer: cut and counted (discarded reason=too_long)
//!     timezone: local            # RFC 3164 times without a zone
//!     receive_buffer_bytes: 4MiB # udp / unix_datagram: SO_RCVBUF (default 4MiB)
//! ```
//! Events carry `message`, `hostname`, `app_name`, `proc_id`, `msg_id`,
//! `facility` and `severity` (numbers), the event time, structured data as
//! `sd.<id>.<param>` and `source_address`. A frame that does not parse is
//! kept whole as `message` and counted (`error_type="parse_failed"`).
//!
//! Framing on streams (RFC 6587): with `auto`, a frame starting with a
//! digit is octet-counted (`LEN SP MSG`), anything else ends at a newline;
//! a length that is not a number is counted (`error_type="bad_frame"`) and
//! reading resumes after the next newline.

use std::borrow::Cow;
use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{Event, EventBatch, Key, Span, Value};
use petrel_time::TimeZone;

use super::net::dgram::{self, DgramCounters, DgramSpec};
use super::net::stream::{self, Splitter, StreamCounters, StreamSpec};
use super::net::tls::TlsOptions;
use super::net::{
    intake, parse_address, Block, BufferOptions, ConnLimits, Decode, ListenAddr, NetRuntime,
    Receiver, RunningNet,
};
use super::tcp::{parse_max_message, parse_socket_mode};
use petrel_syslog::{Context, Frame, Framer, Framing, Message};

/// Keys accepted by the syslog source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "mode",
    "address",
    "format",
    "framing",
    "max_message_bytes",
    "timezone",
    "max_connections",
    "idle_timeout_secs",
    "socket_mode",
    "receive_buffer_bytes",
    "tls",
    "buffer",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives syslog (RFC 5424, RFC 3164, or raw frames) over TCP, UDP or Unix sockets; events carry `hostname`, `app_name`, `proc_id`, `msg_id`, `facility`, `severity`, structured data as `sd.<SD-ID>.<PARAM>`, and `source_address`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "mode",
        kind: petrel_core::plugin::KeyKind::OneOf(&["tcp", "udp", "unix_stream", "unix_datagram"]),
        default: Some(r#"tcp"#),
        doc: r#"The transport."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: `host:port`, or a socket path for the unix modes."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "format",
        kind: petrel_core::plugin::KeyKind::OneOf(&["auto", "rfc5424", "rfc3164", "raw"]),
        default: Some(r#"auto"#),
        doc: r#"How frames are parsed; `raw`: the whole frame is the message. A frame that does not parse is kept whole as `message` and counted (`parse_failed`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "framing",
        kind: petrel_core::plugin::KeyKind::OneOf(&["auto", "octet_counting", "newline"]),
        default: Some(r#"auto"#),
        doc: r#"Stream modes (RFC 6587): with `auto`, a frame starting with a digit is octet-counted, anything else ends at a newline."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_message_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"65536"#),
        doc: r#"Longer messages are cut and counted (`discarded reason=too_long`); 64 to 64MiB."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "timezone",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"local"#),
        doc: r#"The zone of RFC 3164 times, which carry none (`UTC`, `local`, `+08:00`, an IANA name); the year is inferred."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    crate::sources::tcp::SOCKET_MODE_DOC,
    petrel_core::plugin::KeyDoc {
        name: "receive_buffer_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"4MiB"#),
        doc: r#"`udp` and `unix_datagram`: the socket's `SO_RCVBUF` (root may exceed `rmem_max`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "tls",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"`mode: tcp` only: Serve TLS (rustls) on a TCP address: `{cert_file, key_file, ca_file}` (PEM). With `ca_file`, clients must present a certificate signed by that CA (mutual TLS). A failed handshake is counted `tls_handshake_failed`."#,
    },
    crate::sources::net::BUFFER_DOC,
];

/// Registration of `type: syslog`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "syslog",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| SyslogSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// TCP (RFC 6587), optionally TLS.
    Tcp,
    /// UDP, one message per datagram.
    Udp,
    /// Unix stream socket (framed like TCP).
    UnixStream,
    /// Unix datagram socket (`/dev/log` style).
    UnixDatagram,
}

/// Which syntax frames are parsed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Parsed by `petrel_syslog` in this format.
    Parsed(petrel_syslog::Format),
    /// Not parsed: the frame is the message.
    Raw,
}

/// Configuration of the syslog source.
#[derive(Debug, Clone)]
pub struct SyslogSourceConfig {
    mode: Mode,
    address: ListenAddr,
    format: Format,
    framing: Framing,
    max_message_bytes: usize,
    timezone: TimeZone,
    limits: ConnLimits,
    socket_mode: u32,
    receive_buffer_bytes: Option<usize>,
    tls: Option<TlsOptions>,
    buffer: BufferOptions,
}

impl SyslogSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let mode = match map.choice("mode", &["tcp", "udp", "unix_stream", "unix_datagram"]) {
            Some("udp") => Some(Mode::Udp),
            Some("unix_stream") => Some(Mode::UnixStream),
            Some("unix_datagram") => Some(Mode::UnixDatagram),
            Some(_) => Some(Mode::Tcp),
            None if map.get("mode").is_some() => None,
            None => Some(Mode::Tcp),
        };
        let unix = matches!(mode, Some(Mode::UnixStream | Mode::UnixDatagram));
        let address = parse_address(
            &map,
            unix,
            if unix {
                "/run/petrel/syslog.sock"
            } else {
                "127.0.0.1:5140"
            },
        );
        let format = match map.choice("format", &["auto", "rfc5424", "rfc3164", "raw"]) {
            Some("rfc5424") => Some(Format::Parsed(petrel_syslog::Format::Rfc5424)),
            Some("rfc3164") => Some(Format::Parsed(petrel_syslog::Format::Rfc3164)),
            Some("raw") => Some(Format::Raw),
            Some(_) => Some(Format::Parsed(petrel_syslog::Format::Auto)),
            None if map.get("format").is_some() => None,
            None => Some(Format::Parsed(petrel_syslog::Format::Auto)),
        };
        let framing = match map.choice("framing", &["auto", "octet_counting", "newline"]) {
            Some("octet_counting") => Some(Framing::OctetCounting),
            Some("newline") => Some(Framing::Newline),
            Some(_) => Some(Framing::Auto),
            None if map.get("framing").is_some() => None,
            None => Some(Framing::Auto),
        };
        let timezone = match map.get("timezone") {
            None => TimeZone::from_name("local").ok().or(Some(TimeZone::Utc)),
            Some(n) => n.as_str().and_then(|s| match TimeZone::from_name(s) {
                Ok(tz) => Some(tz),
                Err(e) => {
                    n.error(e);
                    None
                }
            }),
        };
        let max_message_bytes = parse_max_message(&map, 65536);
        let socket_mode = parse_socket_mode(&map);
        let tls = TlsOptions::parse(&map);
        let buffer = BufferOptions::parse(&map);
        let receive_buffer_bytes = map.u64("receive_buffer_bytes", true).map(|v| v as usize);
        let mode = mode?;
        if matches!(tls, Some(Some(_))) && mode != Mode::Tcp {
            if let Some(n) = map.get("tls") {
                n.error("`tls` applies to `mode: tcp` only");
            }
            return None;
        }
        if receive_buffer_bytes.is_some() && !matches!(mode, Mode::Udp | Mode::UnixDatagram) {
            if let Some(n) = map.get("receive_buffer_bytes") {
                n.error("`receive_buffer_bytes` applies to `mode: udp` and `unix_datagram`");
            }
            return None;
        }
        Some(Self {
            mode,
            address: address?,
            format: format?,
            framing: framing?,
            max_message_bytes: max_message_bytes?,
            timezone: timezone?,
            limits: ConnLimits::parse(&map),
            socket_mode: socket_mode?,
            receive_buffer_bytes,
            tls: tls?,
            buffer: buffer?,
        })
    }
}

impl petrel_core::plugin::SourceConfig for SyslogSourceConfig {
    fn type_name(&self) -> &'static str {
        "syslog"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let decode = Arc::new(SyslogDecode {
            format: self.format,
            tz: self.timezone.clone(),
            parse_failed: ctx.metrics.error_counter("parse_failed"),
        });
        let (intake, runner) = intake::start(&ctx, decode, &self.buffer, "syslog")?;
        let too_long = ctx.metrics.discarded_counter("too_long");
        let started = (|| -> anyhow::Result<(Receiver, Option<Arc<NetRuntime>>)> {
            Ok(match self.mode {
                Mode::Tcp | Mode::UnixStream => {
                    let rt = NetRuntime::get(&ctx)?;
                    let (framing, max) = (self.framing, self.max_message_bytes);
                    let bad_frame = ctx.metrics.error_counter("bad_frame");
                    let spec = StreamSpec {
                        addr: self.address.clone(),
                        limits: self.limits,
                        tls: self
                            .tls
                            .as_ref()
                            .map(|t| t.one_way_server_config(&crate::tls::Owner::of(&ctx.metrics)))
                            .transpose()?,
                        socket_mode: self.socket_mode,
                        splitter: Arc::new(move || {
                            Box::new(SyslogSplitter::new(
                                framing,
                                max,
                                too_long.clone(),
                                bad_frame.clone(),
                            ))
                        }),
                        counters: StreamCounters::new(&ctx),
                    };
                    let l = stream::listen(rt.handle(), spec, intake)?;
                    (Receiver::Stream(l), Some(rt))
                }
                Mode::Udp | Mode::UnixDatagram => {
                    let spec = DgramSpec {
                        addr: self.address.clone(),
                        receive_buffer_bytes: self.receive_buffer_bytes,
                        max_message_bytes: self.max_message_bytes,
                        socket_mode: self.socket_mode,
                        counters: DgramCounters {
                            kernel_dropped: ctx.metrics.error_counter("kernel_dropped"),
                            too_long,
                            read_errors: ctx.metrics.error_counter("read_failed"),
                            discarded: ctx.metrics.discarded_counter("shutdown"),
                        },
                    };
                    (Receiver::Dgram(dgram::listen(spec, intake)?), None)
                }
            })
        })();
        let (receiver, rt) = match started {
            Ok(x) => x,
            Err(e) => {
                let _ = runner.wait_stopped(std::time::Instant::now());
                return Err(e);
            }
        };
        tracing::info!(source = %ctx.key, mode = ?self.mode, address = %self.address, "listening (syslog)");
        Ok(Box::new(RunningNet::new(vec![receiver], runner, rt)))
    }
}

/// Syslog frames to events.
struct SyslogDecode {
    format: Format,
    tz: TimeZone,
    parse_failed: LazyCounter,
}

fn span_of(base: u32, r: &std::ops::Range<usize>) -> Value {
    Value::Span(Span::new(base as usize + r.start, r.len()))
}

impl Decode for SyslogDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        let Format::Parsed(format) = self.format else {
            batch
                .events
                .extend(block.frames.iter().map(|s| Event::from_span(*s)));
            return;
        };
        // One clock reading per block: RFC 3164 years are inferred from the
        // time the data arrived, not from when it is decoded (a spooled
        // block may be decoded much later).
        let ctx = Context {
            tz: self.tz.clone(),
            now_ns: block.received_ns,
        };
        let mut m = Message::default();
        for s in &block.frames {
            let frame = s.get(&block.buf);
            if petrel_syslog::parse(frame, format, &ctx, &mut m).is_err() {
                self.parse_failed.inc();
                batch.events.push(Event::from_span(*s));
                continue;
            }
            let mut fields: Vec<(Key, Value)> = Vec::with_capacity(6 + m.sd.len());
            let named = [
                ("hostname", &m.hostname),
                ("app_name", &m.app_name),
                ("proc_id", &m.proc_id),
                ("msg_id", &m.msg_id),
            ];
            for (k, r) in named {
                if let Some(r) = r {
                    fields.push((Key::Borrowed(k), span_of(s.start, r)));
                }
            }
            if let (Some(f), Some(sev)) = (m.facility, m.severity) {
                fields.push((Key::Borrowed("facility"), Value::Int(i64::from(f))));
                fields.push((Key::Borrowed("severity"), Value::Int(i64::from(sev))));
            }
            for p in &m.sd {
                let (id, name) = (&frame[p.id.clone()], &frame[p.name.clone()]);
                let key = format!(
                    "sd.{}.{}",
                    String::from_utf8_lossy(id),
                    String::from_utf8_lossy(name)
                );
                let value = if p.escaped {
                    let v = petrel_syslog::unescape_sd_value(&frame[p.value.clone()]).into_owned();
                    match String::from_utf8(v) {
                        Ok(t) => Value::Str(t.into()),
                        Err(e) => Value::Bytes(e.into_bytes().into()),
                    }
                } else {
                    span_of(s.start, &p.value)
                };
                fields.push((Cow::Owned(key), value));
            }
            batch.events.push(Event {
                message: span_of(s.start, &m.message),
                fields,
                time_ns: m.timestamp_ns,
                hidden: petrel_core::Hidden::NONE,
            });
        }
    }
}

/// RFC 6587 framing for stream transports: `petrel_syslog`'s framer with
/// its cut and unframeable input counted in the source's metrics.
pub struct SyslogSplitter {
    framer: Framer,
    max: usize,
    frames: Vec<Frame>,
    bad_frames_seen: u64,
    too_long: LazyCounter,
    bad_frame: LazyCounter,
}

impl SyslogSplitter {
    /// A splitter for one connection.
    pub fn new(
        framing: Framing,
        max: usize,
        too_long: LazyCounter,
        bad_frame: LazyCounter,
    ) -> Self {
        Self {
            framer: Framer::new(framing, max),
            max,
            frames: Vec::new(),
            bad_frames_seen: 0,
            too_long,
            bad_frame,
        }
    }
}

impl Splitter for SyslogSplitter {
    fn split(&mut self, buf: &[u8], eof: bool, out: &mut Vec<Span>) -> usize {
        self.frames.clear();
        let used = self.framer.frames(buf, eof, &mut self.frames);
        for f in &self.frames {
            // A frame cut short by the end of the stream is kept but was
            // not too long: it counts as a bad frame.
            if f.truncated && f.range.len() >= self.max {
                self.too_long.inc();
            } else if f.truncated {
                self.bad_frame.inc();
            }
            out.push(Span::new(f.range.start, f.range.len()));
        }
        let bad = self.framer.bad_frames();
        if bad > self.bad_frames_seen {
            self.bad_frame.inc_by(bad - self.bad_frames_seen);
            self.bad_frames_seen = bad;
        }
        used
    }
}

#[cfg(test)]
mod tests;
