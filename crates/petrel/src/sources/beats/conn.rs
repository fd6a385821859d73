//! One Lumberjack connection: frames cut from what is read, the window's
//! events handed to the intake in parts, and `A` (ACK) frames written back
//! in order once each part is safe.
//!
//! Frames, all integers big-endian (`V` is the version, `1` or `2`):
//! `V W count`, `V J seq len json`, `V D seq pairs (klen key vlen value)*`,
//! `V C len zlib(frames)`; the server answers `V A seq`.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use petrel_core::Span;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::BeatsCounters;
use crate::sources::net::intake::{Admission, Intake};
use crate::sources::net::stream::Connection;
use crate::sources::net::{now_ns, Block};

/// A window's events are handed over in parts of about this size, each
/// acknowledged on its own: memory per connection stays bounded whatever
/// the window size.
const PART_BYTES: usize = 1 << 20;

/// Parts whose acknowledgement is pending on one connection; a client
/// with more in flight waits (its writes stop being read).
const MAX_PENDING_ACKS: usize = 256;

/// While a part waits for its sinks, the last acknowledged sequence number
/// is sent again this often: a client (Filebeat: `timeout: 30s`) counts
/// any ACK as progress and does not give up on a slow pipeline.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// What every connection of a source shares.
pub(super) struct Shared {
    /// `max_frame_bytes`.
    pub max: usize,
    /// Counters.
    pub counters: BeatsCounters,
    /// The source's key, for logs.
    pub key: Arc<str>,
}

/// One frame at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// `W`: the number of events that follow.
    Window(u32),
    /// `J`: a JSON document at this range of the frame.
    Json { seq: u32, payload: (usize, usize) },
    /// `D`: key/value pairs starting at this offset of the frame.
    Pairs { seq: u32, count: u32, at: usize },
    /// `C`: zlib data at this range of the frame.
    Compressed((usize, usize)),
}

/// Why a frame cannot be read.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    /// Not a frame of this protocol.
    Invalid(&'static str),
    /// Over `max_frame_bytes`.
    TooLarge,
}

