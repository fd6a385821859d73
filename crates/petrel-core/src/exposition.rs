//! The Prometheus/OpenMetrics text exposition that [`crate::Metrics::render`]
//! writes, read back: `petrel top` reads an agent's `/metrics` with it,
//! and the own-telemetry exporter turns the agent's metrics into OTLP
//! from it, so that there is one metrics path inside the agent (the
//! registry) and one reader of its text.

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_total`, `_bucket` and the like).
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `k`, or "".
    pub fn label(&self, k: &str) -> &str {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// Parses the Prometheus text exposition format (comments skipped; lines
/// that do not parse are ignored rather than fatal: a newer agent may add
/// syntax this viewer does not know).
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let mut key = String::new();
        let end;
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next().map(|(_, c)| c) != Some('"') {
                        return None;
                    }
                    let mut val = String::new();
                    loop {
                        let (_, c) = chars.next()?;
                        match c {
                            '\\' => match chars.next()?.1 {
                                'n' => val.push('\n'),
                                other => val.push(other),
                            },
                            '"' => break,
                            other => val.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), val));
                }
                other => key.push(other),
            }
        }
        rest = &r[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The kind of a metric family, from its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic: samples `<name>_total` (and `<name>_created`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Samples `<name>_bucket{le}`, `<name>_sum`, `<name>_count`.
    Histogram,
    /// `info`, `stateset`, `unknown` and the rest: read as gauges.
    Other,
}

/// One metric family: its `# TYPE` and `# HELP` lines and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    /// The family name (without `_total`, `_bucket` and the like).
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Its `# HELP` text (unescaped as written).
    pub help: String,
    /// Its samples, in the order written.
    pub samples: Vec<Sample>,
}

/// Parses the exposition into families. A sample before any `# TYPE` line
/// of its name is a family of its own of kind [`Kind::Other`].
pub fn parse_families(text: &str) -> Vec<MetricFamily> {
    let mut out: Vec<MetricFamily> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            let kind = match kind {
                "counter" => Kind::Counter,
                "gauge" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                _ => Kind::Other,
            };
            match out.last_mut() {
                Some(f) if f.name == name && f.samples.is_empty() => f.kind = kind,
                _ => out.push(MetricFamily {
                    name: name.to_string(),
                    kind,
                    help: String::new(),
                    samples: Vec::new(),
                }),
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            match out.last_mut() {
                Some(f) if f.name == name => f.help = help.to_string(),
                _ => out.push(MetricFamily {
                    name: name.to_string(),
                    kind: Kind::Other,
                    help: help.to_string(),
                    samples: Vec::new(),
                }),
            }
            continue;
        }
        let Some(s) = parse_line(line) else {
            continue;
        };
        let belongs = out.last().is_some_and(|f| {
            s.name.strip_prefix(f.name.as_str()).is_some_and(|suffix| {
                matches!(
                    suffix,
                    "" | "_total" | "_created" | "_bucket" | "_sum" | "_count" | "_info"
                )
            })
        });
        match out.last_mut() {
            Some(f) if belongs => f.samples.push(s),
            _ => out.push(MetricFamily {
                name: s.name.clone(),
                kind: Kind::Other,
                help: String::new(),
                samples: vec![s],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exposition_format() {
        let text = "# HELP x y\n# TYPE x counter\npetrel_component_sent_events_total{pipeline=\"p\",component_kind=\"source\",component_id=\"a\\\"b\",component_type=\"file\"} 12\nprocess_cpu_seconds_total 0.5\nbad line {\nh_bucket{le=\"+Inf\"} 3\n";
        let s = parse_metrics(text);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[0].label("component_id"), "a\"b");
        assert_eq!(s[0].value, 12.0);
        assert_eq!(s[1].name, "process_cpu_seconds_total");
        assert_eq!(s[2].label("le"), "+Inf");
    }

    #[test]
    fn samples_are_grouped_by_their_type_lines() {
        let text = "# HELP petrel_a Events.\n# TYPE petrel_a counter\npetrel_a_total{k=\"1\"} 3\npetrel_a_total{k=\"2\"} 4\n# TYPE petrel_g gauge\npetrel_g 7\n# TYPE petrel_h histogram\npetrel_h_sum 1.5\npetrel_h_count 2\npetrel_h_bucket{le=\"0.1\"} 1\npetrel_h_bucket{le=\"+Inf\"} 2\nloose 1\n# EOF\n";
        let f = parse_families(text);
        let names: Vec<(&str, Kind, usize)> = f
            .iter()
            .map(|f| (f.name.as_str(), f.kind, f.samples.len()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("petrel_a", Kind::Counter, 2),
                ("petrel_g", Kind::Gauge, 1),
                ("petrel_h", Kind::Histogram, 4),
                ("loose", Kind::Other, 1),
            ]
        );
        assert_eq!(f[0].help, "Events.");
    }
}
