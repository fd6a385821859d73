//! Stream listeners (TCP, TLS over TCP, Unix stream sockets): accept,
//! read into a buffer, cut frames, hand blocks to the intake.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use petrel_core::LazyCounter;
use petrel_core::Span;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::watch;

use super::intake::Intake;
use super::server::Gate;
pub use super::server::StreamCounters;
use super::{now_ns, Block, ConnLimits, ListenAddr};

/// Bytes asked of one read. Large reads keep the per-message cost low
/// at high rates; a connection's buffer grows to at most this plus the
/// longest frame kept.
const READ_BYTES: usize = 64 << 10;

/// A read shorter than this means the connection is not busy enough to
/// fill blocks by itself: the next read waits [`LINGER`] so that it finds
/// more. Without it, a sender writing one message at a time made every
/// few hundred bytes a block that crossed the pipeline's threads (a
/// wake-up each), whatever the rate.
const LINGER_BELOW: usize = 16 << 10;

/// How long a connection's data is left to gather in the socket buffer
/// after a short read (TCP flow control holds the sender if it fills):
/// the latency this adds is at most this.
const LINGER: Duration = Duration::from_millis(1);

/// A TLS handshake that takes longer than this is abandoned (counted).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Cuts frames from the start of a connection's buffer.
pub trait Splitter: Send + 'static {
    /// Pushes the spans of the complete frames at the start of `buf` to
    /// `out` and returns the bytes they (and anything skipped) cover. At
    /// `eof` an unterminated tail is a frame too. Must consume bytes when
    /// `buf` holds more than the longest frame allowed, so buffers stay
    /// bounded.
    fn split(&mut self, buf: &[u8], eof: bool, out: &mut Vec<Span>) -> usize;
}

/// Makes one splitter per connection.
pub type MakeSplitter = Arc<dyn Fn() -> Box<dyn Splitter> + Send + Sync>;

/// Newline-ended frames (`\r\n` too), longer ones cut at `max` bytes and
/// counted.
pub struct LineSplitter {
    max: usize,
    /// Inside an over-long line: skip to its end.
    skipping: bool,
    too_long: LazyCounter,
}

impl LineSplitter {
    /// Frames of at most `max` bytes; cut lines counted in `too_long`.
    pub fn new(max: usize, too_long: LazyCounter) -> Self {
        Self {
            max,
            skipping: false,
            too_long,
        }
    }
}

impl Splitter for LineSplitter {
    fn split(&mut self, buf: &[u8], eof: bool, out: &mut Vec<Span>) -> usize {
        let mut start = 0;
        loop {
            let rest = &buf[start..];
            match memchr::memchr(b'\n', rest) {
                Some(nl) => {
                    if self.skipping {
                        self.skipping = false;
                    } else {
                        let mut len = nl;
                        if len > 0 && rest[len - 1] == b'\r' {
                            len -= 1;
                        }
                        if len > self.max {
                            self.too_long.inc();
                            len = self.max;
                        }
                        if len > 0 {
                            out.push(Span::new(start, len));
                        }
                    }
                    start += nl + 1;
                }
                None => {
                    if self.skipping {
                        return buf.len();
                    }
                    if rest.len() > self.max {
                        // Kept: the first `max` bytes; the rest of the line
                        // is skipped as it arrives.
                        self.too_long.inc();
                        out.push(Span::new(start, self.max));
                        self.skipping = true;
                        return buf.len();
                    }
                    if eof && !rest.is_empty() {
                        let mut len = rest.len();
                        if rest[len - 1] == b'\r' {
                            len -= 1;
                        }
                        if len > 0 {
                            out.push(Span::new(start, len));
                        }
                        return buf.len();
                    }
                    return start;
                }
            }
        }
    }
}

/// A listening socket and its connections.
pub struct StreamListener {
    stop: watch::Sender<bool>,
    alive: Arc<AtomicBool>,
    unix_path: Option<std::path::PathBuf>,
}

