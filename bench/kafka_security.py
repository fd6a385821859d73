#!/usr/bin/env python3
"""What TLS and SASL cost Kafka (issue 43): one broker (Kafka 3.9.1 from
scripts/fetch-kafka.sh) with a PLAINTEXT listener and a SASL_SSL listener
with SCRAM-SHA-512 (certificates made with openssl and keytool, the SCRAM
user added when the storage is formatted). BENCH_RECORDS records of
BENCH_RECORD_BYTES (200) bytes; then BENCH_RUNS times (default 3),
interleaved, each row on the same broker:

  sink-plain    petrel: file → kafka sink over PLAINTEXT
  sink-scram    petrel: file → kafka sink over SASL_SSL (SCRAM-SHA-512)
  source-plain  petrel: kafka source → file sink (tmpfs) over PLAINTEXT
  source-scram  petrel: kafka source → file sink over SASL_SSL

Each row: seconds, records/s, the agent's CPU seconds (utime + stime from
/proc) per million records; then each SASL_SSL row's CPU per record against
PLAINTEXT's (target: at most 1.3x).

    BENCH_PROFILE=ci BENCH_RECORDS=1000000 bench/kafka_security.py
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aggregator as agg  # noqa: E402  (the broker, Agent and CPU helpers)

RECORDS = int(os.environ.get("BENCH_RECORDS", "1000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
RECORD_BYTES = int(os.environ.get("BENCH_RECORD_BYTES", "200"))
PASSWORD = "bench-secret"


def sh(args, cwd):
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pki(d):
    os.makedirs(d, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh(["openssl", "req", "-x509", *ec, "-days", "30", "-subj", "/CN=bench-ca",
        "-keyout", "ca.key", "-out", "ca.pem"], d)
    sh(["openssl", "req", "-new", *ec, "-subj", "/CN=127.0.0.1", "-addext",
        "subjectAltName=IP:127.0.0.1", "-keyout", "broker.key", "-out", "broker.csr"], d)
    sh(["openssl", "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-set_serial", "0x10", "-days", "30", "-copy_extensions", "copy", "-out", "broker.pem"], d)
    sh(["openssl", "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
        "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12", "-passout", "pass:bench"], d)
    return os.path.join(d, "ca.pem"), os.path.join(d, "broker.p12")


def start_broker(work):
    lib = os.path.join(agg.ROOT, ".cache/kafka/lib")
    subprocess.run([os.path.join(agg.ROOT, "scripts/fetch-kafka.sh")], check=True, stdout=sys.stderr)
    ca, keystore = pki(os.path.join(work, "pki"))
    port, scram, ctrl = agg.free_port(), agg.free_port(), agg.free_port()
    props = os.path.join(work, "server.properties")
    with open(props, "w") as f:
        f.write(f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{ctrl}
listeners=PLAINTEXT://127.0.0.1:{port},SCRAM://127.0.0.1:{scram},CONTROLLER://127.0.0.1:{ctrl}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SCRAM://127.0.0.1:{scram}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SCRAM:SASL_SSL,CONTROLLER:PLAINTEXT
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password=bench
ssl.key.password=bench
listener.name.scram.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.scram.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
log.dirs={work}/kafka-data
num.partitions={agg.PARTITIONS}
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
""")
    cp = f"{lib}/*"
    subprocess.run(["java", "-cp", cp, "kafka.tools.StorageTool", "format", "-t",
                    "petrel-bench-sec-01", "-c", props, "--add-scram",
                    f"SCRAM-SHA-512=[name=petrel,password={PASSWORD}]"],
                   check=True, stdout=subprocess.DEVNULL)
    log = open(os.path.join(work, "broker.log"), "w")
    broker = subprocess.Popen(["java", "-Xms512m", "-Xmx1g", "-cp", cp, "kafka.Kafka", props],
                              stdout=log, stderr=log)
    for _ in range(240):
        try:
            agg.socket.create_connection(("127.0.0.1", scram), 1).close()
            time.sleep(3)
            return broker, port, scram, ca
        except OSError:
            time.sleep(0.5)
    broker.kill()
    sys.exit("kafka_security.py: Kafka did not start")


def security(kind, ca):
    if kind.endswith("scram"):
        return (f"    tls: {{ca_file: \"{ca}\"}}\n"
                f"    sasl: {{mechanism: SCRAM-SHA-512, username: petrel, password: {PASSWORD}}}\n")
    return ""


def run(work, kind, i, ports, ca, data):
    port = ports[kind.split("-")[1]]
    bs = f"127.0.0.1:{port}"
    sec = security(kind, ca)
    if kind.startswith("sink"):
        yaml = (f"sources:\n  - type: file\n    include: [\"{data}\"]\n    read_from: beginning\n"
                f"sinks:\n  - type: kafka\n    brokers: [\"{bs}\"]\n    topic: {kind}-{i}\n"
                f"    encoding: text\n{sec}")
    else:
        out = os.path.join("/dev/shm", f"petrel-sec-{os.getpid()}-{kind}-{i}.out")
        yaml = (f"sources:\n  - type: kafka\n    brokers: [\"{bs}\"]\n    topics: [bench-in]\n"
                f"    group_id: {kind}-{i}\n{sec}"
                f"sinks:\n  - type: file\n    path: \"{out}\"\n    encoding: text\n")
    a = agg.Agent(work, f"{kind}-{i}", yaml)
    secs = a.wait_sent(RECORDS)
    cpu = agg.cpu_seconds(a.p.pid)
    a.stop()
    if kind.startswith("source"):
        os.remove(out)
    return secs, cpu


def main():
    work = tempfile.mkdtemp(prefix="petrel-bench-sec-")
    broker, plain, scram, ca = start_broker(work)
    ports = {"plain": plain, "scram": scram}
    try:
        data = os.path.join(work, "records.log")
        with open(data, "w") as f:
            pad = "x" * (RECORD_BYTES - 12)
            for i in range(RECORDS):
                f.write(f"{i:010d} {pad}\n")
        load = agg.Agent(work, "load",
                         f"sources:\n  - type: file\n    include: [\"{data}\"]\n    read_from: beginning\n"
                         f"sinks:\n  - type: kafka\n    brokers: [\"127.0.0.1:{plain}\"]\n    topic: bench-in\n"
                         f"    encoding: text\n")
        load.wait_sent(RECORDS)
        load.stop()
        kinds = ["sink-plain", "sink-scram", "source-plain", "source-scram"]
        rows = {k: [] for k in kinds}
        for i in range(RUNS):
            for k in kinds:
                rows[k].append(run(work, k, i, ports, ca, data))
        lines = [f"{RECORDS} records of {RECORD_BYTES} B, {RUNS} interleaved runs, median",
                 "", "| row | s | records/s | CPU s per 1M records |", "|---|---|---|---|"]
        med = {}
        for k in kinds:
            s = statistics.median(r[0] for r in rows[k])
            c = statistics.median(r[1] for r in rows[k]) / RECORDS * 1e6
            med[k] = c
            lines.append(f"| {k} | {s:.2f} | {RECORDS / s:,.0f} | {c:.2f} |")
        lines.append("")
        for side in ["sink", "source"]:
            ratio = med[f"{side}-scram"] / med[f"{side}-plain"]
            lines.append(f"{side}: SASL_SSL (SCRAM) / PLAINTEXT CPU per record = {ratio:.2f}x "
                         f"(target <= 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})")
        print("\n".join(lines))
    finally:
        broker.kill()
        broker.wait()
        agg.shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
