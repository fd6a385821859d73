//! Sinks: where events leave the agent. One file per plugin.
//!
//! Each sink encodes on the processing pool ([`petrel_core::plugin::Sink::encode`])
//! and delivers on the shared sink runtime, acknowledging every payload only
//! after its data reached the destination.

pub mod blackhole;
pub mod client;
pub mod congestion;
pub mod dead_letter;
pub mod driver;
#[cfg(feature = "elasticsearch")]
pub mod elasticsearch;
pub mod file;
pub mod http;
pub mod kafka;
#[cfg(feature = "loki")]
pub mod loki;
#[cfg(feature = "opentelemetry")]
pub mod opentelemetry;
pub mod origin;
#[cfg(feature = "s3")]
pub mod s3;
pub mod socket;
pub mod stdout;
pub mod syslog;
pub mod tcp;
pub mod template;
pub mod tls;
mod writer;

use std::sync::Arc;

use petrel_core::config::{Map, YamlNode};
use petrel_core::encode::{Encoding, LineTemplate};
use petrel_time::TimeZone;

/// Keys of `encoding:` written as a mapping.
pub const ENCODING_KEYS: &[&str] = &["codec", "template", "missing", "timezone"];

/// The `encoding` key, documented once for every sink that reads it
/// through [`parse_encoding`].
pub const ENCODING_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "encoding",
    kind: petrel_core::plugin::KeyKind::OneOf(&["text", "ndjson", "map"]),
    default: Some(r#"text"#),
    doc: r#"`text`: the message bytes and `\n`; `ndjson`: one JSON object per event with every field. As a mapping, `codec: text` with `template` writes one line per event from a template, such as `"{{ timestamp | %b %e %H:%M:%S }} {{ host }} {{ app_name }}: {{ message }}"`: fields of the event or of its source (`host`, `file`), `timestamp` the event time; filters after `|`: a strftime pattern, `json`, `upper`, `lower`, `prefix(TEXT)`, `suffix(TEXT)` (these make the field optional: nothing written when missing). `missing` (default empty) is written for a missing field (each counted, `error_type="template_field_missing"`); `timezone` (default `UTC`; `local`, `+08:00`, an IANA name) is the zone of the time filter."#,
};

/// Reads the common `encoding:` key (default `text`): `text`, `ndjson`, or
/// `{codec, template, missing, timezone}`. The template is compiled here,
/// once; its errors are reported at the `template` key.
pub fn parse_encoding(map: &Map<'_>) -> Option<Encoding> {
    let n = match map.get("encoding") {
        None => return Some(Encoding::Text),
        Some(n) if !matches!(n.raw(), YamlNode::Mapping(_)) => {
            return n.as_choice(Encoding::NAMES).and_then(Encoding::from_name)
        }
        Some(n) => n,
    };
    let m = n.as_map(ENCODING_KEYS)?;
    let codec = match m.get("codec") {
        None => Encoding::Text,
        Some(c) => c.as_choice(Encoding::NAMES).and_then(Encoding::from_name)?,
    };
    let tz = match m.get("timezone") {
        None => TimeZone::Utc,
        Some(z) => match TimeZone::from_name(z.as_str()?) {
            Ok(tz) => tz,
            Err(e) => {
                z.error(e);
                return None;
            }
        },
    };
    let missing = match m.get("missing") {
        None => "",
        Some(x) => x.as_str()?,
    };
    let Some(t) = m.get("template") else {
        if m.get("missing").is_some() || m.get("timezone").is_some() {
            n.error("`missing` and `timezone` go with `template`; add `template: \"{{ timestamp }} {{ host }} {{ message }}\"` or remove them");
            return None;
        }
        return Some(codec);
    };
    if codec != Encoding::Text {
        t.error("`template` goes with `codec: text` (an ndjson line is every field); remove `template` or write `codec: text`");
        return None;
    }
    let template = template::Template::parse_in(t.as_str()?, t, &tz)?;
    Some(Encoding::Template(Arc::new(LineTemplate {
        template,
        missing: missing.as_bytes().into(),
    })))
}

/// Counts what encoding noticed in a batch: template fields that were
/// missing (`error_type="template_field_missing"`).
pub fn count_encode_stats(
    metrics: &petrel_core::ComponentMetrics,
    stats: &petrel_core::encode::EncodeStats,
) {
    if stats.missing_fields > 0 {
        metrics.error("template_field_missing", stats.missing_fields);
    }
}

/// The host of a `host:port` address (`[::1]:9092` gives `::1`), for the
/// destinations a remotely managed pipeline may send to.
pub fn host_of(address: &str) -> String {
    let a = address.trim();
    let a = a.split_once("://").map_or(a, |(_, rest)| rest);
    let a = a.split('/').next().unwrap_or(a);
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    match a.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h.to_string(),
        _ => a.to_string(),
    }
}

#[cfg(test)]
mod host_tests {
    #[test]
    fn hosts_of_addresses() {
        assert_eq!(super::host_of("kafka-1:9092"), "kafka-1");
        assert_eq!(super::host_of("[::1]:514"), "::1");
        assert_eq!(
            super::host_of("SASL_SSL://b.example.com:9093"),
            "b.example.com"
        );
        assert_eq!(super::host_of("broker"), "broker");
    }
}
