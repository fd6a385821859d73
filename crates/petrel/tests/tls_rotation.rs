//! Certificates replaced on disk while data flows, the way a Kubernetes
//! Secret mount replaces them (a new directory, then the `..data` symlink
//! swapped atomically): new connections get the new certificate,
//! established ones go on, nothing is lost, and a broken replacement is
//! refused loudly while the previous certificate stays in use.

mod common;
mod pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pki::{Ca, Cert};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Events sent through each test.
const EVENTS: usize = 100_000;

/// A directory laid out as a Kubernetes Secret volume: `tls.crt` and
/// `tls.key` are symlinks into `..data`, itself a symlink to a
/// timestamped directory.
struct SecretMount {
    dir: PathBuf,
    generation: usize,
}

impl SecretMount {
    fn new(dir: &Path, c: &Cert) -> SecretMount {
        std::fs::create_dir_all(dir).expect("mount dir");
        let mut m = SecretMount {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        m.publish(c);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).expect("symlink");
        }
        m
    }

    /// Publishes `c` as the kubelet does: a new directory, then `..data`
    /// replaced by a rename of a new symlink (atomic).
    fn publish(&mut self, c: &Cert) {
        self.generation += 1;
        let gen = format!("..2026_{:02}", self.generation);
        let d = self.dir.join(&gen);
        std::fs::create_dir(&d).expect("generation dir");
        std::fs::copy(&c.cert, d.join("tls.crt")).expect("copy cert");
        std::fs::copy(&c.key, d.join("tls.key")).expect("copy key");
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&gen, &tmp).expect("data symlink");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
}

/// A certificate whose key is another's: a pair that cannot be used.
fn broken(a: &Cert, b: &Cert, dir: &Path) -> Cert {
    std::fs::create_dir_all(dir).expect("dir");
    let c = Cert {
        cert: dir.join("broken.pem"),
        key: dir.join("broken.key"),
        serial: b.serial.clone(),
    };
    std::fs::copy(&b.cert, &c.cert).expect("copy");
    std::fs::copy(&a.key, &c.key).expect("copy");
    c
}

fn roots(ca: &Ca) -> Arc<rustls::RootCertStore> {
    let mut r = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca.pem())
        .expect("ca")
        .flatten()
    {
        r.add(c).expect("root");
    }
    Arc::new(r)
}

/// A TLS client connection to 127.0.0.1:`port` trusting `ca`; also the
/// serial of the certificate the server presented.
fn tls_connect(
    port: u16,
    ca: &Ca,
) -> (
    rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    String,
) {
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots(ca))
    .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client");
    let mut sock = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).expect("handshake");
    }
    let serial = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| petrel::tls::serial_and_expiry(c))
        .map(|(s, _)| s.trim_start_matches('0').to_string())
        .expect("a server certificate");
    (rustls::StreamOwned::new(conn, sock), serial)
}

