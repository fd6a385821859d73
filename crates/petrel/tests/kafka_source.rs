//! The `kafka` source (aggregator role) and `exactly_once` Kafka → Kafka,
//! against a real Apache Kafka broker (KRaft, loopback) started from the
//! jars `scripts/fetch-kafka.sh` fetched from Maven Central.

mod common;
mod kafka_broker;
mod server;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kafka_broker::{create_topic, Broker};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// The broker tests run one at a time: each starts a broker (a JVM) and
/// several agents, and two of them at once on a small machine starve the
/// consumers' heartbeats, which turns a planned rebalance into a lost one.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn producer(bootstrap: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer")
}

fn record(i: usize) -> String {
    format!("rec-{i:07} payload of a log line")
}

/// Produces records `from..to` (keyed by number so they spread over the
/// partitions), `per_sec` at most when set; flushes.
fn produce(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    from: usize,
    to: usize,
    per_sec: Option<usize>,
) {
    let started = Instant::now();
    for i in from..to {
        let v = record(i);
        let k = format!("k{i}");
        let mut r = BaseRecord::to(topic).payload(&v).key(&k);
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    r = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        if let Some(rate) = per_sec {
            let due = started + Duration::from_secs_f64((i - from + 1) as f64 / rate as f64);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// The group's committed offset per partition of `topic` (-1: none).
fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            };
            (e.partition(), o)
        })
        .collect()
}

/// The high watermark of every partition of `topic`.
fn ends(bootstrap: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "petrel-test-watermarks")
        .create()
        .expect("consumer");
    (0..partitions)
        .map(|p| {
            let (_, hi) = c
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (p, hi)
        })
        .collect()
}

/// A pipeline: kafka source of `group` on `topic` → ndjson file `out`.
fn source_config(
    dir: &Path,
    name: &str,
    bootstrap: &str,
    topic: &str,
    group: &str,
    extra: &str,
    out: &Path,
) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            r#"sources:
  - type: kafka
    brokers: ["{bootstrap}"]
    topics: ["{topic}"]
    group_id: {group}
    librdkafka:
      session.timeout.ms: "6000"
      heartbeat.interval.ms: "500"
{extra}sinks:
  - type: file
    path: "{}"
    encoding: ndjson
"#,
            out.display()
        ),
    )
}

/// (partition, offset, message) of every event in the ndjson file.
fn delivered(out: &Path) -> Vec<(i64, i64, String)> {
    if !out.exists() {
        return Vec::new();
    }
    json_lines(out)
        .into_iter()
        .map(|v| {
            let p = v["kafka.partition"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("kafka.partition in {v}"));
            let o = v["kafka.offset"]
                .as_i64()
                .unwrap_or_else(|| panic!("kafka.offset in {v}"));
            (p, o, v["message"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

#[test]
fn records_become_events_with_their_metadata_and_offsets_follow_delivery() {
    let _serial = serial();
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "meta", 3);
    let p = producer(&bs);
    for i in 0..3000usize {
        let v = if i == 7 {
            "not json {".to_string()
        } else {
            format!("{{\"n\":{i},\"level\":\"info\"}}")
        };
        let k = format!("key-{i}");
        let h = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("t-1"),
        });
        let r = BaseRecord::to("meta").payload(&v).key(&k).headers(h);
        p.send(r).map_err(|(e, _)| e).expect("send");
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let cfg = source_config(
        dir.path(),
        "meta",
        &bs,
        "meta",
        "g-meta",
        "    decoding: json\n",
        &out,
    );
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_lines(&out, 3000);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3000);
    let mut seen = HashSet::new();
    for v in &lines {
        assert_eq!(v["kafka.topic"], "meta", "{v}");
        assert_eq!(v["kafka.headers"]["trace"], "t-1", "{v}");
        assert!(
            v["kafka.timestamp"]
                .as_i64()
                .is_some_and(|t| t > 1_600_000_000_000),
            "{v}"
        );
        let key = v["kafka.key"].as_str().expect("key").to_string();
        let i: usize = key
            .trim_start_matches("key-")
            .parse()
            .expect("numbered key");
        if i == 7 {
            assert_eq!(
                v["message"], "not json {",
                "an undecodable record goes on as text"
            );
            assert!(v.get("n").is_none());
        } else {
            assert_eq!(v["n"].as_u64(), Some(i as u64), "{v}");
            assert_eq!(v["level"], "info");
        }
        assert!(seen.insert(i), "record {i} twice");
    }
    let labels = component("meta", "source", "kafka_0");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[
                labels[0],
                labels[1],
                labels[2],
                ("error_type", "decode_failed")
            ]
        ),
        1.0
    );
    wait_metric(
        &agent,
        "petrel_source_rebalances_total",
        &[labels[0], labels[2], ("kind", "assign")],
        3.0,
        false,
    );
    // Every record delivered: after a clean stop the group's offsets are
    // the ends of the partitions.
    agent.stop();
    assert_eq!(committed(&bs, "g-meta", "meta", 3), ends(&bs, "meta", 3));
}

