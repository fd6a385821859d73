#!/usr/bin/env python3
"""Idle cost of many files: N files are read to their end and then left
alone; the agent's CPU (% of one core) and RSS are measured over a window.

    bench/idle_files.py [--files 10000] [--window 30] [--bin target/release/petrel]
                        [--peer-bin OTHER_PETREL] [--close-inactive SECS]

With --peer-bin, the other binary (an older build) runs the same scenario
right after, for a side-by-side ratio. Standard library only.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mb(pid, key="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(addr, name):
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run(binary, files, window, close_inactive):
    work = tempfile.mkdtemp(prefix="petrel-idle-")
    try:
        logs = os.path.join(work, "logs")
        os.mkdir(logs)
        for i in range(files):
            with open(os.path.join(logs, f"f{i:05}.log"), "w") as f:
                f.write(f"file {i} line\n")
        extra = f"    close_inactive_secs: {close_inactive}\n" if close_inactive else ""
        cfg = os.path.join(work, "idle.yaml")
        with open(cfg, "w") as f:
            f.write(
                f"sources:\n  - type: file\n    include: [\"{logs}/*.log\"]\n"
                f"    read_from: beginning\n{extra}sinks:\n  - type: blackhole\n"
            )
        log = open(os.path.join(work, "petrel.log"), "w+")
        proc = subprocess.Popen(
            [binary, "run", "--config", cfg, "--data-dir", os.path.join(work, "data"),
             "--api-addr", "127.0.0.1:0", "--log-level", "info"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        )
        try:
            addr = None
            deadline = time.monotonic() + 60
            while addr is None and time.monotonic() < deadline:
                time.sleep(0.1)
                log.seek(0)
                m = re.search(r"API listening on http://([0-9.:]+)", log.read())
                if m:
                    addr = m.group(1)
            if addr is None:
                sys.exit("petrel did not start; see " + log.name)
            t0 = time.monotonic()
            while metric(addr, "petrel_component_sent_events_total") < files:
                if time.monotonic() - t0 > 300:
                    sys.exit("not every file was read within 300 s")
                time.sleep(0.5)
            read_s = time.monotonic() - t0
            time.sleep(5)  # settle: checkpoints written, gauges created
            c0, w0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(window)
            c1, w1 = cpu_seconds(proc.pid), time.monotonic()
            open_files = metric(addr, "petrel_files_open")
            return {
                "binary": binary,
                "files": files,
                "read_all_s": round(read_s, 2),
                "idle_cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 2),
                "rss_mb": round(rss_mb(proc.pid), 1),
                "peak_rss_mb": round(rss_mb(proc.pid, "VmHWM"), 1),
                "files_open": open_files,
                "window_s": window,
            }
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--window", type=float, default=30)
    p.add_argument("--bin", default=os.path.join(root, "target", "release", "petrel"))
    p.add_argument("--peer-bin")
    p.add_argument("--close-inactive", type=int)
    a = p.parse_args()
    rows = [run(a.bin, a.files, a.window, a.close_inactive)]
    if a.peer_bin:
        rows.append(run(a.peer_bin, a.files, a.window, None))
    print("| binary | files | read all (s) | idle CPU % of a core | RSS MB | peak RSS MB | files open |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['binary']}` | {r['files']} | {r['read_all_s']} | {r['idle_cpu_pct']} | "
              f"{r['rss_mb']} | {r['peak_rss_mb']} | {int(r['files_open'])} |")
    if len(rows) == 2 and rows[0]["idle_cpu_pct"] > 0:
        print(f"\nidle CPU ratio peer / this build: {rows[1]['idle_cpu_pct'] / rows[0]['idle_cpu_pct']:.1f}")
    for r in rows:
        print(json.dumps(r), file=sys.stderr)


if __name__ == "__main__":
    main()
