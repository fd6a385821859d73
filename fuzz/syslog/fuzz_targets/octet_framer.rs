//! `octet_framer`: the first input byte picks the framing and maximum
//! message size, the next four the sizes of the chunks the stream is fed
//! in (repeated), the rest is the stream. Feeding it in chunks must give
//! the same frames and garbage count as feeding it whole, and the framer's
//! contract must hold on every call (consumed within the buffer, frames
//! non-empty, in order, within the consumed bytes; everything consumed at
//! eof; the buffer bounded by the maximum).
#![no_main]

use libfuzzer_sys::fuzz_target;
use petrel_syslog::{Frame, Framer, Framing};

/// Frames and garbage count.
type Framed = (Vec<(Vec<u8>, bool)>, u64);

fn feed(framing: Framing, max: usize, data: &[u8], chunks: &[usize]) -> Framed {
    let mut framer = Framer::new(framing, max);
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<Frame> = Vec::new();
    let mut got = Vec::new();
    let mut at = 0;
    let mut i = 0;
    loop {
        let n = if chunks.is_empty() {
            data.len() - at
        } else {
            chunks[i % chunks.len()].min(data.len() - at)
        };
        i += 1;
        let eof = at + n == data.len();
        buf.extend_from_slice(&data[at..at + n]);
        at += n;
        out.clear();
        let consumed = framer.frames(&buf, eof, &mut out);
        assert!(consumed <= buf.len());
        let mut prev_end = 0;
        for f in &out {
            assert!(!f.range.is_empty());
            assert!(f.range.start >= prev_end && f.range.end <= consumed);
            assert!(f.range.len() <= max.max(1));
            prev_end = f.range.end;
            got.push((buf[f.range.clone()].to_vec(), f.truncated));
        }
        buf.drain(..consumed);
        if eof {
            assert!(buf.is_empty());
            break;
        }
        assert!(buf.len() <= max.max(1) + 12 + n);
    }
    (got, framer.garbage_bytes())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (head, stream) = data.split_at(5);
    let framing = [Framing::Auto, Framing::OctetCounting, Framing::Newline][usize::from(head[0] % 3)];
    let max = usize::from(head[0] / 3) % 64;
    // Empty chunks (calls with no new bytes) are allowed, but not only
    // those: the stream must advance.
    let mut chunks: Vec<usize> = head[1..].iter().map(|&b| usize::from(b % 32)).collect();
    if chunks.iter().all(|&c| c == 0) {
        chunks = vec![1];
    }
    let whole = feed(framing, max, stream, &[]);
    let chunked = feed(framing, max, stream, &chunks);
    assert_eq!(whole, chunked);
});
