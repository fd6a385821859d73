//! A real Apache Kafka broker (KRaft, single node) on 127.0.0.1 for the
//! tests, run from the jars `scripts/fetch-kafka.sh` puts in
//! `.cache/kafka/lib`, plus a consumer that reads topics back.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

use super::server::{free_port, ServerProcess};

/// A running (or stopped) broker with its own data directory.
pub struct Broker {
    server: ServerProcess,
    props: PathBuf,
    /// Client port.
    pub port: u16,
}

fn java_cp() -> String {
    let lib = super::server::cached_entry("kafka", "scripts/fetch-kafka.sh").join("lib");
    format!("{}/*", lib.display())
}

impl Broker {
    /// Formats storage and starts a broker on free loopback ports; waits
    /// until it serves metadata.
    pub fn start() -> Broker {
        let server = ServerProcess::new("kafka broker", "petrel-kafka-", "broker.log");
        let dir = server.dir().to_path_buf();
        let port = free_port();
        let ctrl = free_port();
        let props = dir.join("server.properties");
        std::fs::write(
            &props,
            format!(
                "process.roles=broker,controller\n\
                 node.id=1\n\
                 controller.quorum.voters=1@127.0.0.1:{ctrl}\n\
                 listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctrl}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 controller.listener.names=CONTROLLER\n\
                 listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
                 log.dirs={}\n\
                 num.partitions=3\n\
                 auto.create.topics.enable=true\n\
                 offsets.topic.replication.factor=1\n\
                 transaction.state.log.replication.factor=1\n\
                 transaction.state.log.min.isr=1\n\
                 group.initial.rebalance.delay.ms=0\n\
                 log.flush.interval.messages=9223372036854775807\n",
                dir.join("data").display()
            ),
        )
        .expect("write server.properties");
        // The JVM tool fails now and then on a loaded machine (seen once in
        // many runs, before it printed anything): try it up to three times,
        // and show what it said if it never succeeds.
        let mut last = String::new();
        let mut formatted = false;
        for _ in 0..3 {
            let out = Command::new("java")
                .args(["-cp", &java_cp(), "kafka.tools.StorageTool", "format", "-t"])
                .arg("petrel-test-cluster-0001")
                .arg("-c")
                .arg(&props)
                .stdin(Stdio::null())
                .output()
                .expect("run kafka StorageTool");
            if out.status.success() {
                formatted = true;
                break;
            }
            last = format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = std::fs::remove_dir_all(dir.join("data"));
        }
        assert!(formatted, "kafka storage format failed three times: {last}");
        let mut b = Broker {
            server,
            props,
            port,
        };
        b.restart();
        b
    }

    /// `host:port` for clients.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker process again (after [`Broker::stop`]).
    pub fn restart(&mut self) {
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xms256m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-cp",
            &java_cp(),
            "kafka.Kafka",
        ])
        .arg(&self.props);
        let bootstrap = self.bootstrap();
        self.server.start(
            cmd,
            Duration::from_secs(90),
            Duration::from_millis(250),
            || {
                let c: Result<BaseConsumer, _> = ClientConfig::new()
                    .set("bootstrap.servers", &bootstrap)
                    .set("group.id", "petrel-probe")
                    .create();
                c.ok()
                    .and_then(|c| c.fetch_metadata(None, Duration::from_secs(2)).ok())
                    .is_some_and(|md| !md.brokers().is_empty())
            },
        );
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 30 s).
    pub fn stop(&mut self) {
        self.server.stop(Duration::from_secs(30));
    }

    /// The broker's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
    }
}

/// A message read back.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Partition it was in.
    pub partition: i32,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Vec<u8>,
}

/// Reads `topics` from the beginning until `expected` messages arrived and
/// nothing more came for `settle`, or until `timeout`.
pub fn consume(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    settle: Duration,
    timeout: Duration,
) -> Vec<Consumed> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("petrel-test-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .expect("consumer");
    c.subscribe(topics).expect("subscribe");
    let mut out = Vec::new();
    let start = Instant::now();
    let mut last = Instant::now();
    while start.elapsed() < timeout {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(Consumed {
                    partition: m.partition(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                });
                last = Instant::now();
            }
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {
                if out.len() >= expected && last.elapsed() >= settle {
                    break;
                }
            }
        }
    }
    out
}

/// How often each value was seen.
pub fn value_counts(msgs: &[Consumed]) -> HashMap<Vec<u8>, usize> {
    let mut h = HashMap::new();
    for m in msgs {
        *h.entry(m.value.clone()).or_insert(0) += 1;
    }
    h
}

/// Creates `name` with `partitions` partitions and waits (at most 60 s)
/// until each has a leader, so that a producer's first metadata already
/// lists them all (a topic created by its first produce can answer with
/// some partitions leaderless for a while).
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let r = rt
        .block_on(admin.create_topics(&[topic], &AdminOptions::new()))
        .expect("create topic");
    for x in r {
        x.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "petrel-probe")
        .create()
        .expect("probe client");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let led = probe
            .fetch_metadata(Some(name), Duration::from_secs(2))
            .ok()
            .and_then(|md| {
                md.topics()
                    .first()
                    .map(|t| t.partitions().iter().filter(|p| p.leader() >= 0).count())
            })
            .unwrap_or(0);
        if led == partitions as usize {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {name}: {led} of {partitions} partitions have a leader after 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
