//! The `fluent` source against real Forward protocol clients on loopback:
//! Python's `fluent-logger` (Message mode, its async sender) and its
//! `msgpack` writing PackedForward with EventTime, Node's
//! `@fluent-org/logger` (acknowledgements, Forward, PackedForward,
//! CompressedPackedForward, the `shared_key` handshake and a wrong key),
//! Docker's `fluentd` log driver from the docker lab, garbage and an
//! oversized message, and `kill -9` after acknowledged chunks with the
//! disk buffer. Clients come from `scripts/install-fluent-clients.sh`.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn clients() -> PathBuf {
    let d = repo().join(".cache/fluent-clients");
    assert!(
        d.join("venv/bin/python").exists()
            && d.join("node/node_modules/@fluent-org/logger").exists(),
        "the fluent clients are missing in {}: run scripts/install-fluent-clients.sh",
        d.display()
    );
    d
}

/// Runs a short-lived client to completion (bounded by [`LONG`]); panics
/// with its output when it fails.
fn run_client(mut cmd: Command, what: &str, dir: &Path) -> String {
    let out_path = dir.join(format!("{what}.out"));
    let err_path = dir.join(format!("{what}.err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let status = wait_for(LONG, &format!("{what} to exit"), || {
        match child.try_wait() {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err("still running".into()),
            Err(e) => Err(e.to_string()),
        }
    });
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "{what} failed ({status}):\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

fn python(dir: &Path, name: &str, script: &str, args: &[String]) -> String {
    let p = dir.join(format!("{name}.py"));
    std::fs::write(&p, script).unwrap();
    let mut cmd = Command::new(clients().join("venv/bin/python"));
    cmd.arg(&p).args(args);
    run_client(cmd, name, dir)
}

fn node(dir: &Path, name: &str, script: &str, args: &[String]) -> String {
    let p = dir.join(format!("{name}.js"));
    std::fs::write(&p, script).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&p)
        .args(args)
        .env("NODE_PATH", clients().join("node/node_modules"));
    run_client(cmd, name, dir)
}

/// Pipeline `fluent`: source `fwd` on `port` with `extra` keys (lines
/// indented by four spaces) into an ndjson file.
fn config(dir: &Path, port: u16, extra: &str, out: &Path) -> PathBuf {
    write_config(
        dir,
        "fluent",
        &format!(
            "sources:\n  - type: fluent\n    id: fwd\n    address: 127.0.0.1:{port}\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            out.display()
        ),
    )
}

fn wait_json(out: &Path, n: usize) -> Vec<serde_json::Value> {
    wait_for(LONG, &format!("{n} events in {}", out.display()), || {
        let v = if out.exists() {
            json_lines(out)
        } else {
            Vec::new()
        };
        if v.len() >= n {
            Ok(v)
        } else {
            Err(format!("{} so far", v.len()))
        }
    })
}

/// How often each `message` value arrived.
fn counts(events: &[serde_json::Value]) -> HashMap<String, usize> {
    let mut h = HashMap::new();
    for e in events {
        *h.entry(e["message"].as_str().unwrap_or("<none>").to_string())
            .or_default() += 1;
    }
    h
}

fn assert_once(events: &[serde_json::Value], prefix: &str, n: usize) {
    let c = counts(events);
    for i in 0..n {
        let k = format!("{prefix}-{i}");
        assert_eq!(c.get(&k), Some(&1), "{k} must arrive exactly once");
    }
}

const PY_SENDERS: &str = r#"
import sys
from fluent import sender, asyncsender
port, n = int(sys.argv[1]), int(sys.argv[2])
s = sender.FluentSender('py', host='127.0.0.1', port=port, nanosecond_precision=True)
for i in range(n):
    if not s.emit('sync', {'message': 'sync-%d' % i, 'n': i, 'nested': {'a': i, 'b': [1, 'x']}}):
        sys.exit('emit failed: %r' % s.last_error)
s.close()
a = asyncsender.FluentSender('py', host='127.0.0.1', port=port)
for i in range(n):
    a.emit('async', {'log': 'async-%d' % i, 'n': i})
a.close()
print('sent')
"#;

