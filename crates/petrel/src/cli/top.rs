//! `petrel top`: a live terminal view of a running agent, read from its
//! `/metrics` endpoint (the same numbers Prometheus scrapes; no second
//! metrics path inside the agent).
//!
//! Rates are differences between two scrapes divided by the time between
//! them. Keys: `q` (or Esc, Ctrl-C) quits, `s` cycles the sort column,
//! `r` reverses it, ↑/↓ scroll the component table.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Gauge, Paragraph, Row, Table};
use ratatui::Frame;

pub use petrel_core::exposition::{parse_metrics, Sample};

/// GET `path` from `addr` with HTTP/1.0 (the agent's API answers plain
/// HTTP); the body on 200.
fn http_get(
    target: &super::tap::ApiTarget,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    let (mut s, sock) = super::tap::connect_to(target, timeout).map_err(|e| format!("{e:#}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let headers = super::tap::request_headers(&target.addr, &sock);
    s.write_all(format!("GET {path} HTTP/1.0\r\n{headers}\r\n").as_bytes())
        .and_then(|_| s.flush())
        .map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("a response without headers")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!(
            "{path} answered {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

/// A component's counters at one scrape.
#[derive(Debug, Default, Clone)]
struct Counters {
    received_events: f64,
    sent_events: f64,
    sent_bytes: f64,
    errors: f64,
    discarded: f64,
    /// Errors and discarded events by reason (`error:TYPE` / `discarded:REASON`).
    reasons: HashMap<String, f64>,
    /// A sink's disk buffer: bytes held, its max_size, age of its oldest
    /// data in flight (seconds); `None` without a disk buffer.
    buffer: Option<(f64, f64, f64)>,
}

/// Key of a component: pipeline, kind, id, type.
type ComponentKey = (String, String, String, String);

/// A file of a pipeline: (pipeline, path).
type FileKey = (String, String);

/// What one scrape says.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    at: Option<Instant>,
    components: HashMap<ComponentKey, Counters>,
    /// Per component: latency histogram buckets (le, cumulative count).
    latency: HashMap<ComponentKey, Vec<(f64, f64)>>,
    /// (pipeline, path) → lag bytes, read offset.
    files: HashMap<FileKey, (f64, f64)>,
    memory_used: f64,
    memory_limit: f64,
    cpu_seconds: f64,
    rss: f64,
    /// Fleet management: connected (and how), the last remote
    /// configuration's hash and status.
    managed: Option<Managed>,
}

/// What `petrel top` shows of a managed agent.
#[derive(Debug, Clone, Default, PartialEq)]
struct Managed {
    connected: bool,
    transport: String,
    hash: String,
    status: String,
}

impl Managed {
    fn line(&self) -> String {
        let conn = if self.connected {
            format!("connected ({})", self.transport)
        } else {
            "disconnected".to_string()
        };
        if self.hash.is_empty() {
            format!("managed: {conn}, no remote configuration yet")
        } else {
            let short = self.hash.get(..12).unwrap_or(&self.hash);
            format!("managed: {conn}, remote config {short} {}", self.status)
        }
    }
}

fn snapshot(samples: &[Sample]) -> Snapshot {
    let mut s = Snapshot {
        at: Some(Instant::now()),
        ..Snapshot::default()
    };
    for m in samples {
        let key = || -> ComponentKey {
            (
                m.label("pipeline").to_string(),
                m.label("component_kind").to_string(),
                m.label("component_id").to_string(),
                m.label("component_type").to_string(),
            )
        };
        match m.name.as_str() {
            "petrel_component_received_events_total" => {
                s.components.entry(key()).or_default().received_events += m.value
            }
            "petrel_component_sent_events_total" => {
                s.components.entry(key()).or_default().sent_events += m.value
            }
            "petrel_component_sent_bytes_total" => {
                s.components.entry(key()).or_default().sent_bytes += m.value
            }
            "petrel_component_errors_total" => {
                let c = s.components.entry(key()).or_default();
                c.errors += m.value;
                *c.reasons
                    .entry(format!("error:{}", m.label("error_type")))
                    .or_default() += m.value;
            }
            "petrel_component_discarded_events_total" => {
                let c = s.components.entry(key()).or_default();
                c.discarded += m.value;
                *c.reasons
                    .entry(format!("discarded:{}", m.label("reason")))
                    .or_default() += m.value;
            }
            "petrel_component_buffer_bytes" => {
                s.components
                    .entry(key())
                    .or_default()
                    .buffer
                    .get_or_insert_default()
                    .0 = m.value
            }
            "petrel_component_buffer_max_bytes" => {
                s.components
                    .entry(key())
                    .or_default()
                    .buffer
                    .get_or_insert_default()
                    .1 = m.value
            }
            "petrel_component_buffer_oldest_seconds" => {
                s.components
                    .entry(key())
                    .or_default()
                    .buffer
                    .get_or_insert_default()
                    .2 = m.value
            }
            "petrel_component_delivery_latency_seconds_bucket" => {
                let le = match m.label("le") {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().unwrap_or(f64::INFINITY),
                };
                s.latency.entry(key()).or_default().push((le, m.value));
            }
            "petrel_file_lag_bytes" | "petrel_file_read_offset_bytes" => {
                let e = s
                    .files
                    .entry((m.label("pipeline").to_string(), m.label("path").to_string()))
                    .or_default();
                if m.name == "petrel_file_lag_bytes" {
                    e.0 = m.value;
                } else {
                    e.1 = m.value;
                }
            }
            "petrel_opamp_connected" => {
                let g = s.managed.get_or_insert_default();
                if m.value > 0.0 {
                    g.connected = true;
                    g.transport = m.label("transport").to_string();
                }
            }
            "petrel_opamp_remote_config_info" => {
                let g = s.managed.get_or_insert_default();
                g.hash = m.label("hash").to_string();
                g.status = m.label("status").to_string();
            }
            "petrel_memory_used_bytes" => s.memory_used = m.value,
            "petrel_memory_limit_bytes" => s.memory_limit = m.value,
            "process_cpu_seconds_total" => s.cpu_seconds = m.value,
            "process_resident_memory_bytes" => s.rss = m.value,
            _ => {}
        }
    }
    for b in s.latency.values_mut() {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
    }
    s
}

/// The `q` quantile of the observations between two cumulative
/// histograms (the upper bound of the bucket it falls in), if any.
fn quantile(now: &[(f64, f64)], before: Option<&Vec<(f64, f64)>>, q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = now
        .iter()
        .map(|&(le, c)| {
            let b = before
                .and_then(|b| b.iter().find(|x| x.0 == le))
                .map_or(0.0, |x| x.1);
            (le, c - b)
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    diff.iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

/// One row of the component table.
struct RowData {
    key: ComponentKey,
    in_rate: f64,
    out_rate: f64,
    bytes_rate: f64,
    errors_rate: f64,
    discarded_rate: f64,
    /// The reason growing fastest, with its rate.
    top_reason: Option<(String, f64)>,
    p50: Option<f64>,
    p99: Option<f64>,
    /// "held of max (age)" for a sink with a disk buffer.
    buffer: Option<String>,
}

/// Columns the table can be sorted by.
const SORTS: &[&str] = &["name", "events/s", "bytes/s", "errors/s"];

/// The viewer's state.
struct App {
    addr: String,
    /// Where the API is (`None` in unit tests, which read no agent).
    target: Option<super::tap::ApiTarget>,
    previous: Option<Snapshot>,
    current: Option<Snapshot>,
    error: Option<String>,
    sort: usize,
    reverse: bool,
    scroll: usize,
}

impl App {
    fn refresh(&mut self) {
        let Some(target) = &self.target else { return };
        match http_get(target, "/metrics", Duration::from_secs(2)) {
            Ok(text) => {
                let snap = snapshot(&parse_metrics(&text));
                self.previous = self.current.take();
                self.current = Some(snap);
                self.error = None;
            }
            Err(e) => {
                self.error = Some(e);
                self.previous = None;
                self.current = None;
            }
        }
    }

    fn rows(&self) -> Vec<RowData> {
        let Some(cur) = &self.current else {
            return Vec::new();
        };
        let prev = self.previous.as_ref();
        let secs = match (prev.and_then(|p| p.at), cur.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(1e-3),
            _ => 0.0,
        };
        let rate = |now: f64, before: Option<f64>| -> f64 {
            match before {
                Some(b) if secs > 0.0 => ((now - b) / secs).max(0.0),
                _ => 0.0,
            }
        };
        let mut rows: Vec<RowData> = cur
            .components
            .iter()
            .map(|(k, c)| {
                let p = prev.and_then(|p| p.components.get(k));
                let lat_now = cur.latency.get(k);
                let lat_before = prev.and_then(|p| p.latency.get(k));
                RowData {
                    key: k.clone(),
                    in_rate: rate(c.received_events, p.map(|p| p.received_events)),
                    out_rate: rate(c.sent_events, p.map(|p| p.sent_events)),
                    bytes_rate: rate(c.sent_bytes, p.map(|p| p.sent_bytes)),
                    errors_rate: rate(c.errors, p.map(|p| p.errors)),
                    discarded_rate: rate(c.discarded, p.map(|p| p.discarded)),
                    top_reason: c
                        .reasons
                        .iter()
                        .map(|(r, v)| {
                            (
                                r.clone(),
                                rate(*v, p.and_then(|p| p.reasons.get(r)).copied()),
                            )
                        })
                        .filter(|(_, v)| *v > 0.0)
                        .max_by(|a, b| a.1.total_cmp(&b.1)),
                    p50: lat_now.and_then(|l| quantile(l, lat_before, 0.5)),
                    p99: lat_now.and_then(|l| quantile(l, lat_before, 0.99)),
                    buffer: c.buffer.map(|(held, max, age)| {
                        let pct = if max > 0.0 { held * 100.0 / max } else { 0.0 };
                        format!("{} {pct:.0}% {age:.0}s", human_bytes(held))
                    }),
                }
            })
            .collect();
        let kind_order = |k: &str| match k {
            "source" => 0,
            "processor" => 1,
            _ => 2,
        };
        rows.sort_by(|a, b| {
            let by_name = (&a.key.0, kind_order(&a.key.1), &a.key.2).cmp(&(
                &b.key.0,
                kind_order(&b.key.1),
                &b.key.2,
            ));
            let o = match self.sort {
                1 => b.out_rate.total_cmp(&a.out_rate),
                2 => b.bytes_rate.total_cmp(&a.bytes_rate),
                3 => (b.errors_rate + b.discarded_rate)
                    .total_cmp(&(a.errors_rate + a.discarded_rate)),
                _ => std::cmp::Ordering::Equal,
            };
            o.then(by_name)
        });
        if self.reverse {
            rows.reverse();
        }
        rows
    }

    fn cpu_percent(&self) -> Option<f64> {
        let (p, c) = (self.previous.as_ref()?, self.current.as_ref()?);
        let secs = c.at?.duration_since(p.at?).as_secs_f64();
        (secs > 0.0).then(|| (c.cpu_seconds - p.cpu_seconds) / secs * 100.0)
    }

    fn draw(&self, f: &mut Frame) {
        let [head, gauge, table, files, help] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(5),
            Constraint::Length(8),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let help_line = format!(
            "q quit · s sort ({}{}) · r reverse · ↑/↓ scroll",
            SORTS[self.sort],
            if self.reverse { ", reversed" } else { "" }
        );
        f.render_widget(
            Paragraph::new(help_line).style(Style::default().add_modifier(Modifier::DIM)),
            help,
        );
        let Some(cur) = &self.current else {
            let msg = format!(
                "petrel top: no agent answers at {} ({}). Is `petrel run` running with --api-addr {}? Retrying every second.",
                self.addr,
                self.error.as_deref().unwrap_or("no answer yet"),
                self.addr
            );
            f.render_widget(
                Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }),
                table,
            );
            return;
        };
        let cpu = self
            .cpu_percent()
            .map_or("-".to_string(), |c| format!("{c:.1} %"));
        f.render_widget(
            Paragraph::new(format!(
                "petrel top · {} · CPU {cpu} · RSS {}{}",
                self.addr,
                human_bytes(cur.rss),
                cur.managed
                    .as_ref()
                    .map(|m| format!(" · {}", m.line()))
                    .unwrap_or_default()
            ))
            .style(Style::default().add_modifier(Modifier::BOLD)),
            head,
        );
        let ratio = if cur.memory_limit > 0.0 {
            (cur.memory_used / cur.memory_limit).clamp(0.0, 1.0)
        } else {
            0.0
        };
        f.render_widget(
            Gauge::default().ratio(ratio).label(format!(
                "in flight {} of {}",
                human_bytes(cur.memory_used),
                human_bytes(cur.memory_limit)
            )),
            gauge,
        );
        let rows = self.rows();
        let body: Vec<Row> = rows
            .iter()
            .skip(self.scroll.min(rows.len().saturating_sub(1)))
            .map(|r| {
                Row::new(vec![
                    Cell::from(r.key.0.clone()),
                    Cell::from(r.key.1.clone()),
                    Cell::from(format!("{} ({})", r.key.2, r.key.3)),
                    Cell::from(human_rate(r.in_rate)),
                    Cell::from(human_rate(r.out_rate)),
                    Cell::from(format!("{}/s", human_bytes(r.bytes_rate))),
                    Cell::from(human_rate(r.errors_rate)),
                    Cell::from(human_rate(r.discarded_rate)),
                    Cell::from(
                        r.p50
                            .map_or("-".to_string(), |v| format!("{:.0} ms", v * 1e3)),
                    ),
                    Cell::from(
                        r.p99
                            .map_or("-".to_string(), |v| format!("{:.0} ms", v * 1e3)),
                    ),
                    Cell::from(r.buffer.clone().unwrap_or_else(|| "-".into())),
                    Cell::from(
                        r.top_reason
                            .as_ref()
                            .map_or(String::new(), |(k, v)| format!("{k} {}/s", human_rate(*v))),
                    ),
                ])
            })
            .collect();
        let widths = [
            Constraint::Min(10),
            Constraint::Length(9),
            Constraint::Min(16),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Min(18),
        ];
        let header = Row::new(vec![
            "pipeline",
            "kind",
            "component",
            "in ev/s",
            "out ev/s",
            "out bytes",
            "errors/s",
            "discard/s",
            "p50",
            "p99",
            "disk buffer",
            "top reason",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD));
        f.render_widget(
            Table::new(body, widths).header(header).block(
                Block::default()
                    .borders(Borders::TOP)
                    .title("components (p50/p99: sink delivery latency)"),
            ),
            table,
        );
        // Files by lag, largest first.
        let mut lag: Vec<(&FileKey, &(f64, f64))> = cur.files.iter().collect();
        lag.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let prev = self.previous.as_ref();
        let secs = match (prev.and_then(|p| p.at), cur.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let file_rows: Vec<Row> = lag
            .iter()
            .take(6)
            .map(|(k, (lag_bytes, offset))| {
                let read_rate = prev
                    .and_then(|p| p.files.get(*k))
                    .filter(|_| secs > 0.0)
                    .map_or(0.0, |p| ((offset - p.1) / secs).max(0.0));
                let behind = if *lag_bytes <= 0.0 {
                    "0 s".to_string()
                } else if read_rate > 0.0 {
                    format!("{:.1} s", lag_bytes / read_rate)
                } else {
                    "stalled".to_string()
                };
                Row::new(vec![
                    Cell::from(k.0.clone()),
                    Cell::from(k.1.clone()),
                    Cell::from(human_bytes(*lag_bytes)),
                    Cell::from(behind),
                ])
            })
            .collect();
        f.render_widget(
            Table::new(
                file_rows,
                [
                    Constraint::Min(10),
                    Constraint::Min(30),
                    Constraint::Length(10),
                    Constraint::Length(10),
                ],
            )
            .header(
                Row::new(vec!["pipeline", "file", "lag", "behind"])
                    .style(Style::default().add_modifier(Modifier::BOLD)),
            )
            .block(
                Block::default()
                    .borders(Borders::TOP)
                    .title(Line::from("files by lag (behind = lag / read rate)")),
            ),
            files,
        );
    }
}

fn human_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn human_bytes(v: f64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v.max(0.0);
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Runs the viewer until `q`; `interval` between scrapes.
pub fn run(target: super::tap::ApiTarget, interval: Duration) -> anyhow::Result<()> {
    let mut app = App {
        addr: target.addr.clone(),
        target: Some(target),
        previous: None,
        current: None,
        error: None,
        sort: 0,
        reverse: false,
        scroll: 0,
    };
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                app.refresh();
                next = Instant::now() + interval;
            }
            terminal.draw(|f| app.draw(f))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(())
                        }
                        KeyCode::Char('s') => app.sort = (app.sort + 1) % SORTS.len(),
                        KeyCode::Char('r') => app.reverse = !app.reverse,
                        KeyCode::Down => app.scroll += 1,
                        KeyCode::Up => app.scroll = app.scroll.saturating_sub(1),
                        _ => {}
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_managed_agent_shows_its_server_and_remote_configuration() {
        let text = "petrel_opamp_connected{transport=\"websocket\"} 1\npetrel_opamp_remote_config_info{hash=\"0a1b2c3d4e5f60718293\",status=\"APPLIED\"} 1\n";
        let s = snapshot(&parse_metrics(text));
        assert_eq!(
            s.managed.unwrap().line(),
            "managed: connected (websocket), remote config 0a1b2c3d4e5f APPLIED"
        );
        let s = snapshot(&parse_metrics(
            "petrel_opamp_connected{transport=\"none\"} 0\n",
        ));
        assert_eq!(
            s.managed.unwrap().line(),
            "managed: disconnected, no remote configuration yet"
        );
        assert!(snapshot(&parse_metrics("petrel_memory_used_bytes 1\n"))
            .managed
            .is_none());
    }

    #[test]
    fn a_sink_with_a_disk_buffer_shows_what_it_holds() {
        let l = "pipeline=\"p\",component_kind=\"sink\",component_id=\"es\",component_type=\"elasticsearch\"";
        let text = format!("petrel_component_buffer_bytes{{{l}}} 52428800\npetrel_component_buffer_max_bytes{{{l}}} 104857600\npetrel_component_buffer_oldest_seconds{{{l}}} 42\npetrel_component_sent_events_total{{pipeline=\"p\",component_kind=\"sink\",component_id=\"f\",component_type=\"file\"}} 1\n");
        let top = App {
            addr: "127.0.0.1:1".into(),
            target: None,
            previous: None,
            current: Some(snapshot(&parse_metrics(&text))),
            error: None,
            sort: 0,
            reverse: false,
            scroll: 0,
        };
        let rows = top.rows();
        let es = rows.iter().find(|r| r.key.2 == "es").expect("es row");
        let shown = es.buffer.as_deref().expect("a buffer column");
        assert!(shown.contains("50%") && shown.contains("42s"), "{shown}");
        let f = rows.iter().find(|r| r.key.2 == "f").expect("file row");
        assert!(f.buffer.is_none());
    }

    #[test]
    fn quantiles_come_from_the_difference_of_two_histograms() {
        let before = vec![(0.001, 0.0), (0.01, 10.0), (f64::INFINITY, 10.0)];
        let now = vec![(0.001, 0.0), (0.01, 10.0), (f64::INFINITY, 20.0)];
        // The ten new observations are all above 10 ms.
        assert_eq!(quantile(&now, Some(&before), 0.5), Some(f64::INFINITY));
        assert_eq!(quantile(&now, None, 0.5), Some(0.01));
        assert_eq!(quantile(&before, Some(&before), 0.5), None);
    }
}