impl StreamListener {
    /// Stops accepting and closes the connections.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }

    /// True while the accept loop runs.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

impl Drop for StreamListener {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a stream listener needs.
pub struct StreamSpec {
    /// Where to listen.
    pub addr: ListenAddr,
    /// Connection limits.
    pub limits: ConnLimits,
    /// TLS, for TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Mode of a created Unix socket.
    pub socket_mode: u32,
    /// Frames per connection.
    pub splitter: MakeSplitter,
    /// Counters.
    pub counters: StreamCounters,
}

/// A connection's bytes, plain or TLS, readable and writable.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// An accepted connection handed to a protocol that answers its sender
/// (acknowledgements, handshakes) instead of the read-only [`Splitter`]
/// loop. The handler keeps the connection gauge and the idle timeout.
pub struct Connection {
    /// The connection, after the TLS handshake if any.
    pub io: Box<dyn Conn>,
    /// The peer's `ip:port` (or the socket path).
    pub peer: Arc<str>,
    /// Where to hand blocks.
    pub intake: Intake,
    /// Changes when the source stops.
    pub stop: watch::Receiver<bool>,
    /// The listener's options and counters.
    pub spec: Arc<StreamSpec>,
}

/// Serves one [`Connection`] until it ends.
pub type Serve = Arc<
    dyn Fn(Connection) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// Binds now (so a taken port fails the start) and serves on `rt`.
pub fn listen(
    rt: &tokio::runtime::Handle,
    spec: StreamSpec,
    intake: Intake,
) -> anyhow::Result<StreamListener> {
    listen_with(rt, spec, intake, None)
}

/// Like [`listen`], but each connection is served by `handler` when given
/// (the spec's splitter is then unused).
pub fn listen_with(
    rt: &tokio::runtime::Handle,
    spec: StreamSpec,
    intake: Intake,
    handler: Option<Serve>,
) -> anyhow::Result<StreamListener> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let alive = Arc::new(AtomicBool::new(true));
    let addr = spec.addr.clone();
    let spec = Arc::new(spec);
    match &addr {
        ListenAddr::Inet(addr) => {
            let std = std::net::TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            std.set_nonblocking(true)?;
            let listener = {
                let _g = rt.enter();
                tokio::net::TcpListener::from_std(std)?
            };
            let acceptor = spec.tls.clone().map(tokio_rustls::TlsAcceptor::from);
            let alive2 = alive.clone();
            rt.spawn(async move {
                let mut stop = stop_rx.clone();
                let mut gate = Gate::new(
                    spec.limits.max_connections,
                    spec.counters.refused.clone(),
                    "tcp",
                );
                while let Some((sock, peer, permit)) =
                    gate.admit(|| listener.accept(), &mut stop).await
                {
                    let _ = sock.set_nodelay(true);
                    let peer: Arc<str> = peer.to_string().into();
                    let (spec, intake, stop) = (spec.clone(), intake.clone(), stop_rx.clone());
                    let acceptor = acceptor.clone();
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let _permit = permit;
                        match acceptor {
                            None => run_conn(sock, peer, spec, intake, stop, handler).await,
                            Some(a) => {
                                // Boxed: the handshake's state (a rustls
                                // connection) would otherwise size every
                                // connection's task, TLS or not, for its
                                // whole life (idle connections' memory).
                                let handshake = Box::pin(a.accept(sock));
                                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                                    Ok(Ok(tls)) => {
                                        // Boxed for the same reason.
                                        let tls: Box<dyn Conn> = Box::new(tls);
                                        run_conn(tls, peer, spec.clone(), intake, stop, handler)
                                            .await
                                    }
                                    Ok(Err(e)) => {
                                        spec.counters.tls_failed.inc();
                                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    }
                                    Err(_) => {
                                        spec.counters.tls_failed.inc();
                                    }
                                }
                            }
                        }
                    });
                }
                alive2.store(false, Ordering::SeqCst);
            });
            Ok(StreamListener {
                stop: stop_tx,
                alive,
                unix_path: None,
            })
        }
        ListenAddr::Unix(path) => {
            remove_stale_socket(path)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let std = std::os::unix::net::UnixListener::bind(path)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(spec.socket_mode))?;
            std.set_nonblocking(true)?;
            let listener = {
                let _g = rt.enter();
                tokio::net::UnixListener::from_std(std)?
            };
            let peer: Arc<str> = path.display().to_string().into();
            let alive2 = alive.clone();
            rt.spawn(async move {
                let mut stop = stop_rx.clone();
                let mut gate = Gate::new(
                    spec.limits.max_connections,
                    spec.counters.refused.clone(),
                    "unix",
                );
                while let Some((sock, _, permit)) =
                    gate.admit(|| listener.accept(), &mut stop).await
                {
                    let (spec, intake, stop, peer) =
                        (spec.clone(), intake.clone(), stop_rx.clone(), peer.clone());
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let _permit = permit;
                        run_conn(sock, peer, spec, intake, stop, handler).await;
                    });
                }
                alive2.store(false, Ordering::SeqCst);
            });
            Ok(StreamListener {
                stop: stop_tx,
                alive,
                unix_path: Some(path.clone()),
            })
        }
    }
}