/// PackedForward written with msgpack as Fluent Bit and Fluentd do: one
/// chunk of entries with EventTime (seconds and nanoseconds).
const PY_PACKED: &str = r#"
import socket, struct, sys, msgpack
port, n = int(sys.argv[1]), int(sys.argv[2])
def et(s, ns):
    return msgpack.ExtType(0, struct.pack('>II', s, ns))
entries = b''.join(msgpack.packb([et(1700000000, i * 1000 + 7), {'message': 'packed-%d' % i, 'i': i}]) for i in range(n))
c = socket.create_connection(('127.0.0.1', port))
c.sendall(msgpack.packb(['bit.app', entries, {'size': n}]))
# Forward mode: an array of entries.
c.sendall(msgpack.packb(['bit.fwd', [[1700000001, {'message': 'forward-%d' % i}] for i in range(n)]]))
# Large chunks back to back, cut by the socket reads anywhere, then EOF.
big = b''.join(msgpack.packb(['bit.big', b''.join(msgpack.packb([1700000002, {'message': 'big-%d' % (k * 1000 + i), 'pad': 'x' * 150}]) for i in range(1000)), {'size': 1000}]) for k in range(n // 100))
c.sendall(big)
c.close()
print('sent')
"#;

#[test]
fn python_fluent_logger_message_async_packed_and_forward_arrive_once_with_tag_fields_and_nanoseconds(
) {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "", &out);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    connect(port);
    let n = 300;
    python(
        dir.path(),
        "senders",
        PY_SENDERS,
        &[port.to_string(), n.to_string()],
    );
    python(
        dir.path(),
        "packed",
        PY_PACKED,
        &[port.to_string(), n.to_string()],
    );
    let big = n / 100 * 1000;
    let events = wait_json(&out, 4 * n + big);
    std::thread::sleep(Duration::from_millis(300));
    let events2 = json_lines(&out);
    assert_eq!(events2.len(), 4 * n + big, "no more than the records sent");
    assert_once(&events, "big", big);
    assert_once(&events, "sync", n);
    assert_once(&events, "async", n);
    assert_once(&events, "packed", n);
    assert_once(&events, "forward", n);
    let by_msg: HashMap<String, &serde_json::Value> = events
        .iter()
        .map(|e| (e["message"].as_str().unwrap().to_string(), e))
        .collect();
    let e = by_msg["sync-7"];
    assert_eq!(e["fluent.tag"], "py.sync");
    assert_eq!(e["n"], 7);
    assert_eq!(e["nested"], serde_json::json!({"a": 7, "b": [1, "x"]}));
    assert!(e["source_address"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    let e = by_msg["async-3"];
    assert_eq!(e["fluent.tag"], "py.async");
    assert!(e.get("log").is_none(), "`log` became the message: {e}");
    let e = by_msg["packed-5"];
    assert_eq!(e["fluent.tag"], "bit.app");
    assert_eq!(e["i"], 5);
    // EventTime keeps its nanoseconds.
    assert_eq!(e["timestamp"], "2023-11-14T22:13:20.000005007Z", "{e}");
    let e = by_msg["forward-9"];
    assert_eq!(e["fluent.tag"], "bit.fwd");
    assert_eq!(e["timestamp"], "2023-11-14T22:13:21.000000000Z", "{e}");
}

const NODE_MODES: &str = r#"
const { FluentClient } = require("@fluent-org/logger");
const [port, n, mode, label, key, host] = process.argv.slice(2);
(async () => {
  const opts = {
    socket: { host: "127.0.0.1", port: Number(port), timeout: 10000, disableReconnect: true },
    eventMode: mode,
    ack: { ackTimeout: 20000 },
    flushInterval: 5,
  };
  if (key) opts.security = { clientHostname: host || "node-client", sharedKey: key };
  const tlsDir = process.env.FLUENT_TLS_DIR;
  if (tlsDir) {
    const fs = require("fs");
    opts.socket.tls = { ca: fs.readFileSync(tlsDir + "/ca.pem") };
    if (process.env.FLUENT_TLS_CLIENT) {
      opts.socket.tls.cert = fs.readFileSync(tlsDir + "/client.pem");
      opts.socket.tls.key = fs.readFileSync(tlsDir + "/client.key");
    }
  }
  const logger = new FluentClient("node", opts);
  await logger.connect();
  const all = [];
  for (let i = 0; i < Number(n); i++) {
    all.push(logger.emit(label, { message: `${label}-${i}`, i, mode }));
  }
  await Promise.all(all);
  await logger.disconnect();
  console.log("acked " + all.length);
})().catch((e) => { console.error("FAILED " + (e && e.stack || e)); process.exit(3); });
"#;

#[test]
fn node_logger_acknowledged_in_every_mode_and_shared_key_checked() {
    clients();
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(
        dir.path(),
        port,
        "    security:\n      shared_key: s3cret\n      self_hostname: petrel-test\n",
        &out,
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    connect(port);
    let n = 200;
    for mode in [
        "Message",
        "Forward",
        "PackedForward",
        "CompressedPackedForward",
    ] {
        let said = node(
            dir.path(),
            &format!("node-{mode}"),
            NODE_MODES,
            &[
                port.to_string(),
                n.to_string(),
                mode.to_string(),
                mode.to_lowercase(),
                "s3cret".into(),
            ],
        );
        // Every emit resolved: each was acknowledged, which the source
        // does only once the file sink wrote it.
        assert!(said.contains(&format!("acked {n}")), "{mode}: {said}");
        let events = json_lines(&out);
        assert_once(&events, &mode.to_lowercase(), n);
    }
    let events = json_lines(&out);
    assert_eq!(events.len(), 4 * n);
    let e = events
        .iter()
        .find(|e| e["message"] == "compressedpackedforward-11")
        .unwrap();
    assert_eq!(e["fluent.tag"], "node.compressedpackedforward");
    assert_eq!(e["i"], 11);

    // A wrong key: the handshake fails, nothing is accepted, counted.
    let p = dir.path().join("wrong.js");
    std::fs::write(&p, NODE_MODES).unwrap();
    let mut child = Command::new("node")
        .arg(&p)
        .args([&port.to_string(), "3", "Message", "wrong", "not-the-key"])
        .env("NODE_PATH", clients().join("node/node_modules"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_child(&mut child, "node with a wrong shared key");
    let (mut said, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // The client's emits never resolve (it gives up when the server
    // closes after PONG, exiting with or without an error).
    assert!(
        !said.contains("acked"),
        "a wrong shared key must be refused ({status}): {said} {err}"
    );
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "handshake_failed"),
        1.0,
        false,
    );
    assert!(agent.stderr().contains("shared_key mismatch"));
    assert_eq!(
        json_lines(&out).len(),
        4 * n,
        "nothing from the refused client"
    );
}

fn msg(tag: &str, message: &str, chunk: Option<&str>) -> Vec<u8> {
    let mut o = Vec::new();
    rmp::encode::write_array_len(&mut o, if chunk.is_some() { 4 } else { 3 }).unwrap();
    rmp::encode::write_str(&mut o, tag).unwrap();
    rmp::encode::write_uint(&mut o, 1_700_000_000).unwrap();
    rmp::encode::write_map_len(&mut o, 1).unwrap();
    rmp::encode::write_str(&mut o, "message").unwrap();
    rmp::encode::write_str(&mut o, message).unwrap();
    if let Some(c) = chunk {
        rmp::encode::write_map_len(&mut o, 1).unwrap();
        rmp::encode::write_str(&mut o, "chunk").unwrap();
        rmp::encode::write_str(&mut o, c).unwrap();
    }
    o
}

/// Reads until the server closes; what it sent.
fn read_to_close(s: &mut std::net::TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(MEDIUM)).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the server closes the connection");
    got
}

fn ack(chunk: &str) -> Vec<u8> {
    let mut o = Vec::new();
    rmp::encode::write_map_len(&mut o, 1).unwrap();
    rmp::encode::write_str(&mut o, "ack").unwrap();
    rmp::encode::write_str(&mut o, chunk).unwrap();
    o
}

#[test]
fn garbage_and_an_oversized_message_are_counted_and_earlier_records_kept_and_acknowledged() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "    max_entry_bytes: 4KiB\n", &out);
    let agent = Agent::start(&cfg, &dir.path().join("data"));

    // Two good messages (the second asks for an ack), then garbage.
    let mut s = connect(port);
    let mut data = msg("t.a", "before-garbage-0", None);
    data.extend(msg("t.a", "before-garbage-1", Some("c-1")));
    data.extend_from_slice(&[0xc1, 0xff, 0x00, 0x13, 0x37]);
    s.write_all(&data).unwrap();
    assert_eq!(
        read_to_close(&mut s),
        ack("c-1"),
        "acknowledged, then closed"
    );
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "invalid_message"),
        1.0,
        false,
    );

    // A good message, then one declaring 1 MiB of packed entries.
    let mut s = connect(port);
    let mut data = msg("t.b", "before-oversized-0", Some("c-2"));
    rmp::encode::write_array_len(&mut data, 2).unwrap();
    rmp::encode::write_str(&mut data, "t.b").unwrap();
    rmp::encode::write_bin_len(&mut data, 1 << 20).unwrap();
    data.extend_from_slice(&[0x92; 100]);
    s.write_all(&data).unwrap();
    assert_eq!(read_to_close(&mut s), ack("c-2"));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "entry_too_large"),
        1.0,
        false,
    );

    // A well-formed message that is not a Forward message: a number as tag.
    let mut s = connect(port);
    let mut data = Vec::new();
    rmp::encode::write_array_len(&mut data, 3).unwrap();
    rmp::encode::write_uint(&mut data, 5).unwrap();
    rmp::encode::write_uint(&mut data, 5).unwrap();
    rmp::encode::write_map_len(&mut data, 0).unwrap();
    s.write_all(&data).unwrap();
    assert!(read_to_close(&mut s).is_empty());
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "invalid_message"),
        2.0,
        false,
    );

    let events = wait_json(&out, 3);
    let c = counts(&events);
    for m in ["before-garbage-0", "before-garbage-1", "before-oversized-0"] {
        assert_eq!(c.get(m), Some(&1), "{m}: {c:?}");
    }
    // The agent still serves.
    let mut s = connect(port);
    s.write_all(&msg("t.c", "after", Some("c-3"))).unwrap();
    let mut got = vec![0u8; ack("c-3").len()];
    s.set_read_timeout(Some(MEDIUM)).unwrap();
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, ack("c-3"));
    wait_json(&out, 4);
}

