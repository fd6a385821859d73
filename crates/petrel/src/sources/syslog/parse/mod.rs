//! Syslog messages (RFC 5424 and the many RFC 3164 dialects) parsed in
//! place: every field is a range of the frame, nothing is copied unless
//! a structured-data value has escapes.

use std::ops::Range;

use petrel_time::TimeZone;

/// Which syntax to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// RFC 5424 when the frame starts `<PRI>1 `, else RFC 3164.
    Auto,
    /// RFC 5424 only (anything else fails).
    Rfc5424,
    /// RFC 3164 (lenient) only.
    Rfc3164,
    /// No parsing: the frame is the message.
    Raw,
}

/// One structured-data parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdParam {
    /// SD-ID of its element.
    pub id: Range<usize>,
    /// PARAM-NAME.
    pub name: Range<usize>,
    /// PARAM-VALUE without the quotes, escapes not resolved.
    pub value: Range<usize>,
    /// The value holds `\"`, `\\` or `\]`.
    pub escaped: bool,
}

/// The parts of a message, as ranges of the frame.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Message {
    /// 0..=23, from PRI.
    pub facility: Option<u8>,
    /// 0..=7, from PRI.
    pub severity: Option<u8>,
    /// Nanoseconds since the epoch.
    pub timestamp_ns: Option<i64>,
    /// HOSTNAME.
    pub hostname: Option<Range<usize>>,
    /// APP-NAME (3164: the tag).
    pub app_name: Option<Range<usize>>,
    /// PROCID (3164: the pid in `tag[pid]:`).
    pub proc_id: Option<Range<usize>>,
    /// MSGID (5424 only).
    pub msg_id: Option<Range<usize>>,
    /// Structured data parameters.
    pub sd: Vec<SdParam>,
    /// The free-form message.
    pub message: Range<usize>,
}

/// Why a frame is not a syslog message of the expected syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// `<` without a valid PRI and `>`.
    BadPri,
    /// RFC 5424 header field missing or malformed.
    BadHeader,
    /// Structured data malformed.
    BadStructuredData,
}

/// Parses `f` into `out` (cleared first).
pub fn parse(f: &[u8], format: Format, tz: &TimeZone, out: &mut Message) -> Result<(), ParseError> {
    out.facility = None;
    out.severity = None;
    out.timestamp_ns = None;
    out.hostname = None;
    out.app_name = None;
    out.proc_id = None;
    out.msg_id = None;
    out.sd.clear();
    out.message = 0..f.len();
    if format == Format::Raw {
        return Ok(());
    }
    let mut p = 0;
    if f.first() == Some(&b'<') {
        let (pri, n) = pri(f)?;
        out.facility = Some(pri / 8);
        out.severity = Some(pri % 8);
        p = n;
    } else if format == Format::Rfc5424 {
        return Err(ParseError::BadPri);
    }
    let is_5424 = f.get(p) == Some(&b'1') && f.get(p + 1) == Some(&b' ');
    match format {
        Format::Rfc5424 if !is_5424 => Err(ParseError::BadHeader),
        Format::Rfc5424 | Format::Auto if is_5424 => rfc5424(f, p + 2, out),
        _ => {
            rfc3164(f, p, tz, out);
            Ok(())
        }
    }
}

/// `<PRI>`: 1 to 3 digits, at most 191. Returns it and the bytes used.
fn pri(f: &[u8]) -> Result<(u8, usize), ParseError> {
    let mut v: u32 = 0;
    let mut i = 1;
    while i < f.len() && f[i].is_ascii_digit() {
        if i > 3 {
            return Err(ParseError::BadPri);
        }
        v = v * 10 + u32::from(f[i] - b'0');
        i += 1;
    }
    if i == 1 || f.get(i) != Some(&b'>') || v > 191 {
        return Err(ParseError::BadPri);
    }
    Ok((v as u8, i + 1))
}

/// The next space-delimited token from `p`: its range and the position
/// after the space (or the end).
fn token(f: &[u8], p: usize) -> Option<(Range<usize>, usize)> {
    if p >= f.len() {
        return None;
    }
    let end = memchr::memchr(b' ', &f[p..]).map_or(f.len(), |i| p + i);
    Some((p..end, (end + 1).min(f.len()).max(end)))
}

fn nil_or(r: Range<usize>, f: &[u8]) -> Option<Range<usize>> {
    (&f[r.clone()] != b"-").then_some(r)
}

fn rfc5424(f: &[u8], p: usize, out: &mut Message) -> Result<(), ParseError> {
    let (ts, p) = token(f, p).ok_or(ParseError::BadHeader)?;
    if &f[ts.clone()] != b"-" {
        match petrel_time::parse_any_prefix(&f[ts.clone()]) {
            Some((ns, n)) if n == ts.len() => out.timestamp_ns = Some(ns),
            _ => return Err(ParseError::BadHeader),
        }
    }
    let (host, p) = token(f, p).ok_or(ParseError::BadHeader)?;
    let (app, p) = token(f, p).ok_or(ParseError::BadHeader)?;
    let (proc_id, p) = token(f, p).ok_or(ParseError::BadHeader)?;
    let (msg_id, p) = token(f, p).ok_or(ParseError::BadHeader)?;
    if host.is_empty() || app.is_empty() || proc_id.is_empty() || msg_id.is_empty() {
        return Err(ParseError::BadHeader);
    }
    out.hostname = nil_or(host, f);
    out.app_name = nil_or(app, f);
    out.proc_id = nil_or(proc_id, f);
    out.msg_id = nil_or(msg_id, f);
    let mut p = p;
    match f.get(p) {
        Some(b'-') => p += 1,
        Some(b'[') => p = structured_data(f, p, out)?,
        // Header without SD and message.
        None => {
            out.message = f.len()..f.len();
            return Ok(());
        }
        _ => return Err(ParseError::BadStructuredData),
    }
    if f.get(p) == Some(&b' ') {
        p += 1;
    } else if p < f.len() {
        return Err(ParseError::BadStructuredData);
    }
    if f[p..].starts_with(b"\xEF\xBB\xBF") {
        p += 3;
    }
    out.message = p..trim_end(f, p);
    Ok(())
}

