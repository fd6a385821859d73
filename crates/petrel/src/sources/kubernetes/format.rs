//! Container runtimes' log records, decoded into messages with partials
//! merged.
//!
//! - CRI (containerd, CRI-O; `/var/log/pods`): `<RFC3339Nano> <stream>
//!   <tag> <payload>`, where tag `P` marks a partial record (the runtime
//!   split a long line, at 16 KiB by default) and `F` the last one.
//! - Docker json-file: `{"log":"...","stream":"stdout","time":"..."}`; a
//!   `log` without a trailing `\n` is a partial (16 KiB) that continues in
//!   the next record of the same stream.
//!
//! The format is told per line (a `{` starts a Docker record), so a file
//! needs no declared format. Partials are merged per stream: stdout and
//! stderr records may interleave while a long line is being written.
//!
//! The Docker fast path reads the three fields in the order the daemon
//! writes them, unescaping `log` straight into the output; records in any
//! other shape go through serde_json.

use memchr::memchr;
use petrel_core::LazyCounter;
use petrel_time as timestamp;

use crate::sources::file::decode::{Decoded, DecodedMsg, LineDecoder, Stream};

/// Which streams are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    /// Keep stdout records.
    pub stdout: bool,
    /// Keep stderr records.
    pub stderr: bool,
}

/// Counters of outcomes other than a clean message.
#[derive(Debug, Clone, Default)]
pub struct FormatCounters {
    /// Lines that are neither CRI nor Docker records (passed on as is).
    pub invalid: LazyCounter,
    /// Merged messages cut at `max_merged_line_bytes`.
    pub cut: LazyCounter,
    /// Partial chains that never got their last record (the file ended,
    /// rotated or was deleted mid-message): emitted as they were.
    pub unfinished: LazyCounter,
}

/// A chain of partial records being merged.
#[derive(Debug, Default)]
struct Chain {
    open: bool,
    raw_start: usize,
    time_ns: Option<i64>,
    payload: Vec<u8>,
    /// Raw offsets of the chain's records.
    lines: Vec<usize>,
}

/// Decoder of one container log file.
#[derive(Debug)]
pub struct ContainerDecoder {
    max_merged: usize,
    streams: Streams,
    counters: FormatCounters,
    /// stdout, stderr.
    chains: [Chain; 2],
    /// File offsets of records already turned into messages that lie after
    /// the start of a chain still open at the last call: they come again
    /// with the carried bytes and must not be emitted twice.
    done: Vec<u64>,
    /// Reused for serde_json's fallback and Docker unescaping.
    scratch: Vec<u8>,
}

/// One parsed record.
struct Record<'a> {
    time_ns: Option<i64>,
    stream: Stream,
    partial: bool,
    /// The payload, when it is a slice of the line (CRI); Docker payloads
    /// are unescaped into the decoder's scratch buffer.
    payload: Option<&'a [u8]>,
}

impl ContainerDecoder {
    /// A decoder merging partials up to `max_merged` bytes.
    pub fn new(max_merged: usize, streams: Streams, counters: FormatCounters) -> Self {
        Self {
            max_merged: max_merged.max(1),
            streams,
            counters,
            chains: Default::default(),
            done: Vec::new(),
            scratch: Vec::new(),
        }
    }

    fn wanted(&self, s: Stream) -> bool {
        match s {
            Stream::Stdout => self.streams.stdout,
            Stream::Stderr => self.streams.stderr,
            Stream::None => true,
        }
    }

    fn push_msg(out: &mut Decoded, payload: &[u8], raw_start: usize, time: Option<i64>, s: Stream) {
        let start = out.out.len();
        out.out.extend_from_slice(payload);
        out.out.push(b'\n');
        out.msgs.push(DecodedMsg {
            start,
            len: payload.len(),
            raw_start,
            time_ns: time,
            stream: s,
        });
    }

    /// Emits a chain's payload, in pieces of at most `max_merged` bytes.
    fn emit_chain(&mut self, idx: usize, out: &mut Decoded) {
        let s = if idx == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        let c = &mut self.chains[idx];
        if c.payload.len() <= self.max_merged {
            Self::push_msg(out, &c.payload, c.raw_start, c.time_ns, s);
        } else {
            for piece in c.payload.chunks(self.max_merged) {
                Self::push_msg(out, piece, c.raw_start, c.time_ns, s);
            }
        }
        c.open = false;
        c.payload.clear();
    }
}

