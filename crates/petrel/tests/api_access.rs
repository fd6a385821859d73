//! Who may use the API's control and data endpoints (`POST /reload`,
//! `GET /tap`), with raw HTTP requests against the real binary: on
//! loopback, requests naming a foreign `Host` (DNS rebinding) or sent by a
//! cross-site page (`Origin`) are refused; with `PETREL_API_TOKEN` set,
//! both need it as a bearer token; `/metrics` and `/health` stay open.
//! The rules for an API off loopback are tested in `api.rs` (test services
//! listen on 127.0.0.1 only).

mod common;
mod pki;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const SECRET: &str = "secret-password=hunter2";

fn config(dir: &Path, log: &Path, out: &Path) -> PathBuf {
    write_config(
        dir,
        "web",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: file\n    path: {}\n",
            log.display(),
            out.display()
        ),
    )
}

/// Starts an agent that read one line of `app.log`, with `env` and
/// without watching its configuration (only the API reloads it).
fn agent(dir: &Path, env: &[(&str, &str)]) -> (Agent, PathBuf, PathBuf) {
    let (log, out) = (dir.join("app.log"), dir.join("out.log"));
    append(&log, b"first\n");
    let cfg = config(dir, &log, &out);
    let agent = Agent::start_with(
        &cfg,
        &dir.join("data"),
        AgentOptions {
            args: vec!["--no-watch-config".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
    );
    wait_lines(&out, 1);
    (agent, log, cfg)
}

/// Sends `head` (request line and headers, without the blank line),
/// calls `then` (say, to write a log line a tap would stream), and reads
/// the answer until the agent closes the connection or 10 s pass (a tap
/// that was wrongly served streams without end): (status, body).
fn raw(port: u16, head: &str, then: impl FnOnce()) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{head}\r\nContent-Length: 0\r\n\r\n").unwrap();
    then();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

fn reloads(agent: &Agent) -> f64 {
    ["applied", "unchanged", "failed"]
        .iter()
        .map(|r| agent.metric_or_zero("petrel_config_reload_total", &[("result", r)]))
        .sum()
}

#[test]
fn on_loopback_a_foreign_host_gets_neither_logs_nor_a_reload() {
    let dir = tempdir();
    let (agent, log, _) = agent(dir.path(), &[]);
    let port = agent.port;
    // A page of attacker.example whose name now resolves to 127.0.0.1
    // (DNS rebinding): its requests name its own host.
    for host in [
        format!("attacker.example:{port}"),
        "attacker.example".to_string(),
        "127.0.0.1.attacker.example".to_string(),
        "localhost.attacker.example".to_string(),
        format!("10.1.2.3:{port}"),
    ] {
        let (st, body) = raw(
            port,
            &format!("GET /tap?pipeline=web&limit=1 HTTP/1.1\r\nHost: {host}\r\nConnection: close"),
            || append(&log, format!("{SECRET}\n").as_bytes()),
        );
        assert_eq!(st, 403, "{host}: {body}");
        assert!(!body.contains("hunter2"), "{host}: {body}");
        assert!(body.contains("Host"), "says why: {body}");
        let (st, body) = raw(
            port,
            &format!("POST /reload HTTP/1.1\r\nHost: {host}\r\nConnection: close"),
            || {},
        );
        assert_eq!(st, 403, "{host}: {body}");
        // Monitoring stays open to any Host.
        let (st, body) = raw(
            port,
            &format!("GET /metrics HTTP/1.0\r\nHost: {host}"),
            || {},
        );
        assert_eq!(st, 200, "{host}: {body}");
        // So do the health checks: kubelet names the pod's IP as Host.
        for path in ["/health", "/health/live", "/health/ready"] {
            let (st, body) = raw(port, &format!("GET {path} HTTP/1.0\r\nHost: {host}"), || {});
            assert_eq!(st, 200, "{path} {host}: {body}");
        }
    }
    assert_eq!(reloads(&agent), 0.0, "no refused reload reached the agent");
    // Loopback names and addresses, with or without a port, and no Host
    // at all (HTTP/1.0).
    let allowed = [
        Some("localhost".to_string()),
        Some(format!("LocalHost:{port}")),
        Some(format!("127.0.0.1:{port}")),
        Some("127.9.8.7".to_string()),
        Some(format!("[::1]:{port}")),
        Some("[::1]".to_string()),
        None,
    ];
    for host in &allowed {
        let head = match host {
            Some(h) => format!("POST /reload HTTP/1.0\r\nHost: {h}"),
            None => "POST /reload HTTP/1.0".to_string(),
        };
        let (st, body) = raw(port, &head, || {});
        assert_eq!(st, 200, "{host:?}: {body}");
    }
    assert_eq!(reloads(&agent), allowed.len() as f64);
    let (st, body) = raw(
        port,
        &format!("GET /tap?pipeline=web&limit=1 HTTP/1.0\r\nHost: localhost:{port}"),
        || append(&log, format!("{SECRET}\n").as_bytes()),
    );
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("hunter2"), "the local tap works: {body}");
}

#[test]
fn on_loopback_cross_site_pages_are_refused() {
    let dir = tempdir();
    let (agent, log, _) = agent(dir.path(), &[]);
    let port = agent.port;
    let host = format!("Host: 127.0.0.1:{port}");
    for origin in [
        "https://attacker.example",
        "http://attacker.example:80",
        "null",
        "http://localhost.attacker.example",
        "file://",
    ] {
        let (st, body) = raw(
            port,
            &format!("POST /reload HTTP/1.1\r\n{host}\r\nOrigin: {origin}\r\nConnection: close"),
            || {},
        );
        assert_eq!(st, 403, "{origin}: {body}");
        assert!(body.contains("Origin"), "says why: {body}");
        let (st, body) = raw(
            port,
            &format!("GET /tap?pipeline=web&limit=1 HTTP/1.1\r\n{host}\r\nOrigin: {origin}\r\nConnection: close"),
            || append(&log, format!("{SECRET}\n").as_bytes()),
        );
        assert_eq!(st, 403, "{origin}: {body}");
        assert!(!body.contains("hunter2"), "{origin}: {body}");
    }
    assert_eq!(reloads(&agent), 0.0, "no refused reload reached the agent");
    // A page served from the machine itself is not cross-site.
    for origin in [
        "http://localhost:3000",
        "http://127.0.0.1",
        "https://[::1]:8443",
    ] {
        let (st, body) = raw(
            port,
            &format!("POST /reload HTTP/1.0\r\n{host}\r\nOrigin: {origin}"),
            || {},
        );
        assert_eq!(st, 200, "{origin}: {body}");
    }
}

fn petrel_tap(port: u16, token: Option<&str>) -> std::process::Child {
    let mut cmd = Command::new(bin());
    cmd.arg("tap")
        .args(["--api-addr", &format!("localhost:{port}")])
        .args(["web", "--limit", "1", "--format", "text"])
        .env_remove("PETREL_API_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("PETREL_API_TOKEN", t);
    }
    cmd.spawn().expect("run petrel tap")
}

#[test]
fn with_a_token_reload_and_tap_need_it_and_errors_go_only_to_its_holders() {
    let dir = tempdir();
    let (agent, log, cfg) = agent(dir.path(), &[("PETREL_API_TOKEN", "s3cret")]);
    let port = agent.port;
    let host = format!("Host: 127.0.0.1:{port}");
    let dir_name = dir.path().to_string_lossy().into_owned();
    // An invalid configuration: its errors name the file.
    std::fs::write(&cfg, "sources:\n  - type: nope\n").unwrap();
    for auth in [
        "",
        "\r\nAuthorization: Bearer wrong",
        "\r\nAuthorization: s3cret",
    ] {
        let (st, body) = raw(
            port,
            &format!("POST /reload HTTP/1.0\r\n{host}{auth}"),
            || {},
        );
        assert_eq!(st, 401, "{auth:?}: {body}");
        assert!(
            !body.contains(&dir_name),
            "no paths without the token: {body}"
        );
        assert!(body.contains("PETREL_API_TOKEN"), "says why: {body}");
        let (st, body) = raw(
            port,
            &format!("GET /tap?pipeline=web&limit=1 HTTP/1.0\r\n{host}{auth}"),
            || append(&log, format!("{SECRET}\n").as_bytes()),
        );
        assert_eq!(st, 401, "{auth:?}: {body}");
        assert!(!body.contains("hunter2"), "{auth:?}: {body}");
    }
    assert_eq!(reloads(&agent), 0.0, "no refused reload reached the agent");
    let (st, body) = raw(
        port,
        &format!("POST /reload HTTP/1.0\r\n{host}\r\nAuthorization: Bearer s3cret"),
        || {},
    );
    assert_eq!(st, 422, "{body}");
    assert!(
        body.contains("web.yaml"),
        "its holder gets the errors: {body}"
    );
    assert_eq!(reloads(&agent), 1.0);
    // `petrel tap` sends the token from the same variable.
    let mut without = petrel_tap(port, None);
    let status = wait_child(&mut without, "petrel tap without the token");
    let o = without.wait_with_output().unwrap();
    assert!(!status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("401") && err.contains("PETREL_API_TOKEN"),
        "{err}"
    );
    let mut with = petrel_tap(port, Some("s3cret"));
    wait_metric(&agent, "petrel_tap_open", &[], 1.0, true);
    append(&log, format!("{SECRET}\n").as_bytes());
    let status = wait_child(&mut with, "petrel tap with the token");
    let o = with.wait_with_output().unwrap();
    assert!(status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), SECRET);
    // Monitoring needs no token.
    assert_eq!(
        raw(port, &format!("GET /metrics HTTP/1.0\r\n{host}"), || {}).0,
        200
    );
    for path in ["/health", "/health/live", "/health/ready"] {
        let (st, body) = raw(port, &format!("GET {path} HTTP/1.0\r\n{host}"), || {});
        assert_eq!(st, 200, "{path}: {body}");
    }
}

