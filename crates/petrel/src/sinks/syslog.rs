//! `type: syslog` — sends events as syslog messages (RFC 5424 or RFC 3164)
//! over UDP, TCP or TLS.
//!
//! ```yaml
//! sinks:
//!   - type: syslog
//!     address: siem.example.com:6514
//!     mode: tls                    # udp | tcp | tls
//!     format: rfc5424              # rfc5424 | rfc3164
//!     framing: octet_counting      # tcp/tls: octet_counting | newline
//!     tls: { ca_file: /etc/petrel/ca.pem }
//!     facility: local0             # or "{{ field }}"; default: the `facility` field, else user
//!     app_name: "{{ service }}"    # default: the `app_name` field
//! ```
//!
//! Header values come from templates when configured, else from the fields
//! the syslog source sets (so syslog → syslog keeps them), then common
//! fields (`host` for the hostname, `level` for the severity). MSG is the
//! event encoded with `encoding` (the message by default). RFC 5424
//! structured data comes from the `sd.<SD-ID>.<PARAM>` fields the syslog
//! source sets, or from the field named by `structured_data`.
//!
//! Delivery is the socket transport's (`sinks/socket.rs`).

use std::sync::Arc;

use petrel_core::config::{Map, Node};
use petrel_core::encode::{EncodeStats, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::template::{now_ns, RenderOptions};
use petrel_core::{ComponentMetrics, Event, EventBatch, LazyCounter, Value};
use petrel_syslog::writer::{self, Header, Rfc3164Time, SdWriter};
use petrel_time::TimeZone;

use super::socket::{self, Mode, Transport};
use super::template::Template;

/// Keys accepted by the syslog sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "mode",
    "format",
    "framing",
    "tls",
    "max_message_bytes",
    "facility",
    "severity",
    "hostname",
    "app_name",
    "proc_id",
    "msg_id",
    "structured_data",
    "encoding",
    "timezone",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Sends events as syslog messages (RFC 5424 or RFC 3164) over UDP, TCP (RFC 6587 octet counting or newline framing) or TLS. Header values come from templates, or by default from the fields the syslog source sets (`facility`, `severity`, `hostname`, `app_name`, `proc_id`, `msg_id`, `sd.<SD-ID>.<PARAM>`), so syslog → syslog keeps them; then `host` for the hostname and `level` for the severity. Over TCP and TLS an event is acknowledged once the receiver's TCP acknowledged its bytes: TCP syslog has no application acknowledgement (rsyslog's RELP has), so what a receiver took but never processed (it was killed) is lost; after a broken connection everything unacknowledged is sent again (duplicates counted in `retried_events`). Over UDP nothing is confirmed; messages longer than `max_message_bytes` are cut (counted `truncated`). A missing configured field or an invalid value is replaced by the default and counted (`field_missing`, `field_invalid`)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    socket::ADDRESS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "mode",
        kind: petrel_core::plugin::KeyKind::OneOf(&["tcp", "udp", "tls"]),
        default: Some(r#"tcp"#),
        doc: r#"The transport."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "format",
        kind: petrel_core::plugin::KeyKind::OneOf(&["rfc5424", "rfc3164"]),
        default: Some(r#"rfc5424"#),
        doc: r#"`rfc5424`: `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD MSG`, UTC time with microseconds; `rfc3164`: `<PRI>Mmm dd hh:mm:ss HOSTNAME APP-NAME[PROCID]: MSG` in `timezone`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "framing",
        kind: petrel_core::plugin::KeyKind::OneOf(&["octet_counting", "newline"]),
        default: Some(r#"octet_counting with rfc5424, newline with rfc3164"#),
        doc: r#"`mode: tcp`/`tls` (RFC 6587): `octet_counting` writes `LEN SP MSG`; `newline` ends each message with `\n` (newlines inside become spaces)."#,
    },
    socket::TLS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "max_message_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"65507"#),
        doc: r#"`mode: udp`: longer datagrams are cut to this (counted `truncated`); 64 to 65507. Many receivers take less (rsyslog 8k, RFC 5426 guarantees 480 over IPv4)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "facility",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `facility` field, else user"#),
        doc: r#"A facility number (0-23) or name (`local0`, `auth`, ...), or a `{{ field }}` template giving one."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "severity",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `severity` field, else `level`, else info"#),
        doc: r#"A severity number (0-7) or name (`err`, `warning`, and the level words `error`, `warn`, `fatal`, `trace`...), or a template giving one."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "hostname",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `hostname` field, else `host`"#),
        doc: r#"HOSTNAME: text or a template; cut to 255 bytes, spaces and other bytes outside printable ASCII written as `_` (counted `field_invalid`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "app_name",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `app_name` field"#),
        doc: r#"APP-NAME (the RFC 3164 tag), cut to 48 bytes; `-` (no tag in RFC 3164) when missing."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "proc_id",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `proc_id` field"#),
        doc: r#"PROCID (RFC 3164: `tag[pid]`), cut to 128 bytes."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "msg_id",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"the `msg_id` field"#),
        doc: r#"MSGID (RFC 5424 only), cut to 32 bytes."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "structured_data",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"the `sd.<SD-ID>.<PARAM>` fields"#),
        doc: r#"RFC 5424: a field holding the structured data, either an object `{SD-ID: {PARAM: value}}` or text already written as `[id k="v"]` (sent as it is); anything else is counted `field_invalid` and sent as `-`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["text", "ndjson", "map"]),
        default: Some(r#"text"#),
        doc: r#"MSG: `text` is the message, `ndjson` the event as JSON, or `{codec: text, template: ...}` a line template (see the file sink's `encoding`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "timezone",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"local"#),
        doc: r#"`rfc3164`: the zone its timestamps are written in (they carry none); `UTC`, `local`, `+08:00`, an IANA name."#,
    },
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// Registration of `type: syslog`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "syslog",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| SyslogSinkConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Where a header value comes from.
#[derive(Debug, Clone)]
enum Source {
    /// The first of these fields that the event has (the defaults).
    Fields(&'static [&'static str]),
    /// A configured template (static text when it has no fields).
    Template(Template),
}

/// Configuration of the syslog sink.
#[derive(Debug, Clone)]
pub struct SyslogSinkConfig {
    transport: Transport,
    rfc5424: bool,
    octet_counting: bool,
    facility: Source,
    severity: Source,
    hostname: Source,
    app_name: Source,
    proc_id: Source,
    msg_id: Source,
    structured_data: Option<String>,
    encoding: Encoding,
    timezone: TimeZone,
}

/// Reads a facility or severity code from text.
type CodeParser = fn(&[u8]) -> Option<u8>;

/// A header key: a template, checked now when it is static text (a
/// facility name that does not exist is a configuration error).
fn header(
    map: &Map<'_>,
    key: &str,
    default: &'static [&'static str],
    check: Option<CodeParser>,
    what: &str,
) -> Option<Source> {
    let Some(n) = map.get(key) else {
        return Some(Source::Fields(default));
    };
    let text = scalar_text(n)?;
    let t = Template::parse(&text, n)?;
    if let (Some(check), Some(s)) = (check, t.as_static()) {
        if check(s.as_bytes()).is_none() {
            n.error(format!("`{s}` is not {what}"));
            return None;
        }
    }
    Some(Source::Template(t))
}

