//! Syslog for Petrel: a zero-copy parser for RFC 5424 and RFC 3164 (BSD)
//! messages, and an RFC 6587 framer that splits a TCP/TLS/Unix stream into
//! messages.
//!
//! Both work on byte ranges into the caller's buffer rather than on owned
//! strings: a receiver reads into one buffer, [`Framer::frames`] finds the
//! frames in it, [`parse`] fills a reused [`Message`] with ranges into each
//! frame, and the caller copies out only the fields it keeps. Nothing is
//! allocated per message unless it carries structured data (the `Vec`s of
//! [`Message`] are reused, so even that stops once they have grown), and
//! UTF-8 is never validated (RFC 5424 allows any bytes in MSG, and real
//! RFC 3164 senders write whatever their locale gives them).
//!
//! # RFC 5424
//!
//! `<PRI>VERSION SP TIMESTAMP SP HOSTNAME SP APP-NAME SP PROCID SP MSGID SP
//! STRUCTURED-DATA [SP MSG]`, parsed strictly enough that a frame which is
//! not RFC 5424 is reported ([`ParseError::BadHeader`] names the field),
//! and leniently where real senders differ from the RFC without ambiguity:
//!
//! - Field lengths and character sets are not enforced (APP-NAME longer
//!   than 48 bytes is common with container names); a header field is
//!   whatever lies between two single spaces, and `-` is nil (`None`).
//! - TIMESTAMP is RFC 3339 with `T`/`t`, up to 9 fraction digits (further
//!   digits are ignored) and `Z`/`z` or `±hh:mm`. A well-formed time that
//!   `i64` nanoseconds cannot hold (outside 1677..2262) gives `None` rather
//!   than an error.
//! - STRUCTURED-DATA must be well formed: `-` or `[SD-ID PARAM="VALUE" ...]`
//!   elements; in values `"`, `\` and `]` must be escaped with `\`
//!   (another `\x` is kept as two literal bytes, as the RFC says). A broken
//!   one is [`ParseError::BadStructuredData`]. Several spaces between
//!   parameters are accepted.
//! - MSG loses a leading UTF-8 BOM.
//!
//! # RFC 3164
//!
//! There is no real grammar, so this is best effort: any frame that is not
//! empty and has no malformed `<PRI>` parses, with the fields that could be
//! recognised and the rest in `message`. See [`parse`] for the heuristics.
//!
//! # Writing
//!
//! [`writer`] writes RFC 5424 and RFC 3164 headers, structured data and
//! RFC 6587 frames, for the syslog sink; what it writes parses back here.
//!
//! # Framing
//!
//! [`Framer`] implements RFC 6587 octet counting (`LEN SP MSG`) and
//! newline ("non-transparent") framing, or picks per frame (see
//! [`Framing::Auto`]).

#![warn(missing_docs)]

mod framer;
mod rfc3164;
mod rfc5424;
pub mod writer;

pub use framer::{Frame, Framer, Framing};

use std::borrow::Cow;
use std::fmt;

/// A byte range into the frame given to [`parse`] (or, for [`Frame`], into
/// the buffer given to [`Framer::frames`]).
pub type Range = std::ops::Range<usize>;

/// Which syslog format [`parse`] expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// RFC 5424 when the frame starts with `<PRI>1 ` (the only defined
    /// version), RFC 3164 otherwise. Receivers that serve both kinds of
    /// sender on one port use this.
    Auto,
    /// RFC 5424 only: a frame that is not is an error.
    Rfc5424,
    /// RFC 3164 (best effort) only, even for frames that look like RFC 5424.
    Rfc3164,
}

/// The format a message was actually parsed as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// RFC 5424.
    Rfc5424,
    /// RFC 3164 / BSD syslog, or anything else read best effort.
    Rfc3164,
}

/// What parsing needs besides the frame: RFC 3164 timestamps carry neither
/// a zone nor a year.
#[derive(Clone, Debug)]
pub struct Context {
    /// The zone in which RFC 3164 timestamps without an offset are read
    /// (RFC 5424 timestamps always carry one).
    pub tz: petrel_time::TimeZone,
    /// The current time, nanoseconds since the Unix epoch, for inferring
    /// the year of RFC 3164 timestamps: the year that puts the time at most
    /// one day after `now_ns` (clocks disagree a little), so a 31 December
    /// message received on 1 January is from last year, and a 1 January
    /// message received late on 31 December (a sender in a zone ahead) is
    /// from next year. Passed in rather than read from the clock so that
    /// one clock read serves a whole batch and tests are reproducible.
    pub now_ns: i64,
}

impl Context {
    /// A context with `tz` and the current system time.
    pub fn now(tz: petrel_time::TimeZone) -> Self {
        let now_ns = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(_) => 0,
        };
        Self { tz, now_ns }
    }
}

/// One RFC 5424 SD-PARAM, with the SD-ID of its element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdParam {
    /// The SD-ID of the element the parameter belongs to (the same range
    /// for every parameter of one element, so elements that repeat an ID
    /// stay apart).
    pub id: Range,
    /// PARAM-NAME.
    pub name: Range,
    /// PARAM-VALUE without its quotes, still escaped (see `escaped`).
    pub value: Range,
    /// True when the value contains `\"`, `\\` or `\]`: the caller must
    /// pass it through [`unescape_sd_value`]. False means the raw bytes are
    /// the value, which is the common case and needs no copy.
    pub escaped: bool,
}

