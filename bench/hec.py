#!/usr/bin/env python3
"""The `splunk_hec` source: 100-event JSON batches over keep-alive
connections into a file sink (ndjson, on tmpfs when /dev/shm exists).

BENCH_CLIENTS client processes (default 2) each keep one HTTP/1.1
connection open and POST the same pre-built body of 100 HEC events
(`{"event":{...},"time":...,"host":...,"sourcetype":...}` concatenated,
about 190 bytes each) until BENCH_EVENTS events (default 2,000,000) were
answered `{"code":0}`. Rows, BENCH_RUNS times each (default 3), interleaved:

  hec        petrel: splunk_hec source → file sink
  hec-ack    the same with `ack: {enabled: true}` (ack ids issued, not queried)
  http       petrel: the `http` source (ndjson body of the same objects)
             → file sink, the in-house reference for the same bytes

A row reports the agent's events/s (first answer to the last event written
by the sink), its CPU seconds per million events, its peak RSS (VmHWM), and
the clients' own rate (events answered per second of sending). Petrel runs
with `--threads 1` unless BENCH_THREADS.

    bench/hec.py
    BENCH_EVENTS=4000000 BENCH_RUNS=5 bench/hec.py
"""

import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from petrel_bench import Petrel, proc_cpu_seconds, proc_status_kb  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target/release/petrel"))
EVENTS = int(os.environ.get("BENCH_EVENTS", "2000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "2"))
THREADS = os.environ.get("BENCH_THREADS", "1")
BATCH = 100
TOKEN = "bench-token"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def hec_body():
    now = time.time()
    return "".join(
        json.dumps({
            "time": round(now + i / 1000, 3),
            "host": "web-%d" % (i % 8),
            "source": "/var/log/app.log",
            "sourcetype": "app:json",
            "event": {"message": "GET /api/v1/items/%d 200 in %d ms" % (i, i % 97),
                      "level": "info", "user": "u%04d" % i},
        }, separators=(",", ":"))
        for i in range(BATCH)
    ).encode()


def http_body():
    now = time.time()
    return "".join(
        json.dumps({
            "timestamp": round(now + i / 1000, 3),
            "host": "web-%d" % (i % 8),
            "source": "/var/log/app.log",
            "sourcetype": "app:json",
            "message": "GET /api/v1/items/%d 200 in %d ms" % (i, i % 97),
            "level": "info", "user": "u%04d" % i,
        }, separators=(",", ":")) + "\n"
        for i in range(BATCH)
    ).encode()


def client(port, path, headers, body, requests, out):
    """POSTs `body` `requests` times on one connection; puts
    (answered events, first answer, last answer) on `out`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    ok = 0
    first = last = None
    for _ in range(requests):
        while True:
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            data = r.read()
            if r.status == 200:
                break
            if r.status != 503:
                raise SystemExit(f"answer {r.status}: {data[:200]!r}")
            time.sleep(0.01)
        now = time.monotonic()
        first = first or now
        last = now
        ok += BATCH
    conn.close()
    out.put((ok, first, last))


def run(kind, workdir):
    port = free_port()
    sink = os.path.join(workdir, f"{kind}.ndjson")
    if kind.startswith("hec"):
        src = (f"  - type: splunk_hec\n    address: 127.0.0.1:{port}\n"
               f"    tokens: [\"{TOKEN}\"]\n"
               + ("    ack: { enabled: true, max_pending_acks_per_channel: 100000 }\n"
                  if kind == "hec-ack" else ""))
        path, body = "/services/collector/event", hec_body()
        headers = {"Authorization": f"Splunk {TOKEN}", "Content-Type": "application/json"}
        if kind == "hec-ack":
            headers["X-Splunk-Request-Channel"] = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
    else:
        src = f"  - type: http\n    address: 127.0.0.1:{port}\n    path: /ingest\n"
        path, body = "/ingest", http_body()
        headers = {"Content-Type": "application/x-ndjson"}
    cfg = os.path.join(workdir, f"{kind}.yaml")
    with open(cfg, "w") as f:
        f.write(f"sources:\n{src}sinks:\n  - type: file\n    path: {sink}\n    encoding: ndjson\n")
    data = os.path.join(workdir, f"data-{kind}")
    shutil.rmtree(data, ignore_errors=True)
    p = Petrel(BIN, cfg, data, THREADS, os.path.join(workdir, f"{kind}.log"))
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        cpu0 = proc_cpu_seconds(p.pid)
        requests = EVENTS // BATCH // CLIENTS
        total = requests * BATCH * CLIENTS
        q = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=client, args=(port, path, headers, body, requests, q))
                 for _ in range(CLIENTS)]
        t0 = time.monotonic()
        for c in procs:
            c.start()
        answers = [q.get(timeout=600) for _ in procs]
        for c in procs:
            c.join(60)
            if c.exitcode != 0:
                raise SystemExit(f"a client failed ({c.exitcode})")
        sent = sum(a[0] for a in answers)
        c_first = min(a[1] for a in answers)
        c_last = max(a[2] for a in answers)
        deadline = time.monotonic() + 600
        while True:
            out = p.total(p.metrics(), "petrel_component_sent_events_total", component_kind="sink")
            if out >= total:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{kind}: the sink wrote {out} of {total}")
            time.sleep(0.02)
        t_end = time.monotonic()
        cpu = proc_cpu_seconds(p.pid) - cpu0
        rss_mb = proc_status_kb(p.pid, "VmHWM") / 1024
        status, _ = p.stop()
        if status != 0:
            raise SystemExit(f"{kind}: petrel exited {status}")
        return {
            "kind": kind,
            "events_per_s": total / (t_end - t0),
            "cpu_s_per_million": cpu / (total / 1e6),
            "peak_rss_mb": rss_mb,
            "client_events_per_s": sent / max(c_last - c_first, 1e-9),
        }
    finally:
        p.kill()
        for f in (sink,):
            try:
                os.unlink(f)
            except OSError:
                pass


def main():
    if not os.path.exists(BIN):
        sys.exit(f"no petrel at {BIN}; cargo build --release -p petrel")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workdir = tempfile.mkdtemp(prefix="petrel-bench-hec-", dir=base)
    rows = {}
    try:
        for _ in range(RUNS):
            for kind in ("hec", "hec-ack", "http"):
                r = run(kind, workdir)
                print(json.dumps(r), file=sys.stderr)
                rows.setdefault(kind, []).append(r)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"| row | events/s (median, range) | CPU s / M events | peak RSS MB | client events/s |")
    print("|---|---|---|---|---|")
    for kind, rs in rows.items():
        eps = [r["events_per_s"] for r in rs]
        print(f"| {kind} | {statistics.median(eps)/1e3:.0f} k ({min(eps)/1e3:.0f}–{max(eps)/1e3:.0f} k) "
              f"| {statistics.median(r['cpu_s_per_million'] for r in rs):.2f} "
              f"| {max(r['peak_rss_mb'] for r in rs):.0f} "
              f"| {statistics.median(r['client_events_per_s'] for r in rs)/1e3:.0f} k |")


if __name__ == "__main__":
    main()
