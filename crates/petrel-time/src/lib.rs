//! Timestamp parsing shared by the `parse_timestamp` processor and
//! time-based multiline detection.
//!
//! Two ways in:
//!
//! - [`TimestampFormat`]: a format compiled once from a strftime-like
//!   pattern (`%Y-%m-%d %H:%M:%S%.f`), the word `auto` (the common formats
//!   below) or an epoch word (`unix`, `unix_ms`, `unix_us`, `unix_ns`), plus
//!   the [`TimeZone`] used for times that carry no offset.
//! - [`starts_with_timestamp`] / [`parse_any_prefix`]: does a log line begin
//!   with one of the common formats? Hand-written byte checks on the first
//!   few dozen bytes, no allocation, no regex: this runs on every line of a
//!   multiline stream.
//!
//! The common ("auto") formats, each optionally inside `[` `]`:
//!
//! | example | shape |
//! |---|---|
//! | `2025-04-03T10:02:06.561793Z`, `2025-04-03 10:02:06,123`, `2025-04-03T10:02:06+08:00` | ISO 8601 / RFC 3339: date, `T` or space, time, optional `.`/`,` fraction, optional `Z`/`±hh:mm`/`±hhmm`/`±hh` |
//! | `2025/04/03 10:02:06` | the same with `/` in the date (Go's `log`, nginx error log) |
//! | `Apr  3 10:02:06` | syslog (RFC 3164); the year is inferred (see below) |
//! | `03/Apr/2025:10:02:06 +0000` | Apache / nginx access log |
//!
//! Times without an offset are read in the format's time zone (UTC for
//! [`parse_any_prefix`]). A missing year is inferred: the current year,
//! unless that puts the time more than 7 days in the future (then the
//! previous year: December lines read in January) or more than 358 days in
//! the past while the next year would not be in the future (January lines
//! read on 31 December in a zone behind the log's).
//!
//! Every parse returns nanoseconds since the Unix epoch (UTC) and the number
//! of bytes consumed; times outside what `i64` nanoseconds can hold (years
//! 1677..2262) do not parse.
//!
//! Also here: the calendar arithmetic and RFC 3339 formatting that the
//! encoders use for event times, and [`TimeFormatter`], strftime patterns
//! compiled once for writing times (text templates, syslog headers).

mod strftime;

pub use strftime::{TimeFormatter, OUTPUT_DIRECTIVES};

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

const NS: i64 = 1_000_000_000;
const DAY: i64 = 86_400;
/// How far in the future an inferred-year time may be before the previous
/// year is taken instead (clocks of different hosts disagree a little).
const FUTURE_SLACK: i64 = 7 * DAY;

/// Days since 1970-01-01 of a proleptic Gregorian date; the inverse of
/// [`civil_from_days`] (Howard Hinnant's algorithm).
/// `m` is 1..=12 and `d` 1..=31; other values give meaningless results.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    // Months counted from March so that the leap day is the year's last.
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// True for Gregorian leap years.
pub fn is_leap_year(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

/// Days in month `m` (1..=12) of year `y`; 0 for an invalid month.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(y) => 29,
        2 => 28,
        _ => 0,
    }
}

// ---------------------------------------------------------------------------
// Time zones

/// The zone in which times without an explicit offset are read.
#[derive(Debug, Clone, PartialEq)]
pub enum TimeZone {
    /// Coordinated Universal Time.
    Utc,
    /// A fixed offset, in seconds east of UTC.
    Fixed(i32),
    /// A zone with rules (daylight saving time): an IANA name or the
    /// system's local zone.
    Named(jiff::tz::TimeZone),
}

impl TimeZone {
    /// Reads a configuration value: `UTC` (also `utc`, `Z`, `GMT`), `local`
    /// (the `TZ` variable or `/etc/localtime`), a fixed offset (`+08:00`,
    /// `+0800`, `-05`) or an IANA name (`Asia/Shanghai`; the system's
    /// database, else a copy built into the binary).
    pub fn from_name(name: &str) -> Result<Self, String> {
        let name = name.trim();
        match name {
            "UTC" | "utc" | "Utc" | "Z" | "z" | "GMT" | "gmt" | "Etc/UTC" | "Etc/GMT" => {
                return Ok(Self::Utc)
            }
            "local" | "Local" | "LOCAL" => {
                let tz = jiff::tz::TimeZone::try_system().map_err(|e| {
                    format!(
                        "cannot determine the local time zone ({e}); set the `TZ` \
                         environment variable or give a zone such as `Europe/Paris`"
                    )
                })?;
                return Ok(Self::simplify(tz));
            }
            _ => {}
        }
        if name.starts_with(['+', '-']) {
            let b = name.as_bytes();
            return match zone_offset(b, 0) {
                Some((off, n)) if n == b.len() => Ok(if off == 0 {
                    Self::Utc
                } else {
                    Self::Fixed(off)
                }),
                _ => Err(format!(
                    "invalid offset `{name}`: write `+hh:mm`, `+hhmm` or `+hh`, e.g. `+08:00`"
                )),
            };
        }
        match jiff::tz::TimeZone::get(name) {
            Ok(tz) => Ok(Self::simplify(tz)),
            Err(_) => Err(format!(
                "unknown time zone `{name}`: use `UTC`, `local`, an offset such as \
                 `+08:00`, or an IANA name such as `Asia/Shanghai`"
            )),
        }
    }

    /// Offset east of UTC, in seconds, at `secs` since the epoch.
    pub fn offset_at(&self, secs: i64) -> i32 {
        match self {
            Self::Utc => 0,
            Self::Fixed(off) => *off,
            Self::Named(tz) => match jiff::Timestamp::from_second(secs) {
                Ok(ts) => tz.to_offset(ts).seconds(),
                Err(_) => 0,
            },
        }
    }

    /// Zones without rules become the cheaper fixed variants.
    fn simplify(tz: jiff::tz::TimeZone) -> Self {
        match tz.to_fixed_offset() {
            Ok(o) if o.seconds() == 0 => Self::Utc,
            Ok(o) => Self::Fixed(o.seconds()),
            Err(_) => Self::Named(tz),
        }
    }

