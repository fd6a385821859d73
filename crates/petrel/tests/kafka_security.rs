//! Kafka over TLS and SASL against a real broker (Kafka 3.9.1, KRaft) with
//! every listener a production cluster has: PLAINTEXT, SSL with client
//! certificates required, SASL_SSL with SCRAM-SHA-512, SASL_SSL with PLAIN
//! and SASL_SSL with OAUTHBEARER (tokens from an OIDC token endpoint of the
//! test tree, validated by the broker against its JWKS). One broker serves
//! every case of the suite.

mod common;
mod kafka_broker;
mod server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use kafka_broker::{consume, Broker, Secure, OIDC_CLIENT, PLAIN_USER, SCRAM_USER};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

/// Records per listener.
const RECORDS: usize = 100_000;

/// The `tls:`/`sasl:` keys (YAML, indented for a component) that reach
/// `listener` of the broker, and its port; secrets come from the files in
/// `dir` and the environment of the agent ([`env`]).
fn security(listener: &str, b: &Broker, dir: &Path) -> (u16, String) {
    let s = b.secure.as_ref().expect("a secured broker");
    let ca = s.ca.pem();
    match listener {
        "plaintext" => (b.port, String::new()),
        "ssl" => (
            s.ssl,
            format!(
                "    tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}\n",
                ca.display(),
                s.client.cert.display(),
                s.client.key.display()
            ),
        ),
        "scram" => (
            s.scram,
            format!(
                "    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: SCRAM-SHA-512, username: {}, password: \"${{KAFKA_SCRAM_PASSWORD}}\"}}\n",
                ca.display(),
                SCRAM_USER.0
            ),
        ),
        "plain" => {
            let f = dir.join("plain-password");
            std::fs::write(&f, format!("{}\n", PLAIN_USER.1)).expect("password file");
            (
                s.plain,
                format!(
                    "    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: PLAIN, username: {}, password_file: \"{}\"}}\n",
                    ca.display(),
                    PLAIN_USER.0,
                    f.display()
                ),
            )
        }
        "oauth" => {
            let f = dir.join("oidc-secret");
            std::fs::write(&f, OIDC_CLIENT.1).expect("secret file");
            (
                s.oauth,
                format!(
                    "    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: OAUTHBEARER, token_endpoint_url: \"{}\", client_id: {}, client_secret_file: \"{}\", scope: kafka}}\n",
                    ca.display(),
                    s.oidc.url,
                    OIDC_CLIENT.0,
                    f.display()
                ),
            )
        }
        other => panic!("no listener {other}"),
    }
}

/// The agent's environment: the SCRAM password.
fn env() -> Vec<(String, String)> {
    vec![("KAFKA_SCRAM_PASSWORD".into(), SCRAM_USER.1.into())]
}

/// Reads `topic` with `read_committed` over PLAINTEXT until `n` records
/// came and nothing more for 2 s (at most 120 s).
fn read_committed(bootstrap: &str, topic: &str, n: usize) -> HashMap<Vec<u8>, usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("check-{topic}-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let mut counts = HashMap::new();
    let (mut seen, start) = (0, std::time::Instant::now());
    let mut last = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                *counts
                    .entry(m.payload().unwrap_or_default().to_vec())
                    .or_insert(0) += 1;
                seen += 1;
                last = std::time::Instant::now();
            }
            Some(Err(e)) => eprintln!("check consumer: {e}"),
            None if seen >= n && last.elapsed() > Duration::from_secs(2) => break,
            None => {}
        }
    }
    counts
}

fn record(listener: &str, i: usize) -> String {
    format!("{listener}-{i:07}-{}", "x".repeat(80))
}

