//! Events and batches of events that borrow from one read buffer.
//!
//! A source reads a block into one [`Bytes`] buffer and describes each event
//! as [`Span`]s into it, so a line costs a few integers rather than an
//! allocation. Processors add fields, preferably as spans too; only values
//! that do not exist in the input (masked text, computed numbers) are owned.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;

use crate::ack::AckPart;
use crate::memory::MemoryCharge;

/// A byte range in a batch's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// Offset of the first byte.
    pub start: u32,
    /// Length in bytes.
    pub len: u32,
}

impl Span {
    /// A span from `start` of `len` bytes.
    pub fn new(start: usize, len: usize) -> Self {
        // Buffers are bounded far below 4 GiB (read blocks plus max_line_bytes).
        Self {
            start: start as u32,
            len: len as u32,
        }
    }

    /// The bytes of this span in `buf`; empty when out of range.
    #[inline]
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let s = self.start as usize;
        buf.get(s..s + self.len as usize).unwrap_or_default()
    }

    /// Offset one past the last byte.
    #[inline]
    pub fn end(&self) -> usize {
        self.start as usize + self.len as usize
    }
}

/// A field name. Static names cost nothing; dynamic ones are shared.
pub type Key = Cow<'static, str>;

/// A field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Bytes borrowed from the batch buffer.
    Span(Span),
    /// Owned text.
    Str(Box<str>),
    /// Owned bytes that need not be UTF-8.
    Bytes(Box<[u8]>),
    /// A signed integer.
    Int(i64),
    /// A floating point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// An explicit null.
    Null,
    /// An ordered list.
    Array(Vec<Value>),
    /// A nested object, keys in input order.
    Object(Vec<(Key, Value)>),
}

impl Value {
    /// The raw bytes of a text-like value (span, string, bytes).
    pub fn as_bytes<'a>(&'a self, buf: &'a [u8]) -> Option<&'a [u8]> {
        match self {
            Value::Span(s) => Some(s.get(buf)),
            Value::Str(s) => Some(s.as_bytes()),
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// `path` in `entries`: a key equal to it, or a key equal to a part of it
/// before a dot whose object holds the rest.
fn lookup_path<'a>(entries: &'a [(Key, Value)], path: &str) -> Option<&'a Value> {
    if let Some((_, v)) = entries.iter().find(|(k, _)| k == path) {
        return Some(v);
    }
    for (i, _) in path.match_indices('.') {
        let (head, rest) = (&path[..i], &path[i + 1..]);
        if let Some((_, Value::Object(inner))) = entries.iter().find(|(k, _)| k == head) {
            if let Some(v) = lookup_path(inner, rest) {
                return Some(v);
            }
        }
    }
    None
}

/// One log event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The raw message, usually a span of the read buffer.
    pub message: Value,
    /// Fields added by processors, in insertion order.
    pub fields: Vec<(Key, Value)>,
    /// Event time in nanoseconds since the Unix epoch, when parsed.
    pub time_ns: Option<i64>,
}

impl Event {
    /// An event whose message is `span` of the batch buffer.
    #[inline]
    pub fn from_span(span: Span) -> Self {
        Self {
            message: Value::Span(span),
            fields: Vec::new(),
            time_ns: None,
        }
    }

    /// The value of field `name` (`message` included).
    pub fn get(&self, name: &str) -> Option<&Value> {
        if name == "message" {
            return Some(&self.message);
        }
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The value of field `name`, or else of a dotted path into nested
    /// objects (`@metadata.beat`, `kubernetes.labels.app`): a field whose
    /// name is a prefix of `name` up to a dot, then keys of its objects.
    /// A field named with the dots itself wins.
    pub fn get_path(&self, name: &str) -> Option<&Value> {
        if let Some(v) = self.get(name) {
            return Some(v);
        }
        if !name.contains('.') {
            return None;
        }
        lookup_path(&self.fields, name)
    }

    /// Sets field `name`, replacing an existing value.
    pub fn set(&mut self, name: Key, value: Value) {
        if name == "message" {
            self.message = value;
            return;
        }
        if let Some(slot) = self.fields.iter_mut().find(|(k, _)| *k == name) {
            slot.1 = value;
        } else {
            self.fields.push((name, value));
        }
    }

    /// Removes field `name` and returns its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let idx = self.fields.iter().position(|(k, _)| k == name)?;
        Some(self.fields.remove(idx).1)
    }
}

