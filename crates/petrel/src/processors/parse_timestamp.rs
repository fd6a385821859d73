//! `type: parse_timestamp` — reads a field as the event time.
//!
//! ```yaml
//! processors:
//!   - type: parse_regex          # puts the bracketed time in field `time`
//!     # ...
//!   - type: parse_timestamp
//!     field: time                # required
//!     format: "%Y-%m-%d %H:%M:%S%.f"   # default `auto`
//!     timezone: Asia/Shanghai    # default UTC
//!     remove_field: true         # drop `time` once parsed (default false)
//!     on_error: keep             # keep | drop | raw (default keep)
//! ```
//!
//! On success the event time is set; `ndjson` sinks write it as
//! `"timestamp":"2025-04-03T02:02:06.561793000Z"` (RFC 3339, UTC,
//! nanoseconds). The field must hold the timestamp alone; spaces around it
//! are allowed.
//!
//! `format` is one of:
//! - `auto` (the default): ISO 8601 / RFC 3339 (`2025-04-03T10:02:06.561793Z`,
//!   `2025-04-03 10:02:06,123`, `2025/04/03 10:02:06`, with an optional
//!   `Z`/`±hh:mm` offset), syslog (`Apr  3 10:02:06`), Apache/nginx
//!   (`03/Apr/2025:10:02:06 +0000`), each optionally in `[` `]`, and epoch
//!   numbers whose digit count gives the unit (9–10 digits: seconds, with an
//!   optional fraction; 12–13: milliseconds; 15–16: microseconds; 18–19:
//!   nanoseconds; other lengths do not parse).
//! - `unix`, `unix_ms`, `unix_us`, `unix_ns`: an epoch number in that unit
//!   (`unix` accepts a fraction: `1743674526.25`).
//! - a strftime-like pattern. Directives: `%Y` (4-digit year), `%y`
//!   (2-digit: 69–99 → 19xx, 00–68 → 20xx), `%m`, `%d`, `%e` (day, may be
//!   space-padded), `%j` (day of year), `%H`, `%I` + `%p` (12-hour clock and
//!   AM/PM), `%M`, `%S`, `%f` (1–9 fraction digits; more are ignored),
//!   `%.f` (optional `.` or `,` plus fraction), `%z`/`%:z` (`Z`, `±hh`,
//!   `±hhmm`, `±hh:mm`), `%Z` (`UTC`, `GMT`, `Z`), `%s` (epoch seconds),
//!   `%b`/`%h`/`%B` (month name, short or full, any case), `%a`/`%A`
//!   (weekday name, ignored), `%T` = `%H:%M:%S`, `%F` = `%Y-%m-%d`,
//!   `%R` = `%H:%M`, `%D` = `%m/%d/%y`, `%%`. Other characters must match
//!   exactly, except that a space matches any run of spaces and tabs.
//!   Numbers other than `%Y` may have fewer digits (`4/3/2025`). The pattern
//!   needs a month and day (or `%j`) or `%s`; without a year, the current
//!   year is used (the previous one when that would put the time more than
//!   7 days in the future).
//!
//! `timezone` applies to times written without an offset: `UTC`, `local`
//! (the `TZ` environment variable, else `/etc/localtime`), a fixed offset
//! (`+08:00`) or an IANA name (`Europe/Paris`, daylight saving time
//! included; the system's zone database is used, else a copy built into
//! the binary). A wall time skipped by a daylight-saving jump is moved
//! forward; a repeated one takes its first occurrence.
//!
//! Integer and decimal field values (from `parse_json`) are read as epoch
//! numbers with `auto`, the `unix*` formats and the pattern `%s`.
//!
//! When the field is missing or does not parse, `on_error` decides:
//! `keep` (the event goes on unchanged with `parse_error` set), `drop`, or
//! `raw` (as `keep`, plus the value copied to `raw_field`, default `raw`).
//! Each failure counts in
//! `petrel_component_errors_total{error_type="parse_failed"}`; dropped
//! events also in `petrel_component_discarded_events_total{reason="parse_error"}`.

use petrel_core::config::Map;
use petrel_core::plugin::Processor;
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, Event, EventBatch, Value};
use petrel_time::{TimeZone, TimestampFormat};

use super::common::intern_name;
use super::common::{self, OnError};

