//! One Forward protocol connection: the optional handshake, then
//! messages cut into frames and handed to the intake, and `{"ack": chunk}`
//! written back in order once each chunk is safe.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use petrel_core::Span;
use sha2::{Digest, Sha512};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::msgpack::{self, Cur, Mode, ScanError};
use super::{FluentCounters, Security};
use crate::sources::net::intake::{Admission, Intake};
use crate::sources::net::stream::Connection;
use crate::sources::net::{now_ns, Block};

/// A handshake message larger than this is refused.
const MAX_HANDSHAKE_BYTES: usize = 64 << 10;

/// Chunks whose acknowledgement is pending on one connection; a client
/// with more in flight waits (its writes stop being read).
const MAX_PENDING_ACKS: usize = 256;

/// The longest `chunk` id taken. Clients send 16 random bytes in base64
/// (24 characters: Fluentd, Fluent Bit, the fluent-logger libraries); a
/// longer id is refused with its message, so what a connection keeps for
/// its pending acknowledgements stays within MAX_PENDING_ACKS × this
/// (64 KiB) whatever the client sends.
pub(super) const MAX_CHUNK_ID: usize = 256;

/// What every connection of a source shares.
pub(super) struct Shared {
    /// `max_entry_bytes`.
    pub max: usize,
    /// The handshake's secrets, when required.
    pub security: Option<Arc<Security>>,
    /// Counters.
    pub counters: FluentCounters,
    /// The source's key, for logs.
    pub key: Arc<str>,
}

/// Serves one connection until it ends, fails, idles out or the source
/// stops.
pub(super) async fn serve(c: Connection, sh: Arc<Shared>) {
    let Connection {
        io,
        peer,
        intake,
        mut stop,
        spec,
    } = c;
    let counters = &spec.counters;
    let idle = spec.limits.idle_timeout;
    counters.connections.inc();
    let (mut rd, mut wr) = tokio::io::split(io);
    // Grown as data arrives (see `read_room`): an idle connection holds
    // half a KiB, a busy one reads 64 KiB at a time.
    let mut buf = BytesMut::new();
    let mut last_read = 0usize;
    if let Some(sec) = &sh.security {
        if let Err(why) = handshake(&mut rd, &mut wr, &mut buf, sec, idle).await {
            if why.is_empty() {
                // Connected and closed without a byte: a port check (load
                // balancers, `connect` probes), not a failed client.
                counters.connections.dec();
                return;
            }
            sh.counters.handshake_failed.inc();
            tracing::warn!(source = %sh.key, %peer, reason = %why, "fluent handshake failed; connection closed");
            counters.connections.dec();
            return;
        }
    }
    let (ack_tx, ack_rx) = mpsc::channel(MAX_PENDING_ACKS);
    let writer = tokio::spawn(write_acks(wr, ack_rx, idle, sh.clone(), peer.clone()));
    let writer_abort = writer.abort_handle();
    let mut pending: Vec<Span> = Vec::new();
    let mut pos = 0usize;
    // Do not look for the end of the message at `pos` before the buffer
    // holds this many bytes.
    let mut want = 0usize;
    'conn: loop {
        let mut close = false;
        while buf.len() > pos && buf.len() >= want {
            let m = match msgpack::scan(&buf[pos..], sh.max) {
                Ok(m) => m,
                Err(ScanError::Incomplete) => {
                    if buf.len() - pos > sh.max {
                        refuse(
                            &sh,
                            &peer,
                            &sh.counters.too_large,
                            "a message is larger than max_entry_bytes",
                        );
                        close = true;
                    }
                    break;
                }
                Err(ScanError::Need(n)) => {
                    if n > sh.max {
                        refuse(
                            &sh,
                            &peer,
                            &sh.counters.too_large,
                            "a message is larger than max_entry_bytes",
                        );
                        close = true;
                    } else {
                        want = pos + n;
                        if want > buf.capacity() {
                            buf.reserve(want - buf.len());
                        }
                    }
                    break;
                }
                Err(ScanError::TooLarge) => {
                    refuse(
                        &sh,
                        &peer,
                        &sh.counters.too_large,
                        "a message is larger than max_entry_bytes",
                    );
                    close = true;
                    break;
                }
                Err(ScanError::Invalid(why)) => {
                    refuse(&sh, &peer, &sh.counters.invalid, why);
                    close = true;
                    break;
                }
            };
            want = 0;
            let start = pos;
            pos += m.len;
            if m.chunk.as_ref().is_some_and(|r| r.len() > MAX_CHUNK_ID) {
                refuse(
                    &sh,
                    &peer,
                    &sh.counters.chunk_id_too_long,
                    "a chunk id longer than 256 bytes",
                );
                close = true;
                break;
            }
            let chunk = m
                .chunk
                .as_ref()
                .map(|r| Bytes::copy_from_slice(&buf[start + r.start..start + r.end]));
            if m.mode == Mode::Compressed {
                // Earlier frames first, then this one inflated on its own.
                if !pending.is_empty() {
                    let data = buf.split_to(start).freeze();
                    if !submit(&intake, &peer, data, &mut pending).await {
                        break 'conn;
                    }
                } else {
                    buf.advance(start);
                }
                pos -= start;
                let msg = buf.split_to(pos).freeze();
                pos = 0;
                let frame = match inflate(&msg, &m, sh.max) {
                    Ok(f) => f,
                    Err((counter, why)) => {
                        let counter = match counter {
                            Fail::TooLarge => &sh.counters.too_large,
                            Fail::Inflate => &sh.counters.inflate_failed,
                            Fail::Invalid => &sh.counters.invalid,
                        };
                        refuse(&sh, &peer, counter, why);
                        close = true;
                        break;
                    }
                };
                let span = Span::new(0, frame.len());
                let block = block(frame, vec![span], &peer);
                if !hand_over(&intake, block, chunk, &ack_tx).await {
                    break 'conn;
                }
                continue;
            }
            pending.push(Span::new(start, m.len));
            if chunk.is_some() {
                let data = buf.split_to(pos).freeze();
                pos = 0;
                let block = block(data, std::mem::take(&mut pending), &peer);
                if !hand_over(&intake, block, chunk, &ack_tx).await {
                    break 'conn;
                }
            }
        }
        if !pending.is_empty() {
            let data = buf.split_to(pos).freeze();
            // `want` counts from the buffer's start, which moved.
            want = want.saturating_sub(pos);
            pos = 0;
            if !submit(&intake, &peer, data, &mut pending).await {
                break;
            }
        }
        if close {
            break;
        }
        crate::sources::net::stream::read_room(&mut buf, last_read);
        let read = tokio::select! {
            r = tokio::time::timeout(idle, rd.read_buf(&mut buf)) => r,
            _ = stop.changed() => break,
        };
        match read {
            Err(_) => {
                counters.idle_closed.inc();
                break;
            }
            Ok(Err(e)) => {
                counters.read_errors.inc();
                tracing::debug!(%peer, error = %e, "read failed; closing the connection");
                break;
            }
            Ok(Ok(0)) => {
                if buf.len() > pos {
                    refuse(
                        &sh,
                        &peer,
                        &sh.counters.invalid,
                        "the connection closed inside a message",
                    );
                }
                break;
            }
            Ok(Ok(n)) => last_read = n,
        }
    }
    // Acknowledgements of what was accepted are still written, while the
    // client listens.
    drop(ack_tx);
    if tokio::time::timeout(idle, writer).await.is_err() {
        // A client that stopped reading: its acknowledgements and the
        // socket are let go, not kept until it reads.
        writer_abort.abort();
    }
    counters.connections.dec();
}