/// A string or a number as text (`facility: 16`).
fn scalar_text(n: Node<'_>) -> Option<String> {
    if let petrel_core::config::YamlNode::Scalar(s) = n.raw() {
        return Some(s.as_str().to_string());
    }
    n.as_str().map(str::to_string)
}

impl SyslogSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let transport = socket::parse_transport(&map, &["tcp", "udp", "tls"]);
        let rfc5424 = match map.choice("format", &["rfc5424", "rfc3164"]) {
            Some(f) => Some(f == "rfc5424"),
            None if map.get("format").is_some() => None,
            None => Some(true),
        };
        let framing = match map.choice("framing", &["octet_counting", "newline"]) {
            Some(f) => Some(Some(f == "octet_counting")),
            None if map.get("framing").is_some() => None,
            None => Some(None),
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
        let facility = header(
            &map,
            "facility",
            &["facility"],
            Some(writer::facility_code),
            "a facility: write 0-23 or a name such as `local0`, `user`, `auth`",
        );
        let severity = header(
            &map,
            "severity",
            &["severity", "level"],
            Some(writer::severity_code),
            "a severity: write 0-7 or a name such as `err`, `warning`, `info`",
        );
        let hostname = header(&map, "hostname", &["hostname", "host"], None, "");
        let app_name = header(&map, "app_name", &["app_name"], None, "");
        let proc_id = header(&map, "proc_id", &["proc_id"], None, "");
        let msg_id = header(&map, "msg_id", &["msg_id"], None, "");
        let structured_data = map.str("structured_data").map(str::to_string);
        let encoding = super::parse_encoding(&map);
        let transport = transport?;
        let rfc5424 = rfc5424?;
        if let (Some(n), false) = (map.get("max_message_bytes"), transport.mode == Mode::Udp) {
            n.error("`max_message_bytes` applies to `mode: udp` (streams carry any length)");
            return None;
        }
        if let (Some(n), Mode::Udp) = (map.get("framing"), transport.mode) {
            n.error("`framing` applies to `mode: tcp` and `tls` (a datagram is one message)");
            return None;
        }
        if let (Some(n), false) = (map.get("structured_data"), rfc5424) {
            n.error("`structured_data` applies to `format: rfc5424`");
            return None;
        }
        Some(Self {
            transport,
            rfc5424,
            octet_counting: framing?.unwrap_or(rfc5424),
            facility: facility?,
            severity: severity?,
            hostname: hostname?,
            app_name: app_name?,
            proc_id: proc_id?,
            msg_id: msg_id?,
            structured_data,
            encoding: encoding?,
            timezone: timezone?,
        })
    }
}

