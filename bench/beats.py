#!/usr/bin/env python3
"""The `beats` source (Lumberjack v2): windows of 2048 compressed events.

Rows, BENCH_RUNS times each (default 3), interleaved:

  raw      a client process sends pre-built windows (BENCH_WINDOW events,
           default 2048, each a Filebeat-shaped JSON document of about
           BENCH_EVENT_BYTES bytes, default 250, the window zlib-compressed
           at level 3 as Filebeat does, all built before the clock starts)
           with up to BENCH_INFLIGHT windows unacknowledged (default 2, as
           Filebeat's `pipelining: 2`) into a process that reads and answers
           each window's ACK without decoding it: the client's own rate,
           the limit of this client on this host
  petrel   the same client into petrel: beats source (memory buffer) ->
           file sink (ndjson on /dev/shm when it exists)
  tst-send go-lumber's own tst-send (`-batch 2048 -compress 3 -pipeline 2`,
           from scripts/install-beats-clients.sh; it JSON-encodes and
           compresses each window itself) into the same pipeline for
           BENCH_SECONDS (default 10): what Elastic's client reaches

A petrel row is timed from the first event the sink wrote to the last (the
tst-send row over its fixed time); it reports events/s, the agent's CPU
seconds per million events, its peak RSS (VmHWM) and the ratio to the raw
row. `--threads 1` unless BENCH_THREADS.

    bench/beats.py
    BENCH_EVENTS=4000000 BENCH_RUNS=5 bench/beats.py

Needs a release build (target/release/petrel).
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from petrel_bench import Petrel, proc_cpu_seconds, proc_status_kb  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target/release/petrel"))
EVENTS = int(os.environ.get("BENCH_EVENTS", "2000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "2048"))
EVENT_BYTES = int(os.environ.get("BENCH_EVENT_BYTES", "250"))
INFLIGHT = int(os.environ.get("BENCH_INFLIGHT", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
THREADS = os.environ.get("BENCH_THREADS", "1")
TST_SEND = os.path.join(ROOT, ".cache/beats-clients/bin/tst-send")

# The client: its own process (its CPU is not the agent's). Prints the
# seconds it spent sending and the bytes of events it sent.
CLIENT = r'''
import json, socket, struct, sys, time, zlib
port, events, window, size, inflight = map(int, sys.argv[1:6])
def doc(i):
    d = {"@timestamp": "2026-11-27T10:00:00.000Z",
         "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.15.0"},
         "log": {"offset": i, "file": {"path": "/var/log/app.log"}},
         "message": ""}
    pad = size - len(json.dumps(d, separators=(",", ":")))
    d["message"] = ("event %d " % i).ljust(max(pad, 8), "x")
    return json.dumps(d, separators=(",", ":")).encode()
windows = []
n = 0
payload = 0
while n < events:
    m = min(window, events - n)
    frames = bytearray()
    for i in range(m):
        b = doc(n + i)
        payload += len(b)
        frames += b"2J" + struct.pack(">II", i + 1, len(b)) + b
    z = zlib.compress(bytes(frames), 3)
    windows.append((m, b"2W" + struct.pack(">I", m) + b"2C" + struct.pack(">I", len(z)) + z))
    n += m
c = socket.create_connection(("127.0.0.1", port))
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
pending = []
buf = b""
def await_one():
    global buf
    want = pending.pop(0)
    while True:
        while len(buf) < 6:
            got = c.recv(4096)
            if not got:
                sys.exit("closed before an ACK")
            buf += got
        seq = struct.unpack(">I", buf[2:6])[0]
        buf = buf[6:]
        if seq == want:
            return
t0 = time.perf_counter()
for m, w in windows:
    if len(pending) >= inflight:
        await_one()
    c.sendall(w)
    pending.append(m)
while pending:
    await_one()
t1 = time.perf_counter()
c.close()
print(t1 - t0, payload, flush=True)
'''

# Reads and answers each window's ACK from the frame headers alone.
RAW = r'''
import socket, struct, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
buf = bytearray()
while True:
    got = c.recv(1 << 20)
    if not got:
        break
    buf += got
    while len(buf) >= 12:
        n = struct.unpack(">I", buf[2:6])[0]
        z = struct.unpack(">I", buf[8:12])[0]
        if len(buf) < 12 + z:
            break
        del buf[:12 + z]
        c.sendall(b"2A" + struct.pack(">I", n))
'''


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def client(port):
    p = subprocess.run([sys.executable, "-c", CLIENT, str(port), str(EVENTS), str(WINDOW),
                        str(EVENT_BYTES), str(INFLIGHT)],
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"beats.py: the client failed: {p.stderr}")
    secs, payload = p.stdout.split()
    return float(secs), int(payload)


def run_raw(work):
    sink = subprocess.Popen([sys.executable, "-c", RAW], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    secs, payload = client(port)
    sink.wait(60)
    return {"rate": EVENTS / secs, "mbs": payload / secs / 1e6}


def start_petrel(work, name):
    d = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
    out_dir = "/dev/shm" if os.path.isdir("/dev/shm") else d
    out = tempfile.mktemp(prefix="petrel-bench-beats-", suffix=".ndjson", dir=out_dir)
    port = free_port()
    cfg = os.path.join(d, "beats.yaml")
    with open(cfg, "w") as f:
        f.write(f"""sources:
  - type: beats
    address: 127.0.0.1:{port}
