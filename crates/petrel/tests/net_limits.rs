//! Receiving sources at their limits, over real sockets: connection caps
//! and silent clients, slow-loris HTTP clients, a full buffer answered with
//! 503 and `Retry-After` (then recovery with every accepted line once), and
//! mutual TLS with certificates made by the `openssl` command.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn wait_errors(agent: &Agent, pipeline: &str, id: &str, error_type: &str, want: f64) {
    wait_metric(
        agent,
        "petrel_component_errors_total",
        &source_error(pipeline, id, error_type),
        want,
        false,
    );
}

/// True once the peer has closed `s` (read returns 0 or fails), waiting up
/// to `LONG`.
fn wait_closed(s: &mut std::net::TcpStream, what: &str) -> Vec<u8> {
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("{what}: not closed by the server: {e}"),
        }
    }
}

#[test]
fn excess_and_silent_connections_are_closed_and_counted_and_a_partial_frame_kept() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = syslog_to_ndjson(
        dir.path(),
        "lim",
        port,
        "    max_connections: 2\n    idle_timeout_secs: 2\n",
        &out,
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut a = connect(port);
    let mut b = connect(port);
    // A frame without its newline, then silence.
    a.write_all(b"<13>1 - h app - - - partial").unwrap();
    wait_metric(
        &agent,
        "petrel_source_connections",
        &component("lim", "source", "syslog_0"),
        2.0,
        false,
    );
    // The third is closed at once and counted.
    let mut c = connect(port);
    let _ = c.write_all(b"<13>1 - h app - - - refused\n");
    wait_closed(&mut c, "the connection over max_connections");
    wait_errors(&agent, "lim", "syslog_0", "connection_refused", 1.0);
    // Both silent ones are closed after idle_timeout_secs.
    wait_closed(&mut a, "a silent connection");
    wait_closed(&mut b, "a silent connection");
    wait_errors(&agent, "lim", "syslog_0", "idle_timeout", 2.0);
    // The partial frame is delivered, not lost; a new client gets in.
    let mut d = connect(port);
    d.write_all(b"<13>1 - h app - - - after\n").unwrap();
    wait_lines(&out, 2);
    let msgs: Vec<String> = json_lines(&out)
        .iter()
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(msgs, ["partial", "after"]);
}

