//! RFC 5424 after `<PRI>`: VERSION, the header fields, STRUCTURED-DATA and
//! MSG. Every read goes through `get`, so malformed input ends in an error,
//! never an out-of-bounds index.

use crate::{Message, ParseError, Range, SdParam};

const NS: i64 = 1_000_000_000;

/// The UTF-8 byte order mark RFC 5424 allows at the start of MSG.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Parses `b[pos..]` (just after `<PRI>`) into `out`. `b` has no trailing
/// line terminators.
pub(crate) fn parse(b: &[u8], pos: usize, out: &mut Message) -> Result<(), ParseError> {
    let pos = version(b, pos)?;
    let (ts, pos) = field(b, pos, "timestamp", "hostname")?;
    out.timestamp_ns = timestamp(b, ts)?;
    let (r, pos) = field(b, pos, "hostname", "app-name")?;
    out.hostname = non_nil(b, r);
    let (r, pos) = field(b, pos, "app-name", "procid")?;
    out.app_name = non_nil(b, r);
    let (r, pos) = field(b, pos, "procid", "msgid")?;
    out.proc_id = non_nil(b, r);
    let (r, pos) = field(b, pos, "msgid", "")?;
    out.msg_id = non_nil(b, r);
    let pos = structured_data(b, pos, out)?;
    out.message = match b.get(pos) {
        None => b.len()..b.len(),
        Some(b' ') => {
            let start = pos + 1;
            let start = match b.get(start..start + BOM.len()) {
                Some(s) if s == BOM => start + BOM.len(),
                _ => start,
            };
            start..b.len()
        }
        // `structured_data` only returns at the end or before a space.
        Some(_) => return Err(ParseError::BadStructuredData),
    };
    Ok(())
}

/// VERSION (1..=3 digits, the first not zero) and its space; `Format::Auto`
/// only gets here with `1 `, `Format::Rfc5424` accepts any version.
#[inline]
fn version(b: &[u8], mut pos: usize) -> Result<usize, ParseError> {
    let start = pos;
    while let Some(c) = b.get(pos).filter(|c| c.is_ascii_digit()) {
        if pos == start && *c == b'0' {
            break;
        }
        pos += 1;
    }
    let n = pos - start;
    if !(1..=3).contains(&n) || b.get(pos) != Some(&b' ') {
        return Err(ParseError::BadHeader("version"));
    }
    Ok(pos + 1)
}

/// A header field at `pos`: its range and the position after the space
/// that ends it. A field that is empty is an error naming it; one not
/// followed by a space means the next field (`next`, or STRUCTURED-DATA
/// when `next` is empty) is missing.
#[inline]
fn field(
    b: &[u8],
    pos: usize,
    name: &'static str,
    next: &'static str,
) -> Result<(Range, usize), ParseError> {
    let rest = b.get(pos..).unwrap_or_default();
    // Fields are short: a plain loop beats memchr's setup here.
    match rest.iter().position(|&c| c == b' ') {
        Some(0) => Err(ParseError::BadHeader(name)),
        Some(n) => Ok((pos..pos + n, pos + n + 1)),
        None if rest.is_empty() => Err(ParseError::BadHeader(name)),
        None if next.is_empty() => Err(ParseError::BadStructuredData),
        None => Err(ParseError::BadHeader(next)),
    }
}

/// `None` for the nil value `-`.
#[inline]
fn non_nil(b: &[u8], r: Range) -> Option<Range> {
    (b.get(r.clone()) != Some(b"-")).then_some(r)
}

/// TIMESTAMP: nil, or RFC 3339 (see the crate documentation).
#[inline]
fn timestamp(b: &[u8], r: Range) -> Result<Option<i64>, ParseError> {
    let t = b.get(r).unwrap_or_default();
    if t == b"-" {
        return Ok(None);
    }
    rfc3339(t).ok_or(ParseError::BadHeader("timestamp"))
}

#[inline(always)]
fn digit(t: &[u8], i: usize) -> Option<u32> {
    match t.get(i) {
        Some(c) if c.is_ascii_digit() => Some(u32::from(c - b'0')),
        _ => None,
    }
}

#[inline(always)]
fn d2(t: &[u8], i: usize) -> Option<u32> {
    Some(digit(t, i)? * 10 + digit(t, i + 1)?)
}

