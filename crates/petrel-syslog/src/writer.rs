//! Writing syslog messages: RFC 5424 and RFC 3164 headers, RFC 5424
//! structured data with its escapes, and RFC 6587 framing, into a caller's
//! buffer. What the values are (and where they come from) is the caller's
//! business; this module only makes them valid on the wire: header fields
//! are cut to their RFC lengths and bytes outside printable US-ASCII are
//! replaced by `_` (RFC 5424 §6), and the caller is told so.

use petrel_time::{TimeFormatter, TimeZone};

/// Longest HOSTNAME, APP-NAME, PROCID and MSGID of RFC 5424 §6.
pub const MAX_HOSTNAME: usize = 255;
/// Longest APP-NAME (RFC 5424); also used for the RFC 3164 tag.
pub const MAX_APP_NAME: usize = 48;
/// Longest PROCID.
pub const MAX_PROC_ID: usize = 128;
/// Longest MSGID.
pub const MAX_MSG_ID: usize = 32;

/// The header of one message. `None` (or empty) fields are written as the
/// nil value `-` in RFC 5424.
#[derive(Debug, Clone, Copy, Default)]
pub struct Header<'a> {
    /// 0..=23.
    pub facility: u8,
    /// 0..=7.
    pub severity: u8,
    /// Nanoseconds since the epoch; `None` writes `-` (RFC 5424).
    pub time_ns: Option<i64>,
    /// HOSTNAME.
    pub hostname: Option<&'a [u8]>,
    /// APP-NAME (the RFC 3164 tag).
    pub app_name: Option<&'a [u8]>,
    /// PROCID.
    pub proc_id: Option<&'a [u8]>,
    /// MSGID (RFC 5424 only).
    pub msg_id: Option<&'a [u8]>,
}

/// The facility names of RFC 5424 §6.2.1 (and their usual aliases), in
/// code order.
pub const FACILITIES: [&str; 24] = [
    "kern",
    "user",
    "mail",
    "daemon",
    "auth",
    "syslog",
    "lpr",
    "news",
    "uucp",
    "cron",
    "authpriv",
    "ftp",
    "ntp",
    "security",
    "console",
    "solaris-cron",
    "local0",
    "local1",
    "local2",
    "local3",
    "local4",
    "local5",
    "local6",
    "local7",
];

/// A facility from a number (`0`..`23`) or a name (`local0`, `auth`, any
/// case).
pub fn facility_code(v: &[u8]) -> Option<u8> {
    if let Some(n) = small_number(v) {
        return (n <= 23).then_some(n);
    }
    let v = std::str::from_utf8(v).ok()?.trim();
    let alias = match v.to_ascii_lowercase().as_str() {
        "audit" => return Some(13),
        "alert" => return Some(14),
        "clock" | "cron2" => return Some(15),
        "authpriv" | "auth-priv" | "auth_priv" => return Some(10),
        "security2" => return Some(4),
        other => other.to_string(),
    };
    FACILITIES.iter().position(|f| *f == alias).map(|p| p as u8)
}

/// A severity from a number (`0`..`7`) or a name: the syslog keywords and
/// the level words of application logs (`fatal`, `error`, `warn`,
/// `trace`...), any case.
pub fn severity_code(v: &[u8]) -> Option<u8> {
    if let Some(n) = small_number(v) {
        return (n <= 7).then_some(n);
    }
    let v = std::str::from_utf8(v).ok()?.trim().to_ascii_lowercase();
    Some(match v.as_str() {
        "emerg" | "emergency" | "panic" => 0,
        "alert" => 1,
        "crit" | "critical" | "fatal" => 2,
        "err" | "error" | "eror" => 3,
        "warn" | "warning" => 4,
        "notice" => 5,
        "info" | "informational" | "information" => 6,
        "debug" | "trace" | "dbug" => 7,
        _ => return None,
    })
}

fn small_number(v: &[u8]) -> Option<u8> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 3 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u16, |a, c| a * 10 + u16::from(c - b'0'));
    u8::try_from(n).ok()
}

/// Writes `<PRI>`.
fn write_pri(h: &Header<'_>, out: &mut Vec<u8>) {
    let pri = u16::from(h.facility.min(23)) * 8 + u16::from(h.severity.min(7));
    out.push(b'<');
    if pri >= 100 {
        out.push(b'0' + (pri / 100) as u8);
    }
    if pri >= 10 {
        out.push(b'0' + (pri / 10 % 10) as u8);
    }
    out.push(b'0' + (pri % 10) as u8);
    out.push(b'>');
}

