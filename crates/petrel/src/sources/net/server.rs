//! Connection handling shared by the receiving sources' servers (HTTP,
//! OTLP over HTTP and gRPC): accepting within limits, closing idle
//! connections, bearer tokens.
//!
//! - [`Gate::admit`] accepts the next connection that may be served:
//!   `max_connections` reached, or the process within a reserve of its
//!   descriptor limit, closes the new connection at once (counted
//!   `connection_refused`). The reserve keeps descriptors for the agent's
//!   own API, its files and spools however many clients connect, so
//!   `/health` and `/metrics` stay reachable under a connection flood.
//!   Accept errors (out of descriptors) back off up to a second instead of
//!   spinning, with one log line per 10 s.
//! - [`IdleIo`] closes a connection silent for `idle_timeout_secs`
//!   (counted `idle_timeout`): silence, not age, so a busy keep-alive
//!   client is never cut.
//! - [`serve_http`] runs an HTTP/1.1 server on both; [`grpc_incoming`]
//!   hands tonic the same connections.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use petrel_core::config::Map;
use petrel_core::plugin::SourceContext;
use petrel_core::LazyCounter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::ConnLimits;

/// Longest pause after a failed accept.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// At most one log line about failed or refused accepts per this period.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers must arrive within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Counters of a stream listener.
#[derive(Clone)]
pub struct StreamCounters {
    /// Open connections.
    pub connections: Gauge,
    /// Connections closed at accept: `max_connections` reached.
    pub refused: LazyCounter,
    /// Connections closed after `idle_timeout_secs` of silence.
    pub idle_closed: LazyCounter,
    /// Read errors and failed TLS handshakes.
    pub read_errors: LazyCounter,
    /// TLS handshakes that failed or timed out.
    pub tls_failed: LazyCounter,
}

impl StreamCounters {
    /// The counters of the source of `ctx`.
    pub fn new(ctx: &SourceContext) -> Self {
        let m = &ctx.metrics;
        Self {
            connections: m.connections_gauge(),
            refused: m.error_counter("connection_refused"),
            idle_closed: m.error_counter("idle_timeout"),
            read_errors: m.error_counter("read_failed"),
            tls_failed: m.error_counter("tls_handshake_failed"),
        }
    }
}

/// The process's soft limit of open descriptors (read once, after the
/// agent raised it at start).
fn fd_limit() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            r.rlim_cur
        } else {
            1024
        }
    })
}

/// Descriptors kept free of source connections: 1/16 of the limit,
/// between 32 and 256.
fn fd_reserve(limit: u64) -> u64 {
    (limit / 16).clamp(32, 256)
}

/// Whether a newly accepted descriptor `fd` eats into the reserve. The
/// kernel hands out the lowest free number, so every descriptor below
/// `fd` is in use: a number this high means fewer than the reserve are
/// left.
fn within_reserve(fd: i32, limit: u64) -> bool {
    fd >= 0 && (fd as u64) + fd_reserve(limit) >= limit
}

/// The accept side of one listener: connection slots, the descriptor
/// reserve, backoff on errors.
pub struct Gate {
    slots: Arc<Semaphore>,
    max: usize,
    refused: LazyCounter,
    backoff: Duration,
    last_log: Option<Instant>,
    quiet: u64,
    what: &'static str,
}

impl Gate {
    /// A gate of `max_connections` slots; refusals count into `refused`.
    pub fn new(max_connections: usize, refused: LazyCounter, what: &'static str) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_connections.max(1))),
            max: max_connections.max(1),
            refused,
            backoff: Duration::ZERO,
            last_log: None,
            quiet: 0,
            what,
        }
    }

    fn log(&mut self, msg: std::fmt::Arguments<'_>) {
        if self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            tracing::warn!(listener = self.what, suppressed = self.quiet, "{msg}");
            self.last_log = Some(Instant::now());
            self.quiet = 0;
        } else {
            self.quiet += 1;
        }
    }

    /// The next connection to serve, with its slot; `None` once `stop`
    /// is signalled.
    pub async fn admit<S, A, F, Fut>(
        &mut self,
        mut accept: F,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<(S, A, OwnedSemaphorePermit)>
    where
        S: AsRawFd,
        F: FnMut() -> Fut,
        Fut: Future<Output = io::Result<(S, A)>>,
    {
        loop {
            if *stop.borrow() {
                return None;
            }
            let accepted = tokio::select! {
                a = accept() => a,
                _ = stop.changed() => return None,
            };
            let (sock, addr) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, say: the pending connection stays
                    // in the backlog, so accept would fail again at once.
                    self.backoff =
                        (self.backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                    self.log(format_args!(
                        "accept failed: {e}; retrying in {} ms",
                        self.backoff.as_millis()
                    ));
                    tokio::select! {
                        _ = tokio::time::sleep(self.backoff) => {}
                        _ = stop.changed() => return None,
                    }
                    continue;
                }
            };
            self.backoff = Duration::ZERO;
            let limit = fd_limit();
            if within_reserve(sock.as_raw_fd(), limit) {
                self.refused.inc();
                self.log(format_args!(
                    "refusing a connection: the agent is within {} descriptors of its limit ({limit}); raise `ulimit -n` or lower `max_connections`",
                    fd_reserve(limit)
                ));
                continue;
            }
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => return Some((sock, addr, permit)),
                Err(_) => {
                    self.refused.inc();
                    let max = self.max;
                    self.log(format_args!(
                        "refusing a connection: `max_connections` ({max}) are open"
                    ));
                }
            }
        }
    }
}

