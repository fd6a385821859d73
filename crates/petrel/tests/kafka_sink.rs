//! End-to-end tests of the Kafka sink against a real Apache Kafka broker
//! (KRaft, single node, loopback) started by the test from the jars that
//! `scripts/fetch-kafka.sh` fetched from Maven Central.

mod common;
mod kafka_broker;
mod server;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kafka_broker::{consume, create_topic, value_counts, Broker};

fn numbered_line(i: usize) -> String {
    format!("line-{i:07} the quick brown fox jumps over the lazy dog\n")
}

fn kafka_config(include: &str, bootstrap: &str, topic: &str, extra: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{include}\"]\n    read_from: beginning\n\
         sinks:\n  - type: kafka\n    brokers: [\"{bootstrap}\"]\n    topic: \"{topic}\"\n{extra}"
    )
}

/// Every `line-NNNNNNN` number 0..n among the consumed values; panics with
/// the missing ones. Returns the number of duplicates.
fn assert_all_numbers(counts: &HashMap<Vec<u8>, usize>, n: usize) -> usize {
    let mut missing = Vec::new();
    for i in 0..n {
        let l = numbered_line(i);
        if !counts.contains_key(l.trim_end().as_bytes()) {
            missing.push(i);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {n} lines missing in Kafka, first: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    counts.values().map(|c| c - 1).sum()
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// 1,000,000 lines written while the file is rotated by rename four times
/// all reach the topic.
#[test]
fn million_lines_across_rotations() {
    const N: usize = 1_000_000;
    let broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let cfg = write_config(
        dir.path(),
        "million",
        &kafka_config(
            &app.display().to_string(),
            &broker.bootstrap(),
            "million",
            "    compression: lz4\n",
        ),
    );
    std::fs::File::create(&app).unwrap();
    // Created up front with every partition led, so that the partition
    // assertion below is about the sink's round robin and not about how
    // soon an auto-created topic elects its leaders (CI once finished the
    // whole run while one of three was still leaderless).
    create_topic(&broker.bootstrap(), "million", 3);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    // The writer renames the file four times within a second or two; a
    // file renamed out of the `include` pattern before the agent first
    // opened it is not the agent's to read (CI once lost the race on a
    // loaded machine), so the stream starts once the agent holds it.
    wait_metric(
        &agent,
        "petrel_files_open",
        &[("pipeline", "million")],
        1.0,
        false,
    );
    let writer = {
        let app = app.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&app).unwrap();
            let mut chunk = String::new();
            for i in 0..N {
                chunk.push_str(&numbered_line(i));
                if (i + 1) % 5000 == 0 {
                    f.write_all(chunk.as_bytes()).unwrap();
                    chunk.clear();
                }
                if (i + 1) % 200_000 == 0 && i + 1 < N {
                    let rotated = app.with_extension(format!("log.{}", (i + 1) / 200_000));
                    std::fs::rename(&app, &rotated).unwrap();
                    f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&app)
                        .unwrap();
                }
            }
            f.write_all(chunk.as_bytes()).unwrap();
        })
    };
    writer.join().unwrap();
    let msgs = consume(
        &broker.bootstrap(),
        &["million"],
        N,
        Duration::from_secs(3),
        Duration::from_secs(300),
    );
    let counts = value_counts(&msgs);
    let dups = assert_all_numbers(&counts, N);
    eprintln!("million: {} messages, {dups} duplicates", msgs.len());
    assert_eq!(
        dups, 0,
        "no restart or failure happened, so no duplicates are expected"
    );
    // Key-less batches go to the partitions in turn (the broker creates
    // topics with 3).
    let mut per_partition: HashMap<i32, usize> = HashMap::new();
    for m in &msgs {
        *per_partition.entry(m.partition).or_default() += 1;
    }
    assert_eq!(
        per_partition.len(),
        3,
        "key-less messages use every partition: {per_partition:?}"
    );
}

