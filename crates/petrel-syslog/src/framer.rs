//! RFC 6587 framing of syslog over stream transports (TCP, TLS, Unix
//! stream sockets): octet counting and newline ("non-transparent")
//! framing.

use crate::Range;

/// How messages are delimited in a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Decided per frame, as RFC 6587 suggests for receivers: a frame that
    /// starts with an ASCII digit is octet-counted, anything else is
    /// newline-terminated (an RFC 5424 or 3164 message starts with `<`).
    /// Lets one listener serve senders of both kinds.
    Auto,
    /// `MSG-LEN SP MSG` only (RFC 6587 3.4.1 / RFC 5425). `\r`, `\n` and
    /// NUL bytes between frames are skipped, as some senders add them.
    OctetCounting,
    /// Messages ended by `\n` (a `\r` before it is dropped) or NUL (RFC
    /// 6587 3.4.2, as rsyslog, syslog-ng and most appliances send).
    Newline,
}

/// A message found by [`Framer::frames`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The message's bytes in the buffer given to [`Framer::frames`],
    /// without the length prefix or terminator. Never empty.
    pub range: Range,
    /// The message was longer than the framer's maximum (or, at the end of
    /// the stream, cut short): `range` holds only its first bytes.
    pub truncated: bool,
}

/// Where the framer is between calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start of a frame.
    Start,
    /// Skipping the rest of an oversize octet-counted frame: bytes left.
    SkipBytes(u64),
    /// Skipping to the next terminator: after an oversize newline frame, or
    /// (`garbage`) to resynchronise after bytes that are not a frame.
    SkipLine { garbage: bool },
}

/// Splits a byte stream into syslog frames, keeping only a little state
/// between calls so that the caller owns all buffering.
///
/// Oversize frames are delivered truncated and the rest is skipped as it
/// arrives, so memory stays bounded by `max_message_bytes` (plus a few
/// bytes) whatever the sender does.
///
/// Bytes that cannot be framed (an octet count that is not a number, has
/// more than 10 digits, a leading zero or no space after it) are skipped up
/// to and including the next `\n` or NUL, where framing resumes; they are
/// counted in [`Framer::garbage_bytes`] rather than reported per call,
/// since a receiver only logs or exports that count.
#[derive(Clone, Debug)]
pub struct Framer {
    framing: Framing,
    max: usize,
    state: State,
    garbage: u64,
    bad_frames: u64,
    /// How many bytes at the start of the next buffer belong to an
    /// unterminated newline frame and were already searched for its
    /// terminator: without this, a long line arriving in small pieces would
    /// be searched again from its start on every call (quadratic).
    scanned: usize,
}

impl Framer {
    /// A framer for `framing` that truncates messages longer than
    /// `max_message_bytes` (at least 1; 0 is taken as 1).
    pub fn new(framing: Framing, max_message_bytes: usize) -> Self {
        Self {
            framing,
            max: max_message_bytes.max(1),
            state: State::Start,
            garbage: 0,
            bad_frames: 0,
            scanned: 0,
        }
    }

    /// Bytes skipped so far because they could not be framed (see
    /// [`Framer`]). The skipped rest of oversize frames is not counted.
    pub fn garbage_bytes(&self) -> u64 {
        self.garbage
    }

    /// How many times framing was lost (a length prefix that is not one,
    /// or one cut by the end of the stream): each is one skipped run of
    /// [`Framer::garbage_bytes`]. Receivers count these as bad frames.
    pub fn bad_frames(&self) -> u64 {
        self.bad_frames
    }

