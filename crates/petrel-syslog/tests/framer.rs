//! RFC 6587 framing: split invariance, oversize frames, garbage, eof.

mod common;

use common::{feed, whole, Framed};
use petrel_syslog::{Frame, Framer, Framing};

/// An octet-counted frame.
fn oc(msg: &[u8]) -> Vec<u8> {
    let mut v = format!("{} ", msg.len()).into_bytes();
    v.extend_from_slice(msg);
    v
}

fn frames(list: &[(&[u8], bool)]) -> Vec<(Vec<u8>, bool)> {
    list.iter().map(|(b, t)| (b.to_vec(), *t)).collect()
}

/// A stream mixing both framings, as `Framing::Auto` sees from a relay
/// that changed configuration, with CRLF, an empty line, a NUL terminator
/// and an unterminated tail.
fn mixed_stream() -> Vec<u8> {
    let mut s = Vec::new();
    s.extend(oc(b"<13>1 - host app - - - first message"));
    s.extend_from_slice(b"<13>Oct 11 22:14:15 host app: newline one\n");
    s.extend(oc(b"<14>1 - - - - - - with\nnewline\ninside"));
    s.extend_from_slice(b"<14>crlf line\r\n\n\r\n<15>nul terminated\0");
    s.extend(oc(b"x"));
    s.extend_from_slice(b"<16>tail without newline");
    s
}

fn mixed_expected() -> Vec<(Vec<u8>, bool)> {
    frames(&[
        (b"<13>1 - host app - - - first message", false),
        (b"<13>Oct 11 22:14:15 host app: newline one", false),
        (b"<14>1 - - - - - - with\nnewline\ninside", false),
        (b"<14>crlf line", false),
        (b"<15>nul terminated", false),
        (b"x", false),
        (b"<16>tail without newline", false),
    ])
}

#[test]
fn auto_whole_stream() {
    let got = whole(Framing::Auto, 1024, &mixed_stream());
    assert_eq!(
        got,
        Framed {
            frames: mixed_expected(),
            garbage: 0
        }
    );
}

#[test]
fn every_split_point_gives_the_same_frames() {
    let data = mixed_stream();
    let want = whole(Framing::Auto, 1024, &data);
    for i in 0..=data.len() {
        assert_eq!(feed(Framing::Auto, 1024, &data, &[i]), want, "split at {i}");
    }
    // Every pair of split points (three pieces), including the length
    // prefixes split between calls.
    for i in 0..=data.len() {
        for j in 0..=data.len() - i {
            assert_eq!(
                feed(Framing::Auto, 1024, &data, &[i, j]),
                want,
                "split at {i}, {}",
                i + j
            );
        }
    }
    // A byte at a time.
    assert_eq!(feed(Framing::Auto, 1024, &data, &[1; 4096]), want);
}

#[test]
fn octet_counting_only() {
    let mut data = oc(b"<13>one");
    data.extend(oc(b"<13>two\nlines"));
    // A trailing LF after a frame (a common sender bug) is skipped.
    data.push(b'\n');
    data.extend(oc(b"three"));
    let want = Framed {
        frames: frames(&[
            (b"<13>one", false),
            (b"<13>two\nlines", false),
            (b"three", false),
        ]),
        garbage: 0,
    };
    for i in 0..=data.len() {
        assert_eq!(
            feed(Framing::OctetCounting, 64, &data, &[i]),
            want,
            "split {i}"
        );
    }
}

#[test]
fn newline_only_treats_digits_as_text() {
    let data = b"12 not a count\n2024-01-01 line\r\n";
    assert_eq!(
        whole(Framing::Newline, 64, data).frames,
        frames(&[(b"12 not a count", false), (b"2024-01-01 line", false)])
    );
}

#[test]
fn oversize_octet_frames_are_truncated_and_skipped_across_calls() {
    let big = [b'a'; 25];
    let mut data = oc(&big);
    data.extend(oc(b"next"));
    data.extend(oc(b"0123456789"));
    data.extend(oc(b"0123456789a"));
    data.extend(oc(b"end"));
    let want = Framed {
        frames: frames(&[
            (b"aaaaaaaaaa", true),
            (b"next", false),
            (b"0123456789", false),
            (b"0123456789", true),
            (b"end", false),
        ]),
        garbage: 0,
    };
    assert_eq!(whole(Framing::OctetCounting, 10, &data), want);
    for chunk in 1..=data.len() {
        let chunks = vec![chunk; data.len()];
        assert_eq!(
            feed(Framing::OctetCounting, 10, &data, &chunks),
            want,
            "chunks of {chunk}"
        );
    }
    // A length far above the maximum: truncated once 10 bytes arrived,
    // without waiting for (or buffering) the rest.
    let mut f = Framer::new(Framing::Auto, 10);
    let mut out = Vec::new();
    let n = f.frames(b"9999999999 0123456789abc", false, &mut out);
    assert_eq!(n, 24);
    assert_eq!(
        out,
        vec![Frame {
            range: 11..21,
            truncated: true
        }]
    );
    out.clear();
    assert_eq!(f.frames(&[b'x'; 100], false, &mut out), 100);
    assert!(out.is_empty());
}

