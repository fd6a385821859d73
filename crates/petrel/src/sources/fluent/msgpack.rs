//! The Forward protocol's messages read straight from a connection's
//! buffer: [`scan`] finds where one message ends and checks its shape
//! without allocating (so a connection can cut frames, answer `chunk`
//! and refuse garbage before anything is accepted), and [`events`] turns
//! an accepted frame into events whose strings point into the buffer.
//!
//! The msgpack markers are read with `rmp`; the lengths after them are
//! read here so that a value cut by the end of a read is told apart from
//! a broken one.

use bytes::Bytes;
use petrel_core::{Event, Key, Span, Value};
use rmp::Marker;

/// Nesting deeper than this is refused (a record is a map of values; a
/// hostile peer must not make the decoder recurse without bound).
const MAX_DEPTH: usize = 64;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// The buffer ends inside the message: read more.
    Incomplete,
    /// The message is complete only once the buffer holds this many
    /// bytes (known from a packed chunk's header): no need to look again
    /// before.
    Need(usize),
    /// A value declares more bytes than `max_entry_bytes`.
    TooLarge,
    /// Not a Forward protocol message.
    Invalid(&'static str),
}

type R<T> = Result<T, ScanError>;

/// How a message carries its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `[tag, time, record(, option)]`.
    Message,
    /// `[tag, [[time, record], ...](, option)]`.
    Forward,
    /// `[tag, bin of concatenated [time, record](, option)]`.
    Packed,
    /// Packed whose entries are gzip-compressed (`option.compressed`).
    Compressed,
}

/// One complete message found by [`scan`]; ranges are relative to the
/// scanned slice.
#[derive(Debug, Clone)]
pub struct Scanned {
    /// Bytes the message takes.
    pub len: usize,
    /// How entries are carried.
    pub mode: Mode,
    /// The tag.
    pub tag: std::ops::Range<usize>,
    /// The packed entries (Packed, Compressed).
    pub packed: std::ops::Range<usize>,
    /// `option.chunk`, to be answered with `{"ack": chunk}`.
    pub chunk: Option<std::ops::Range<usize>>,
}

/// A reading position in a buffer.
pub struct Cur<'a> {
    b: &'a [u8],
    /// Offset of the next byte.
    pub pos: usize,
}

impl<'a> Cur<'a> {
    /// Reads `b` from `pos`.
    pub fn new(b: &'a [u8], pos: usize) -> Self {
        Self { b, pos }
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(ScanError::TooLarge)?;
        let s = self.b.get(self.pos..end).ok_or(ScanError::Incomplete)?;
        self.pos = end;
        Ok(s)
    }

    fn marker(&mut self) -> R<Marker> {
        Ok(Marker::from_u8(self.take(1)?[0]))
    }

    fn peek(&self) -> R<Marker> {
        self.b
            .get(self.pos)
            .map(|&b| Marker::from_u8(b))
            .ok_or(ScanError::Incomplete)
    }

    fn be(&mut self, n: usize) -> R<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn len_of(&mut self, n: usize, max: usize) -> R<usize> {
        let v = self.be(n)?;
        if v > max as u64 {
            return Err(ScanError::TooLarge);
        }
        Ok(v as usize)
    }

    /// The string or binary at the cursor, as a range.
    pub fn str_or_bin(&mut self, max: usize) -> R<std::ops::Range<usize>> {
        let n = match self.marker()? {
            Marker::FixStr(n) => n as usize,
            Marker::Str8 | Marker::Bin8 => self.len_of(1, max)?,
            Marker::Str16 | Marker::Bin16 => self.len_of(2, max)?,
            Marker::Str32 | Marker::Bin32 => self.len_of(4, max)?,
            _ => return Err(ScanError::Invalid("expected a string")),
        };
        let start = self.pos;
        self.take(n)?;
        Ok(start..start + n)
    }