/// A memory budget that the sink frees within moments is waited for, not
/// paused on: a pause drops what librdkafka prefetched, and partitions
/// resumed after one stayed idle for ~0.6 s (Kafka into Kafka ran at a
/// third of its speed at the default limit). Every record still arrives
/// once and in order.
#[test]
fn a_memory_limit_full_for_moments_does_not_pause_the_partitions() {
    let _serial = serial();
    const N: usize = 200_000;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "tight", 3);
    let p = producer(&bs);
    produce(&p, "tight", 0, N, None);
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let cfg = source_config(dir.path(), "tight", &bs, "tight", "g-tight", "", &out);
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "2MiB".into()],
            ..AgentOptions::default()
        },
    );
    wait_lines(&out, N);
    let labels = component("tight", "source", "kafka_0");
    assert_eq!(
        agent.metric_or_zero("petrel_backpressure_pauses_total", &labels),
        0.0,
        "short waits for memory paused the partitions"
    );
    let mut next: BTreeMap<i64, i64> = BTreeMap::new();
    for (part, offset, message) in delivered(&out) {
        let want = next.entry(part).or_insert(0);
        assert_eq!(offset, *want, "partition {part}: {message}");
        *want += 1;
    }
    assert_eq!(next.values().sum::<i64>(), N as i64);
    agent.stop();
    assert_eq!(committed(&bs, "g-tight", "tight", 3), ends(&bs, "tight", 3));
}

/// Writes `chunks` chunks of 10,000 records to `topic` at `per_sec`
/// records a second from a thread; the count written so far is shared.
fn write_in_chunks(
    bs: &str,
    topic: &'static str,
    chunks: usize,
    per_sec: usize,
) -> (std::thread::JoinHandle<()>, Arc<AtomicUsize>) {
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (bs, written) = (bs.to_string(), written.clone());
        std::thread::spawn(move || {
            let p = producer(&bs);
            for chunk in 0..chunks {
                produce(
                    &p,
                    topic,
                    chunk * 10_000,
                    (chunk + 1) * 10_000,
                    Some(per_sec),
                );
                written.store((chunk + 1) * 10_000, Ordering::SeqCst);
            }
        })
    };
    (writer, written)
}

/// Starts member `i` of consumer group `group` on `topic`, writing
/// `out{i}.ndjson` in `dir`; returns the agent and that path.
fn start_member(
    dir: &Path,
    bs: &str,
    name: &str,
    topic: &str,
    group: &str,
    i: usize,
) -> (Agent, PathBuf) {
    let out = dir.join(format!("out{i}.ndjson"));
    let cfg = source_config(dir, name, bs, topic, group, "", &out);
    (Agent::start(&cfg, &dir.join(format!("data{i}"))), out)
}