/// Structured data elements from `p` (at `[`); returns the position
/// after the last `]`.
fn structured_data(f: &[u8], mut p: usize, out: &mut Message) -> Result<usize, ParseError> {
    let bad = ParseError::BadStructuredData;
    while f.get(p) == Some(&b'[') {
        p += 1;
        let id_start = p;
        while p < f.len() && !matches!(f[p], b' ' | b']' | b'=' | b'"') {
            p += 1;
        }
        let id = id_start..p;
        if id.is_empty() {
            return Err(bad);
        }
        loop {
            match f.get(p) {
                Some(b']') => {
                    p += 1;
                    break;
                }
                Some(b' ') => p += 1,
                _ => return Err(bad),
            }
            let name_start = p;
            while p < f.len() && !matches!(f[p], b' ' | b']' | b'=' | b'"') {
                p += 1;
            }
            let name = name_start..p;
            if name.is_empty() || f.get(p) != Some(&b'=') || f.get(p + 1) != Some(&b'"') {
                return Err(bad);
            }
            p += 2;
            let value_start = p;
            let mut escaped = false;
            loop {
                match f.get(p) {
                    None => return Err(bad),
                    Some(b'\\') => {
                        escaped = true;
                        p += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => p += 1,
                }
            }
            if p > f.len() {
                return Err(bad);
            }
            out.sd.push(SdParam {
                id: id.clone(),
                name,
                value: value_start..p,
                escaped,
            });
            p += 1;
        }
    }
    Ok(p)
}

/// Resolves `\"`, `\\` and `\]` in a structured-data value.
pub fn unescape(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'\\' && matches!(v.get(i + 1), Some(b'"' | b'\\' | b']')) {
            out.push(v[i + 1]);
            i += 2;
        } else {
            out.push(v[i]);
            i += 1;
        }
    }
    out
}

/// End of the message without trailing newlines, carriage returns, NULs.
fn trim_end(f: &[u8], start: usize) -> usize {
    let mut end = f.len();
    while end > start && matches!(f[end - 1], b'\n' | b'\r' | 0) {
        end -= 1;
    }
    end
}

/// RFC 3164 as seen in the wild, best effort: `TIMESTAMP HOST TAG[PID]: MSG`
/// where any part may be missing. Heuristics:
/// - Cisco-style sequence numbers and `*`/`.` markers before the time
///   (`<189>123: *Mar  1 18:46:11.123: %SYS-5-...`) are skipped;
/// - the time is any format `petrel_time` knows (`Mmm dd hh:mm:ss` with
///   the year inferred in `tz`, or RFC 3339), followed by an optional `:`;
/// - the next word is the hostname unless it looks like a tag (ends in
///   `:` or holds `[`), then there is none;
/// - a tag is letters, digits and `._-/` up to 48 bytes, optionally with
///   `[pid]`, ending in `:`; otherwise the rest is all message.
fn rfc3164(f: &[u8], mut p: usize, tz: &TimeZone, out: &mut Message) {
    let end = trim_end(f, p);
    // Cisco: "123: " sequence number before the time.
    let digits = f[p..end].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 && f.get(p + digits) == Some(&b':') && f.get(p + digits + 1) == Some(&b' ') {
        p += digits + 2;
    }
    if matches!(f.get(p), Some(b'*' | b'.')) {
        p += 1;
    }
    if let Some((ns, n)) = petrel_time::parse_any_prefix_in(&f[p..end], tz) {
        out.timestamp_ns = Some(ns);
        p += n;
        if f.get(p) == Some(&b':') {
            p += 1;
        }
        while f.get(p) == Some(&b' ') {
            p += 1;
        }
        // Hostname, unless the word is the tag.
        if let Some((w, next)) = token(f, p).filter(|(w, _)| w.end <= end) {
            let word = &f[w.clone()];
            let tagish = word.ends_with(b":") || word.contains(&b'[');
            if !word.is_empty() && !tagish && !word.starts_with(b"%") {
                out.hostname = Some(w);
                p = next;
            }
        }
    }
    // TAG[PID]: — only when it is one.
    let mut i = p;
    while i < end
        && i - p < 48
        && matches!(f[i], b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'/')
    {
        i += 1;
    }
    if i > p {
        let tag = p..i;
        let mut pid = None;
        let mut j = i;
        if f.get(j) == Some(&b'[') {
            if let Some(close) = memchr::memchr(b']', &f[j..end]) {
                pid = Some(j + 1..j + close);
                j += close + 1;
            }
        }
        if f.get(j) == Some(&b':') && j < end {
            out.app_name = Some(tag);
            out.proc_id = pid.filter(|r| !r.is_empty());
            p = j + 1;
            if f.get(p) == Some(&b' ') {
                p += 1;
            }
        }
    }
    out.message = p.min(end)..end;
}

#[cfg(test)]
mod tests;