/// A connection closed after `timeout` without a byte either way.
pub struct IdleIo<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    idle_closed: LazyCounter,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<S> IdleIo<S> {
    /// Wraps `inner`; `permit` (its connection slot) is released with it.
    pub fn new(
        inner: S,
        timeout: Duration,
        idle_closed: LazyCounter,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            idle_closed,
            _permit: permit,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn active(&mut self) {
        let at = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(at);
    }

    /// Notes a write's progress; a write that cannot proceed fails once
    /// the connection has been idle too long: a client that does not read
    /// what it is sent is as idle as one that sends nothing.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.idle_closed.inc();
            // Later polls fail at once without counting again.
            self.active();
            return true;
        }
        false
    }
}

fn idle_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "connection idle past idle_timeout_secs",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if self.expired(cx) {
                    Poll::Ready(Err(idle_error()))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(feature = "opentelemetry")]
impl tonic::transport::server::Connected for IdleIo<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Binds `addr` now (a taken port fails the start) as a listener on `rt`.
pub fn bind(
    rt: &tokio::runtime::Handle,
    addr: std::net::SocketAddr,
) -> anyhow::Result<tokio::net::TcpListener> {
    let std = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    std.set_nonblocking(true)?;
    let _g = rt.enter();
    Ok(tokio::net::TcpListener::from_std(std)?)
}

/// A running server of a source: stop it, ask whether it runs.
pub struct ServerHandle {
    stop: watch::Sender<bool>,
    alive: Arc<AtomicBool>,
}

impl ServerHandle {
    /// A handle and what the server's task watches: the stop signal and
    /// its alive flag.
    pub fn new() -> (Self, watch::Receiver<bool>, Arc<AtomicBool>) {
        let (stop, rx) = watch::channel(false);
        let alive = Arc::new(AtomicBool::new(true));
        (
            Self {
                stop,
                alive: alive.clone(),
            },
            rx,
            alive,
        )
    }
}