/// `curl` against the TLS API: (HTTP status, body), or the status 0 and
/// curl's complaint when no HTTP answer came (a refused handshake).
fn curl(
    port: u16,
    path: &str,
    ca: &Path,
    client: Option<&pki::Cert>,
    token: Option<&str>,
) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        "20",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(ca);
    if let Some(cl) = client {
        c.arg("--cert").arg(&cl.cert).arg("--key").arg(&cl.key);
    }
    if let Some(t) = token {
        c.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = c
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl is needed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code: u16 = code.trim().parse().unwrap_or(0);
    if code == 0 {
        return (0, String::from_utf8_lossy(&out.stderr).into_owned());
    }
    (code, body.to_string())
}

#[test]
fn over_tls_with_client_certificates_metrics_need_the_token_and_probes_stay_open() {
    let dir = tempdir();
    let ca = pki::Ca::new(&dir.path().join("pki"), "api-ca");
    let server = ca.issue("api", "127.0.0.1", 0x11, true);
    let client = ca.issue("operator", "operator", 0x12, false);
    let stranger =
        pki::Ca::new(&dir.path().join("pki/other"), "other-ca").issue("x", "x", 0x13, false);
    let (log, out) = (dir.path().join("app.log"), dir.path().join("out.log"));
    append(&log, b"first\n");
    let cfg = config(dir.path(), &log, &out);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t0ken-from-a-file\n").expect("token file");
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec![
                "--api-tls-cert".into(),
                server.cert.display().to_string(),
                "--api-tls-key".into(),
                server.key.display().to_string(),
                "--api-tls-client-ca".into(),
                ca.pem().display().to_string(),
                "--api-auth".into(),
                "metrics".into(),
                "--api-token-file".into(),
                token_file.display().to_string(),
            ],
            ..Default::default()
        },
    );
    wait_lines(&out, 1);
    assert!(
        agent.stderr().contains("API listening on https://"),
        "{}",
        agent.stderr()
    );
    let port = agent.port;
    let token = Some("t0ken-from-a-file");
    // With a client certificate and the token: the metrics, with the API's
    // own certificate's expiry.
    let (st, body) = curl(port, "/metrics", &ca.pem(), Some(&client), token);
    assert_eq!(st, 200, "{body}");
    assert!(
        body.contains("petrel_tls_certificate_expiry_seconds{component=\"api\"}"),
        "{body}"
    );
    // Without the token: 401 for /metrics and /health.
    for path in ["/metrics", "/health"] {
        let (st, body) = curl(port, path, &ca.pem(), Some(&client), None);
        assert_eq!(st, 401, "{path}: {body}");
        let (st, body) = curl(port, path, &ca.pem(), Some(&client), Some("wrong"));
        assert_eq!(st, 401, "{path}: {body}");
    }
    // The probes stay open for the kubelet.
    for path in ["/health/live", "/health/ready"] {
        let (st, body) = curl(port, path, &ca.pem(), Some(&client), None);
        assert_eq!(st, 200, "{path}: {body}");
    }
    // No client certificate, or one of another authority: no answer.
    let (st, why) = curl(port, "/health/live", &ca.pem(), None, token);
    assert_eq!(st, 0, "refused without a client certificate: {why}");
    let (st, why) = curl(port, "/health/live", &ca.pem(), Some(&stranger), token);
    assert_eq!(st, 0, "refused with a stranger's certificate: {why}");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let _ = s.write_all(b"GET /health/live HTTP/1.0\r\n\r\n");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    assert!(
        !String::from_utf8_lossy(&raw).starts_with("HTTP/1."),
        "plain HTTP answered"
    );
    // `petrel tap` speaks TLS with the client certificate and the token.
    let mut tap = Command::new(bin())
        .args([
            "tap",
            "web",
            "--limit",
            "1",
            "--format",
            "text",
            "--api-addr",
        ])
        .arg(format!("https://127.0.0.1:{port}"))
        .arg("--api-ca-file")
        .arg(ca.pem())
        .arg("--api-cert-file")
        .arg(&client.cert)
        .arg("--api-key-file")
        .arg(&client.key)
        .env("PETREL_API_TOKEN", "t0ken-from-a-file")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("petrel tap");
    // The tap is open once it answered; lines written until one shows.
    wait_for(LONG, "a tapped event over TLS", || {
        append(&log, b"tapped over tls\n");
        match tap.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => Err("tap still waiting".to_string()),
        }
    });
    let mut text = String::new();
    tap.stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut text)
        .expect("read");
    let mut err = String::new();
    tap.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert_eq!(text.trim(), "tapped over tls", "tap output; stderr: {err}");
}
