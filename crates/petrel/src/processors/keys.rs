//! What `throttle`, `dedupe` and `sample` share: looking a field up among
//! an event's fields and its batch's metadata, hashing values, and a
//! bounded LRU of hashes whose evictions are counted.

use std::num::NonZeroUsize;

use petrel_core::{Event, EventBatch, Value};
use prometheus_client::metrics::counter::Counter;

use super::common::value_text;

/// The 64-bit hash keys are kept and compared by: XXH3 with a fixed seed,
/// so the same value hashes the same on every agent and after restarts
/// (sampling by key keeps a trace together across instances).
#[inline]
pub fn hash(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_128::oneshot(bytes) as u64
}

/// The text of field `name` for a key: the event's field (numbers and
/// booleans as their JSON text), else the batch's metadata (`host`,
/// `file`, `kafka.topic`...), the lookup of the condition language.
#[inline]
pub fn field_text<'a>(
    batch: &'a EventBatch,
    ev: &'a Event,
    name: &str,
    scratch: &'a mut [u8; 32],
) -> Option<&'a [u8]> {
    match ev.get(name) {
        Some(v) => value_text(v, &batch.buf, scratch),
        None => batch.meta_field(ev, name),
    }
}

/// Appends an unambiguous encoding of `v` to `out` (a type tag, lengths
/// before contents), so that different values never encode the same.
pub fn encode_value(out: &mut Vec<u8>, v: &Value, buf: &[u8]) {
    match v {
        Value::Span(_) | Value::Str(_) | Value::Bytes(_) => {
            let b = v.as_bytes(buf).unwrap_or_default();
            out.push(b's');
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        Value::Int(i) => {
            out.push(b'i');
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::Float(x) => {
            out.push(b'f');
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        Value::Bool(b) => out.extend_from_slice(if *b { b"t" } else { b"F" }),
        Value::Null => out.push(b'n'),
        Value::Array(items) => {
            out.push(b'a');
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                encode_value(out, i, buf);
            }
        }
        Value::Object(entries) => {
            out.push(b'o');
            out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
            for (k, v) in entries {
                encode_text(out, k.as_bytes());
                encode_value(out, v, buf);
            }
        }
    }
}

/// Appends `text` with its length.
#[inline]
pub fn encode_text(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text);
}

/// A bounded LRU map from key hashes to `V`: at most `capacity` entries
/// whatever the key cardinality; the least recently used one makes room,
/// counted in `petrel_component_cache_evictions_total`.
pub struct Lru<V> {
    map: lru::LruCache<u64, V>,
    evictions: Counter,
}

impl<V> Lru<V> {
    /// An empty cache of at most `capacity` (at least 1) entries.
    pub fn new(capacity: usize, evictions: Counter) -> Self {
        Self {
            map: lru::LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            evictions,
        }
    }

    /// The entry of `key`, made most recently used; created with `make`
    /// (evicting the least recently used entry when full) if absent. The
    /// flag is true when the entry existed.
    pub fn entry(&mut self, key: u64, make: impl FnOnce() -> V) -> (&mut V, bool) {
        let existed = self.map.contains(&key);
        if !existed && self.map.len() >= self.map.cap().get() {
            self.evictions.inc();
        }
        (self.map.get_or_insert_mut(key, make), existed)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lru_is_bounded_and_counts_evictions() {
        let c = Counter::default();
        let mut l: Lru<u32> = Lru::new(3, c.clone());
        for k in 0..10u64 {
            let (_, existed) = l.entry(k, || 0);
            assert!(!existed);
        }
        assert_eq!(l.len(), 3);
        assert_eq!(c.get(), 7);
        // 9 is the most recent; 7 is the least recent of 7, 8, 9.
        let (v, existed) = l.entry(7, || 0);
        assert!(existed);
        *v = 5;
        l.entry(10, || 0); // evicts 8
        assert!(l.entry(7, || 0).1);
        assert!(!l.entry(8, || 0).1);
        assert_eq!(c.get(), 9);
    }

    #[test]
    fn encodings_differ_between_types_and_boundaries() {
        let enc = |vals: &[Value]| {
            let mut out = Vec::new();
            for v in vals {
                encode_value(&mut out, v, b"");
            }
            hash(&out)
        };
        assert_ne!(enc(&[Value::Int(1)]), enc(&[Value::Str("1".into())]));
        assert_ne!(
            enc(&[Value::Str("ab".into()), Value::Str("c".into())]),
            enc(&[Value::Str("a".into()), Value::Str("bc".into())])
        );
        assert_eq!(
            enc(&[Value::Str("x".into())]),
            enc(&[Value::Bytes(b"x".to_vec().into())])
        );
        assert_eq!(hash(b"trace-1"), hash(b"trace-1"));
    }
}