impl super::OtherReceiver for ServerHandle {
    fn stop(&mut self) {
        let _ = self.stop.send(true);
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// Answers one request: the request and the peer (`ip:port`).
pub type Handler = Arc<
    dyn Fn(
            Request<Incoming>,
            Arc<str>,
        ) -> Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>
        + Send
        + Sync,
>;

/// Serves HTTP/1.1 on `addr` (TLS when `tls` is set) within `limits`,
/// answering with `handler`.
pub fn serve_http(
    rt: &tokio::runtime::Handle,
    addr: std::net::SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    counters: StreamCounters,
    handler: Handler,
) -> anyhow::Result<ServerHandle> {
    let listener = bind(rt, addr)?;
    let (handle, stop_rx, alive) = ServerHandle::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    rt.spawn(async move {
        let mut stop = stop_rx.clone();
        let mut gate = Gate::new(limits.max_connections, counters.refused.clone(), "http");
        while let Some((sock, peer, permit)) = gate.admit(|| listener.accept(), &mut stop).await {
            let peer: Arc<str> = peer.to_string().into();
            let (handler, acceptor, mut stop) =
                (handler.clone(), acceptor.clone(), stop_rx.clone());
            let c = counters.clone();
            tokio::spawn(async move {
                c.connections.inc();
                let io = IdleIo::new(
                    sock,
                    limits.idle_timeout,
                    c.idle_closed.clone(),
                    Some(permit),
                );
                let svc = hyper::service::service_fn(move |req| {
                    let fut = handler(req, peer.clone());
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT);
                match acceptor {
                    None => {
                        let conn = b.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
                        tokio::select! {
                            _ = conn => {}
                            _ = stop.changed() => {}
                        }
                    }
                    Some(a) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, a.accept(io)).await {
                        Ok(Ok(tls)) => {
                            let conn = b.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                            tokio::select! {
                                _ = conn => {}
                                _ = stop.changed() => {}
                            }
                        }
                        _ => {
                            c.tls_failed.inc();
                        }
                    },
                }
                c.connections.dec();
            });
        }
        alive.store(false, Ordering::SeqCst);
    });
    Ok(handle)
}

/// The connections of `listener` for a tonic server, within `limits`
/// (tonic adds TLS itself when configured). Ends when `stop` fires.
#[cfg(feature = "opentelemetry")]
pub fn grpc_incoming(
    listener: tokio::net::TcpListener,
    limits: ConnLimits,
    counters: StreamCounters,
    stop: watch::Receiver<bool>,
) -> impl futures_core::Stream<Item = io::Result<IdleIo<tokio::net::TcpStream>>> {
    let gate = Gate::new(limits.max_connections, counters.refused.clone(), "grpc");
    let state = (listener, gate, stop, limits, counters);
    futures_util::stream::unfold(
        state,
        |(listener, mut gate, mut stop, limits, counters)| async move {
            let (sock, _, permit) = gate.admit(|| listener.accept(), &mut stop).await?;
            let _ = sock.set_nodelay(true);
            let io = IdleIo::new(
                sock,
                limits.idle_timeout,
                counters.idle_closed.clone(),
                Some(permit),
            );
            Some((Ok(io), (listener, gate, stop, limits, counters)))
        },
    )
}

/// The `auth` key of the receiving HTTP sources, documented once.
pub const AUTH_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "auth",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"`{bearer_token}`: requests must carry `Authorization: Bearer <token>` (HTTP 401, gRPC UNAUTHENTICATED otherwise, counted `unauthorized`); `${ENV}` expanded at load."#,
};

/// Reads `auth: {bearer_token}`; `Some(None)` without it, `None` on a
/// configuration error (reported).
pub fn parse_bearer_auth(map: &Map<'_>) -> Option<Option<String>> {
    let Some(n) = map.get("auth") else {
        return Some(None);
    };
    let m = n.as_map(&["bearer_token"])?;
    let t = m.required("bearer_token", "\"${PETREL_HTTP_TOKEN}\"")?;
    match t.as_str() {
        None => None,
        Some("") => {
            t.error(
                "`bearer_token` is empty (an unset environment variable?); set it or remove `auth`",
            );
            None
        }
        Some(s) => Some(Some(s.to_string())),
    }
}

/// The expected `Authorization` value for `token`.
pub fn bearer_header(token: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("Bearer {token}")).ok()
}

/// Whether the request's `Authorization` header is `want` (always true
/// without one).
pub fn authorized(headers: &hyper::HeaderMap, want: Option<&HeaderValue>) -> bool {
    want.is_none_or(|want| {
        headers
            .get(hyper::header::AUTHORIZATION)
            .is_some_and(|got| same_secret(got.as_bytes(), want.as_bytes()))
    })
}

/// Whether `given` equals `expected`, in time independent of where they
/// differ (a token must not be guessable byte by byte).
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_starts_where_few_descriptors_are_left() {
        assert_eq!(fd_reserve(2048), 128);
        assert_eq!(fd_reserve(256), 32);
        assert_eq!(fd_reserve(1 << 20), 256);
        assert!(!within_reserve(100, 2048));
        assert!(!within_reserve(1919, 2048));
        assert!(within_reserve(1920, 2048));
        assert!(within_reserve(2047, 2048));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"Bearer abc", b"Bearer abc"));
        assert!(!same_secret(b"Bearer abd", b"Bearer abc"));
        assert!(!same_secret(b"Bearer ab", b"Bearer abc"));
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_and_counted_once() {
        let (client, server) = tokio::io::duplex(64);
        let idle = LazyCounter::default();
        let mut io = IdleIo::new(server, Duration::from_millis(200), idle.clone(), None);
        let mut buf = [0u8; 8];
        let r = tokio::io::AsyncReadExt::read(&mut io, &mut buf).await;
        assert_eq!(r.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        assert_eq!(idle.get(), 1);
        drop(client);
    }

    #[tokio::test]
    async fn a_connection_that_keeps_talking_is_never_cut() {
        let (mut client, server) = tokio::io::duplex(64);
        let idle = LazyCounter::default();
        // Silence of a second closes it; a byte every 100 ms for 1.5 s
        // (longer than the timeout in all) must not.
        let mut io = IdleIo::new(server, Duration::from_secs(1), idle.clone(), None);
        let writer = tokio::spawn(async move {
            for _ in 0..15 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tokio::io::AsyncWriteExt::write_all(&mut client, b"x")
                    .await
                    .unwrap();
            }
        });
        let mut got = 0;
        let mut buf = [0u8; 8];
        while got < 15 {
            got += tokio::io::AsyncReadExt::read(&mut io, &mut buf)
                .await
                .unwrap();
        }
        assert_eq!(idle.get(), 0);
        writer.await.unwrap();
    }
}
