//! `{{ field }}` templates, such as Kafka topics `app-{{ level }}` (the
//! one template engine lives in `petrel_core::template`; the `text`
//! encoding renders its line templates there too), and [`TimeTemplate`]s,
//! whose literal text also holds strftime conversions of the event time
//! (Elasticsearch index names `petrel-%Y.%m.%d`, S3 key prefixes
//! `date=%F/` as Vector's `aws_s3` sink writes them).

use petrel_core::config::Node;
use petrel_core::{Event, EventBatch};

pub use petrel_core::template::{RenderOptions, Template};

/// strftime conversions accepted in a [`TimeTemplate`].
pub const TIME_CONVERSIONS: &[char] = &['Y', 'y', 'm', 'd', 'H', 'M', 'S', 'j', 'F', 'T', 's', '%'];

/// A template whose literal text may hold strftime conversions of the
/// event time (UTC): `%Y %y %m %d %H %M %S %j`, `%F` (`%Y-%m-%d`), `%T`
/// (`%H:%M:%S`), `%s` (seconds since the epoch) and `%%`. A `%` inside a
/// field's value stays as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeTemplate {
    template: Template,
}

impl TimeTemplate {
    /// Parses `text`, the value of key `what`; an unknown conversion is
    /// reported at `node`.
    pub fn parse(text: &str, node: Node<'_>, what: &str) -> Option<Self> {
        let template = Template::parse(text, node)?;
        for lit in template.literals() {
            let mut chars = lit.chars();
            while let Some(c) = chars.next() {
                if c != '%' {
                    continue;
                }
                match chars.next() {
                    Some(x) if TIME_CONVERSIONS.contains(&x) => {}
                    other => {
                        node.error(format!(
                            "`%{}` in {what} `{text}` is not supported; use %Y %y %m %d %H %M %S %j %F %T %s or %%",
                            other.map(String::from).unwrap_or_default()
                        ));
                        return None;
                    }
                }
            }
        }
        Some(Self { template })
    }

    /// True when the template has no `{{ field }}` (it depends on the
    /// time only).
    pub fn is_static(&self) -> bool {
        self.template.as_static().is_some()
    }

    /// Renders for `ev` at time `ns` into `out`; false when a template
    /// field is missing (it renders as nothing).
    pub fn render(&self, ev: &Event, batch: &EventBatch, ns: i64, out: &mut String) -> bool {
        self.template
            .render_with(ev, batch, out, |lit, o| strftime(lit, ns, o))
    }
}

/// Expands the conversions of [`TIME_CONVERSIONS`] in `lit` for `ns` (UTC).
pub fn strftime(lit: &str, ns: i64, out: &mut String) {
    use std::fmt::Write;
    if !lit.contains('%') {
        out.push_str(lit);
        return;
    }
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = petrel_time::civil_from_days(days);
    let mut chars = lit.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y:04}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('F') => write!(out, "{y:04}-{m:02}-{d:02}"),
            Some('H') => write!(out, "{:02}", sod / 3600),
            Some('M') => write!(out, "{:02}", sod % 3600 / 60),
            Some('S') => write!(out, "{:02}", sod % 60),
            Some('T') => write!(
                out,
                "{:02}:{:02}:{:02}",
                sod / 3600,
                sod % 3600 / 60,
                sod % 60
            ),
            Some('s') => write!(out, "{secs}"),
            Some('j') => write!(
                out,
                "{:03}",
                days - petrel_time::days_from_civil(y, 1, 1) + 1
            ),
            Some(x) => write!(out, "{x}"),
            None => write!(out, "%"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors};
    use petrel_core::{Span, Value};
    use std::sync::Arc;

    fn tpl(s: &str) -> Option<Template> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, "x: 1").unwrap();
        let errs = ConfigErrors::new();
        Template::parse(s, petrel_core::config::Node::root(&f, &raw, &errs))
    }

    #[test]
    fn renders_fields_and_reports_missing() {
        let t = tpl("app-{{ level }}").unwrap();
        let batch = EventBatch::new(
            bytes::Bytes::from_static(b"warn"),
            Arc::new(petrel_core::SourceInfo::file("/x", Default::default())),
        );
        let mut ev = Event::from_span(Span::new(0, 0));
        let mut out = String::new();
        assert!(!t.render(&ev, &batch, &mut out));
        ev.set("level".into(), Value::Span(Span::new(0, 4)));
        assert!(t.render(&ev, &batch, &mut out));
        assert_eq!(out, "app-warn");
        let f = tpl("f={{ file }}").unwrap();
        assert!(f.render(&ev, &batch, &mut out));
        assert_eq!(out, "f=/x");
        assert_eq!(tpl("plain").unwrap().as_static(), Some("plain"));
        assert!(tpl("bad-{{ level").is_none());
    }

    #[test]
    fn strftime_conversions() {
        let mut s = String::new();
        strftime(
            "x-%Y.%m.%d %H:%M:%S %j %y %%",
            1_700_000_000_000_000_000,
            &mut s,
        );
        assert_eq!(s, "x-2023.11.14 22:13:20 318 23 %");
        s.clear();
        strftime("date=%F/%T/%s", 1_700_000_000_000_000_000, &mut s);
        assert_eq!(s, "date=2023-11-14/22:13:20/1700000000");
    }
}