/// Records are taken in batches from a queue of the source's own, to which
/// each assigned partition is forwarded; librdkafka drops that forwarding
/// when a partition is revoked. A partition taken away by a second member
/// and given back when it leaves, while records keep arriving and are
/// being consumed in batches, is read on from where it was committed:
/// every record arrives, each member sees a partition's offsets rising,
/// and the group ends committed at the partitions' ends.
#[test]
fn partitions_revoked_and_assigned_again_during_batch_consumption_are_read_on() {
    let _serial = serial();
    const N: usize = 120_000;
    const PARTS: i32 = 4;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "again", PARTS);
    let dir = tempdir();
    let (writer, written) = write_in_chunks(&bs, "again", 12, 20_000);
    let start =
        |i: usize| start_member(dir.path(), &bs, &format!("again{i}"), "again", "g-again", i);
    let (mut first, out0) = start(0);
    wait_for(
        Duration::from_secs(120),
        "the first member reading",
        || match count_lines(&out0) {
            n if n >= 10_000 => Ok(()),
            n => Err(format!("{n} lines")),
        },
    );
    let (mut second, out1) = start(1);
    wait_for(
        Duration::from_secs(120),
        "the second member reading",
        || match count_lines(&out1) {
            n if n >= 5_000 => Ok(()),
            n => Err(format!("{n} lines")),
        },
    );
    // A clean stop leaves the group: its partitions go back to the first.
    second.stop();
    let handed_back: BTreeMap<i64, i64> =
        delivered(&out1)
            .into_iter()
            .fold(BTreeMap::new(), |mut m, (p, o, _)| {
                let e = m.entry(p).or_insert(o);
                *e = (*e).max(o);
                m
            });
    assert!(
        !handed_back.is_empty(),
        "the second member was given no partition"
    );
    writer.join().expect("writer");
    assert_eq!(written.load(Ordering::SeqCst), N);
    wait_for(Duration::from_secs(180), "every record delivered", || {
        let lines = count_lines(&out0) + count_lines(&out1);
        if lines < N {
            return Err(format!("{lines} lines of {N}"));
        }
        let got: HashSet<String> = delivered(&out0)
            .into_iter()
            .chain(delivered(&out1))
            .map(|(_, _, m)| m)
            .collect();
        match got.len() {
            n if n >= N => Ok(()),
            n => Err(format!("{n} of {N} distinct")),
        }
    });
    let firsts = delivered(&out0);
    for (&part, &last) in &handed_back {
        assert!(
            firsts.iter().any(|&(p, o, _)| p == part && o > last),
            "partition {part}, handed back after offset {last}, was not read on by the first member"
        );
    }
    // Within a member, a partition's records come in offset order, each
    // once, between the hand-overs (a batch's records are not reordered
    // or repeated by the fetch queue).
    for (name, out) in [("first", &out0), ("second", &out1)] {
        let mut last: BTreeMap<i64, i64> = BTreeMap::new();
        for (p, o, m) in delivered(out) {
            if let Some(&l) = last.get(&p) {
                assert!(
                    o > l,
                    "the {name} member delivered {p}/{o} after {p}/{l}: {m}"
                );
            }
            last.insert(p, o);
        }
    }
    first.stop();
    assert_eq!(
        committed(&bs, "g-again", "again", PARTS),
        ends(&bs, "again", PARTS)
    );
}

