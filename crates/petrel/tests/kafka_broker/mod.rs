//! A real Apache Kafka broker (KRaft, single node) on 127.0.0.1 for the
//! tests, run from the jars `scripts/fetch-kafka.sh` puts in
//! `.cache/kafka/lib`, plus a consumer that reads topics back.
//!
//! [`Broker::start_secure`] adds the listeners of a production cluster
//! beside PLAINTEXT: SSL with client certificates required, SASL_SSL with
//! SCRAM-SHA-512 (and -256), SASL_SSL with PLAIN, and SASL_SSL with
//! OAUTHBEARER validated against the JWKS of a small OIDC token endpoint
//! ([`oidc`]); certificates made by `openssl` and `keytool` ([`pki`]).

#![allow(dead_code)]

pub mod oidc;
#[path = "../pki/mod.rs"]
pub mod pki;

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
    /// The secured listeners, with [`Broker::start_secure`].
    pub secure: Option<Secure>,
}

/// The secured listeners of a broker and what clients need for them.
pub struct Secure {
    /// SSL, client certificates required.
    pub ssl: u16,
    /// SASL_SSL with SCRAM-SHA-512 and SCRAM-SHA-256.
    pub scram: u16,
    /// SASL_SSL with PLAIN.
    pub plain: u16,
    /// SASL_SSL with OAUTHBEARER (tokens of [`Secure::oidc`]).
    pub oauth: u16,
    /// The authority of the broker's certificate and the clients'.
    pub ca: pki::Ca,
    /// A client certificate the SSL listener accepts.
    pub client: pki::Cert,
    /// A client certificate of the same authority, expired.
    pub expired: pki::Cert,
    /// An authority nobody here trusts (with a certificate of its own).
    pub other_ca: pki::Ca,
    /// The token endpoint of the OAUTHBEARER listener.
    pub oidc: oidc::TokenEndpoint,
}

/// The SCRAM user (SCRAM-SHA-512 and -256) and its password.
pub const SCRAM_USER: (&str, &str) = ("petrel", "scram-secret");
/// The PLAIN user and its password.
pub const PLAIN_USER: (&str, &str) = ("petrel", "plain-secret");
/// The OIDC client and its secret.
pub const OIDC_CLIENT: (&str, &str) = ("petrel-client", "oidc-secret");

fn java_cp() -> String {
    let lib = super::server::cached_entry("kafka", "scripts/fetch-kafka.sh").join("lib");
    format!("{}/*", lib.display())
}

impl Broker {
    /// Formats storage and starts a broker on free loopback ports; waits
    /// until it serves metadata.
    pub fn start() -> Broker {
        Self::start_with(false)
    }

    /// A broker with the secured listeners of [`Secure`] beside PLAINTEXT.
    pub fn start_secure() -> Broker {
        Self::start_with(true)
    }

    fn start_with(secured: bool) -> Broker {
        let server = ServerProcess::new("kafka broker", "petrel-kafka-", "broker.log");
        let dir = server.dir().to_path_buf();
        let port = free_port();
        let ctrl = free_port();
        let props = dir.join("server.properties");
        let mut listeners = format!("PLAINTEXT://127.0.0.1:{port}");
        let mut map = "PLAINTEXT:PLAINTEXT".to_string();
        let mut extra = String::new();
        let mut scram_args: Vec<String> = Vec::new();
        let secure = secured.then(|| {
            let pki_dir = dir.join("pki");
            let ca = pki::Ca::new(&pki_dir, "kafka-ca");
            let broker_cert = ca.issue("broker", "127.0.0.1", 0x1001, true);
            let client = ca.issue("client", "petrel-client", 0x2001, false);
            let expired = ca.issue_expired("expired", "petrel-expired");
            let other_ca = pki::Ca::new(&pki_dir.join("other"), "other-ca");
            let keystore = ca.keystore(&broker_cert, "broker");
            let truststore = ca.truststore();
            let jwks = dir.join("jwks.json");
            let oidc = oidc::TokenEndpoint::start(&jwks, OIDC_CLIENT.0, OIDC_CLIENT.1);
            let (ssl, scram, plain, oauth) = (free_port(), free_port(), free_port(), free_port());
            listeners.push_str(&format!(
                ",SSL://127.0.0.1:{ssl},SCRAM://127.0.0.1:{scram},PLAIN://127.0.0.1:{plain},OAUTH://127.0.0.1:{oauth}"
            ));
            map.push_str(",SSL:SSL,SCRAM:SASL_SSL,PLAIN:SASL_SSL,OAUTH:SASL_SSL");
            let pw = pki::STORE_PASSWORD;
            let (pu, pp) = PLAIN_USER;
            let jwks_url = format!("file://{}", jwks.display());
            extra = format!(
                "inter.broker.listener.name=PLAINTEXT\n\
                 ssl.keystore.type=PKCS12\n\
                 ssl.keystore.location={}\n\
                 ssl.keystore.password={pw}\n\
                 ssl.key.password={pw}\n\
                 ssl.truststore.type=PKCS12\n\
                 ssl.truststore.location={}\n\
                 ssl.truststore.password={pw}\n\
                 listener.name.ssl.ssl.client.auth=required\n\
                 listener.name.scram.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256\n\
                 listener.name.scram.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
                 listener.name.scram.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
                 listener.name.plain.sasl.enabled.mechanisms=PLAIN\n\
                 listener.name.plain.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{pu}=\"{pp}\";\n\
                 listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER\n\
                 listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;\n\
                 listener.name.oauth.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler\n\
                 sasl.oauthbearer.jwks.endpoint.url={jwks_url}\n\
                 sasl.oauthbearer.expected.issuer=petrel-test-idp\n",
                keystore.display(),
                truststore.display(),
            );
            let (su, sp) = SCRAM_USER;
            for m in ["SCRAM-SHA-512", "SCRAM-SHA-256"] {
                scram_args.push("--add-scram".into());
                scram_args.push(format!("{m}=[name={su},password={sp}]"));
            }
            Secure {
                ssl,
                scram,
                plain,
                oauth,
                ca,
                client,
                expired,
                other_ca,
                oidc,
            }
        });
        std::fs::write(
            &props,
            format!(
                "process.roles=broker,controller\n\
                 node.id=1\n\
                 controller.quorum.voters=1@127.0.0.1:{ctrl}\n\
                 listeners={listeners},CONTROLLER://127.0.0.1:{ctrl}\n\
                 advertised.listeners={listeners}\n\
                 controller.listener.names=CONTROLLER\n\
                 listener.security.protocol.map={map},CONTROLLER:PLAINTEXT\n\
                 {extra}\
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
                .args(&scram_args)
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
            secure,
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
        cmd.args(["-Xms256m", "-Xmx512m", "-XX:+UseSerialGC"]);
        if self.secure.is_some() {
            // Kafka 3.9.1 reads OAUTHBEARER keys only from the URLs this
            // allows (CVE-2025-27817).
            let jwks = self.server.dir().join("jwks.json");
            cmd.arg(format!(
                "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=file://{}",
                jwks.display()
            ));
        }
        cmd.args(["-cp", &java_cp(), "kafka.Kafka"])
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
    /// Its headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
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
                use rdkafka::message::Headers;
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| {
                                (
                                    x.key.to_string(),
                                    x.value.map(<[u8]>::to_vec).unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Consumed {
                    partition: m.partition(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    headers,
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
