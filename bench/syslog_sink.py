#!/usr/bin/env python3
"""The `syslog` sink over TCP into rsyslog.

Input: BENCH_LINES lines of the single128 data set (`petrel gen`, default
2,000,000), read by a file source from the beginning. BENCH_RUNS times
(default 3), interleaved:

  null            petrel: file -> syslog sink (RFC 5424, octet counting,
                  TCP) into a process that reads and discards (and, in the
                  first run, keeps the stream): the agent's own limit
  rsyslog         the same into rsyslogd (imptcp -> omfile `%msg%` on
                  /dev/shm), the row of the target
  frames-rsyslog  the frames the sink wrote in the first null run, sent
                  pre-encoded by a client (one sendall of 1 MiB blocks)
                  into the same rsyslogd: the raw limit of rsyslog on this
                  host, what the agent cannot go past

A petrel row is timed from the first event the sink acknowledged to the
last; the frames row from the first byte sent until rsyslog wrote its last
line. Each row reports messages/s, the agent's CPU seconds per million
messages (utime+stime of its process, start-up and reading included),
rsyslog's CPU seconds per million, the agent's peak RSS (VmHWM), and
rsyslog's line count is checked against the input. `--threads 1` unless
BENCH_THREADS; the default `--memory-limit` unless BENCH_MEMORY_LIMIT.

    bench/syslog_sink.py
    BENCH_LINES=4000000 BENCH_RUNS=5 bench/syslog_sink.py

Needs rsyslogd (scripts/install-syslog-tools.sh) and a build of petrel
(PETREL_BIN, default target/release/petrel).
"""