/// Reads the frame at the start of `b`: `Ok(None)` when more bytes are
/// needed, else the frame's version, length and kind.
fn frame(b: &[u8], max: usize) -> Result<Option<(u8, usize, Frame)>, Bad> {
    if b.len() < 2 {
        return Ok(None);
    }
    let version = b[0];
    if version != b'1' && version != b'2' {
        return Err(Bad::Invalid("not a Lumberjack frame (version byte)"));
    }
    let u32_at = |i: usize| -> Option<u32> {
        b.get(i..i + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    let sized = |header: usize, len: u32| -> Result<Option<usize>, Bad> {
        let len = len as usize;
        if len > max {
            return Err(Bad::TooLarge);
        }
        Ok((b.len() >= header + len).then_some(header + len))
    };
    match b[1] {
        b'W' => Ok(u32_at(2).map(|n| (version, 6, Frame::Window(n)))),
        b'J' => {
            let (Some(seq), Some(len)) = (u32_at(2), u32_at(6)) else {
                return Ok(None);
            };
            let end = sized(10, len)?;
            // Refused when it arrives, as other invalid data: the parser
            // could only keep it as one unparsed message.
            if end.is_some_and(|end| {
                petrel_core::json::nesting_exceeds(&b[10..end], petrel_core::json::MAX_JSON_DEPTH)
            }) {
                return Err(Bad::Invalid("a JSON event nested deeper than 64 levels"));
            }
            Ok(end.map(|end| {
                (
                    version,
                    end,
                    Frame::Json {
                        seq,
                        payload: (10, end),
                    },
                )
            }))
        }
        b'C' => {
            let Some(len) = u32_at(2) else {
                return Ok(None);
            };
            Ok(sized(6, len)?.map(|end| (version, end, Frame::Compressed((6, end)))))
        }
        b'D' => {
            let (Some(seq), Some(count)) = (u32_at(2), u32_at(6)) else {
                return Ok(None);
            };
            let mut at = 10usize;
            for _ in 0..count {
                for _ in 0..2 {
                    let Some(len) = u32_at(at) else {
                        return Ok(None);
                    };
                    at += 4 + len as usize;
                    if at > max {
                        return Err(Bad::TooLarge);
                    }
                }
            }
            if b.len() < at {
                return Ok(None);
            }
            Ok(Some((version, at, Frame::Pairs { seq, count, at: 10 })))
        }
        _ => Err(Bad::Invalid("unknown Lumberjack frame type")),
    }
}

/// A v1 key/value data frame's pairs as a JSON object appended to `out`
/// (`line`, logstash-forwarder's message, becomes `message`, as Logstash
/// reads it). Keys and values are text; bytes that are not UTF-8 are
/// replaced.
fn pairs_to_json(b: &[u8], mut at: usize, count: u32, out: &mut BytesMut) {
    let mut obj = serde_json::Map::with_capacity(count as usize);
    let next = |at: &mut usize| -> String {
        let len = u32::from_be_bytes([b[*at], b[*at + 1], b[*at + 2], b[*at + 3]]) as usize;
        let s = String::from_utf8_lossy(&b[*at + 4..*at + 4 + len]).into_owned();
        *at += 4 + len;
        s
    };
    for _ in 0..count {
        let k = next(&mut at);
        let v = next(&mut at);
        let k = if k == "line" {
            "message".to_string()
        } else {
            k
        };
        obj.insert(k, serde_json::Value::String(v));
    }
    // Writing a map of strings into memory does not fail.
    let _ = serde_json::to_writer(bytes::BufMut::writer(out), &obj);
}

/// A JSON data frame must hold an object; parsed in full when decoded.
fn looks_like_object(p: &[u8]) -> bool {
    let t = p.trim_ascii();
    t.first() == Some(&b'{') && t.last() == Some(&b'}')
}

/// Where the events of the part being gathered live.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// Spans of the read buffer (uncompressed JSON frames: no copy).
    Read,
    /// Spans of `side` (inflated and converted frames).
    Side,
}

/// The part of a window being gathered.
struct Part {
    backing: Backing,
    frames: Vec<Span>,
    bytes: usize,
    /// Sequence number of its last event: what its ACK says.
    last_seq: u32,
}

/// An acknowledgement waiting for its part to be safe.
struct Pending {
    version: u8,
    /// Which window of the connection the part belongs to.
    window: u64,
    seq: u32,
    done: oneshot::Receiver<Admission>,
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
    let (mut rd, wr) = tokio::io::split(io);
    let (ack_tx, ack_rx) = mpsc::channel(MAX_PENDING_ACKS);
    // The writer says when a part was not accepted: the window cannot be
    // acknowledged any further, so the connection closes and the client
    // sends the rest again.
    let (abort_tx, mut abort_rx) = oneshot::channel::<()>();
    let writer = tokio::spawn(write_acks(wr, ack_rx, abort_tx));
    // Grown as data arrives (see `read_room`): an idle connection holds
    // half a KiB, a busy one reads 64 KiB at a time.
    let mut buf = BytesMut::new();
    let mut last_read = 0usize;
    let mut side = BytesMut::new();
    let mut pos = 0usize;
    let mut part = Part {
        backing: Backing::Read,
        frames: Vec::new(),
        bytes: 0,
        last_seq: 0,
    };
    // Events still expected in the current window, and its number.
    let mut remaining = 0u64;
    let mut window = 0u64;
    let mut version = b'2';
    let mut inflated = Vec::new();
    'conn: loop {
        let mut close = false;
        loop {
            let (v, len, f) = match frame(&buf[pos..], sh.max) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(bad) => {
                    let (counter, why) = match bad {
                        Bad::TooLarge => (
                            &sh.counters.too_large,
                            "a frame is larger than max_frame_bytes",
                        ),
                        Bad::Invalid(why) => (&sh.counters.invalid, why),
                    };
                    refuse(&sh, &peer, counter, why);
                    close = true;
                    break;
                }
            };
            let start = pos;
            pos += len;
            match f {
                Frame::Window(n) => {
                    // A new window before the last one ended: what arrived
                    // of it is acknowledged, as far as it went.
                    if !flush(
                        &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx, version,
                        window,
                    )
                    .await
                    {
                        break 'conn;
                    }
                    window += 1;
                    remaining = u64::from(n);
                    version = v;
                }
                _ if remaining == 0 => {
                    refuse(
                        &sh,
                        &peer,
                        &sh.counters.invalid,
                        "a data frame outside a window (no `W` frame before it)",
                    );
                    close = true;
                    break;
                }
                Frame::Json { seq, payload } => {
                    let p = (start + payload.0, start + payload.1);
                    if !looks_like_object(&buf[p.0..p.1]) {
                        refuse(
                            &sh,
                            &peer,
                            &sh.counters.invalid,
                            "a JSON data frame does not hold a JSON object",
                        );
                        close = true;
                        break;
                    }
                    if part.backing != Backing::Read
                        && !flush(
                            &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx,
                            version, window,
                        )
                        .await
                    {
                        break 'conn;
                    }
                    // Only a part of `side` was flushed: the read buffer
                    // is as it was.
                    part.backing = Backing::Read;
                    part.frames.push(Span::new(p.0, p.1 - p.0));
                    part.bytes += len;
                    part.last_seq = seq;
                    remaining -= 1;
                }
                Frame::Pairs { seq, count, at } => {
                    // Converted before a flush of the read buffer cuts it
                    // (`side` is empty unless it backs the part).
                    let begin = side.len();
                    pairs_to_json(&buf[start..pos], at, count, &mut side);
                    if part.backing != Backing::Side
                        && !flush(
                            &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx,
                            version, window,
                        )
                        .await
                    {
                        break 'conn;
                    }
                    part.backing = Backing::Side;
                    part.frames.push(Span::new(begin, side.len() - begin));
                    part.bytes += side.len() - begin;
                    part.last_seq = seq;
                    remaining -= 1;
                }
                Frame::Compressed(range) => {
                    inflated.clear();
                    let z = &buf[start + range.0..start + range.1];
                    let mut dec = flate2::read::ZlibDecoder::new(z).take(sh.max as u64 + 1);
                    if dec.read_to_end(&mut inflated).is_err() {
                        refuse(
                            &sh,
                            &peer,
                            &sh.counters.inflate_failed,
                            "a compressed frame does not inflate (zlib)",
                        );
                        close = true;
                        break;
                    }
                    if inflated.len() > sh.max {
                        refuse(
                            &sh,
                            &peer,
                            &sh.counters.too_large,
                            "a compressed frame inflates to more than max_frame_bytes",
                        );
                        close = true;
                        break;
                    }
                    if part.backing != Backing::Side
                        && !flush(
                            &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx,
                            version, window,
                        )
                        .await
                    {
                        break 'conn;
                    }
                    part.backing = Backing::Side;
                    // The inflated frames are copied once, whole, into
                    // `side`; the events are spans of them.
                    let base = side.len();
                    side.extend_from_slice(&inflated);
                    let mut at = 0usize;
                    let mut failed = None;
                    while at < inflated.len() {
                        match frame(&inflated[at..], sh.max) {
                            Ok(Some((_, len, Frame::Json { seq, payload }))) => {
                                let p = &inflated[at + payload.0..at + payload.1];
                                if !looks_like_object(p) {
                                    failed = Some((
                                        &sh.counters.invalid,
                                        "a JSON data frame does not hold a JSON object",
                                    ));
                                    break;
                                }
                                part.frames.push(Span::new(base + at + payload.0, p.len()));
                                part.bytes += len;
                                part.last_seq = seq;
                                at += len;
                            }
                            Ok(Some((
                                _,
                                len,
                                Frame::Pairs {
                                    seq,
                                    count,
                                    at: pairs,
                                },
                            ))) => {
                                let begin = side.len();
                                pairs_to_json(&inflated[at..at + len], pairs, count, &mut side);
                                part.frames.push(Span::new(begin, side.len() - begin));
                                part.bytes += len;
                                part.last_seq = seq;
                                at += len;
                            }
                            Ok(Some(_)) => {
                                failed = Some((
                                    &sh.counters.invalid,
                                    "a compressed frame may hold data frames only",
                                ));
                                break;
                            }
                            Ok(None) => {
                                failed = Some((
                                    &sh.counters.invalid,
                                    "a compressed frame ends inside a data frame",
                                ));
                                break;
                            }
                            Err(Bad::TooLarge) => {
                                failed = Some((
                                    &sh.counters.too_large,
                                    "a frame is larger than max_frame_bytes",
                                ));
                                break;
                            }
                            Err(Bad::Invalid(why)) => {
                                failed = Some((&sh.counters.invalid, why));
                                break;
                            }
                        }
                        remaining = remaining.saturating_sub(1);
                    }
                    if let Some((counter, why)) = failed {
                        // The frames before the bad one are kept and
                        // acknowledged; the client resends the rest.
                        refuse(&sh, &peer, counter, why);
                        close = true;
                        break;
                    }
                }
            }
            let full = part.bytes >= PART_BYTES || (remaining == 0 && !part.frames.is_empty());
            if full
                && !flush(
                    &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx, version,
                    window,
                )
                .await
            {
                break 'conn;
            }
        }
        if close {
            let _ = flush(
                &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx, version, window,
            )
            .await;
            break;
        }
        if part.frames.is_empty() || part.backing == Backing::Side {
            // Nothing of the read buffer is kept: what was parsed goes.
            buf.advance(pos);
            pos = 0;
        }
        crate::sources::net::stream::read_room(&mut buf, last_read);
        let read = tokio::select! {
            r = tokio::time::timeout(idle, rd.read_buf(&mut buf)) => r,
            _ = stop.changed() => break,
            _ = &mut abort_rx => break,
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
                        "the connection closed inside a frame",
                    );
                }
                let _ = flush(
                    &mut part, &mut buf, &mut pos, &mut side, &intake, &peer, &ack_tx, version,
                    window,
                )
                .await;
                break;
            }
            Ok(Ok(n)) => last_read = n,
        }
    }
    // Acknowledgements of what was accepted are still written, while the
    // client listens.
    drop(ack_tx);
    let _ = tokio::time::timeout(idle, writer).await;
    counters.connections.dec();
}