fn block(buf: Bytes, frames: Vec<Span>, peer: &Arc<str>) -> Block {
    Block {
        buf,
        frames,
        peer: Some(peer.clone()),
        received_ns: now_ns(),
        json: false,
    }
}

async fn submit(intake: &Intake, peer: &Arc<str>, data: Bytes, pending: &mut Vec<Span>) -> bool {
    intake
        .submit(block(data, std::mem::take(pending), peer))
        .await
}

/// Submits `block`; with a chunk, queues its acknowledgement.
async fn hand_over(
    intake: &Intake,
    block: Block,
    chunk: Option<Bytes>,
    acks: &mpsc::Sender<(Bytes, oneshot::Receiver<Admission>)>,
) -> bool {
    match chunk {
        None => intake.submit(block).await,
        Some(chunk) => match intake.submit_acked(block).await {
            Some(rx) => acks.send((chunk, rx)).await.is_ok(),
            None => false,
        },
    }
}

/// Counts and logs a refused message (the connection is then closed:
/// after garbage, where the next message starts is unknown).
fn refuse(sh: &Shared, peer: &str, counter: &petrel_core::LazyCounter, why: &str) {
    counter.inc();
    tracing::warn!(source = %sh.key, %peer, reason = why, "fluent: refused a message; closing the connection (its earlier messages are kept)");
}