/// Keys accepted.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "field",
    "format",
    "timezone",
    "on_error",
    "raw_field",
    "remove_field",
];

/// What this plugin does, for the component reference.
pub const DOC: &str =
    r#"Reads a field as the event time (written by `ndjson` sinks as RFC 3339 UTC `timestamp`)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "field",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: the field holding the timestamp alone (spaces around it allowed)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "format",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"auto"#),
        doc: r#"`auto` (ISO 8601 / RFC 3339, syslog, Apache/nginx, epoch numbers by digit count), `unix`, `unix_ms`, `unix_us`, `unix_ns`, or a strftime-like pattern (`%Y-%m-%d %H:%M:%S%.f`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "timezone",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"UTC"#),
        doc: r#"Applies to times written without an offset: `UTC`, `local`, a fixed offset (`+08:00`) or an IANA name (`Europe/Paris`)."#,
    },
    crate::processors::common::ON_ERROR_DOC,
    crate::processors::common::RAW_FIELD_DOC,
    petrel_core::plugin::KeyDoc {
        name: "remove_field",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"`true`: remove the field once parsed."#,
    },
];

/// Configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The field holding the timestamp.
    pub field: String,
    /// The compiled format with its time zone.
    pub format: TimestampFormat,
    /// The format as written, for error reasons.
    pub format_text: String,
    /// What to do with events whose field does not parse.
    pub on_error: OnError,
    /// Delete the field after a successful parse.
    pub remove_field: bool,
}

impl Config {
    /// Reads the keys; format and time zone problems are reported at their
    /// position.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        // Every key is checked before giving up, so that one run of
        // `petrel validate` lists every problem.
        let field = map.required("field", "time").and_then(|n| n.as_str());
        if field == Some("") {
            map.node().error("`field` must not be empty");
        }
        let tz = match map.get("timezone") {
            None => Some(TimeZone::Utc),
            Some(n) => n.as_str().and_then(|name| match TimeZone::from_name(name) {
                Ok(tz) => Some(tz),
                Err(e) => {
                    n.error(e);
                    None
                }
            }),
        };
        let format_node = map.get("format");
        let format_text = match format_node {
            Some(n) => n.as_str(),
            None => Some("auto"),
        };
        // Compiled with UTC when the zone was wrong, to report both.
        let format = format_text.and_then(|text| {
            match TimestampFormat::new(text, tz.clone().unwrap_or(TimeZone::Utc)) {
                Ok(f) => Some(f),
                Err(e) => {
                    format_node.unwrap_or(map.node()).error(e.to_string());
                    None
                }
            }
        });
        let on_error = OnError::parse(&map);
        let remove_field = map.bool("remove_field").unwrap_or(false);
        if remove_field && field == Some("message") {
            map.node().error(
                "`remove_field: true` cannot remove `message`; use a `fields` processor \
                 to rename or replace it",
            );
            return None;
        }
        let field = field.filter(|f| !f.is_empty())?;
        tz?;
        Some(Self {
            field: field.to_string(),
            format: format?,
            format_text: format_text?.to_string(),
            on_error: on_error?,
            remove_field,
        })
    }
}

/// The running processor.
pub struct ParseTimestamp {
    field: &'static str,
    format: TimestampFormat,
    /// Reason written to `parse_error` when the value does not parse.
    no_match: String,
    on_error: OnError,
    remove_field: bool,
    failed: LazyCounter,
    dropped: LazyCounter,
}

impl ParseTimestamp {
    /// Builds it; `metrics` provides the failure counters.
    pub fn new(c: &Config, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            field: intern_name(&c.field),
            format: c.format.clone(),
            no_match: format!(
                "value of `{}` does not match format `{}`",
                c.field, c.format_text
            ),
            on_error: c.on_error.clone(),
            remove_field: c.remove_field,
            failed: metrics.error_counter("parse_failed"),
            dropped: metrics.discarded_counter("parse_error"),
        })
    }

    /// The event time in `ev`'s field, or why there is none.
    #[inline]
    fn time_of(&self, buf: &[u8], ev: &Event) -> Result<i64, &str> {
        let parsed = match ev.get(self.field) {
            None => return Err("field is missing"),
            Some(Value::Int(n)) => self.format.from_integer(*n),
            Some(Value::Float(x)) => self.format.from_float(*x),
            Some(v) => match v.as_bytes(buf) {
                Some(b) => self.format.parse(b).map(|(ns, _)| ns),
                None => return Err("value is not text or a number"),
            },
        };
        parsed.ok_or(&self.no_match)
    }
}