#[test]
fn docker_fluentd_log_driver_lines_arrive_once() {
    use petrel_cri::lab::Dockerd;
    let d = Dockerd::start().expect("start dockerd (scripts/docker-lab.sh setup first)");
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "", &out);
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    connect(port);
    let n = 500;
    let script = format!("i=1; while [ $i -le {n} ]; do echo docker-line-$i; i=$((i+1)); done");
    let addr = format!("fluentd-address=127.0.0.1:{port}");
    d.docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        "fluent-test",
        "--log-driver",
        "fluentd",
        "--log-opt",
        &addr,
        "--log-opt",
        "fluentd-async=false",
        "--log-opt",
        "tag=docker.{{.Name}}",
        Dockerd::IMAGE,
        "sh",
        "-c",
        &script,
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let events = wait_json(&out, n);
    std::thread::sleep(Duration::from_millis(300));
    let events = {
        let again = json_lines(&out);
        assert_eq!(again.len(), events.len().max(n), "no duplicates");
        again
    };
    let c = counts(&events);
    for i in 1..=n {
        assert_eq!(c.get(&format!("docker-line-{i}")), Some(&1), "line {i}");
    }
    let e = &events[0];
    assert_eq!(e["fluent.tag"], "docker.fluent-test", "{e}");
    assert_eq!(e["container_name"], "/fluent-test", "{e}");
    assert_eq!(e["source"], "stdout", "{e}");
    assert!(
        e["container_id"].as_str().is_some_and(|s| s.len() == 64),
        "{e}"
    );
}