/// Writes the three pipelines of `listener` into `cfg`: a file into topic
/// `in-L` (at least once), `in-L` into `out-L` exactly once (a consumer
/// group and a transactional producer), and `out-L` into a file.
fn pipelines(listener: &str, b: &Broker, cfg: &Path, work: &Path) -> (PathBuf, PathBuf) {
    let (port, sec) = security(listener, b, work);
    let input = work.join(format!("{listener}.log"));
    let mut text = String::with_capacity(RECORDS * 100);
    for i in 0..RECORDS {
        text.push_str(&record(listener, i));
        text.push('\n');
    }
    std::fs::write(&input, text).expect("input");
    let out = work.join(format!("{listener}.out"));
    let bs = format!("[\"127.0.0.1:{port}\"]");
    write_config(
        cfg,
        &format!("{listener}_in"),
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: kafka\n    id: out\n    brokers: {bs}\n    topic: in-{listener}\n{sec}",
            input.display()
        ),
    );
    write_config(
        cfg,
        &format!("{listener}_mirror"),
        &format!(
            "sources:\n  - type: kafka\n    brokers: {bs}\n    topics: [in-{listener}]\n    group_id: mirror-{listener}\n{sec}sinks:\n  - type: kafka\n    id: out\n    brokers: {bs}\n    topic: out-{listener}\n    exactly_once: true\n{sec}"
        ),
    );
    write_config(
        cfg,
        &format!("{listener}_out"),
        &format!(
            "sources:\n  - type: kafka\n    brokers: {bs}\n    topics: [out-{listener}]\n    group_id: reader-{listener}\n{sec}sinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
            out.display()
        ),
    );
    (input, out)
}

const LISTENERS: &[&str] = &["plaintext", "ssl", "scram", "plain", "oauth"];

#[test]
fn every_listener_carries_records_at_least_once_and_exactly_once_and_refusals_are_clear() {
    let b = Broker::start_secure();
    let bootstrap = b.bootstrap();
    let work = tempdir();
    let cfg = work.path().join("pipelines");
    std::fs::create_dir(&cfg).expect("config dir");
    let mut outs = Vec::new();
    for l in LISTENERS {
        outs.push((*l, pipelines(l, &b, &cfg, work.path())));
    }
    let (code, out, err) = run_to_end_env(
        work.path(),
        &["validate", "--config", &cfg.to_string_lossy()],
        &env(),
    );
    assert_eq!(code, Some(0), "validate: {out}{err}");
    let data = work.path().join("data");
    let mut agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            env: env(),
            ..Default::default()
        },
    );
    for (l, (_, out)) in &outs {
        wait_for(
            Duration::from_secs(240),
            &format!("{l}: {RECORDS} records through"),
            || {
                let n = count_lines(out);
                if n >= RECORDS {
                    Ok(())
                } else {
                    Err(format!("{n} lines; agent log:\n{}", tail(&agent.stderr())))
                }
            },
        );
    }
    for (l, (_, out)) in &outs {
        // Nothing missing at the end of the chain, none twice.
        let h = histogram(read_lines(out));
        let missing = (0..RECORDS)
            .filter(|i| !h.contains_key(record(l, *i).as_bytes()))
            .count();
        assert_eq!(missing, 0, "{l}: records missing in the output file");
        // The at-least-once topic holds every record.
        let input = read_committed(&bootstrap, &format!("in-{l}"), RECORDS);
        let missing = (0..RECORDS)
            .filter(|i| !input.contains_key(record(l, *i).as_bytes()))
            .count();
        assert_eq!(missing, 0, "{l}: records missing in in-{l} (at least once)");
        // Exactly once: each record of the input topic once in the output
        // topic as often as in the input topic.
        let output = read_committed(&bootstrap, &format!("out-{l}"), RECORDS);
        let differ = input
            .iter()
            .filter(|(v, n)| output.get(*v) != Some(n))
            .count();
        assert_eq!(differ, 0, "{l}: out-{l} is not in-{l} exactly once");
        assert_eq!(output.len(), input.len(), "{l}: records only in out-{l}");
    }
    agent.stop();
    refusals(&b, work.path());
}