/// Hands the gathered part over and queues its ACK. `false` once the
/// source stops or the connection's writer ended.
#[allow(clippy::too_many_arguments)]
async fn flush(
    part: &mut Part,
    buf: &mut BytesMut,
    pos: &mut usize,
    side: &mut BytesMut,
    intake: &Intake,
    peer: &Arc<str>,
    acks: &mpsc::Sender<Pending>,
    version: u8,
    window: u64,
) -> bool {
    if part.frames.is_empty() {
        return true;
    }
    let data = match part.backing {
        Backing::Read => {
            let d = buf.split_to(*pos).freeze();
            *pos = 0;
            d
        }
        Backing::Side => side.split().freeze(),
    };
    let block = Block {
        buf: data,
        frames: std::mem::take(&mut part.frames),
        peer: Some(peer.clone()),
        received_ns: now_ns(),
        json: true,
    };
    part.bytes = 0;
    let Some(done) = intake.submit_acked(block).await else {
        return false;
    };
    acks.send(Pending {
        version,
        window,
        seq: part.last_seq,
        done,
    })
    .await
    .is_ok()
}

/// Counts and logs a refused frame (the connection is then closed: after
/// garbage, where the next frame starts is unknown).
fn refuse(sh: &Shared, peer: &str, counter: &petrel_core::LazyCounter, why: &str) {
    counter.inc();
    tracing::warn!(source = %sh.key, %peer, reason = why, "beats: refused a frame; closing the connection (the window's earlier events are kept)");
}

