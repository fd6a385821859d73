//! The OpAMP server of the fleet management tests (opamp-go's server
//! v0.23.0 with a control API, `main.go` beside this file, built by
//! `scripts/opamp-server.sh` into `.cache/opamp-server/bin`), started
//! through the shared server helper, and a small client of its control
//! API: set the remote configuration, read every AgentToServer it
//! received, make it refuse, hang, block WebSocket or send bad input.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::server::{cached_binary, free_port, ServerProcess};

/// TLS and auth of a server.
#[derive(Default, Clone)]
pub struct Options {
    /// Serve OpAMP over TLS with this certificate and key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Require `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Record full messages (off: counted only).
    pub record: bool,
}

/// A running server; killed when dropped.
pub struct OpampServer {
    server: ServerProcess,
    opts: Options,
    /// The OpAMP port (both transports).
    pub port: u16,
    /// The control API's port.
    pub control: u16,
}

/// One AgentToServer the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `websocket` or `http`.
    pub transport: String,
    /// The message as protojson.
    pub msg: Value,
}

/// One OTLP/HTTP request the server received.
#[derive(Debug, Clone)]
pub struct OtlpRequest {
    /// `/otlp/v1/logs` or `/otlp/v1/metrics`.
    pub path: String,
    /// Its headers (canonical names).
    pub headers: Value,
    /// The protobuf body.
    pub body: Vec<u8>,
}

impl OpampServer {
    /// Starts a plain server on free ports.
    pub fn start() -> OpampServer {
        Self::start_with(Options {
            record: true,
            ..Options::default()
        })
    }

    /// Starts a server with `opts`.
    pub fn start_with(opts: Options) -> OpampServer {
        let mut s = OpampServer {
            server: ServerProcess::new("OpAMP server", "petrel-opamp-", "server.log"),
            opts,
            port: free_port(),
            control: free_port(),
        };
        s.run();
        s
    }

    fn run(&mut self) {
        let mut cmd = Command::new(cached_binary(
            "opamp-server/bin/opamp-test-server",
            "scripts/opamp-server.sh",
        ));
        cmd.arg("-addr")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("-control")
            .arg(format!("127.0.0.1:{}", self.control))
            .arg("-lifetime")
            .arg("20m")
            .arg(format!("-record={}", self.opts.record));
        if let Some((cert, key)) = &self.opts.tls {
            cmd.arg("-tls-cert").arg(cert).arg("-tls-key").arg(key);
        }
        if let Some(t) = &self.opts.token {
            cmd.arg("-token").arg(t);
        }
        let control = self.control;
        self.server.start(
            cmd,
            Duration::from_secs(30),
            Duration::from_millis(50),
            || http(control, "GET", "/control/agents", "").is_ok(),
        );
    }

    /// Kills the server at once (SIGKILL): connections drop, its state
    /// (configuration, records) is lost.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts it again on the same ports, with no state.
    pub fn restart(&mut self) {
        self.server.kill();
        self.run();
    }

    /// `ws://127.0.0.1:<port>/v1/opamp` (`wss://localhost` with TLS).
    pub fn ws_endpoint(&self) -> String {
        match self.opts.tls {
            Some(_) => format!("wss://localhost:{}/v1/opamp", self.port),
            None => format!("ws://127.0.0.1:{}/v1/opamp", self.port),
        }
    }

    /// The server's log (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
    }

    fn call(&self, method: &str, path: &str, body: &str) -> Value {
        let text = http(self.control, method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}; server log:\n{}", self.log()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} answered {text:?}: {e}"))
    }

    /// Sets the standing remote configuration (pushed to WebSocket agents
    /// at once, answered to polling ones); returns its hash in hex.
    pub fn set_config(&self, files: &[(&str, &str)]) -> String {
        self.set_config_typed(files, &[])
    }

    /// Like [`OpampServer::set_config`], with content types by key.
    pub fn set_config_typed(&self, files: &[(&str, &str)], types: &[(&str, &str)]) -> String {
        let f: serde_json::Map<String, Value> = files
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let t: serde_json::Map<String, Value> = types
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let body = serde_json::json!({"files": f, "content_types": t}).to_string();
        self.call("POST", "/control/config", &body)["hash"]
            .as_str()
            .expect("hash")
            .to_string()
    }

    /// `normal`, `refuse` (503 with Retry-After), `hang` (answers
    /// nothing until the mode changes) or `block_ws` (WebSocket upgrades
    /// refused with 403, plain HTTP served).
    pub fn set_mode(&self, mode: &str) {
        self.call("POST", "/control/mode", &format!("{{\"mode\":\"{mode}\"}}"));
    }

    /// Sends something once (see `main.go`: `text`, `bad_header`,
    /// `garbage`, `unknown_capability`, `unknown_command`, `restart`,
    /// `packages`, `big` with `bytes`, `many` with `count` and
    /// `template`); returns to how many WebSocket agents.
    pub fn send(&self, request: Value) -> u64 {
        self.call("POST", "/control/send", &request.to_string())["sent"]
            .as_u64()
            .unwrap_or(0)
    }

    /// WebSocket agents connected now.
    pub fn ws_agents(&self) -> u64 {
        self.call("GET", "/control/agents", "")["websocket"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Every message received since this run of the server started.
    pub fn messages(&self) -> Vec<Received> {
        let v = self.call("GET", "/control/messages?from=0", "");
        v["messages"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| Received {
                        transport: r["transport"].as_str().unwrap_or("").to_string(),
                        msg: r["msg"].clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The OTLP/HTTP URL of the server's receiver for `kind` (`logs`,
    /// `metrics`): where it offers the agent's own telemetry to go.
    pub fn otlp_endpoint(&self, kind: &str) -> String {
        format!("http://127.0.0.1:{}/otlp/v1/{kind}", self.control)
    }

    /// The OTLP requests received so far (the last 500): path, headers
    /// and protobuf body.
    pub fn otlp_requests(&self) -> Vec<OtlpRequest> {
        let v = self.call("GET", "/control/otlp", "");
        v["requests"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| OtlpRequest {
                        path: r["path"].as_str().unwrap_or("").to_string(),
                        headers: r["headers"].clone(),
                        body: b64(r["body"].as_str().unwrap_or("")),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many messages it received (also when not recording them).
    pub fn count(&self) -> u64 {
        self.call("GET", "/control/messages?from=-1", "")["count"]
            .as_u64()
            .unwrap_or(0)
    }
}

/// The remote config statuses received, as (hash in hex, status name
/// without its prefix, error message), in order.
pub fn statuses(msgs: &[Received]) -> Vec<(String, String, String)> {
    msgs.iter()
        .filter_map(|r| {
            let s = r.msg.get("remoteConfigStatus")?;
            let hash = s
                .get("lastRemoteConfigHash")
                .and_then(Value::as_str)
                .map(b64_to_hex)
                .unwrap_or_default();
            let status = s
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim_start_matches("RemoteConfigStatuses_")
                .to_string();
            let err = s
                .get("errorMessage")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            Some((hash, status, err))
        })
        .collect()
}

/// protojson's standard base64 to hex.
pub fn b64_to_hex(s: &str) -> String {
    b64(s).iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes standard base64.
pub fn b64(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let Some(v) = A.iter().position(|&x| x == c) else {
            continue;
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// One HTTP/1.0 request to the control API; the body of a 200.
fn http(port: u16, method: &str, path: &str, body: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{head}\n{body}"));
    }
    Ok(body.to_string())
}
