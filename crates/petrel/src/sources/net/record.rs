//! How a [`Block`] is stored as one spool record.
//!
//! ```text
//! kind: u8                 1 = length-prefixed text frames, 2 = newline-ended lines,
//!                          3 = length-prefixed JSON objects
//! received_ns: i64 LE
//! peer_len: u16 LE, peer bytes
//! kind 1: (len: u32 LE, frame bytes)*
//! kind 2: lines, each ending with '\n' (written by `petrel pipe`)
//! ```
//! Decoding borrows the frames from the buffer the spool reader read, so
//! replay costs no copy.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use petrel_core::Span;

use super::Block;

const FRAMED: u8 = 1;
const LINES: u8 = 2;
const FRAMED_JSON: u8 = 3;

/// Appends the record of `block` to `out`.
pub fn encode(block: &Block, out: &mut Vec<u8>) {
    out.push(if block.json { FRAMED_JSON } else { FRAMED });
    out.extend_from_slice(&block.received_ns.to_le_bytes());
    encode_peer(block.peer.as_deref(), out);
    let frames_len: usize = block.frames.iter().map(|s| s.len as usize + 4).sum();
    out.reserve(frames_len);
    for s in &block.frames {
        let f = s.get(&block.buf);
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
}

/// Appends the header of a record of complete lines, which the caller
/// follows with the lines themselves.
pub fn encode_lines_header(received_ns: i64, peer: Option<&str>, out: &mut Vec<u8>) {
    out.push(LINES);
    out.extend_from_slice(&received_ns.to_le_bytes());
    encode_peer(peer, out);
}

fn encode_peer(peer: Option<&str>, out: &mut Vec<u8>) {
    let p = peer.unwrap_or("").as_bytes();
    let p = &p[..p.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(p.len() as u16).to_le_bytes());
    out.extend_from_slice(p);
}

/// A record that does not follow the format (a spool written by something
/// else, or damaged in a way its checksum did not catch).
#[derive(Debug)]
pub struct BadRecord;

/// Decodes the record at `range` of `buf` into a block over `buf`.
/// `peers` caches peer names so a long stream from one peer shares one.
pub fn decode(
    buf: &Bytes,
    range: Range<usize>,
    peers: &mut Option<Arc<str>>,
) -> Result<Block, BadRecord> {
    let rec = buf.get(range.clone()).ok_or(BadRecord)?;
    let (&kind, rest) = rec.split_first().ok_or(BadRecord)?;
    let ts: [u8; 8] = rest
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(BadRecord)?;
    let received_ns = i64::from_le_bytes(ts);
    let plen = rest
        .get(8..10)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or(BadRecord)?;
    let peer_bytes = rest.get(10..10 + plen).ok_or(BadRecord)?;
    let peer = if peer_bytes.is_empty() {
        None
    } else {
        match peers {
            Some(p) if p.as_bytes() == peer_bytes => Some(p.clone()),
            _ => {
                let p: Arc<str> = String::from_utf8_lossy(peer_bytes).into();
                *peers = Some(p.clone());
                Some(p)
            }
        }
    };
    let body_start = range.start + 1 + 10 + plen;
    let body = buf.get(body_start..range.end).ok_or(BadRecord)?;
    let mut frames = Vec::new();
    match kind {
        FRAMED | FRAMED_JSON => {
            let mut p = 0;
            while p < body.len() {
                let len = body
                    .get(p..p + 4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or(BadRecord)?;
                let start = p + 4;
                if start + len > body.len() {
                    return Err(BadRecord);
                }
                frames.push(Span::new(body_start + start, len));
                p = start + len;
            }
        }
        LINES => {
            let mut start = 0;
            for nl in memchr::memchr_iter(b'\n', body) {
                frames.push(Span::new(body_start + start, nl - start));
                start = nl + 1;
            }
            if start < body.len() {
                frames.push(Span::new(body_start + start, body.len() - start));
            }
        }
        _ => return Err(BadRecord),
    }
    Ok(Block {
        buf: buf.clone(),
        frames,
        peer,
        received_ns,
        json: kind == FRAMED_JSON,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_blocks_and_line_records_round_trip() {
        let data = Bytes::from_static(b"<13>one\nxx<14>two with\nnewline");
        let block = Block {
            buf: data.clone(),
            frames: vec![Span::new(0, 7), Span::new(10, 20)],
            peer: Some("127.0.0.1:5000".into()),
            received_ns: 42,
            json: true,
        };
        let mut rec = vec![9, 9];
        encode(&block, &mut rec);
        encode_lines_header(7, None, &mut rec);
        let lines_at = rec.len();
        rec.extend_from_slice(b"a\nbb\nlast");
        let buf = Bytes::from(rec);
        let mut cache = None;
        // The first record starts after two bytes of something else.
        let b = decode(&buf, 2..lines_at - 11, &mut cache).unwrap();
        let got: Vec<&[u8]> = b.frames.iter().map(|s| s.get(&b.buf)).collect();
        assert_eq!(got, vec![&b"<13>one"[..], b"<14>two with\nnewline"]);
        assert_eq!(b.peer.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(b.received_ns, 42);
        assert!(b.json);
        let l = decode(&buf, lines_at - 11..buf.len(), &mut cache).unwrap();
        let got: Vec<&[u8]> = l.frames.iter().map(|s| s.get(&l.buf)).collect();
        assert_eq!(got, vec![&b"a"[..], b"bb", b"last"]);
        assert_eq!(l.peer, None);
        assert_eq!(l.received_ns, 7);
        assert!(!l.json);
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let mut cache = None;
        for bad in [
            &b""[..],
            b"\x01",
            b"\x01\0\0\0\0\0\0\0\0\xff\xff",
            b"\x01\0\0\0\0\0\0\0\0\0\0\x10\0\0\0abc",
            b"\x07\0\0\0\0\0\0\0\0\0\0",
        ] {
            let buf = Bytes::copy_from_slice(bad);
            assert!(decode(&buf, 0..buf.len(), &mut cache).is_err(), "{bad:?}");
        }
    }
}