    /// Finds the complete frames at the start of `buf` (the caller's
    /// receive buffer; data not consumed is kept by the caller and given
    /// again, followed by more bytes). Pushes them to `out` and returns how
    /// many bytes of `buf` were consumed; every frame lies within that
    /// prefix, in order, without overlap.
    ///
    /// At `eof` (no more bytes will come) everything is consumed: an
    /// unterminated newline-framed tail is a frame too, an incomplete
    /// octet-counted frame is delivered with `truncated` set, and an
    /// incomplete length prefix is garbage.
    ///
    /// A frame longer than the maximum is delivered truncated to it as
    /// soon as that is certain: with octet counting once `max` bytes of it
    /// are in `buf`; with newline framing once `max + 2` bytes are without
    /// a terminator (a `\r` before the `\n` is not part of the message).
    /// Its rest is skipped, across calls, without being buffered. Empty
    /// newline-framed lines are skipped.
    pub fn frames(&mut self, buf: &[u8], eof: bool, out: &mut Vec<Frame>) -> usize {
        let mut pos = 0;
        // Only valid for the frame at the very start of `buf`.
        let mut scanned = std::mem::take(&mut self.scanned);
        loop {
            let rest = buf.get(pos..).unwrap_or_default();
            match self.state {
                State::SkipBytes(n) => {
                    let avail = rest.len() as u64;
                    if avail < n {
                        self.state = if eof {
                            State::Start
                        } else {
                            State::SkipBytes(n - avail)
                        };
                        return buf.len();
                    }
                    // n <= avail, which is a usize.
                    pos += n as usize;
                    self.state = State::Start;
                }
                State::SkipLine { garbage } => match memchr::memchr2(b'\n', 0, rest) {
                    Some(i) => {
                        if garbage {
                            self.garbage += i as u64 + 1;
                        }
                        pos += i + 1;
                        self.state = State::Start;
                    }
                    None => {
                        if garbage {
                            self.garbage += rest.len() as u64;
                        }
                        if eof {
                            self.state = State::Start;
                        }
                        return buf.len();
                    }
                },
                State::Start => {
                    let Some(&first) = rest.first() else {
                        return pos;
                    };
                    let step = match self.framing {
                        Framing::OctetCounting if matches!(first, b'\n' | b'\r' | 0) => Some(1),
                        Framing::OctetCounting => self.octet(rest, pos, eof, out),
                        Framing::Auto if first.is_ascii_digit() => self.octet(rest, pos, eof, out),
                        Framing::Auto | Framing::Newline => self.line(rest, pos, eof, scanned, out),
                    };
                    scanned = 0;
                    match step {
                        Some(n) => pos += n,
                        None => return pos,
                    }
                }
            }
        }
    }

    /// An octet-counted frame at the start of `rest` (at `base` in the
    /// caller's buffer). Returns the bytes consumed, or `None` to wait for
    /// more. Garbage switches to resynchronisation and consumes nothing.
    fn octet(
        &mut self,
        rest: &[u8],
        base: usize,
        eof: bool,
        out: &mut Vec<Frame>,
    ) -> Option<usize> {
        let mut n = 0;
        let mut len: u64 = 0;
        loop {
            match rest.get(n) {
                Some(&c) if c.is_ascii_digit() && n < 10 && !(n == 0 && c == b'0') => {
                    len = len * 10 + u64::from(c - b'0');
                    n += 1;
                }
                Some(b' ') if n > 0 => break,
                Some(_) => {
                    self.bad_frames += 1;
                    self.state = State::SkipLine { garbage: true };
                    return Some(0);
                }
                None if eof => {
                    self.bad_frames += 1;
                    self.garbage += rest.len() as u64;
                    return Some(rest.len());
                }
                None => return None,
            }
        }
        let start = n + 1;
        let avail = rest.len() - start;
        let (take, truncated) = match usize::try_from(len) {
            Ok(l) if l <= self.max => (l, false),
            _ => (self.max, true),
        };
        if avail >= take {
            out.push(Frame {
                range: base + start..base + start + take,
                truncated,
            });
            if truncated {
                // len > max == take here.
                self.state = State::SkipBytes(len - take as u64);
            }
            Some(start + take)
        } else if eof {
            if avail == 0 {
                self.bad_frames += 1;
                self.garbage += rest.len() as u64;
            } else {
                out.push(Frame {
                    range: base + start..base + rest.len(),
                    truncated: true,
                });
            }
            Some(rest.len())
        } else {
            None
        }
    }

    /// A newline-terminated frame at the start of `rest` (at `base` in the
    /// caller's buffer), whose first `scanned` bytes are known to hold no
    /// terminator. Returns the bytes consumed, or `None` to wait for more.
    fn line(
        &mut self,
        rest: &[u8],
        base: usize,
        eof: bool,
        scanned: usize,
        out: &mut Vec<Frame>,
    ) -> Option<usize> {
        // Looking further than max + 2 bytes is pointless: by then the
        // frame is oversize whatever follows.
        let window = rest.len().min(self.max.saturating_add(2));
        let from = scanned.min(window);
        let hay = rest.get(from..window).unwrap_or_default();
        let (len, consumed) = match memchr::memchr2(b'\n', 0, hay) {
            Some(i) => (from + i, from + i + 1),
            None if rest.len() >= self.max.saturating_add(2) => {
                // No terminator within max + 2 bytes: oversize.
                out.push(Frame {
                    range: base..base + self.max,
                    truncated: true,
                });
                self.state = State::SkipLine { garbage: false };
                return Some(self.max);
            }
            None if eof => (rest.len(), rest.len()),
            None => {
                self.scanned = rest.len();
                return None;
            }
        };
        let len = if len > 0 && rest.get(len - 1) == Some(&b'\r') {
            len - 1
        } else {
            len
        };
        if len > 0 {
            out.push(Frame {
                range: base..base + len.min(self.max),
                truncated: len > self.max,
            });
        }
        Some(consumed)
    }
}