    /// An array header's element count.
    pub fn array_len(&mut self, max: usize) -> R<usize> {
        match self.marker()? {
            Marker::FixArray(n) => Ok(n as usize),
            Marker::Array16 => self.len_of(2, max),
            Marker::Array32 => self.len_of(4, max),
            _ => Err(ScanError::Invalid("expected an array")),
        }
    }

    fn map_len(&mut self, max: usize) -> R<usize> {
        match self.marker()? {
            Marker::FixMap(n) => Ok(n as usize),
            Marker::Map16 => self.len_of(2, max),
            Marker::Map32 => self.len_of(4, max),
            _ => Err(ScanError::Invalid("expected a map")),
        }
    }

    /// Skips one value of any type.
    fn skip(&mut self, max: usize, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err(ScanError::Invalid("values nested too deep"));
        }
        let n = match self.marker()? {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                0
            }
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixStr(n) => n as usize,
            Marker::Str8 | Marker::Bin8 => self.len_of(1, max)?,
            Marker::Str16 | Marker::Bin16 => self.len_of(2, max)?,
            Marker::Str32 | Marker::Bin32 => self.len_of(4, max)?,
            Marker::FixExt1 => 2,
            Marker::FixExt2 => 3,
            Marker::FixExt4 => 5,
            Marker::FixExt8 => 9,
            Marker::FixExt16 => 17,
            Marker::Ext8 => self.len_of(1, max)? + 1,
            Marker::Ext16 => self.len_of(2, max)? + 1,
            Marker::Ext32 => self.len_of(4, max)? + 1,
            m @ (Marker::FixArray(_) | Marker::Array16 | Marker::Array32) => {
                let n = match m {
                    Marker::FixArray(n) => n as usize,
                    Marker::Array16 => self.len_of(2, max)?,
                    _ => self.len_of(4, max)?,
                };
                for _ in 0..n {
                    self.skip(max, depth + 1)?;
                }
                0
            }
            m @ (Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {
                let n = match m {
                    Marker::FixMap(n) => n as usize,
                    Marker::Map16 => self.len_of(2, max)?,
                    _ => self.len_of(4, max)?,
                };
                for _ in 0..n {
                    self.skip(max, depth + 1)?;
                    self.skip(max, depth + 1)?;
                }
                0
            }
            Marker::Reserved => return Err(ScanError::Invalid("reserved msgpack byte 0xc1")),
        };
        self.take(n)?;
        Ok(())
    }

    /// Reads an event time: integer seconds, a float, or EventTime (ext
    /// type 0: seconds and nanoseconds, 32 bits each, big endian). In
    /// nanoseconds since the epoch.
    fn time(&mut self) -> R<i64> {
        let secs = |s: i64| s.saturating_mul(1_000_000_000);
        Ok(match self.marker()? {
            Marker::FixPos(n) => secs(i64::from(n)),
            Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
                let n = match self.b.get(self.pos - 1) {
                    Some(0xcc) => 1,
                    Some(0xcd) => 2,
                    Some(0xce) => 4,
                    _ => 8,
                };
                secs(self.be(n)?.min(i64::MAX as u64) as i64)
            }
            Marker::FixNeg(n) => secs(i64::from(n)),
            Marker::I8 => secs(i64::from(self.be(1)? as u8 as i8)),
            Marker::I16 => secs(i64::from(self.be(2)? as u16 as i16)),
            Marker::I32 => secs(i64::from(self.be(4)? as u32 as i32)),
            Marker::I64 => secs(self.be(8)? as i64),
            Marker::F32 => (f64::from(f32::from_bits(self.be(4)? as u32)) * 1e9) as i64,
            Marker::F64 => (f64::from_bits(self.be(8)?) * 1e9) as i64,
            Marker::FixExt8 => self.event_time()?,
            Marker::Ext8 => {
                if self.be(1)? != 8 {
                    return Err(ScanError::Invalid("an extension time must be 8 bytes"));
                }
                self.event_time()?
            }
            _ => {
                return Err(ScanError::Invalid(
                    "an entry's time must be an integer or EventTime",
                ))
            }
        })
    }

    fn event_time(&mut self) -> R<i64> {
        let t = self.take(9)?;
        if t[0] != 0 {
            return Err(ScanError::Invalid(
                "an extension time must be EventTime (type 0)",
            ));
        }
        let s = u32::from_be_bytes([t[1], t[2], t[3], t[4]]);
        let ns = u32::from_be_bytes([t[5], t[6], t[7], t[8]]);
        Ok(i64::from(s) * 1_000_000_000 + i64::from(ns))
    }

    /// Checks one `[time, record]` entry.
    fn entry(&mut self, max: usize) -> R<()> {
        if self.array_len(max)? != 2 {
            return Err(ScanError::Invalid("an entry must be [time, record]"));
        }
        self.time()?;
        self.record(max)
    }

    fn record(&mut self, max: usize) -> R<()> {
        if !matches!(
            self.peek()?,
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32
        ) {
            return Err(ScanError::Invalid("a record must be a map"));
        }
        self.skip(max, 0)
    }
}