/// Writes `{"ack": chunk}` for each chunk once it is safe, in order. A
/// client that does not read its acknowledgements for `idle` (its socket
/// buffer full) is logged, counted and disconnected: this task ends, the
/// queue of pending acknowledgements closes, and the connection with it.
async fn write_acks<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<(Bytes, oneshot::Receiver<Admission>)>,
    idle: Duration,
    sh: Arc<Shared>,
    peer: Arc<str>,
) {
    let mut out = Vec::with_capacity(64);
    while let Some((chunk, done)) = rx.recv().await {
        match done.await {
            Ok(Admission::Accepted) => {}
            // Not accepted (the buffer dropped it, or the source stops):
            // no answer, so the client sends it again.
            _ => continue,
        }
        out.clear();
        let _ = rmp::encode::write_map_len(&mut out, 1);
        let _ = rmp::encode::write_str(&mut out, "ack");
        let _ = rmp::encode::write_str_len(&mut out, chunk.len() as u32);
        out.extend_from_slice(&chunk);
        let written = async { wr.write_all(&out).await.and(wr.flush().await) };
        match tokio::time::timeout(idle, written).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                sh.counters.acks_not_read.inc();
                tracing::warn!(source = %sh.key, %peer, "fluent: the client does not read its acknowledgements; connection closed (its unacknowledged chunks are sent again by the client)");
                return;
            }
        }
    }
}

enum Fail {
    TooLarge,
    Inflate,
    Invalid,
}

/// The compressed message `msg` as an uncompressed PackedForward frame
/// `[tag, bin]` (what is buffered, so replay needs no inflating).
fn inflate(msg: &Bytes, m: &msgpack::Scanned, max: usize) -> Result<Bytes, (Fail, &'static str)> {
    let mut data = Vec::new();
    // Several gzip members may follow each other (one per appended chunk).
    let mut gz = flate2::read::MultiGzDecoder::new(&msg[m.packed.clone()]).take(max as u64 + 1);
    if gz.read_to_end(&mut data).is_err() {
        return Err((Fail::Inflate, "compressed entries do not inflate (gzip)"));
    }
    if data.len() > max {
        return Err((
            Fail::TooLarge,
            "compressed entries inflate to more than max_entry_bytes",
        ));
    }
    msgpack::check_entries(&data, max).map_err(|why| (Fail::Invalid, why))?;
    let tag = &msg[m.tag.clone()];
    let mut out = Vec::with_capacity(data.len() + tag.len() + 16);
    let _ = rmp::encode::write_array_len(&mut out, 2);
    let _ = rmp::encode::write_str_len(&mut out, tag.len() as u32);
    out.extend_from_slice(tag);
    let _ = rmp::encode::write_bin_len(&mut out, data.len() as u32);
    out.extend_from_slice(&data);
    Ok(out.into())
}

fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    // The nonce and salt only need to be unpredictable; the OS source
    // does not fail on Linux once booted.
    let _ = getrandom::fill(&mut b);
    b
}

fn hex_sha512(parts: &[&[u8]]) -> String {
    let mut h = Sha512::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares digests in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HELO, then PING read and checked, then PONG. `Err` says why (also
/// sent to the client in PONG when the PING was read); empty when the
/// client closed without sending anything.
async fn handshake<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
    sec: &Security,
    idle: Duration,
) -> Result<(), String> {
    let nonce = random16();
    let auth_salt = if sec.users.is_empty() {
        None
    } else {
        Some(random16())
    };
    let mut out = Vec::new();
    let _ = rmp::encode::write_array_len(&mut out, 2);
    let _ = rmp::encode::write_str(&mut out, "HELO");
    let _ = rmp::encode::write_map_len(&mut out, 3);
    let _ = rmp::encode::write_str(&mut out, "nonce");
    let _ = rmp::encode::write_bin(&mut out, &nonce);
    let _ = rmp::encode::write_str(&mut out, "auth");
    let _ = rmp::encode::write_bin(&mut out, auth_salt.as_ref().map_or(&[][..], |s| &s[..]));
    let _ = rmp::encode::write_str(&mut out, "keepalive");
    let _ = rmp::encode::write_bool(&mut out, true);
    // A port check that already closed (reset) is no failed client.
    let helo_failed = |e: std::io::Error| {
        if peer_gone(&e) {
            String::new()
        } else {
            format!("cannot send HELO: {e}")
        }
    };
    wr.write_all(&out).await.map_err(helo_failed)?;
    wr.flush().await.map_err(helo_failed)?;
    let ping = loop {
        match read_ping(buf) {
            Ok(p) => break p,
            Err(ScanError::Incomplete | ScanError::Need(_)) if buf.len() <= MAX_HANDSHAKE_BYTES => {
            }
            Err(ScanError::Invalid(why)) => return Err(format!("bad PING: {why}")),
            Err(_) => return Err("PING larger than 64KiB".into()),
        }
        buf.reserve(512);
        match tokio::time::timeout(idle, rd.read_buf(buf)).await {
            Ok(Ok(0)) if buf.is_empty() => return Err(String::new()),
            Ok(Ok(0)) => return Err("the client closed the connection inside PING".into()),
            Ok(Ok(_)) => {}
            // The HELO written to a probe that connected and closed makes
            // its kernel answer with a reset: still a port check, whether
            // the close or the reset is read first.
            Ok(Err(e)) if buf.is_empty() && peer_gone(&e) => return Err(String::new()),
            Ok(Err(e)) => return Err(format!("read failed: {e}")),
            Err(_) => return Err("no PING within idle_timeout_secs".into()),
        }
    };
    let (len, f) = ping;
    let b: &[u8] = &buf[..];
    let (hostname, salt, digest, user, pass) = (
        &b[f[0].clone()],
        &b[f[1].clone()],
        &b[f[2].clone()],
        &b[f[3].clone()],
        &b[f[4].clone()],
    );
    let expect = hex_sha512(&[salt, hostname, &nonce, sec.shared_key.as_bytes()]);
    let mut failure = None;
    if !same(digest, expect.as_bytes()) {
        failure = Some("shared_key mismatch".to_string());
    } else if let Some(auth) = &auth_salt {
        let ok = sec.users.iter().any(|(u, p)| {
            u.as_bytes() == user
                && same(
                    pass,
                    hex_sha512(&[auth, u.as_bytes(), p.as_bytes()]).as_bytes(),
                )
        });
        if !ok {
            failure = Some(format!(
                "username/password mismatch for user `{}`",
                String::from_utf8_lossy(user)
            ));
        }
    }
    let pong_digest = hex_sha512(&[
        salt,
        sec.self_hostname.as_bytes(),
        &nonce,
        sec.shared_key.as_bytes(),
    ]);
    out.clear();
    let _ = rmp::encode::write_array_len(&mut out, 5);
    let _ = rmp::encode::write_str(&mut out, "PONG");
    let _ = rmp::encode::write_bool(&mut out, failure.is_none());
    let _ = rmp::encode::write_str(&mut out, failure.as_deref().unwrap_or(""));
    match failure {
        None => {
            let _ = rmp::encode::write_str(&mut out, &sec.self_hostname);
            let _ = rmp::encode::write_str(&mut out, &pong_digest);
        }
        Some(_) => {
            let _ = rmp::encode::write_str(&mut out, "");
            let _ = rmp::encode::write_str(&mut out, "");
        }
    }
    buf.advance(len);
    let sent = async {
        wr.write_all(&out).await?;
        wr.flush().await
    }
    .await;
    match (failure, sent) {
        (Some(why), _) => Err(why),
        (None, Err(e)) => Err(format!("cannot send PONG: {e}")),
        (None, Ok(())) => Ok(()),
    }
}

/// The peer closed or reset the connection.
fn peer_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted)
}

