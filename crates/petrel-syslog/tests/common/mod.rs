//! Drives a `Framer` the way a receiver does, checking its contract on the
//! way.

use petrel_syslog::{Frame, Framer, Framing};

/// What a stream gave: each frame's bytes and truncation, and the garbage
/// count.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed {
    pub frames: Vec<(Vec<u8>, bool)>,
    pub garbage: u64,
}

/// Feeds `data` to a new framer in chunks of the given sizes (the last
/// chunk takes whatever is left; eof is given with it), keeping unconsumed
/// bytes like a receive buffer. Asserts the framer's contract: consumed
/// within the buffer, frames non-empty, within the consumed prefix, in
/// order and not overlapping, everything consumed at eof, and the buffer
/// never growing past `max + slack` beyond one chunk.
pub fn feed(framing: Framing, max: usize, data: &[u8], chunks: &[usize]) -> Framed {
    let mut framer = Framer::new(framing, max);
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<Frame> = Vec::new();
    let mut got = Vec::new();
    let mut at = 0;
    let mut sizes = chunks.iter().copied();
    loop {
        let n = sizes.next().unwrap_or(usize::MAX).min(data.len() - at);
        let eof = at + n == data.len();
        buf.extend_from_slice(&data[at..at + n]);
        at += n;
        out.clear();
        let consumed = framer.frames(&buf, eof, &mut out);
        assert!(
            consumed <= buf.len(),
            "consumed {consumed} of {}",
            buf.len()
        );
        let mut prev_end = 0;
        for f in &out {
            assert!(!f.range.is_empty(), "empty frame {f:?}");
            assert!(
                f.range.start >= prev_end && f.range.end <= consumed,
                "frame {f:?} after {prev_end}, consumed {consumed}"
            );
            prev_end = f.range.end;
            got.push((buf[f.range.clone()].to_vec(), f.truncated));
        }
        buf.drain(..consumed);
        if eof {
            assert!(buf.is_empty(), "{} bytes left at eof", buf.len());
            break;
        }
        // A length prefix (11 bytes) and the max-size message at most, or
        // a newline frame's max + 2 bytes, plus the chunk just read.
        assert!(
            buf.len() <= max.saturating_add(12).saturating_add(n),
            "buffered {} with max {max}",
            buf.len()
        );
    }
    Framed {
        frames: got,
        garbage: framer.garbage_bytes(),
    }
}

/// The whole of `data` at once.
pub fn whole(framing: Framing, max: usize, data: &[u8]) -> Framed {
    feed(framing, max, data, &[])
}