/// Empties `events`, quickly when none of them owns memory: the events of
/// raw lines (a span each, no fields) are then forgotten in one step
/// instead of dropped one by one, which cost two calls per event (3 % of
/// the single128 → text pipeline's CPU, BENCHMARKS.md section 21).
pub fn drop_events(events: &mut Vec<Event>) {
    let trivial = events.iter().all(|e| {
        e.fields.capacity() == 0
            && matches!(
                e.message,
                Value::Span(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_) | Value::Null
            )
    });
    if trivial {
        // SAFETY: shrinking the length is always sound; the events past it
        // are not dropped, and none of them owns anything to release
        // (checked above: plain values, no field vector allocated).
        unsafe { events.set_len(0) };
    } else {
        events.clear();
    }
}

/// Where a batch came from; shared by all its events.
#[derive(Debug, Default)]
pub struct SourceInfo {
    /// The file path written as the `file` field; empty for sources that
    /// do not read files (then no `file` field is written).
    pub path: Arc<str>,
    /// Metadata fields set by the source and the engine (`host`, later
    /// container and pod labels), written like event fields unless an
    /// event has a field of the same name.
    pub meta: Arc<[(Key, Arc<str>)]>,
    /// The source's `type:`, readable as the `source_type` field.
    pub source_type: &'static str,
}

impl SourceInfo {
    /// A batch origin that is the file at `path`, with `meta` fields.
    pub fn file(path: impl Into<Arc<str>>, meta: Arc<[(Key, Arc<str>)]>) -> Self {
        Self {
            path: path.into(),
            meta,
            source_type: "file",
        }
    }

    /// The value of metadata field `name`, `file` and `source_type` included.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        match name {
            "file" if !self.path.is_empty() => Some(self.path.as_bytes()),
            "source_type" if !self.source_type.is_empty() => Some(self.source_type.as_bytes()),
            _ => self
                .meta
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_bytes()),
        }
    }
}

/// Where a batch's buffer sits in a stream whose byte positions survive
/// restarts (a file, a spool segment), so that sinks can give each event an
/// id that is the same every time the event is read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Identity of the stream, stable across restarts, reloads and
    /// rotation, and different for different content at the same place
    /// (a reused inode).
    pub stream: u128,
    /// Stream position of the buffer's first byte.
    pub base: u64,
    /// For buffers that are not the stream's bytes themselves (messages
    /// decoded from a container runtime's records): for each message, in
    /// buffer order, its buffer position, the stream position (from
    /// `base`) it stands for, and a tag mixed into the stream identity
    /// (the record's stdout/stderr: records of both interleave, so their
    /// positions may overlap). A position inside a message maps to the
    /// same distance from its start. `None`: the buffer is the stream's
    /// bytes from `base` on.
    pub starts: Option<Arc<[(u32, u32, u8)]>>,
    /// Positions in `starts` count records, not bytes (a Kafka partition's
    /// offsets): every event of a message maps to the message's own
    /// position, since a distance inside it would name the next record.
    pub per_record: bool,
}

impl Origin {
    /// The position of the last message in `starts` (or `base` without a
    /// map): with `per_record`, one less than where reading resumes after
    /// this buffer.
    pub fn last_position(&self) -> u64 {
        match self.starts.as_deref().and_then(<[_]>::last) {
            Some(&(_, pos, _)) => self.base + pos as u64,
            None => self.base,
        }
    }
}