#[test]
fn a_group_of_three_loses_nothing_when_one_is_killed_and_a_fourth_joins() {
    let _serial = serial();
    const N: usize = 240_000;
    const PARTS: i32 = 12;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "logs", PARTS);
    let dir = tempdir();
    let (writer, written) = write_in_chunks(&bs, "logs", 24, 16_000);
    let start = |i: usize| start_member(dir.path(), &bs, &format!("agg{i}"), "logs", "g-logs", i);
    let mut agents: Vec<(Agent, PathBuf)> = (0..3).map(start).collect();
    wait_for(Duration::from_secs(120), "a third of the stream", || {
        let n = written.load(Ordering::SeqCst);
        if n >= N / 3 {
            Ok(())
        } else {
            Err(format!("{n} written"))
        }
    });
    agents[0].0.kill9();
    // What the killed instance committed: anything it read at or after
    // these offsets may be read again by the next owner, nothing before.
    let at_kill = committed(&bs, "g-logs", "logs", PARTS);
    wait_for(Duration::from_secs(120), "two thirds of the stream", || {
        let n = written.load(Ordering::SeqCst);
        if n >= 2 * N / 3 {
            Ok(())
        } else {
            Err(format!("{n} written"))
        }
    });
    agents.push(start(3));
    writer.join().expect("writer");
    let all = || {
        let mut v = Vec::new();
        for (_, out) in &agents {
            v.extend(delivered(out));
        }
        v
    };
    wait_for(Duration::from_secs(180), "every record delivered", || {
        // Counting lines is cheap; parsing them all is not.
        let lines: usize = agents.iter().map(|(_, out)| count_lines(out)).sum();
        if lines < N {
            return Err(format!("{lines} lines of {N}"));
        }
        let got: HashSet<String> = all().into_iter().map(|(_, _, m)| m).collect();
        if got.len() >= N {
            Ok(())
        } else {
            Err(format!("{} of {N} distinct", got.len()))
        }
    });
    let everything = all();
    let mut count: HashMap<(i64, i64), usize> = HashMap::new();
    for (p, o, _) in &everything {
        *count.entry((*p, *o)).or_default() += 1;
    }
    // Rebalances each live instance went through, for the messages below.
    let rebalances: Vec<String> = agents
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, (a, _))| {
            let name = format!("agg{i}");
            let n = |kind| {
                a.metric_or_zero(
                    "petrel_source_rebalances_total",
                    &[("pipeline", name.as_str()), ("kind", kind)],
                )
            };
            let errors = a.metric_or_zero(
                "petrel_component_errors_total",
                &[("pipeline", name.as_str()), ("error_type", "consumer")],
            );
            format!(
                "{name}: revoke {} lost {} consumer errors {errors}",
                n("revoke"),
                n("lost")
            )
        })
        .collect();
    let killed: HashSet<(i64, i64)> = delivered(&agents[0].1)
        .into_iter()
        .map(|(p, o, _)| (p, o))
        .collect();
    // Duplicates come from uncommitted windows: mostly the killed
    // instance's, and now and then a revoked partition's whose commit
    // librdkafka refused during the cooperative rebalance (its issue
    // #4059). Never from before what was committed at the kill.
    let (mut dups, mut from_killed) = (0, 0);
    for (&(p, o), &n) in &count {
        if n > 1 {
            dups += n - 1;
            from_killed += usize::from(killed.contains(&(p, o)));
            assert_eq!(n, 2, "record {p}/{o} delivered {n} times; {rebalances:?}");
            let c = at_kill.get(&(p as i32)).copied().unwrap_or(-1);
            assert!(
                o >= c,
                "duplicate {p}/{o} was committed ({c}) before the kill; {rebalances:?}"
            );
        }
    }
    eprintln!(
        "{} events, {dups} duplicates ({from_killed} of records the killed instance delivered), none before the commits at the kill; {rebalances:?}",
        everything.len()
    );
    let fourth = delivered(&agents[3].1).len();
    assert!(fourth > 0, "the fourth instance received no partition");
    for (a, _) in agents.iter_mut().skip(1) {
        a.stop();
    }
    assert_eq!(
        committed(&bs, "g-logs", "logs", PARTS),
        ends(&bs, "logs", PARTS)
    );
}