/// Removes a socket left by a previous run; refuses to remove anything
/// that is not a socket.
pub fn remove_stale_socket(path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path)?;
            Ok(())
        }
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; choose another `address` or remove it",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Starts a receiving source whose connections `handler` serves (a
/// protocol that answers its sender: fluent, beats): listens on `addr`
/// with the connection limits and TLS of every receiving source and hands
/// what the connections read to `intake`. On failure the intake's runner
/// is stopped before the error is returned. `what` names the protocol in
/// the log line.
#[allow(clippy::too_many_arguments)]
pub fn start_protocol(
    ctx: &petrel_core::plugin::SourceContext,
    rt: Arc<super::NetRuntime>,
    addr: &ListenAddr,
    limits: ConnLimits,
    tls: Option<&super::tls::TlsOptions>,
    (intake, runner): (Intake, super::intake::IntakeRunner),
    handler: Serve,
    what: &str,
) -> anyhow::Result<Box<dyn petrel_core::plugin::Source>> {
    let tls = match tls
        .map(|t| t.server_config(&crate::tls::Owner::of(&ctx.metrics)))
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            let _ = runner.wait_stopped(std::time::Instant::now());
            return Err(e);
        }
    };
    let unused = ctx.metrics.discarded_counter("too_long");
    let spec = StreamSpec {
        addr: addr.clone(),
        limits,
        tls,
        socket_mode: 0o666,
        // Unused: connections are served by the protocol handler.
        splitter: Arc::new(move || Box::new(LineSplitter::new(64, unused.clone()))),
        counters: StreamCounters::new(ctx),
    };
    let listener = match listen_with(rt.handle(), spec, intake, Some(handler)) {
        Ok(l) => l,
        Err(e) => {
            let _ = runner.wait_stopped(std::time::Instant::now());
            return Err(e);
        }
    };
    tracing::info!(source = %ctx.key, address = %addr, "listening ({what})");
    Ok(Box::new(super::RunningNet::new(
        vec![super::Receiver::Stream(listener)],
        runner,
        Some(rt),
    )))
}

/// Makes room in a protocol connection's read buffer before a read: twice
/// the last read from 512 bytes, and 64 KiB once reads bring 2 KiB. An idle connection then holds
/// half a KiB instead of a 64 KiB buffer whose touched pages stay
/// resident (1,000 idle connections: bench/idle_conns.py), while a busy
/// one, whose reads fill what they are given, reads 64 KiB at a time.
pub fn read_room(buf: &mut BytesMut, last_read: usize) {
    // A connection that read a few KiB is busy: from then on, room for a
    // whole 64 KiB read, as a plain TCP connection gets, so that reads
    // cut short by a nearly full buffer cannot make the next ones smaller.
    let want = if last_read >= 2048 {
        READ_BYTES
    } else {
        (last_read * 2).clamp(512, READ_BYTES)
    };
    if buf.capacity() - buf.len() < want / 4 {
        buf.reserve(want);
    }
}