#[test]
fn oversize_newline_frames() {
    let mut data = Vec::new();
    data.extend_from_slice(&[b'a'; 30]);
    data.push(b'\n');
    data.extend_from_slice(b"klmnopqrst\r\n"); // exactly max: complete
    data.extend_from_slice(b"klmnopqrsta\n"); // max + 1
    data.extend_from_slice(b"klmnopqrst\r\r\n"); // max + 1 with the \r kept
    data.extend_from_slice(b"ok\n");
    data.extend_from_slice(&[b'b'; 15]); // unterminated oversize tail
    let want = Framed {
        frames: frames(&[
            (b"aaaaaaaaaa", true),
            (b"klmnopqrst", false),
            (b"klmnopqrst", true),
            (b"klmnopqrst", true),
            (b"ok", false),
            (b"bbbbbbbbbb", true),
        ]),
        garbage: 0,
    };
    for framing in [Framing::Newline, Framing::Auto] {
        assert_eq!(whole(framing, 10, &data), want);
        for i in 0..=data.len() {
            for j in [1, 2, 3, 7] {
                assert_eq!(
                    feed(framing, 10, &data, &[i, j, j, j, j, j]),
                    want,
                    "split {i} then {j}"
                );
            }
        }
    }
}

#[test]
fn garbage_resynchronises_at_the_next_newline() {
    // Not a number, 11 digits, a leading zero, zero, no space.
    let cases: &[(&[u8], u64)] = &[
        (b"abc def\n", 8),
        (b"12345678901 x\n", 14),
        (b"05 hello\n", 9),
        (b"0 \n", 3),
        (b"12x\n", 4),
        (b"12\0", 3),
    ];
    for &(junk, n) in cases {
        let mut data = junk.to_vec();
        data.extend(oc(b"<13>good"));
        let want = Framed {
            frames: frames(&[(b"<13>good", false)]),
            garbage: n,
        };
        for i in 0..=data.len() {
            assert_eq!(
                feed(Framing::OctetCounting, 64, &data, &[i]),
                want,
                "{} split {i}",
                junk.escape_ascii()
            );
        }
    }
    // Auto: a digit starts an octet count; a bad one is skipped to the
    // newline, and the next line frames normally.
    let data = b"12x rest\n<13>ok\n";
    assert_eq!(
        whole(Framing::Auto, 64, data),
        Framed {
            frames: frames(&[(b"<13>ok", false)]),
            garbage: 9
        }
    );
    // Garbage without a newline yet: consumed (not buffered) and counted
    // as it arrives.
    let mut f = Framer::new(Framing::OctetCounting, 64);
    let mut out = Vec::new();
    assert_eq!(f.frames(b"xyz", false, &mut out), 3);
    assert_eq!(f.frames(b"uvw\n3 abc", false, &mut out), 9);
    assert_eq!(f.garbage_bytes(), 7);
    assert_eq!(f.bad_frames(), 1, "one run of garbage, however it arrives");
    assert_eq!(
        out,
        vec![Frame {
            range: 6..9,
            truncated: false
        }]
    );
}

#[test]
fn eof() {
    // An unterminated newline tail is a frame; a lone \r is trimmed.
    assert_eq!(
        whole(Framing::Newline, 64, b"a\nb\r").frames,
        frames(&[(b"a", false), (b"b", false)])
    );
    // An incomplete octet-counted frame is delivered truncated.
    assert_eq!(
        whole(Framing::OctetCounting, 64, b"10 abc"),
        Framed {
            frames: frames(&[(b"abc", true)]),
            garbage: 0
        }
    );
    // An incomplete length prefix, or a prefix with no message, is garbage.
    assert_eq!(whole(Framing::OctetCounting, 64, b"3 abc12").garbage, 2);
    assert_eq!(whole(Framing::Auto, 64, b"3 abc12 ").garbage, 3);
    // Without eof, the same bytes wait.
    let mut f = Framer::new(Framing::Auto, 64);
    let mut out = Vec::new();
    assert_eq!(f.frames(b"3 abc12", false, &mut out), 5);
    assert_eq!(f.frames(b"12", false, &mut out), 0);
    assert_eq!(f.garbage_bytes(), 0);
    assert_eq!(f.frames(b"12", true, &mut out), 2);
    assert_eq!(f.garbage_bytes(), 2);
    assert_eq!(f.bad_frames(), 1);
    assert_eq!(out.len(), 1);
}

#[test]
fn max_zero_is_one() {
    assert_eq!(
        whole(Framing::Auto, 0, b"abc\n2 xy").frames,
        frames(&[(b"a", true), (b"x", true)])
    );
}