impl LineDecoder for ContainerDecoder {
    fn decode(&mut self, raw: &[u8], base: u64, flush: bool, out: &mut Decoded) {
        out.clear();
        // Messages are never longer than their records: one allocation.
        out.out.reserve(raw.len() + 16);
        // Records finished in this call (turned into messages, skipped,
        // passed through) while a chain was open: candidates for `done`.
        let mut finished_late: Vec<usize> = Vec::new();
        let old_done = std::mem::take(&mut self.done);
        let mut done_idx = 0;
        let mut s = 0;
        while s < raw.len() {
            let e = memchr(b'\n', &raw[s..]).map_or(raw.len(), |i| s + i);
            let line = &raw[s..e];
            let abs = base + s as u64;
            let line_start = s;
            s = e + 1;
            while done_idx < old_done.len() && old_done[done_idx] < abs {
                done_idx += 1;
            }
            let any_open = self.chains[0].open || self.chains[1].open;
            if done_idx < old_done.len() && old_done[done_idx] == abs {
                if any_open {
                    finished_late.push(line_start);
                }
                continue;
            }
            self.scratch.clear();
            let Some(rec) = parse_record(line, &mut self.scratch) else {
                self.counters.invalid.inc();
                Self::push_msg(out, line, line_start, None, Stream::None);
                if any_open {
                    finished_late.push(line_start);
                }
                continue;
            };
            if !self.wanted(rec.stream) {
                if any_open {
                    finished_late.push(line_start);
                }
                continue;
            }
            let idx = usize::from(rec.stream == Stream::Stderr);
            let payload: &[u8] = rec.payload.unwrap_or(&self.scratch);
            if !self.chains[idx].open {
                if !rec.partial {
                    Self::push_msg(out, payload, line_start, rec.time_ns, rec.stream);
                    if any_open {
                        finished_late.push(line_start);
                    }
                    continue;
                }
                let c = &mut self.chains[idx];
                c.open = true;
                c.raw_start = line_start;
                c.time_ns = rec.time_ns;
                c.lines.clear();
            }
            let c = &mut self.chains[idx];
            c.payload.extend_from_slice(payload);
            c.lines.push(line_start);
            if !rec.partial || c.payload.len() >= self.max_merged {
                if rec.partial {
                    // Cut here; what follows starts a new message.
                    self.counters.cut.inc();
                }
                let other_open = self.chains[1 - idx].open;
                if other_open {
                    finished_late.extend_from_slice(&self.chains[idx].lines);
                }
                self.emit_chain(idx, out);
            }
        }
        let mut held = raw.len();
        for idx in 0..2 {
            if self.chains[idx].open {
                if flush {
                    self.counters.unfinished.inc();
                    self.emit_chain(idx, out);
                } else {
                    held = held.min(self.chains[idx].raw_start);
                }
            }
        }
        // An open chain is decoded again from its first record next time.
        for c in &mut self.chains {
            c.open = false;
            c.payload.clear();
            c.lines.clear();
        }
        if held < raw.len() {
            finished_late.sort_unstable();
            self.done = finished_late
                .into_iter()
                .filter(|&o| o >= held)
                .map(|o| base + o as u64)
                .collect();
        }
        out.held = held;
    }

    fn reset(&mut self) {
        self.done.clear();
        for c in &mut self.chains {
            c.open = false;
            c.payload.clear();
            c.lines.clear();
        }
    }
}

/// Parses one CRI or Docker json-file record.
fn parse_record<'a>(line: &'a [u8], scratch: &mut Vec<u8>) -> Option<Record<'a>> {
    if line.first() == Some(&b'{') {
        parse_docker(line, scratch)
    } else {
        parse_cri(line)
    }
}

fn stream_of(s: &[u8]) -> Option<Stream> {
    match s {
        b"stdout" => Some(Stream::Stdout),
        b"stderr" => Some(Stream::Stderr),
        _ => None,
    }
}