/// Serves one connection with `handler`, or the splitter loop.
async fn run_conn<S: Conn>(
    sock: S,
    peer: Arc<str>,
    spec: Arc<StreamSpec>,
    intake: Intake,
    stop: watch::Receiver<bool>,
    handler: Option<Serve>,
) {
    match handler {
        None => serve(sock, peer, &spec, &intake, stop).await,
        Some(h) => {
            h(Connection {
                io: Box::new(sock),
                peer,
                intake,
                stop,
                spec,
            })
            .await
        }
    }
}

/// Reads one connection until it ends, is idle too long, or the source
/// stops.
async fn serve<S: AsyncRead + Unpin>(
    mut sock: S,
    peer: Arc<str>,
    spec: &StreamSpec,
    intake: &Intake,
    mut stop: watch::Receiver<bool>,
) {
    let c = &spec.counters;
    c.connections.inc();
    let mut splitter = (spec.splitter)();
    let mut buf = BytesMut::with_capacity(READ_BYTES);
    let mut frames = Vec::new();
    loop {
        if buf.capacity() - buf.len() < READ_BYTES / 4 {
            buf.reserve(READ_BYTES);
        }
        let read = tokio::select! {
            r = tokio::time::timeout(spec.limits.idle_timeout, sock.read_buf(&mut buf)) => r,
            _ = stop.changed() => break,
        };
        let mut short = false;
        let eof = match read {
            Err(_) => {
                c.idle_closed.inc();
                true
            }
            Ok(Err(e)) => {
                c.read_errors.inc();
                tracing::debug!(%peer, error = %e, "read failed; closing the connection");
                true
            }
            Ok(Ok(n)) => {
                short = n < LINGER_BELOW;
                n == 0
            }
        };
        let used = splitter.split(&buf, eof, &mut frames);
        if frames.is_empty() {
            buf.advance(used);
        } else {
            let data = buf.split_to(used).freeze();
            let block = Block {
                buf: data,
                frames: std::mem::take(&mut frames),
                peer: Some(peer.clone()),
                received_ns: now_ns(),
                json: false,
            };
            if !intake.submit(block).await {
                break;
            }
        }
        if eof {
            break;
        }
        if short {
            tokio::select! {
                _ = tokio::time::sleep(LINGER) => {}
                _ = stop.changed() => break,
            }
        }
    }
    c.connections.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(input: &[u8], chunk: usize, max: usize) -> (Vec<Vec<u8>>, u64) {
        let too_long = LazyCounter::default();
        let mut s = LineSplitter::new(max, too_long.clone());
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for (i, piece) in input.chunks(chunk).enumerate() {
            buf.extend_from_slice(piece);
            let eof = (i + 1) * chunk >= input.len();
            let mut spans = Vec::new();
            let used = s.split(&buf, eof, &mut spans);
            out.extend(spans.iter().map(|sp| sp.get(&buf).to_vec()));
            buf.drain(..used);
        }
        (out, too_long.get())
    }

    #[test]
    fn lines_are_the_same_whatever_the_read_sizes() {
        let input = b"one\r\ntwo\n\nthree is longer than ten\nfour\nlast-no-newline";
        for chunk in 1..input.len() {
            let (got, cut) = split_all(input, chunk, 10);
            assert_eq!(
                got,
                vec![
                    b"one".to_vec(),
                    b"two".to_vec(),
                    b"three is l".to_vec(),
                    b"four".to_vec(),
                    b"last-no-ne".to_vec()
                ],
                "read size {chunk}"
            );
            assert_eq!(cut, 2, "read size {chunk}");
        }
    }
}