#[test]
fn a_broker_outage_and_a_stalled_sink_pause_the_partitions_and_lose_nothing() {
    let _serial = serial();
    const N: usize = 150_000;
    let mut broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "outage", 4);
    let p = producer(&bs);
    produce(&p, "outage", 0, N / 3, None);
    let stalled = Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let dir = tempdir();
    let cfg = write_config(
        dir.path(),
        "stall",
        &format!(
            r#"sources:
  - type: kafka
    brokers: ["{bs}"]
    topics: ["outage"]
    group_id: g-outage
    librdkafka:
      session.timeout.ms: "6000"
      heartbeat.interval.ms: "500"
      max.poll.interval.ms: "15000"
sinks:
  - type: http
    url: "http://{addr}/ingest"
    encoding: ndjson
"#
        ),
    );
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "4MiB".into()],
            ..AgentOptions::default()
        },
    );
    let src = component("stall", "source", "kafka_0");
    wait_metric(
        &agent,
        "petrel_source_paused_partitions",
        &[src[0], src[2]],
        1.0,
        true,
    );
    // The counter the short-wait test expects at zero counts this pause.
    assert!(agent.metric_or_zero("petrel_backpressure_pauses_total", &src) >= 1.0);
    // Stalled for longer than max.poll.interval.ms: the source keeps
    // polling while paused, so it stays in the group.
    let mut peak = 0.0f64;
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        peak = peak.max(agent.metric_or_zero("petrel_memory_used_bytes", &[]));
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        peak <= (6 << 20) as f64,
        "memory peaked at {peak} bytes under a 4 MiB limit"
    );
    let lost = agent.metric_or_zero(
        "petrel_source_rebalances_total",
        &[src[0], src[2], ("kind", "lost")],
    );
    let revoked = agent.metric_or_zero(
        "petrel_source_rebalances_total",
        &[src[0], src[2], ("kind", "revoke")],
    );
    assert_eq!(
        (lost, revoked),
        (0.0, 0.0),
        "the source left its group during the stall"
    );
    stalled.released.store(true, Ordering::SeqCst);
    // The broker stops for 20 s in the middle of the rest of the stream.
    let more = {
        let bs = bs.clone();
        std::thread::spawn(move || produce(&producer(&bs), "outage", N / 3, 2 * N / 3, None))
    };
    more.join().unwrap();
    broker.stop();
    std::thread::sleep(Duration::from_secs(20));
    broker.restart();
    produce(&producer(&bs), "outage", 2 * N / 3, N, None);
    let messages = |s: &Stalled| -> HashSet<String> {
        let mut got = HashSet::new();
        for b in s.bodies.lock().unwrap().iter() {
            for l in b.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson");
                got.insert(v["message"].as_str().unwrap_or_default().to_string());
            }
        }
        got
    };
    wait_for(Duration::from_secs(120), "every record delivered", || {
        let n = messages(&stalled).len();
        if n >= N {
            Ok(())
        } else {
            Err(format!("{n} of {N}"))
        }
    });
    let got = messages(&stalled);
    for i in 0..N {
        assert!(got.contains(&record(i)), "record {i} missing");
    }
    agent.stop();
    assert_eq!(
        committed(&bs, "g-outage", "outage", 4),
        ends(&bs, "outage", 4)
    );
}

/// Reads `topic` with isolation.level=read_committed until `n` distinct
/// values arrived and nothing more came for a few seconds.
fn read_committed(bs: &str, topic: &str, n: usize) -> HashMap<String, usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("group.id", format!("petrel-test-rc-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let mut counts: HashMap<String, usize> = HashMap::new();
    let start = Instant::now();
    let mut last = Instant::now();
    while start.elapsed() < Duration::from_secs(180) {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                *counts.entry(v).or_default() += 1;
                last = Instant::now();
            }
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {
                if counts.len() >= n && last.elapsed() > Duration::from_secs(5) {
                    break;
                }
            }
        }
    }
    counts
}

#[test]
fn exactly_once_kafka_to_kafka_through_three_kill_9() {
    let _serial = serial();
    const N: usize = 300_000;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "eos-in", 6);
    create_topic(&bs, "eos-out", 6);
    let dir = tempdir();
    let cfg = write_config(
        dir.path(),
        "eos",
        &format!(
            r#"sources:
  - type: kafka
    brokers: ["{bs}"]
    topics: ["eos-in"]
    group_id: g-eos
    librdkafka:
      session.timeout.ms: "6000"
      heartbeat.interval.ms: "500"
sinks:
  - type: kafka
    brokers: ["{bs}"]
    topic: eos-out
    encoding: text
    exactly_once: true
"#
        ),
    );
    let data = dir.path().join("data");
    // The input arrives while the agent runs (it would otherwise finish
    // between two kills): 300,000 records over about 25 s.
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (bs, written) = (bs.clone(), written.clone());
        std::thread::spawn(move || {
            let p = producer(&bs);
            for chunk in 0..30 {
                produce(
                    &p,
                    "eos-in",
                    chunk * 10_000,
                    (chunk + 1) * 10_000,
                    Some(12_000),
                );
                written.store((chunk + 1) * 10_000, Ordering::SeqCst);
            }
        })
    };
    let sink = component("eos", "sink", "kafka_0");
    for quarter in 1..=3 {
        let mut agent = Agent::start(&cfg, &data);
        wait_for(
            Duration::from_secs(120),
            "the next quarter of the input",
            || {
                let n = written.load(Ordering::SeqCst);
                if n >= N * quarter / 4 {
                    Ok(())
                } else {
                    Err(format!("{n} written"))
                }
            },
        );
        wait_metric(
            &agent,
            "petrel_component_sent_events_total",
            &sink,
            1.0,
            true,
        );
        agent.kill9();
    }
    writer.join().expect("writer");
    let mut agent = Agent::start(&cfg, &data);
    let counts = read_committed(&bs, "eos-out", N);
    let mut missing = Vec::new();
    for i in 0..N {
        match counts.get(&record(i)) {
            None => missing.push(i),
            Some(1) => {}
            Some(n) => panic!("record {i} seen {n} times by a read_committed consumer"),
        }
    }
    assert!(
        missing.is_empty(),
        "{} records missing, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(counts.len(), N);
    agent.stop();
    assert_eq!(committed(&bs, "g-eos", "eos-in", 6), ends(&bs, "eos-in", 6));
}

