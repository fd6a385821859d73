#!/usr/bin/env python3
"""The aggregator role (issue 21): reading Kafka with the `kafka` source.

A single-node Kafka broker on this host (KRaft, from the jars of
scripts/fetch-kafka.sh) gets BENCH_RECORDS records of BENCH_RECORD_BYTES
bytes (default 2,000,000 of 200: single128 lines lengthened) in a topic of
12 partitions, written by Petrel itself (file → kafka sink, not measured). Then, BENCH_RUNS times (default 3), interleaved:

  kcat            kcat -C reading every partition to the end into /dev/null:
                  librdkafka alone, the raw limit of a consumer on this host
  file            petrel: kafka source → file sink ndjson on tmpfs (the
                  record with its kafka.* fields)
  file-text       the same with `encoding: text` (the values only)
  kafka           petrel: kafka source → kafka sink (text), at least once
  kafka-eos       the same with `exactly_once: true` (transactions that
                  commit the consumed offsets)

Each petrel run uses its own consumer group, so it reads from the start, and
ends when its sink has sent every record; its records/s are timed from the
first record sent to the last (joining a new group takes a few seconds that
an aggregator pays once, not per record). A row reports the median and
range of records/s, the reader's CPU seconds per million records (kcat's,
or the agent's), peak RSS (VmHWM) and the ratio of records/s to kcat's.
The broker's own CPU is not counted. `--threads 1` unless BENCH_THREADS;
the default `--memory-limit` unless BENCH_MEMORY_LIMIT.

    bench/aggregator.py
    BENCH_RECORDS=4000000 BENCH_RUNS=5 bench/aggregator.py
    BENCH_MEMORY_LIMIT=64MiB bench/aggregator.py

Comparing two builds in one session (issue 33; the machine is shared, so
only interleaved runs compare): PETREL_BASE_BIN names a second binary, run
right before the current one for every petrel row; each row then also
reports the ratios current/base of records/s, CPU and RSS (median, and the
range of the per-run-pair ratios). BENCH_KINDS selects rows (default
"kcat file file-text kafka kafka-eos"). BENCH_PROFILE=ci takes
target/ci/petrel (the test command's build) unless PETREL_BIN is set.
BENCH_SOURCE_EXTRA / BENCH_SINK_EXTRA are YAML lines appended to the
source / kafka sink entries (e.g. "    librdkafka: {fetch.max.bytes: '4194304'}").
BENCH_PERF=file profiles the current build's `file` runs with perf record -g
(bench/out/aggregator-file.perf.data; `perf report -i ... --no-children`).

    PETREL_BASE_BIN=/tmp/petrel-base BENCH_PROFILE=ci BENCH_KINDS="file kafka" bench/aggregator.py

Needs java (17+) and kcat (apt-get install kcat). Output also goes to
bench/out/aggregator.md.
"""

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.environ.get("BENCH_PROFILE", "release")
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target", PROFILE, "petrel"))
BASE_BIN = os.environ.get("PETREL_BASE_BIN", "")
KINDS = os.environ.get("BENCH_KINDS", "kcat file file-text kafka kafka-eos").split()
SOURCE_EXTRA = os.environ.get("BENCH_SOURCE_EXTRA", "")
SINK_EXTRA = os.environ.get("BENCH_SINK_EXTRA", "")
# Row kinds (e.g. "file kafka") whose current-build runs are profiled with
# `perf record -g` into bench/out/aggregator-<kind>.perf.data.
PERF = os.environ.get("BENCH_PERF", "")
RECORDS = int(os.environ.get("BENCH_RECORDS", "2000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
THREADS = os.environ.get("BENCH_THREADS", "1")
# --memory-limit of the measured agents; the agent's default when empty.
MEMORY_LIMIT = os.environ.get("BENCH_MEMORY_LIMIT", "")
# The record size: single128 lines lengthened to this many bytes.
RECORD_BYTES = int(os.environ.get("BENCH_RECORD_BYTES", "200"))
PARTITIONS = 12
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def hwm_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def metric(port, name, labels):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Agent:
    """`petrel run` on one pipeline file; stopped by `stop`."""

    def __init__(self, work, name, yaml, binary=None):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        cfg = os.path.join(d, f"{name}.yaml")
        with open(cfg, "w") as f:
            f.write(yaml)
        self.err = open(os.path.join(d, "err"), "w+")
        self.p = subprocess.Popen(
            [binary or BIN, "run", "--config", cfg, "--data-dir", os.path.join(d, "data"),
             "--threads", THREADS, "--api-addr", "127.0.0.1:0"]
            + (["--memory-limit", MEMORY_LIMIT] if MEMORY_LIMIT and name != "load" else []),
            stdout=subprocess.DEVNULL, stderr=self.err)
        self.name = name
        self.port = None
        for _ in range(600):
            self.err.seek(0)
            m = re.search(r"API listening on http://127.0.0.1:(\d+)", self.err.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.err.seek(0)
            sys.exit(f"aggregator.py: petrel did not start:\n{self.err.read()}")

    def wait_sent(self, n, timeout=900):
        """Waits until the sink sent `n` records; returns the seconds from
        the first record sent to the last (the group join, which takes
        seconds on a fresh group, left out)."""
        deadline = time.time() + timeout
        first = None
        while time.time() < deadline:
            sent = metric(self.port, "petrel_component_sent_events_total",
                          [("component_kind", "sink")])
            if first is None and sent > 0:
                first = (time.time(), sent)
            if sent >= n:
                t0, s0 = first
                # The records sent before the first sighting are credited
                # at the measured rate, so the span covers all n.
                span = time.time() - t0
                return span * n / max(n - s0, 1) if s0 < n else span
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        self.err.seek(0)
        sys.exit(f"aggregator.py: {self.name} did not send {n} records:\n{self.err.read()[-3000:]}")

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def start_broker(work):
    lib = os.path.join(ROOT, ".cache/kafka/lib")
    subprocess.run([os.path.join(ROOT, "scripts/fetch-kafka.sh")], check=True, stdout=sys.stderr)
    port, ctrl = free_port(), free_port()
    props = os.path.join(work, "server.properties")
    with open(props, "w") as f:
        f.write(f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{ctrl}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctrl}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={work}/kafka-data
num.partitions={PARTITIONS}
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
""")
    cp = f"{lib}/*"
    subprocess.run(["java", "-cp", cp, "kafka.tools.StorageTool", "format", "-t",
                    "petrel-bench-agg-01", "-c", props], check=True, stdout=subprocess.DEVNULL)
    log = open(os.path.join(work, "broker.log"), "w")
    broker = subprocess.Popen(["java", "-Xms512m", "-Xmx1g", "-cp", cp, "kafka.Kafka", props],
                              stdout=log, stderr=log)
    for _ in range(240):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            time.sleep(3)
            return broker, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    broker.kill()
    sys.exit("aggregator.py: Kafka did not start")


def lengthen(src, dst, size):
    """Copies single128 lines, each cut or padded (with its own text again)
    to `size` bytes before the newline."""
    with open(src, "rb") as i, open(dst, "wb") as o:
        for line in i:
            line = line.rstrip(b"\n")
            while len(line) < size:
                line += b" " + line
            o.write(line[:size] + b"\n")


def kafka_source(bs, group):
    return (f"sources:\n  - type: kafka\n    brokers: [\"{bs}\"]\n    topics: [bench-in]\n"
            f"    group_id: {group}\n" + (SOURCE_EXTRA + "\n" if SOURCE_EXTRA else ""))


def run_kcat(bs):
    t0 = time.time()
    r = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "kcat", "-C", "-b", bs, "-t", "bench-in",
                        "-o", "beginning", "-e", "-q", "-X", "enable.partition.eof=true"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    wall = time.time() - t0
    user, sys_, rss = r.stderr.strip().splitlines()[-1].split()
    return wall, float(user) + float(sys_), int(rss)


def run_petrel(work, bs, kind, i, binary=None, tag=""):
    group = f"bench-{kind}-{i}{tag}"
    i = f"{i}{tag}"
    out = os.path.join(work, f"{kind}-{i}.ndjson")
    sink = {
        "file": f"  - type: file\n    path: \"{out}\"\n    encoding: ndjson\n",
        "file-text": f"  - type: file\n    path: \"{out}\"\n    encoding: text\n",
        "kafka": f"  - type: kafka\n    brokers: [\"{bs}\"]\n    topic: out-{i}\n    encoding: text\n",
        "kafka-eos": f"  - type: kafka\n    brokers: [\"{bs}\"]\n    topic: eos-{i}\n    encoding: text\n"
                     f"    exactly_once: true\n",
    }[kind]
    if kind.startswith("kafka") and SINK_EXTRA:
        sink += SINK_EXTRA + "\n"
    a = Agent(work, f"{kind}-{i}", kafka_source(bs, group) + "sinks:\n" + sink, binary)
    perf = None
    if PERF and binary is None and kind in PERF.split():
        # The whole run of the current build's first `kind` reader.
        out_perf = os.path.join(ROOT, "bench/out", f"aggregator-{kind}.perf.data")
        os.makedirs(os.path.dirname(out_perf), exist_ok=True)
        perf = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-o", out_perf,
                                 "-p", str(a.p.pid)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    wall = a.wait_sent(RECORDS)
    if perf:
        perf.send_signal(signal.SIGINT)
        perf.wait(60)
    cpu, rss = cpu_seconds(a.p.pid), hwm_kb(a.p.pid)
    a.stop()
    if os.path.exists(out):
        os.unlink(out)
    return wall, cpu, rss


def main():
    global RECORDS
    if not shutil.which("kcat"):
        sys.exit("aggregator.py: kcat is missing (apt-get install kcat)")
    if not os.path.exists(BIN):
        cmd = (["cargo", "build", "--release", "-p", "petrel"] if PROFILE == "release"
               else ["cargo", "build", "--profile", PROFILE, "--workspace", "--locked"])
        subprocess.run(cmd, cwd=ROOT, check=True)
    work = tempfile.mkdtemp(prefix="petrel-agg.", dir="/dev/shm")
    broker = None
    try:
        broker, bs = start_broker(work)
        data = os.path.join(work, "in.log")
        size = RECORDS * 129
        subprocess.run([BIN, "gen", "--format", "single128", "--size", str(size), "--output", data + ".128"],
                       check=True, stdout=subprocess.DEVNULL)
        lengthen(data + ".128", data, RECORD_BYTES)
        os.unlink(data + ".128")
        lines = sum(1 for _ in open(data, "rb"))
        load = Agent(work, "load", f"sources:\n  - type: file\n    include: [\"{data}\"]\n    read_from: beginning\n"
                     f"sinks:\n  - type: kafka\n    brokers: [\"{bs}\"]\n    topic: bench-in\n    encoding: text\n")
        load.wait_sent(lines)
        load.stop()
        os.unlink(data)
        RECORDS = lines
        rows = {}
        for k in KINDS:
            if k != "kcat" and BASE_BIN:
                rows[k + " (base)"] = []
            rows[k] = []
        for i in range(RUNS):
            for kind in KINDS:
                if kind == "kcat":
                    rows["kcat"].append(run_kcat(bs))
                    continue
                if BASE_BIN:
                    rows[kind + " (base)"].append(run_petrel(work, bs, kind, i, BASE_BIN, "b"))
                rows[kind].append(run_petrel(work, bs, kind, i))
                print(f"run {i} {kind}: " + (f"base {rows[kind + ' (base)'][-1]} " if BASE_BIN else "")
                      + f"current {rows[kind][-1]}", file=sys.stderr)
        out = [f"{RECORDS} records of {RECORD_BYTES} bytes (single128 lengthened) in {PARTITIONS} partitions, {RUNS} runs, median [range], --threads {THREADS}, --memory-limit {MEMORY_LIMIT or 'default'}", "",
               "| reader | records/s | CPU s per million | peak RSS MB | records/s vs kcat |"
               + (" current/base: records/s, CPU, RSS (median [range of run pairs]) |" if BASE_BIN else ""),
               "|---|---|---|---|---|" + ("---|" if BASE_BIN else "")]
        base = (statistics.median(RECORDS / w for w, _, _ in rows["kcat"])
                if rows.get("kcat") else None)

        def ratios(cur, old, f):
            r = [f(c) / f(o) for c, o in zip(cur, old)]
            return f"{statistics.median(r):.2f} [{min(r):.2f}–{max(r):.2f}]"

        for kind, rs in rows.items():
            rate = [RECORDS / w for w, _, _ in rs]
            cpu = [c / RECORDS * 1e6 for _, c, _ in rs]
            rss = [r / 1024 for _, _, r in rs]
            line = (f"| {kind} | {statistics.median(rate):,.0f} [{min(rate):,.0f}–{max(rate):,.0f}] "
                    f"| {statistics.median(cpu):.2f} [{min(cpu):.2f}–{max(cpu):.2f}] "
                    f"| {statistics.median(rss):.0f} [{min(rss):.0f}–{max(rss):.0f}] "
                    + (f"| {statistics.median(rate) / base:.2f} |" if base else "| – |"))
            if BASE_BIN:
                old = rows.get(kind + " (base)")
                if old and kind != "kcat" and not kind.endswith("(base)"):
                    line += (f" {ratios(rs, old, lambda x: 1 / x[0])}, {ratios(rs, old, lambda x: x[1])},"
                             f" {ratios(rs, old, lambda x: x[2])} |")
                else:
                    line += " |"
            out.append(line)
        text = "\n".join(out)
        print(text)
        os.makedirs(os.path.join(ROOT, "bench/out"), exist_ok=True)
        with open(os.path.join(ROOT, "bench/out/aggregator.md"), "w") as f:
            f.write(text + "\n")
    finally:
        if broker:
            broker.terminate()
            try:
                broker.wait(30)
            except subprocess.TimeoutExpired:
                broker.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
