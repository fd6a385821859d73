//! `petrel tap`: prints a sample of the events leaving a component of a
//! running agent, streamed from its API's `/tap` (see `api.rs`). The
//! agent skips (and counts) what this client is too slow to take; the
//! pipeline never waits for it.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How events are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TapFormat {
    /// One JSON object per event, every field (as the ndjson encoding).
    Ndjson,
    /// The `message` field only.
    Text,
}

/// What to tap.
#[derive(Debug, Clone)]
pub struct TapOptions {
    /// The agent's API address.
    pub api_addr: String,
    /// `PIPELINE` or `PIPELINE/COMPONENT`.
    pub target: String,
    /// Stop after this many events.
    pub limit: Option<u64>,
    /// At most this many events per second.
    pub rate: Option<u64>,
    /// Output format.
    pub format: TapFormat,
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Connects to the agent's API at `api_addr`, trying each address it
/// resolves to (`localhost` may give `::1` first while the agent listens
/// on 127.0.0.1).
pub fn connect(api_addr: &str, timeout: Duration) -> anyhow::Result<(TcpStream, SocketAddr)> {
    let mut last = None;
    for addr in api_addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok((s, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => anyhow::anyhow!(
            "no agent answers at {api_addr} ({e}); is `petrel run` running with --api-addr {api_addr}?"
        ),
        None => anyhow::anyhow!("{api_addr}: no address"),
    })
}

/// The `Host` and `Authorization` headers of a request to the API at
/// `addr` (reached as `given`), each ending with CRLF. On loopback the
/// agent takes only a loopback `Host`, so the address connected to is
/// sent rather than a name that merely resolves to it; the token comes
/// from `PETREL_API_TOKEN` when set.
pub fn request_headers(given: &str, addr: &SocketAddr) -> String {
    let mut h = if addr.ip().is_loopback() {
        format!("Host: {addr}\r\n")
    } else {
        format!("Host: {given}\r\n")
    };
    if let Ok(t) = std::env::var("PETREL_API_TOKEN") {
        if !t.is_empty() {
            h.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
    }
    h
}

/// Streams events to `out` until the limit, the agent's end of the
/// stream, or a closed output.
pub fn run(o: &TapOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    let (pipeline, component) = match o.target.split_once('/') {
        Some((p, c)) => (p, Some(c)),
        None => (o.target.as_str(), None),
    };
    let mut query = format!("pipeline={}", encode(pipeline));
    if let Some(c) = component {
        query.push_str(&format!("&component={}", encode(c)));
    }
    if let Some(l) = o.limit {
        query.push_str(&format!("&limit={l}"));
    }
    if let Some(r) = o.rate {
        query.push_str(&format!("&rate={r}"));
    }
    let (mut s, addr) = connect(&o.api_addr, Duration::from_secs(5))?;
    let req = format!(
        "GET /tap?{query} HTTP/1.0\r\n{}\r\n",
        request_headers(&o.api_addr, &addr)
    );
    s.write_all(req.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    if status.split_whitespace().nth(1) != Some("200") {
        let mut body = String::new();
        let _ = std::io::Read::read_to_string(&mut r, &mut body);
        anyhow::bail!("{}: {}", status.trim(), body.trim());
    }
    let mut seen = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let printed = match o.format {
            TapFormat::Ndjson => out.write_all(&line),
            TapFormat::Text => {
                let msg = serde_json::from_slice::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
                    .unwrap_or_else(|| String::from_utf8_lossy(&line).trim_end().to_string());
                writeln!(out, "{msg}")
            }
        };
        if printed.and_then(|_| out.flush()).is_err() {
            // The reader of our output went away (`| head`): done.
            return Ok(());
        }
        seen += 1;
        if o.limit.is_some_and(|l| seen >= l) {
            return Ok(());
        }
    }
}