/// Events sharing one read buffer, flowing through a pipeline together.
pub struct EventBatch {
    /// The buffer all [`Value::Span`]s point into.
    pub buf: Bytes,
    /// The events, in source order.
    pub events: Vec<Event>,
    /// The origin of every event in this batch.
    pub source: Arc<SourceInfo>,
    /// Input bytes this batch represents (lines with their newlines).
    pub input_bytes: u64,
    /// Delivery tracking; the engine splits it into one part per sink.
    pub ack: Option<AckPart>,
    /// Memory held by the buffer; released when the batch is dropped.
    pub charge: MemoryCharge,
    /// Where `buf` sits in its stream, set only by sources whose positions
    /// are stable; events carry no position of their own (see
    /// [`EventBatch::event_origin`]).
    pub origin: Option<Origin>,
    /// Set by a source when the messages are exactly the lines of `buf`:
    /// each a [`Value::Span`], in order, with no gap, each followed by one
    /// `\n`, and `buf` ending with that newline. The text encoding is then
    /// `buf` itself, copied in one go instead of walked event by event. The
    /// engine clears it before any processor runs (processors change
    /// events in place), and batches built any other way leave it false.
    /// Such events own no memory (no fields), so the engine forgets them
    /// instead of dropping them one by one.
    pub verbatim_lines: bool,
    /// Events a processor took out of the flow and sent to one named sink
    /// instead of dropping them (`reroute_dropped`); they skip the rest of
    /// the chain and only that sink receives them.
    pub rerouted: Vec<Rerouted>,
}

/// An event set aside for one sink (see [`EventBatch::rerouted`]).
#[derive(Debug, Clone)]
pub struct Rerouted {
    /// The id of the sink that receives it.
    pub sink: Arc<str>,
    /// The event, sharing the batch's buffer.
    pub event: Event,
}

impl EventBatch {
    /// A batch over `buf` with no events yet.
    pub fn new(buf: Bytes, source: Arc<SourceInfo>) -> Self {
        Self {
            buf,
            events: Vec::new(),
            source,
            input_bytes: 0,
            ack: None,
            charge: MemoryCharge::none(),
            origin: None,
            verbatim_lines: false,
            rerouted: Vec::new(),
        }
    }

    /// The stream and stream position `ev` came from, when the batch has an
    /// [`Origin`]: the lowest buffer position among the event's message and
    /// top-level fields that still point into the buffer. Every such span
    /// lies within the event's own line(s), lines do not overlap, and
    /// processors are deterministic, so reading the same bytes again gives
    /// the same position, however the reads were cut into batches and
    /// whichever events a filter dropped. `None` when the batch has no
    /// origin or no value of the event comes from the buffer any more
    /// (a masked message and nothing else).
    pub fn event_origin(&self, ev: &Event) -> Option<(u128, u64)> {
        let o = self.origin.as_ref()?;
        let mut low = match &ev.message {
            Value::Span(s) => Some(s.start),
            _ => None,
        };
        for (_, v) in &ev.fields {
            if let Value::Span(s) = v {
                low = Some(low.map_or(s.start, |l| l.min(s.start)));
            }
        }
        let low = low?;
        match &o.starts {
            None => Some((o.stream, o.base + low as u64)),
            Some(map) => {
                let i = map.partition_point(|&(s, _, _)| s <= low).checked_sub(1)?;
                let (start, pos, tag) = map[i];
                let inside = if o.per_record { 0 } else { low - start };
                Some((o.stream ^ tag as u128, o.base + pos as u64 + inside as u64))
            }
        }
    }

    /// Bytes of field `name` of `ev`, counting the batch's source
    /// metadata (`file`, `host`, `source_type`, ...) as fields unless a
    /// processor set one of the same name.
    pub fn field_bytes<'a>(&'a self, ev: &'a Event, name: &str) -> Option<&'a [u8]> {
        match ev.get(name) {
            Some(v) => self.bytes_of(v),
            None => self.source.field(name),
        }
    }

    /// Bytes of `value` in this batch's buffer, for text-like values.
    #[inline]
    pub fn bytes_of<'a>(&'a self, value: &'a Value) -> Option<&'a [u8]> {
        value.as_bytes(&self.buf)
    }
}