/// Reads the message at the start of `b`: its length, mode, tag and
/// `chunk`, having checked every entry's shape (packed entries included;
/// compressed ones are checked once inflated, by [`check_entries`]).
pub fn scan(b: &[u8], max: usize) -> R<Scanned> {
    let mut c = Cur::new(b, 0);
    let n = c.array_len(max)?;
    if !(2..=4).contains(&n) {
        return Err(ScanError::Invalid(
            "a message must be an array of 2 to 4 elements",
        ));
    }
    let tag = c.str_or_bin(max).map_err(|e| match e {
        ScanError::Invalid(_) => ScanError::Invalid("a message must start with its tag"),
        e => e,
    })?;
    let mut packed = 0..0;
    let mut mode = match c.peek()? {
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let entries = c.array_len(max)?;
            for _ in 0..entries {
                c.entry(max)?;
            }
            Mode::Forward
        }
        Marker::FixStr(_)
        | Marker::Str8
        | Marker::Str16
        | Marker::Str32
        | Marker::Bin8
        | Marker::Bin16
        | Marker::Bin32 => {
            let at = c.pos;
            packed = match c.str_or_bin(max) {
                // The chunk's length is known once its header is read:
                // come back once it is all here (the option map after it
                // is small) rather than reading it again at every read.
                Err(ScanError::Incomplete) => {
                    let hdr = match b[at] {
                        0xa0..=0xbf => 1,
                        0xc4 | 0xd9 => 2,
                        0xc5 | 0xda => 3,
                        _ => 5,
                    };
                    if c.pos != at + hdr {
                        return Err(ScanError::Incomplete);
                    }
                    let n = if hdr == 1 {
                        usize::from(b[at] & 0x1f)
                    } else {
                        b[at + 1..at + hdr]
                            .iter()
                            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x))
                    };
                    return Err(ScanError::Need(at + hdr + n));
                }
                r => r?,
            };
            Mode::Packed
        }
        _ => {
            if n < 3 {
                return Err(ScanError::Invalid("a Message mode message needs a record"));
            }
            c.time()?;
            c.record(max)?;
            Mode::Message
        }
    };
    let options = match mode {
        Mode::Message => n - 3,
        _ => n - 2,
    };
    if options > 1 {
        return Err(ScanError::Invalid("too many elements in a message"));
    }
    let mut chunk = None;
    let mut compressed = false;
    if options == 1 {
        if c.peek()? == Marker::Null {
            c.skip(max, 0)?;
        } else {
            let pairs = c.map_len(max)?;
            for _ in 0..pairs {
                let key = match c.peek()? {
                    Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                        let k = c.str_or_bin(max)?;
                        &b[k]
                    }
                    _ => {
                        c.skip(max, 0)?;
                        b""
                    }
                };
                match key {
                    b"chunk" => chunk = Some(c.str_or_bin(max)?),
                    b"compressed" => {
                        let v = c.str_or_bin(max)?;
                        match &b[v] {
                            b"gzip" => compressed = true,
                            b"text" => {}
                            _ => {
                                return Err(ScanError::Invalid(
                                    "option `compressed` must be \"gzip\" or \"text\"",
                                ))
                            }
                        }
                    }
                    _ => c.skip(max, 0)?,
                }
            }
        }
    }
    if mode == Mode::Packed {
        if compressed {
            mode = Mode::Compressed;
        } else {
            check_entries(&b[packed.clone()], max).map_err(ScanError::Invalid)?;
        }
    }
    Ok(Scanned {
        len: c.pos,
        mode,
        tag,
        packed,
        chunk,
    })
}

