//! A quick timing of the parser and the framer (no timing assertions
//! anywhere in the tests; this only prints).
//!
//! ```text
//! cargo run -p petrel-syslog --release --example bench
//! ```

use std::hint::black_box;
use std::time::Instant;

use petrel_syslog::{parse, Context, Format, Frame, Framer, Framing, Message};
use petrel_time::TimeZone;

/// Runs `f` `n` times and returns the ns per call (best of 5 rounds, so a
/// busy neighbour on a shared machine skews it less).
fn time(n: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

fn bench_parse(name: &str, line: &[u8], ctx: &Context) {
    let mut m = Message::default();
    parse(line, Format::Auto, ctx, &mut m).expect("sample parses");
    let ns = time(1_000_000, || {
        let r = parse(black_box(line), Format::Auto, ctx, &mut m);
        black_box((&r, &m));
    });
    println!(
        "parse {name:<28} {:>4} bytes {ns:>7.1} ns/message",
        line.len()
    );
}

fn bench_framer(name: &str, framing: Framing, data: &[u8], frames_per_buf: usize) {
    let mut out: Vec<Frame> = Vec::with_capacity(frames_per_buf + 1);
    let ns = time(200, || {
        let mut f = Framer::new(framing, 64 * 1024);
        out.clear();
        let n = f.frames(black_box(data), false, &mut out);
        black_box((n, &out));
    });
    assert_eq!(out.len(), frames_per_buf);
    let gbps = data.len() as f64 / ns;
    println!(
        "frame {name:<28} {:>7.1} ns/frame {gbps:>6.2} GB/s",
        ns / frames_per_buf as f64
    );
}

fn main() {
    let ctx = Context::now(TimeZone::Utc);
    let typical: &[u8] = b"<165>1 2024-03-01T12:00:00.123456Z web-01.example.com nginx 12345 access - GET /api/v1/items?id=42&page=2 HTTP/1.1 200 1532 \"-\" \"curl/8.5.0\"";
    bench_parse("rfc5424 typical", typical, &ctx);
    bench_parse(
        "rfc5424 with SD",
        b"<165>1 2024-03-01T12:00:00.123Z host app 42 ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"] An application event",
        &ctx,
    );
    bench_parse(
        "rfc3164",
        b"<34>Oct 11 22:14:15 mymachine sshd[4321]: Accepted publickey for alice from 192.0.2.10 port 52144 ssh2: ED25519 SHA256:abc",
        &ctx,
    );
    let paris = Context::now(TimeZone::from_name("Europe/Paris").expect("zone"));
    bench_parse(
        "rfc3164 Europe/Paris",
        b"<34>Oct 11 22:14:15 mymachine sshd[4321]: Accepted publickey for alice from 192.0.2.10 port 52144 ssh2: ED25519 SHA256:abc",
        &paris,
    );

    // 140-byte frames, 4 MiB-ish buffers.
    let msg = {
        let mut m = typical.to_vec();
        m.resize(139, b'x');
        m
    };
    let count = 30_000;
    let mut lines = Vec::new();
    let mut counted = Vec::new();
    for _ in 0..count {
        lines.extend_from_slice(&msg);
        lines.push(b'\n');
        counted.extend_from_slice(format!("{} ", msg.len() + 1).as_bytes());
        counted.extend_from_slice(&msg);
        counted.push(b'\n');
    }
    bench_framer("newline 140 B", Framing::Newline, &lines, count);
    bench_framer("auto (newline) 140 B", Framing::Auto, &lines, count);
    bench_framer(
        "octet counting 140 B",
        Framing::OctetCounting,
        &counted,
        count,
    );
    bench_framer("auto (octet) 140 B", Framing::Auto, &counted, count);
}
