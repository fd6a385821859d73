#!/usr/bin/env python3
"""Memory of idle client connections on the receiving sources of issue 30.

One agent runs a `fluent`, a `beats` and a `splunk_hec` source (each into
a blackhole sink). For each source in turn, BENCH_CONNS connections (default
1000) are opened and kept; each first does what a real client does before
it idles (fluent: one Message-mode record; beats: one window of one event,
acknowledged; splunk_hec: one keep-alive POST of one event, answered), then
stays silent. The agent's RSS (VmRSS, after 2 s to settle) is read before
and after each source's connections; the row is the difference, in MB and
KB per connection. The connections stay open until the end, so each row
adds to the ones before it.

    bench/idle_conns.py
    BENCH_CONNS=2000 bench/idle_conns.py

Needs a release build (target/release/petrel); raises its own and the
agent's open-files limit to fit the connections.
"""

import json
import os
import resource
import shutil
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from petrel_bench import Petrel, proc_status_kb  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target/release/petrel"))
CONNS = int(os.environ.get("BENCH_CONNS", "1000"))
TOKEN = "idle-token"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def fluent_hello(s):
    # ["idle", 1700000000, {"message": "x"}] in msgpack.
    s.sendall(b"\x93\xa4idle\xce\x65\x53\xf1\x00\x81\xa7message\xa1x")


def beats_hello(s):
    doc = b'{"message":"x"}'
    s.sendall(b"2W" + struct.pack(">I", 1) + b"2J" + struct.pack(">II", 1, len(doc)) + doc)
    got = b""
    while len(got) < 6:
        b = s.recv(6 - len(got))
        if not b:
            sys.exit("idle_conns.py: beats closed before the ACK")
        got += b


def hec_hello(s):
    body = b'{"event":"x"}'
    s.sendall(b"POST /services/collector/event HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Splunk " + TOKEN.encode() + b"\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
        b = s.recv(4096)
        if not b:
            sys.exit("idle_conns.py: splunk_hec closed before answering")
        got += b


def main():
    if not os.path.exists(BIN):
        sys.exit(f"idle_conns.py: {BIN} is missing: cargo build --release -p petrel")
    need = 3 * CONNS + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, soft), max(need, hard)))
    work = tempfile.mkdtemp(prefix="petrel-bench-idle-")
    ports = {k: free_port() for k in ("fluent", "beats", "splunk_hec")}
    cfg = os.path.join(work, "idle.yaml")
    with open(cfg, "w") as f:
        f.write(f"""sources:
  - type: fluent
    address: 127.0.0.1:{ports['fluent']}
    max_connections: {CONNS + 10}
  - type: beats
    address: 127.0.0.1:{ports['beats']}
    max_connections: {CONNS + 10}
  - type: splunk_hec
    address: 127.0.0.1:{ports['splunk_hec']}
    max_connections: {CONNS + 10}
    tokens: [{TOKEN}]
sinks:
  - type: blackhole
""")
    # The agent inherits the raised limit.
    p = Petrel(BIN, cfg, os.path.join(work, "data"), "1", os.path.join(work, "petrel.log"))
    held = []
    rows = []
    try:
        time.sleep(2)
        before = proc_status_kb(p.pid, "VmRSS")
        start = before
        for name, hello in (("fluent", fluent_hello), ("beats", beats_hello),
                            ("splunk_hec", hec_hello)):
            for _ in range(CONNS):
                s = socket.create_connection(("127.0.0.1", ports[name]), 10)
                hello(s)
                held.append(s)
            time.sleep(2)
            after = proc_status_kb(p.pid, "VmRSS")
            rows.append((name, before, after))
            before = after
        m = p.metrics()
        conns = Petrel.total(m, "petrel_source_connections")
    finally:
        for s in held:
            s.close()
        p.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{CONNS} idle connections per source, one agent (--threads 1); "
          f"RSS at start {start / 1024:.1f} MB; open connections counted by the agent: {conns:.0f}\n")
    print("| source | RSS before MB | RSS after MB | added MB | KB per connection |")
    print("|---|---|---|---|---|")
    for name, b, a in rows:
        print(f"| {name} | {b / 1024:.1f} | {a / 1024:.1f} | {(a - b) / 1024:+.1f} | {(a - b) / CONNS:.1f} |")
    print(json.dumps({n: round((a - b) / 1024, 2) for n, b, a in rows}), file=sys.stderr)


if __name__ == "__main__":
    main()