/// Checks that `b` is a sequence of complete `[time, record]` entries;
/// returns how many.
pub fn check_entries(b: &[u8], max: usize) -> Result<usize, &'static str> {
    let mut c = Cur::new(b, 0);
    let mut n = 0;
    while c.pos < b.len() {
        match c.entry(max) {
            Ok(()) => n += 1,
            Err(ScanError::Invalid(why)) => return Err(why),
            Err(ScanError::Incomplete | ScanError::Need(_)) => {
                return Err("packed entries end inside an entry")
            }
            Err(ScanError::TooLarge) => {
                return Err("a packed entry is larger than max_entry_bytes")
            }
        }
    }
    Ok(n)
}

/// Appends the events of the message frame `frame` of `buf` (checked by
/// [`scan`], compressed entries inflated) to `out`. `Err` only for a
/// frame that does not decode (a damaged spool record).
pub fn events(buf: &Bytes, frame: Span, out: &mut Vec<Event>) -> Result<(), &'static str> {
    let end = frame.end();
    let b = buf.get(..end).ok_or("frame out of range")?;
    let mut c = Cur::new(b, frame.start as usize);
    let max = usize::MAX;
    let map_err = |e: ScanError| match e {
        ScanError::Invalid(why) => why,
        _ => "truncated frame",
    };
    let n = c.array_len(max).map_err(map_err)?;
    let tag = c.str_or_bin(max).map_err(map_err)?;
    let tag = Value::Span(Span::new(tag.start, tag.len()));
    match c.peek().map_err(map_err)? {
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let entries = c.array_len(max).map_err(map_err)?;
            for _ in 0..entries {
                entry_event(&mut c, &tag, out).map_err(map_err)?;
            }
        }
        Marker::FixStr(_)
        | Marker::Str8
        | Marker::Str16
        | Marker::Str32
        | Marker::Bin8
        | Marker::Bin16
        | Marker::Bin32 => {
            let packed = c.str_or_bin(max).map_err(map_err)?;
            let mut p = Cur::new(&b[..packed.end], packed.start);
            while p.pos < packed.end {
                entry_event(&mut p, &tag, out).map_err(map_err)?;
            }
        }
        _ => {
            if n < 3 {
                return Err("a Message mode message needs a record");
            }
            let t = c.time().map_err(map_err)?;
            let ev = record_event(&mut c, &tag, t).map_err(map_err)?;
            out.push(ev);
        }
    }
    Ok(())
}

fn entry_event(c: &mut Cur<'_>, tag: &Value, out: &mut Vec<Event>) -> R<()> {
    if c.array_len(usize::MAX)? != 2 {
        return Err(ScanError::Invalid("an entry must be [time, record]"));
    }
    let t = c.time()?;
    out.push(record_event(c, tag, t)?);
    Ok(())
}

/// The field that carries the tag.
pub const TAG_FIELD: &str = "fluent.tag";

