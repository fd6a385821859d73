//! What the fuzz targets share: each input line is processed twice, once as
//! a span of a batch buffer (placed after other data, so offsets are not
//! zero) and once as an owned value, and the two results must agree.

pub mod processors;

#[path = "../../crates/petrel/src/sources/file/decode.rs"]
#[doc(hidden)]
pub mod decode_impl;
#[path = "../../crates/petrel/src/sources/kubernetes/format.rs"]
#[doc(hidden)]
pub mod format_impl;

/// The container log decoder (`kubernetes_logs`), compiled from the agent's
/// own sources and reachable at the module paths they expect.
pub mod sources {
    /// The file source's decoder contract.
    pub mod file {
        pub use crate::decode_impl as decode;
    }
    /// CRI and Docker json-file records.
    pub mod kubernetes {
        pub use crate::format_impl as format;
    }
}

use std::sync::Arc;

use bytes::Bytes;
use petrel_core::plugin::Processor;
use petrel_core::{ComponentMetrics, Event, EventBatch, Metrics, SourceInfo, Span, Value};

/// Counters for a processor under test.
pub fn metrics() -> ComponentMetrics {
    Metrics::new().component("fuzz", "processor", "p", "fuzz")
}

/// A value with every text resolved to bytes, for comparing the span and
/// owned paths.
#[derive(Debug, PartialEq)]
enum Resolved<'a> {
    Text(&'a [u8]),
    Int(i64),
    Float(u64),
    Bool(bool),
    Null,
    Array(Vec<Resolved<'a>>),
    Object(Vec<(&'a str, Resolved<'a>)>),
}

/// Resolves `v`, asserting that spans lie inside `line` (the byte range of
/// the event's own line in `buf`).
fn resolve<'a>(buf: &'a [u8], line: (usize, usize), v: &'a Value) -> Resolved<'a> {
    match v {
        Value::Span(s) => {
            assert!(
                s.start as usize >= line.0 && s.end() <= line.1,
                "span {s:?} outside its line {line:?}"
            );
            Resolved::Text(s.get(buf))
        }
        Value::Str(s) => Resolved::Text(s.as_bytes()),
        Value::Bytes(b) => Resolved::Text(b),
        Value::Int(i) => Resolved::Int(*i),
        Value::Float(f) => Resolved::Float(f.to_bits()),
        Value::Bool(b) => Resolved::Bool(*b),
        Value::Null => Resolved::Null,
        Value::Array(items) => {
            Resolved::Array(items.iter().map(|v| resolve(buf, line, v)).collect())
        }
        Value::Object(fields) => Resolved::Object(
            fields
                .iter()
                .map(|(k, v)| (&**k, resolve(buf, line, v)))
                .collect(),
        ),
    }
}

fn resolve_event<'a>(buf: &'a [u8], line: (usize, usize), ev: &'a Event) -> Resolved<'a> {
    let mut fields = vec![("message", resolve(buf, line, &ev.message))];
    fields.extend(ev.fields.iter().map(|(k, v)| (&**k, resolve(buf, line, v))));
    Resolved::Object(fields)
}

/// Runs `p` over `line` as a span and as an owned value and checks that
/// nothing points outside its line and both give the same fields.
pub fn check(p: &dyn Processor, line: &[u8]) {
    let mut buf = b"previous line\n".to_vec();
    let start = buf.len();
    buf.extend_from_slice(line);
    let end = buf.len();
    buf.push(b'\n');
    let mut batch = EventBatch::new(
        Bytes::from(buf),
        Arc::new(SourceInfo::file("/fuzz.log", Arc::new([]))),
    );
    let span = Event::from_span(Span::new(start, line.len()));
    let mut owned = span.clone();
    owned.message = match std::str::from_utf8(line) {
        Ok(s) => Value::Str(s.into()),
        Err(_) => Value::Bytes(line.into()),
    };
    batch.events = vec![span, owned];
    p.process(&mut batch);
    // With `on_error: drop` both or neither are dropped.
    assert!(
        batch.events.len() == 2 || batch.events.is_empty(),
        "{}",
        batch.events.len()
    );
    if let [a, b] = &batch.events[..] {
        let a = resolve_event(&batch.buf, (start, end), a);
        // The owned event may have no spans at all.
        let b = resolve_event(&batch.buf, (start, end), b);
        assert_eq!(a, b, "span and owned paths differ");
    }
}