/// `["PING", hostname, salt, digest, username, password digest]`: its
/// length and the ranges of its five fields.
fn read_ping(b: &[u8]) -> Result<(usize, [std::ops::Range<usize>; 5]), ScanError> {
    let mut c = Cur::new(b, 0);
    let n = c.array_len(MAX_HANDSHAKE_BYTES)?;
    if n != 6 {
        return Err(ScanError::Invalid(
            "expected [\"PING\", hostname, salt, digest, username, password]",
        ));
    }
    let kind = c.str_or_bin(MAX_HANDSHAKE_BYTES)?;
    if &b[kind] != b"PING" {
        return Err(ScanError::Invalid("expected PING"));
    }
    let mut f: [std::ops::Range<usize>; 5] = Default::default();
    for r in &mut f {
        *r = c.str_or_bin(MAX_HANDSHAKE_BYTES)?;
    }
    Ok((c.pos, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn security() -> Security {
        Security {
            shared_key: "k".into(),
            self_hostname: "h".into(),
            users: Vec::new(),
        }
    }

    /// A port check that connects and closes, whether its close arrives
    /// as an end of stream or as a reset, is not a failed handshake (it
    /// was counted as one when the reset was read first).
    #[tokio::test]
    async fn a_probe_that_connects_and_resets_is_no_failed_handshake() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        for reset in [false, true] {
            let client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            if reset {
                client.set_zero_linger().unwrap();
            }
            drop(client);
            // Let the close or reset reach the server before it writes
            // HELO, as it does when the probe is quicker than the accept.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (mut rd, mut wr) = tokio::io::split(server);
            let mut buf = BytesMut::new();
            let got = handshake(
                &mut rd,
                &mut wr,
                &mut buf,
                &security(),
                Duration::from_secs(5),
            )
            .await;
            assert_eq!(got, Err(String::new()), "reset: {reset}");
        }
    }

    /// A client that sent part of a PING and then vanished is a failure.
    #[tokio::test]
    async fn a_client_gone_inside_ping_is_a_failed_handshake() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(&[0x96, 0xa4, b'P']).await.unwrap();
        drop(client);
        let (mut rd, mut wr) = tokio::io::split(server);
        let mut buf = BytesMut::new();
        let got = handshake(
            &mut rd,
            &mut wr,
            &mut buf,
            &security(),
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(got, Err(ref why) if !why.is_empty()), "{got:?}");
    }
}