impl petrel_core::plugin::SinkConfig for SyslogSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![crate::sinks::host_of(&self.transport.address)])
    }

    fn type_name(&self) -> &'static str {
        "syslog"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(SyslogSink {
            transport: self.transport.prepare(&crate::tls::Owner::of(&metrics))?,
            time3164: Rfc3164Time::new(self.timezone.clone()),
            field_missing: metrics.error_counter("field_missing"),
            field_invalid: metrics.error_counter("field_invalid"),
            config: self.clone(),
            metrics,
        }))
    }
}

/// The running syslog sink.
pub struct SyslogSink {
    /// Ready to connect (TLS files read at build).
    transport: Arc<Transport>,
    config: SyslogSinkConfig,
    time3164: Rfc3164Time,
    field_missing: LazyCounter,
    field_invalid: LazyCounter,
    metrics: ComponentMetrics,
}

/// Buffers reused across the events of a batch.
#[derive(Default)]
struct Scratch {
    host: Vec<u8>,
    app: Vec<u8>,
    proc: Vec<u8>,
    msgid: Vec<u8>,
    code: Vec<u8>,
    msg: Vec<u8>,
    missing: u64,
    invalid: u64,
}

impl SyslogSink {
    /// Renders a header value into `out`; false when there is none.
    fn value(
        &self,
        src: &Source,
        ev: &Event,
        batch: &EventBatch,
        out: &mut Vec<u8>,
        stats: &mut EncodeStats,
        missing: &mut u64,
    ) -> bool {
        out.clear();
        match src {
            Source::Fields(names) => names.iter().any(|f| {
                match ev.get(f) {
                    Some(Value::Int(i)) => {
                        out.extend_from_slice(i.to_string().as_bytes());
                    }
                    Some(v) => match batch.bytes_of(v) {
                        Some(b) => out.extend_from_slice(b),
                        None => return false,
                    },
                    None => match batch.meta_field(ev, f) {
                        Some(b) => out.extend_from_slice(b),
                        None => return false,
                    },
                }
                !out.is_empty()
            }),
            Source::Template(t) => {
                let opts = RenderOptions {
                    missing: b"",
                    now_ns: 0,
                };
                let n = t.render_bytes(ev, batch, opts, out, stats);
                if n > 0 {
                    *missing += 1;
                    out.clear();
                }
                !out.is_empty()
            }
        }
    }

    /// A code (facility or severity) from `src`, else `default`.
    #[allow(clippy::too_many_arguments)]
    fn code(
        &self,
        src: &Source,
        parse: CodeParser,
        default: u8,
        ev: &Event,
        batch: &EventBatch,
        s: &mut Scratch,
        stats: &mut EncodeStats,
    ) -> u8 {
        let mut buf = std::mem::take(&mut s.code);
        let code = if self.value(src, ev, batch, &mut buf, stats, &mut s.missing) {
            match parse(&buf) {
                Some(c) => c,
                None => {
                    s.invalid += 1;
                    default
                }
            }
        } else {
            default
        };
        s.code = buf;
        code
    }