fn ack_frame(version: u8, seq: u32) -> [u8; 6] {
    let s = seq.to_be_bytes();
    [version, b'A', s[0], s[1], s[2], s[3]]
}

/// Writes each part's ACK once it is safe, in order, and keep-alive ACKs
/// while one waits. A part that is not accepted (the buffer dropped it,
/// or the source stops) ends the acknowledgements of the connection.
async fn write_acks<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Pending>,
    abort: oneshot::Sender<()>,
) {
    // The window and sequence number last acknowledged.
    let mut last: Option<(u64, u32)> = None;
    while let Some(mut p) = rx.recv().await {
        let outcome = loop {
            match tokio::time::timeout(KEEPALIVE, &mut p.done).await {
                Ok(r) => break r,
                Err(_) => {
                    let seq = match last {
                        Some((w, s)) if w == p.window => s,
                        _ => 0,
                    };
                    if wr.write_all(&ack_frame(p.version, seq)).await.is_err()
                        || wr.flush().await.is_err()
                    {
                        return;
                    }
                }
            }
        };
        if !matches!(outcome, Ok(Admission::Accepted)) {
            let _ = abort.send(());
            return;
        }
        if wr.write_all(&ack_frame(p.version, p.seq)).await.is_err() || wr.flush().await.is_err() {
            return;
        }
        last = Some((p.window, p.seq));
    }
}

