#!/usr/bin/env python3
"""The `fluent` source (Forward protocol): PackedForward over one connection.

A client writes pre-encoded PackedForward messages (BENCH_CHUNK entries of
BENCH_RECORD_BYTES-byte records each, default 1000 of 200: a record
`{"message": <text>}` whose msgpack entry `[time, record]` is that many
bytes) as fast as it can, BENCH_RECORDS records in all (default 2,000,000).
BENCH_RUNS times (default 3), interleaved:

  raw      the client into a process that reads and discards: the client's
           own send rate, the raw limit of one connection on this host
  petrel   the client into petrel: fluent source (memory buffer) -> file
           sink (ndjson on /dev/shm when it exists)
  petrel-ack  the same with a `chunk` option on each message, the client
           waiting for each ack before the next message (Fluent Bit's
           `Require_ack_response`, one chunk in flight)

A petrel row is timed from the first record the sink wrote to the last;
it reports records/s, MB/s of records, the agent's CPU seconds per million
records, peak RSS (VmHWM), and the ratio to the raw client's rate.
`--threads 1` unless BENCH_THREADS.

    bench/fluent.py
    BENCH_RECORDS=4000000 BENCH_RUNS=5 bench/fluent.py

Needs `scripts/install-fluent-clients.sh` (msgpack in
.cache/fluent-clients/venv) and a release build (target/release/petrel).
"""

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target/release/petrel"))
RECORDS = int(os.environ.get("BENCH_RECORDS", "2000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
CHUNK = int(os.environ.get("BENCH_CHUNK", "1000"))
RECORD_BYTES = int(os.environ.get("BENCH_RECORD_BYTES", "200"))
THREADS = os.environ.get("BENCH_THREADS", "1")
VENV_PY = os.path.join(ROOT, ".cache/fluent-clients/venv/bin/python")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The client: its own process (so that its CPU is not the agent's), with
# every message encoded before the clock starts.
CLIENT = r'''
import socket, sys, time, msgpack
port, records, chunk, size, acked = map(int, sys.argv[1:6])
def entry(i):
    base = msgpack.packb([1700000000, {"message": ""}])
    text = ("record %d " % i).ljust(size - len(base) - 3, "x")
    e = msgpack.packb([1700000000, {"message": text}])
    return e
msgs = []
n = 0
k = 0
while n < records:
    m = min(chunk, records - n)
    body = b"".join(entry(n + i) for i in range(m))
    opt = {"chunk": "c%d" % k} if acked else {"size": m}
    msgs.append(msgpack.packb(["bench.fluent", body, opt], use_bin_type=True))
    n += m
    k += 1
payload = sum(len(x) for x in msgs)
c = socket.create_connection(("127.0.0.1", port))
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
u = msgpack.Unpacker(raw=False)
t0 = time.perf_counter()
for i, x in enumerate(msgs):
    c.sendall(x)
    if acked:
        while True:
            got = c.recv(256)
            if not got:
                sys.exit("closed before an ack")
            u.feed(got)
            if any(True for _ in u):
                break
t1 = time.perf_counter()
c.shutdown(socket.SHUT_WR)
c.recv(1)
c.close()
print(t1 - t0, payload, flush=True)
'''

SINK = r'''
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
buf = bytearray(1 << 20)
while c.recv_into(buf):
    pass
c.close()
'''


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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def client(port, acked, work):
    p = subprocess.run([VENV_PY, "-c", CLIENT, str(port), str(RECORDS), str(CHUNK),
                        str(RECORD_BYTES), "1" if acked else "0"],
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"fluent.py: the client failed: {p.stderr}")
    secs, payload = p.stdout.split()
    return float(secs), int(payload)


def run_raw(work):
    sink = subprocess.Popen([VENV_PY, "-c", SINK], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    secs, payload = client(port, False, work)
    sink.wait(60)
    return {"rate": RECORDS / secs, "mbs": payload / secs / 1e6}


def run_petrel(work, name, acked):
    d = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
    out_dir = "/dev/shm" if os.path.isdir("/dev/shm") else d
    out = tempfile.mktemp(prefix="petrel-bench-fluent-", suffix=".ndjson", dir=out_dir)
    port = free_port()
    cfg = os.path.join(d, "fluent.yaml")
    with open(cfg, "w") as f:
        f.write(f"""sources:
  - type: fluent
    address: 127.0.0.1:{port}
sinks:
  - type: file
    path: {out}
    encoding: ndjson
""")
    err = open(os.path.join(d, "err"), "w+")
    p = subprocess.Popen([BIN, "run", "--config", cfg, "--data-dir", os.path.join(d, "data"),
                          "--threads", THREADS, "--api-addr", "127.0.0.1:0"],
                         stdout=subprocess.DEVNULL, stderr=err)
    api = None
    for _ in range(600):
        err.seek(0)
        m = re.search(r"API listening on http://127.0.0.1:(\d+)", err.read())
        if m:
            api = int(m.group(1))
            break
        time.sleep(0.05)
    if api is None:
        err.seek(0)
        sys.exit(f"fluent.py: petrel did not start:\n{err.read()}")
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.05)
    cpu0 = cpu_seconds(p.pid)
    import threading
    res = {}
    t = threading.Thread(target=lambda: res.update(c=client(port, acked, work)))
    t.start()
    first = None
    deadline = time.time() + 1800
    while time.time() < deadline:
        sent = metric(api, "petrel_component_sent_events_total", [("component_kind", "sink")])
        if first is None and sent > 0:
            first = (time.time(), sent)
        if sent >= RECORDS:
            break
        if p.poll() is not None:
            err.seek(0)
            sys.exit(f"fluent.py: petrel exited:\n{err.read()[-3000:]}")
        time.sleep(0.02)
    else:
        sys.exit("fluent.py: the sink did not write every record")
    t0, s0 = first
    span = time.time() - t0
    span = span * RECORDS / max(RECORDS - s0, 1) if s0 < RECORDS else span
    cpu = cpu_seconds(p.pid) - cpu0
    hwm = hwm_kb(p.pid)
    t.join()
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    with open(out, "rb") as f:
        lines = sum(1 for _ in f)
    os.unlink(out)
    if lines != RECORDS:
        sys.exit(f"fluent.py: {name}: {lines} lines written, {RECORDS} sent")
    return {"rate": RECORDS / span, "mbs": RECORDS * RECORD_BYTES / span / 1e6,
            "cpu": cpu / RECORDS * 1e6, "rss": hwm / 1024}


def fmt(xs, f="{:,.0f}"):
    m = statistics.median(xs)
    return f"{f.format(m)} ({f.format(min(xs))}–{f.format(max(xs))})"


def main():
    if not os.path.exists(VENV_PY):
        sys.exit("fluent.py: run scripts/install-fluent-clients.sh first")
    if not os.path.exists(BIN):
        sys.exit(f"fluent.py: build first: cargo build --release -p petrel ({BIN})")
    work = tempfile.mkdtemp(prefix="petrel-bench-fluent-")
    rows = {"raw": [], "petrel": [], "petrel-ack": []}
    for run in range(RUNS):
        rows["raw"].append(run_raw(work))
        rows["petrel"].append(run_petrel(work, "petrel", False))
        rows["petrel-ack"].append(run_petrel(work, "petrel-ack", True))
        print(f"run {run + 1}/{RUNS}: " + ", ".join(
            f"{k} {v[-1]['rate']:,.0f}/s" for k, v in rows.items()), file=sys.stderr)
    raw = statistics.median(r["rate"] for r in rows["raw"])
    out = [f"{RECORDS:,} records of {RECORD_BYTES} bytes, PackedForward chunks of {CHUNK}, "
           f"one connection, --threads {THREADS}, median (min–max) of {RUNS} runs", "",
           "| run | records/s | MB/s | CPU s per million | peak RSS MB | of raw |",
           "|---|---|---|---|---|---|"]
    for k, v in rows.items():
        rate = [r["rate"] for r in v]
        mbs = [r["mbs"] for r in v]
        cpu = [r["cpu"] for r in v] if "cpu" in v[0] else None
        rss = [r["rss"] for r in v] if "rss" in v[0] else None
        out.append(f"| {k} | {fmt(rate)} | {fmt(mbs, '{:,.1f}')} | "
                   f"{fmt(cpu, '{:.2f}') if cpu else '—'} | {fmt(rss, '{:.0f}') if rss else '—'} | "
                   f"{statistics.median(rate) / raw:.2f}x |")
    text = "\n".join(out)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench/out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench/out/fluent.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