    fn encode_event(
        &self,
        ev: &Event,
        batch: &EventBatch,
        now: i64,
        s: &mut Scratch,
        stats: &mut EncodeStats,
    ) {
        let c = &self.config;
        let facility = self.code(&c.facility, writer::facility_code, 1, ev, batch, s, stats);
        let severity = self.code(&c.severity, writer::severity_code, 6, ev, batch, s, stats);
        let has_host = self.value(&c.hostname, ev, batch, &mut s.host, stats, &mut s.missing);
        let has_app = self.value(&c.app_name, ev, batch, &mut s.app, stats, &mut s.missing);
        let has_proc = self.value(&c.proc_id, ev, batch, &mut s.proc, stats, &mut s.missing);
        let has_msgid = self.value(&c.msg_id, ev, batch, &mut s.msgid, stats, &mut s.missing);
        let h = Header {
            facility,
            severity,
            time_ns: ev.time_ns.or(Some(now)),
            hostname: has_host.then_some(&s.host[..]),
            app_name: has_app.then_some(&s.app[..]),
            proc_id: has_proc.then_some(&s.proc[..]),
            msg_id: has_msgid.then_some(&s.msgid[..]),
        };
        let msg = &mut s.msg;
        msg.clear();
        if c.rfc5424 {
            s.invalid += u64::from(writer::write_rfc5424_header(&h, msg));
            s.invalid += u64::from(self.write_sd(ev, batch, msg, stats));
            let at = msg.len();
            msg.push(b' ');
            c.encoding.write_event(None, batch, ev, now, msg, stats);
            if msg.len() == at + 1 {
                msg.truncate(at);
            }
        } else {
            s.invalid += u64::from(writer::write_rfc3164_header(&h, &self.time3164, now, msg));
            c.encoding.write_event(None, batch, ev, now, msg, stats);
        }
    }

    /// Writes STRUCTURED-DATA; returns how many names had to be cleaned
    /// (or 1 for a configured field that is not structured data).
    fn write_sd(
        &self,
        ev: &Event,
        batch: &EventBatch,
        out: &mut Vec<u8>,
        stats: &mut EncodeStats,
    ) -> u32 {
        let mut sd = SdWriter::new(out);
        let mut scratch = Vec::new();
        match &self.config.structured_data {
            None => {
                let mut current: Option<&str> = None;
                for (k, v) in &ev.fields {
                    let Some(rest) = k.strip_prefix("sd.") else {
                        continue;
                    };
                    let Some((id, name)) = rest.split_once('.') else {
                        continue;
                    };
                    if current != Some(id) {
                        sd.element(id.as_bytes(), out);
                        current = Some(id);
                    }
                    let value = value_bytes(v, batch, &mut scratch, stats);
                    sd.param(name.as_bytes(), value, out);
                }
            }
            Some(field) => match ev.get_path(field) {
                None | Some(Value::Null) => {}
                Some(Value::Object(elements)) => {
                    for (id, params) in elements {
                        sd.element(id.as_bytes(), out);
                        if let Value::Object(params) = params {
                            for (name, v) in params {
                                let value = value_bytes(v, batch, &mut scratch, stats);
                                sd.param(name.as_bytes(), value, out);
                            }
                        }
                    }
                }
                Some(v) => match batch.bytes_of(v) {
                    Some(b) if b.starts_with(b"[") && b.ends_with(b"]") => {
                        out.extend_from_slice(b);
                        return 0;
                    }
                    _ => {
                        out.push(b'-');
                        return 1;
                    }
                },
            },
        }
        sd.finish(out)
    }
}

/// A value as bytes for a structured data parameter: text as it is,
/// numbers and booleans as JSON writes them, arrays and objects as JSON.
fn value_bytes<'a>(
    v: &'a Value,
    batch: &'a EventBatch,
    scratch: &'a mut Vec<u8>,
    stats: &mut EncodeStats,
) -> &'a [u8] {
    if let Some(b) = batch.bytes_of(v) {
        return b;
    }
    scratch.clear();
    petrel_core::encode::write_json_value(batch, v, scratch, stats);
    scratch.as_slice()
}