/// A parsed message: ranges into the frame given to [`parse`]. Reuse one
/// `Message` for many frames; [`parse`] clears it first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// The format the frame was parsed as (`None` only before the first
    /// parse, or after an error).
    pub flavor: Option<Flavor>,
    /// Facility (PRI / 8, 0..=23); `None` when the frame has no `<PRI>`.
    pub facility: Option<u8>,
    /// Severity (PRI % 8, 0..=7); `None` when the frame has no `<PRI>`.
    pub severity: Option<u8>,
    /// The message's time, nanoseconds since the Unix epoch (UTC); `None`
    /// for the nil value `-`, or an absent or unparsable RFC 3164 stamp.
    pub timestamp_ns: Option<i64>,
    /// HOSTNAME; `None` when nil (`-`) or absent.
    pub hostname: Option<Range>,
    /// APP-NAME (RFC 3164: the TAG); `None` when nil or absent.
    pub app_name: Option<Range>,
    /// PROCID (RFC 3164: the pid in `tag[pid]:`); `None` when nil or absent.
    pub proc_id: Option<Range>,
    /// MSGID (RFC 5424 only); `None` when nil or absent.
    pub msg_id: Option<Range>,
    /// Every SD-PARAM of every element, in order.
    pub sd: Vec<SdParam>,
    /// Every SD-ID in order, including those of elements without
    /// parameters (which `sd` cannot show).
    pub sd_ids: Vec<Range>,
    /// MSG: RFC 5424 without a leading BOM; for both formats without
    /// trailing `\r`, `\n` and NUL bytes. Empty (at the end of the frame)
    /// when there is none.
    pub message: Range,
}

impl Message {
    /// Empties every field, keeping the `Vec`s' capacity.
    fn clear(&mut self) {
        self.flavor = None;
        self.facility = None;
        self.severity = None;
        self.timestamp_ns = None;
        self.hostname = None;
        self.app_name = None;
        self.proc_id = None;
        self.msg_id = None;
        self.sd.clear();
        self.sd_ids.clear();
        self.message = 0..0;
    }
}

