#!/usr/bin/env python3
"""The journald source: 1,000,000 journal entries (a 200-byte MESSAGE and
the usual trusted fields) from real journal files into a file sink, beside
`journalctl -o export --directory=D > /dev/null` (the peer, and the raw
limit: the source runs that very journalctl and parses its output).

    bench/journald.py                      # 1,000,000 entries, 3 runs each
    bench/journald.py --entries 200000 --repeat 1
    bench/journald.py --bin NEW --base OLD  # two builds, interleaved runs

The journal is written once by systemd-journal-remote (scripts/install-
journal-tools.sh) from generated export-format input into a temporary
directory. Petrel: `petrel run` with one journald source (`directory:`)
into an ndjson file sink, timed from start until its sink reported every
entry (the API's petrel_component_sent_events_total); CPU (utime+stime of
the agent, and of its journalctl child, from /proc) and peak RSS (VmHWM)
are read before it is stopped. journalctl: /usr/bin/time. The table gives
the median and the range. Results: stdout and
bench/results/journald-<UTC date>.md. Standard library only.
"""

import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE = "/lib/systemd/systemd-journal-remote"
TICK = os.sysconf("SC_CLK_TCK")


def field(k, v):
    if b"\n" in v:
        return k + b"\n" + struct.pack("<Q", len(v)) + v + b"\n"
    return k + b"=" + v + b"\n"