impl Sink for SyslogSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        let mut s = Scratch::default();
        let mut stats = EncodeStats::default();
        let now = now_ns();
        let udp = self.config.transport.mode == Mode::Udp;
        for ev in &batch.events {
            self.encode_event(ev, batch, now, &mut s, &mut stats);
            if udp {
                out.bytes.extend_from_slice(&s.msg);
                out.record_ends.push(out.bytes.len() as u32);
            } else {
                writer::frame(&s.msg, self.config.octet_counting, &mut out.bytes);
            }
        }
        if s.missing > 0 {
            self.field_missing.inc_by(s.missing);
        }
        if s.invalid > 0 {
            self.field_invalid.inc_by(s.invalid);
        }
        super::count_encode_stats(&self.metrics, &stats);
        out.invalid_utf8 = stats.invalid_utf8;
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(socket::run(
            self.transport.clone(),
            rx,
            self.metrics.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors};
    use petrel_core::{SourceInfo, Span};

    fn sink(yaml: &str) -> Result<SyslogSink, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, yaml).unwrap();
        let errs = ConfigErrors::new();
        let node = Node::root(&f, &raw, &errs);
        let c = node
            .as_map(KEYS)
            .and_then(SyslogSinkConfig::parse)
            .ok_or_else(|| {
                errs.into_vec()
                    .iter()
                    .map(|e| format!("{}:{}: {}", e.line, e.col, e.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
        let m = petrel_core::Metrics::new().component("p", "sink", "s", "syslog");
        Ok(SyslogSink {
            transport: c
                .transport
                .prepare(&crate::tls::Owner::named("test"))
                .unwrap(),
            time3164: Rfc3164Time::new(c.timezone.clone()),
            field_missing: LazyCounter::default(),
            field_invalid: LazyCounter::default(),
            config: c,
            metrics: m,
        })
    }

    fn err(yaml: &str) -> String {
        match sink(yaml) {
            Ok(_) => panic!("`{yaml}` was accepted"),
            Err(e) => e,
        }
    }

    fn encode(s: &SyslogSink, batch: &EventBatch) -> String {
        let mut out = Encoded::default();
        s.encode(batch, &mut out);
        String::from_utf8(out.bytes).unwrap()
    }

    fn batch() -> EventBatch {
        let meta: Arc<[(petrel_core::Key, Arc<str>)]> =
            Arc::from(vec![("host".into(), "agent1".into())]);
        let mut b = EventBatch::new(
            bytes::Bytes::from_static(b"hello world"),
            Arc::new(SourceInfo::file("", meta)),
        );
        let mut ev = Event::from_span(Span::new(0, 11));
        ev.time_ns = Some(1_699_063_384_005_000_000);
        ev.set("facility".into(), Value::Int(16));
        ev.set("severity".into(), Value::Int(3));
        ev.set("app_name".into(), Value::Str("app".into()));
        ev.set("sd.ex@1.k".into(), Value::Str("v]".into()));
        b.events.push(ev);
        let mut ev = Event::from_span(Span::new(0, 5));
        ev.time_ns = Some(1_699_063_384_000_000_000);
        ev.set("level".into(), Value::Str("WARN".into()));
        ev.set("facility".into(), Value::Str("nope".into()));
        b.events.push(ev);
        b
    }

    #[test]
    fn defaults_come_from_syslog_fields_then_common_ones() {
        let s = sink("address: 127.0.0.1:514\ntimezone: UTC").unwrap();
        assert_eq!(
            encode(&s, &batch()),
            "76 <131>1 2023-11-04T02:03:04.005000Z agent1 app - - [ex@1 k=\"v\\]\"] hello world\
             54 <12>1 2023-11-04T02:03:04.000000Z agent1 - - - - hello"
        );
        let s = sink("address: 127.0.0.1:514\nformat: rfc3164\ntimezone: UTC\napp_name: \"{{ app_name }}\"\nfacility: local0").unwrap();
        assert_eq!(
            encode(&s, &batch()),
            "<131>Nov  4 02:03:04 agent1 app: hello world\n<132>Nov  4 02:03:04 agent1 hello\n"
        );
    }

    #[test]
    fn config_errors_name_the_key() {
        let e = err("address: 127.0.0.1:514\nfacility: local9");
        assert!(e.starts_with("2:") && e.contains("not a facility"), "{e}");
        let e = err("address: 127.0.0.1:514\nmode: udp\nframing: newline");
        assert!(e.contains("`framing` applies"), "{e}");
        let e = err("address: 127.0.0.1\n");
        assert!(e.contains("no port"), "{e}");
        let e = err("address: 127.0.0.1:514\ntls: {}\n");
        assert!(e.contains("`mode: tls`"), "{e}");
        let e = err("address: 127.0.0.1:514\nhostname: \"{{ h | nope }}\"\n");
        assert!(e.starts_with("2:") && e.contains("unknown filter"), "{e}");
    }
}