/// Writes a header field: `-` when empty, else cut to `max` bytes with
/// bytes outside `!`..`~` replaced by `_`. True when it had to change it.
fn write_field(v: Option<&[u8]>, max: usize, out: &mut Vec<u8>) -> bool {
    let v = v.unwrap_or_default();
    if v.is_empty() {
        out.push(b'-');
        return false;
    }
    let cut = &v[..v.len().min(max)];
    let mut changed = cut.len() != v.len();
    for &c in cut {
        if (33..=126).contains(&c) {
            out.push(c);
        } else {
            out.push(b'_');
            changed = true;
        }
    }
    changed
}

/// Writes an RFC 5424 header up to and including MSGID and its space:
/// `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID `. The timestamp is
/// UTC with microseconds (the RFC allows six fraction digits). Then the
/// caller writes STRUCTURED-DATA (see [`SdWriter`], or `-`), and
/// optionally ` ` and MSG. Returns how many header fields had to be cut
/// or cleaned.
pub fn write_rfc5424_header(h: &Header<'_>, out: &mut Vec<u8>) -> u32 {
    write_pri(h, out);
    out.extend_from_slice(b"1 ");
    match h.time_ns {
        Some(ns) => {
            petrel_time::write_rfc3339(ns, out);
            // …SS.nnnnnnnnnZ → …SS.uuuuuuZ
            out.truncate(out.len() - 4);
            out.push(b'Z');
        }
        None => out.push(b'-'),
    }
    let mut changed = 0;
    for (v, max) in [
        (h.hostname, MAX_HOSTNAME),
        (h.app_name, MAX_APP_NAME),
        (h.proc_id, MAX_PROC_ID),
        (h.msg_id, MAX_MSG_ID),
    ] {
        out.push(b' ');
        changed += u32::from(write_field(v, max, out));
    }
    out.push(b' ');
    changed
}

/// The RFC 3164 timestamp (`Mmm dd hh:mm:ss`) in a zone.
#[derive(Debug, Clone)]
pub struct Rfc3164Time(TimeFormatter);

impl Rfc3164Time {
    /// Times written in `tz` (RFC 3164 times carry no zone: the
    /// receiver's is assumed).
    pub fn new(tz: TimeZone) -> Self {
        match TimeFormatter::new("%b %e %H:%M:%S", tz) {
            Ok(f) => Self(f),
            // The pattern is fixed and valid.
            Err(e) => unreachable!("{e}"),
        }
    }
}

/// Writes an RFC 3164 header: `<PRI>Mmm dd hh:mm:ss HOSTNAME TAG[PID]: `
/// (without a tag when there is no APP-NAME; the time of writing when the
/// header has none, as the format needs one). Returns how many fields had
/// to be cut or cleaned.
pub fn write_rfc3164_header(
    h: &Header<'_>,
    time: &Rfc3164Time,
    now_ns: i64,
    out: &mut Vec<u8>,
) -> u32 {
    write_pri(h, out);
    time.0.write(h.time_ns.unwrap_or(now_ns), out);
    out.push(b' ');
    let mut changed = u32::from(write_field(h.hostname, MAX_HOSTNAME, out));
    out.push(b' ');
    if h.app_name.is_some_and(|a| !a.is_empty()) {
        changed += u32::from(write_field(h.app_name, MAX_APP_NAME, out));
        if h.proc_id.is_some_and(|p| !p.is_empty()) {
            out.push(b'[');
            changed += u32::from(write_field(h.proc_id, MAX_PROC_ID, out));
            out.push(b']');
        }
        out.extend_from_slice(b": ");
    }
    changed
}

/// Writes RFC 5424 STRUCTURED-DATA element by element: `-` when nothing
/// was written, else `[id name="value" ...]...`.
#[derive(Debug)]
pub struct SdWriter {
    start: usize,
    open: bool,
    /// Names and ids that had to be cleaned (invalid characters, too long).
    pub changed: u32,
}

impl SdWriter {
    /// Starts structured data at the end of `out`.
    pub fn new(out: &[u8]) -> Self {
        Self {
            start: out.len(),
            open: false,
            changed: 0,
        }
    }

    /// Opens element `id` (closing the previous one).
    pub fn element(&mut self, id: &[u8], out: &mut Vec<u8>) {
        if self.open {
            out.push(b']');
        }
        out.push(b'[');
        self.changed += u32::from(write_sd_name(id, out));
        self.open = true;
    }

    /// Adds `name="value"` to the open element (escaping `"`, `\` and `]`).
    pub fn param(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        if !self.open {
            self.element(b"petrel", out);
        }
        out.push(b' ');
        self.changed += u32::from(write_sd_name(name, out));
        out.extend_from_slice(b"=\"");
        for &c in value {
            if matches!(c, b'"' | b'\\' | b']') {
                out.push(b'\\');
            }
            out.push(c);
        }
        out.push(b'"');
    }

    /// Closes the last element, or writes `-` when there was none.
    pub fn finish(self, out: &mut Vec<u8>) -> u32 {
        if self.open {
            out.push(b']');
        } else if out.len() == self.start {
            out.push(b'-');
        }
        self.changed
    }
}

