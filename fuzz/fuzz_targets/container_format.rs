//! `container_format`: CRI and Docker json-file records fed to the
//! decoder the way the file reader does, in two reads with the held bytes
//! carried over. The first byte picks the merge limit, the streams kept
//! and where the input is cut; the decoder must never panic, never hold
//! more than it was given, and describe only bytes of its output.
#![no_main]

use libfuzzer_sys::fuzz_target;
use petrel_fuzz::sources::file::decode::{Decoded, LineDecoder};
use petrel_fuzz::sources::kubernetes::format::{ContainerDecoder, FormatCounters, Streams};

fn check(d: &Decoded, raw_len: usize) {
    assert!(d.held <= raw_len, "held {} of {raw_len}", d.held);
    for m in &d.msgs {
        assert!(m.start + m.len < d.out.len() + 1);
        assert_eq!(d.out[m.start + m.len], b'\n');
        assert!(m.raw_start <= raw_len);
    }
}

/// The complete lines of `buf` (up to its last newline).
fn complete(buf: &[u8]) -> usize {
    memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1)
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let max = [16usize, 100, 1 << 20][sel as usize % 3];
    let streams = Streams {
        stdout: sel & 0x10 == 0,
        stderr: sel & 0x20 == 0,
    };
    let mut dec = ContainerDecoder::new(max, streams, FormatCounters::default());
    let cut = if rest.is_empty() {
        0
    } else {
        (sel as usize * 7) % rest.len()
    };
    let mut d = Decoded::default();
    // First read: the complete lines of the first part.
    let first = &rest[..cut];
    let n = complete(first);
    dec.decode(&first[..n], 0, false, &mut d);
    check(&d, n);
    // Second read: what was held, then the rest, as the reader carries it.
    let held = d.held;
    let second = &rest[held..];
    let m = complete(second);
    dec.decode(&second[..m], held as u64, false, &mut d);
    check(&d, m);
    // End of file: everything goes out.
    let last = &rest[held + d.held..];
    let mut tail = last.to_vec();
    if tail.last() != Some(&b'\n') {
        tail.push(b'\n');
    }
    dec.decode(&tail, (held + d.held) as u64, true, &mut d);
    check(&d, tail.len());
    assert_eq!(d.held, tail.len(), "a flush holds nothing");
});
