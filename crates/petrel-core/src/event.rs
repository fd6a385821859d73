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

/// The metadata entries of its batch (see [`SourceInfo::entry`]) that an
/// event no longer has: a processor removed, renamed or moved them. Bit
/// `i` stands for entry `i`. The first 64 entries cost nothing beyond the
/// word here; a batch with more (pods with many labels) spills the rest
/// into a boxed list only for events that hide one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden {
    low: u64,
    // Boxed so that an event pays one word for the rare spill, not the
    // three of a `Vec`.
    #[allow(clippy::box_collection)]
    high: Option<Box<Vec<u64>>>,
}

impl Hidden {
    /// Nothing hidden.
    pub const NONE: Hidden = Hidden { low: 0, high: None };

    /// True when no entry is hidden (the common case, checked first by
    /// every writer).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.low == 0 && self.high.is_none()
    }

    /// Whether entry `i` is hidden.
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        if i < 64 {
            return self.low & (1 << i) != 0;
        }
        let (w, b) = ((i - 64) / 64, (i - 64) % 64);
        self.high
            .as_ref()
            .and_then(|h| h.get(w))
            .is_some_and(|word| word & (1 << b) != 0)
    }

    /// Shows entry `i` again.
    pub fn remove(&mut self, i: usize) {
        if i < 64 {
            self.low &= !(1 << i);
            return;
        }
        let (w, b) = ((i - 64) / 64, (i - 64) % 64);
        if let Some(word) = self.high.as_mut().and_then(|h| h.get_mut(w)) {
            *word &= !(1 << b);
        }
        if self
            .high
            .as_ref()
            .is_some_and(|h| h.iter().all(|w| *w == 0))
        {
            self.high = None;
        }
    }

    /// Hides entry `i`.
    pub fn insert(&mut self, i: usize) {
        if i < 64 {
            self.low |= 1 << i;
            return;
        }
        let (w, b) = ((i - 64) / 64, (i - 64) % 64);
        let high = self.high.get_or_insert_with(Default::default);
        if high.len() <= w {
            high.resize(w + 1, 0);
        }
        high[w] |= 1 << b;
    }
}

/// Removes `path` from `entries` as [`lookup_path`] finds it.
fn remove_path(entries: &mut Vec<(Key, Value)>, path: &str) -> Option<Value> {
    if let Some(i) = entries.iter().position(|(k, _)| k == path) {
        return Some(entries.remove(i).1);
    }
    for (i, _) in path.match_indices('.') {
        let (head, rest) = (&path[..i], &path[i + 1..]);
        if let Some((_, Value::Object(inner))) = entries.iter_mut().find(|(k, _)| k == head) {
            if let Some(v) = remove_path(inner, rest) {
                return Some(v);
            }
        }
    }
    None
}

/// One log event.
///
/// Its fields are its own (`message`, `fields`, the time) and the
/// metadata of its batch ([`SourceInfo::entry`]: `file`, `host`, the
/// container's and pod's, ...), less the entries in `hidden`. An own field
/// of the same name as an entry takes that entry's place.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The raw message, usually a span of the read buffer. `Null` when a
    /// processor removed it: no `message` is written then.
    pub message: Value,
    /// Fields added by processors, in insertion order.
    pub fields: Vec<(Key, Value)>,
    /// Event time in nanoseconds since the Unix epoch, when parsed.
    pub time_ns: Option<i64>,
    /// Metadata entries of the batch this event no longer has.
    pub hidden: Hidden,
}

impl Event {
    /// An event whose message is `span` of the batch buffer.
    #[inline]
    pub fn from_span(span: Span) -> Self {
        Self::new(Value::Span(span))
    }

