//! A 503 with `Retry-After` (what Petrel's HTTP source answers when its
//! buffer is full) delays the retry at least that long, even when the
//! backoff is shorter; refusals for good are not retried.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use petrel_producer::{Compression, Config, Outcome, Producer, Record};

/// Answers each request with the next of `answers`, reporting when each
/// request arrived.
fn fake_agent(answers: Vec<&'static str>) -> (u16, mpsc::Receiver<Instant>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut answers = answers.into_iter();
        for conn in l.incoming() {
            let Ok(s) = conn else { return };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            loop {
                let mut len = 0;
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                if line != "\r\n" {
                    break; // the client closed the connection
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                let _ = tx.send(Instant::now());
                let Some(a) = answers.next() else { return };
                w.write_all(a.as_bytes()).unwrap();
            }
        }
    });
    (port, rx)
}

fn producer(port: u16) -> Producer {
    let mut cfg = Config::new(format!("http://127.0.0.1:{port}/ingest"));
    cfg.linger_ms = 10;
    cfg.base_retry_backoff_ms = 10;
    cfg.max_retry_backoff_ms = 20;
    cfg.compression = Compression::None;
    Producer::new(cfg).unwrap()
}

#[test]
fn retry_after_is_honoured() {
    let (port, arrivals) = fake_agent(vec![
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nfull",
        "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"accepted\":1}",
    ]);
    let p = producer(port);
    let f = p.send_future(&Record::new(&[("k", "v")])).unwrap();
    assert_eq!(
        f.wait_timeout(Duration::from_secs(60)),
        Some(Outcome::Delivered { attempts: 2 })
    );
    let first = arrivals.recv().unwrap();
    let second = arrivals.recv().unwrap();
    // The backoff alone would retry after 10 ms.
    assert!(
        second - first >= Duration::from_millis(950),
        "retried after {:?}",
        second - first
    );
    assert_eq!(p.counters().retried, 1);
    p.close(Duration::from_secs(10));
}

#[test]
fn a_refusal_for_good_is_not_retried() {
    let (port, _arrivals) = fake_agent(vec![
        "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\n\r\ntoo large",
    ]);
    let p = producer(port);
    let f = p.send_future(&Record::new(&[("k", "v")])).unwrap();
    match f.wait_timeout(Duration::from_secs(60)) {
        Some(Outcome::Failed { reason, attempts }) => {
            assert_eq!(attempts, 1);
            assert!(
                reason.contains("413") && reason.contains("too large"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let c = p.counters();
    assert_eq!((c.failed, c.retried, c.sent), (1, 0, 0));
    p.close(Duration::from_secs(1));
}