#[test]
fn the_syslog_tls_source_serves_a_swapped_certificate_to_new_connections_and_keeps_a_broken_one_out(
) {
    let work = tempdir();
    let ca = Ca::new(&work.path().join("pki"), "ca");
    let a = ca.issue_days("a", "127.0.0.1", 0xa1, true, 300);
    let b = ca.issue_days("b", "127.0.0.1", 0xb2, true, 200);
    let bad = broken(&a, &b, &work.path().join("pki/broken"));
    let mut mount = SecretMount::new(&work.path().join("secret"), &a);
    let out = work.path().join("out.ndjson");
    let port = free_port();
    let cfg = syslog_to_ndjson(
        work.path(),
        "rot",
        port,
        &format!(
            "    tls: {{ cert_file: {}, key_file: {} }}\n",
            mount.cert().display(),
            mount.key().display()
        ),
        &out,
    );
    let agent = Agent::start(&cfg, &work.path().join("data"));
    let labels = [("component", "rot/source/syslog_0")];
    // The API answers before the pipelines have started.
    let expiry_a = wait_for(MEDIUM, "the expiry gauge", || {
        agent
            .metric("petrel_tls_certificate_expiry_seconds", &labels)
            .ok_or_else(|| agent.metrics())
    });
    // One connection stays open across both swaps.
    let (mut long, first) = tls_connect(port, &ca);
    assert_eq!(first, a.serial);
    let sent = AtomicUsize::new(0);
    let send_batch = |s: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
                      n: usize| {
        let mut buf = Vec::with_capacity(n * 64);
        for _ in 0..n {
            let i = sent.fetch_add(1, Ordering::SeqCst);
            buf.extend_from_slice(format!("<13>1 - h app - - - event-{i:07}\n").as_bytes());
        }
        s.write_all(&buf).expect("send");
        s.flush().expect("flush");
    };
    let mut serials = Vec::new();
    // A quarter through new connections with the first certificate.
    for _ in 0..5 {
        let (mut s, serial) = tls_connect(port, &ca);
        serials.push(serial);
        send_batch(&mut s, EVENTS / 20);
        s.conn.send_close_notify();
        let _ = s.flush();
    }
    send_batch(&mut long, EVENTS / 20);
    mount.publish(&b);
    // New connections see the new serial within a few watch intervals.
    wait_for(MEDIUM, "a new connection with the new certificate", || {
        let (mut s, serial) = tls_connect(port, &ca);
        send_batch(&mut s, 100);
        s.conn.send_close_notify();
        let _ = s.flush();
        if serial == b.serial {
            Ok(())
        } else {
            Err(format!("serial {serial}"))
        }
    });
    wait_for(MEDIUM, "the expiry gauge of the new certificate", || {
        let v = agent.metric("petrel_tls_certificate_expiry_seconds", &labels);
        match v {
            Some(v) if v < expiry_a - 50.0 * 86400.0 => Ok(()),
            other => Err(format!("{other:?}, was {expiry_a}")),
        }
    });
    // The connection opened before the swap goes on.
    send_batch(&mut long, EVENTS / 20);
    // A broken pair: refused, loudly; the new certificate stays.
    mount.publish(&bad);
    wait_for(MEDIUM, "the refusal of the broken pair", || {
        let log = agent.stderr();
        if log.contains("cannot be used") && log.contains("still using the previous one") {
            Ok(())
        } else {
            Err(log)
        }
    });
    while sent.load(Ordering::SeqCst) < EVENTS - EVENTS / 20 {
        let (mut s, serial) = tls_connect(port, &ca);
        assert_eq!(
            serial, b.serial,
            "after the broken swap, the good new certificate"
        );
        let n = (EVENTS / 20).min(EVENTS - EVENTS / 20 - sent.load(Ordering::SeqCst));
        send_batch(&mut s, n.max(1));
        s.conn.send_close_notify();
        let _ = s.flush();
    }
    let rest = EVENTS - sent.load(Ordering::SeqCst);
    send_batch(&mut long, rest);
    let total = sent.load(Ordering::SeqCst);
    assert!(serials.iter().all(|s| *s == a.serial), "{serials:?}");
    wait_for(LONG, "every event in the file", || {
        let n = count_lines(&out);
        if n >= total {
            Ok(())
        } else {
            Err(format!("{n} of {total}"))
        }
    });
    let h = histogram(
        json_lines(&out)
            .into_iter()
            .filter_map(|v| v["message"].as_str().map(|m| m.as_bytes().to_vec())),
    );
    let missing = (0..total)
        .filter(|i| !h.contains_key(format!("event-{i:07}").as_bytes()))
        .count();
    assert_eq!(missing, 0, "events lost across the swaps");
    drop(long);
}

/// What the HTTPS receiver saw: events per client certificate serial, and
/// the serial of each connection in order.
#[derive(Default)]
struct Seen {
    lines: Vec<String>,
    serials: Vec<String>,
}

/// A small HTTPS server requiring client certificates of `ca`: each
/// request's body lines are recorded with the serial of the connection's
/// client certificate; each connection serves one request (so the sink
/// opens new ones all the time). Serves on a thread until `stop`.
fn https_receiver(ca: &Ca, server: &Cert, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca), provider.clone())
            .build()
            .expect("verifier");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&server.cert)
        .expect("cert")
        .flatten()
        .collect();
    let key = PrivateKeyDer::from_pem_file(&server.key).expect("key");
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config"),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let sock = match listener.accept() {
                Ok((s, _)) => s,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            let (cfg, seen) = (cfg.clone(), seen.clone());
            std::thread::spawn(move || {
                let _ = sock.set_nonblocking(false);
                let _ = sock.set_read_timeout(Some(Duration::from_secs(30)));
                let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut s = rustls::StreamOwned::new(conn, sock);
                let mut r = BufReader::new(&mut s);
                let mut len = 0usize;
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line.trim().is_empty() => break,
                        Ok(_) => {
                            if let Some((k, v)) = line.split_once(':') {
                                if k.trim().eq_ignore_ascii_case("content-length") {
                                    len = v.trim().parse().unwrap_or(0);
                                }
                            }
                        }
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                drop(r);
                let serial = s
                    .conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| petrel::tls::serial_and_expiry(c))
                    .map(|(s, _)| s.trim_start_matches('0').to_string())
                    .unwrap_or_default();
                {
                    let mut g = seen.lock().expect("seen");
                    g.serials.push(serial);
                    for l in String::from_utf8_lossy(&body).lines() {
                        g.lines.push(l.to_string());
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                let _ = s.flush();
                s.conn.send_close_notify();
                let _ = s.flush();
            });
        }
    });
    port
}