sinks:
  - type: file
    path: {out}
    encoding: ndjson
""")
    p = Petrel(BIN, cfg, os.path.join(d, "data"), THREADS, os.path.join(d, "petrel.log"))
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.05)
    return p, port, out


def sent(p):
    return Petrel.total(p.metrics(), "petrel_component_sent_events_total", component_kind="sink")


def run_petrel(work):
    p, port, out = start_petrel(work, "petrel")
    cpu0 = proc_cpu_seconds(p.pid)
    res = {}
    t = threading.Thread(target=lambda: res.update(c=client(port)))
    t.start()
    first = None
    deadline = time.time() + 1800
    n = 0
    while time.time() < deadline:
        n = sent(p)
        if n > 0 and first is None:
            first = time.perf_counter()
        if n >= EVENTS:
            break
        time.sleep(0.01)
    last = time.perf_counter()
    cpu = proc_cpu_seconds(p.pid) - cpu0
    hwm = proc_status_kb(p.pid, "VmHWM")
    t.join()
    p.stop()
    with open(out, "rb") as f:
        lines = sum(1 for _ in f)
    os.unlink(out)
    if lines != EVENTS:
        sys.exit(f"beats.py: {lines} events in the file, sent {EVENTS}")
    return {"rate": EVENTS / (last - first), "cpu_per_m": cpu / EVENTS * 1e6,
            "hwm_mb": hwm / 1024}


def tst_acked(http):
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/debug/vars", timeout=5) as r:
        return json.load(r)["ACKed"]


def run_tst_send(work):
    p, port, out = start_petrel(work, "tst")
    http = free_port()
    c = subprocess.Popen([TST_SEND, "-c", f"127.0.0.1:{port}", "-batch", str(WINDOW),
                          "-compress", "3", "-pipeline", "2", "-httpprof", f"127.0.0.1:{http}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Warm up: the first window acknowledged.
        for _ in range(600):
            try:
                if tst_acked(http) > 0:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        n0, cpu0, t0 = sent(p), proc_cpu_seconds(p.pid), time.perf_counter()
        time.sleep(SECONDS)
        n1, cpu1, t1 = sent(p), proc_cpu_seconds(p.pid), time.perf_counter()
        hwm = proc_status_kb(p.pid, "VmHWM")
    finally:
        c.kill()
        c.wait()
    p.stop()
    os.unlink(out)
    n = n1 - n0
    return {"rate": n / (t1 - t0), "cpu_per_m": (cpu1 - cpu0) / max(n, 1) * 1e6,
            "hwm_mb": hwm / 1024}


def med(rows, k):
    v = [r[k] for r in rows]
    return statistics.median(v), min(v), max(v)


def main():
    if not os.path.exists(BIN):
        sys.exit(f"beats.py: {BIN} is missing: cargo build --release -p petrel")
    have_tst = os.path.exists(TST_SEND)
    work = tempfile.mkdtemp(prefix="petrel-bench-beats-")
    rows = {"raw": [], "petrel": [], "tst-send": []}
    try:
        for _ in range(RUNS):
            rows["raw"].append(run_raw(work))
            rows["petrel"].append(run_petrel(work))
            if have_tst:
                rows["tst-send"].append(run_tst_send(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = med(rows["raw"], "rate")[0]
    print(f"{EVENTS} events of ~{EVENT_BYTES} bytes, windows of {WINDOW} (zlib 3), "
          f"{INFLIGHT} in flight, {RUNS} runs, --threads {THREADS}\n")
    print("| run | events/s | CPU s per million | peak RSS MB | of raw |")
    print("|---|---|---|---|---|")
    r = med(rows["raw"], "rate")
    print(f"| raw (client → read and ACK) | {r[0]:,.0f} ({r[1]:,.0f}–{r[2]:,.0f}) | — | — | 1.00x |")
    for name in ("petrel", "tst-send"):
        if not rows[name]:
            print(f"| {name} | not run (scripts/install-beats-clients.sh) | | | |")
            continue
        r, c, h = med(rows[name], "rate"), med(rows[name], "cpu_per_m"), med(rows[name], "hwm_mb")
        print(f"| {name} | {r[0]:,.0f} ({r[1]:,.0f}–{r[2]:,.0f}) | {c[0]:.2f} ({c[1]:.2f}–{c[2]:.2f}) "
              f"| {h[0]:.0f} ({h[1]:.0f}–{h[2]:.0f}) | {r[0] / raw:.2f}x |")


if __name__ == "__main__":
    main()