/// The last lines of a log.
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A wrong password, an untrusted authority, an expired client
/// certificate and a refused OIDC client: one clear error each, naming the
/// sink and the cause, and nothing acknowledged. A good SCRAM-SHA-256
/// sink beside them delivers.
fn refusals(b: &Broker, work: &Path) {
    let s: &Secure = b.secure.as_ref().expect("secured");
    let dir = work.join("refusals");
    let cfg = dir.join("pipelines");
    std::fs::create_dir_all(&cfg).expect("dir");
    let ca = s.ca.pem();
    let other = s.other_ca.pem();
    let bad_secret = dir.join("bad-secret");
    std::fs::write(&bad_secret, "not-the-secret").expect("secret");
    // Not a keytab kinit can use: there is no KDC to make one for.
    let keytab = dir.join("client.keytab");
    std::fs::write(&keytab, "not a keytab").expect("keytab");
    let cases: Vec<(&str, u16, String, &[&str])> = vec![
        (
            "wrong_password",
            s.scram,
            format!("    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: SCRAM-SHA-512, username: petrel, password: wrong}}\n", ca.display()),
            &["SASL credentials"][..],
        ),
        (
            "untrusted_ca",
            s.ssl,
            format!(
                "    tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}\n",
                other.display(),
                s.client.cert.display(),
                s.client.key.display()
            ),
            &["not trusted"][..],
        ),
        (
            "expired_cert",
            s.ssl,
            format!(
                "    tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}\n",
                ca.display(),
                s.expired.cert.display(),
                s.expired.key.display()
            ),
            &["expired"][..],
        ),
        (
            "refused_client",
            s.oauth,
            format!(
                "    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: OAUTHBEARER, token_endpoint_url: \"{}\", client_id: {}, client_secret_file: \"{}\"}}\n",
                ca.display(),
                s.oidc.url,
                OIDC_CLIENT.0,
                bad_secret.display()
            ),
            &["OAUTHBEARER token", "401"][..],
        ),
        (
            // No KDC here: GSSAPI is accepted by the configuration and
            // its failure to start Kerberos is named.
            "gssapi",
            s.scram,
            format!("    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: GSSAPI, kerberos_principal: petrel@EXAMPLE.ORG, kerberos_keytab: \"{}\"}}\n", ca.display(), keytab.display()),
            &["GSSAPI", "kinit"][..],
        ),
    ];
    let mut inputs = Vec::new();
    for (name, port, sec, _) in &cases {
        let input = dir.join(format!("{name}.log"));
        std::fs::write(&input, "one\ntwo\nthree\n").expect("input");
        write_config(
            &cfg,
            name,
            &format!(
                "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: kafka\n    id: out\n    brokers: [\"127.0.0.1:{port}\"]\n    topic: refused-{name}\n{sec}",
                input.display()
            ),
        );
        inputs.push(input);
    }
    // Beside them, SCRAM-SHA-256 with the right password delivers.
    let good = dir.join("good.log");
    std::fs::write(&good, "sha256-a\nsha256-b\n").expect("input");
    write_config(
        &cfg,
        "scram_sha_256",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: kafka\n    id: out\n    brokers: [\"127.0.0.1:{}\"]\n    topic: good-sha256\n    tls: {{ca_file: \"{}\"}}\n    sasl: {{mechanism: SCRAM-SHA-256, username: petrel, password: \"${{KAFKA_SCRAM_PASSWORD}}\"}}\n",
            good.display(),
            s.scram,
            ca.display()
        ),
    );
    let data = dir.join("data");
    let mut agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            env: env(),
            // The refused sinks hold their records to the end: the drain
            // at the stop waits for them no longer than this.
            args: vec!["--shutdown-timeout".into(), "3".into()],
            ..Default::default()
        },
    );
    let got = consume(
        &b.bootstrap(),
        &["good-sha256"],
        2,
        Duration::from_millis(500),
        Duration::from_secs(60),
    );
    assert_eq!(
        got.len(),
        2,
        "SCRAM-SHA-256 delivers; log:\n{}",
        tail(&agent.stderr())
    );
    for (name, _, _, causes) in &cases {
        let sink = format!("kafka sink {name}/sink/out");
        wait_for(LONG, &format!("the error of {name}"), || {
            let log = agent.stderr();
            let hit = log
                .lines()
                .any(|l| l.contains(&sink) && causes.iter().all(|c| l.contains(c)));
            if hit {
                Ok(())
            } else {
                Err(format!(
                    "no line naming `{sink}` and {causes:?}; log:\n{}",
                    tail(&log)
                ))
            }
        });
    }
    for ((name, _, _, _), input) in cases.iter().zip(&inputs) {
        let sent = agent.metric_or_zero(
            "petrel_component_sent_events_total",
            &component(name, "sink", "out"),
        );
        assert_eq!(sent, 0.0, "{name}: nothing delivered");
        assert!(
            checkpoint_offset(&data, input).unwrap_or(0) == 0,
            "{name}: nothing acknowledged"
        );
    }
    let log = agent.stderr();
    assert!(
        !log.contains("not-the-secret") && !log.contains(SCRAM_USER.1) && !log.contains("wrong,"),
        "secrets never logged:\n{log}"
    );
    agent.stop();
}