#[test]
fn the_aggregator_examples_validate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/aggregator");
    let (code, out, err) = run_to_end(&dir, &["validate", "--config", "."]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 pipeline(s) valid"), "{out}{err}");
}

#[test]
fn routed_records_a_stalled_sink_holds_only_its_own_and_the_commit_waits_for_it() {
    let _serial = serial();
    const N: usize = 30_000;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    create_topic(&bs, "routed", 3);
    let p = producer(&bs);
    for i in 0..N {
        let v = format!(
            "level={} n={i:06}",
            if i % 2 == 0 { "error" } else { "info" }
        );
        let k = format!("k{i}");
        p.send(BaseRecord::to("routed").payload(&v).key(&k))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let stalled = Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let dir = tempdir();
    let errors = dir.path().join("errors.ndjson");
    let cfg = write_config(
        dir.path(),
        "routed",
        &format!(
            r#"sources:
  - type: kafka
    brokers: ["{bs}"]
    topics: ["routed"]
    group_id: g-routed
sinks:
  - type: file
    id: errors
    path: "{}"
    encoding: ndjson
    when: {{ include: {{ message: "^level=error" }} }}
  - type: http
    id: infos
    url: "http://{addr}/ingest"
    encoding: ndjson
    when: {{ include: {{ kafka.topic: "^routed$", message: "^level=info" }} }}
"#,
            errors.display()
        ),
    );
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    // The file sink gets every error record while the http sink is held.
    wait_lines(&errors, N / 2);
    assert!(delivered(&errors)
        .iter()
        .all(|(_, _, m)| m.starts_with("level=error")));
    wait_for(
        Duration::from_secs(30),
        "the http sink held by its server",
        || {
            if stalled.held.load(Ordering::SeqCst) > 0 {
                Ok(())
            } else {
                Err("no request held yet".into())
            }
        },
    );
    // Nothing is committed past the info records not yet delivered.
    std::thread::sleep(Duration::from_secs(2));
    let c = committed(&bs, "g-routed", "routed", 3);
    let e = ends(&bs, "routed", 3);
    assert!(
        c.iter().all(|(p, o)| *o < e[p]),
        "committed {c:?} of {e:?} while info records were held"
    );
    stalled.released.store(true, Ordering::SeqCst);
    wait_for(Duration::from_secs(60), "info records delivered", || {
        let n: usize = stalled
            .bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.iter().filter(|&&c| c == b'\n').count())
            .sum();
        if n >= N / 2 {
            Ok(())
        } else {
            Err(format!("{n} of {}", N / 2))
        }
    });
    agent.stop();
    assert_eq!(
        committed(&bs, "g-routed", "routed", 3),
        ends(&bs, "routed", 3)
    );
}

