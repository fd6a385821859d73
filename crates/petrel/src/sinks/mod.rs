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
pub mod files;
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
use petrel_core::schema::{FieldPath, Layout, Output, TimeFormat};
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
/// With `ndjson`, the sink's [`OUTPUT_KEYS`] are read into it (they are
/// refused with the other encodings).
pub fn parse_encoding(map: &Map<'_>) -> Option<Encoding> {
    let encoding = parse_codec(map);
    let writes_fields = matches!(encoding, Some(Encoding::Ndjson(_)));
    let output = parse_output(map, writes_fields);
    match (encoding?, output?) {
        (Encoding::Ndjson(_), o) => Some(Encoding::Ndjson(Arc::new(o))),
        (e, _) => Some(e),
    }
}

fn parse_codec(map: &Map<'_>) -> Option<Encoding> {
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
    if !matches!(codec, Encoding::Text) {
        t.error("`template` goes with `codec: text` (an ndjson line is every field); remove `template` or write `codec: text`");
        return None;
    }
    let template = template::Template::parse_in(t.as_str()?, t, &tz)?;
    Some(Encoding::Template(Arc::new(LineTemplate {
        template,
        missing: missing.as_bytes().into(),
    })))
}

/// The keys of a sink's [`Output`]: which fields it writes and how it
/// names the metadata. Every sink that writes fields lists them among its
/// keys and reads them with [`parse_output`].
pub const OUTPUT_KEYS: &[&str] = &[
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// The `metadata` key, documented once for every sink that reads it.
pub const METADATA_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "metadata",
    kind: petrel_core::plugin::KeyKind::Map,
    default: Some(r#"{layout: flat}"#),
    doc: r#"How the metadata of the sources (`file`, `host`, `k8s.*`, `container.*`, ...) is named and shaped: `layout:` `flat` (Petrel's dotted names, `"k8s.pod_name"`), `nested` (the same as objects), `ecs` (Filebeat's: `log.file.path`, `kubernetes.pod.name`, `@timestamp`), `otel` (semantic conventions: `k8s.pod.name`; the opentelemetry sink puts them into the resource), `fluent-bit` (the `kubernetes` object of Fluent Bit's filter, the line as `log`, the time as `time`) or `vector` (`kubernetes_logs`' names, with `source_type`); `dedot: true` replaces the dots in label and annotation keys with `_` (default on for `ecs`). Every name in every layout: [layouts](layouts.md)."#,
};

/// The `only_fields` key, documented once for every sink that reads it.
pub const ONLY_FIELDS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "only_fields",
    kind: petrel_core::plugin::KeyKind::List,
    default: None,
    doc: r#"Writes only these fields (Vector's name): event names (`message`, `host`, `k8s.labels`, a path into an object such as `kubernetes.pod_name`) or the layout's (`log.file.path`); a name covers what lies below it."#,
};

/// The `except_fields` key, documented once for every sink that reads it.
pub const EXCEPT_FIELDS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "except_fields",
    kind: petrel_core::plugin::KeyKind::List,
    default: Some(r#"[]"#),
    doc: r#"Writes every field but these (Vector's name), named as for `only_fields`."#,
};

/// The `timestamp_format` key, documented once for every sink that reads it.
pub const TIMESTAMP_FORMAT_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "timestamp_format",
    kind: petrel_core::plugin::KeyKind::OneOf(petrel_core::schema::TimeFormat::NAMES),
    default: Some(r#"rfc3339"#),
    doc: r#"How the event time is written: `rfc3339` (`"2024-05-01T10:00:00.123456789Z"`), or a number of seconds (`unix`), milliseconds (`unix_ms`), nanoseconds (`unix_ns`) since the epoch, or seconds with a fraction (`unix_float`, Fluent Bit's `double`)."#,
};

/// The `timestamp_key` key, documented once for every sink that reads it.
pub const TIMESTAMP_KEY_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "timestamp_key",
    kind: petrel_core::plugin::KeyKind::String,
    default: None,
    doc: r#"The key of the event time (default: the sink's, else the layout's: `timestamp`, `@timestamp` for `ecs`)."#,
};

/// Reads a sink's [`OUTPUT_KEYS`]. `writes_fields` is false for a sink
/// whose encoding writes no fields (`text`, a template): any of these keys
/// is then an error at the key, saying why.
pub fn parse_output(map: &Map<'_>, writes_fields: bool) -> Option<Output> {
    parse_output_for(map, writes_fields, Layout::Flat)
}

/// [`parse_output`] for a sink whose layout without `metadata` is not
/// `flat` (the opentelemetry sink's is `otel`).
pub fn parse_output_for(map: &Map<'_>, writes_fields: bool, default: Layout) -> Option<Output> {
    let mut out = Output {
        layout: default,
        dedot: default.default_dedot(),
        ..Output::default()
    };
    let mut ok = true;
    if !writes_fields {
        for key in OUTPUT_KEYS {
            if let Some(n) = map.get(key) {
                n.error(format!(
                    "`{key}` applies to encodings that write fields; with `encoding: text` only the message is written. Use `encoding: ndjson`, or remove `{key}`"
                ));
                ok = false;
            }
        }
        return ok.then_some(out);
    }
    if let Some(n) = map.get("metadata") {
        if n.as_map_quiet().is_none() {
            n.error("`metadata` is a mapping, e.g. `metadata: {layout: ecs, dedot: true}`");
            return None;
        }
        let m = n.as_map(&["layout", "dedot"])?;
        if let Some(l) = m.get("layout") {
            match l.as_choice(Layout::NAMES).and_then(Layout::from_name) {
                Some(layout) => out.layout = layout,
                None => ok = false,
            }
        }
        out.dedot = match m.get("dedot") {
            Some(d) => match d.as_bool() {
                Some(b) => b,
                None => {
                    ok = false;
                    false
                }
            },
            None => out.layout.default_dedot(),
        };
    }
    let paths = |key: &str, ok: &mut bool| -> Option<Vec<FieldPath>> {
        let n = map.get(key)?;
        let mut v = Vec::new();
        for (name, item) in n.as_str_list() {
            if name.is_empty() || name.starts_with('.') || name.ends_with('.') {
                item.error(format!(
                    "`{key}` names fields such as `host` or `k8s.labels`, found `{name}`"
                ));
                *ok = false;
                continue;
            }
            v.push(FieldPath::new(name));
        }
        Some(v)
    };
    out.only = paths("only_fields", &mut ok);
    out.except = paths("except_fields", &mut ok).unwrap_or_default();
    if let (Some(only), Some(n)) = (&out.only, map.get("only_fields")) {
        if only.is_empty() {
            n.error("`only_fields` is empty, so nothing would be written; name the fields to keep or remove the key");
            ok = false;
        }
    }
    if let Some(f) = map.get("timestamp_format") {
        match f
            .as_choice(TimeFormat::NAMES)
            .and_then(TimeFormat::from_name)
        {
            Some(t) => out.time_format = t,
            None => ok = false,
        }
    }
    if let Some(k) = map.get("timestamp_key") {
        match k.as_str() {
            Some(key)
                if !key.is_empty()
                    && key
                        .bytes()
                        .all(|c| c > 0x20 && c != b'"' && c != b'\\' && c < 0x7f) =>
            {
                out.time_key = Some(key.into());
            }
            Some(key) => {
                k.error(format!(
                    "`timestamp_key` must be a plain name such as `@timestamp` or `time`, found `{key}`"
                ));
                ok = false;
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
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