impl std::fmt::Debug for EventBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBatch")
            .field("source", &self.source.path)
            .field("events", &self.events.len())
            .field("input_bytes", &self.input_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_out_of_range_is_empty() {
        let buf = b"hello";
        assert_eq!(Span::new(1, 3).get(buf), b"ell");
        assert_eq!(Span::new(4, 9).get(buf), b"");
    }

    #[test]
    fn dotted_paths_reach_into_objects() {
        let mut e = Event::from_span(Span::new(0, 1));
        e.set(
            "@metadata".into(),
            Value::Object(vec![
                ("beat".into(), Value::Str("winlogbeat".into())),
                (
                    "a.b".into(),
                    Value::Object(vec![("c".into(), Value::Int(3))]),
                ),
            ]),
        );
        e.set("x.y".into(), Value::Int(1));
        assert_eq!(
            e.get_path("@metadata.beat"),
            Some(&Value::Str("winlogbeat".into()))
        );
        assert_eq!(e.get_path("@metadata.a.b.c"), Some(&Value::Int(3)));
        assert_eq!(
            e.get_path("x.y"),
            Some(&Value::Int(1)),
            "a dotted name wins"
        );
        assert_eq!(e.get_path("@metadata.missing"), None);
        assert_eq!(e.get_path("@metadata.beat.deeper"), None);
        assert_eq!(e.get("@metadata.beat"), None, "get stays exact");
    }

    #[test]
    fn set_get_remove() {
        let mut e = Event::from_span(Span::new(0, 1));
        e.set("a".into(), Value::Int(1));
        e.set("a".into(), Value::Int(2));
        assert_eq!(e.get("a"), Some(&Value::Int(2)));
        assert_eq!(e.remove("a"), Some(Value::Int(2)));
        assert!(e.get("a").is_none());
        e.set("message".into(), Value::Str("x".into()));
        assert_eq!(e.message, Value::Str("x".into()));
    }

    #[test]
    fn event_origin_is_the_lowest_span_and_survives_a_replaced_message() {
        let mut b = EventBatch::new(Bytes::from_static(b"ab cd\nef\n"), Arc::default());
        let mut first = Event::from_span(Span::new(0, 5));
        let second = Event::from_span(Span::new(6, 2));
        assert_eq!(b.event_origin(&first), None, "no origin, no position");
        b.origin = Some(Origin {
            stream: 7,
            base: 1000,
            starts: None,
            per_record: false,
        });
        assert_eq!(b.event_origin(&second), Some((7, 1006)));
        // A parser put the message on a later span, a mask replaced it:
        // the other fields still place the event.
        first.set("word".into(), Value::Span(Span::new(3, 2)));
        first.message = Value::Str("masked".into());
        assert_eq!(b.event_origin(&first), Some((7, 1003)));
        first.fields.clear();
        assert_eq!(b.event_origin(&first), None);
        // Decoded messages: buffer 0 stands for stream 40, buffer 6 for 90.
        b.origin = Some(Origin {
            stream: 7,
            base: 1000,
            starts: Some(Arc::from(vec![(0, 40, 0), (6, 90, 2)])),
            per_record: false,
        });
        assert_eq!(b.event_origin(&second), Some((7 ^ 2, 1090)));
        let inner = Event::from_span(Span::new(3, 2));
        assert_eq!(b.event_origin(&inner), Some((7, 1043)));
        // Kafka records: a field inside the first record still names it,
        // not the record after it.
        b.origin = Some(Origin {
            stream: 7,
            base: 500,
            starts: Some(Arc::from(vec![(0, 0, 0), (6, 1, 0)])),
            per_record: true,
        });
        assert_eq!(b.event_origin(&inner), Some((7, 500)));
        assert_eq!(b.event_origin(&second), Some((7, 501)));
        assert_eq!(b.origin.as_ref().map(Origin::last_position), Some(501));
    }
}