def write_journal(d, n):
    """n entries into d/bench.journal."""
    p = subprocess.Popen([REMOTE, "--output=" + os.path.join(d, "bench.journal"), "-"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    pad = b"x" * 200
    chunk = []
    for i in range(n):
        msg = (b"bench entry %09d GET /index.html HTTP/1.1 200 " % i + pad)[:200]
        e = (field(b"__REALTIME_TIMESTAMP", b"%d" % (1_700_000_000_000_000 + i))
             + field(b"__MONOTONIC_TIMESTAMP", b"%d" % (1_000_000 + i))
             + field(b"_BOOT_ID", b"6c0a1b0e4f2d4b8c9e7a5d3c1b0a9f8e")
             + field(b"_HOSTNAME", b"node-1")
             + field(b"_SYSTEMD_UNIT", b"app%d.service" % (i % 4))
             + field(b"_PID", b"%d" % (1000 + i % 4))
             + field(b"SYSLOG_IDENTIFIER", b"app%d" % (i % 4))
             + field(b"PRIORITY", b"6")
             + field(b"MESSAGE", msg) + b"\n")
        chunk.append(e)
        if len(chunk) == 10000:
            p.stdin.write(b"".join(chunk))
            chunk = []
    p.stdin.write(b"".join(chunk))
    p.stdin.close()
    if p.wait() != 0:
        sys.exit("systemd-journal-remote failed")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK


def hwm_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def children(pid):
    """Child processes of every thread of `pid` (journalctl is started by
    the source's thread, not the main one)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def sent(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if (line.startswith("petrel_component_sent_events_total{")
                        and 'component_kind="sink"' in line):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        pass
    return 0.0


def run_petrel(bin_path, journal, n, work):
    out = os.path.join(work, "out.ndjson")
    data = os.path.join(work, "data")
    for p in (out, data):
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (
            os.path.exists(p) and os.remove(p))
    cfg = os.path.join(work, "j.yaml")
    with open(cfg, "w") as f:
        f.write(f"sources:\n  - type: journald\n    directory: {journal}\n"
                f"sinks:\n  - type: file\n    path: {out}\n    encoding: ndjson\n")
    port = free_port()
    t0 = time.monotonic()
    p = subprocess.Popen([bin_path, "run", "--config", cfg, "--data-dir", data,
                          "--api-addr", f"127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kids = []
        deadline = t0 + 600
        while sent(port) < n:
            if p.poll() is not None or time.monotonic() > deadline:
                sys.exit("petrel did not deliver every entry")
            kids = children(p.pid) or kids
            time.sleep(0.05)
        secs = time.monotonic() - t0
        kids = children(p.pid) or kids
        cpu = cpu_of(p.pid)
        rss = hwm_kb(p.pid)
        jcpu = sum(cpu_of(k) for k in kids)
        jrss = max([hwm_kb(k) for k in kids] or [0])
    finally:
        p.terminate()
        p.wait()
    with open(out, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    if lines < n:
        sys.exit(f"petrel wrote {lines} of {n} entries")
    return {"secs": secs, "cpu": cpu, "rss": rss, "jcpu": jcpu, "jrss": jrss}


def run_journalctl(journal, work):
    timing = os.path.join(work, "time.txt")
    t0 = time.monotonic()
    subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "-o", timing, "journalctl",
                    "-o", "export", "--no-pager", f"--directory={journal}"],
                   stdout=subprocess.DEVNULL, check=True)
    secs = time.monotonic() - t0
    rss, u, s = open(timing).read().split()[-3:]
    return {"secs": secs, "cpu": float(u) + float(s), "rss": int(rss)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/petrel"))
    ap.add_argument("--base", help="another petrel binary measured in the same runs (before/after a change)")
    a = ap.parse_args()
    if not os.path.exists(REMOTE):
        sys.exit(f"{REMOTE} missing: run scripts/install-journal-tools.sh")
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} missing: cargo build --release -p petrel")
    work = tempfile.mkdtemp(prefix="petrel-journald-bench-")
    try:
        journal = os.path.join(work, "journal")
        os.mkdir(journal)
        t = time.monotonic()
        write_journal(journal, a.entries)
        size = sum(os.path.getsize(os.path.join(journal, f)) for f in os.listdir(journal))
        print(f"journal: {a.entries} entries, {size / 1e6:.0f} MB of journal files "
              f"(written in {time.monotonic() - t:.0f} s)", flush=True)
        rows = {"petrel": [], "journalctl": [], "base": []}
        for i in range(a.repeat):
            rows["journalctl"].append(run_journalctl(journal, work))
            if a.base:
                rows["base"].append(run_petrel(a.base, journal, a.entries, work))
                print(f"run {i + 1}: base {rows['base'][-1]}", flush=True)
            rows["petrel"].append(run_petrel(a.bin, journal, a.entries, work))
            print(f"run {i + 1}: journalctl {rows['journalctl'][-1]} petrel {rows['petrel'][-1]}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def fmt(xs, f):
        m = statistics.median(xs)
        return f"{f(m)} ({f(min(xs))}–{f(max(xs))})"

    n = a.entries
    out = [f"# journald source, {n:,} entries of 200-byte messages ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
           "",
           f"`bench/journald.py {' '.join(sys.argv[1:])}`; median (range).",
           "",
           "| reader | entries/s | CPU s per million (agent) | CPU s per million (journalctl) | peak RSS MB (agent) | peak RSS MB (journalctl) |",
           "|---|---|---|---|---|---|"]
    j = rows["journalctl"]
    sides = [("petrel journald → file (ndjson)", rows["petrel"])]
    if a.base:
        sides = [(f"petrel journald → file (ndjson), `{a.bin}`", rows["petrel"]),
                 (f"the same, base `{a.base}`", rows["base"])]
    for name, p in sides:
        out.append(f"| {name} | "
                   + fmt([n / r["secs"] for r in p], lambda v: f"{v:,.0f}") + " | "
                   + fmt([r["cpu"] * 1e6 / n for r in p], lambda v: f"{v:.2f}") + " | "
                   + fmt([r["jcpu"] * 1e6 / n for r in p], lambda v: f"{v:.2f}") + " | "
                   + fmt([r["rss"] / 1024 for r in p], lambda v: f"{v:.1f}") + " | "
                   + fmt([r["jrss"] / 1024 for r in p], lambda v: f"{v:.1f}") + " |")
    out.append("| `journalctl -o export > /dev/null` (peer, raw limit) | "
               + fmt([n / r["secs"] for r in j], lambda v: f"{v:,.0f}") + " | – | "
               + fmt([r["cpu"] * 1e6 / n for r in j], lambda v: f"{v:.2f}") + " | – | "
               + fmt([r["rss"] / 1024 for r in j], lambda v: f"{v:.1f}") + " |")
    text = "\n".join(out) + "\n"
    print(text)
    os.makedirs(os.path.join(ROOT, "bench/results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench/results",
                           "journald-" + time.strftime("%Y%m%d-%H%M", time.gmtime()) + ".md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