/// SD-NAME: printable US-ASCII except `=`, space, `]`, `"`; 1..=32 bytes.
fn write_sd_name(v: &[u8], out: &mut Vec<u8>) -> bool {
    if v.is_empty() {
        out.push(b'_');
        return true;
    }
    let cut = &v[..v.len().min(32)];
    let mut changed = cut.len() != v.len();
    for &c in cut {
        if (33..=126).contains(&c) && !matches!(c, b'=' | b']' | b'"') {
            out.push(c);
        } else {
            out.push(b'_');
            changed = true;
        }
    }
    changed
}

/// Appends `msg` framed for a stream: octet counting (`LEN SP MSG`) or a
/// newline after it (newlines inside the message become spaces, or the
/// receiver would split it).
pub fn frame(msg: &[u8], octet_counting: bool, out: &mut Vec<u8>) {
    if octet_counting {
        let mut n = [0u8; 20];
        let mut i = n.len();
        let mut len = msg.len();
        loop {
            i -= 1;
            n[i] = b'0' + (len % 10) as u8;
            len /= 10;
            if len == 0 {
                break;
            }
        }
        out.extend_from_slice(&n[i..]);
        out.push(b' ');
        out.extend_from_slice(msg);
    } else {
        let start = out.len();
        out.extend_from_slice(msg);
        for c in &mut out[start..] {
            if *c == b'\n' {
                *c = b' ';
            }
        }
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Context, Format, Message};

    #[test]
    fn rfc5424_round_trips_through_the_parser() {
        let h = Header {
            facility: 16,
            severity: 3,
            time_ns: Some(1_699_063_384_005_123_456),
            hostname: Some(b"web 1"),
            app_name: Some(b"nginx"),
            proc_id: Some(b"42"),
            msg_id: None,
        };
        let mut out = Vec::new();
        assert_eq!(write_rfc5424_header(&h, &mut out), 1);
        let mut sd = SdWriter::new(&out);
        sd.element(b"ex@32473", &mut out);
        sd.param(b"k", br#"a"b]\c"#, &mut out);
        sd.param(b"bad name", b"v", &mut out);
        assert_eq!(sd.finish(&mut out), 1);
        out.extend_from_slice(b" hello");
        assert_eq!(
            String::from_utf8_lossy(&out),
            r#"<131>1 2023-11-04T02:03:04.005123Z web_1 nginx 42 - [ex@32473 k="a\"b\]\\c" bad_name="v"] hello"#
        );
        let mut m = Message::default();
        let ctx = Context::now(petrel_time::TimeZone::Utc);
        parse(&out, Format::Rfc5424, &ctx, &mut m).unwrap();
        assert_eq!((m.facility, m.severity), (Some(16), Some(3)));
        assert_eq!(m.timestamp_ns, Some(1_699_063_384_005_123_000));
        assert_eq!(&out[m.message], b"hello");
        assert_eq!(m.sd.len(), 2);
        let v = &out[m.sd[0].value.clone()];
        assert_eq!(&*crate::unescape_sd_value(v), br#"a"b]\c"#);
        let mut nil = Vec::new();
        write_rfc5424_header(&Header::default(), &mut nil);
        SdWriter::new(&nil).finish(&mut nil);
        assert_eq!(nil, b"<0>1 - - - - - -");
    }

    #[test]
    fn rfc3164_and_framing() {
        let h = Header {
            facility: 4,
            severity: 6,
            time_ns: Some(1_699_063_384_000_000_000),
            hostname: Some(b"host"),
            app_name: Some(b"sshd"),
            proc_id: Some(b"7"),
            msg_id: Some(b"ignored"),
        };
        let t = Rfc3164Time::new(TimeZone::Utc);
        let mut out = Vec::new();
        write_rfc3164_header(&h, &t, 0, &mut out);
        out.extend_from_slice(b"msg");
        assert_eq!(out, b"<38>Nov  4 02:03:04 host sshd[7]: msg");
        let mut f = Vec::new();
        frame(b"a\nb", false, &mut f);
        frame(b"0123456789", true, &mut f);
        assert_eq!(f, b"a b\n10 0123456789");
    }

    #[test]
    fn codes_from_names_and_numbers() {
        assert_eq!(facility_code(b"local7"), Some(23));
        assert_eq!(facility_code(b"AUTH"), Some(4));
        assert_eq!(facility_code(b"24"), None);
        assert_eq!(facility_code(b"x"), None);
        assert_eq!(severity_code(b"Warning"), Some(4));
        assert_eq!(severity_code(b"3"), Some(3));
        assert_eq!(severity_code(b"8"), None);
        assert_eq!(severity_code(b"fatal"), Some(2));
    }
}