fn record_event(c: &mut Cur<'_>, tag: &Value, time_ns: i64) -> R<Event> {
    let pairs = c.map_len(usize::MAX)?;
    let mut ev = Event {
        message: Value::Null,
        fields: Vec::with_capacity(pairs + 1),
        time_ns: Some(time_ns),
        hidden: petrel_core::Hidden::NONE,
    };
    ev.fields.push((Key::Borrowed(TAG_FIELD), tag.clone()));
    let mut message = None;
    let mut log = None;
    for _ in 0..pairs {
        let key = key(c)?;
        let v = value(c, 0)?;
        match &*key {
            "message" if message.is_none() => message = Some(v),
            "log" if log.is_none() => log = Some(v),
            _ => ev.fields.push((key, v)),
        }
    }
    // As Vector's `fluent` source reads Docker's driver and Fluent Bit:
    // `message` is the message; failing that `log` (what Docker's
    // `fluentd` driver and Fluent Bit's tail input send), which is then
    // no field of its own. With both, `log` stays a field.
    match (message, log) {
        (Some(m), log) => {
            ev.message = m;
            if let Some(l) = log {
                ev.fields.push((Key::Borrowed("log"), l));
            }
        }
        (None, Some(l)) => ev.message = l,
        (None, None) => ev.message = Value::Str("".into()),
    }
    Ok(ev)
}

