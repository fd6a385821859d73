//! Formatting event times with strftime patterns (`%b %e %H:%M:%S`,
//! `%Y-%m-%dT%H:%M:%S%.3f%:z`), compiled once and written per event
//! without allocating: the time filter of text templates and the syslog
//! sink's headers.

use crate::{civil_from_days, days_from_civil, FormatError, TimeZone, NS};

/// The directives [`TimeFormatter`] writes, for error messages.
pub const OUTPUT_DIRECTIVES: &str = "%Y %C %y %m %b %h %B %d %e %j %H %k %I %l %p %M %S \
     %f %3f %6f %9f %.f %.3f %.6f %.9f %z %:z %Z %s %a %A %u %w %T %F %R %D %n %t %%";

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// One step of a compiled output pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    Lit(Box<str>),
    Year,
    Century,
    Year2,
    Month,
    MonthAbbr,
    MonthFull,
    Day,
    DaySpace,
    YearDay,
    Hour,
    HourSpace,
    Hour12,
    Hour12Space,
    AmPm,
    Minute,
    Second,
    /// Fraction digits (1..=9), with a leading `.` when `dot`.
    Frac {
        digits: u8,
        dot: bool,
    },
    /// `%.f`: `.` and 3, 6 or 9 digits, the fewest that hold the value,
    /// nothing for a whole second.
    FracAuto,
    Offset {
        colon: bool,
    },
    ZoneName,
    Epoch,
    WeekdayAbbr,
    WeekdayFull,
    /// `%u`: 1 (Monday) to 7.
    WeekdayMon,
    /// `%w`: 0 (Sunday) to 6.
    WeekdaySun,
}

/// A strftime pattern compiled once; [`TimeFormatter::write`] renders a
/// time in its zone. Cheap to share between threads.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeFormatter {
    items: Vec<Out>,
    tz: TimeZone,
}