/// `start: earliest` means Kafka's `auto.offset.reset`: only a partition
/// without a committed offset starts at its first record. A clean restart
/// and a second instance joining the group read nothing twice, at least
/// once into a file and exactly once into Kafka (before, every start
/// re-read each partition from its beginning: a `read_committed` consumer
/// saw all 50,000 records twice after one restart). A forced replay is
/// `start: {replay: earliest}`, and `validate` warns when a sink has
/// `exactly_once` with it.
#[test]
fn start_earliest_reads_nothing_twice_after_a_clean_restart_or_a_second_instance() {
    let _serial = serial();
    const N: usize = 20_000;
    let broker = Broker::start();
    let bs = broker.bootstrap();
    let dir = tempdir();
    let p = producer(&bs);

    // At least once, into a file: a clean restart.
    create_topic(&bs, "se-in", 3);
    produce(&p, "se-in", 0, N, None);
    let out = dir.path().join("out.ndjson");
    let cfg = source_config(
        dir.path(),
        "se",
        &bs,
        "se-in",
        "g-se",
        "    start: earliest\n",
        &out,
    );
    let data = dir.path().join("data-se");
    let mut agent = Agent::start(&cfg, &data);
    wait_lines(&out, N);
    agent.stop();
    produce(&p, "se-in", N, 2 * N, None);
    let mut agent = Agent::start(&cfg, &data);
    wait_lines(&out, 2 * N);
    // Anything read twice would arrive right after the new records.
    std::thread::sleep(Duration::from_secs(3));
    agent.stop();
    let got = delivered(&out);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (_, _, m) in &got {
        *seen.entry(m.clone()).or_default() += 1;
    }
    let twice = seen.values().filter(|n| **n > 1).count();
    assert_eq!(
        twice, 0,
        "{twice} records delivered more than once after a clean restart"
    );
    assert_eq!(seen.len(), 2 * N);

    // Exactly once into Kafka: a clean restart, then a second instance
    // joining the group while records keep coming.
    create_topic(&bs, "se-eos-in", 4);
    create_topic(&bs, "se-eos-out", 4);
    let eos = |name: &str, tid: &str| {
        write_config(
            dir.path(),
            name,
            &format!(
                r#"sources:
  - type: kafka
    brokers: ["{bs}"]
    topics: ["se-eos-in"]
    group_id: g-se-eos
    start: earliest
    librdkafka:
      session.timeout.ms: "6000"
      heartbeat.interval.ms: "500"
sinks:
  - type: kafka
    brokers: ["{bs}"]
    topic: se-eos-out
    encoding: text
    exactly_once: true
    transactional_id: {tid}
"#
            ),
        )
    };
    let (cfg_a, cfg_b) = (eos("eos-a", "petrel-se-a"), eos("eos-b", "petrel-se-b"));
    let (data_a, data_b) = (dir.path().join("data-a"), dir.path().join("data-b"));
    produce(&p, "se-eos-in", 0, N, None);
    let sink_a = component("eos-a", "sink", "kafka_0");
    let mut a = Agent::start(&cfg_a, &data_a);
    wait_metric(
        &a,
        "petrel_component_sent_events_total",
        &sink_a,
        N as f64,
        true,
    );
    a.stop();
    let mut a = Agent::start(&cfg_a, &data_a);
    let mut b = Agent::start(&cfg_b, &data_b);
    produce(&p, "se-eos-in", N, 3 * N, Some(10_000));
    wait_for(LONG, "every input record committed by the group", || {
        let (c, e) = (
            committed(&bs, "g-se-eos", "se-eos-in", 4),
            ends(&bs, "se-eos-in", 4),
        );
        if c == e {
            Ok(())
        } else {
            Err(format!("committed {c:?}, ends {e:?}"))
        }
    });
    a.stop();
    b.stop();
    let counts = read_committed(&bs, "se-eos-out", 3 * N);
    let dup: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    let dups = counts.values().filter(|n| **n > 1).count();
    assert_eq!(
        dups, 0,
        "{dups} records seen more than once read_committed, e.g. {dup:?}"
    );
    let missing = (0..3 * N)
        .filter(|i| !counts.contains_key(&record(*i)))
        .count();
    assert_eq!(missing, 0, "{missing} records missing");

    // The forced replay is explicit, and validate warns about it next to
    // exactly_once.
    let replay = std::fs::read_to_string(&cfg_a)
        .unwrap()
        .replace("start: earliest", "start: {replay: earliest}");
    let replay_cfg = write_config(dir.path(), "replay", &replay);
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["validate", "--config", replay_cfg.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("warning:")
            && stdout.contains("exactly_once")
            && stdout.contains("replay.yaml:6:"),
        "{stdout}"
    );
}
