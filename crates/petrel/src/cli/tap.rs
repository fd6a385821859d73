//! `petrel tap`: prints a sample of the events leaving a component of a
//! running agent, streamed from its API's `/tap` (see `api.rs`). The
//! agent skips (and counts) what this client is too slow to take; the
//! pipeline never waits for it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How events are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TapFormat {
    /// One JSON object per event, every field (as the ndjson encoding).
    Ndjson,
    /// The `message` field only.
    Text,
}

/// How `petrel top` and `tap` reach an API served over TLS
/// (`--api-addr https://...`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ApiTls {
    /// PEM authority the agent's API certificate must chain to (beside
    /// Mozilla's roots), for an `https://` --api-addr.
    #[arg(long, env = "PETREL_API_CA_FILE")]
    pub api_ca_file: Option<PathBuf>,
    /// PEM client certificate for an API that asks for one (mutual TLS).
    #[arg(long, requires = "api_key_file", env = "PETREL_API_CERT_FILE")]
    pub api_cert_file: Option<PathBuf>,
    /// The PEM private key of --api-cert-file.
    #[arg(long, requires = "api_cert_file", env = "PETREL_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
}

/// Where an agent's API is: `host:port`, `http://host:port` or
/// `https://host:port` (TLS, with the settings of [`ApiTls`]).
#[derive(Clone)]
pub struct ApiTarget {
    /// `host:port`.
    pub addr: String,
    /// The host, for the TLS server name.
    host: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ApiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTarget")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ApiTarget {
    /// Reads `--api-addr` and the TLS options.
    pub fn new(api_addr: &str, tls: &ApiTls) -> anyhow::Result<ApiTarget> {
        let (secure, addr) = match api_addr.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            Some((scheme, _)) => {
                anyhow::bail!("--api-addr {api_addr}: `{scheme}://` is not http:// or https://")
            }
            None => (false, api_addr),
        };
        let addr = addr.trim_end_matches('/').to_string();
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            None => addr.clone(),
        };
        if !secure && (tls.api_ca_file.is_some() || tls.api_cert_file.is_some()) {
            anyhow::bail!(
                "--api-ca-file and --api-cert-file are for an API served over TLS: write --api-addr https://{addr}"
            );
        }
        let tls = if secure {
            let files = crate::tls::ClientFiles {
                ca_file: tls.api_ca_file.clone(),
                cert_file: tls.api_cert_file.clone(),
                key_file: tls.api_key_file.clone(),
                verify: true,
            };
            let mut cfg = crate::tls::client_config(&files, &crate::tls::Owner::named("client"))?;
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(Arc::new(cfg))
        } else {
            None
        };
        Ok(ApiTarget { addr, host, tls })
    }
}

/// A connection to the API, plain or TLS.
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// Sets the read timeout of the socket.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.set_read_timeout(t),
            Conn::Tls(s) => s.sock.set_read_timeout(t),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let r = match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        };
        match r {
            // The API closes a TLS connection after an HTTP/1.0 answer
            // without close_notify at times: the end of the body is the
            // end of the connection either way.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            r => r,
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Connects to the API of `target`, with TLS when it says so; the TLS
/// handshake is made here, so that a refused certificate is reported as
/// such.
pub fn connect_to(target: &ApiTarget, timeout: Duration) -> anyhow::Result<(Conn, SocketAddr)> {
    let (s, addr) = connect(&target.addr, timeout)?;
    let Some(cfg) = &target.tls else {
        return Ok((Conn::Plain(s), addr));
    };
    let name = rustls_pki_types::ServerName::try_from(target.host.clone())
        .map_err(|e| anyhow::anyhow!("{}: not a TLS server name: {e}", target.host))?;
    let mut c = rustls::ClientConnection::new(cfg.clone(), name)?;
    let mut s = s;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    while c.is_handshaking() {
        c.complete_io(&mut s).map_err(|e| {
            anyhow::anyhow!("TLS with the agent's API at {} failed: {e}", target.addr)
        })?;
    }
    s.set_write_timeout(None)?;
    Ok((Conn::Tls(Box::new(rustls::StreamOwned::new(c, s))), addr))
}

/// What to tap.
#[derive(Debug, Clone)]
pub struct TapOptions {
    /// The agent's API.
    pub api: ApiTarget,
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
    let (mut s, addr) = connect_to(&o.api, Duration::from_secs(5))?;
    s.set_read_timeout(None)?;
    let req = format!(
        "GET /tap?{query} HTTP/1.0\r\n{}\r\n",
        request_headers(&o.api.addr, &addr)
    );
    s.write_all(req.as_bytes())?;
    s.flush()?;
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