impl TimeFormatter {
    /// Compiles `pattern` (directives in [`OUTPUT_DIRECTIVES`]); times are
    /// written in `tz`. An unknown directive or a lone `%` at the end is an
    /// error naming it.
    pub fn new(pattern: &str, tz: TimeZone) -> Result<Self, FormatError> {
        let mut items = Vec::new();
        let mut lit = String::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                lit.push(c);
                continue;
            }
            let bad = |d: &str| {
                FormatError(format!(
                    "unknown directive `%{d}` in `{pattern}`; use {OUTPUT_DIRECTIVES}"
                ))
            };
            let Some(d) = chars.next() else {
                return Err(FormatError(format!(
                    "`%` at the end of `{pattern}`; write `%%` for a percent sign"
                )));
            };
            let item = match d {
                '%' => {
                    lit.push('%');
                    continue;
                }
                'n' => {
                    lit.push('\n');
                    continue;
                }
                't' => {
                    lit.push('\t');
                    continue;
                }
                'Y' => Out::Year,
                'C' => Out::Century,
                'y' => Out::Year2,
                'm' => Out::Month,
                'b' | 'h' => Out::MonthAbbr,
                'B' => Out::MonthFull,
                'd' => Out::Day,
                'e' => Out::DaySpace,
                'j' => Out::YearDay,
                'H' => Out::Hour,
                'k' => Out::HourSpace,
                'I' => Out::Hour12,
                'l' => Out::Hour12Space,
                'p' => Out::AmPm,
                'M' => Out::Minute,
                'S' => Out::Second,
                'f' => Out::Frac {
                    digits: 9,
                    dot: false,
                },
                'z' => Out::Offset { colon: false },
                'Z' => Out::ZoneName,
                's' => Out::Epoch,
                'a' => Out::WeekdayAbbr,
                'A' => Out::WeekdayFull,
                'u' => Out::WeekdayMon,
                'w' => Out::WeekdaySun,
                ':' => match chars.next() {
                    Some('z') => Out::Offset { colon: true },
                    Some(x) => return Err(bad(&format!(":{x}"))),
                    None => return Err(bad(":")),
                },
                '3' | '6' | '9' => match chars.next() {
                    Some('f') => Out::Frac {
                        digits: d as u8 - b'0',
                        dot: false,
                    },
                    Some(x) => return Err(bad(&format!("{d}{x}"))),
                    None => return Err(bad(&d.to_string())),
                },
                '.' => match chars.next() {
                    Some('f') => Out::FracAuto,
                    Some(n @ ('3' | '6' | '9')) if chars.peek() == Some(&'f') => {
                        chars.next();
                        Out::Frac {
                            digits: n as u8 - b'0',
                            dot: true,
                        }
                    }
                    Some(x) => return Err(bad(&format!(".{x}"))),
                    None => return Err(bad(".")),
                },
                // Composites, expanded here so that writing has fewer cases.
                'T' | 'F' | 'R' | 'D' => {
                    let (sub, seps): (&[Out], &str) = match d {
                        'T' => (&[Out::Hour, Out::Minute, Out::Second], "::"),
                        'F' => (&[Out::Year, Out::Month, Out::Day], "--"),
                        'R' => (&[Out::Hour, Out::Minute], ":"),
                        _ => (&[Out::Month, Out::Day, Out::Year2], "//"),
                    };
                    for (i, it) in sub.iter().enumerate() {
                        if i > 0 {
                            lit.push(seps.as_bytes()[i - 1] as char);
                        }
                        flush(&mut lit, &mut items);
                        items.push(it.clone());
                    }
                    continue;
                }
                x => return Err(bad(&x.to_string())),
            };
            flush(&mut lit, &mut items);
            items.push(item);
        }
        flush(&mut lit, &mut items);
        Ok(Self { items, tz })
    }

    /// The zone times are written in.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// Appends `ns` (nanoseconds since the epoch) formatted.
    pub fn write(&self, ns: i64, out: &mut Vec<u8>) {
        let secs = ns.div_euclid(NS);
        let nanos = ns.rem_euclid(NS) as u32;
        let off = self.tz.offset_at(secs);
        let local = secs + i64::from(off);
        let days = local.div_euclid(crate::DAY);
        let sod = local.rem_euclid(crate::DAY);
        let (y, m, d) = civil_from_days(days);
        let (hour, minute, second) = (sod / 3600, sod % 3600 / 60, sod % 60);
        // 1970-01-01 was a Thursday (4 counting from Sunday).
        let wday = (days + 4).rem_euclid(7) as usize;
        for it in &self.items {
            match it {
                Out::Lit(s) => out.extend_from_slice(s.as_bytes()),
                Out::Year => num(out, y, 4, b'0'),
                Out::Century => num(out, y.div_euclid(100), 2, b'0'),
                Out::Year2 => num(out, y.rem_euclid(100), 2, b'0'),
                Out::Month => num(out, i64::from(m), 2, b'0'),
                Out::MonthAbbr => out.extend_from_slice(&MONTHS[m as usize - 1].as_bytes()[..3]),
                Out::MonthFull => out.extend_from_slice(MONTHS[m as usize - 1].as_bytes()),
                Out::Day => num(out, i64::from(d), 2, b'0'),
                Out::DaySpace => num(out, i64::from(d), 2, b' '),
                Out::YearDay => num(out, days - days_from_civil(y, 1, 1) + 1, 3, b'0'),
                Out::Hour => num(out, hour, 2, b'0'),
                Out::HourSpace => num(out, hour, 2, b' '),
                Out::Hour12 => num(out, (hour + 11) % 12 + 1, 2, b'0'),
                Out::Hour12Space => num(out, (hour + 11) % 12 + 1, 2, b' '),
                Out::AmPm => out.extend_from_slice(if hour < 12 { b"AM" } else { b"PM" }),
                Out::Minute => num(out, minute, 2, b'0'),
                Out::Second => num(out, second, 2, b'0'),
                Out::Frac { digits, dot } => {
                    if *dot {
                        out.push(b'.');
                    }
                    let v = i64::from(nanos) / 10i64.pow(9 - u32::from(*digits));
                    num(out, v, usize::from(*digits), b'0');
                }
                Out::FracAuto => {
                    if nanos.is_multiple_of(1_000_000) && nanos > 0 {
                        out.push(b'.');
                        num(out, i64::from(nanos / 1_000_000), 3, b'0');
                    } else if nanos.is_multiple_of(1000) && nanos > 0 {
                        out.push(b'.');
                        num(out, i64::from(nanos / 1000), 6, b'0');
                    } else if nanos > 0 {
                        out.push(b'.');
                        num(out, i64::from(nanos), 9, b'0');
                    }
                }
                Out::Offset { colon } => write_offset(out, off, *colon),
                Out::ZoneName => match &self.tz {
                    TimeZone::Utc => out.extend_from_slice(b"UTC"),
                    TimeZone::Named(tz) => match jiff::Timestamp::from_second(secs) {
                        Ok(ts) => {
                            out.extend_from_slice(tz.to_offset_info(ts).abbreviation().as_bytes())
                        }
                        Err(_) => write_offset(out, off, true),
                    },
                    TimeZone::Fixed(_) => write_offset(out, off, true),
                },
                Out::Epoch => num(out, secs, 1, b'0'),
                Out::WeekdayAbbr => out.extend_from_slice(&WEEKDAYS[wday].as_bytes()[..3]),
                Out::WeekdayFull => out.extend_from_slice(WEEKDAYS[wday].as_bytes()),
                Out::WeekdayMon => num(out, ((wday + 6) % 7 + 1) as i64, 1, b'0'),
                Out::WeekdaySun => num(out, wday as i64, 1, b'0'),
            }
        }
    }
}