/// The broker is stopped for 30 s in the middle of the stream: the agent
/// backs up within its memory limit and delivers everything once the broker
/// is back.
#[test]
fn broker_outage_loses_nothing() {
    const N: usize = 300_000;
    const LIMIT: u64 = 32 << 20;
    let mut broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let cfg = write_config(
        dir.path(),
        "outage",
        &kafka_config(
            &app.display().to_string(),
            &broker.bootstrap(),
            "outage",
            "",
        ),
    );
    std::fs::File::create(&app).unwrap();
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), LIMIT.to_string()],
            ..AgentOptions::default()
        },
    );
    let baseline_rss = rss_bytes(agent.pid());
    let writer = {
        let app = app.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&app).unwrap();
            // About 50 s of writing at 6,000 lines/s, so the outage falls
            // in the middle of the stream.
            for block in 0..(N / 3000) {
                let mut chunk = String::new();
                for i in block * 3000..(block + 1) * 3000 {
                    chunk.push_str(&numbered_line(i));
                }
                f.write_all(chunk.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let sink = component("outage", "sink", "kafka_0");
    wait_for(LONG, "first deliveries", || {
        match agent.metric_or_zero("petrel_component_sent_events_total", &sink) {
            n if n > 10_000.0 => Ok(()),
            n => Err(format!("{n} delivered")),
        }
    });
    broker.stop();
    let down = Instant::now();
    let mut peak = 0;
    let mut window = f64::MAX;
    while down.elapsed() < Duration::from_secs(30) {
        peak = peak.max(rss_bytes(agent.pid()));
        window = window.min(agent.metric_or_zero("petrel_component_window_batches", &sink));
        std::thread::sleep(Duration::from_millis(250));
    }
    broker.restart();
    writer.join().unwrap();
    let msgs = consume(
        &broker.bootstrap(),
        &["outage"],
        N,
        Duration::from_secs(5),
        Duration::from_secs(240),
    );
    let counts = value_counts(&msgs);
    let dups = assert_all_numbers(&counts, N);
    let retried = agent.metric_or_zero("petrel_component_retried_events_total", &sink);
    eprintln!(
        "outage: {} messages, {dups} duplicates, {retried} retried, smallest window during the outage {window}, RSS baseline {} MiB peak {} MiB",
        msgs.len(),
        baseline_rss >> 20,
        peak >> 20
    );
    assert!(
        window <= 2.0,
        "the congestion window should have shrunk during the outage, was {window}"
    );
    // In-flight data is bounded by the limit; librdkafka holds a copy of
    // what is in flight, so the growth stays under twice the limit.
    assert!(
        peak < baseline_rss + 2 * LIMIT + (16 << 20),
        "RSS grew from {baseline_rss} to {peak} with a {LIMIT} byte memory limit"
    );
}

/// `kill -9` of the agent in the middle of the stream, then a restart:
/// nothing is lost, and the duplicates stay within the documented bound:
/// what was delivered since the last checkpoint write (one interval, 1 s,
/// of delivery; measured here just before the kill) plus what was in
/// flight (at most `--memory-limit`).
#[test]
fn kill9_agent_then_restart_loses_nothing() {
    const N: usize = 400_000;
    let broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let data = dir.path().join("data");
    // The agent delivers a few hundred thousand lines per second, faster
    // than this test can look: a writer appends the stream in paced chunks
    // and holds back the last part until the kill, so the kill always lands
    // in the middle of the stream whatever the machine's speed.
    const HELD_BACK: usize = 100_000;
    std::fs::write(&app, "").unwrap();
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let app = app.clone();
        let killed = killed.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&app).unwrap();
            let mut next = 0;
            while next < N {
                if next >= N - HELD_BACK && !killed.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let end = (next + 5_000).min(N);
                let chunk: String = (next..end).map(numbered_line).collect();
                f.write_all(chunk.as_bytes()).unwrap();
                next = end;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let cfg = write_config(
        dir.path(),
        "crash",
        &kafka_config(&app.display().to_string(), &broker.bootstrap(), "crash", ""),
    );
    let sink = component("crash", "sink", "kafka_0");
    const MEMORY_LIMIT: usize = 2 << 20;
    let opts = || AgentOptions {
        args: vec!["--memory-limit".into(), MEMORY_LIMIT.to_string()],
        ..Default::default()
    };
    let mut agent = Agent::start_with(&cfg, &data, opts());
    wait_for(LONG, "a part of the stream delivered", || {
        match agent.metric_or_zero("petrel_component_sent_events_total", &sink) {
            n if n >= 50_000.0 => Ok(()),
            n => Err(format!("{n} delivered")),
        }
    });
    let before = agent.metric_or_zero("petrel_component_sent_events_total", &sink);
    // The delivery rate just before the kill, over a short window so that
    // the kill lands in the middle of the stream.
    std::thread::sleep(Duration::from_millis(250));
    let at_kill = agent.metric_or_zero("petrel_component_sent_events_total", &sink);
    agent.kill9();
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    let per_second = ((at_kill - before).max(0.0) * 4.0) as usize;
    eprintln!("kill -9 at {at_kill} delivered of {N}, {per_second} per second");
    assert!(
        (at_kill as usize) <= N - HELD_BACK,
        "more was delivered than was written before the kill"
    );
    let _agent = Agent::start_with(&cfg, &data, opts());
    writer.join().unwrap();
    let msgs = consume(
        &broker.bootstrap(),
        &["crash"],
        N,
        Duration::from_secs(5),
        Duration::from_secs(240),
    );
    let counts = value_counts(&msgs);
    let dups = assert_all_numbers(&counts, N);
    eprintln!(
        "kill -9: {} messages for {N} lines, {dups} duplicates",
        msgs.len()
    );
    let line_len = numbered_line(N / 2).len();
    let bound = 2 * per_second + MEMORY_LIMIT / line_len;
    assert!(
        dups <= bound,
        "{dups} duplicates exceed the bound of {bound} (1 s of delivery at {per_second}/s, twice for jitter, plus --memory-limit in flight)"
    );
}

fn write_levels(path: &Path, n: usize) -> Vec<String> {
    let levels = ["info", "warn", "error", "debug"];
    let mut lines = Vec::new();
    let mut text = String::new();
    for i in 0..n {
        let l = format!("level={} pid={} seq={i}", levels[i % 4], 100 + i % 7);
        text.push_str(&l);
        text.push('\n');
        lines.push(l);
    }
    // A line without level goes to the fallback topic, and so does one
    // whose level makes an invalid topic name (longer than 249 bytes).
    text.push_str("no level here\n");
    text.push_str(&format!("level={} pid=999 seq=-1\n", "x".repeat(250)));
    std::fs::write(path, text).unwrap();
    lines
}

/// Topic templates route by field, keys keep a key's messages in one
/// partition, events without the field or whose topic would be an invalid
/// name go to the fallback topic (counted), and the rest flows.
#[test]
fn topic_template_keys_and_fallback() {
    topic_template_keys_and_fallback_with("");
}

/// The same through a disk buffer: each record's topic and key are
/// written with the payload and read back.
#[test]
fn topic_template_keys_and_fallback_through_a_disk_buffer() {
    topic_template_keys_and_fallback_with("    buffer: { type: disk, max_size: 64MiB }\n");
}

fn topic_template_keys_and_fallback_with(buffer: &str) {
    let broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("levels.log");
    let lines = write_levels(&app, 2000);
    let cfg = write_config(
        dir.path(),
        "tpl",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n\
             processors:\n  - type: parse_regex\n    pattern: 'level=(?P<level>\\w+) pid=(?P<pid>\\d+)'\n\
             sinks:\n  - type: kafka\n    brokers: [\"{}\"]\n    topic: \"tpl-{{{{ level }}}}\"\n    fallback_topic: tpl-fallback\n    key_field: pid\n    encoding: text\n{buffer}",
            app.display(),
            broker.bootstrap()
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let topics = [
        "tpl-info",
        "tpl-warn",
        "tpl-error",
        "tpl-debug",
        "tpl-fallback",
    ];
    let mut msgs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while msgs.len() < 2002 && Instant::now() < deadline {
        msgs = topics
            .iter()
            .flat_map(|t| {
                consume(
                    &broker.bootstrap(),
                    &[t],
                    1,
                    Duration::from_secs(2),
                    Duration::from_secs(20),
                )
                .into_iter()
                .map(move |m| (t.to_string(), m))
            })
            .collect();
    }
    assert_eq!(msgs.len(), 2002, "every event delivered once");
    if !buffer.is_empty() {
        assert_eq!(
            agent.metric_or_zero("petrel_component_buffer_max_bytes", &[("pipeline", "tpl")]),
            (64u64 << 20) as f64,
            "the payloads went through the disk buffer"
        );
    }
    let mut key_parts: HashMap<Vec<u8>, HashSet<i32>> = HashMap::new();
    for (topic, m) in &msgs {
        let v = String::from_utf8_lossy(&m.value).to_string();
        if topic == "tpl-fallback" {
            match v.as_str() {
                "no level here" => assert!(m.key.is_none(), "no pid, no key"),
                v if v.ends_with(" pid=999 seq=-1") => {
                    assert_eq!(m.key.as_deref(), Some(&b"999"[..]))
                }
                other => panic!("unexpected in the fallback topic: {other}"),
            }
            continue;
        }
        let level = topic.trim_start_matches("tpl-");
        assert!(v.starts_with(&format!("level={level} ")), "{v} in {topic}");
        let key = m.key.clone().expect("keyed by pid");
        assert!(v.contains(&format!("pid={} ", String::from_utf8_lossy(&key))));
        key_parts.entry(key).or_default().insert(m.partition);
    }
    assert_eq!(key_parts.len(), 7, "seven pids");
    for (k, parts) in &key_parts {
        assert_eq!(
            parts.len(),
            1,
            "key {:?} spread over partitions {parts:?}",
            String::from_utf8_lossy(k)
        );
    }
    let values: HashSet<String> = msgs
        .iter()
        .map(|(_, m)| String::from_utf8_lossy(&m.value).to_string())
        .collect();
    assert!(lines.iter().all(|l| values.contains(l)));
    let fallback = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[
            ("pipeline", "tpl"),
            ("component_kind", "sink"),
            ("error_type", "topic_field_missing"),
        ],
    );
    assert_eq!(fallback, 1.0, "the event without level is counted");
    let invalid = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[
            ("pipeline", "tpl"),
            ("component_kind", "sink"),
            ("error_type", "invalid_topic"),
        ],
    );
    assert_eq!(
        invalid, 1.0,
        "the event with an invalid topic name is counted"
    );
}

/// Every compression codec delivers (one pipeline per codec, all in one
/// agent, reading the same file).
#[test]
fn every_compression_codec() {
    const N: usize = 5000;
    let broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("codec.log");
    let all: String = (0..N).map(numbered_line).collect();
    std::fs::write(&app, all).unwrap();
    let conf_dir = dir.path().join("pipelines");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
    for c in codecs {
        write_config(
            &conf_dir,
            c,
            &kafka_config(
                &app.display().to_string(),
                &broker.bootstrap(),
                &format!("codec-{c}"),
                &format!("    compression: {c}\n    encoding: ndjson\n"),
            ),
        );
    }
    let _agent = Agent::start(&conf_dir, &dir.path().join("data"));
    for c in codecs {
        let topic = format!("codec-{c}");
        let msgs = consume(
            &broker.bootstrap(),
            &[&topic],
            N,
            Duration::from_secs(2),
            Duration::from_secs(120),
        );
        let mut seen = HashSet::new();
        for m in &msgs {
            let v: serde_json::Value = serde_json::from_slice(&m.value).expect("ndjson record");
            seen.insert(v["message"].as_str().expect("message").to_string());
            assert_eq!(v["file"].as_str(), Some(app.to_str().unwrap()));
        }
        assert_eq!(seen.len(), N, "codec {c}: {} distinct of {N}", seen.len());
    }
}

/// Events larger than Kafka accepts are counted as discarded, with an error
/// naming the limit; the others are delivered, and the file is committed to
/// its end (an oversized event does not hold the pipeline back).
#[test]
fn oversized_messages_are_counted_not_stuck() {
    const N: usize = 300;
    let broker = Broker::start();
    let dir = tempdir();
    let app = dir.path().join("big.log");
    let mut text = String::new();
    let mut small = Vec::new();
    let mut big = 0;
    for i in 0..N {
        if i % 30 == 29 {
            text.push_str(&"x".repeat(5000));
            text.push('\n');
            big += 1;
        } else {
            text.push_str(&numbered_line(i));
            small.push(i);
        }
    }
    std::fs::write(&app, &text).unwrap();
    let size = text.len() as u64;
    let cfg = write_config(
        dir.path(),
        "big",
        &kafka_config(
            &app.display().to_string(),
            &broker.bootstrap(),
            "big",
            // librdkafka refuses messages above its own limit before
            // sending, as the broker would above its own.
            "    librdkafka: { message.max.bytes: \"2000\" }\n",
        ),
    );
    let data = dir.path().join("data");
    let agent = Agent::start(&cfg, &data);
    let msgs = consume(
        &broker.bootstrap(),
        &["big"],
        small.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    );
    let counts = value_counts(&msgs);
    for i in &small {
        let l = numbered_line(*i);
        assert!(
            counts.contains_key(l.trim_end().as_bytes()),
            "line {i} delivered"
        );
    }
    assert!(
        msgs.iter().all(|m| m.value.len() < 2000),
        "no oversized message reached the topic"
    );
    wait_for(
        MEDIUM,
        "the file committed to its end",
        || match checkpoint_offset(&data, &app) {
            Some(o) if o == size => Ok(()),
            o => Err(format!("committed {o:?} of {size}")),
        },
    );
    let discarded = agent.metric_or_zero(
        "petrel_component_discarded_events_total",
        &[("reason", "message_too_large")],
    );
    assert_eq!(discarded, big as f64, "oversized events counted");
    assert!(
        agent.stderr().contains("message.max.bytes"),
        "the error names the limit"
    );
}

/// Messages in `ndjson` hold what the sink's output selects: what a
/// processor removed is absent, a renamed field is there under its new
/// name, `except_fields` leaves out what it names, and the time is
/// written as asked.
#[test]
fn ndjson_messages_without_removed_or_excluded_fields() {
    let broker = Broker::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let mut text = String::new();
    for i in 0..50 {
        text.push_str(&format!("{{\"n\":{i},\"t\":1700000000}}\n"));
    }
    append(&log, text.as_bytes());
    create_topic(&broker.bootstrap(), "fields", 1);
    let cfg = kafka_config(
        &log.display().to_string(),
        &broker.bootstrap(),
        "fields",
        "    encoding: ndjson\n    except_fields: [message, t]\n    timestamp_format: unix\n",
    )
    .replace(
        "sinks:\n",
        "processors:\n  - type: parse_json\n  - type: parse_timestamp\n    field: t\n  - type: fields\n    remove: [host]\n    rename: { file: path }\nsinks:\n",
    );
    let cfg = write_config(dir.path(), "kf", &cfg);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    let msgs = consume(
        &broker.bootstrap(),
        &["fields"],
        50,
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    assert_eq!(msgs.len(), 50);
    let path = log.display().to_string();
    let mut ns = Vec::new();
    for m in &msgs {
        let v: serde_json::Value = serde_json::from_slice(&m.value).expect("JSON");
        let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["n", "path", "timestamp"], "{v}");
        assert_eq!(v["path"], path.as_str(), "{v}");
        assert_eq!(v["timestamp"], 1_700_000_000i64, "{v}");
        ns.push(v["n"].as_u64().unwrap());
    }
    ns.sort_unstable();
    assert_eq!(ns, (0..50).collect::<Vec<u64>>());
}

/// `headers:` sets message headers from the event's fields (templates);
/// a header whose field is missing is left out and counted, the message
/// is sent.
#[test]
fn headers_from_fields() {
    let broker = Broker::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(
        &log,
        b"{\"trace\":\"t-1\",\"n\":\"1\"}\n{\"n\":\"2\"}\n{\"trace\":\"t-3\",\"n\":\"3\"}\n",
    );
    create_topic(&broker.bootstrap(), "headers", 1);
    let cfg = kafka_config(
        &log.display().to_string(),
        &broker.bootstrap(),
        "headers",
        "    key_field: n\n    headers: { trace_id: \"{{ trace }}\", source: \"petrel-{{ n }}\" }\n",
    )
    .replace("sinks:\n", "processors:\n  - type: parse_json\nsinks:\n");
    let cfg = write_config(dir.path(), "hd", &cfg);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let mut msgs = consume(
        &broker.bootstrap(),
        &["headers"],
        3,
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    msgs.sort_by(|a, b| a.key.cmp(&b.key));
    type Headers = Vec<(String, Vec<u8>)>;
    let got: Vec<(Option<Vec<u8>>, Headers)> =
        msgs.into_iter().map(|m| (m.key, m.headers)).collect();
    let h = |k: &str, v: &str| (k.to_string(), v.as_bytes().to_vec());
    assert_eq!(
        got,
        vec![
            (
                Some(b"1".to_vec()),
                vec![h("trace_id", "t-1"), h("source", "petrel-1")]
            ),
            (Some(b"2".to_vec()), vec![h("source", "petrel-2")]),
            (
                Some(b"3".to_vec()),
                vec![h("trace_id", "t-3"), h("source", "petrel-3")]
            ),
        ]
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("pipeline", "hd"), ("error_type", "template_field_missing")]
        ),
        1.0
    );
}
