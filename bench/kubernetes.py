#!/usr/bin/env python3
"""Seed 003 on this machine: container stdout (kubelet's CRI layout) read
by `type: kubernetes_logs` into `blackhole`, at a fixed rate.

    bench/kubernetes.py [--mode rates|pipelines|both] [--rates 1,2,3]
                        [--pipelines 50,100,500,1000] [--pipeline-rate 3]
                        [--window 30] [--warmup 5] [--runtime none]
                        [--bin target/release/petrel] [--threads N] [--flush-ms 20]

Rates: one pipeline reads the 4 containers' `0.log` at 1, 2, 3 MB/s in
total. Pipelines: N pipeline files (a config directory) at a constant
3 MB/s; 4 of them each select one of the 4 writing pods
(`include: { pods: [web-K] }`), the others select pods that do not exist,
as in iLogtail's many-configs experiment; every pipeline has its own
blackhole sink. `--source file`: plain `file` sources instead, the idle
ones naming one absent literal path each; `--source file-glob`: every
pipeline's `file` source includes `<work>/apps/app-N/*.log` over a
directory that exists (issue 33's set-up; only the 4 active ones hold a
file).

The writer is a separate process (this script with `--writer`) that, every
20 ms (`--flush-ms`), appends the lines due since the start to each container's file in
one write() per file, as a container runtime flushes a pipe: 283-byte nginx
combined-format messages (varying IPs, paths, statuses, sizes, agents),
each wrapped as `<RFC3339Nano> stdout F <msg>\\n`. MB = 10^6 bytes of
*message* (283 per line); the CRI prefix and newline (41 more bytes per
line) are not counted in the rate, and are shown separately as file MB/s.
The writer's CPU is measured and reported separately, never added to the
agent's.

Agent CPU % of one core = (utime + stime of the agent, /proc/PID/stat)
over the measurement window / window wall seconds × 100, after a warm-up;
"sched" is the same from se.sum_exec_runtime (exact, not tick-sampled).
Peak RSS = VmHWM at the end of the run; RSS = VmRSS at the end of the
window. Every written line must be delivered (sum of the sinks'
petrel_component_sent_events_total): the script exits non-zero otherwise.

API metadata (`--mode api`): the issue's CPU row. A real kube-apiserver
(the tests' own, kept up by the `kube_apiserver` example: build it with
`cargo build --workspace --profile ci --locked --example kube_apiserver`;
it needs `scripts/kube-apiserver.sh`) knows `--api-pods` pods (default
1,000) bound to the node, each with a ReplicaSet owner, 3 labels, 2
annotations and an IP, in a namespace with labels, on a node with labels;
each pod has its log file `<pods_dir>/bench_<pod>_<uid>/app/0.log` and the
writer spreads `--api-rate` MB/s (default 3) over all of them. One
`kubernetes_logs` pipeline (`runtime: none`) runs with `api: true` +
`kubeconfig:` ("on") or `api: false` ("off"), `--api-repeat` runs per side
(default 3) interleaved off, on, on, off, off, on; a side's run starts
once the agent's cache holds every pod ("on") and every file is open.
RSS average = mean of VmRSS sampled every second over the window.

Results: stdout and bench/results/kubernetes-<UTC date>.md. Standard
library only.
"""

import argparse
import datetime
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK = os.sysconf("SC_CLK_TCK")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MSG_BYTES = 283
PODS = [("shop", f"web-{i}", f"5f0c3a1e-0000-4000-8000-00000000000{i}", "nginx") for i in range(4)]
TICK = 0.02
# Seed 003's published figures (4 vCPU nodes): CPU % of one core.
SEED_RATES = {1: (2.0, 20.0), 2: (3.3, 37.0), 3: (4.1, 52.0)}
SEED_PIPELINES = {50: (5.0, 95.0), 1000: (8.7, 149.0)}


# --- measuring -------------------------------------------------------------

def tick_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def sched_seconds(pid):
    total, found = 0.0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/sched") as f:
                for line in f:
                    if line.startswith("se.sum_exec_runtime"):
                        total += float(line.split(":")[1]) / 1000.0
                        found = True
                        break
        except OSError:
            continue
    return total if found else None


def status_mb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def sink_events(addr):
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("petrel_component_sent_events_total{") and 'component_kind="sink"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


# --- the writer --------------------------------------------------------------