    /// An event with `message` and nothing else.
    #[inline]
    pub fn new(message: Value) -> Self {
        Self {
            message,
            fields: Vec::new(),
            time_ns: None,
            hidden: Hidden::NONE,
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

    /// Removes field `name`, or else the dotted path `name` inside an
    /// object field (as [`Event::get_path`] finds it), and returns its
    /// value.
    pub fn remove_path(&mut self, name: &str) -> Option<Value> {
        remove_path(&mut self.fields, name)
    }
}

/// Empties `events`, quickly when none of them owns memory: the events of
/// raw lines (a span each, no fields) are then forgotten in one step
/// instead of dropped one by one, which cost two calls per event (3 % of
/// the single128 → text pipeline's CPU, BENCHMARKS.md section 21).
pub fn drop_events(events: &mut Vec<Event>) {
    let trivial = events.iter().all(|e| {
        e.fields.capacity() == 0
            && e.hidden.high.is_none()
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

    /// How many entry numbers there are ([`SourceInfo::entry`]): `file`,
    /// then each of `meta`.
    #[inline]
    pub fn entry_count(&self) -> usize {
        1 + self.meta.len()
    }

    /// Metadata entry `i` as (name, value): entry 0 is `file` (absent for
    /// sources that read no file), entry `1 + j` is `meta[j]`. These are
    /// the fields an event gets from its batch; [`Event::hidden`] counts
    /// in these numbers.
    #[inline]
    pub fn entry(&self, i: usize) -> Option<(&str, &str)> {
        match i {
            0 if self.path.is_empty() => None,
            0 => Some(("file", &self.path)),
            _ => self.meta.get(i - 1).map(|(k, v)| (&**k, &**v)),
        }
    }

    /// The entries, with their numbers.
    pub fn entries(&self) -> impl Iterator<Item = (usize, &str, &str)> {
        (0..self.entry_count()).filter_map(|i| self.entry(i).map(|(k, v)| (i, k, v)))
    }

    /// The number of the entry named `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        if name == "file" {
            return (!self.path.is_empty()).then_some(0);
        }
        self.meta.iter().position(|(k, _)| k == name).map(|j| j + 1)
    }

    /// The numbers of the entries named `name` or below it (`k8s` covers
    /// `k8s.pod_name` and `k8s.labels.app`).
    pub fn find_under<'a>(&'a self, name: &'a str) -> impl Iterator<Item = usize> + 'a {
        self.entries()
            .filter(move |(_, k, _)| crate::schema::is_under(k, name))
            .map(|(i, _, _)| i)
    }

    /// The value of metadata entry `name` as `ev` has it: none when the
    /// event hid it. `source_type` (not an entry: it is never written,
    /// and cannot be removed) is answered too.
    pub fn visible(&self, ev: &Event, name: &str) -> Option<&str> {
        if name == "source_type" && !self.source_type.is_empty() {
            return Some(self.source_type);
        }
        let i = self.find(name)?;
        if ev.hidden.contains(i) {
            return None;
        }
        self.entry(i).map(|(_, v)| v)
    }

    /// Hides from `ev` the entries named `name` or below it; true when
    /// there was one to hide.
    pub fn hide(&self, ev: &mut Event, name: &str) -> bool {
        let mut any = false;
        for i in (0..self.entry_count()).filter(|&i| {
            self.entry(i)
                .is_some_and(|(k, _)| crate::schema::is_under(k, name))
        }) {
            if !ev.hidden.contains(i) {
                ev.hidden.insert(i);
                any = true;
            }
        }
        any
    }

    /// The value of `name` as `ev` has it, own field first, then the
    /// metadata: an entry's text, or for the name of a group of entries
    /// (`k8s`, `k8s.labels`) an object of the entries below it.
    pub fn value_of(&self, ev: &Event, name: &str) -> Option<Value> {
        if name == "message" {
            return (!matches!(ev.message, Value::Null)).then(|| ev.message.clone());
        }
        if let Some(v) = ev.get_path(name) {
            return Some(v.clone());
        }
        if let Some(v) = self.visible(ev, name) {
            return Some(Value::Str(v.into()));
        }
        let prefix = crate::schema::segments(name);
        let mut obj: Option<Value> = None;
        for (i, k, v) in self.entries() {
            if ev.hidden.contains(i) || !crate::schema::is_under(k, name) || k == name {
                continue;
            }
            // An own field of the entry's name holds its value now.
            let value = ev.get(k).cloned().unwrap_or_else(|| Value::Str(v.into()));
            let segs = crate::schema::segments(k);
            let root = obj.get_or_insert_with(|| Value::Object(Vec::new()));
            crate::schema::insert_path(root, &segs[prefix.len()..], value);
        }
        obj
    }

    /// Takes `name` out of `ev` and returns its value as
    /// [`SourceInfo::value_of`] saw it: the own field is removed
    /// (`message` becomes absent) and the metadata it names is hidden.
    pub fn take(&self, ev: &mut Event, name: &str) -> Option<Value> {
        let v = self.value_of(ev, name);
        self.remove(ev, name);
        v
    }

    /// Removes `name` from `ev`: the own field (`message` included) and
    /// every metadata entry named so or below it; true when something was
    /// there.
    pub fn remove(&self, ev: &mut Event, name: &str) -> bool {
        let own = if name == "message" {
            !matches!(std::mem::replace(&mut ev.message, Value::Null), Value::Null)
        } else {
            let mut own = ev.remove_path(name).is_some();
            // Own fields that took the place of entries below `name`.
            if self
                .meta
                .iter()
                .any(|(k, _)| crate::schema::is_under(k, name))
            {
                let before = ev.fields.len();
                ev.fields
                    .retain(|(k, _)| !(crate::schema::is_under(k, name) && self.find(k).is_some()));
                own |= ev.fields.len() != before;
            }
            own
        };
        self.hide(ev, name) || own
    }

    /// Sets own field `name` of `ev`; the metadata entries below it are
    /// hidden, so that a field named like a group (`k8s`) replaces the
    /// whole group. (An entry of the same name is replaced by the own
    /// field in any case.)
    pub fn set(&self, ev: &mut Event, name: Key, value: Value) {
        if self
            .meta
            .iter()
            .any(|(k, _)| k.len() > name.len() && crate::schema::is_under(k, &name))
        {
            for i in 1..self.entry_count() {
                if self
                    .entry(i)
                    .is_some_and(|(k, _)| k.len() > name.len() && crate::schema::is_under(k, &name))
                {
                    ev.hidden.insert(i);
                }
            }
        }
        ev.set(name, value);
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
    /// processor set one of the same name or removed it.
    pub fn field_bytes<'a>(&'a self, ev: &'a Event, name: &str) -> Option<&'a [u8]> {
        match ev.get(name) {
            Some(v) => self.bytes_of(v),
            None => self.meta_field(ev, name),
        }
    }

    /// The text of metadata entry `name` (or `source_type`) as `ev` has
    /// it: none when a processor removed it. The fallback of every lookup
    /// of a field by name (conditions, templates, keys) after the event's
    /// own fields.
    #[inline]
    pub fn meta_field<'a>(&'a self, ev: &Event, name: &str) -> Option<&'a [u8]> {
        self.source.visible(ev, name).map(str::as_bytes)
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
