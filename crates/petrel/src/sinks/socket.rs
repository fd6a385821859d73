//! The transport of the `syslog` and `tcp` sinks: UDP datagrams, or a TCP
//! or TLS connection that is reconnected with backoff.
//!
//! Stream delivery: encoded payloads are written back to back on one
//! connection. A payload is acknowledged once the receiving host's TCP
//! has acknowledged all its bytes (the socket's send queue, `SIOCOUTQ`,
//! no longer holds them) and the connection then stayed established for
//! [`ACK_LINGER`]: a receiver that closes its socket with data it never
//! read resets the connection, and that reset arrives within the linger
//! unless the receiver stalled longer than that before closing. This is
//! more than "written to the socket" but less than an application
//! acknowledgement: plain TCP syslog has none (RELP has), so bytes a
//! receiver took but never processed can still be lost. When the
//! connection breaks, every payload not yet acknowledged is written again
//! on the next connection (at least once: the receiver may see some
//! twice; counted in `retried_events`). With TLS the send queue holds
//! ciphertext, a little longer than the text: acknowledgements then lag a
//! little, never run ahead.
//!
//! Datagram delivery (UDP): one datagram per record, cut to
//! `max_message_bytes` (counted `error_type="truncated"`); acknowledged
//! when sent. UDP has no delivery guarantee at all.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use petrel_core::config::Map;
use petrel_core::plugin::{Payload, PayloadReceiver};
use petrel_core::ComponentMetrics;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use super::tls::Tls;

/// Most payloads taken from the queue per write.
const MAX_PAYLOADS_PER_WRITE: usize = 64;
/// How often written but unacknowledged payloads are checked when no new
/// payload arrives.
const CONFIRM_POLL: Duration = Duration::from_millis(5);
/// How long a connection must stay established after the receiver's TCP
/// acknowledged a payload's bytes before the payload is acknowledged.
pub const ACK_LINGER: Duration = Duration::from_millis(100);
/// Bound on connecting (DNS, TCP and TLS handshakes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Transport of a socket sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One datagram per message.
    Udp,
    /// A TCP connection.
    Tcp,
    /// A TLS connection.
    Tls,
}

/// Where and how a socket sink sends.
#[derive(Clone)]
pub struct Transport {
    /// `host:port`.
    pub address: String,
    /// UDP, TCP or TLS.
    pub mode: Mode,
    /// `mode: tls`: the `tls` settings and the name the server's
    /// certificate must carry.
    pub tls_options: Option<(Tls, rustls_pki_types::ServerName<'static>)>,
    /// The client configuration made from `tls_options` by
    /// [`Transport::prepare`] (files are read when the sink is built, as
    /// the other sinks do, so that `validate` passes on another host).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// UDP: longer datagrams are cut to this.
    pub max_datagram_bytes: usize,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("address", &self.address)
            .field("mode", &self.mode)
            .field("tls", &self.tls_options.is_some())
            .finish()
    }
}

/// The `address` key, documented once for the socket sinks.
pub const ADDRESS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "address",
    kind: petrel_core::plugin::KeyKind::String,
    default: None,
    doc: r#"Required: the receiver, `host:port` (a name is resolved at each connection)."#,
};

/// The `tls` key of the socket sinks (client side).
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"`mode: tls`: `{ca_file, cert_file, key_file, server_name, verify}`. The server is verified against Mozilla's roots and `ca_file` (PEM); `cert_file` + `key_file` present a client certificate (mutual TLS); `server_name` is the name its certificate must carry (default: the host of `address`); `verify: false` skips verification (tests only)."#,
};

