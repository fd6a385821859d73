//! The common case of `parse_json` without serde: one object whose values
//! are strings without escapes, integers, `true`, `false` or `null`.
//!
//! Through sonic-rs's serde interface, a json512 line (six keys) cost
//! about 4,700 instructions in deserialisation and visitor calls; this
//! scan costs a few hundred (BENCHMARKS.md section 21). It only ever
//! accepts input that sonic-rs accepts too, and gives the same fields:
//! anything else (escapes, nested values, numbers with a fraction or an
//! exponent, invalid or unusual input of any kind) answers
//! [`Flat::Fallback`] and the caller parses with sonic-rs, which also
//! words every error.

use petrel_core::{Key, Span, Value};

/// What the scan made of the input.
#[derive(Debug, PartialEq)]
pub(super) enum Flat {
    /// Parsed; the fields were appended.
    Done,
    /// Not for this scan; the fields it appended must be removed.
    Fallback,
}

/// JSON's whitespace.
#[inline]
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// Index of the first byte at or after `i` that ends a plain string: a
/// quote, a backslash or a control character; `None` when there is none.
#[inline]
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86_64; every load reads 16 bytes that
        // lie inside `b` (`i + 16 <= b.len()`).
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let bslash = _mm_set1_epi8(b'\\' as i8);
            let ctl = _mm_set1_epi8(0x1f);
            while i + 16 <= b.len() {
                let v = _mm_loadu_si128(b.as_ptr().add(i).cast());
                let hit = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                    // c <= 0x1f exactly when max(c, 0x1f) == 0x1f (unsigned).
                    _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl),
                );
                let m = _mm_movemask_epi8(hit) as u32;
                if m != 0 {
                    return Some(i + m.trailing_zeros() as usize);
                }
                i += 16;
            }
        }
    }
    b[i..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| i + p)
}

/// The plain string starting after the quote at `i - 1`: its range, and
/// the index after its closing quote.
#[inline]
fn plain_string(b: &[u8], i: usize) -> Option<(usize, usize, usize)> {
    let end = string_end(b, i)?;
    (b[end] == b'"').then_some((i, end, end + 1))
}

/// Scans `input` (already known to be UTF-8), appending fields to `out`
/// with keys from `key(position, name)` and string values from
/// `string(offset, text)`.
pub(super) fn parse(
    input: &[u8],
    out: &mut Vec<(Key, Value)>,
    mut key: impl FnMut(usize, &str) -> Key,
    mut string: impl FnMut(usize, &str) -> Value,
) -> Flat {
    let b = input;
    let n = b.len();
    let first = out.len();
    let mut i = 0;
    while i < n && is_ws(b[i]) {
        i += 1;
    }
    if i >= n || b[i] != b'{' {
        return Flat::Fallback;
    }
    i += 1;
    let skip_ws = |mut i: usize| {
        while i < n && is_ws(b[i]) {
            i += 1;
        }
        i
    };
    i = skip_ws(i);
    if i < n && b[i] == b'}' {
        i += 1;
    } else {
        loop {
            // A key: a plain string.
            if i >= n || b[i] != b'"' {
                return Flat::Fallback;
            }
            let Some((ks, ke, next)) = plain_string(b, i + 1) else {
                return Flat::Fallback;
            };
            i = skip_ws(next);
            if i >= n || b[i] != b':' {
                return Flat::Fallback;
            }
            i = skip_ws(i + 1);
            if i >= n {
                return Flat::Fallback;
            }
            let value = match b[i] {
                b'"' => {
                    let Some((vs, ve, next)) = plain_string(b, i + 1) else {
                        return Flat::Fallback;
                    };
                    i = next;
                    // SAFETY: `input` is UTF-8 and the range lies between
                    // two ASCII quotes, so it starts and ends on
                    // character boundaries.
                    string(vs, unsafe { std::str::from_utf8_unchecked(&b[vs..ve]) })
                }
                b'-' | b'0'..=b'9' => {
                    let neg = b[i] == b'-';
                    if neg {
                        i += 1;
                    }
                    let digits = i;
                    let mut v: i64 = 0;
                    while i < n && b[i].is_ascii_digit() {
                        // 18 digits always fit in an i64; a 19th (and the
                        // u64/f64 cases) is sonic-rs's. Checked before the
                        // multiplication, which would overflow on it.
                        if i - digits == 18 {
                            return Flat::Fallback;
                        }
                        v = v * 10 + i64::from(b[i] - b'0');
                        i += 1;
                    }
                    let count = i - digits;
                    // No digits, a leading zero ("01", and "-0", whose
                    // sign sonic-rs may keep), or a fraction or exponent
                    // next.
                    if count == 0
                        || (b[digits] == b'0' && (count > 1 || neg))
                        || (i < n && matches!(b[i], b'.' | b'e' | b'E'))
                    {
                        return Flat::Fallback;
                    }
                    Value::Int(if neg { -v } else { v })
                }
                b't' if b[i..].starts_with(b"true") => {
                    i += 4;
                    Value::Bool(true)
                }
                b'f' if b[i..].starts_with(b"false") => {
                    i += 5;
                    Value::Bool(false)
                }
                b'n' if b[i..].starts_with(b"null") => {
                    i += 4;
                    Value::Null
                }
                _ => return Flat::Fallback,
            };
            // SAFETY: as for string values above.
            let name = unsafe { std::str::from_utf8_unchecked(&b[ks..ke]) };
            let k = key(out.len() - first, name);
            out.push((k, value));
            i = skip_ws(i);
            if i >= n {
                return Flat::Fallback;
            }
            match b[i] {
                b',' => i = skip_ws(i + 1),
                b'}' => {
                    i += 1;
                    break;
                }
                _ => return Flat::Fallback,
            }
        }
    }
    if skip_ws(i) != n {
        return Flat::Fallback;
    }
    Flat::Done
}

/// A span of the batch buffer for text at `offset` of a field that starts
/// at `base`, else an owned copy (what sonic-rs's borrowed strings give).
#[inline]
pub(super) fn string_value(base: Option<u32>, offset: usize, s: &str) -> Value {
    match base {
        Some(base) => Value::Span(Span::new(base as usize + offset, s.len())),
        None => Value::Str(s.into()),
    }
}
