//! RFC 3164 / BSD syslog, best effort: see [`crate::parse`] for the steps
//! and the heuristics. Never fails: what is not understood stays in the
//! message.

use crate::{Context, Message};
use petrel_time::TimeZone;

const NS: i64 = 1_000_000_000;
/// How far ahead of the receiver's clock an inferred-year time may be.
const FUTURE_SLACK_SECS: i64 = 86_400;

/// Parses `b[pos..]` (after `<PRI>`, if any) into `out`. `b` has no
/// trailing line terminators.
pub(crate) fn parse(b: &[u8], pos: usize, ctx: &Context, out: &mut Message) {
    let mut pos = skip_spaces(b, pos);
    pos = cisco_prefix(b, pos);
    if let Some((ns, end)) = timestamp(b, pos, ctx) {
        out.timestamp_ns = Some(ns);
        pos = skip_spaces(b, end);
        pos = hostname(b, pos, out);
    }
    pos = tag(b, pos, out);
    out.message = pos.min(b.len())..b.len();
}

#[inline]
fn skip_spaces(b: &[u8], mut pos: usize) -> usize {
    while b.get(pos) == Some(&b' ') {
        pos += 1;
    }
    pos
}

/// The end of the word at `pos` (the next space or the end of `b`).
#[inline]
fn word_end(b: &[u8], pos: usize) -> usize {
    let rest = b.get(pos..).unwrap_or_default();
    pos + rest.iter().position(|&c| c == b' ').unwrap_or(rest.len())
}

/// Skips a Cisco IOS sequence number (`123: `) and the `*` / `.` IOS puts
/// before a time that is not synchronised.
#[inline]
fn cisco_prefix(b: &[u8], pos: usize) -> usize {
    let mut i = pos;
    while b.get(i).is_some_and(u8::is_ascii_digit) && i - pos < 10 {
        i += 1;
    }
    let mut pos = if i > pos && b.get(i..i + 2) == Some(b": ") {
        skip_spaces(b, i + 2)
    } else {
        pos
    };
    if matches!(b.get(pos), Some(b'*' | b'.'))
        && b.get(pos + 1).is_some_and(u8::is_ascii_alphabetic)
    {
        pos += 1;
    }
    pos
}

/// The timestamp at `pos` and the position after it (and after a Cisco
/// colon); `None` when there is none, or it is not followed by a space,
/// a colon or the end.
fn timestamp(b: &[u8], pos: usize, ctx: &Context) -> Option<(i64, usize)> {
    let rest = b.get(pos..)?;
    let first = *rest.first()?;
    let now_secs = ctx.now_ns.div_euclid(NS);
    let (ns, mut end) = if first.is_ascii_alphabetic() {
        let (ns, n) =
            petrel_time::parse_syslog_prefix_at(rest, &ctx.tz, now_secs, FUTURE_SLACK_SECS)?;
        // An explicit zone after the time replaces the configured one.
        match zone_suffix(rest, n) {
            Some((tz, m)) => {
                let (ns, _) =
                    petrel_time::parse_syslog_prefix_at(rest, &tz, now_secs, FUTURE_SLACK_SECS)?;
                (ns, m)
            }
            None => (ns, n),
        }
    } else if first.is_ascii_digit() {
        // Only the ISO shape: other formats that start with digits are
        // more likely part of the message.
        if rest.get(4) != Some(&b'-') {
            return None;
        }
        petrel_time::parse_any_prefix_in(rest, &ctx.tz)?
    } else {
        return None;
    };
    if rest.get(end) == Some(&b':') {
        end += 1;
    }
    match rest.get(end) {
        None | Some(b' ') => Some((ns, pos + end)),
        Some(_) => None,
    }
}

/// A zone after a time at `at`: ` UTC`, ` GMT` or ` ±hh:mm` / ` ±hhmm`,
/// followed by a space, a colon or the end. Returns the zone and the end of
/// the suffix.
fn zone_suffix(rest: &[u8], at: usize) -> Option<(TimeZone, usize)> {
    if rest.get(at) != Some(&b' ') {
        return None;
    }
    let s = at + 1;
    let (tz, end) = match rest.get(s..s + 3) {
        Some(b"UTC" | b"GMT") => (TimeZone::Utc, s + 3),
        _ => {
            let sign: i32 = match rest.get(s) {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            let d = |i: usize| match rest.get(i) {
                Some(c) if c.is_ascii_digit() => Some(i32::from(c - b'0')),
                _ => None,
            };
            let h = d(s + 1)? * 10 + d(s + 2)?;
            let (m, end) = if rest.get(s + 3) == Some(&b':') {
                (d(s + 4)? * 10 + d(s + 5)?, s + 6)
            } else {
                (d(s + 3)? * 10 + d(s + 4)?, s + 5)
            };
            if h > 23 || m > 59 {
                return None;
            }
            (TimeZone::Fixed(sign * (h * 3600 + m * 60)), end)
        }
    };
    match rest.get(end) {
        None | Some(b' ' | b':') => Some((tz, end)),
        Some(_) => None,
    }
}

/// The hostname after a timestamp, if the word at `pos` is one (see
/// [`crate::parse`], step 4). Returns the position after it.
fn hostname(b: &[u8], pos: usize, out: &mut Message) -> usize {
    let end = word_end(b, pos);
    let Some(word) = b.get(pos..end) else {
        return pos;
    };
    let is_tag = word.last() == Some(&b':') || word.contains(&b'[');
    if word.is_empty() || is_tag || word.first() == Some(&b'%') || end >= b.len() {
        return pos;
    }
    out.hostname = Some(pos..end);
    skip_spaces(b, end)
}

/// The tag at `pos`, if there is one (see [`crate::parse`], step 5).
/// Returns the position of the message.
fn tag(b: &[u8], pos: usize, out: &mut Message) -> usize {
    let rest = b.get(pos..).unwrap_or_default();
    let Some(n) = rest.iter().position(|&c| matches!(c, b':' | b'[' | b' ')) else {
        return pos;
    };
    if n == 0 || rest.first() == Some(&b'%') {
        return pos;
    }
    let name = pos..pos + n;
    // After the tag: the colon (or `]`) and one optional space.
    let after = |i: usize| {
        if b.get(i) == Some(&b' ') {
            i + 1
        } else {
            i
        }
    };
    match rest.get(n) {
        Some(b':') => {
            // `http://`, `a::b`: not a tag.
            if matches!(rest.get(n + 1), Some(b'/' | b':')) {
                return pos;
            }
            out.app_name = Some(name);
            after(pos + n + 1)
        }
        Some(b'[') => {
            let inner = rest.get(n + 1..).unwrap_or_default();
            let Some(close) = inner.iter().position(|&c| matches!(c, b']' | b' ')) else {
                return pos;
            };
            if inner.get(close) != Some(&b']') {
                return pos;
            }
            let pid = pos + n + 1..pos + n + 1 + close;
            let mut next = pid.end + 1;
            match b.get(next) {
                Some(b':') => next += 1,
                None | Some(b' ') => {}
                // `app[1]x`: not a tag.
                Some(_) => return pos,
            }
            out.app_name = Some(name);
            if !pid.is_empty() {
                out.proc_id = Some(pid);
            }
            after(next)
        }
        _ => pos,
    }
}