def nginx_messages(n, seed=3):
    """`n` distinct nginx combined-format lines, each exactly MSG_BYTES bytes;
    `%TIME%` stands for the 26-byte `[dd/Mon/yyyy:HH:MM:SS +0000]` field."""
    rnd = random.Random(seed)
    paths = ["/", "/index.html", "/api/v1/orders", "/api/v1/orders/{}", "/api/v1/cart/{}/items",
             "/static/js/app.{}.js", "/static/css/main.{}.css", "/images/products/{}.jpg",
             "/search?q=shoes&page={}", "/login", "/logout", "/healthz", "/metrics",
             "/api/v2/users/{}/profile", "/checkout/step/{}", "/favicon.ico"]
    methods = ["GET"] * 8 + ["POST"] * 2 + ["PUT", "DELETE", "HEAD"]
    statuses = [200] * 14 + [201, 204, 301, 302, 304, 304, 400, 401, 403, 404, 404, 499, 500, 502, 503]
    agents = [
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Safari/605.1.15",
        "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
        "curl/8.5.0", "kube-probe/1.29", "Go-http-client/1.1", "python-requests/2.31.0",
    ]
    referers = ["-", "https://shop.example.com/", "https://www.google.com/", "https://shop.example.com/cart"]
    out = []
    while len(out) < n:
        ip = f"{rnd.choice([10, 172, 192, 81, 93, 203])}.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"
        path = rnd.choice(paths).format(rnd.randrange(1, 100000))
        head = (f'{ip} - - %TIME% "{rnd.choice(methods)} {path} HTTP/1.1" {rnd.choice(statuses)} '
                f'{rnd.randrange(0, 60000)} "{rnd.choice(referers)}" "{rnd.choice(agents)}"')
        # %TIME% (6 bytes) becomes 28 bytes: `[23/Nov/2026:12:00:00 +0000]`.
        fixed = len(head.encode()) - 6 + 28
        # Pad with the request id nginx's `$request_id` would log.
        pad = MSG_BYTES - fixed - 1
        if pad < 8:
            continue
        rid = "".join(rnd.choice("0123456789abcdef") for _ in range(pad))
        out.append((head + " " + rid).encode())
    return out


def writer_main(a):
    paths = list(a.writer_files or [])
    if a.writer_files_from:
        with open(a.writer_files_from) as f:
            paths += f.read().split()
    files = [open(p, "ab", buffering=0) for p in paths]
    msgs = nginx_messages(4096)
    pre = [m.split(b"%TIME%") for m in msgs]
    per_sec = a.writer_rate * 1e6 / MSG_BYTES
    start = time.monotonic()
    end = start + a.writer_duration
    written = 0
    k = 0
    nf = len(files)
    while True:
        now = time.monotonic()
        due = int(per_sec * (min(now, end) - start))
        n = due - written
        if n > 0:
            wall = time.time_ns()
            secs, ns = divmod(wall, 1_000_000_000)
            t = time.gmtime(secs)
            cri = (time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ns:09d}Z stdout F ").encode()
            ngx = time.strftime("[%d/%b/%Y:%H:%M:%S +0000]", t).encode()
            bufs = [[] for _ in range(nf)]
            for i in range(n):
                a1, b1 = pre[k % len(pre)]
                bufs[(written + i) % nf].append(cri + a1 + ngx + b1 + b"\n")
                k += 1
            for f, b in zip(files, bufs):
                if b:
                    f.write(b"".join(b))
            written = due
        if now >= end:
            break
        time.sleep(max(0.0, a.writer_tick - (time.monotonic() - now)))
    for f in files:
        f.close()
    print(json.dumps({"lines": written, "message_bytes": written * MSG_BYTES}), flush=True)


# --- one run -------------------------------------------------------------------

def kube_source(pods_dir, runtime, include, extra=""):
    inc = f"    include: {include}\n" if include else ""
    return (f"sources:\n  - type: kubernetes_logs\n    id: pods\n    pods_dir: {pods_dir}\n"
            f"    docker_dir: {pods_dir}/../docker\n    runtime: {runtime}\n{inc}{extra}"
            f"sinks:\n  - type: blackhole\n    id: null\n")


def file_source(paths):
    """The other set-up of seed 003's pipelines row: plain `file` sources
    (no container metadata) into blackhole."""
    return (f"sources:\n  - type: file\n    id: files\n    include: {json.dumps(paths)}\n"
            f"sinks:\n  - type: blackhole\n    id: null\n")