import glob
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PETREL_BIN", os.path.join(ROOT, "target/release/petrel"))
LINES = int(os.environ.get("BENCH_LINES", "2000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
THREADS = os.environ.get("BENCH_THREADS", "1")
MEMORY = os.environ.get("BENCH_MEMORY_LIMIT")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def rsyslogd():
    if os.path.exists("/usr/sbin/rsyslogd"):
        return "/usr/sbin/rsyslogd", []
    b = os.path.join(ROOT, ".cache/rsyslog/usr/sbin/rsyslogd")
    if not os.path.exists(b):
        sys.exit("syslog_sink.py: rsyslogd missing: run scripts/install-syslog-tools.sh")
    mods = glob.glob(os.path.join(ROOT, ".cache/rsyslog/usr/lib/*/rsyslog/imptcp.so"))
    return b, ["-M", os.path.dirname(mods[0])]


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


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(b.count(b"\n") for b in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


class Rsyslog:
    """A private rsyslogd: imptcp on a free port, omfile of %msg% on tmpfs."""

    def __init__(self, work):
        self.dir = tempfile.mkdtemp(prefix="rsyslog-", dir=work)
        self.port = free_port()
        self.out = tempfile.mktemp(prefix="petrel-bench-rsyslog-", dir=SHM)
        os.makedirs(os.path.join(self.dir, "work"))
        conf = os.path.join(self.dir, "rsyslog.conf")
        with open(conf, "w") as f:
            f.write(f"""global(workDirectory="{self.dir}/work")
module(load="imptcp")
template(name="m" type="string" string="%msg%\\n")
ruleset(name="r") {{ action(type="omfile" file="{self.out}" template="m") }}
input(type="imptcp" address="127.0.0.1" port="{self.port}" ruleset="r")
""")
        b, args = rsyslogd()
        self.p = subprocess.Popen([b, "-n", "-f", conf, "-i", os.path.join(self.dir, "pid")] + args,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                time.sleep(0.05)
        sys.exit("syslog_sink.py: rsyslogd did not start")

    def wait_lines(self, n, timeout=1800):
        """Waits until the output has n lines; the time of the last growth."""
        deadline = time.time() + timeout
        last, size = time.time(), -1
        while time.time() < deadline:
            s = os.path.getsize(self.out) if os.path.exists(self.out) else 0
            if s != size:
                size, last = s, time.time()
                if count_lines(self.out) >= n:
                    return last
            time.sleep(0.02)
        sys.exit(f"syslog_sink.py: rsyslog wrote {count_lines(self.out)} of {n} lines")

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(60)
        os.unlink(self.out)


# Reads and discards; with a path, keeps what it read there.
NULL = r'''
import socket, sys
keep = sys.argv[1] if len(sys.argv) > 1 else None
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
print(l.getsockname()[1], flush=True)
out = open(keep, "wb") if keep else None
while True:
    c, _ = l.accept()
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        if out:
            out.write(b)
    c.close()
'''


def run_petrel(work, data, port, name):
    d = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
    cfg = os.path.join(d, "p.yaml")
    with open(cfg, "w") as f:
        f.write(f"""sources:
  - type: file
    include: ["{data}"]
    read_from: beginning
sinks:
  - type: syslog
    id: out
    address: 127.0.0.1:{port}
    mode: tcp
    format: rfc5424
    app_name: bench
""")
    err = open(os.path.join(d, "err"), "w+")
    p = subprocess.Popen([BIN, "run", "--config", cfg, "--data-dir", os.path.join(d, "data"),
                          "--threads", THREADS, "--api-addr", "127.0.0.1:0"]
                         + (["--memory-limit", MEMORY] if MEMORY else []),
                         stdout=subprocess.DEVNULL, stderr=err)
    api = None
    first = None
    deadline = time.time() + 1800
    while time.time() < deadline:
        if api is None:
            err.seek(0)
            m = re.search(r"API listening on http://127.0.0.1:(\d+)", err.read())
            if m:
                api = int(m.group(1))
                cpu0 = 0.0
            time.sleep(0.005)
            continue
        sent = metric(api, "petrel_component_sent_events_total", [("component_kind", "sink")])
        if first is None and sent > 0:
            first = (time.time(), sent)
        if sent >= LINES:
            break
        if p.poll() is not None:
            err.seek(0)
            sys.exit(f"syslog_sink.py: petrel exited:\n{err.read()[-3000:]}")
        time.sleep(0.01)
    else:
        sys.exit("syslog_sink.py: the sink did not send every line")
    t0, s0 = first
    span = time.time() - t0
    span = span * LINES / max(LINES - s0, 1) if s0 < LINES else span
    cpu = cpu_seconds(p.pid) - cpu0
    hwm = hwm_kb(p.pid)
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    return {"rate": LINES / span, "cpu": cpu / LINES * 1e6, "rss": hwm / 1024}


def main():
    if not os.path.exists(BIN):
        sys.exit(f"syslog_sink.py: build first ({BIN})")
    work = tempfile.mkdtemp(prefix="petrel-bench-syslog-sink-")
    data = os.path.join(work, "single128.log")
    subprocess.run([BIN, "gen", "--format", "single128", "--size", str(LINES * 140), "--output", data],
                   check=True, capture_output=True)
    # Exactly LINES lines.
    with open(data, "rb") as f:
        lines = f.read().split(b"\n")[:LINES]
    if len(lines) < LINES:
        sys.exit(f"syslog_sink.py: petrel gen gave {len(lines)} lines")
    with open(data, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    frames = os.path.join(work, "frames")
    rows = {"null": [], "rsyslog": [], "frames-rsyslog": []}
    for run in range(RUNS):
        # null (keeping the frames of the first run)
        keep = [frames] if run == 0 else []
        sink = subprocess.Popen([sys.executable, "-c", NULL] + keep, stdout=subprocess.PIPE, text=True)
        port = int(sink.stdout.readline())
        rows["null"].append(run_petrel(work, data, port, "null"))
        sink.kill()
        sink.wait()
        # rsyslog
        r = Rsyslog(work)
        c0 = cpu_seconds(r.p.pid)
        res = run_petrel(work, data, r.port, "rsyslog")
        t_end = r.wait_lines(LINES)
        res["peer_cpu"] = (cpu_seconds(r.p.pid) - c0) / LINES * 1e6
        got = count_lines(r.out)
        r.stop()
        if got != LINES:
            sys.exit(f"syslog_sink.py: rsyslog wrote {got} lines for {LINES}")
        rows["rsyslog"].append(res)
        # frames into rsyslog
        r = Rsyslog(work)
        c0 = cpu_seconds(r.p.pid)
        t0 = time.time()
        s = socket.create_connection(("127.0.0.1", r.port))
        with open(frames, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                s.sendall(b)
        s.close()
        t_end = r.wait_lines(LINES)
        rows["frames-rsyslog"].append({"rate": LINES / (t_end - t0),
                                       "peer_cpu": (cpu_seconds(r.p.pid) - c0) / LINES * 1e6})
        r.stop()
        print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]['rate']:,.0f}/s" for k, v in rows.items()),
              file=sys.stderr)

    def fmt(xs, f="{:,.0f}"):
        if not xs:
            return "–"
        m = statistics.median(xs)
        return f"{f.format(m)} ({f.format(min(xs))}–{f.format(max(xs))})"

    size = os.path.getsize(frames)
    print(f"{LINES:,} single128 lines, frames {size / LINES:.0f} bytes each, {RUNS} runs, --threads {THREADS}\n")
    print("| row | messages/s | agent CPU s per million | rsyslog CPU s per million | agent peak RSS MB |")
    print("|---|---|---|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {fmt([x['rate'] for x in v])} | "
              f"{fmt([x['cpu'] for x in v if 'cpu' in x], '{:.2f}')} | "
              f"{fmt([x['peer_cpu'] for x in v if 'peer_cpu' in x], '{:.2f}')} | "
              f"{fmt([x['rss'] for x in v if 'rss' in x], '{:.1f}')} |")


if __name__ == "__main__":
    main()
