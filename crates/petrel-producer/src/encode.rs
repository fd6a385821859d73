//! Records as ndjson, written straight into a batch buffer.

/// One record: string fields, an optional event time and an optional
/// stream (batches are formed per stream).
#[derive(Debug, Clone, Copy, Default)]
pub struct Record<'a> {
    /// Key/value pairs, written in this order.
    pub fields: &'a [(&'a str, &'a str)],
    /// Event time in nanoseconds since the Unix epoch, sent as `time_ns`.
    pub time_ns: Option<u64>,
    /// The stream (like the seed's logstore/topic), sent as `stream`.
    pub stream: Option<&'a str>,
}

impl<'a> Record<'a> {
    /// A record with these fields, no time and the default stream.
    pub fn new(fields: &'a [(&'a str, &'a str)]) -> Self {
        Self {
            fields,
            time_ns: None,
            stream: None,
        }
    }

    /// Sets the event time (nanoseconds since the Unix epoch).
    pub fn time_ns(mut self, t: u64) -> Self {
        self.time_ns = Some(t);
        self
    }

    /// Sets the stream.
    pub fn stream(mut self, s: &'a str) -> Self {
        self.stream = Some(s);
        self
    }
}

/// Bytes that cannot appear raw inside a JSON string.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// True when one of the 8 bytes of `w` needs escaping (a control byte,
/// `"` or `\\`): the word-at-a-time zero-byte test, exact for "any".
#[inline]
fn word_needs_escape(w: u64) -> bool {
    let ctl = w.wrapping_sub(LO * 0x20) & !w;
    let q = w ^ (LO * b'"' as u64);
    let bs = w ^ (LO * b'\\' as u64);
    let zero = |v: u64| v.wrapping_sub(LO) & !v;
    (ctl | zero(q) | zero(bs)) & HI != 0
}

/// True when no byte of `b` needs escaping, tested eight bytes at a time
/// (the tail padded with a harmless byte), without a per-byte loop.
fn is_plain(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        if word_needs_escape(u64::from_le_bytes(w)) {
            return false;
        }
    }
    let rest = chunks.remainder();
    let mut w = [b'a'; 8];
    w[..rest.len()].copy_from_slice(rest);
    !word_needs_escape(u64::from_le_bytes(w))
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    if is_plain(b) {
        out.extend_from_slice(b);
    } else {
        let mut start = 0;
        for (i, &c) in b.iter().enumerate() {
            if NEEDS_ESCAPE[c as usize] {
                out.extend_from_slice(&b[start..i]);
                escape(out, c);
                start = i + 1;
            }
        }
        out.extend_from_slice(&b[start..]);
    }
    out.push(b'"');
}

fn escape(out: &mut Vec<u8>, c: u8) {
    match c {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        _ => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        }
    }
}

fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Appends `rec` as one JSON object and a newline.
pub(crate) fn encode(out: &mut Vec<u8>, rec: &Record<'_>) {
    out.push(b'{');
    let mut first = true;
    for (k, v) in rec.fields {
        if !first {
            out.push(b',');
        }
        first = false;
        push_str(out, k);
        out.push(b':');
        push_str(out, v);
    }
    if let Some(t) = rec.time_ns {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(b"\"time_ns\":");
        push_u64(out, t);
    }
    if let Some(s) = rec.stream {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(b"\"stream\":");
        push_str(out, s);
    }
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_valid_json_lines() {
        let mut out = Vec::new();
        let rec = Record::new(&[("msg", "a \"q\" \\ \n\t\u{1}é"), ("k", "")])
            .time_ns(1_700_000_000_123_456_789)
            .stream("web");
        encode(&mut out, &rec);
        encode(&mut out, &Record::new(&[]));
        encode(&mut out, &Record::default().time_ns(0));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["msg"], "a \"q\" \\ \n\t\u{1}é");
        assert_eq!(lines[0]["k"], "");
        assert_eq!(lines[0]["time_ns"], 1_700_000_000_123_456_789u64);
        assert_eq!(lines[0]["stream"], "web");
        assert_eq!(lines[1], serde_json::json!({}));
        assert_eq!(lines[2]["time_ns"], 0);
    }

    #[test]
    fn escaping_matches_serde_json_at_every_position() {
        // Every escapable byte (and some UTF-8) at every offset of a word.
        let specials = ["\"", "\\", "\n", "\u{0}", "\u{1f}", "é", "\u{7f}", " ", "~"];
        for sp in specials {
            for pos in 0..20 {
                let mut v = "abcdefghijklmnopqrst".to_string();
                v.insert_str(pos, sp);
                let mut out = Vec::new();
                encode(&mut out, &Record::new(&[("k", &v)]));
                let got: serde_json::Value = serde_json::from_slice(&out).unwrap();
                assert_eq!(got["k"], v.as_str(), "{v:?}");
            }
        }
    }
}