def run(a, rate, pipelines):
    work = tempfile.mkdtemp(prefix="petrel-kbench-")
    try:
        pods = os.path.join(work, "pods")
        os.makedirs(os.path.join(work, "docker"))
        files = []
        for ns, pod, uid, ctr in PODS:
            d = os.path.join(pods, f"{ns}_{pod}_{uid}", ctr)
            os.makedirs(d)
            p = os.path.join(d, "0.log")
            open(p, "wb").close()
            files.append(p)
        if a.source == "file-glob":
            # One directory per pipeline, each its own `*.log` glob; the 4
            # active ones hold the written file, the others stay empty.
            files = []
            for i in range(pipelines or 1):
                d = os.path.join(work, "apps", f"app-{i}")
                os.makedirs(d)
                if i < len(PODS):
                    p = os.path.join(d, "0.log")
                    open(p, "wb").close()
                    files.append(p)
        if pipelines is None:
            cfg = os.path.join(work, "k8s.yaml")
            with open(cfg, "w") as f:
                if a.source == "file":
                    f.write(file_source(files))
                elif a.source == "file-glob":
                    f.write(file_source([os.path.join(work, "apps", "app-0", "*.log")]))
                else:
                    f.write(kube_source(pods, a.runtime, None))
        else:
            cfg = os.path.join(work, "pipelines")
            os.mkdir(cfg)
            for i in range(pipelines):
                pod = f"web-{i}" if i < len(PODS) else f"absent-{i}"
                with open(os.path.join(cfg, f"p{i:04}.yaml"), "w") as f:
                    if a.source == "file":
                        path = files[i] if i < len(files) else os.path.join(work, "absent", f"{i}.log")
                        f.write(file_source([path]))
                    elif a.source == "file-glob":
                        f.write(file_source([os.path.join(work, "apps", f"app-{i}", "*.log")]))
                    else:
                        f.write(kube_source(pods, a.runtime, f"{{ pods: [{pod}] }}"))
        row = measure(a, work, cfg, files, rate)
        row["pipelines"] = pipelines or 1
        return row
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def metric(addr, name, labels=""):
    """The sum of `name` series whose labels contain `labels`, or None."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=30).read().decode()
    found = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if labels in line:
                found = (found or 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def measure(a, work, cfg, files, rate, env=None, ready=None):
    """Starts the agent on `cfg`, waits for `ready(addr)` (when given), writes
    `rate` MB/s over `files` for warm-up + window, and returns the row."""
    agent = writer = None
    try:
        log = open(os.path.join(work, "petrel.log"), "w+")
        args = [a.bin, "run", "--config", cfg, "--data-dir", os.path.join(work, "data"),
                "--api-addr", "127.0.0.1:0", "--log-level", "info"]
        if a.threads:
            args += ["--threads", str(a.threads)]
        agent = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=log, env={**os.environ, **(env or {})})
        addr = None
        deadline = time.monotonic() + 300
        while addr is None and time.monotonic() < deadline:
            if agent.poll() is not None:
                log.seek(0)
                sys.exit("petrel exited at start:\n" + log.read()[-3000:])
            time.sleep(0.1)
            log.seek(0)
            m = re.search(r"API listening on http://([0-9.:]+)", log.read())
            if m:
                addr = m.group(1)
        if addr is None:
            log.seek(0)
            sys.exit("petrel did not start within 300 s; its log ends with:\n" + log.read()[-3000:])
        if ready is not None:
            t0 = time.monotonic()
            while not ready(addr):
                if time.monotonic() - t0 > 300:
                    log.seek(0)
                    sys.exit("the agent was not ready within 300 s; its log ends with:\n" + log.read()[-3000:])
                time.sleep(0.5)
        time.sleep(2)  # discovery of the (empty) files
        started_rss = status_mb(agent.pid, "VmRSS")
        list_file = os.path.join(work, "writer-files")
        with open(list_file, "w") as f:
            f.write("\n".join(files) + "\n")
        writer = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--writer", "--writer-rate", str(rate),
             "--writer-duration", str(a.warmup + a.window), "--writer-tick", str(a.flush_ms / 1000),
             "--writer-files-from", list_file],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        load0 = loadavg()
        time.sleep(a.warmup)
        c0, s0, w0 = tick_seconds(agent.pid), sched_seconds(agent.pid), time.monotonic()
        wc0 = tick_seconds(writer.pid)
        rss_samples = []
        while time.monotonic() - w0 < a.window:
            rss_samples.append(status_mb(agent.pid, "VmRSS"))
            time.sleep(min(1.0, max(0.0, a.window - (time.monotonic() - w0))))
        c1, s1, w1 = tick_seconds(agent.pid), sched_seconds(agent.pid), time.monotonic()
        wc1 = tick_seconds(writer.pid)
        rss_end = status_mb(agent.pid, "VmRSS")
        load1 = loadavg()
        out, _ = writer.communicate(timeout=120)
        written = json.loads(out.decode().strip().splitlines()[-1])["lines"]
        writer = None
        delivered, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 120:
            delivered = sink_events(addr)
            if delivered >= written:
                break
            time.sleep(0.5)
        time.sleep(1)
        delivered = sink_events(addr)
        row = {
            "rate_mb_s": rate,
            "cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 2),
            "cpu_sched_pct": round(100 * (s1 - s0) / (w1 - w0), 2) if s0 is not None and s1 is not None else None,
            "peak_rss_mb": round(status_mb(agent.pid, "VmHWM"), 1),
            "rss_mb": round(rss_end, 1),
            "rss_avg_mb": round(sum(rss_samples) / len(rss_samples), 1),
            "rss_before_mb": round(started_rss, 1),
            "threads": threads(agent.pid),
            "writer_cpu_pct": round(100 * (wc1 - wc0) / (w1 - w0), 2),
            "written": written,
            "delivered": delivered,
            "file_mb_s": round(written * (MSG_BYTES + 41) / (a.warmup + a.window) / 1e6, 2),
            "load": f"{load0}→{load1}",
            "window_s": a.window,
        }
        print(json.dumps(row), file=sys.stderr, flush=True)
        if delivered != written:
            sys.exit(f"FAIL: {written} lines written, {delivered} delivered "
                     f"(rate {rate} MB/s); agent log: {log.name}")
        return row
    finally:
        for p in (writer, agent):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


# --- API metadata on and off (the CPU row) ------------------------------

API_NODE = "bench-node"


def start_apiserver(a, work):
    """The `kube_apiserver` example with `a.api_pods` pods on API_NODE: (its
    process, the JSON it printed)."""
    if not os.path.exists(a.apiserver_bin):
        sys.exit(f"{a.apiserver_bin} missing: cargo build --workspace --profile ci --locked "
                 "--example kube_apiserver (and scripts/kube-apiserver.sh)")
    p = subprocess.Popen([a.apiserver_bin, work, str(a.api_pods), API_NODE],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline()
    if not line:
        p.wait(timeout=60)
        sys.exit(f"the kube_apiserver example exited ({p.returncode}) before it was ready")
    return p, json.loads(line)


def run_api(a, side, pods_dir, files, kubeconfig, n_pods):
    work = tempfile.mkdtemp(prefix="petrel-kbench-api-")
    try:
        for f in files:
            open(f, "wb").close()  # every run reads its own lines only
        if side == "on":
            extra = f"    api: true\n    kubeconfig: {kubeconfig}\n    annotation_fields: [team-owner]\n"
        else:
            extra = "    api: false\n    annotation_fields: [team-owner]\n"
        cfg = os.path.join(work, "k8s.yaml")
        with open(cfg, "w") as f:
            f.write(kube_source(pods_dir, "none", None, extra))

        def ready(addr):
            if side == "on" and metric(addr, "petrel_kubernetes_api_objects", 'resource="pods"') != n_pods:
                return False
            return (metric(addr, "petrel_files_open") or 0) >= len(files)
        row = measure(a, work, cfg, files, a.api_rate, env={"NODE_NAME": API_NODE}, ready=ready)
        row["side"] = side
        return row
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def api_mode(a):
    work = tempfile.mkdtemp(prefix="petrel-kbench-apiserver-")
    server = None
    try:
        server, info = start_apiserver(a, work)
        pods_dir = os.path.join(work, "pods")
        os.makedirs(os.path.join(work, "docker"))
        files = []
        for name, uid in info["pods"]:
            d = os.path.join(pods_dir, f"{info['namespace']}_{name}_{uid}", "app")
            os.makedirs(d)
            files.append(os.path.join(d, "0.log"))
        order = (["off", "on", "on", "off"] * a.api_repeat)[:2 * a.api_repeat]
        rows = [run_api(a, side, pods_dir, files, info["kubeconfig"], len(info["pods"])) for side in order]
        return rows, len(info["pods"])
    finally:
        if server is not None:
            server.stdin.close()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def api_table(rows, n_pods, rate):
    out = [f"### Runs in order ({n_pods} pods, {rate:g} MB/s spread over their files)", "",
           "| # | API metadata | CPU % | (sched) | RSS avg MB | RSS end MB | peak RSS MB | threads | "
           "lines written = delivered | writer CPU % | load |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for i, r in enumerate(rows, 1):
        out.append(f"| {i} | {r['side']} | {r['cpu_pct']} | {r['cpu_sched_pct']} | {r['rss_avg_mb']} | "
                   f"{r['rss_mb']} | {r['peak_rss_mb']} | {r['threads']} | {r['delivered']} | "
                   f"{r['writer_cpu_pct']} | {r['load']} |")
    out += ["", "### Median (range) per side", "",
            "| API metadata | CPU % | (sched) | RSS avg MB | peak RSS MB |", "|---|---:|---:|---:|---:|"]
    med = {}
    for side in ("off", "on"):
        rs = [r for r in rows if r["side"] == side]
        cells = []
        for k in ("cpu_pct", "cpu_sched_pct", "rss_avg_mb", "peak_rss_mb"):
            xs = [r[k] for r in rs if r[k] is not None]
            med[(side, k)] = median(xs)
            cells.append(f"{median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})")
        out.append(f"| {side} | " + " | ".join(cells) + " |")
    d_cpu = med[("on", "cpu_pct")] - med[("off", "cpu_pct")]
    d_sched = med[("on", "cpu_sched_pct")] - med[("off", "cpu_sched_pct")]
    d_rss = med[("on", "rss_avg_mb")] - med[("off", "rss_avg_mb")]
    d_peak = med[("on", "peak_rss_mb")] - med[("off", "peak_rss_mb")]
    met = d_sched <= 0.2 and d_rss <= 10 and d_peak <= 10
    out += ["", f"on − off (medians): CPU {d_cpu:+.2f} points (sched {d_sched:+.2f}; target ≤ +0.2), "
            f"RSS avg {d_rss:+.1f} MB, peak RSS {d_peak:+.1f} MB (target ≤ +10 MB): "
            f"{'met' if met else 'NOT met'}"]
    return out


# --- report ------------------------------------------------------------------

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def header(a):
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "?"
    return [
        f"# {a.source}, seed 003 ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ})",
        "",
        f"`bench/kubernetes.py {' '.join(sys.argv[1:])}`".replace("`bench/kubernetes.py `", "`bench/kubernetes.py`"),
        "",
        f"- nproc: {os.cpu_count()}, kernel {os.uname().release}, load average at start {loadavg()}",
        f"- petrel: {sh(a.bin, '--version')}, binary sha256 {sha256(a.bin)[:12]}, "
        f"working tree {sh('git', 'rev-parse', '--short', 'HEAD')}"
        f"{' (modified)' if sh('git', 'status', '--porcelain', '--untracked-files=no') else ''}",
        f"- runtime: {'none' if a.mode == 'api' else a.runtime}; writer flush every {a.flush_ms:g} ms; window {a.window:g} s after {a.warmup:g} s warm-up; "
        f"{str(a.api_pods) + ' pods (one container each)' if a.mode == 'api' else '4 containers'}, "
        f"{MSG_BYTES}-byte nginx messages, CRI-wrapped (MB/s counts message bytes; the CRI prefix and "
        f"newline add 41 bytes per line, see file MB/s)",
        "- CPU % = agent utime+stime over the window / wall × 100 (sched: se.sum_exec_runtime); "
        "writer CPU is its own process, not counted",
        "",
    ]


def rates_table(rows):
    out = ["| rate (msg MB/s) | file MB/s | Petrel CPU % | (sched) | peak RSS MB | RSS end MB | "
           "iLogtail CPU % | Filebeat CPU % | Petrel / iLogtail | lines written = delivered | writer CPU % | load |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        il, fb = SEED_RATES.get(int(r["rate_mb_s"]), (None, None))
        ratio = f"{r['cpu_pct'] / il:.2f}" if il else "–"
        out.append(f"| {r['rate_mb_s']:g} | {r['file_mb_s']} | {r['cpu_pct']} | {r['cpu_sched_pct']} | "
                   f"{r['peak_rss_mb']} | {r['rss_mb']} | {il or '–'} | {fb or '–'} | {ratio} | "
                   f"{r['delivered']} | {r['writer_cpu_pct']} | {r['load']} |")
    return out


def pipelines_table(rows):
    out = ["| pipelines | Petrel CPU % | (sched) | peak RSS MB | RSS end MB | RSS before writing MB | threads | "
           "iLogtail CPU % | iLogtail MB | lines written = delivered | writer CPU % | load |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        il = SEED_PIPELINES.get(r["pipelines"], ("–", "–"))
        out.append(f"| {r['pipelines']} | {r['cpu_pct']} | {r['cpu_sched_pct']} | {r['peak_rss_mb']} | "
                   f"{r['rss_mb']} | {r['rss_before_mb']} | {r['threads']} | {il[0]} | {il[1]} | "
                   f"{r['delivered']} | {r['writer_cpu_pct']} | {r['load']} |")
    if len(rows) >= 2:
        f, l = rows[0], rows[-1]
        out += ["", f"{f['pipelines']} → {l['pipelines']} pipelines: CPU {l['cpu_pct'] - f['cpu_pct']:+.2f} "
                f"points (target ≤ +0.3), RSS end {l['rss_mb'] - f['rss_mb']:+.1f} MB, peak RSS "
                f"{l['peak_rss_mb'] - f['peak_rss_mb']:+.1f} MB (target ≤ +15 MB); "
                "iLogtail 50 → 1000: +3.7 points, +54 MB"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["rates", "pipelines", "both", "api"], default="both")
    p.add_argument("--api-pods", type=int, default=1000)
    p.add_argument("--api-rate", type=float, default=3)
    p.add_argument("--api-repeat", type=int, default=3, help="runs per side (API metadata on, off)")
    p.add_argument("--apiserver-bin", default=os.path.join(ROOT, "target", "ci", "examples", "kube_apiserver"))
    p.add_argument("--rates", default="1,2,3")
    p.add_argument("--pipelines", default="50,100,500,1000")
    p.add_argument("--pipeline-rate", type=float, default=3)
    p.add_argument("--window", type=float, default=30)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--runtime", default="none", choices=["none", "auto", "containerd", "docker"])
    p.add_argument("--threads", type=int)
    p.add_argument("--source", default="kubernetes_logs", choices=["kubernetes_logs", "file", "file-glob"],
                   help="file: plain file sources (one file per active pipeline, the idle ones name an "
                   "absent literal path) instead of kubernetes_logs; file-glob: every pipeline's source "
                   "includes `<work>/apps/app-N/*.log`, a directory that exists (empty for the idle ones)")
    p.add_argument("--flush-ms", type=float, default=TICK * 1000,
                   help="the writer appends to each file once per this period (default 20)")
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "petrel"))
    p.add_argument("--no-write", action="store_true", help="do not write bench/results/")
    p.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--writer-rate", type=float, help=argparse.SUPPRESS)
    p.add_argument("--writer-duration", type=float, help=argparse.SUPPRESS)
    p.add_argument("--writer-file", action="append", dest="writer_files", help=argparse.SUPPRESS)
    p.add_argument("--writer-files-from", help=argparse.SUPPRESS)
    p.add_argument("--writer-tick", type=float, default=TICK, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.writer:
        return writer_main(a)
    lines = header(a)
    if a.mode in ("rates", "both"):
        rows = [run(a, float(r), None) for r in a.rates.split(",")]
        lines += ["## Rates (one pipeline, all 4 containers)", ""] + rates_table(rows) + [""]
    if a.mode == "api":
        rows, n_pods = api_mode(a)
        lines += [f"## kubernetes_logs with Kubernetes API metadata on and off ({n_pods} pods on the node, "
                  f"{a.api_rate:g} MB/s)", ""] + api_table(rows, n_pods, a.api_rate) + [""]
    if a.mode in ("pipelines", "both"):
        rows = [run(a, a.pipeline_rate, int(n)) for n in a.pipelines.split(",")]
        lines += [f"## Pipelines at {a.pipeline_rate:g} MB/s (4 select a writing pod each, the rest absent pods)",
                  ""] + pipelines_table(rows) + [""]
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        path = os.path.join(ROOT, "bench", "results",
                            f"kubernetes-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M}.md")
        with open(path, "w") as f:
            f.write(text + "\n")
        print(f"\nwritten to {os.path.relpath(path, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