impl Processor for ParseTimestamp {
    fn process(&self, batch: &mut EventBatch) {
        let EventBatch { buf, events, .. } = batch;
        let mut failed = 0u64;
        let before = events.len();
        events.retain_mut(|ev| match self.time_of(buf, ev) {
            Ok(ns) => {
                ev.time_ns = Some(ns);
                if self.remove_field {
                    ev.remove(self.field);
                }
                true
            }
            Err(reason) => {
                failed += 1;
                common::on_failure(&self.on_error, ev, self.field, "parse_timestamp", reason)
            }
        });
        if failed > 0 {
            self.failed.inc_by(failed);
        }
        let dropped = before - events.len();
        if dropped > 0 {
            self.dropped.inc_by(dropped as u64);
        }
    }
}

/// Registration of `type: parse_timestamp`.
pub const PLUGIN: petrel_core::plugin::ProcessorPlugin = petrel_core::plugin::ProcessorPlugin {
    type_name: "parse_timestamp",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| Config::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::ProcessorConfig for Config {
    fn type_name(&self) -> &'static str {
        "parse_timestamp"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<Box<dyn petrel_core::plugin::Processor>> {
        Ok(Box::new(ParseTimestamp::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fields::test_support::*;
    use super::*;
    use petrel_time::write_rfc3339;

    fn pt(yaml: &str) -> (ParseTimestamp, ComponentMetrics) {
        let c = parse_cfg(yaml, KEYS, Config::parse).expect("config");
        let m = metrics();
        (ParseTimestamp::new(&c, m.clone()).unwrap(), m)
    }

    fn rfc(ev: &Event) -> Option<String> {
        ev.time_ns.map(|ns| {
            let mut out = Vec::new();
            write_rfc3339(ns, &mut out);
            String::from_utf8(out).unwrap()
        })
    }

    #[test]
    fn pattern_with_zone_and_remove_field() {
        let (p, m) = pt(
            "type: parse_timestamp\nfield: time\nformat: \"%Y-%m-%d %H:%M:%S.%f\"\ntimezone: \"+08:00\"\nremove_field: true\n",
        );
        let mut b = batch_of(&["[2025-04-03 10:02:06.561793] [info] x", "no time"]);
        // A span of the buffer, as parse_regex would produce.
        with_field(
            &mut b,
            0,
            "time",
            Value::Span(petrel_core::Span::new(1, 26)),
        );
        with_field(&mut b, 1, "time", Value::Str("yesterday".into()));
        p.process(&mut b);
        assert_eq!(
            rfc(&b.events[0]).as_deref(),
            Some("2025-04-03T02:02:06.561793000Z")
        );
        assert!(b.events[0].get("time").is_none());
        assert!(b.events[0].get("parse_error").is_none());
        // Failure with on_error keep: unchanged, reason attached, field kept.
        assert_eq!(b.events[1].time_ns, None);
        assert!(b.events[1].get("time").is_some());
        assert_eq!(
            b.events[1].get("parse_error"),
            Some(&Value::Str(
                "parse_timestamp: value of `time` does not match format `%Y-%m-%d %H:%M:%S.%f`"
                    .into()
            ))
        );
        let text = m.metrics().render();
        assert!(text.contains("error_type=\"parse_failed\"} 1"), "{text}");
    }

    #[test]
    fn auto_and_numbers() {
        let (p, _) = pt("type: parse_timestamp\nfield: ts\n");
        let mut b = batch_of(&["a", "b", "c", "d", "e"]);
        with_field(&mut b, 0, "ts", Value::Str("2025-04-03T10:02:06Z".into()));
        with_field(&mut b, 1, "ts", Value::Int(1_743_674_526_123));
        with_field(&mut b, 2, "ts", Value::Float(1_743_674_526.5));
        with_field(
            &mut b,
            3,
            "ts",
            Value::Str(" 03/Apr/2025:10:02:06 +0000 ".into()),
        );
        with_field(&mut b, 4, "ts", Value::Bool(true));
        p.process(&mut b);
        let got: Vec<Option<String>> = b.events.iter().map(rfc).collect();
        assert_eq!(got[0].as_deref(), Some("2025-04-03T10:02:06.000000000Z"));
        assert_eq!(got[1].as_deref(), Some("2025-04-03T10:02:06.123000000Z"));
        assert_eq!(got[2].as_deref(), Some("2025-04-03T10:02:06.500000000Z"));
        assert_eq!(got[3].as_deref(), Some("2025-04-03T10:02:06.000000000Z"));
        assert_eq!(got[4], None);
        assert_eq!(
            b.events[4].get("parse_error"),
            Some(&Value::Str(
                "parse_timestamp: value is not text or a number".into()
            ))
        );
    }

    #[test]
    fn on_error_drop_and_raw() {
        let (p, m) = pt("type: parse_timestamp\nfield: message\nformat: unix\non_error: drop\n");
        let big = "1".repeat(1 << 20);
        let mut b = batch_of(&["1743674526", "", "nope", &big]);
        b.events
            .push(Event::from_span(petrel_core::Span::new(0, 0)));
        b.events[4].message = Value::Bytes(b"17\xff".to_vec().into());
        p.process(&mut b);
        assert_eq!(b.events.len(), 1);
        assert_eq!(
            rfc(&b.events[0]).as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        let text = m.metrics().render();
        assert!(text.contains("reason=\"parse_error\"} 4"), "{text}");
        assert!(text.contains("error_type=\"parse_failed\"} 4"), "{text}");

        let (p, _) = pt(
            "type: parse_timestamp\nfield: t\nformat: \"%F\"\non_error: raw\nraw_field: bad_time\n",
        );
        let mut b = batch_of(&["x", "y"]);
        with_field(&mut b, 0, "t", Value::Str("2025-02-30".into()));
        p.process(&mut b);
        assert_eq!(b.events.len(), 2);
        assert_eq!(
            b.events[0].get("bad_time"),
            Some(&Value::Str("2025-02-30".into()))
        );
        assert_eq!(
            b.events[1].get("parse_error"),
            Some(&Value::Str("parse_timestamp: field is missing".into()))
        );
    }

    #[test]
    fn config_errors() {
        let errs = cfg_errors(
            "type: parse_timestamp\nformat: \"%F\"\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].contains("missing required key `field`"), "{errs:?}");
        let errs = cfg_errors(
            "type: parse_timestamp\nfield: t\nformat: \"%Y-%m-%d %Q\"\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs[0].starts_with("t.yaml:3:9: unknown directive `%Q`"),
            "{errs:?}"
        );
        let errs = cfg_errors(
            "type: parse_timestamp\nfield: t\ntimezone: Mars/Base\nformat: \"%K\"\n",
            KEYS,
            Config::parse,
        );
        assert!(
            errs[0].contains("3:11: unknown time zone `Mars/Base`"),
            "{errs:?}"
        );
        assert!(errs[1].contains("4:9: unknown directive `%K`"), "{errs:?}");
        let errs = cfg_errors(
            "type: parse_timestamp\nfield: message\nremove_field: true\non_error: maybe\n",
            KEYS,
            Config::parse,
        );
        let all = errs.join("\n");
        assert!(all.contains("cannot remove `message`"), "{all}");
        let errs = cfg_errors(
            "type: parse_timestamp\nfield: t\non_error: maybe\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].contains("`on_error` must be one of"), "{errs:?}");
        let errs = cfg_errors(
            "type: parse_timestamp\nfield: t\nformat: \"%H:%M\"\n",
            KEYS,
            Config::parse,
        );
        assert!(errs[0].contains("has no date"), "{errs:?}");
    }

    #[test]
    fn named_zone() {
        let (p, _) = pt(
            "type: parse_timestamp\nfield: t\nformat: \"%d/%m/%Y %T\"\ntimezone: Europe/Paris\n",
        );
        let mut b = batch_of(&["x", "y"]);
        with_field(&mut b, 0, "t", Value::Str("15/01/2025 12:00:00".into()));
        with_field(&mut b, 1, "t", Value::Str("15/07/2025 12:00:00".into()));
        p.process(&mut b);
        assert_eq!(
            rfc(&b.events[0]).as_deref(),
            Some("2025-01-15T11:00:00.000000000Z")
        );
        assert_eq!(
            rfc(&b.events[1]).as_deref(),
            Some("2025-07-15T10:00:00.000000000Z")
        );
    }
}
