//! The syslog and tcp sinks against real receivers on 127.0.0.1: rsyslogd
//! and syslog-ng take RFC 5424 and RFC 3164 from Petrel over UDP, TCP and
//! TLS, and what they write (every header field, through their own file
//! templates) is compared field by field with what was sent into Petrel's
//! syslog source (syslog → Petrel → syslog keeps the fields). A receiver
//! stopped and restarted mid-stream loses nothing. The tcp sink writes
//! lines to a listener in the test, over TCP and TLS. And the file sink
//! with a line template writes what rsyslog writes for the same messages
//! in its traditional file format.

mod common;
mod server;
mod syslog_servers;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Duration;

use common::*;
use syslog_servers::{make_certs, Kind, Listen, Receiver};

/// One message sent into Petrel, and what a receiver must show of it.
#[derive(Debug, Clone)]
struct Sent {
    facility: u8,
    severity: u8,
    /// Nanoseconds, whole microseconds.
    time_ns: i64,
    hostname: &'static str,
    app: &'static str,
    procid: Option<&'static str>,
    msgid: Option<&'static str>,
    /// (SD-ID, PARAM, value), in order.
    sd: Vec<(&'static str, &'static str, &'static str)>,
    msg: String,
}

impl Sent {
    fn frame(&self) -> String {
        let mut sd = String::new();
        let mut current = "";
        for (id, k, v) in &self.sd {
            if *id != current {
                if !current.is_empty() {
                    sd.push(']');
                }
                sd.push_str(&format!("[{id}"));
                current = id;
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace(']', "\\]");
            sd.push_str(&format!(" {k}=\"{v}\""));
        }
        if current.is_empty() {
            sd.push('-');
        } else {
            sd.push(']');
        }
        let mut t = Vec::new();
        petrel_time::write_rfc3339(self.time_ns, &mut t);
        let t = String::from_utf8(t).unwrap();
        format!(
            "<{}>1 {}Z {} {} {} {} {} {}",
            u32::from(self.facility) * 8 + u32::from(self.severity),
            &t[..26],
            self.hostname,
            self.app,
            self.procid.unwrap_or("-"),
            self.msgid.unwrap_or("-"),
            sd,
            self.msg
        )
    }
}

impl Sent {
    /// The message as RFC 3164 (`<PRI>Mmm dd hh:mm:ss HOST APP[PID]: MSG`,
    /// time in UTC), newline-terminated.
    fn frame3164(&self) -> String {
        let f =
            petrel_time::TimeFormatter::new("%b %e %H:%M:%S", petrel_time::TimeZone::Utc).unwrap();
        let mut t = Vec::new();
        f.write(self.time_ns, &mut t);
        format!(
            "<{}>{} {} {}{}: {}\n",
            u32::from(self.facility) * 8 + u32::from(self.severity),
            String::from_utf8(t).unwrap(),
            self.hostname,
            self.app,
            self.procid.map(|p| format!("[{p}]")).unwrap_or_default(),
            self.msg
        )
    }
}

/// Messages with times a little before now (RFC 3164 receivers infer the
/// year from their clock).
fn messages(n: usize) -> Vec<Sent> {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let base = now_us - 3_600_000_000;
    let mut v = vec![
        Sent {
            facility: 20,
            severity: 5,
            time_ns: (base + 5_123) * 1000,
            hostname: "host1.example.com",
            app: "app1",
            procid: Some("123"),
            msgid: Some("ID47"),
            sd: vec![
                ("exampleSDID@32473", "iut", "3"),
                ("exampleSDID@32473", "eventSource", "Application"),
                ("ex@1", "q", "a\"b]c\\d"),
            ],
            msg: "message one with ünïcödé".into(),
        },
        Sent {
            facility: 4,
            severity: 2,
            time_ns: (base + 1_000_000) * 1000,
            hostname: "host2",
            app: "su",
            procid: None,
            msgid: None,
            sd: vec![],
            msg: "'su root' failed for lonvick on /dev/pts/8".into(),
        },
    ];
    for i in 0..n.saturating_sub(v.len()) {
        v.push(Sent {
            facility: (i % 24) as u8,
            severity: (i % 8) as u8,
            time_ns: (base + 2_000_000 + i as i64 * 1_001) * 1000,
            hostname: "web-3",
            app: "nginx",
            procid: Some("4242"),
            msgid: Some("req"),
            sd: vec![("meta@1", "seq", "x")],
            msg: format!("GET /item/{i} 200"),
        });
    }
    v
}

/// Sends frames (octet counting) into Petrel's syslog source.
fn send_frames(port: u16, msgs: &[Sent]) {
    let mut s = connect(port);
    let mut buf = Vec::new();
    for m in msgs {
        let f = m.frame();
        buf.extend_from_slice(format!("{} {f}", f.len()).as_bytes());
    }
    s.write_all(&buf).unwrap();
}

fn time_of(s: &str) -> i64 {
    petrel_time::TimestampFormat::auto(petrel_time::TimeZone::Utc)
        .parse(s.as_bytes())
        .unwrap_or_else(|| panic!("receiver time `{s}`"))
        .0
}

/// The (SD-ID, PARAM, value) triples of a structured data string.
fn sd_triples(sd: &str) -> BTreeSet<(String, String, String)> {
    let frame = format!("<0>1 - - - - - {sd}");
    let mut m = petrel_syslog::Message::default();
    let ctx = petrel_syslog::Context::now(petrel_time::TimeZone::Utc);
    if sd.is_empty() || sd == "-" {
        return BTreeSet::new();
    }
    petrel_syslog::parse(
        frame.as_bytes(),
        petrel_syslog::Format::Rfc5424,
        &ctx,
        &mut m,
    )
    .unwrap_or_else(|e| panic!("structured data `{sd}`: {e}"));
    let b = frame.as_bytes();
    m.sd.iter()
        .map(|p| {
            let v = petrel_syslog::unescape_sd_value(&b[p.value.clone()]);
            (
                String::from_utf8_lossy(&b[p.id.clone()]).into_owned(),
                String::from_utf8_lossy(&b[p.name.clone()]).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect()
}

fn nil(s: &str) -> Option<&str> {
    (!s.is_empty() && s != "-").then_some(s)
}

/// Compares what a receiver wrote with what was sent, field by field.
fn check(r: &Receiver, what: &str, sent: &[Sent], rfc5424: bool) {
    let recs = r.records();
    assert_eq!(
        recs.len(),
        sent.len(),
        "{what}: received {recs:?}; log: {}",
        r.log()
    );
    let by_msg: HashMap<&str, &Vec<String>> = recs.iter().map(|f| (f[9].trim_start(), f)).collect();
    for s in sent {
        let f = by_msg
            .get(s.msg.as_str())
            .unwrap_or_else(|| panic!("{what}: `{}` not received; got {recs:?}", s.msg));
        let pri = u32::from(s.facility) * 8 + u32::from(s.severity);
        assert_eq!(f[0], pri.to_string(), "{what}: PRI of {s:?}: {f:?}");
        assert_eq!(f[1], s.facility.to_string(), "{what}: facility: {f:?}");
        assert_eq!(f[2], s.severity.to_string(), "{what}: severity: {f:?}");
        let t = time_of(&f[3]);
        if rfc5424 {
            assert_eq!(t, s.time_ns, "{what}: time `{}` of {s:?}", f[3]);
        } else {
            assert_eq!(
                t,
                s.time_ns / 1_000_000_000 * 1_000_000_000,
                "{what}: time `{}`",
                f[3]
            );
        }
        assert_eq!(f[4], s.hostname, "{what}: hostname: {f:?}");
        assert_eq!(f[5], s.app, "{what}: app-name: {f:?}");
        assert_eq!(nil(&f[6]), s.procid, "{what}: procid: {f:?}");
        if rfc5424 {
            assert_eq!(nil(&f[7]), s.msgid, "{what}: msgid: {f:?}");
            let want: BTreeSet<_> =
                s.sd.iter()
                    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
                    .collect();
            assert_eq!(sd_triples(&f[8]), want, "{what}: structured data: {f:?}");
        }
        assert_eq!(f[9].trim_start(), s.msg, "{what}: message: {f:?}");
    }
}

/// A syslog sink entry of a pipeline.
fn sink_yaml(id: &str, port: u16, mode: &str, format: &str, extra: &str) -> String {
    format!(
        "  - type: syslog\n    id: {id}\n    address: 127.0.0.1:{port}\n    mode: {mode}\n    format: {format}\n    timezone: UTC\n{extra}"
    )
}

#[test]
fn rsyslog_and_syslog_ng_receive_every_field_over_udp_tcp_and_tls() {
    let dir = tempdir();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (ca, _, _) = make_certs(&certs);
    let tls = format!(
        "    tls: {{ ca_file: {}, server_name: localhost }}\n",
        ca.display()
    );
    // (receiver, listen, sink mode, format, sink keys)
    let cases: Vec<(Kind, Listen, &str, &str, String)> = vec![
        (
            Kind::Rsyslog,
            Listen::Udp { rfc5424: true },
            "udp",
            "rfc5424",
            String::new(),
        ),
        (
            Kind::Rsyslog,
            Listen::Tcp { octet: true },
            "tcp",
            "rfc5424",
            String::new(),
        ),
        (Kind::Rsyslog, Listen::Tls, "tls", "rfc5424", tls.clone()),
        (
            Kind::Rsyslog,
            Listen::Udp { rfc5424: false },
            "udp",
            "rfc3164",
            String::new(),
        ),
        (
            Kind::Rsyslog,
            Listen::Tcp { octet: false },
            "tcp",
            "rfc3164",
            String::new(),
        ),
        (
            Kind::SyslogNg,
            Listen::Udp { rfc5424: true },
            "udp",
            "rfc5424",
            String::new(),
        ),
        (
            Kind::SyslogNg,
            Listen::Tcp { octet: true },
            "tcp",
            "rfc5424",
            String::new(),
        ),
        (Kind::SyslogNg, Listen::Tls, "tls", "rfc5424", tls.clone()),
        (
            Kind::SyslogNg,
            Listen::Udp { rfc5424: false },
            "udp",
            "rfc3164",
            String::new(),
        ),
        (
            Kind::SyslogNg,
            Listen::Tcp { octet: false },
            "tcp",
            "rfc3164",
            String::new(),
        ),
    ];
    let receivers: Vec<Receiver> = cases
        .iter()
        .map(|(k, l, ..)| Receiver::start(*k, *l, Some(&certs)))
        .collect();
    let in_port = free_port();
    let mut yaml = format!(
        "sources:\n  - type: syslog\n    address: 127.0.0.1:{in_port}\n    format: rfc5424\nsinks:\n"
    );
    for (i, ((_, _, mode, format, extra), r)) in cases.iter().zip(&receivers).enumerate() {
        yaml.push_str(&sink_yaml(&format!("s{i}"), r.port, mode, format, extra));
    }
    let cfg = write_config(dir.path(), "fwd", &yaml);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let sent = messages(20);
    send_frames(in_port, &sent);
    for ((kind, listen, mode, format, _), r) in cases.iter().zip(&receivers) {
        let what = format!("{kind:?} {listen:?} {mode} {format}");
        wait_for(LONG, &format!("{what}: {} messages", sent.len()), || {
            let n = count_lines(&r.out);
            if n >= sent.len() {
                Ok(())
            } else {
                Err(format!("{n} lines; sink log: {}", agent.stderr()))
            }
        });
        check(r, &what, &sent, *format == "rfc5424");
    }
    // Every sink confirmed every event.
    for i in 0..cases.len() {
        let id = format!("s{i}");
        wait_for(MEDIUM, &format!("sink {id} sent {}", sent.len()), || {
            let v = agent.metric_or_zero(
                "petrel_component_sent_events_total",
                &component("fwd", "sink", &id),
            );
            if v >= sent.len() as f64 {
                Ok(())
            } else {
                Err(format!("{v}"))
            }
        });
    }
}

/// Lines `seq=N` appended to a file source while rsyslog is stopped and
/// started again: every N arrives (some twice, counted), and the agent
/// noticed the broken connection.
#[test]
fn a_receiver_restarted_mid_stream_loses_nothing_over_tcp() {
    let dir = tempdir();
    let mut r = Receiver::start(Kind::Rsyslog, Listen::Tcp { octet: true }, None);
    let input = dir.path().join("in.log");
    std::fs::write(&input, b"").unwrap();
    let yaml = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n{}",
        input.display(),
        sink_yaml("out", r.port, "tcp", "rfc5424", "    app_name: seqapp\n")
    );
    let cfg = write_config(dir.path(), "restart", &yaml);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let total = 6000;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .unwrap();
    let mut written = 0;
    let write_some = |n: usize, f: &mut std::fs::File, written: &mut usize| {
        let mut b = String::new();
        for _ in 0..n {
            b.push_str(&format!("seq={written}\n"));
            *written += 1;
        }
        f.write_all(b.as_bytes()).unwrap();
    };
    for _ in 0..10 {
        write_some(200, &mut f, &mut written);
        std::thread::sleep(Duration::from_millis(50));
    }
    r.stop();
    // Written while the receiver is down: held, then sent after it is back.
    for _ in 0..10 {
        write_some(100, &mut f, &mut written);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    r.restart();
    while written < total {
        write_some(200, &mut f, &mut written);
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(LONG, "every seq received", || {
        let got: BTreeSet<usize> = r
            .records()
            .iter()
            .filter_map(|f| f.get(9)?.trim().strip_prefix("seq=")?.parse().ok())
            .collect();
        if got.len() == total {
            Ok(())
        } else {
            let missing: Vec<_> = (0..total).filter(|i| !got.contains(i)).take(10).collect();
            Err(format!(
                "{} of {total}; first missing {missing:?}",
                got.len()
            ))
        }
    });
    let lines = r.records().len();
    eprintln!(
        "received {lines} lines for {total} messages: {} duplicates",
        lines - total
    );
    let broken = ["connect_failed", "connection_lost", "write_failed"]
        .iter()
        .map(|e| {
            let mut l = component("restart", "sink", "out");
            l.push(("error_type", e));
            agent.metric_or_zero("petrel_component_errors_total", &l)
        })
        .sum::<f64>();
    assert!(broken >= 1.0, "the stopped receiver was not noticed");
}

/// A listener in the test that collects lines from one connection at a
/// time, with TLS when given a server configuration.
fn collect_lines(
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    n: usize,
) -> (u16, std::thread::JoinHandle<Vec<String>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        let reader: Box<dyn std::io::Read> = match tls {
            None => Box::new(s),
            Some((cert, key)) => {
                use rustls_pki_types::pem::PemObject;
                let chain: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(&cert)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
                let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
                let conn = rustls::ServerConnection::new(std::sync::Arc::new(cfg)).unwrap();
                Box::new(rustls::StreamOwned::new(conn, s))
            }
        };
        let mut out = Vec::new();
        for line in std::io::BufReader::new(reader).lines() {
            out.push(line.unwrap());
            if out.len() == n {
                break;
            }
        }
        out
    });
    (port, h)
}

#[test]
fn the_tcp_sink_writes_template_lines_over_tcp_and_tls() {
    let dir = tempdir();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (ca, cert, key) = make_certs(&certs);
    let input = dir.path().join("in.log");
    let lines: Vec<String> = (0..500).map(|i| format!("line {i}")).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let (plain_port, plain) = collect_lines(None, lines.len());
    let (tls_port, tls) = collect_lines(Some((cert, key)), lines.len());
    let yaml = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n\
         \x20 - type: tcp\n    address: 127.0.0.1:{plain_port}\n    encoding: {{ codec: text, template: \"{{{{ host | upper }}}} {{{{ message }}}} {{{{ nope }}}}\", missing: \"-\" }}\n\
         \x20 - type: tcp\n    mode: tls\n    address: 127.0.0.1:{tls_port}\n    tls: {{ ca_file: {}, server_name: localhost }}\n    encoding: ndjson\n",
        input.display(),
        ca.display()
    );
    let cfg = write_config(dir.path(), "tcpout", &yaml);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let host = hostname().to_uppercase();
    let got = plain.join().unwrap();
    let want: Vec<String> = lines.iter().map(|l| format!("{host} {l} -")).collect();
    assert_eq!(got, want);
    let got = tls.join().unwrap();
    let msgs: Vec<String> = got
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["message"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(msgs, lines);
    let mut l = component("tcpout", "sink", "tcp_0");
    l.push(("error_type", "template_field_missing"));
    wait_for(MEDIUM, "missing fields counted", || {
        let v = agent.metric_or_zero("petrel_component_errors_total", &l);
        if v >= lines.len() as f64 {
            Ok(())
        } else {
            Err(format!("{v}; {}", agent.metrics()))
        }
    });
}

/// The file sink with the traditional syslog template
/// (examples/pipelines/syslog-to-messages.yaml) writes, for the same RFC
/// 3164 messages, what rsyslog writes with RSYSLOG_TraditionalFileFormat.
#[test]
fn file_sink_template_matches_rsyslog_traditional_file_format() {
    let dir = tempdir();
    let sent = messages(12);
    // rsyslog's own /var/log/messages format, fed the same frames.
    let mut r = Receiver::start(Kind::Rsyslog, Listen::Tcp { octet: true }, None);
    let conf = r.out.with_file_name("rsyslog.conf");
    let trad = r.out.with_file_name("traditional.log");
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        "ruleset(name=\"r\") {",
        &format!(
            "ruleset(name=\"r\") {{ action(type=\"omfile\" file=\"{}\" template=\"RSYSLOG_TraditionalFileFormat\")",
            trad.display()
        ),
    );
    std::fs::write(&conf, text).unwrap();
    r.stop();
    r.restart();
    // RFC 3164, as local programs write it (rsyslog's traditional format
    // keeps the tag as received).
    let bsd: String = sent.iter().map(Sent::frame3164).collect();
    connect(r.port).write_all(bsd.as_bytes()).unwrap();
    // Petrel: the syslog source into a file sink with the example's template.
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/pipelines/syslog-to-messages.yaml");
    let in_port = free_port();
    let out = dir.path().join("messages");
    // Without the example's second sink (a central server over TLS).
    let text =
        std::fs::read_to_string(&example).expect("examples/pipelines/syslog-to-messages.yaml");
    let (file_part, central) = text
        .split_once("  - type: syslog\n    id: central")
        .expect("the example's central sink");
    assert!(central.contains("mode: tls"));
    let yaml = file_part
        .replace("0.0.0.0:514", &format!("127.0.0.1:{in_port}"))
        .replace("/var/log/messages", &out.display().to_string())
        .replace("timezone: local", "timezone: UTC");
    let cfg = write_config(dir.path(), "messages", &yaml);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    connect(in_port).write_all(bsd.as_bytes()).unwrap();
    wait_lines(&trad, sent.len());
    wait_lines(&out, sent.len());
    let theirs = std::fs::read_to_string(&trad).unwrap();
    let ours = std::fs::read_to_string(&out).unwrap();
    assert_eq!(ours, theirs, "petrel (left) and rsyslog (right) differ");
}