#[test]
fn the_http_sink_presents_a_swapped_client_certificate_on_new_connections_and_keeps_a_broken_one_out(
) {
    let work = tempdir();
    let ca = Ca::new(&work.path().join("pki"), "ca");
    let server = ca.issue("server", "127.0.0.1", 0x5e, true);
    let a = ca.issue_days("a", "petrel-client", 0xc1, false, 300);
    let b = ca.issue_days("b", "petrel-client", 0xc2, false, 200);
    let bad = broken(&a, &b, &work.path().join("pki/broken"));
    let mut mount = SecretMount::new(&work.path().join("secret"), &a);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let port = https_receiver(&ca, &server, seen.clone(), stop.clone());
    let input = work.path().join("in.log");
    let cfg = write_config(
        work.path(),
        "rot",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: http\n    id: out\n    url: https://127.0.0.1:{port}/ingest\n    encoding: ndjson\n    batch: {{max_events: 2000, timeout_ms: 20}}\n    tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}\n",
            input.display(),
            ca.pem().display(),
            mount.cert().display(),
            mount.key().display()
        ),
    );
    let agent = Agent::start(&cfg, &work.path().join("data"));
    let write = |from: usize, to: usize| {
        let mut t = String::new();
        for i in from..to {
            t.push_str(&format!("event-{i:07}\n"));
        }
        append(&input, t.as_bytes());
    };
    let received = |n: usize| {
        wait_for(LONG, &format!("{n} events at the receiver"), || {
            let got = seen.lock().expect("seen").lines.len();
            if got >= n {
                Ok(())
            } else {
                Err(format!("{got}"))
            }
        })
    };
    write(0, EVENTS / 4);
    received(EVENTS / 4);
    mount.publish(&b);
    // Events keep coming; the sink's new connections present the new
    // certificate.
    let mut next = EVENTS / 4;
    wait_for(
        MEDIUM,
        "a connection with the new client certificate",
        || {
            write(next, next + 500);
            next += 500;
            let g = seen.lock().expect("seen");
            if g.serials.contains(&b.serial) {
                Ok(())
            } else {
                Err(format!(
                    "{} connections, {} events, the last serials {:?}; agent log:\n{}",
                    g.serials.len(),
                    g.lines.len(),
                    &g.serials[g.serials.len().saturating_sub(5)..],
                    agent.stderr()
                ))
            }
        },
    );
    mount.publish(&bad);
    wait_for(MEDIUM, "the refusal of the broken pair", || {
        let log = agent.stderr();
        if log.contains("cannot be used") && log.contains("still using the previous one") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let after_broken = seen.lock().expect("seen").serials.len();
    write(next, EVENTS);
    received(EVENTS);
    stop.store(true, Ordering::SeqCst);
    let g = seen.lock().expect("seen");
    assert!(
        g.serials[after_broken..].iter().all(|s| *s == b.serial),
        "after the broken swap, the good new certificate: {:?}",
        &g.serials[after_broken..]
    );
    let h = histogram(g.lines.iter().filter_map(|l| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v["message"].as_str().map(|m| m.as_bytes().to_vec()))
    }));
    let missing = (0..EVENTS)
        .filter(|i| !h.contains_key(format!("event-{i:07}").as_bytes()))
        .count();
    assert_eq!(missing, 0, "events lost across the swaps");
    let sent = agent.metric_or_zero(
        "petrel_component_sent_events_total",
        &component("rot", "sink", "out"),
    );
    assert!(sent >= EVENTS as f64, "{sent}");
}

/// One HTTPS request to the agent's API with the client configuration
/// `cfg` (shared between calls, so its sessions are resumed): the serial
/// of the certificate the server presented, and whether the session was
/// resumed.
fn api_get(port: u16, cfg: &Arc<rustls::ClientConfig>) -> (String, bool) {
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let conn = rustls::ClientConnection::new(cfg.clone(), name).expect("client");
    let sock = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut s = rustls::StreamOwned::new(conn, sock);
    s.write_all(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .expect("request");
    // Read to the end: the session tickets come with the answer.
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let serial = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| petrel::tls::serial_and_expiry(c))
        .map(|(s, _)| s.trim_start_matches('0').to_string())
        .expect("a server certificate");
    let resumed = s.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    (serial, resumed)
}

#[test]
fn the_api_serves_a_swapped_certificate_even_to_a_client_that_resumes_its_sessions() {
    let work = tempdir();
    let ca = Ca::new(&work.path().join("pki"), "ca");
    let a = ca.issue_days("a", "127.0.0.1", 0xa1, true, 300);
    let b = ca.issue_days("b", "127.0.0.1", 0xb2, true, 200);
    let mut mount = SecretMount::new(&work.path().join("secret"), &a);
    let log = work.path().join("in.log");
    append(&log, b"one\n");
    let cfg = write_config(
        work.path(),
        "api",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\nsinks:\n  - type: blackhole\n",
            log.display()
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &work.path().join("data"),
        AgentOptions {
            args: vec![
                "--api-tls-cert".into(),
                mount.cert().display().to_string(),
                "--api-tls-key".into(),
                mount.key().display().to_string(),
            ],
            ..Default::default()
        },
    );
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots(&ca))
        .with_no_client_auth(),
    );
    assert_eq!(api_get(agent.port, &client), (a.serial.clone(), false));
    // The client resumes its session: the certificate is not sent again.
    assert_eq!(api_get(agent.port, &client), (a.serial.clone(), true));
    mount.publish(&b);
    // Before the sessions were forgotten at a reload, the client resumed
    // its old session for ever and never saw the new certificate.
    wait_for(
        MEDIUM,
        "the new certificate for a resuming client",
        || match api_get(agent.port, &client) {
            (s, false) if s == b.serial => Ok(()),
            other => Err(format!("{other:?}; agent log:\n{}", agent.stderr())),
        },
    );
}
