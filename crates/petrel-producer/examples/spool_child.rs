//! Sends numbered records (`n`) through a producer with a spool, for the
//! crash test: `spool_child ENDPOINT SPOOL_DIR FLUSH_AT`. After FLUSH_AT
//! records it flushes and prints `FLUSHED <FLUSH_AT>`; then it sends
//! FLUSH_AT more, slowly, printing `S <n>` for each record reported
//! spooled, and waits to be killed.

use std::time::Duration;

use std::io::Write;

use petrel_producer::{Compression, Config, Outcome, Producer, Record};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: spool_child ENDPOINT SPOOL_DIR FLUSH_AT");
        std::process::exit(2);
    }
    let flush_at: u64 = args[3].parse().unwrap_or(10_000);
    let mut cfg = Config::new(args[1].clone());
    cfg.spool_dir = Some(args[2].clone().into());
    cfg.linger_ms = 20;
    cfg.batch_count_threshold = 1000;
    cfg.total_size_in_bytes = 1 << 20;
    cfg.compression = Compression::Zstd;
    let p = match Producer::new(cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut n = 0u64;
    while n < 2 * flush_at {
        let s = n.to_string();
        let fields = [
            ("n", s.as_str()),
            ("pad", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        ];
        let rec = Record::new(&fields);
        let sent = if n < flush_at {
            p.send(&rec)
        } else {
            let me = n;
            p.send_with_callback(&rec, move |o| {
                if matches!(o, Outcome::Spooled { .. }) {
                    // Printed only once durable: the test holds us to it.
                    let _ = writeln!(std::io::stdout().lock(), "S {me}");
                }
            })
        };
        if let Err(e) = sent {
            eprintln!("send {n}: {e}");
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        n += 1;
        if n == flush_at {
            if !p.flush(Duration::from_secs(60)) {
                eprintln!("flush timed out");
                std::process::exit(1);
            }
            println!("FLUSHED {n}");
        }
        if n > flush_at && n.is_multiple_of(20) {
            // Spread the rest over about a second: the kill lands mid-stream.
            std::thread::sleep(Duration::from_micros(1000));
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