/// Everything `r` yields until its end.
#[cfg(test)]
async fn read_all<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v).await;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(seq: u32, doc: &str) -> Vec<u8> {
        let mut f = vec![b'2', b'J'];
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&(doc.len() as u32).to_be_bytes());
        f.extend_from_slice(doc.as_bytes());
        f
    }

    #[test]
    fn frames_are_cut_whole_or_asked_for() {
        let f = j(7, r#"{"a":1}"#);
        for cut in 0..f.len() {
            assert_eq!(frame(&f[..cut], 1024), Ok(None), "cut at {cut}");
        }
        assert_eq!(
            frame(&f, 1024),
            Ok(Some((
                b'2',
                f.len(),
                Frame::Json {
                    seq: 7,
                    payload: (10, f.len())
                }
            )))
        );
        assert_eq!(frame(&f, 4), Err(Bad::TooLarge));
        assert_eq!(
            frame(b"2W\0\0\x08\0", 10),
            Ok(Some((b'2', 6, Frame::Window(2048))))
        );
        assert!(matches!(frame(b"GET / HTTP/1.1", 10), Err(Bad::Invalid(_))));
        assert!(matches!(frame(b"2X", 10), Err(Bad::Invalid(_))));
    }

    #[test]
    fn json_nested_deeper_than_the_parser_goes_is_an_invalid_frame() {
        let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(frame(&j(1, &deep), 1 << 20), Err(Bad::Invalid(_))));
        let ok = format!(r#"{{"a":{}1{}}}"#, "[".repeat(60), "]".repeat(60));
        assert!(matches!(frame(&j(1, &ok), 1 << 20), Ok(Some(_))));
    }

    #[test]
    fn v1_pairs_become_a_json_object() {
        let mut f = vec![b'1', b'D', 0, 0, 0, 1, 0, 0, 0, 2];
        for s in ["line", "hello \"x\"", "file", "/var/log/a"] {
            f.extend_from_slice(&(s.len() as u32).to_be_bytes());
            f.extend_from_slice(s.as_bytes());
        }
        let (v, len, fr) = frame(&f, 1024).unwrap().unwrap();
        assert_eq!((v, len), (b'1', f.len()));
        let Frame::Pairs { seq, count, at } = fr else {
            panic!("{fr:?}")
        };
        assert_eq!((seq, count), (1, 2));
        let mut out = BytesMut::new();
        pairs_to_json(&f, at, count, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["message"], "hello \"x\"");
        assert_eq!(v["file"], "/var/log/a");
        // A pair whose length runs past the frame's end waits for more.
        assert_eq!(frame(&f[..f.len() - 1], 1024), Ok(None));
    }

    /// Random and mutated input never panics the frame reader, and every
    /// key/value frame it accepts converts to a JSON object.
    #[test]
    fn random_inputs() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut good = window(b'2', 2);
        good.extend(j(1, r#"{"a":1}"#));
        let mut d = vec![b'1', b'D', 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 4];
        d.extend_from_slice(b"line\0\0\0\x02hi");
        good.extend(&d);
        for round in 0..20_000 {
            let mut b = if round % 2 == 0 {
                let n = (next() % 64) as usize;
                (0..n).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                good.clone()
            };
            for _ in 0..(next() % 4) {
                if !b.is_empty() {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
            }
            let mut at = 0;
            while at < b.len() {
                match frame(&b[at..], 1 << 16) {
                    Ok(Some((_, len, f))) => {
                        assert!(len > 0 && at + len <= b.len());
                        if let Frame::Pairs { count, at: p, .. } = f {
                            let mut out = BytesMut::new();
                            pairs_to_json(&b[at..at + len], p, count, &mut out);
                            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                            assert!(v.is_object());
                        }
                        at += len;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }

    fn window(v: u8, n: u32) -> Vec<u8> {
        let mut f = vec![v, b'W'];
        f.extend_from_slice(&n.to_be_bytes());
        f
    }

    #[tokio::test]
    async fn a_refused_part_ends_the_acknowledgements() {
        let (client, server) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(8);
        let (abort_tx, abort_rx) = oneshot::channel();
        let w = tokio::spawn(write_acks(server, rx, abort_tx));
        let (d1, r1) = oneshot::channel();
        let (d2, r2) = oneshot::channel();
        let (d3, r3) = oneshot::channel();
        for (seq, done) in [(10, r1), (20, r2), (30, r3)] {
            tx.send(Pending {
                version: b'2',
                window: 1,
                seq,
                done,
            })
            .await
            .unwrap();
        }
        d1.send(Admission::Accepted).unwrap();
        d2.send(Admission::Full).unwrap();
        d3.send(Admission::Accepted).unwrap();
        drop(tx);
        w.await.unwrap();
        assert!(abort_rx.await.is_ok(), "the reader is told to close");
        let mut client = client;
        let got = read_all(&mut client).await;
        // Only the first part: acknowledging the third would cover the
        // second, which was not accepted.
        assert_eq!(got, ack_frame(b'2', 10));
    }
}
