//! Throughput of the producer (seed 002's three log shapes):
//! `producer_bench ENDPOINT KIND COUNT IO_THREADS [COMPRESSION]` with KIND
//! `plain` (one ~510 B random string + time_ns), `structured` (content +
//! 10 random keys + time_ns, ~550 B) or `newstructured` (content + 10
//! random keys + a logTime field, ~540 B). One application thread sends
//! COUNT records from a pool of 8192 distinct random ones (larger than a
//! batch, so compression sees no repeats), then closes. Prints one line of
//! `key=value`: records, bytes (ndjson sent, before compression), wall
//! seconds (first send to close returning), producer CPU seconds.

use std::time::{Duration, Instant};

use petrel_producer::{Compression, Config, Producer, Record};

/// xorshift: reproducible random letters without a dependency.
struct Rng(u64);

impl Rng {
    fn letters(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                let c = (self.0 % 52) as u8;
                (if c < 26 { b'a' + c } else { b'A' + c - 26 }) as char
            })
            .collect()
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: producer_bench ENDPOINT plain|structured|newstructured COUNT IO_THREADS [lz4|zstd|gzip|none]");
        std::process::exit(2);
    }
    let kind = a[2].as_str();
    let count: u64 = a[3].parse().unwrap_or(1_000_000);
    let io: usize = a[4].parse().unwrap_or(1);
    let compression =
        Compression::parse(a.get(5).map_or("lz4", String::as_str)).unwrap_or(Compression::Lz4);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    const POOL: usize = 8192;
    let keys: Vec<String> = (1..=10).map(|i| format!("content_key_{i}")).collect();
    let pool: Vec<Vec<(String, String)>> = (0..POOL)
        .map(|i| match kind {
            "plain" => vec![("log".to_string(), rng.letters(485))],
            "structured" => {
                let mut f = vec![("content".into(), format!("sdk-log-struct-{i}"))];
                f.extend(keys.iter().map(|k| (k.clone(), rng.letters(30))));
                f
            }
            _ => {
                let mut f = vec![("content".into(), format!("sdk-log-new-struct-{i}"))];
                f.extend(keys.iter().map(|k| (k.clone(), rng.letters(28))));
                f.push((
                    "logTime".into(),
                    format!("{}", 1_645_390_242_169u64 + i as u64),
                ));
                f
            }
        })
        .collect();
    // All strings in one buffer in sending order, as an application's
    // freshly built record would be close together (separate allocations
    // made the bench mostly measure cache misses on its own pool).
    let arena: String = pool
        .iter()
        .flat_map(|f| f.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]))
        .collect();
    let mut off = 0;
    let mut take = |n: usize| {
        let s = &arena[off..off + n];
        off += n;
        s
    };
    let refs: Vec<Vec<(&str, &str)>> = pool
        .iter()
        .map(|f| {
            f.iter()
                .map(|(k, v)| (take(k.len()), take(v.len())))
                .collect()
        })
        .collect();
    let with_time = kind != "newstructured";
    let mut cfg = Config::new(a[1].clone());
    cfg.io_thread_count = io;
    cfg.compression = compression;
    let p = match Producer::new(cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut bytes = 0u64;
    for i in 0..count {
        let f = &refs[i as usize % POOL];
        let mut rec = Record::new(f);
        if with_time {
            rec = rec.time_ns(1_637_527_157_333_902_200 + i);
        }
        if let Err(e) = p.send(&rec) {
            eprintln!("send: {e}");
            std::process::exit(1);
        }
    }
    let report = p.close(Duration::from_secs(600));
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    // Bytes as sent (ndjson lines: `"k":"v",` per field, braces and
    // newline, `"time_ns":<19 digits>`), from the pool.
    for i in 0..count.min(POOL as u64) {
        let f = &pool[i as usize];
        let n: usize = f.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>()
            + 2
            + if with_time { 30 } else { 0 };
        bytes += n as u64;
    }
    bytes = bytes * count / count.min(POOL as u64);
    let c = p.counters();
    println!(
        "kind={kind} records={} failed={} undelivered={} bytes={bytes} wall_s={wall:.3} cpu_s={cpu:.3} io_threads={io} compression={compression:?}",
        c.sent, c.failed, report.undelivered_records
    );
}