    /// UTC seconds of a wall-clock time in this zone. `local` is the same
    /// time counted as if it were UTC. A time skipped by a daylight-saving
    /// jump is moved forward by the jump; a repeated time takes its first
    /// occurrence (the "compatible" rule of RFC 5545 and Temporal).
    fn to_utc(&self, local: i64, c: &Civil) -> Option<i64> {
        match self {
            Self::Utc => Some(local),
            Self::Fixed(off) => Some(local - i64::from(*off)),
            Self::Named(tz) => {
                // jiff has no leap seconds: ask with :59 and keep the offset.
                let sec = c.second.min(59);
                let dt = jiff::civil::DateTime::new(
                    i16::try_from(c.year).ok()?,
                    c.month as i8,
                    c.day as i8,
                    c.hour as i8,
                    c.minute as i8,
                    sec as i8,
                    0,
                )
                .ok()?;
                let ts = tz.to_ambiguous_timestamp(dt).compatible().ok()?;
                let offset = local - i64::from(c.second - sec) - ts.as_second();
                Some(local - offset)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parsed pieces and their conversion

/// A wall-clock date and time as read, before conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanos: u32,
}

/// What a format read from the input.
#[derive(Debug, Clone, Copy)]
struct Parts {
    /// Date and time; `year` is meaningless when `has_year` is false.
    civil: Civil,
    has_year: bool,
    /// Day of year (`%j`), used when the format has no month and day.
    yday: Option<u32>,
    /// Offset east of UTC in seconds, when the input had one.
    offset: Option<i32>,
    /// Seconds since the epoch (`%s`), overriding the date and time.
    epoch: Option<i64>,
    /// `%p`: Some(true) for PM; the hour was read by `%I`.
    pm: Option<bool>,
    /// The epoch value was written with a minus sign (`-0.5` is before 0).
    negative: bool,
}

impl Default for Parts {
    fn default() -> Self {
        Self {
            civil: Civil {
                year: 1970,
                month: 1,
                day: 1,
                hour: 0,
                minute: 0,
                second: 0,
                nanos: 0,
            },
            has_year: true,
            yday: None,
            offset: None,
            epoch: None,
            pm: None,
            negative: false,
        }
    }
}

/// The current time in seconds since the epoch (for year inference).
fn now_secs() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// Converts parts to nanoseconds since the epoch, validating every range.
/// `now` is called only when the year must be inferred.
fn to_ns(p: &Parts, tz: &TimeZone, now: impl FnOnce() -> i64) -> Option<i64> {
    to_ns_slack(p, tz, now, FUTURE_SLACK)
}

/// [`to_ns`] with the future slack of year inference given (seconds).
fn to_ns_slack(
    p: &Parts,
    tz: &TimeZone,
    now: impl FnOnce() -> i64,
    future_slack: i64,
) -> Option<i64> {
    if let Some(e) = p.epoch {
        let frac = i64::from(p.civil.nanos);
        let frac = if p.negative { -frac } else { frac };
        return e.checked_mul(NS)?.checked_add(frac);
    }
    let mut c = p.civil;
    if let Some(pm) = p.pm {
        // %I read 1..=12: 12 AM is midnight, 12 PM is noon.
        if !(1..=12).contains(&c.hour) {
            return None;
        }
        c.hour = c.hour % 12 + if pm { 12 } else { 0 };
    }
    if c.hour > 23 || c.minute > 59 || c.second > 60 || c.nanos >= 1_000_000_000 {
        return None;
    }
    if p.has_year {
        return civil_to_ns(&mut c, p.yday, p.offset, tz);
    }
    // Year inference: see the module documentation.
    let now = now();
    let year = civil_from_days(now.div_euclid(DAY)).0;
    c.year = year;
    let this = civil_to_ns(&mut c.clone(), p.yday, p.offset, tz);
    let this_secs = this.map(|ns| ns.div_euclid(NS));
    match this_secs {
        Some(s) if s > now + future_slack => {
            c.year = year - 1;
            civil_to_ns(&mut c, p.yday, p.offset, tz)
        }
        Some(s) if s < now + future_slack - 365 * DAY => {
            c.year = year + 1;
            match civil_to_ns(&mut c.clone(), p.yday, p.offset, tz) {
                Some(ns) if ns.div_euclid(NS) <= now + future_slack => Some(ns),
                _ => this,
            }
        }
        Some(_) => this,
        // Only 29 February can fail here (the current year is not a leap
        // year); the last leap year is the likely one for a past line.
        None => {
            c.year = year - 1;
            civil_to_ns(&mut c, p.yday, p.offset, tz)
        }
    }
}

/// Validates the date of `c` (filling it from `yday` when given) and
/// converts it.
fn civil_to_ns(
    c: &mut Civil,
    yday: Option<u32>,
    offset: Option<i32>,
    tz: &TimeZone,
) -> Option<i64> {
    if let Some(yd) = yday {
        let len = if is_leap_year(c.year) { 366 } else { 365 };
        if !(1..=len).contains(&yd) {
            return None;
        }
        let (_, m, d) = civil_from_days(days_from_civil(c.year, 1, 1) + i64::from(yd) - 1);
        c.month = m;
        c.day = d;
    }
    if c.month == 0 || c.day == 0 || c.day > days_in_month(c.year, c.month) {
        return None;
    }
    let days = days_from_civil(c.year, c.month, c.day);
    let local =
        days * DAY + i64::from(c.hour) * 3600 + i64::from(c.minute) * 60 + i64::from(c.second);
    let utc = match offset {
        Some(off) => local - i64::from(off),
        None => tz.to_utc(local, c)?,
    };
    utc.checked_mul(NS)?.checked_add(i64::from(c.nanos))
}

// ---------------------------------------------------------------------------
// Byte readers shared by the format interpreter and the hand-written checks.
// Each takes the input and a position and returns the value and the new
// position; `None` means "does not match here".

#[inline(always)]
fn digit(b: &[u8], i: usize) -> Option<u32> {
    match b.get(i) {
        Some(c) if c.is_ascii_digit() => Some(u32::from(c - b'0')),
        _ => None,
    }
}

/// Exactly two digits.
#[inline(always)]
fn d2(b: &[u8], i: usize) -> Option<u32> {
    Some(digit(b, i)? * 10 + digit(b, i + 1)?)
}

/// Exactly four digits.
#[inline(always)]
fn d4(b: &[u8], i: usize) -> Option<u32> {
    Some(d2(b, i)? * 100 + d2(b, i + 2)?)
}

/// One to `max` digits, greedy.
#[inline]
fn digits_upto(b: &[u8], i: usize, max: usize) -> Option<(u32, usize)> {
    let mut v = 0u32;
    let mut j = i;
    while j - i < max {
        match digit(b, j) {
            Some(d) => v = v * 10 + d,
            None => break,
        }
        j += 1;
    }
    (j > i).then_some((v, j))
}

/// A fraction after its separator: 1..=9 digits are kept (scaled to
/// nanoseconds); further digits are read and ignored.
#[inline]
fn fraction(b: &[u8], i: usize) -> Option<(u32, usize)> {
    let (mut v, j) = digits_upto(b, i, 9)?;
    for _ in (j - i)..9 {
        v *= 10;
    }
    let mut k = j;
    while digit(b, k).is_some() {
        k += 1;
    }
    Some((v, k))
}

/// `Z`, `z`, or `±hh`, `±hhmm`, `±hh:mm`: seconds east of UTC.
#[inline]
fn zone_offset(b: &[u8], i: usize) -> Option<(i32, usize)> {
    let sign = match b.get(i)? {
        b'Z' | b'z' => return Some((0, i + 1)),
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let h = d2(b, i + 1)?;
    let (m, end) = match b.get(i + 3) {
        Some(b':') => (d2(b, i + 4)?, i + 6),
        Some(c) if c.is_ascii_digit() => (d2(b, i + 3)?, i + 5),
        _ => (0, i + 3),
    };
    if h > 23 || m > 59 {
        return None;
    }
    Some((sign * (h * 3600 + m * 60) as i32, end))
}

/// Month names, lower case.
const MONTHS: [&[u8]; 12] = [
    b"january",
    b"february",
    b"march",
    b"april",
    b"may",
    b"june",
    b"july",
    b"august",
    b"september",
    b"october",
    b"november",
    b"december",
];
const WEEKDAYS: [&[u8]; 7] = [
    b"monday",
    b"tuesday",
    b"wednesday",
    b"thursday",
    b"friday",
    b"saturday",
    b"sunday",
];

/// Three ASCII letters, lower-cased, packed for a cheap `match`.
#[inline(always)]
fn lower3(b: &[u8], i: usize) -> Option<[u8; 3]> {
    let s = b.get(i..i + 3)?;
    if !s.iter().all(u8::is_ascii_alphabetic) {
        return None;
    }
    Some([s[0] | 0x20, s[1] | 0x20, s[2] | 0x20])
}

/// A three-letter month abbreviation, any case: month 1..=12.
#[inline(always)]
fn month_abbr(b: &[u8], i: usize) -> Option<u32> {
    Some(match &lower3(b, i)? {
        b"jan" => 1,
        b"feb" => 2,
        b"mar" => 3,
        b"apr" => 4,
        b"may" => 5,
        b"jun" => 6,
        b"jul" => 7,
        b"aug" => 8,
        b"sep" => 9,
        b"oct" => 10,
        b"nov" => 11,
        b"dec" => 12,
        _ => return None,
    })
}

/// Index of `b[i..]`'s abbreviation among `names`, and the end of the full
/// name when it is written out, else of the abbreviation.
fn name_in(b: &[u8], i: usize, names: &[&[u8]]) -> Option<(usize, usize)> {
    let l = lower3(b, i)?;
    let idx = names.iter().position(|n| n[..3] == l)?;
    let rest = &names[idx][3..];
    let end = i + 3 + rest.len();
    match b.get(i + 3..end) {
        Some(s) if !rest.is_empty() && s.eq_ignore_ascii_case(rest) => Some((idx, end)),
        _ => Some((idx, i + 3)),
    }
}

// ---------------------------------------------------------------------------
// The common formats, hand-written

/// Reads one of the common formats at the start of `b`.
#[inline]
fn scan_auto(b: &[u8]) -> Option<(Parts, usize)> {
    let first = *b.first()?;
    let (bracket, i) = if first == b'[' { (true, 1) } else { (false, 0) };
    let c = *b.get(i)?;
    let (parts, end) = if c.is_ascii_digit() {
        match b.get(i + 2)? {
            b'/' => scan_clf(b, i)?,
            _ => scan_iso(b, i)?,
        }
    } else if c.is_ascii_alphabetic() {
        scan_syslog(b, i)?
    } else {
        return None;
    };
    if bracket {
        if b.get(end) != Some(&b']') {
            return None;
        }
        return Some((parts, end + 1));
    }
    Some((parts, end))
}

/// `YYYY-MM-DD[T ]hh:mm:ss[.frac][zone]`, also with `/` in the date.
#[inline]
fn scan_iso(b: &[u8], i: usize) -> Option<(Parts, usize)> {
    let year = d4(b, i)?;
    let sep = *b.get(i + 4)?;
    if (sep != b'-' && sep != b'/') || b.get(i + 7) != Some(&sep) {
        return None;
    }
    let month = d2(b, i + 5)?;
    let day = d2(b, i + 8)?;
    if !matches!(b.get(i + 10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let (hour, minute, second, nanos, mut j) = hms_frac(b, i + 11)?;
    let mut offset = None;
    if let Some((off, k)) = zone_offset(b, j) {
        offset = Some(off);
        j = k;
    }
    let civil = Civil {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
        nanos,
    };
    Some((
        Parts {
            civil,
            offset,
            ..Parts::default()
        },
        j,
    ))
}

/// `hh:mm:ss` and an optional `.`/`,` fraction.
#[inline(always)]
fn hms_frac(b: &[u8], i: usize) -> Option<(u32, u32, u32, u32, usize)> {
    let hour = d2(b, i)?;
    if b.get(i + 2) != Some(&b':') || b.get(i + 5) != Some(&b':') {
        return None;
    }
    let minute = d2(b, i + 3)?;
    let second = d2(b, i + 6)?;
    let mut j = i + 8;
    let mut nanos = 0;
    if matches!(b.get(j), Some(b'.' | b',')) {
        if let Some((n, k)) = fraction(b, j + 1) {
            nanos = n;
            j = k;
        }
    }
    Some((hour, minute, second, nanos, j))
}

/// `Mmm dd hh:mm:ss[.frac]` with the day space-padded or not.
#[inline]
fn scan_syslog(b: &[u8], i: usize) -> Option<(Parts, usize)> {
    let month = month_abbr(b, i)?;
    if b.get(i + 3) != Some(&b' ') {
        return None;
    }
    let mut j = i + 4;
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    let (day, k) = digits_upto(b, j, 2)?;
    if b.get(k) != Some(&b' ') {
        return None;
    }
    let (hour, minute, second, nanos, end) = hms_frac(b, k + 1)?;
    let civil = Civil {
        year: 0,
        month,
        day,
        hour,
        minute,
        second,
        nanos,
    };
    Some((
        Parts {
            civil,
            has_year: false,
            ..Parts::default()
        },
        end,
    ))
}

/// Common Log Format: `dd/Mmm/yyyy:hh:mm:ss[ ±hhmm]`.
#[inline]
fn scan_clf(b: &[u8], i: usize) -> Option<(Parts, usize)> {
    let day = d2(b, i)?;
    let month = month_abbr(b, i + 3)?;
    if b.get(i + 6) != Some(&b'/') || b.get(i + 11) != Some(&b':') {
        return None;
    }
    let year = d4(b, i + 7)?;
    let (hour, minute, second, nanos, mut j) = hms_frac(b, i + 12)?;
    let mut offset = None;
    if b.get(j) == Some(&b' ') {
        if let Some((off, k)) = zone_offset(b, j + 1) {
            offset = Some(off);
            j = k;
        }
    }
    let civil = Civil {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
        nanos,
    };
    Some((
        Parts {
            civil,
            offset,
            ..Parts::default()
        },
        j,
    ))
}

/// Checks the ranges the scanners leave open, without converting (so no
/// time zone and no clock are needed). Day-of-month is checked against
/// the month's longest length when the year is unknown.
#[inline]
fn plausible(p: &Parts) -> bool {
    let c = &p.civil;
    let max_day = if p.has_year {
        days_in_month(c.year, c.month)
    } else {
        days_in_month(2000, c.month)
    };
    c.day >= 1 && c.day <= max_day && c.hour <= 23 && c.minute <= 59 && c.second <= 60
}

/// A prefix match must not end in the middle of a number
/// (`10:02:061` is not a time).
#[inline(always)]
fn at_boundary(b: &[u8], end: usize) -> bool {
    !matches!(b.get(end), Some(c) if c.is_ascii_digit())
}

/// True when `line` begins with one of the common timestamp formats (see
/// the module documentation), with valid ranges. Looks at the first few
/// dozen bytes only; a line that starts with anything other than a digit,
/// a letter or `[` is rejected at the first byte.
#[inline]
pub fn starts_with_timestamp(line: &[u8]) -> bool {
    match scan_auto(line) {
        Some((p, end)) => plausible(&p) && at_boundary(line, end),
        None => false,
    }
}

/// Parses a common-format timestamp at the start of `line` (times without
/// an offset are UTC; syslog's missing year is inferred). Returns
/// nanoseconds since the epoch and the bytes consumed (the closing `]`
/// included for bracketed forms).
pub fn parse_any_prefix(line: &[u8]) -> Option<(i64, usize)> {
    parse_any_prefix_in(line, &TimeZone::Utc)
}

/// [`parse_any_prefix`] with times without an offset read in `tz`.
pub fn parse_any_prefix_in(line: &[u8], tz: &TimeZone) -> Option<(i64, usize)> {
    let (p, end) = scan_auto(line)?;
    if !plausible(&p) || !at_boundary(line, end) {
        return None;
    }
    Some((to_ns(&p, tz, now_secs)?, end))
}

/// Parses an RFC 3164 (BSD syslog) timestamp at the start of `line`:
/// `Mmm dd hh:mm:ss[.frac]` (day space-padded or not), or
/// `Mmm dd yyyy hh:mm:ss[.frac]` as some network devices write it (Cisco's
/// `service timestamps log datetime year`). Times are read in `tz`.
///
/// A missing year is inferred relative to `now_secs` (seconds since the
/// epoch) as in the module documentation, but with the caller's
/// `future_slack_secs` instead of 7 days: a syslog receiver knows the
/// message was just sent, so it can use a tight bound (a day) where a file
/// reader cannot. Explicit `now` keeps the result reproducible in tests.
///
/// Returns nanoseconds since the epoch and the bytes consumed; `None` when
/// the prefix is not such a timestamp, has invalid ranges, or is followed
/// directly by a digit.
pub fn parse_syslog_prefix_at(
    line: &[u8],
    tz: &TimeZone,
    now_secs: i64,
    future_slack_secs: i64,
) -> Option<(i64, usize)> {
    let (p, end) = match scan_syslog(line, 0) {
        Some(r) => r,
        None => scan_syslog_year(line)?,
    };
    if !plausible(&p) || !at_boundary(line, end) {
        return None;
    }
    Some((to_ns_slack(&p, tz, || now_secs, future_slack_secs)?, end))
}

/// `Mmm dd yyyy hh:mm:ss[.frac]` (day space-padded or not).
fn scan_syslog_year(b: &[u8]) -> Option<(Parts, usize)> {
    let month = month_abbr(b, 0)?;
    if b.get(3) != Some(&b' ') {
        return None;
    }
    let mut j = 4;
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    let (day, k) = digits_upto(b, j, 2)?;
    if b.get(k) != Some(&b' ') || b.get(k + 5) != Some(&b' ') {
        return None;
    }
    let year = d4(b, k + 1)?;
    let (hour, minute, second, nanos, end) = hms_frac(b, k + 6)?;
    let civil = Civil {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
        nanos,
    };
    Some((
        Parts {
            civil,
            ..Parts::default()
        },
        end,
    ))
}

// ---------------------------------------------------------------------------
// Compiled formats

/// A format that could not be compiled; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FormatError {}

/// The directives a format may use, for error messages.
pub const DIRECTIVES: &str =
    "%Y %y %m %d %e %j %H %I %p %M %S %f %.f %z %:z %Z %s %b %B %h %a %A %T %F %R %D %%";

/// One step of a compiled format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// A byte that must be there.
    Lit(u8),
    /// One or more spaces or tabs (a space in the format).
    Space,
    /// `%Y`: four digits.
    Year,
    /// `%y`: two digits, 69..=99 → 19xx, 00..=68 → 20xx.
    Year2,
    /// `%m`: 1..=2 digits.
    Month,
    /// `%b` `%B` `%h`: month name, abbreviated or full, any case.
    MonthName,
    /// `%d`: 1..=2 digits.
    Day,
    /// `%e`: an optional space, then 1..=2 digits.
    DaySpace,
    /// `%j`: day of the year, 1..=3 digits.
    YearDay,
    /// `%H`: 1..=2 digits.
    Hour,
    /// `%I`: 1..=2 digits, 12-hour clock (needs `%p`).
    Hour12,
    /// `%p`: `AM` or `PM`, any case.
    AmPm,
    /// `%M`: 1..=2 digits.
    Minute,
    /// `%S`: 1..=2 digits (60 allowed for a leap second).
    Second,
    /// `%f`: 1..=9 fraction digits (more are read and ignored).
    Frac,
    /// `%.f`: optional `.` or `,` and fraction digits.
    OptFrac,
    /// `%z` `%:z`: `Z`, `±hh`, `±hhmm`, `±hh:mm`.
    Offset,
    /// `%Z`: `UTC`, `GMT` or `Z`.
    ZoneName,
    /// `%s`: seconds since the epoch, optionally negative.
    Epoch,
    /// `%a` `%A`: weekday name, read and ignored.
    Weekday,
}

/// Epoch units of the `unix*` format words, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochUnit {
    Seconds,
    Millis,
    Micros,
    Nanos,
}

impl EpochUnit {
    fn ns(self) -> i64 {
        match self {
            Self::Seconds => NS,
            Self::Millis => 1_000_000,
            Self::Micros => 1_000,
            Self::Nanos => 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// The common formats (plus bare epoch numbers for whole values).
    Auto,
    /// `unix`, `unix_ms`, `unix_us`, `unix_ns`.
    Epoch(EpochUnit),
    /// A strftime-like pattern.
    Pattern(Vec<Item>),
}

/// A compiled timestamp format and the zone for times without an offset.
/// Cheap to share between threads; parsing never allocates.
#[derive(Debug, Clone, PartialEq)]
pub struct TimestampFormat {
    kind: Kind,
    tz: TimeZone,
}

impl TimestampFormat {
    /// Compiles `spec`:
    ///
    /// - `auto`: the common formats of the module documentation; for a whole
    ///   value, also a bare epoch number whose digit count gives the unit
    ///   (9–10: seconds, with an optional fraction; 12–13: ms; 15–16: µs;
    ///   18–19: ns; other lengths do not parse).
    /// - `unix`, `unix_ms`, `unix_us`, `unix_ns`: an epoch number in that
    ///   unit, optionally negative; `unix` accepts a fraction.
    /// - otherwise a pattern of literal bytes and the directives in
    ///   [`DIRECTIVES`]. A space matches one or more spaces or tabs;
    ///   numbers other than `%Y` may have fewer digits than their width.
    ///   `%T` = `%H:%M:%S`, `%F` = `%Y-%m-%d`, `%R` = `%H:%M`,
    ///   `%D` = `%m/%d/%y`. The pattern needs a date (`%m` and `%d`, or
    ///   `%j`; the year may be missing and is then inferred) or `%s`.
    pub fn new(spec: &str, tz: TimeZone) -> Result<Self, FormatError> {
        let kind = match spec {
            "auto" => Kind::Auto,
            "unix" => Kind::Epoch(EpochUnit::Seconds),
            "unix_ms" => Kind::Epoch(EpochUnit::Millis),
            "unix_us" => Kind::Epoch(EpochUnit::Micros),
            "unix_ns" => Kind::Epoch(EpochUnit::Nanos),
            _ => Kind::Pattern(compile(spec)?),
        };
        Ok(Self { kind, tz })
    }

    /// The common formats, times without an offset read in `tz`.
    pub fn auto(tz: TimeZone) -> Self {
        Self {
            kind: Kind::Auto,
            tz,
        }
    }

    /// The zone used for times without an offset.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// Parses `input` that must hold the timestamp alone (ASCII whitespace
    /// around it is allowed). Returns nanoseconds since the epoch and the
    /// end of the timestamp in `input`.
    pub fn parse(&self, input: &[u8]) -> Option<(i64, usize)> {
        self.parse_at(input, now_secs)
    }

    /// Parses a timestamp at the very start of `input`; what follows it is
    /// not looked at (beyond not continuing a number). Returns nanoseconds
    /// since the epoch and the bytes consumed.
    pub fn parse_prefix(&self, input: &[u8]) -> Option<(i64, usize)> {
        self.parse_prefix_at(input, now_secs)
    }

    /// Reads an integer field value: an epoch in this format's unit (`auto`:
    /// the unit given by the number of digits, as for text; a pattern: only
    /// `%s` alone, in seconds).
    pub fn from_integer(&self, n: i64) -> Option<i64> {
        let unit = match &self.kind {
            Kind::Epoch(u) => *u,
            Kind::Auto => auto_epoch_unit(n.unsigned_abs().checked_ilog10()? as usize + 1)?,
            Kind::Pattern(items) if items.as_slice() == [Item::Epoch] => EpochUnit::Seconds,
            Kind::Pattern(_) => return None,
        };
        n.checked_mul(unit.ns())
    }

    /// Reads a floating point field value, as [`Self::from_integer`] does
    /// (fractions of the unit are kept to the nanosecond).
    pub fn from_float(&self, x: f64) -> Option<i64> {
        if !x.is_finite() {
            return None;
        }
        let unit = match &self.kind {
            Kind::Epoch(u) => *u,
            Kind::Auto => auto_epoch_unit(x.abs().trunc().max(1.0).log10() as usize + 1)?,
            Kind::Pattern(items) if items.as_slice() == [Item::Epoch] => EpochUnit::Seconds,
            Kind::Pattern(_) => return None,
        };
        let ns = x * unit.ns() as f64;
        // i64::MAX as f64 rounds up to 2^63, which does not fit.
        (ns.abs() < 9.2e18).then_some(ns.round() as i64)
    }

    fn parse_at(&self, input: &[u8], now: impl FnOnce() -> i64) -> Option<(i64, usize)> {
        let start = input.iter().position(|c| !c.is_ascii_whitespace())?;
        let s = &input[start..];
        let (ns, n) = match &self.kind {
            Kind::Auto => {
                let rest = s.trim_ascii_end();
                match scan_auto(rest) {
                    Some((p, end)) if end == rest.len() && plausible(&p) => {
                        (to_ns(&p, &self.tz, now)?, end)
                    }
                    _ => (parse_epoch_auto(rest)?, rest.len()),
                }
            }
            Kind::Epoch(u) => {
                let rest = s.trim_ascii_end();
                (parse_epoch(rest, *u)?, rest.len())
            }
            Kind::Pattern(items) => {
                let (p, end) = run(items, s)?;
                if !s[end..].iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                (to_ns(&p, &self.tz, now)?, end)
            }
        };
        Some((ns, start + n))
    }

    fn parse_prefix_at(&self, input: &[u8], now: impl FnOnce() -> i64) -> Option<(i64, usize)> {
        let (p, end) = match &self.kind {
            Kind::Auto => {
                let (p, end) = scan_auto(input)?;
                if !plausible(&p) {
                    return None;
                }
                (p, end)
            }
            Kind::Epoch(u) => {
                let end = epoch_len(input, *u == EpochUnit::Seconds);
                return Some((parse_epoch(input.get(..end)?, *u)?, end));
            }
            Kind::Pattern(items) => run(items, input)?,
        };
        if !at_boundary(input, end) {
            return None;
        }
        Some((to_ns(&p, &self.tz, now)?, end))
    }
}

/// The unit of an `auto` epoch number with `digits` integer digits.
fn auto_epoch_unit(digits: usize) -> Option<EpochUnit> {
    match digits {
        9 | 10 => Some(EpochUnit::Seconds),
        12 | 13 => Some(EpochUnit::Millis),
        15 | 16 => Some(EpochUnit::Micros),
        18 | 19 => Some(EpochUnit::Nanos),
        _ => None,
    }
}

/// Length of an epoch number at the start of `b`: optional `-`, digits,
/// and a `.` fraction when allowed.
fn epoch_len(b: &[u8], frac: bool) -> usize {
    let mut i = usize::from(b.first() == Some(&b'-'));
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    if frac && b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    i
}

/// `b` entirely an epoch number in `unit` (a fraction only for seconds).
fn parse_epoch(b: &[u8], unit: EpochUnit) -> Option<i64> {
    let (neg, digits) = match b.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, b),
    };
    let int_end = digits
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    if int_end == 0 || int_end > 19 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in &digits[..int_end] {
        v = v.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
    }
    let mut ns = v.checked_mul(unit.ns())?;
    if int_end < digits.len() {
        if unit != EpochUnit::Seconds || digits[int_end] != b'.' {
            return None;
        }
        let (f, end) = fraction(digits, int_end + 1)?;
        if end != digits.len() {
            return None;
        }
        ns = ns.checked_add(i64::from(f))?;
    }
    Some(if neg { -ns } else { ns })
}

/// `auto` on a whole value that is not a date: an epoch number whose digit
/// count gives the unit.
fn parse_epoch_auto(b: &[u8]) -> Option<i64> {
    let digits = b
        .iter()
        .skip(usize::from(b.first() == Some(&b'-')))
        .take_while(|c| c.is_ascii_digit())
        .count();
    parse_epoch(b, auto_epoch_unit(digits)?)
}

/// Compiles a pattern into items.
fn compile(spec: &str) -> Result<Vec<Item>, FormatError> {
    use Item::*;
    let b = spec.as_bytes();
    let mut items = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c == b' ' {
            // Consecutive spaces already match as one run.
            if items.last() != Some(&Space) {
                items.push(Space);
            }
            continue;
        }
        if c != b'%' {
            items.push(Lit(c));
            continue;
        }
        let Some(&d) = b.get(i) else {
            return Err(FormatError(format!(
                "format `{spec}` ends with a lone `%`; write `%%` for a literal percent sign"
            )));
        };
        i += 1;
        match d {
            b'Y' => items.push(Year),
            b'y' => items.push(Year2),
            b'm' => items.push(Month),
            b'b' | b'B' | b'h' => items.push(MonthName),
            b'd' => items.push(Day),
            b'e' => items.push(DaySpace),
            b'j' => items.push(YearDay),
            b'H' => items.push(Hour),
            b'I' => items.push(Hour12),
            b'p' => items.push(AmPm),
            b'M' => items.push(Minute),
            b'S' => items.push(Second),
            b'f' => items.push(Frac),
            b'z' => items.push(Offset),
            b'Z' => items.push(ZoneName),
            b's' => items.push(Epoch),
            b'a' | b'A' => items.push(Weekday),
            b'T' => items.extend([Hour, Lit(b':'), Minute, Lit(b':'), Second]),
            b'F' => items.extend([Year, Lit(b'-'), Month, Lit(b'-'), Day]),
            b'R' => items.extend([Hour, Lit(b':'), Minute]),
            b'D' => items.extend([Month, Lit(b'/'), Day, Lit(b'/'), Year2]),
            b'%' => items.push(Lit(b'%')),
            b'.' if b.get(i) == Some(&b'f') => {
                i += 1;
                items.push(OptFrac);
            }
            b':' if b.get(i) == Some(&b'z') => {
                i += 1;
                items.push(Offset);
            }
            _ => {
                let bad: String = spec[i - 2..].chars().take(2).collect();
                return Err(FormatError(format!(
                    "unknown directive `{bad}` in format `{spec}`; supported: {DIRECTIVES}"
                )));
            }
        }
    }
    let has = |it: Item| items.contains(&it);
    let has_date = (has(Month) || has(MonthName)) && (has(Day) || has(DaySpace)) || has(YearDay);
    if !has(Epoch) && !has_date {
        return Err(FormatError(format!(
            "format `{spec}` has no date: add month and day (`%m`/`%b` and `%d`), a day of \
             the year (`%j`), or use `%s` for epoch seconds"
        )));
    }
    if has(Hour12) != has(AmPm) {
        return Err(FormatError(format!(
            "format `{spec}` must use `%I` (12-hour clock) and `%p` (AM/PM) together"
        )));
    }
    Ok(items)
}

/// Runs compiled `items` over the start of `b`.
fn run(items: &[Item], b: &[u8]) -> Option<(Parts, usize)> {
    let mut p = Parts {
        has_year: false,
        ..Parts::default()
    };
    let mut i = 0;
    for item in items {
        match *item {
            Item::Lit(c) => {
                if b.get(i) != Some(&c) {
                    return None;
                }
                i += 1;
            }
            Item::Space => {
                let n = b[i.min(b.len())..]
                    .iter()
                    .take_while(|c| **c == b' ' || **c == b'\t')
                    .count();
                if n == 0 {
                    return None;
                }
                i += n;
            }
            Item::Year => {
                p.civil.year = i64::from(d4(b, i)?);
                p.has_year = true;
                i += 4;
            }
            Item::Year2 => {
                let y = d2(b, i)?;
                p.civil.year = i64::from(if y >= 69 { 1900 + y } else { 2000 + y });
                p.has_year = true;
                i += 2;
            }
            Item::Month => (p.civil.month, i) = digits_upto(b, i, 2)?,
            Item::MonthName => {
                let (idx, end) = name_in(b, i, &MONTHS)?;
                p.civil.month = idx as u32 + 1;
                i = end;
            }
            Item::Day => (p.civil.day, i) = digits_upto(b, i, 2)?,
            Item::DaySpace => {
                if b.get(i) == Some(&b' ') {
                    i += 1;
                }
                (p.civil.day, i) = digits_upto(b, i, 2)?;
            }
            Item::YearDay => {
                let (v, end) = digits_upto(b, i, 3)?;
                p.yday = Some(v);
                i = end;
            }
            Item::Hour | Item::Hour12 => (p.civil.hour, i) = digits_upto(b, i, 2)?,
            Item::AmPm => {
                let s = b.get(i..i + 2)?;
                p.pm = Some(match [s[0] | 0x20, s[1] | 0x20] {
                    [b'a', b'm'] => false,
                    [b'p', b'm'] => true,
                    _ => return None,
                });
                i += 2;
            }
            Item::Minute => (p.civil.minute, i) = digits_upto(b, i, 2)?,
            Item::Second => (p.civil.second, i) = digits_upto(b, i, 2)?,
            Item::Frac => (p.civil.nanos, i) = fraction(b, i)?,
            Item::OptFrac => {
                if matches!(b.get(i), Some(b'.' | b',')) {
                    if let Some((n, end)) = fraction(b, i + 1) {
                        p.civil.nanos = n;
                        i = end;
                    }
                }
            }
            Item::Offset => (p.offset, i) = zone_offset(b, i).map(|(o, e)| (Some(o), e))?,
            Item::ZoneName => {
                if b.get(i) == Some(&b'Z') {
                    i += 1;
                } else {
                    let s = b.get(i..i + 3)?;
                    if s != b"UTC" && s != b"GMT" {
                        return None;
                    }
                    i += 3;
                }
                p.offset = Some(0);
            }
            Item::Epoch => {
                let neg = b.get(i) == Some(&b'-');
                let start = i + usize::from(neg);
                let end = start
                    + b[start.min(b.len())..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .count();
                if end == start || end - start > 19 {
                    return None;
                }
                let mut v: i64 = 0;
                for &c in &b[start..end] {
                    v = v.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
                }
                p.epoch = Some(if neg { -v } else { v });
                p.negative = neg;
                i = end;
            }
            Item::Weekday => (_, i) = name_in(b, i, &WEEKDAYS)?,
        }
    }
    Some((p, i))
}

/// Writes nanoseconds since the epoch as RFC 3339 in UTC with nanoseconds.
pub fn write_rfc3339(ns: i64, out: &mut Vec<u8>) {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    // Digits placed directly: `write!` with seven padded numbers cost as
    // much as the rest of an ndjson event with a timestamp (profile of the
    // kafka source into a file, bench/aggregator.py). i64 nanoseconds span
    // the years 1677–2262, so four digits always hold the year.
    let mut b = *b"0000-00-00T00:00:00.000000000Z";
    put_digits(&mut b[0..4], y.clamp(0, 9999) as u64);
    put_digits(&mut b[5..7], m as u64);
    put_digits(&mut b[8..10], d as u64);
    put_digits(&mut b[11..13], (sod / 3600) as u64);
    put_digits(&mut b[14..16], (sod % 3600 / 60) as u64);
    put_digits(&mut b[17..19], (sod % 60) as u64);
    put_digits(&mut b[20..29], nanos as u64);
    out.extend_from_slice(&b);
}

/// Writes `v` as decimal digits filling `dst`, zero-padded on the left.
fn put_digits(dst: &mut [u8], mut v: u64) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_digits_match_formatting() {
        for ns in [
            0,
            -1,
            1,
            i64::MIN,
            i64::MAX,
            1_795_661_898_941_000_000,
            951_782_400_123_456_789,
            -86_400_000_000_001,
        ] {
            let secs = ns.div_euclid(1_000_000_000);
            let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
            let sod = secs.rem_euclid(86_400);
            let want = format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
                sod / 3600,
                sod % 3600 / 60,
                sod % 60,
                ns.rem_euclid(1_000_000_000)
            );
            assert_eq!(rfc(ns), want, "{ns}");
        }
        assert_eq!(rfc(0), "1970-01-01T00:00:00.000000000Z");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    /// A fixed "now" for year inference: 2025-06-15T00:00:00Z.
    const NOW: i64 = 1_749_945_600;

    fn rfc(ns: i64) -> String {
        let mut out = Vec::new();
        write_rfc3339(ns, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn fmt(spec: &str) -> TimestampFormat {
        TimestampFormat::new(spec, TimeZone::Utc).unwrap()
    }

    fn p(spec: &str, input: &str) -> Option<String> {
        fmt(spec)
            .parse_at(input.as_bytes(), || NOW)
            .map(|(ns, _)| rfc(ns))
    }

    #[test]
    fn days_round_trip_and_leap_years() {
        for z in (-800_000..800_000).step_by(97) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28),
            2
        );
        assert_eq!(
            days_from_civil(1900, 3, 1) - days_from_civil(1900, 2, 28),
            1
        );
        assert!(
            is_leap_year(2000) && is_leap_year(2024) && !is_leap_year(1900) && !is_leap_year(2025)
        );
        assert_eq!(
            p("%F %T", "2024-02-29 12:00:00").as_deref(),
            Some("2024-02-29T12:00:00.000000000Z")
        );
        assert_eq!(p("%F %T", "2025-02-29 12:00:00"), None);
        assert_eq!(p("%F %T", "1900-02-29 12:00:00"), None);
        assert_eq!(
            p("%F %T", "2000-02-29 12:00:00").as_deref(),
            Some("2000-02-29T12:00:00.000000000Z")
        );
    }

    #[test]
    fn month_ends() {
        for (m, last) in [
            (1, 31),
            (3, 31),
            (4, 30),
            (6, 30),
            (9, 30),
            (11, 30),
            (12, 31),
        ] {
            let ok = format!("2025-{m:02}-{last} 00:00:00");
            let bad = format!("2025-{m:02}-{} 00:00:00", last + 1);
            assert!(p("%F %T", &ok).is_some(), "{ok}");
            assert!(p("%F %T", &bad).is_none(), "{bad}");
        }
        assert_eq!(
            p("%F %T", "2025-12-31 23:59:59").as_deref(),
            Some("2025-12-31T23:59:59.000000000Z")
        );
    }

    #[test]
    fn fraction_precision_1_to_9_and_beyond() {
        let f = "%Y-%m-%dT%H:%M:%S.%f";
        let expect = [
            "5",
            "56",
            "561",
            "5617",
            "56179",
            "561793",
            "5617931",
            "56179312",
            "561793123",
        ];
        for digits in expect {
            let got = p(f, &format!("2025-04-03T10:02:06.{digits}")).unwrap();
            let want = format!("2025-04-03T10:02:06.{digits:0<9}Z");
            assert_eq!(got, want);
        }
        // Digits past nanoseconds are read and dropped.
        assert_eq!(
            p(f, "2025-04-03T10:02:06.1234567891").as_deref(),
            Some("2025-04-03T10:02:06.123456789Z")
        );
        assert_eq!(p(f, "2025-04-03T10:02:06."), None);
        // `%.f` is optional and takes `,` too.
        let g = "%F %T%.f";
        assert_eq!(
            p(g, "2025-04-03 10:02:06").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p(g, "2025-04-03 10:02:06,123").as_deref(),
            Some("2025-04-03T10:02:06.123000000Z")
        );
    }

    #[test]
    fn offsets() {
        let f = "%FT%T%z";
        assert_eq!(
            p(f, "2025-04-03T10:02:06Z").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p(f, "2025-04-03T10:02:06+08:00").as_deref(),
            Some("2025-04-03T02:02:06.000000000Z")
        );
        assert_eq!(
            p(f, "2025-04-03T10:02:06+0800").as_deref(),
            Some("2025-04-03T02:02:06.000000000Z")
        );
        assert_eq!(
            p(f, "2025-04-03T10:02:06-05").as_deref(),
            Some("2025-04-03T15:02:06.000000000Z")
        );
        assert_eq!(
            p(f, "2025-04-03T00:30:00+05:45").as_deref(),
            Some("2025-04-02T18:45:00.000000000Z")
        );
        assert_eq!(p(f, "2025-04-03T10:02:06+24:00"), None);
        assert_eq!(p(f, "2025-04-03T10:02:06+08:60"), None);
        assert_eq!(p(f, "2025-04-03T10:02:06"), None);
        assert_eq!(
            p("%F %T %Z", "2025-04-03 10:02:06 UTC").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        // The default zone applies only when the input has no offset.
        let f1 = TimestampFormat::new("%F %T%z", TimeZone::Fixed(3600)).unwrap();
        assert_eq!(
            f1.parse(b"2025-04-03 10:02:06Z")
                .map(|x| rfc(x.0))
                .as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        let f8 = TimestampFormat::new("%F %T", TimeZone::from_name("+08:00").unwrap()).unwrap();
        assert_eq!(
            f8.parse(b"2025-04-03 10:02:06")
                .map(|x| rfc(x.0))
                .as_deref(),
            Some("2025-04-03T02:02:06.000000000Z")
        );
    }

    #[test]
    fn named_zones_and_dst() {
        let ny = TimeZone::from_name("America/New_York").unwrap();
        assert!(matches!(ny, TimeZone::Named(_)));
        let f = TimestampFormat::new("%F %T", ny).unwrap();
        let r = |s: &str| f.parse(s.as_bytes()).map(|x| rfc(x.0));
        assert_eq!(
            r("2025-01-15 12:00:00").as_deref(),
            Some("2025-01-15T17:00:00.000000000Z")
        );
        assert_eq!(
            r("2025-07-15 12:00:00").as_deref(),
            Some("2025-07-15T16:00:00.000000000Z")
        );
        // 02:30 does not exist on 2025-03-09: moved forward by the hour.
        assert_eq!(
            r("2025-03-09 02:30:00").as_deref(),
            Some("2025-03-09T07:30:00.000000000Z")
        );
        // 01:30 happens twice on 2025-11-02: the first (EDT) is taken.
        assert_eq!(
            r("2025-11-02 01:30:00").as_deref(),
            Some("2025-11-02T05:30:00.000000000Z")
        );
        assert_eq!(TimeZone::from_name("UTC").unwrap(), TimeZone::Utc);
        assert_eq!(
            TimeZone::from_name("-05:30").unwrap(),
            TimeZone::Fixed(-19_800)
        );
        assert!(TimeZone::from_name("Mars/Olympus")
            .unwrap_err()
            .contains("unknown time zone"));
        assert!(TimeZone::from_name("+25:00")
            .unwrap_err()
            .contains("invalid offset"));
        assert!(TimeZone::from_name("local").is_ok());
    }

    #[test]
    fn directives() {
        assert_eq!(
            p("%d/%b/%Y:%T %z", "03/Apr/2025:10:02:06 +0000").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p("%a, %d %B %Y %T", "Thursday, 03 april 2025 10:02:06").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p("%D %I:%M %p", "4/3/25 12:05 AM").as_deref(),
            Some("2025-04-03T00:05:00.000000000Z")
        );
        assert_eq!(
            p("%D %I:%M %p", "04/03/25 12:05 pm").as_deref(),
            Some("2025-04-03T12:05:00.000000000Z")
        );
        assert_eq!(p("%D %I:%M %p", "04/03/25 13:05 pm"), None);
        assert_eq!(
            p("%Y %j %R", "2024 366 23:59").as_deref(),
            Some("2024-12-31T23:59:00.000000000Z")
        );
        assert_eq!(p("%Y %j %R", "2025 366 23:59"), None);
        assert_eq!(
            p("%y%m%d%H%M%S", "691231235959").as_deref(),
            Some("1969-12-31T23:59:59.000000000Z")
        );
        assert_eq!(
            p("%s", "1743674526").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p("%s.%f", "1743674526.5").as_deref(),
            Some("2025-04-03T10:02:06.500000000Z")
        );
        assert_eq!(
            p("100%% %F %T", "100% 2025-04-03 10:02:06").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        // A space in the format takes any run of spaces and tabs.
        assert_eq!(
            p("%b %e %T", "Apr  3 10:02:06").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        assert_eq!(
            p("%b %d %T", "Apr \t 3 10:02:06").as_deref(),
            Some("2025-04-03T10:02:06.000000000Z")
        );
        // Leap second: 23:59:60 is the next day's first second.
        assert_eq!(
            p("%F %T", "2016-12-31 23:59:60").as_deref(),
            Some("2017-01-01T00:00:00.000000000Z")
        );
    }

    #[test]
    fn compile_errors() {
        let e = |s: &str| TimestampFormat::new(s, TimeZone::Utc).unwrap_err().0;
        assert!(
            e("%Y-%m-%d %Q").contains("unknown directive `%Q`"),
            "{}",
            e("%Y-%m-%d %Q")
        );
        assert!(e("%F %").contains("lone `%`"));
        assert!(e("%H:%M:%S").contains("has no date"));
        assert!(e("%F %I:%M").contains("`%I`"));
        assert!(e("%F 時%Q").contains("`%Q`"));
        assert!(e("%F %é").contains("`%é`"), "{}", e("%F %é"));
    }

    #[test]
    fn invalid_inputs() {
        let f = "%F %T%.f";
        for bad in [
            "",
            " ",
            "2025-13-01 00:00:00",
            "2025-00-01 00:00:00",
            "2025-04-00 00:00:00",
            "2025-04-31 00:00:00",
            "2025-04-03 24:00:00",
            "2025-04-03 10:60:00",
            "2025-04-03 10:02:61",
            "garbage",
            "2025-04-03",
            "2025-04-03 10:02:06 trailing",
            "２０２５-04-03 10:02:06",
            "20x5-04-03 10:02:06",
        ] {
            assert_eq!(p(f, bad), None, "{bad:?}");
            assert_eq!(p("auto", bad), None, "auto {bad:?}");
        }
        let ff = fmt(f);
        assert_eq!(ff.parse(b"\xff\xfe2025-04-03 10:02:06"), None);
        assert_eq!(ff.parse(b"2025-04-03 10:02:06\xff"), None);
        assert_eq!(
            ff.parse_prefix(b"2025-04-03 10:02:06\xff").map(|x| x.1),
            Some(19)
        );
        // Surrounding whitespace is fine; the end is reported.
        assert_eq!(ff.parse(b"  2025-04-03 10:02:06 \n").map(|x| x.1), Some(21));
        // Years past what i64 nanoseconds hold do not parse.
        assert_eq!(p(f, "2263-01-01 00:00:00"), None);
        assert_eq!(p(f, "1677-01-01 00:00:00"), None);
        assert!(p(f, "2262-01-01 00:00:00").is_some());
        // A huge input is rejected quickly by the pattern, not scanned.
        let big = vec![b'9'; 1 << 20];
        assert_eq!(ff.parse(&big), None);
        assert_eq!(fmt("auto").parse(&big), None);
        assert_eq!(fmt("unix").parse(&big), None);
    }

    #[test]
    fn auto_formats() {
        let a = |s: &str| p("auto", s);
        for (input, want) in [
            (
                "2025-04-03T10:02:06.561793Z",
                "2025-04-03T10:02:06.561793000Z",
            ),
            ("2025-04-03 10:02:06,123", "2025-04-03T10:02:06.123000000Z"),
            (
                "2025-04-03T10:02:06+08:00",
                "2025-04-03T02:02:06.000000000Z",
            ),
            ("2025/04/03 10:02:06", "2025-04-03T10:02:06.000000000Z"),
            (
                "[2025-04-03 10:02:06.561793]",
                "2025-04-03T10:02:06.561793000Z",
            ),
            (
                "03/Apr/2025:10:02:06 +0200",
                "2025-04-03T08:02:06.000000000Z",
            ),
            (
                "[03/Apr/2025:10:02:06 +0000]",
                "2025-04-03T10:02:06.000000000Z",
            ),
            ("Apr  3 10:02:06", "2025-04-03T10:02:06.000000000Z"),
            ("1743674526", "2025-04-03T10:02:06.000000000Z"),
            ("1743674526.25", "2025-04-03T10:02:06.250000000Z"),
            ("1743674526123", "2025-04-03T10:02:06.123000000Z"),
            ("1743674526123456", "2025-04-03T10:02:06.123456000Z"),
            ("1743674526123456789", "2025-04-03T10:02:06.123456789Z"),
        ] {
            assert_eq!(a(input).as_deref(), Some(want), "{input}");
        }
        assert_eq!(a("12345"), None);
        assert_eq!(a("[2025-04-03 10:02:06"), None);
        let au = fmt("auto");
        assert_eq!(
            au.from_integer(1_743_674_526_123).map(rfc).as_deref(),
            Some("2025-04-03T10:02:06.123000000Z")
        );
        assert_eq!(au.from_integer(42), None);
        assert_eq!(
            au.from_float(1_743_674_526.5).map(rfc).as_deref(),
            Some("2025-04-03T10:02:06.500000000Z")
        );
        assert_eq!(fmt("unix_ms").from_integer(-1), Some(-1_000_000));
        assert_eq!(fmt("unix").from_integer(i64::MAX), None);
        assert_eq!(fmt("unix").from_float(f64::NAN), None);
        assert_eq!(fmt("%F").from_integer(1), None);
    }

    #[test]
    fn epoch_words() {
        let u = |spec: &str, s: &str| fmt(spec).parse(s.as_bytes()).map(|x| x.0);
        assert_eq!(u("unix", "-1.5"), Some(-1_500_000_000));
        assert_eq!(u("unix", "0"), Some(0));
        assert_eq!(
            u("unix_ms", "1743674526123"),
            Some(1_743_674_526_123_000_000)
        );
        assert_eq!(u("unix_ms", "1.5"), None);
        assert_eq!(u("unix_ns", "9223372036854775807"), Some(i64::MAX));
        assert_eq!(u("unix_ns", "9223372036854775808"), None);
        assert_eq!(u("unix", "99999999999"), None);
        assert_eq!(u("unix", "12a"), None);
        assert_eq!(u("unix", "-"), None);
        assert_eq!(
            fmt("unix").parse_prefix(b"1743674526 rest").map(|x| x.1),
            Some(10)
        );
    }

    #[test]
    fn syslog_year_inference() {
        let f = fmt("%b %e %T");
        let at = |s: &str, now: i64| f.parse_at(s.as_bytes(), || now).map(|x| rfc(x.0));
        // Now: 2025-06-15. A June line is this year.
        assert_eq!(
            at("Jun 14 10:00:00", NOW).as_deref(),
            Some("2025-06-14T10:00:00.000000000Z")
        );
        // Read on 2026-01-02, a 31 December line is from 2025.
        let jan2 = days_from_civil(2026, 1, 2) * DAY;
        assert_eq!(
            at("Dec 31 23:59:59", jan2).as_deref(),
            Some("2025-12-31T23:59:59.000000000Z")
        );
        // Read on 2025-12-31T23:00Z, a line stamped 1 January (a zone ahead) is 2026.
        let dec31 = days_from_civil(2025, 12, 31) * DAY + 23 * 3600;
        assert_eq!(
            at("Jan  1 06:00:00", dec31).as_deref(),
            Some("2026-01-01T06:00:00.000000000Z")
        );
        // 29 February in a non-leap current year: the previous year.
        let y2029 = days_from_civil(2029, 3, 5) * DAY;
        assert_eq!(
            at("Feb 29 10:00:00", y2029).as_deref(),
            Some("2028-02-29T10:00:00.000000000Z")
        );
        assert_eq!(at("Feb 30 10:00:00", y2029), None);
    }

    #[test]
    fn syslog_prefix_with_explicit_now_and_slack() {
        let day = 86_400;
        let at = |s: &str, now: i64| {
            parse_syslog_prefix_at(s.as_bytes(), &TimeZone::Utc, now, day)
                .map(|(ns, n)| (rfc(ns), n))
        };
        let jan1 = days_from_civil(2025, 1, 1) * DAY;
        assert_eq!(
            at("Dec 31 23:59:59 host", jan1),
            Some(("2024-12-31T23:59:59.000000000Z".into(), 15))
        );
        let dec31 = days_from_civil(2024, 12, 31) * DAY + 12 * 3600;
        // Within a day ahead: next year; more than a day ahead: this year.
        assert_eq!(
            at("Jan  1 06:00:00", dec31).map(|x| x.0).as_deref(),
            Some("2025-01-01T06:00:00.000000000Z")
        );
        assert_eq!(
            at("Jan  2 12:00:01", dec31).map(|x| x.0).as_deref(),
            Some("2024-01-02T12:00:01.000000000Z")
        );
        // An explicit year and a fraction.
        assert_eq!(
            at("Mar  1 2023 18:46:11.123: x", jan1),
            Some(("2023-03-01T18:46:11.123000000Z".into(), 24))
        );
        assert_eq!(
            parse_syslog_prefix_at(b"Mar  1 18:46:11", &TimeZone::Fixed(3600), jan1, day)
                .map(|x| rfc(x.0))
                .as_deref(),
            Some("2024-03-01T17:46:11.000000000Z")
        );
        assert_eq!(at("Mar 1 2023", jan1), None);
        assert_eq!(at("Mar 32 10:00:00", jan1), None);
        assert_eq!(at("Mar 1 10:00:001", jan1), None);
        assert_eq!(at("", jan1), None);
    }

    #[test]
    fn starts_with_timestamp_cases() {
        for yes in [
            "[2025-04-03 10:02:06.561793] [info] [131172] /root/stdout-test/server_stdout.go:165 log:ZQsC8JI2",
            "2025-04-03T10:02:06.561793Z something",
            "2025-04-03 10:02:06,123 INFO main",
            "2025-04-03 10:02:06|info|131172|f.go|1|x",
            "2025/04/03 10:02:06 [error] 123#0: boom",
            "Apr  3 10:02:06 host sshd[1]: hi",
            "Apr 13 10:02:06 host",
            "03/Apr/2025:10:02:06 +0000 GET /",
            "[03/Apr/2025:10:02:06 +0000] GET /",
            "2025-04-03T10:02:06",
        ] {
            assert!(starts_with_timestamp(yes.as_bytes()), "{yes}");
            assert!(parse_any_prefix(yes.as_bytes()).is_some(), "{yes}");
        }
        for no in [
            "    at com.example.Foo.bar(Foo.java:42)",
            "\tat com.example.Foo.bar(Foo.java:42)",
            "Caused by: java.lang.IllegalStateException",
            "java.lang.NullPointerException: null",
            "",
            "[",
            "2025",
            "2025-04-03",
            "2025-04-03 10:02",
            "2025-13-03 10:02:06",
            "2025-04-31 10:02:06",
            "2025-04-03 25:02:06",
            "2025-04-03 10:02:061",
            "[2025-04-03 10:02:06 unclosed",
            "Foo  3 10:02:06",
            "Apr 32 10:02:06",
            "12345 records",
            "{\"time\":\"2025-04-03T10:02:06Z\"}",
            "\u{feff}2025-04-03 10:02:06",
        ] {
            assert!(!starts_with_timestamp(no.as_bytes()), "{no:?}");
            assert!(parse_any_prefix(no.as_bytes()).is_none(), "{no:?}");
        }
        assert!(!starts_with_timestamp(b"\xff\xfe\xfd"));
        assert!(!starts_with_timestamp(b"2025-04-03 10:02:\xff6"));
        let line = b"[2025-04-03 10:02:06.561793] [info] x";
        let (ns, n) = parse_any_prefix(line).unwrap();
        assert_eq!(n, 28);
        assert_eq!(rfc(ns), "2025-04-03T10:02:06.561793000Z");
        let (_, n) = parse_any_prefix(b"2025-04-03T10:02:06+08:00 x").unwrap();
        assert_eq!(n, 25);
    }

    #[test]
    fn prefix_and_pattern_prefix() {
        let f = fmt("[%F %T.%f]");
        let line = b"[2025-04-03 10:02:06.561793] [info] x";
        assert_eq!(f.parse_prefix(line).map(|x| x.1), Some(28));
        assert_eq!(f.parse(line), None);
        assert_eq!(f.parse_prefix(b"    at com.example"), None);
        assert_eq!(fmt("auto").parse_prefix(line).map(|x| x.1), Some(28));
        let tz = TimeZone::Fixed(-3600);
        assert_eq!(
            parse_any_prefix_in(b"2025-04-03 10:00:00 x", &tz)
                .map(|x| rfc(x.0))
                .as_deref(),
            Some("2025-04-03T11:00:00.000000000Z")
        );
    }
}
