#!/usr/bin/env python3
"""CPU of `petrel pipe` per million lines when the writer sends one line per
write() (as Apache's piped CustomLog does), beside `cat > FILE` reading the
same stream (the raw limit: a read and a write per read, nothing else).

    bench/pipe.py                                   # 1,000,000 lines, 3 runs
    bench/pipe.py --rate 20000 --lines 200000       # paced, like a busy httpd
    bench/pipe.py --base-bin OLD/petrel             # an older build side by side

This process is the writer: one os.write() per 200-byte line (--line-bytes),
as fast as it can or paced (--rate lines/s, in 1 ms ticks). Each receiver
reads the other end of the pipe; its CPU (utime+stime) and peak RSS come
from /usr/bin/time once it exited at end of input. The spool is then read back
and every line counted (a receiver that drops lines fails the run).
Receivers run interleaved, --repeat times each; the table gives the median
and the range. Results: stdout and bench/results/pipe-<UTC date>.md.
Standard library only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = b"pipe-bench "


def lines_of(n, size):
    """n distinct lines of exactly `size` bytes (newline included)."""
    pad = b"x" * size
    for i in range(n):
        head = MARK + str(i).encode() + b" GET /index.html HTTP/1.1 200 "
        yield (head + pad)[: size - 1] + b"\n"


def run_one(cmd, out_dir, n, size, rate, stdout_path=None):
    """Feeds the lines to `cmd` one write() each; returns a dict."""
    out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    # /usr/bin/time measures its child: wait4() on a child of this process
    # would count this (Python) process's pages in the child's peak RSS.
    timing = os.path.join(os.path.dirname(out_dir), "time.txt")
    cmd = ["/usr/bin/time", "-f", "%M %U %S", "-o", timing] + cmd
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE)
    fd = p.stdin.fileno()
    t0 = time.monotonic()
    if rate:
        per_tick = max(1, int(rate / 1000))
        tick = per_tick / rate
        nxt = t0
        batch = []
        for line in lines_of(n, size):
            batch.append(line)
            if len(batch) == per_tick:
                for b in batch:
                    os.write(fd, b)
                batch.clear()
                nxt += tick
                d = nxt - time.monotonic()
                if d > 0:
                    time.sleep(d)
        for b in batch:
            os.write(fd, b)
    else:
        for line in lines_of(n, size):
            os.write(fd, line)
    p.stdin.close()
    err = p.stderr.read().decode(errors="replace")
    p.wait()
    wall = time.monotonic() - t0
    if stdout_path:
        out.close()
    if p.returncode != 0:
        sys.exit(f"{cmd[5]} exited with {p.returncode}: {err[-2000:]}")
    got = 0
    for root, _, files in os.walk(out_dir):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                got += fh.read().count(MARK)
    if got != n:
        sys.exit(f"{' '.join(cmd)}: {got} of {n} lines arrived")
    with open(timing) as fh:
        kb, user, sys_s = fh.read().split()[-3:]
    return {"wall": wall, "cpu": float(user) + float(sys_s), "rss_mb": int(kb) / 1000}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "petrel"))
    ap.add_argument("--base-bin", help="another petrel build, run interleaved as 'petrel pipe (base)'")
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--line-bytes", type=int, default=200)
    ap.add_argument("--rate", type=int, default=0, help="lines/s (0: as fast as the writer goes)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/")
    a = ap.parse_args()
    if a.line_bytes < 64:
        sys.exit("--line-bytes must be at least 64")
    receivers = [("cat > FILE (raw limit)", None)]
    if a.base_bin:
        receivers.append(("petrel pipe (base)", a.base_bin))
    receivers.append(("petrel pipe", a.bin))
    for _, b in receivers:
        if b and not os.access(b, os.X_OK):
            sys.exit(f"{b} missing: cargo build --release -p petrel")
    work = tempfile.mkdtemp(prefix="petrel-pipe.", dir="/var/tmp")
    results = {name: [] for name, _ in receivers}
    try:
        for _ in range(a.repeat):
            for name, b in receivers:
                d = os.path.join(work, "out")
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                if b is None:
                    r = run_one(["cat"], d, a.lines, a.line_bytes, a.rate, os.path.join(d, "file"))
                else:
                    r = run_one([b, "pipe", "--spool-dir", d], d, a.lines, a.line_bytes, a.rate)
                results[name].append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(rs, k):
        v = [r[k] for r in rs]
        return statistics.median(v), min(v), max(v)

    raw = med(results[receivers[0][0]], "cpu")[0]
    rate = f"{a.rate} lines/s" if a.rate else "as fast as the writer goes"
    head = [
        f"# petrel pipe, one write() per line ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())})",
        "",
        f"Command: `bench/pipe.py --lines {a.lines} --line-bytes {a.line_bytes} --rate {a.rate} --repeat {a.repeat}`"
        f"{' --base-bin ' + a.base_bin if a.base_bin else ''}; {rate}; {os.cpu_count()} cores, "
        f"load at end {open('/proc/loadavg').read().split()[0]}",
        "",
        "| receiver | lines | lines/s | CPU s | CPU s per million lines | peak RSS MB | CPU vs cat |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for name, _ in receivers:
        rs = results[name]
        wall = med(rs, "wall")[0]
        cpu, lo, hi = med(rs, "cpu")
        rss = med(rs, "rss_mb")[0]
        per_m = cpu / a.lines * 1e6
        ratio = f"{cpu / raw:.2f}" if raw > 0 else "n/a"
        rows.append(
            f"| {name} | {a.lines} | {a.lines / wall:,.0f} | {cpu:.2f} ({lo:.2f}–{hi:.2f}) | "
            f"{per_m:.2f} | {rss:.1f} | {ratio} |"
        )
    text = "\n".join(head + rows) + "\n\nMedians of the runs (range of CPU s in brackets); CPU is the receiver's utime+stime (tick-sampled, 10 ms).\n"
    print(text)
    if not a.no_write:
        os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
        path = os.path.join(ROOT, "bench", "results", time.strftime("pipe-%Y%m%d-%H%M.md", time.gmtime()))
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