#[test]
fn slow_loris_http_clients_are_cut_off_while_others_are_served() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        "loris",
        &format!(
            "sources:\n  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n    idle_timeout_secs: 3\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    // Headers that never end.
    let mut headers = connect(port);
    headers
        .write_all(b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-")
        .unwrap();
    // A body that never completes, trickled a byte at a time.
    let mut body = connect(port);
    body.write_all(b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\nnever complete\n")
        .unwrap();
    let trickle = std::thread::spawn(move || {
        for _ in 0..(LONG.as_secs() * 2) {
            if body.write_all(b"x").is_err() {
                return body;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        body
    });
    // Meanwhile an ordinary client is served.
    let (code, _) = post(
        port,
        "/ingest",
        &[("Content-Type", "text/plain")],
        b"served\n",
    );
    assert_eq!(code, 200);
    let got = wait_closed(&mut headers, "unfinished headers");
    assert!(
        got.is_empty() || String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let mut body = trickle.join().unwrap();
    wait_closed(&mut body, "an unfinished body");
    wait_lines(&out, 1);
    std::thread::sleep(Duration::from_millis(500));
    let ev = json_lines(&out);
    assert_eq!(ev.len(), 1, "only the complete request: {ev:?}");
    assert_eq!(ev[0]["message"], "served");
}

#[test]
fn a_full_disk_buffer_answers_503_with_retry_after_and_recovers_without_loss() {
    let dir = tempdir();
    let port = free_port();
    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let cfg = write_config(
        dir.path(),
        "full",
        &format!(
            "sources:\n  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n    max_body_bytes: 256KiB\n    buffer: {{ type: disk, max_bytes: 1MiB, when_full: block }}\nsinks:\n  - type: http\n    url: http://{addr}/ingest\n    timeout_ms: 600000\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n"
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    // 100 KiB bodies of numbered lines until the spool is full.
    let mut accepted: Vec<String> = Vec::new();
    let mut full = None;
    for req in 0..40 {
        let lines: Vec<String> = (0..1000)
            .map(|i| format!("r{req:02}-l{i:04}-{}", "p".repeat(80)))
            .collect();
        let text = post_raw(
            port,
            "/ingest",
            &[("Content-Type", "text/plain")],
            (lines.join("\n") + "\n").as_bytes(),
        );
        if text.starts_with("HTTP/1.1 200") {
            accepted.extend(lines);
        } else {
            full = Some(text);
            break;
        }
    }
    let full = full.expect("the 1 MiB spool filled up within 4 MB of posts");
    assert!(full.starts_with("HTTP/1.1 503"), "{full}");
    assert!(
        full.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{full}"
    );
    wait_for(LONG, "the sink stalled on its first request", || {
        if server.held.load(Ordering::SeqCst) > 0 {
            Ok(())
        } else {
            Err("nothing sent yet".to_string())
        }
    });
    assert!(server.bodies.lock().unwrap().is_empty());
    wait_errors(&agent, "full", "http_0", "buffer_full", 1.0);

    // The sink recovers: the spool drains and posts are accepted again.
    server.released.store(true, Ordering::SeqCst);
    let last: Vec<String> = (0..10).map(|i| format!("late-{i}")).collect();
    wait_for(LONG, "a post accepted after recovery", || {
        let (code, body) = post(
            port,
            "/ingest",
            &[("Content-Type", "text/plain")],
            (last.join("\n") + "\n").as_bytes(),
        );
        if code == 200 {
            Ok(())
        } else {
            Err(format!("{code} {body}"))
        }
    });
    accepted.extend(last);
    let count = || -> HashMap<String, usize> {
        let mut seen = HashMap::new();
        for b in server.bodies.lock().unwrap().iter() {
            for l in b.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson");
                *seen
                    .entry(v["message"].as_str().unwrap_or_default().to_string())
                    .or_default() += 1;
            }
        }
        seen
    };
    wait_for(LONG, "every accepted line delivered", || {
        let n: usize = count().values().sum();
        if n >= accepted.len() {
            Ok(())
        } else {
            Err(format!("{n} of {}", accepted.len()))
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let seen = count();
    for l in &accepted {
        assert_eq!(seen.get(l), Some(&1), "{l} delivered once");
    }
    assert_eq!(seen.len(), accepted.len(), "nothing but accepted lines");
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is needed");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A certificate for `cn` signed by `ca` (an X.509 v3 end-entity
/// certificate, as rustls requires), as `<name>.pem` / `<name>.key`.
fn signed_cert(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

fn self_signed_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// Sends `line` with `openssl s_client` (optionally with a client
/// certificate) and closes.
fn s_client(dir: &Path, port: u16, ca: &str, cert: Option<&str>, line: &str) {
    let mut cmd = Command::new("openssl");
    cmd.current_dir(dir)
        .args([
            "s_client",
            "-quiet",
            "-no_ign_eof",
            "-verify_return_error",
            "-CAfile",
        ])
        .arg(format!("{ca}.pem"))
        .args(["-servername", "localhost", "-connect"])
        .arg(format!("127.0.0.1:{port}"));
    if let Some(c) = cert {
        cmd.args(["-cert", &format!("{c}.pem"), "-key", &format!("{c}.key")]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(line.as_bytes());
    // Closing stdin ends s_client after it sent the line (or failed).
    std::thread::sleep(Duration::from_millis(300));
    drop(stdin);
    wait_child(&mut child, "openssl s_client");
}

#[test]
fn mutual_tls_accepts_only_clients_with_a_certificate_from_the_ca() {
    let dir = tempdir();
    let d = dir.path();
    self_signed_ca(d, "ca");
    self_signed_ca(d, "rogue");
    signed_cert(
        d,
        "ca",
        "server",
        "localhost",
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
    signed_cert(d, "ca", "client", "app-1", client_ext);
    signed_cert(d, "rogue", "intruder", "app-2", client_ext);
    let out = d.join("out.ndjson");
    let port = free_port();
    let cfg = syslog_to_ndjson(
        d,
        "mtls",
        port,
        &format!(
            "    tls: {{ cert_file: {0}/server.pem, key_file: {0}/server.key, ca_file: {0}/ca.pem }}\n",
            d.display()
        ),
        &out,
    );
    let agent = Agent::start(&cfg, &d.join("data"));
    drop(connect(port));
    wait_errors(&agent, "mtls", "syslog_0", "tls_handshake_failed", 1.0);
    s_client(d, port, "ca", None, "<13>1 - h app - - - no certificate\n");
    wait_errors(&agent, "mtls", "syslog_0", "tls_handshake_failed", 2.0);
    s_client(
        d,
        port,
        "ca",
        Some("intruder"),
        "<13>1 - h app - - - wrong CA\n",
    );
    wait_errors(&agent, "mtls", "syslog_0", "tls_handshake_failed", 3.0);
    s_client(
        d,
        port,
        "ca",
        Some("client"),
        "<13>1 - h app - - - trusted\n",
    );
    wait_lines(&out, 1);
    std::thread::sleep(Duration::from_millis(300));
    let ev = json_lines(&out);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["message"], "trusted");
}