fn key(c: &mut Cur<'_>) -> R<Key> {
    match c.peek()? {
        Marker::FixStr(_)
        | Marker::Str8
        | Marker::Str16
        | Marker::Str32
        | Marker::Bin8
        | Marker::Bin16
        | Marker::Bin32 => {
            let r = c.str_or_bin(usize::MAX)?;
            Ok(Key::Owned(String::from_utf8_lossy(&c.b[r]).into_owned()))
        }
        _ => {
            // A number or other value as a key: its JSON text.
            let v = value(c, 0)?;
            Ok(Key::Owned(match v {
                Value::Int(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null => "null".to_string(),
                _ => "?".to_string(),
            }))
        }
    }
}

fn value(c: &mut Cur<'_>, depth: usize) -> R<Value> {
    if depth > MAX_DEPTH {
        return Err(ScanError::Invalid("values nested too deep"));
    }
    let max = usize::MAX;
    let m = c.peek()?;
    Ok(match m {
        Marker::FixStr(_)
        | Marker::Str8
        | Marker::Str16
        | Marker::Str32
        | Marker::Bin8
        | Marker::Bin16
        | Marker::Bin32 => {
            let r = c.str_or_bin(max)?;
            Value::Span(Span::new(r.start, r.len()))
        }
        Marker::Null => {
            c.pos += 1;
            Value::Null
        }
        Marker::True | Marker::False => {
            c.pos += 1;
            Value::Bool(m == Marker::True)
        }
        Marker::FixPos(n) => {
            c.pos += 1;
            Value::Int(i64::from(n))
        }
        Marker::FixNeg(n) => {
            c.pos += 1;
            Value::Int(i64::from(n))
        }
        Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
            c.pos += 1;
            let n = match m {
                Marker::U8 => 1,
                Marker::U16 => 2,
                Marker::U32 => 4,
                _ => 8,
            };
            let v = c.be(n)?;
            i64::try_from(v).map_or(Value::Float(v as f64), Value::Int)
        }
        Marker::I8 => {
            c.pos += 1;
            Value::Int(i64::from(c.be(1)? as u8 as i8))
        }
        Marker::I16 => {
            c.pos += 1;
            Value::Int(i64::from(c.be(2)? as u16 as i16))
        }
        Marker::I32 => {
            c.pos += 1;
            Value::Int(i64::from(c.be(4)? as u32 as i32))
        }
        Marker::I64 => {
            c.pos += 1;
            Value::Int(c.be(8)? as i64)
        }
        Marker::F32 => {
            c.pos += 1;
            Value::Float(f64::from(f32::from_bits(c.be(4)? as u32)))
        }
        Marker::F64 => {
            c.pos += 1;
            Value::Float(f64::from_bits(c.be(8)?))
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let n = c.array_len(max)?;
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                items.push(value(c, depth + 1)?);
            }
            Value::Array(items)
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let n = c.map_len(max)?;
            let mut o = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let k = key(c)?;
                o.push((k, value(c, depth + 1)?));
            }
            Value::Object(o)
        }
        Marker::FixExt8 if c.b.get(c.pos + 1) == Some(&0) => {
            // EventTime inside a record: nanoseconds since the epoch.
            c.pos += 1;
            Value::Int(c.event_time()?)
        }
        _ => {
            // Other extension types: their bytes (type byte first).
            let start = c.pos;
            c.skip(max, depth)?;
            let raw = &c.b[start..c.pos];
            let data = match raw.first() {
                Some(0xd4..=0xd8) => &raw[1..],
                Some(0xc7) => raw.get(2..).unwrap_or_default(),
                Some(0xc8) => raw.get(3..).unwrap_or_default(),
                Some(0xc9) => raw.get(5..).unwrap_or_default(),
                _ => raw,
            };
            Value::Bytes(data.into())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Vec<u8> {
        let mut o = Vec::new();
        rmp::encode::write_str(&mut o, v).unwrap();
        o
    }

    fn entry(t: u32, msg: &str) -> Vec<u8> {
        let mut o = Vec::new();
        rmp::encode::write_array_len(&mut o, 2).unwrap();
        rmp::encode::write_ext_meta(&mut o, 8, 0).unwrap();
        o.extend_from_slice(&t.to_be_bytes());
        o.extend_from_slice(&5u32.to_be_bytes());
        rmp::encode::write_map_len(&mut o, 2).unwrap();
        o.extend(s("message"));
        o.extend(s(msg));
        o.extend(s("n"));
        rmp::encode::write_sint(&mut o, -3).unwrap();
        o
    }

    fn packed(entries: &[u8], chunk: Option<&str>) -> Vec<u8> {
        let mut o = Vec::new();
        rmp::encode::write_array_len(&mut o, if chunk.is_some() { 3 } else { 2 }).unwrap();
        o.extend(s("app.web"));
        rmp::encode::write_bin(&mut o, entries).unwrap();
        if let Some(c) = chunk {
            rmp::encode::write_map_len(&mut o, 1).unwrap();
            o.extend(s("chunk"));
            o.extend(s(c));
        }
        o
    }

    #[test]
    fn packed_forward_scans_and_decodes_with_nanoseconds() {
        let mut e = entry(1_700_000_000, "hello");
        e.extend(entry(1_700_000_001, "world"));
        let msg = packed(&e, Some("abc"));
        let sc = scan(&msg, 1 << 20).unwrap();
        assert_eq!(sc.len, msg.len());
        assert_eq!(sc.mode, Mode::Packed);
        assert_eq!(&msg[sc.chunk.unwrap()], b"abc");
        for cut in 0..msg.len() {
            match scan(&msg[..cut], 1 << 20).unwrap_err() {
                ScanError::Incomplete => {}
                ScanError::Need(n) => assert!(n > cut && n <= msg.len()),
                e => panic!("{e:?}"),
            }
        }
        let buf = Bytes::from(msg.clone());
        let mut out = Vec::new();
        events(&buf, Span::new(0, msg.len()), &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].time_ns, Some(1_700_000_000_000_000_005));
        assert_eq!(out[1].message.as_bytes(&buf), Some(&b"world"[..]));
        assert_eq!(
            out[0].get(TAG_FIELD).unwrap().as_bytes(&buf),
            Some(&b"app.web"[..])
        );
        assert_eq!(out[0].get("n"), Some(&Value::Int(-3)));
    }

    #[test]
    fn garbage_and_oversized_values_are_refused() {
        assert!(matches!(scan(&[0xc1], 100), Err(ScanError::Invalid(_))));
        assert!(matches!(
            scan(b"\x92\x01\x02", 100),
            Err(ScanError::Invalid(_))
        ));
        let msg = packed(&[0u8; 200], None);
        assert_eq!(scan(&msg, 100).unwrap_err(), ScanError::TooLarge);
        assert!(matches!(scan(&msg, 1000), Err(ScanError::Invalid(_))));
    }
}