/// Why a frame could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Nothing but line terminators and NUL bytes.
    Empty,
    /// A `<` not followed by 1..=3 digits and `>`, or a value above 191;
    /// with [`Format::Rfc5424`] also a missing PRI.
    BadPri,
    /// RFC 5424 header field that is missing or malformed: `version`,
    /// `timestamp`, `hostname`, `app-name`, `procid` or `msgid`.
    BadHeader(&'static str),
    /// The RFC 5424 header parsed but STRUCTURED-DATA is missing or
    /// malformed.
    BadStructuredData,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("empty syslog message"),
            Self::BadPri => f.write_str("invalid syslog priority (<PRI>)"),
            Self::BadHeader(field) => write!(f, "invalid RFC 5424 header field {field}"),
            Self::BadStructuredData => f.write_str("invalid RFC 5424 structured data"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses one syslog frame (one message, without framing) into `out`.
///
/// `out` is cleared first and its `Vec`s reused. On `Err`, `out` keeps the
/// fields read before the error (an RFC 5424 header before
/// [`ParseError::BadStructuredData`], say); every range in it is within
/// `frame` either way.
///
/// Trailing `\r`, `\n` and NUL bytes are ignored everywhere (datagram
/// senders often append them). With [`Format::Auto`], a frame starting
/// with `<PRI>1 ` is RFC 5424, anything else RFC 3164.
///
/// RFC 3164 is read best effort, in this order (each step optional):
///
/// 1. `<PRI>`; then spaces are skipped.
/// 2. A Cisco IOS sequence number `123: ` (digits, colon, space), dropped,
///    and a Cisco `*` or `.` before the time (clock not synchronised).
/// 3. The timestamp: `Mmm dd hh:mm:ss` (day padded with a space or not,
///    optional fraction, optional year as `Mmm dd yyyy hh:mm:ss`) in
///    [`Context::tz`] with the year inferred (see [`Context::now_ns`]),
///    optionally followed by ` UTC`, ` GMT` or a numeric offset
///    ` +hh:mm`/` +hhmm`, which then take precedence over `tz`; or RFC 3339
///    / ISO 8601 (`2024-03-01T12:00:00Z`, as rsyslog's forwarding format
///    writes it; without an offset read in `tz`). A colon right after the
///    time (Cisco) is skipped. Anything else: no timestamp, and no hostname
///    is looked for (without a timestamp nothing marks where a header
///    would end).
/// 4. After a timestamp, the hostname: the next word, unless it ends with
///    `:`, contains `[` or starts with `%` (then it is the tag or a Cisco
///    message, and the sender wrote no hostname), or it is the last word
///    (then it is the message).
/// 5. The tag: a word ended by `:` (`su:`, also `app:msg` with no space
///    after the colon, but not `http://` or `a::b`) or by `[pid]` and an
///    optional colon (`sshd[123]:`), giving APP-NAME and PROCID. Words
///    starting with `%` are Cisco mnemonics (`%SYS-5-CONFIG_I:`) and are
///    kept in the message. One space after the tag is dropped.
/// 6. The rest is the message.
pub fn parse(
    frame: &[u8],
    format: Format,
    ctx: &Context,
    out: &mut Message,
) -> Result<(), ParseError> {
    out.clear();
    let b = trim_end(frame);
    if b.is_empty() {
        return Err(ParseError::Empty);
    }
    let (pri, pos) = parse_pri(b)?;
    if let Some(p) = pri {
        out.facility = Some(p >> 3);
        out.severity = Some(p & 7);
    }
    let rfc5424 = match format {
        Format::Auto => pri.is_some() && b.get(pos..pos + 2) == Some(b"1 "),
        Format::Rfc5424 => {
            if pri.is_none() {
                return Err(ParseError::BadPri);
            }
            true
        }
        Format::Rfc3164 => false,
    };
    if rfc5424 {
        out.flavor = Some(Flavor::Rfc5424);
        let r = rfc5424::parse(b, pos, out);
        if r.is_err() {
            out.flavor = None;
        }
        r
    } else {
        out.flavor = Some(Flavor::Rfc3164);
        rfc3164::parse(b, pos, ctx, out);
        Ok(())
    }
}

/// Resolves the escapes of an RFC 5424 PARAM-VALUE: `\"`, `\\` and `\]`
/// become the escaped byte; any other backslash is kept as it is, as the
/// RFC asks. Borrows when there is nothing to resolve.
pub fn unescape_sd_value(v: &[u8]) -> Cow<'_, [u8]> {
    let Some(first) = memchr::memchr(b'\\', v) else {
        return Cow::Borrowed(v);
    };
    let mut out = Vec::with_capacity(v.len());
    let mut rest = v;
    let mut at = first;
    loop {
        let (head, tail) = rest.split_at(at);
        out.extend_from_slice(head);
        // `tail` starts with the backslash.
        match tail.get(1) {
            Some(&c @ (b'"' | b'\\' | b']')) => {
                out.push(c);
                rest = tail.get(2..).unwrap_or_default();
            }
            _ => {
                out.push(b'\\');
                rest = tail.get(1..).unwrap_or_default();
            }
        }
        match memchr::memchr(b'\\', rest) {
            Some(i) => at = i,
            None => break,
        }
    }
    out.extend_from_slice(rest);
    Cow::Owned(out)
}

/// `frame` without trailing `\r`, `\n` and NUL bytes.
#[inline]
fn trim_end(frame: &[u8]) -> &[u8] {
    let mut b = frame;
    while let Some((&last, head)) = b.split_last() {
        if matches!(last, b'\n' | b'\r' | 0) {
            b = head;
        } else {
            break;
        }
    }
    b
}

/// Reads `<PRI>` at the start of `b`: the value (`None` when `b` does not
/// start with `<`) and the position after it.
#[inline]
fn parse_pri(b: &[u8]) -> Result<(Option<u8>, usize), ParseError> {
    if b.first() != Some(&b'<') {
        return Ok((None, 0));
    }
    let mut v: u32 = 0;
    let mut i = 1;
    loop {
        match b.get(i) {
            Some(&c) if c.is_ascii_digit() && i <= 3 => {
                v = v * 10 + u32::from(c - b'0');
                i += 1;
            }
            Some(b'>') if i > 1 => break,
            _ => return Err(ParseError::BadPri),
        }
    }
    match u8::try_from(v) {
        Ok(p) if p <= 191 => Ok((Some(p), i + 1)),
        _ => Err(ParseError::BadPri),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pri() {
        assert_eq!(parse_pri(b"<0>"), Ok((Some(0), 3)));
        assert_eq!(parse_pri(b"<191>x"), Ok((Some(191), 5)));
        assert_eq!(parse_pri(b"<013>"), Ok((Some(13), 5)));
        assert_eq!(parse_pri(b"no"), Ok((None, 0)));
        for bad in [
            &b"<192>"[..],
            b"<>",
            b"<1",
            b"<",
            b"<1234>",
            b"<12a>",
            b"<999>",
        ] {
            assert_eq!(parse_pri(bad), Err(ParseError::BadPri), "{bad:?}");
        }
    }

    #[test]
    fn unescape() {
        assert!(matches!(
            unescape_sd_value(b"plain"),
            Cow::Borrowed(b"plain")
        ));
        assert_eq!(&*unescape_sd_value(br#"a\"b\\c\]d"#), br#"a"b\c]d"#);
        assert_eq!(&*unescape_sd_value(br"a\nb\"), br"a\nb\");
        assert_eq!(&*unescape_sd_value(br"\\\\"), br"\\");
        assert_eq!(&*unescape_sd_value(br"\"), br"\");
    }

    #[test]
    fn trim() {
        assert_eq!(trim_end(b"a\r\n\0\n"), b"a");
        assert_eq!(trim_end(b"\n\r"), b"");
        assert_eq!(trim_end(b"a b "), b"a b ");
    }
}