fn parse_time(t: &[u8]) -> Option<i64> {
    if let Some(ns) = parse_utc_rfc3339(t) {
        return Some(ns);
    }
    match timestamp::parse_any_prefix(t) {
        Some((ns, n)) if n == t.len() => Some(ns),
        _ => None,
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z`, the shape runtimes write in UTC, read
/// directly: the general timestamp parser, which tries every format it
/// knows, was 8 % of the agent's CPU on container logs (BENCHMARKS.md
/// section 7). Anything else (an offset, other precision) goes to it.
fn parse_utc_rfc3339(t: &[u8]) -> Option<i64> {
    if t.len() < 20
        || t[4] != b'-'
        || t[7] != b'-'
        || t[10] != b'T'
        || t[13] != b':'
        || t[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        t[r].iter().try_fold(0u32, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
        })
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo)
        || d == 0
        || d > timestamp::days_in_month(i64::from(y), mo)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return None;
    }
    let mut i = 19;
    let mut frac: i64 = 0;
    if t[i] == b'.' {
        i += 1;
        let start = i;
        while i < t.len() && t[i].is_ascii_digit() && i - start < 9 {
            frac = frac * 10 + i64::from(t[i] - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        frac *= 10i64.pow(9 - digits as u32);
    }
    if i + 1 != t.len() || t[i] != b'Z' {
        return None;
    }
    let days = timestamp::days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(sec);
    secs.checked_mul(1_000_000_000)?.checked_add(frac)
}

/// `<time> <stream> <tag> <payload>`; the tag is `P`, `F`, or
/// colon-separated tags whose first is `P` or `F`.
fn parse_cri(line: &[u8]) -> Option<Record<'_>> {
    let sp1 = memchr(b' ', line)?;
    let time_ns = Some(parse_time(&line[..sp1])?);
    let rest = &line[sp1 + 1..];
    let sp2 = memchr(b' ', rest)?;
    let stream = stream_of(&rest[..sp2])?;
    let rest = &rest[sp2 + 1..];
    let (tag, payload) = match memchr(b' ', rest) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    let partial = match tag.split(|&b| b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return None,
    };
    Some(Record {
        time_ns,
        stream,
        partial,
        payload: Some(payload),
    })
}

/// A Docker json-file record. The payload is unescaped into `scratch`.
fn parse_docker<'a>(line: &'a [u8], scratch: &mut Vec<u8>) -> Option<Record<'a>> {
    if let Some(r) = parse_docker_fast(line, scratch) {
        return Some(r);
    }
    #[derive(serde::Deserialize)]
    struct Rec {
        log: String,
        stream: String,
        time: Option<String>,
    }
    let r: Rec = serde_json::from_slice(line).ok()?;
    scratch.clear();
    scratch.extend_from_slice(r.log.as_bytes());
    let stream = stream_of(r.stream.as_bytes())?;
    Some(finish_docker(
        scratch,
        stream,
        r.time.as_deref().map(str::as_bytes),
    ))
}

fn finish_docker<'a>(scratch: &mut Vec<u8>, stream: Stream, time: Option<&[u8]>) -> Record<'a> {
    let partial = scratch.last() != Some(&b'\n');
    if !partial {
        scratch.pop();
    }
    Record {
        time_ns: time.and_then(parse_time),
        stream,
        partial,
        payload: None,
    }
}

/// `{"log":"…","stream":"…","time":"…"}` exactly as dockerd writes it.
fn parse_docker_fast<'a>(line: &'a [u8], scratch: &mut Vec<u8>) -> Option<Record<'a>> {
    const LOG: &[u8] = b"{\"log\":\"";
    const STREAM: &[u8] = b",\"stream\":\"";
    const TIME: &[u8] = b",\"time\":\"";
    let rest = line.strip_prefix(LOG)?;
    scratch.clear();
    let used = unescape_json_string(rest, scratch)?;
    let rest = rest[used..].strip_prefix(STREAM)?;
    let q = memchr(b'"', rest)?;
    let stream = stream_of(&rest[..q])?;
    let rest = rest[q + 1..].strip_prefix(TIME)?;
    let q = memchr(b'"', rest)?;
    let time = &rest[..q];
    if &rest[q + 1..] != b"}" {
        return None;
    }
    Some(finish_docker(scratch, stream, Some(time)))
}

/// Unescapes the JSON string starting at `s` (after its opening quote)
/// into `out`; returns the bytes used, closing quote included.
fn unescape_json_string(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let mut i = 0;
    loop {
        let j = i + memchr::memchr2(b'"', b'\\', &s[i..])?;
        out.extend_from_slice(&s[i..j]);
        if s[j] == b'"' {
            return Some(j + 1);
        }
        let esc = *s.get(j + 1)?;
        i = j + 2;
        match esc {
            b'"' => out.push(b'"'),
            b'\\' => out.push(b'\\'),
            b'/' => out.push(b'/'),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'u' => {
                let hi = hex4(s.get(i..i + 4)?)?;
                i += 4;
                let c = if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair: the low half must follow.
                    let lo = match s.get(i..i + 2) {
                        Some(b"\\u") => hex4(s.get(i + 2..i + 6)?)?,
                        _ => 0,
                    };
                    if (0xDC00..0xE000).contains(&lo) {
                        i += 6;
                        char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                    } else {
                        None
                    }
                } else {
                    char::from_u32(hi)
                };
                let c = c.unwrap_or(char::REPLACEMENT_CHARACTER);
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
            _ => return None,
        }
    }
}

fn hex4(h: &[u8]) -> Option<u32> {
    let mut v = 0u32;
    for &c in h {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests;