/// Reads `address`, `mode` (among `modes`), `tls` and, for UDP,
/// `max_message_bytes`.
pub fn parse_transport(map: &Map<'_>, modes: &'static [&'static str]) -> Option<Transport> {
    let address = map.required("address", "127.0.0.1:514")?;
    let addr = address.as_str()?;
    let Some((host, port)) = addr.rsplit_once(':') else {
        address.error(format!(
            "`{addr}` has no port; write `host:port`, e.g. `{addr}:514`"
        ));
        return None;
    };
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        address.error(format!(
            "`{addr}` is not `host:port` with a port 1..65535; e.g. `127.0.0.1:514`"
        ));
        return None;
    }
    let mode = match map.get("mode") {
        None => Mode::Tcp,
        Some(n) => match n.as_choice(modes)? {
            "udp" => Mode::Udp,
            "tls" => Mode::Tls,
            _ => Mode::Tcp,
        },
    };
    let tls = match (map.get("tls"), mode) {
        (Some(n), Mode::Tls) => Some(n),
        (Some(n), _) => {
            n.error("`tls` goes with `mode: tls`; write `mode: tls` or remove `tls`");
            return None;
        }
        (None, _) => None,
    };
    let tls_options = if mode == Mode::Tls {
        let opts = match tls {
            Some(n) => super::tls::parse_tls_keys(n, true)?,
            None => Tls {
                verify: true,
                ..Tls::default()
            },
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = opts.server_name.clone().unwrap_or_else(|| host.to_string());
        let server_name = match rustls_pki_types::ServerName::try_from(name.clone()) {
            Ok(n) => n,
            Err(e) => {
                let at = tls.and_then(|t| t.as_map_quiet()?.get("server_name"));
                at.unwrap_or(address).error(format!(
                    "`{name}` is not a DNS name or IP address for TLS: {e}"
                ));
                return None;
            }
        };
        Some((opts, server_name))
    } else {
        None
    };
    let max_datagram_bytes = match map.get("max_message_bytes") {
        None => 65_507,
        Some(n) => {
            let v = n.as_u64(true)?;
            if !(64..=65_507).contains(&v) {
                n.error("`max_message_bytes` must be 64 to 65507 (the largest UDP payload)");
                return None;
            }
            v as usize
        }
    };
    Some(Transport {
        address: addr.to_string(),
        mode,
        tls_options,
        tls: None,
        max_datagram_bytes,
    })
}

impl Transport {
    /// A copy ready to connect: the TLS client configuration made (its
    /// files read), or an error naming the file.
    pub fn prepare(&self, owner: &crate::tls::Owner) -> anyhow::Result<Arc<Transport>> {
        let mut t = self.clone();
        if let Some((opts, _)) = &self.tls_options {
            t.tls = Some(opts.rustls_client_config(owner)?);
        }
        Ok(Arc::new(t))
    }
}

/// An open stream.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    async fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.write_all(b).await,
            Self::Tls(s) => s.write_all(b).await,
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.flush().await,
            Self::Tls(s) => s.flush().await,
        }
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Tcp(s) => s,
            Self::Tls(s) => s.get_ref().0,
        }
    }

    /// Bytes written but not yet acknowledged by the peer's TCP, or `None`
    /// when the connection is no longer established (reset, or closed by
    /// us). `Some((n, true))`: the peer closed its side (it stopped
    /// reading; what it acknowledged before is still its).
    fn unacked(&self) -> Option<(u64, bool)> {
        use std::os::fd::AsRawFd;
        let fd = self.tcp().as_raw_fd();
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: getsockopt and ioctl on a socket we own, into buffers of
        // the sizes given.
        let (rc, state) = unsafe {
            let rc = libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            );
            (rc, info.tcpi_state)
        };
        if rc != 0 {
            return None;
        }
        // 1 = ESTABLISHED, 8 = CLOSE_WAIT (the peer sent FIN).
        let closed_by_peer = match state {
            1 => false,
            8 => true,
            _ => return None,
        };
        let mut outq: libc::c_int = 0;
        // SAFETY: as above.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut outq) } != 0 {
            return None;
        }
        Some((outq.max(0) as u64, closed_by_peer))
    }
}