fn flush(lit: &mut String, items: &mut Vec<Out>) {
    if !lit.is_empty() {
        items.push(Out::Lit(std::mem::take(lit).into_boxed_str()));
    }
}

/// `±hhmm` or `±hh:mm` (`+00:00` for UTC, as RFC 3339 allows).
fn write_offset(out: &mut Vec<u8>, off: i32, colon: bool) {
    out.push(if off < 0 { b'-' } else { b'+' });
    let a = i64::from(off.unsigned_abs());
    num(out, a / 3600, 2, b'0');
    if colon {
        out.push(b':');
    }
    num(out, a % 3600 / 60, 2, b'0');
}

/// Writes `v` in decimal, padded on the left with `pad` to `width`.
fn num(out: &mut Vec<u8>, v: i64, width: usize, pad: u8) {
    if v < 0 {
        out.push(b'-');
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    let digits = buf.len() - i;
    for _ in digits..width {
        out.push(pad);
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(p: &str, tz: &str, ns: i64) -> String {
        let f = TimeFormatter::new(p, TimeZone::from_name(tz).unwrap()).unwrap();
        let mut out = Vec::new();
        f.write(ns, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn writes_syslog_and_rfc3339_shapes() {
        // 2023-11-04T02:03:04.005Z, a Saturday.
        let ns = 1_699_063_384_005_000_000;
        assert_eq!(fmt("%b %e %H:%M:%S", "UTC", ns), "Nov  4 02:03:04");
        assert_eq!(
            fmt("%Y-%m-%dT%H:%M:%S%.3f%:z", "+05:30", ns),
            "2023-11-04T07:33:04.005+05:30"
        );
        assert_eq!(
            fmt("%F %T%.f %z", "-08:00", ns),
            "2023-11-03 18:03:04.005 -0800"
        );
        assert_eq!(
            fmt("%a %A %u %w %j %y %C", "UTC", ns),
            "Sat Saturday 6 6 308 23 20"
        );
        assert_eq!(
            fmt("%I:%M %p %l %k|%s|%6f|%%", "UTC", ns),
            "02:03 AM  2  2|1699063384|005000|%"
        );
        assert_eq!(fmt("%Z", "UTC", ns), "UTC");
        assert_eq!(fmt("%Z", "Europe/Paris", ns), "CET");
        assert_eq!(fmt("%H %Z", "Europe/Paris", 1_690_000_000 * NS), "06 CEST");
        assert_eq!(fmt("%.f", "UTC", 0), "");
        assert_eq!(fmt("%.f", "UTC", 1), ".000000001");
        assert_eq!(fmt("%R %D", "UTC", 0), "00:00 01/01/70");
        assert_eq!(fmt("%Y-%m-%d", "UTC", -1), "1969-12-31");
    }

    #[test]
    fn unknown_directives_are_named() {
        for (p, want) in [
            ("%Q", "`%Q`"),
            ("%:x", "`%:x`"),
            ("%.4f", "`%.4`"),
            ("x%", "end"),
        ] {
            let e = TimeFormatter::new(p, TimeZone::Utc).unwrap_err();
            assert!(e.0.contains(want), "{p}: {}", e.0);
        }
    }
}
