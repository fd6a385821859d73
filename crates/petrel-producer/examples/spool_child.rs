//! Sends numbered records (`n`) through a producer with a spool, for the
//! crash test: `spool_child ENDPOINT SPOOL_DIR FLUSH_AT`. After FLUSH_AT
//! records it flushes, prints `FLUSHED <FLUSH_AT>`, and sends on until
//! killed.

use std::time::Duration;

use petrel_producer::{Compression, Config, Producer, Record};

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
    loop {
        let s = n.to_string();
        if let Err(e) = p.send(&Record::new(&[
            ("n", &s),
            ("pad", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        ])) {
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
    }
}