async fn connect(t: &Transport) -> anyhow::Result<Stream> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&t.address))
        .await
        .map_err(|_| anyhow::anyhow!("connect timed out"))??;
    let _ = tcp.set_nodelay(true);
    match (&t.tls, &t.tls_options) {
        (Some(config), Some((_, name))) => {
            let c = tokio_rustls::TlsConnector::from(config.clone());
            let s = tokio::time::timeout(CONNECT_TIMEOUT, c.connect(name.clone(), tcp))
                .await
                .map_err(|_| anyhow::anyhow!("TLS handshake timed out"))??;
            Ok(Stream::Tls(Box::new(s)))
        }
        _ => Ok(Stream::Tcp(tcp)),
    }
}

/// A payload written on the current connection (or waiting to be).
struct Pending {
    payload: Payload,
    /// Offset just past its bytes in what this connection was sent; `None`
    /// until written on it.
    end: Option<u64>,
    /// When the receiver's TCP was first seen to hold all its bytes.
    taken_at: Option<std::time::Instant>,
}

/// Delivers payloads over `t` until the queue closes and everything taken
/// was acknowledged.
pub async fn run(t: Arc<Transport>, rx: PayloadReceiver, m: ComponentMetrics) {
    match t.mode {
        Mode::Udp => run_udp(t, rx, m).await,
        Mode::Tcp | Mode::Tls => run_stream(t, rx, m).await,
    }
}