/// Parses a whole RFC 3339 date-time: `Some(Some(ns))`, `Some(None)` when
/// it is valid but `i64` nanoseconds cannot hold it, `None` when invalid.
/// Fixed positions, no allocation: this runs for every RFC 5424 message.
pub(crate) fn rfc3339(t: &[u8]) -> Option<Option<i64>> {
    // YYYY-MM-DDThh:mm:ss
    if t.get(4) != Some(&b'-')
        || t.get(7) != Some(&b'-')
        || !matches!(t.get(10), Some(b'T' | b't'))
        || t.get(13) != Some(&b':')
        || t.get(16) != Some(&b':')
    {
        return None;
    }
    let year = d2(t, 0)? * 100 + d2(t, 2)?;
    let (month, day) = (d2(t, 5)?, d2(t, 8)?);
    let (hour, minute, second) = (d2(t, 11)?, d2(t, 14)?, d2(t, 17)?);
    let year = i64::from(year);
    if !(1..=12).contains(&month)
        || day == 0
        || day > petrel_time::days_in_month(year, month)
        || hour > 23
        || minute > 59
        // 60: a leap second, counted as the next minute's first.
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if t.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        let mut scale = NS;
        while let Some(d) = digit(t, i) {
            // Digits past the ninth are below a nanosecond: ignored.
            if scale > 1 {
                scale /= 10;
                nanos += i64::from(d) * scale;
            }
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset: i64 = match t.get(i) {
        Some(b'Z' | b'z') => {
            i += 1;
            0
        }
        Some(&s @ (b'+' | b'-')) => {
            if t.get(i + 3) != Some(&b':') {
                return None;
            }
            let (oh, om) = (d2(t, i + 1)?, d2(t, i + 4)?);
            if oh > 23 || om > 59 {
                return None;
            }
            i += 6;
            let off = i64::from(oh * 3600 + om * 60);
            if s == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    if i != t.len() {
        return None;
    }
    let days = petrel_time::days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset;
    Some(secs.checked_mul(NS).and_then(|s| s.checked_add(nanos)))
}

/// STRUCTURED-DATA at `pos`: `-` or one or more elements, recorded in
/// `out.sd` / `out.sd_ids`. Returns the position after it, which is the
/// end of `b` or a space.
fn structured_data(b: &[u8], mut pos: usize, out: &mut Message) -> Result<usize, ParseError> {
    const BAD: ParseError = ParseError::BadStructuredData;
    match b.get(pos) {
        Some(b'-') => pos += 1,
        Some(b'[') => {
            while b.get(pos) == Some(&b'[') {
                pos = element(b, pos + 1, out)?;
            }
        }
        _ => return Err(BAD),
    }
    match b.get(pos) {
        None | Some(b' ') => Ok(pos),
        Some(_) => Err(BAD),
    }
}

/// True for the bytes a SD-NAME (SD-ID, PARAM-NAME) cannot hold besides
/// the control characters: RFC 5424 excludes `=`, space, `]` and `"`.
#[inline(always)]
fn name_stop(c: u8) -> bool {
    matches!(c, b'=' | b' ' | b']' | b'"') || c < 0x21 || c == 0x7f
}

/// A SD-NAME at `pos`: its end, which must be past `pos`.
#[inline]
fn sd_name(b: &[u8], pos: usize) -> Result<usize, ParseError> {
    let rest = b.get(pos..).unwrap_or_default();
    match rest.iter().position(|&c| name_stop(c)) {
        Some(n) if n > 0 => Ok(pos + n),
        _ => Err(ParseError::BadStructuredData),
    }
}

/// One SD-ELEMENT from just after its `[`; returns the position after its
/// `]`.
fn element(b: &[u8], pos: usize, out: &mut Message) -> Result<usize, ParseError> {
    const BAD: ParseError = ParseError::BadStructuredData;
    let id_end = sd_name(b, pos)?;
    let id = pos..id_end;
    out.sd_ids.push(id.clone());
    let mut pos = id_end;
    loop {
        match b.get(pos) {
            Some(b']') => return Ok(pos + 1),
            Some(b' ') => {
                // One space per the RFC; more are tolerated.
                while b.get(pos) == Some(&b' ') {
                    pos += 1;
                }
                if b.get(pos) == Some(&b']') {
                    return Ok(pos + 1);
                }
                let name_end = sd_name(b, pos)?;
                if b.get(name_end..name_end + 2) != Some(b"=\"") {
                    return Err(BAD);
                }
                let (value_end, escaped) = param_value(b, name_end + 2)?;
                out.sd.push(SdParam {
                    id: id.clone(),
                    name: pos..name_end,
                    value: name_end + 2..value_end,
                    escaped,
                });
                // Past the closing quote.
                pos = value_end + 1;
            }
            _ => return Err(BAD),
        }
    }
}

/// A PARAM-VALUE from just after its opening quote: the position of the
/// closing quote and whether an escape was seen.
#[inline]
fn param_value(b: &[u8], start: usize) -> Result<(usize, bool), ParseError> {
    let mut escaped = false;
    let mut pos = start;
    loop {
        let rest = b.get(pos..).unwrap_or_default();
        let Some(n) = memchr::memchr3(b'"', b'\\', b']', rest) else {
            return Err(ParseError::BadStructuredData);
        };
        pos += n;
        match b.get(pos) {
            Some(b'"') => return Ok((pos, escaped)),
            Some(b'\\') => match b.get(pos + 1) {
                Some(b'"' | b'\\' | b']') => {
                    escaped = true;
                    pos += 2;
                }
                // Not an escape: a literal backslash.
                _ => pos += 1,
            },
            // A `]` must be escaped inside a value.
            _ => return Err(ParseError::BadStructuredData),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_values() {
        let ok = |s: &str| rfc3339(s.as_bytes()).flatten();
        assert_eq!(ok("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(ok("1970-01-01T00:00:00.5Z"), Some(500_000_000));
        assert_eq!(ok("1970-01-01T00:00:00.123456789Z"), Some(123_456_789));
        assert_eq!(ok("1970-01-01T00:00:00.1234567891Z"), Some(123_456_789));
        assert_eq!(ok("1970-01-01t01:00:00+01:00"), Some(0));
        assert_eq!(ok("1969-12-31T19:00:00-05:00"), Some(0));
        assert_eq!(ok("2024-02-29T23:59:60Z"), Some(1_709_251_200 * NS));
        assert_eq!(rfc3339(b"9999-12-31T23:59:59Z"), Some(None));
        assert_eq!(rfc3339(b"1000-01-01T00:00:00Z"), Some(None));
        for bad in [
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-00-01T00:00:00Z",
            "2024-01-00T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:61Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00Zx",
            "2024-01-01 00:00:00Z",
            "24-01-01T00:00:00Z",
            "",
        ] {
            assert_eq!(rfc3339(bad.as_bytes()), None, "{bad}");
        }
    }
}
