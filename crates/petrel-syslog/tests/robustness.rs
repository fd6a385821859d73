//! Seeded random and mutated inputs through `parse` and the framer (a
//! stable-toolchain complement to the cargo-fuzz targets in `fuzz/`): no
//! panic, every range within its input, and the framer giving the same
//! frames whatever the chunking.

mod common;

use common::{feed, whole};
use petrel_syslog::{parse, unescape_sd_value, Context, Format, Framing, Message, Range};
use petrel_time::TimeZone;

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

const SEEDS: &[&[u8]] = &[
    b"<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - \xEF\xBB\xBF'su root' failed",
    b"<165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time",
    b"<165>1 2003-10-11T22:14:15.003Z host evntslog - ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\"][examplePriority@32473 class=\"high\"] msg",
    br#"<13>1 2024-03-01T12:00:00Z h a p m [x@1 k="a\"b\\c\]d" e="\n" f=""] msg"#,
    b"<13>1 - - - - - -",
    b"<13>1 - - - - - [origin][meta sequenceId=\"1\"]",
    b"<34>Oct 11 22:14:15 mymachine su: 'su root' failed for lonvick",
    b"<34>Oct  1 22:14:15 host app[123]: msg",
    b"<13>Oct 11 22:14:15 app: msg",
    b"<189>123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: Configured from console",
    b"<187>45: Feb 28 2024 23:10:01.5 UTC: %LINK-3-UPDOWN: Interface Gi0/1",
    b"<28>Mar 14 12:00:00 router mgd[1234]: UI_COMMIT: User 'root'",
    b"<13>2024-03-01T12:00:00Z host app: msg",
    b"<13>Mar  1 18:46:11 +01:00 host app:msg",
    b"Oct 11 22:14:15 host app: msg",
    b"<13>",
    b"hello world",
    b"37 <13>1 - host app - - - first message",
    b"<14>crlf line\r\n\n<15>nul\0",
];

/// Bytes that steer the parsers and the framer into their branches.
const SPECIAL: &[u8] = b"<>[]\"\\= -:*.%/0123456789\n\r\0\xEF\xBB\xBFZT+1 ";

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(8) {
        let len = input.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            1 => {
                let i = rng.below(len + 1);
                input.insert(i, *rng.pick(SPECIAL));
            }
            2 if len > 0 => {
                let i = rng.below(len);
                let n = rng.below(len - i + 1);
                input.drain(i..i + n);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = rng.below((len - i).min(16) + 1);
                let piece = input[i..i + n].to_vec();
                let at = rng.below(input.len() + 1);
                input.splice(at..at, piece);
            }
            4 => input.truncate(rng.below(len + 1)),
            5 => {
                let other = rng.pick(SEEDS);
                let i = rng.below(other.len() + 1);
                let at = rng.below(len + 1);
                input.splice(at..at, other[i..].iter().copied());
            }
            _ => {
                let i = rng.below(len + 1);
                input.insert(i, rng.next() as u8);
            }
        }
    }
}

fn random_input(rng: &mut Rng) -> Vec<u8> {
    if rng.below(4) == 0 {
        let n = rng.below(160);
        (0..n)
            .map(|_| {
                if rng.below(3) == 0 {
                    rng.next() as u8
                } else {
                    *rng.pick(SPECIAL)
                }
            })
            .collect()
    } else {
        let mut v = rng.pick(SEEDS).to_vec();
        mutate(rng, &mut v);
        v
    }
}

fn in_bounds(r: &Range, len: usize) -> bool {
    r.start <= r.end && r.end <= len
}

fn check_message(input: &[u8], m: &Message) {
    let len = input.len();
    for r in [&m.hostname, &m.app_name, &m.proc_id, &m.msg_id]
        .into_iter()
        .flatten()
    {
        assert!(in_bounds(r, len), "{r:?} in {}", input.escape_ascii());
    }
    assert!(in_bounds(&m.message, len), "message {:?}", m.message);
    for id in &m.sd_ids {
        assert!(in_bounds(id, len));
    }
    for p in &m.sd {
        assert!(in_bounds(&p.id, len) && in_bounds(&p.name, len) && in_bounds(&p.value, len));
        let v = &input[p.value.clone()];
        let un = unescape_sd_value(v);
        assert!(un.len() <= v.len());
        assert_eq!(un.len() < v.len(), p.escaped, "{}", v.escape_ascii());
    }
    assert!(m.facility.is_none_or(|f| f <= 23));
    assert!(m.severity.is_none_or(|s| s <= 7));
}

#[test]
fn random_and_mutated_inputs_through_parse() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let zones = [
        TimeZone::Utc,
        TimeZone::Fixed(-5 * 3600),
        TimeZone::from_name("Europe/Paris").unwrap(),
    ];
    let mut m = Message::default();
    let mut ok = [0usize; 2];
    for _ in 0..200_000 {
        let input = random_input(&mut rng);
        let ctx = Context {
            tz: rng.pick(&zones).clone(),
            // Around 1970..2100, sometimes negative or extreme.
            now_ns: match rng.below(10) {
                0 => i64::MIN + rng.below(1000) as i64,
                1 => i64::MAX - rng.below(1000) as i64,
                _ => (rng.next() % 4_102_444_800) as i64 * 1_000_000_000,
            },
        };
        for format in [Format::Auto, Format::Rfc5424, Format::Rfc3164] {
            let r = parse(&input, format, &ctx, &mut m);
            ok[usize::from(r.is_ok())] += 1;
            check_message(&input, &m);
        }
    }
    // The inputs reach both outcomes.
    eprintln!("parse outcomes {ok:?}");
    assert!(ok[0] > 10_000 && ok[1] > 10_000, "{ok:?}");
}

/// A stream of valid frames of both kinds, garbage and stray terminators.
fn random_stream(rng: &mut Rng) -> Vec<u8> {
    let mut s = Vec::new();
    for _ in 0..rng.below(8) {
        let mut msg = rng.pick(SEEDS).to_vec();
        if rng.below(3) == 0 {
            mutate(rng, &mut msg);
        }
        match rng.below(5) {
            0 | 1 => {
                let len = if rng.below(8) == 0 {
                    msg.len() + rng.below(20)
                } else {
                    msg.len()
                };
                s.extend(format!("{len} ").bytes());
                s.extend(msg);
            }
            2 | 3 => {
                s.extend(msg);
                let ends: [&[u8]; 4] = [b"\n", b"\r\n", b"\0", b""];
                let end: &[u8] = ends[rng.below(ends.len())];
                s.extend_from_slice(end);
            }
            _ => s.extend(random_input(rng)),
        }
    }
    if rng.below(4) == 0 {
        mutate(rng, &mut s);
    }
    s
}

#[test]
fn random_streams_through_the_framer() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut frames = 0usize;
    for i in 0..200_000 {
        let data = if i % 2 == 0 {
            random_stream(&mut rng)
        } else {
            random_input(&mut rng)
        };
        let framing = *rng.pick(&[Framing::Auto, Framing::OctetCounting, Framing::Newline]);
        let small = rng.below(4) == 0;
        let max = 1 + rng.below(if small { 8 } else { 200 });
        let want = whole(framing, max, &data);
        frames += want.frames.len();
        let chunks: Vec<usize> = (0..1 + rng.below(8)).map(|_| rng.below(40)).collect();
        let got = feed(framing, max, &data, &chunks);
        assert_eq!(
            got,
            want,
            "{framing:?} max {max} chunks {chunks:?} data {}",
            data.escape_ascii()
        );
    }
    eprintln!("frames {frames}");
    assert!(frames > 200_000, "{frames}");
}