#[test]
fn tls_and_sasl_settings_are_checked_in_a_stable_order_and_every_problem_is_reported() {
    let work = tempdir();
    let cfg = write_config(
        work.path(),
        "kafka",
        "sources:\n  - type: stdin\nsinks:\n  - type: kafka\n    brokers: [\"127.0.0.1:9093\"]\n    topic: t\n    tls: {ca_file: /nonexistent/ca.pem, cert_file: /nonexistent/client.pem}\n    sasl: {mechanism: SCRAM-SHA-512, username: petrel}\n    librdkafka:\n      no.such.setting: 1\n      compression.codec: bogus\n      socket.timeout.ms: soon\n",
    );
    let mut first = None;
    for _ in 0..5 {
        let (code, out, err) = run_to_end(
            work.path(),
            &["validate", "--config", &cfg.to_string_lossy()],
        );
        assert_eq!(code, Some(2), "{out}{err}");
        let text = format!("{out}{err}");
        for want in [
            "`tls.ca_file`: /nonexistent/ca.pem",
            "`tls.cert_file`: /nonexistent/client.pem",
            "`cert_file` and `key_file` go together",
            "SASL SCRAM-SHA-512 needs `password` (or `password_file`)",
            "unknown librdkafka setting `no.such.setting`",
            "librdkafka refuses `compression.codec: bogus`",
            "librdkafka refuses `socket.timeout.ms: soon`",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
        match &first {
            None => first = Some(text),
            Some(f) => assert_eq!(f, &text, "the same problems in the same order on every run"),
        }
    }
}

#[test]
fn secrets_come_from_files_and_the_environment_and_a_missing_one_is_named() {
    let work = tempdir();
    let cfg = write_config(
        work.path(),
        "kafka",
        "sources:\n  - type: stdin\nsinks:\n  - type: kafka\n    brokers: [\"127.0.0.1:9093\"]\n    topic: t\n    sasl: {mechanism: PLAIN, username: petrel, password: \"${PETREL_TEST_UNSET_PASSWORD}\"}\n  - type: kafka\n    brokers: [\"127.0.0.1:9093\"]\n    topic: t\n    sasl: {mechanism: SCRAM-SHA-256, username: petrel, password_file: /nonexistent/pw}\n  - type: kafka\n    brokers: [\"127.0.0.1:9093\"]\n    topic: t\n    sasl: {mechanism: GSSAPI, kerberos_service_name: kafka, kerberos_principal: petrel@EXAMPLE.ORG}\n  - type: kafka\n    brokers: [\"127.0.0.1:9093\"]\n    topic: t\n    sasl: {mechanism: GSSAPI, kerberos_principal: petrel@EXAMPLE.ORG, kerberos_keytab: kafka.yaml}\n",
    );
    let (code, out, err) = run_to_end(
        work.path(),
        &["validate", "--config", &cfg.to_string_lossy()],
    );
    let text = format!("{out}{err}");
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("environment variable `PETREL_TEST_UNSET_PASSWORD` is not set"),
        "{text}"
    );
    assert!(text.contains("`password_file` /nonexistent/pw"), "{text}");
    // GSSAPI without a keytab: librdkafka's kinit command needs one (it
    // would refuse to create the client at start).
    assert!(
        text.contains("kafka.yaml:15:23: SASL GSSAPI: librdkafka gets its Kerberos ticket with `kinit`, whose command needs `sasl.kerberos.keytab`: add `kerberos_keytab: /path/to/client.keytab` to `sasl`"),
        "{text}"
    );
    // With one, GSSAPI is accepted: the only problems are the three above.
    assert_eq!(
        text.lines().filter(|l| l.contains("kafka.yaml:")).count(),
        3,
        "{text}"
    );
}