/// Sends `chunks` PackedForward chunks of `per` records with `chunk`
/// options; prints each acknowledged chunk id as its ack arrives, and
/// stops (exit 0) after `stop_after` acks or at the end.
const PY_ACKED: &str = r#"
import socket, sys, msgpack
port, chunks, per, start = map(int, sys.argv[1:5])
c = socket.create_connection(('127.0.0.1', port))
c.settimeout(60)
u = msgpack.Unpacker(raw=False)
for k in range(start, start + chunks):
    entries = b''.join(msgpack.packb([1700000000, {'message': 'rec-%d-%d' % (k, i)}]) for i in range(per))
    c.sendall(msgpack.packb(['kill.test', entries, {'chunk': 'k%d' % k, 'size': per}]))
    while True:
        data = c.recv(4096)
        if not data:
            sys.exit('closed before the ack of k%d' % k)
        u.feed(data)
        got = [m for m in u]
        if got:
            assert got == [{'ack': 'k%d' % k}], got
            print('acked', k, flush=True)
            break
c.close()
"#;

#[test]
fn kill_9_after_acknowledged_chunks_loses_none_with_the_disk_buffer() {
    use std::sync::atomic::Ordering;
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    let port = free_port();
    // Two sinks: the file, and an HTTP receiver that holds every request
    // until released, so nothing is committed in the spool before the
    // kill: acknowledgements can only come from the spool's durability.
    let stalled = std::sync::Arc::new(Stalled::default());
    let addr = serve_stalled(stalled.clone());
    let cfg = write_config(
        dir.path(),
        "fluent",
        &format!(
            "sources:\n  - type: fluent\n    id: fwd\n    address: 127.0.0.1:{port}\n    buffer: {{type: disk, sync_interval_ms: 50}}\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n  - type: http\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n",
            out.display()
        ),
    );
    let mut agent = Agent::start(&cfg, &data);
    connect(port);
    let (chunks, per) = (40u32, 250u32);
    let said = python(
        dir.path(),
        "acked",
        PY_ACKED,
        &[port as u32, chunks, per, 0].map(|v| v.to_string()),
    );
    assert_eq!(said.lines().count(), chunks as usize, "{said}");
    assert!(
        stalled.bodies.lock().unwrap().is_empty(),
        "the HTTP receiver answered nothing yet"
    );
    agent.kill9();
    stalled.released.store(true, Ordering::SeqCst);
    let _agent = Agent::start(&cfg, &data);
    let total = (chunks * per) as usize;
    let http_count = || stalled.lines();
    wait_for(
        LONG,
        "every acknowledged record at the HTTP receiver",
        || {
            let n = http_count();
            if n >= total {
                Ok(())
            } else {
                Err(format!("{n} of {total}"))
            }
        },
    );
    let events = wait_json(&out, total);
    let c = counts(&events);
    let mut dups = 0;
    for k in 0..chunks {
        for i in 0..per {
            let n = c.get(&format!("rec-{k}-{i}")).copied().unwrap_or(0);
            assert!(n >= 1, "acknowledged rec-{k}-{i} was lost");
            dups += n - 1;
        }
    }
    eprintln!(
        "kill -9 after {total} acknowledged records: file {} lines ({dups} duplicates), http {}",
        events.len(),
        http_count()
    );
    // Duplicates are records a sink wrote before the kill that the spool
    // had not committed (here: everything the file sink wrote, since the
    // HTTP sink acknowledged nothing): at most once more each.
    assert!(dups <= total, "{dups}");
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is needed (scripts/install-test-tools.sh)");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `ca.pem`, and `<name>.pem`/`<name>.key` signed by it, in `dir`.
fn certificates(dir: &Path) {
    let req = |name: &str, cn: &str| {
        vec![
            "req".to_string(),
            "-newkey".into(),
            "rsa:2048".into(),
            "-nodes".into(),
            "-subj".into(),
            format!("/CN={cn}"),
            "-keyout".into(),
            format!("{name}.key"),
            "-out".into(),
            format!("{name}.csr"),
        ]
    };
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=fluent-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    for (name, cn, ext) in [
        (
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "node-client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let args = req(name, cn);
        openssl(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
}

#[test]
fn node_logger_over_mutual_tls_with_a_shared_key_is_acknowledged_and_a_client_without_certificate_refused(
) {
    clients();
    let dir = tempdir();
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    certificates(&tls);
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let t = tls.display();
    let cfg = config(
        dir.path(),
        port,
        &format!(
            "    tls: {{cert_file: {t}/server.pem, key_file: {t}/server.key, ca_file: {t}/ca.pem}}\n    security: {{shared_key: k3y, users: [{{username: u, password: p}}]}}\n"
        ),
        &out,
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let n = 100;
    let script = NODE_MODES.replace(
        "sharedKey: key }",
        "sharedKey: key, username: \"u\", password: \"p\" }",
    );
    let p = dir.path().join("tls.js");
    std::fs::write(&p, &script).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&p)
        .args([
            &port.to_string(),
            &n.to_string(),
            "PackedForward",
            "tls",
            "k3y",
        ])
        .env("NODE_PATH", clients().join("node/node_modules"))
        .env("FLUENT_TLS_DIR", &tls)
        .env("FLUENT_TLS_CLIENT", "1");
    let said = run_client(cmd, "node-tls", dir.path());
    assert!(said.contains(&format!("acked {n}")), "{said}");
    assert_once(&json_lines(&out), "tls", n);

    // Without a client certificate: refused by the TLS handshake.
    let mut cmd = Command::new("node");
    cmd.arg(&p)
        .args([&port.to_string(), "2", "Message", "nocert", "k3y"])
        .env("NODE_PATH", clients().join("node/node_modules"))
        .env("FLUENT_TLS_DIR", &tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    wait_child(&mut child, "node without a client certificate");
    let mut said = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(!said.contains("acked"), "{said}");
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "tls_handshake_failed"),
        1.0,
        true,
    );
    assert_eq!(json_lines(&out).len(), n);
}

#[test]
fn a_client_with_huge_chunk_ids_or_that_never_reads_its_acks_cannot_grow_the_agent() {
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let port = free_port();
    let cfg = config(dir.path(), port, "    idle_timeout_secs: 3\n", &out);
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--memory-limit".into(), "16MiB".into()],
            ..Default::default()
        },
    );
    // Chunk ids of 1 MiB, a hundred messages on each of two connections,
    // acks never read: refused at the first, the connection closed.
    let big = "c".repeat(1 << 20);
    let writers: Vec<_> = (0..2)
        .map(|k| {
            let big = big.clone();
            std::thread::spawn(move || {
                let mut s = connect(port);
                let mut sent = 0;
                for i in 0..100 {
                    if s.write_all(&msg("t.big", &format!("big-{k}-{i}"), Some(&big)))
                        .is_err()
                    {
                        break;
                    }
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    for w in writers {
        let sent = w.join().unwrap();
        assert!(
            sent < 100,
            "the connection was closed, {sent} messages written"
        );
    }
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "chunk_id_too_long"),
        2.0,
        false,
    );
    // A client that sends acknowledged chunks and never reads an answer:
    // stalled once its answers pile up, then disconnected and counted.
    let s = connect(port);
    let writer = {
        let mut s = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut batch = Vec::new();
            for i in 0..20_000 {
                batch.extend(msg(
                    "t.mute",
                    &format!("mute-{i}"),
                    Some(&format!("{i:024}")),
                ));
            }
            let mut rounds = 0;
            while s.write_all(&batch).is_ok() && rounds < 100 {
                rounds += 1;
            }
            rounds
        })
    };
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("fluent", "fwd", "acks_not_read"),
        1.0,
        false,
    );
    let rounds = writer.join().unwrap();
    assert!(
        rounds < 100,
        "the mute client was disconnected after {rounds} rounds"
    );
    s.shutdown(std::net::Shutdown::Both).ok();
    // Bounded all along: the limit plus what the agent itself needs.
    let peak = proc_rss(agent.pid(), true);
    assert!(
        peak < 120 << 20,
        "peak RSS {} MiB with a 16 MiB limit",
        peak >> 20
    );
    // Still serving.
    let mut s = connect(port);
    s.write_all(&msg("t.c", "after", Some("c-after"))).unwrap();
    let mut got = vec![0u8; ack("c-after").len()];
    s.set_read_timeout(Some(MEDIUM)).unwrap();
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, ack("c-after"));
}