async fn run_stream(t: Arc<Transport>, mut rx: PayloadReceiver, m: ComponentMetrics) {
    let connect_failed = m.error_counter("connect_failed");
    let write_failed = m.error_counter("write_failed");
    let connection_lost = m.error_counter("connection_lost");
    let retried = m.delivery().retried_events;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut incoming: Vec<Payload> = Vec::new();
    let mut conn: Option<Stream> = None;
    // Bytes sent on `conn`.
    let mut sent: u64 = 0;
    let mut closing = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        // Take what is queued; while payloads wait for acknowledgement,
        // wake up now and then to look at the socket.
        if !closing {
            let n = if pending.is_empty() {
                rx.recv_many(&mut incoming, MAX_PAYLOADS_PER_WRITE).await
            } else {
                tokio::select! {
                    n = rx.recv_many(&mut incoming, MAX_PAYLOADS_PER_WRITE) => n,
                    _ = tokio::time::sleep(CONFIRM_POLL) => usize::MAX,
                }
            };
            if n == 0 {
                closing = true;
            }
        }
        pending.extend(incoming.drain(..).map(|payload| Pending {
            payload,
            end: None,
            taken_at: None,
        }));
        if closing && pending.is_empty() {
            return;
        }
        if closing {
            tokio::time::sleep(CONFIRM_POLL).await;
        }
        // Write what this connection has not been sent.
        if pending.iter().any(|p| p.end.is_none()) {
            if conn.is_none() {
                match connect(&t).await {
                    Ok(s) => {
                        tracing::debug!(address = %t.address, "connected");
                        conn = Some(s);
                        sent = 0;
                        backoff = Duration::from_millis(100);
                    }
                    Err(e) => {
                        connect_failed.inc();
                        tracing::warn!(address = %t.address, error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot connect; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                        continue;
                    }
                }
            }
            let Some(s) = conn.as_mut() else { continue };
            let mut failed = None;
            for p in pending.iter_mut().filter(|p| p.end.is_none()) {
                if let Err(e) = s.write_all(&p.payload.data.bytes).await {
                    failed = Some(e);
                    break;
                }
                sent += p.payload.data.bytes.len() as u64;
                p.end = Some(sent);
            }
            if failed.is_none() {
                if let Err(e) = s.flush().await {
                    failed = Some(e);
                }
            }
            if let Some(e) = failed {
                write_failed.inc();
                tracing::warn!(address = %t.address, error = %e, retry_in_ms = backoff.as_millis() as u64, "write failed; reconnecting and sending the unacknowledged data again");
                conn = None;
                resend_all(&mut pending, &retried);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        }
        // Acknowledge what the peer's TCP took.
        let Some(s) = conn.as_ref() else { continue };
        match s.unacked() {
            Some((outq, peer_closed)) => {
                let confirmed = sent.saturating_sub(outq);
                let now = std::time::Instant::now();
                for p in pending.iter_mut() {
                    match p.end {
                        Some(e) if e <= confirmed => {
                            p.taken_at.get_or_insert(now);
                        }
                        _ => break,
                    }
                }
                // A receiver that closed its side after taking everything
                // (a FIN, not a reset) read it: no need to linger.
                let settled = |p: &Pending| {
                    p.taken_at
                        .is_some_and(|t| peer_closed || now.duration_since(t) >= ACK_LINGER)
                };
                while pending.front().is_some_and(settled) {
                    if let Some(p) = pending.pop_front() {
                        m.sent_events.inc_by(p.payload.events);
                        m.sent_bytes.inc_by(p.payload.data.bytes.len() as u64);
                        p.payload.ack.ack();
                    }
                }
                if peer_closed && (pending.is_empty() || outq == 0) {
                    // The receiver closed the connection: a new one for
                    // what comes next, and for what it did not take.
                    connection_lost.inc();
                    tracing::warn!(address = %t.address, "the receiver closed the connection; reconnecting");
                    conn = None;
                    resend_all(&mut pending, &retried);
                }
            }
            None => {
                connection_lost.inc();
                tracing::warn!(address = %t.address, "connection lost; reconnecting and sending the unacknowledged data again");
                conn = None;
                resend_all(&mut pending, &retried);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Marks every pending payload as to be written again on a new connection.
fn resend_all(
    pending: &mut VecDeque<Pending>,
    retried: &prometheus_client::metrics::counter::Counter,
) {
    for p in pending.iter_mut() {
        p.taken_at = None;
        if p.end.take().is_some() {
            retried.inc_by(p.payload.events);
        }
    }
}

async fn run_udp(t: Arc<Transport>, mut rx: PayloadReceiver, m: ComponentMetrics) {
    let send_failed = m.error_counter("send_failed");
    let truncated = m.error_counter("truncated");
    let mut sock: Option<UdpSocket> = None;
    let mut batch = Vec::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        if rx.recv_many(&mut batch, MAX_PAYLOADS_PER_WRITE).await == 0 {
            return;
        }
        for p in batch.drain(..) {
            let bytes = &p.data.bytes;
            let mut start = 0usize;
            let mut i = 0;
            while i < p.data.record_ends.len() {
                let end = p.data.record_ends[i] as usize;
                if sock.is_none() {
                    match udp_socket(&t.address).await {
                        Ok(s) => sock = Some(s),
                        Err(e) => {
                            send_failed.inc();
                            tracing::warn!(address = %t.address, error = %e, "cannot open the UDP socket; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                            continue;
                        }
                    }
                }
                let Some(s) = sock.as_ref() else { continue };
                let mut rec = bytes.get(start..end).unwrap_or_default();
                if rec.len() > t.max_datagram_bytes {
                    truncated.inc();
                    rec = &rec[..t.max_datagram_bytes];
                }
                match s.send(rec).await {
                    Ok(_) => {
                        backoff = Duration::from_millis(100);
                        start = end;
                        i += 1;
                    }
                    // A refused earlier datagram (ICMP port unreachable) is
                    // reported on a later send: that one was not sent, so
                    // it is sent again; the earlier one is lost, as UDP
                    // allows.
                    Err(e) => {
                        send_failed.inc();
                        tracing::warn!(address = %t.address, error = %e, "UDP send failed; retrying");
                        if e.kind() != std::io::ErrorKind::ConnectionRefused {
                            sock = None;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            m.sent_events.inc_by(p.events);
            m.sent_bytes.inc_by(p.data.bytes.len() as u64);
            p.ack.ack();
        }
    }
}

async fn udp_socket(address: &str) -> std::io::Result<UdpSocket> {
    let target = tokio::net::lookup_host(address)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{address} resolves to no address")))?;
    let local = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(local).await?;
    s.connect(target).await?;
    Ok(s)
}
