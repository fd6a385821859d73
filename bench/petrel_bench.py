#!/usr/bin/env python3
"""Measurement helper for bench/run.sh and bench/compare.sh (Python standard
library only).

Subcommands:

  throughput  start `petrel run` on a page-cached file, wait until every line
              has left the sink, print one JSON object with wall time, CPU
              seconds and peak RSS.
  rate        start `petrel run` tailing an empty file, append to it with
              `petrel gen --rate`, sample CPU and RSS every second, print one
              JSON object.
  stats       summarise one bench/run.sh row (fastest run, medians, range).
  compare-report
              bench/compare.sh's markdown table from its jsonl.

throughput and rate always stop the petrel they started (SIGTERM, then SIGKILL after a
bounded wait) and report a non-zero exit status of petrel as an error.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
API_RE = re.compile(r"API listening on http://([0-9.]+):([0-9]+)")



# What the throughput loop reads from /metrics at every poll.
POLLED = ("petrel_component_sent_events_total", "petrel_memory_used_bytes",
          "petrel_file_committed_offset_bytes")

def emit(d):
    """Prints one JSON object. Floats are rounded to 4 decimals so that none
    is printed in exponent notation (bc, used by run.sh, cannot read 1e-05)."""
    def fix(v):
        return round(v, 4) if isinstance(v, float) else v
    print(json.dumps({k: fix(v) for k, v in d.items()}))


def fail(msg):
    print(f"petrel_bench: {msg}", file=sys.stderr)
    sys.exit(1)


# Parsing for the `parse-*` variants: what each data set is made for. The
# source's lines become these events; multiline512 joins its 23-line events
# in the source (start pattern), the others parse each line into fields.
PARSE = {
    "regex512": {"processors": [
        "- type: parse_regex\n"
        "    pattern: '\\[(?<time>[^]]+)]\\s\\[(?<level>\\w+)]\\s\\[(?<pid>\\d+)]\\s(?<file>\\S+):(?<line>\\d+)\\slog:(?<log>.*)'",
    ]},
    "json512": {"processors": ["- type: parse_json"]},
    "delim512": {"processors": [
        "- type: parse_delimiter\n"
        "    separator: \"|\"\n"
        "    keys: [time, level, pid, file, line, log]",
    ]},
    # bench/transforms.sh: parse_json plus one of the transforms, keyed by
    # `pid` (100 000 distinct values in json512).
    "json512-throttle": {"processors": [
        "- type: parse_json",
        "- type: throttle\n    key_field: \"{{ pid }}\"\n    threshold: 1000\n    window_secs: 1",
    ]},
    "json512-dedupe": {"processors": [
        "- type: parse_json",
        "- type: dedupe\n    fields: {match: [pid, line]}\n    cache: {num_events: 100000}",
    ]},
    "json512-sample": {"processors": [
        "- type: parse_json",
        "- type: sample\n    rate: 10\n    key_field: pid",
    ]},
    # bench/transforms.sh, `remap` rows (issue 32). The native equivalent
    # of the program: Petrel's `fields` has no upcase, so it sets `level`
    # to a new string, which is the write the program makes.
    # bench/output_layouts.sh (issue 41): the source's `host` and `file`
    # removed by a processor.
    "json512-rmhostfile": {"processors": [
        "- type: parse_json",
        "- type: fields\n    remove: [host, file]",
    ]},
    "json512-fields": {"processors": [
        "- type: parse_json",
        "- type: fields\n    add: {level: INFO}",
    ]},
    "json512-remap": {"processors": [
        "- type: remap\n    source: |\n"
        "      . = merge(., object!(parse_json!(.message)))\n"
        "      .level = upcase!(.level)",
    ]},
    # A condition that reads one field and drops 90 % (pid ending in 0),
    # native regex and VRL.
    "json512-filter-regex": {"processors": [
        "- type: parse_json",
        "- type: filter\n    include: {pid: '0$'}",
    ]},
    "json512-filter-vrl": {"processors": [
        "- type: parse_json",
        "- type: filter\n    vrl: 'ends_with(to_string(.pid) ?? \"\", \"0\")'",
    ]},
    "nginx283-remap": {"processors": [
        "- type: remap\n    source: '. = merge(., parse_nginx_log!(.message, \"combined\"))'",
    ]},
    "multiline512": {"source": "    multiline:\n      start_pattern: '\\[\\d{4}-'\n"},
    "nginx283": {"processors": [
        "- type: parse_regex\n"
        "    pattern: '^(?<remote_addr>\\S+) \\S+ (?<remote_user>\\S+) \\[(?<time_local>[^]]+)] "
        "\"(?<method>\\S+) (?<request>\\S+) (?<protocol>[^\"]*)\" (?<status>\\d+) (?<body_bytes_sent>\\d+) "
        "\"(?<http_referer>[^\"]*)\" \"(?<http_user_agent>[^\"]*)\"'",
    ]},
}


# A sink name ending in this puts the sink behind a disk buffer (in the
# agent's data directory, on disk): `ndjson+disk`, `elasticsearch:URL+disk`.
DISK_BUFFER = "+disk"
DISK_BUFFER_YAML = "    buffer: { type: disk, max_size: 1GiB }\n"


def write_pipeline(path, log_file, sink, read_from, parse=None, sink_path=None):
    buffered = sink.endswith(DISK_BUFFER)
    if buffered:
        sink = sink[: -len(DISK_BUFFER)]
    if sink == "blackhole":
        sink_yaml = "  - type: blackhole\n"
    elif sink in ("text", "ndjson"):
        # /dev/null unless a real output file is given (throughput --sink-dir).
        sink_yaml = (f"  - type: file\n    path: {json.dumps(sink_path or '/dev/null')}\n"
                     f"    encoding: {sink}\n")
    elif sink == "ndjson-ecs3":
        # bench/output_layouts.sh (issue 41): the ecs layout, three fields
        # left out.
        sink_yaml = (f"  - type: file\n    path: {json.dumps(sink_path or '/dev/null')}\n"
                     "    encoding: ndjson\n    metadata: { layout: ecs }\n"
                     "    except_fields: [pid, line, level]\n")
    elif sink == "template":
        # The text encoding with a line template of four fields (a time
        # filter, two source fields, the message), as /var/log/messages.
        tpl = "{{ timestamp | %b %e %H:%M:%S }} {{ host }} {{ source_type }}: {{ message }}"
        sink_yaml = (f"  - type: file\n    path: {json.dumps(sink_path or '/dev/null')}\n"
                     f"    encoding: {{ codec: text, template: {json.dumps(tpl)} }}\n")
    elif sink.startswith("ndjson-file:"):
        # A real file (on tmpfs in bench/sinks.sh): the write is paid.
        sink_yaml = (f"  - type: file\n    path: {json.dumps(sink[len('ndjson-file:'):])}\n"
                     "    encoding: ndjson\n")
    elif sink.startswith("elasticsearch:"):
        sink_yaml = (f"  - type: elasticsearch\n    endpoints: [{json.dumps(sink[len('elasticsearch:'):])}]\n"
                     "    index: bench\n")
    elif sink.startswith("loki:") or sink.startswith("loki-json:"):
        kind, url = sink.split(":", 1)
        enc = "json" if kind == "loki-json" else "protobuf"
        sink_yaml = (f"  - type: loki\n    endpoint: {json.dumps(url)}\n    encoding: {enc}\n"
                     "    labels: { level: \"{{ level }}\" }\n")
    elif sink.startswith("http:"):
        sink_yaml = f"  - type: http\n    url: {json.dumps(sink[len('http:'):])}\n"
    elif sink.startswith("opentelemetry:"):
        sink_yaml = (f"  - type: opentelemetry\n    endpoint: {json.dumps(sink[len('opentelemetry:'):] + '/v1/logs')}\n"
                     "    protocol: http\n")
    elif sink.startswith("s3:"):
        # s3:URL, a versitygw started by bench/s3.sh with these root keys
        # and a bucket `bench`; gzip objects of 10 MiB of lines (the
        # default), closed 2 s after they open so that the run's last
        # object does not wait for the default 5 minutes.
        sink_yaml = (f"  - type: s3\n    endpoint: {json.dumps(sink[len('s3:'):])}\n    bucket: bench\n"
                     "    auth: { access_key_id: bench-key, secret_access_key: bench-secret-0123456789 }\n"
                     "    key_prefix: \"json512/\"\n    compression: gzip\n"
                     "    batch: { timeout_ms: 2000 }\n")
    elif sink.startswith("kafka:"):
        # kafka:HOST:PORT, a broker started by bench/pipelines.sh.
        sink_yaml = (f"  - type: kafka\n    brokers: [{json.dumps(sink[len('kafka:'):])}]\n"
                     "    topic: bench-rate\n    encoding: ndjson\n")
    else:
        fail(f"unknown sink variant {sink!r}")
    spec = {}
    if parse:
        if parse not in PARSE:
            fail(f"no parse configuration for data set {parse!r} (have: {', '.join(PARSE)})")
        spec = PARSE[parse]
    procs = spec.get("processors", [])
    if buffered:
        sink_yaml += DISK_BUFFER_YAML
    with open(path, "w") as f:
        f.write(
            "# generated by bench/petrel_bench.py\n"
            "sources:\n"
            "  - type: file\n"
            f"    include: [{json.dumps(log_file)}]\n"
            f"    read_from: {read_from}\n"
            + spec.get("source", "")
            + ("processors:\n" + "".join(f"  {p}\n" for p in procs) if procs else "processors: []\n")
            + "sinks:\n" + sink_yaml
        )


def proc_cpu_split(pid):
    """(utime, stime) of all threads of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    # The command name may contain spaces; fields start after the last ')'.
    fields = s[s.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15.
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_seconds(pid):
    """utime + stime of all threads of `pid`, in seconds."""
    return sum(proc_cpu_split(pid))


def proc_exec_seconds(pid):
    """On-CPU time of the live threads of `pid` from the scheduler
    (se.sum_exec_runtime in /proc/PID/task/TID/sched), in seconds, or None
    when the kernel does not expose it. Exact, unlike utime+stime, which a
    tick-accounting kernel samples at each timer tick (coarse and possibly
    biased for a process that wakes in short bursts); but threads that
    exited are missing, so use it over intervals where the threads stay."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found = False
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


def proc_status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def system_busy_seconds():
    """CPU seconds spent not idle by all cores since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def self_cpu_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def wait_quiet(max_wait, threshold=0.15):
    """Waits (at most max_wait s) until the machine is idle: less than
    `threshold` of all cores busy over one second. Returns the busy fraction
    last seen."""
    ncpu = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0 = system_busy_seconds(), time.monotonic()
        time.sleep(1.0)
        frac = (system_busy_seconds() - b0) / ((time.monotonic() - t0) * ncpu)
        if frac < threshold or time.monotonic() >= deadline:
            if frac >= threshold:
                print(f"petrel_bench: warning: machine still {100*frac:.0f}% busy after "
                      f"{max_wait:.0f}s; measuring anyway", file=sys.stderr)
            return frac


class Petrel:
    """One `petrel run` child with its stderr drained into a log file."""

    def __init__(self, binary, config, data_dir, threads, log_path, start_timeout=30,
                 memory_limit=None):
        self.log_path = log_path
        self.addr = None
        self._found = threading.Event()
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            [binary, "run", "--config", config, "--data-dir", data_dir,
             "--threads", str(threads), "--api-addr", "127.0.0.1:0",
             "--log-level", "info"]
            + (["--memory-limit", memory_limit] if memory_limit else []),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        deadline = time.monotonic() + start_timeout
        while not self._found.wait(0.005):
            if self.proc.poll() is not None:
                self._drain.join(2)
                fail(f"petrel exited with status {self.proc.returncode} before its API "
                     f"came up; see {log_path}")
            if time.monotonic() > deadline:
                self.kill()
                fail(f"no 'API listening' line within {start_timeout}s; see {log_path}")
        self.conn = http.client.HTTPConnection(self.addr[0], self.addr[1], timeout=10)

    def _read_stderr(self):
        with open(self.log_path, "wb") as log:
            for line in self.proc.stderr:
                log.write(line)
                log.flush()
                if self.addr is None:
                    m = API_RE.search(line.decode("utf-8", "replace"))
                    if m:
                        self.addr = (m.group(1), int(m.group(2)))
                        self._found.set()

    @property
    def pid(self):
        return self.proc.pid

    def metrics(self, names=None):
        """Returns {(name, frozenset(labels)): value} of the samples; only
        those of the metrics in `names` when given. The throughput loop
        polls every 10 ms, and parsing every line of /metrics took 14 % of
        a core's samples on this 2-core machine (BENCHMARKS.md section 24):
        CPU taken from the agent it measures."""
        for attempt in range(3):
            try:
                self.conn.request("GET", "/metrics")
                body = self.conn.getresponse().read().decode("utf-8", "replace")
                break
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.addr[0], self.addr[1], timeout=10)
                if attempt == 2 or self.proc.poll() is not None:
                    raise
        out = {}
        prefixes = tuple(names) if names else None
        for line in body.splitlines():
            if not line or line[0] == "#":
                continue
            if prefixes and not line.startswith(prefixes):
                continue
            try:
                key, value = line.rsplit(" ", 1)
                value = float(value)
            except ValueError:
                continue
            if "{" in key:
                name, rest = key.split("{", 1)
                labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
            else:
                name, labels = key, frozenset()
            out[(name, labels)] = value
        return out

    @staticmethod
    def total(m, name, **want):
        """Sum of the samples of `name` whose labels include `want`."""
        w = set(want.items())
        return sum(v for (n, labels), v in m.items() if n == name and w <= labels)

    def stop(self, timeout=120):
        """SIGTERM, wait; returns (exit status, seconds to stop)."""
        if self.proc.poll() is None:
            t = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                fail(f"petrel did not stop within {timeout}s of SIGTERM (killed); see {self.log_path}")
            took = time.monotonic() - t
        else:
            took = 0.0
        self._drain.join(5)
        self.conn.close()
        return self.proc.returncode, took

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def install_signal_cleanup(children):
    """On SIGTERM/SIGINT (e.g. run.sh's trap), kill our children and exit."""
    def handler(signum, _frame):
        for c in children:
            try:
                c.kill()
            except Exception:
                pass
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def open_tap(p, mode, bin_path):
    """Opens a tap on the whole pipeline (`pipeline`, the sinks' input):
    `stalled` = a client that sends its request and never reads; `reading`
    = `petrel tap` writing to /dev/null. Returns what to close afterwards.
    Waits until the agent counts the tap as open; asks again when the
    request came before the pipeline was running (a 404)."""
    import socket
    deadline = time.monotonic() + 30
    while True:
        if mode == "stalled":
            handle = socket.create_connection(p.addr, timeout=10)
            handle.sendall(b"GET /tap?pipeline=pipeline HTTP/1.0\r\nHost: x\r\n\r\n")
        else:
            handle = subprocess.Popen(
                [bin_path, "tap", "pipeline", "--api-addr", f"{p.addr[0]}:{p.addr[1]}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        attempt_end = time.monotonic() + 2
        while time.monotonic() < attempt_end:
            if p.total(p.metrics(), "petrel_tap_open") >= 1:
                return handle
            time.sleep(0.01)
        close_tap(handle)
        if time.monotonic() > deadline:
            fail("the tap did not open within 30 s")


def close_tap(handle):
    if isinstance(handle, subprocess.Popen):
        handle.kill()
        handle.wait()
    else:
        handle.close()


def cmd_throughput(a):
    a.file = os.path.abspath(a.file)
    workdir = os.path.abspath(a.workdir)
    data_dir = os.path.join(workdir, "data")
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(workdir, exist_ok=True)
    cfg = os.path.join(workdir, "pipeline.yaml")
    # With --tap the agent starts on a path that does not exist yet; the
    # data file is linked there once the tap is open (or at once without
    # one), so that every run reads the file from a discovered link.
    read_path = a.file
    if a.tap:
        read_path = os.path.join(workdir, "in.log")
        if os.path.lexists(read_path):
            os.unlink(read_path)
    size = os.path.getsize(a.file)
    # text/ndjson with --sink-dir: the file sink writes a real file there
    # (tmpfs in bench/run.sh), so the write is paid as in production; it is
    # checked after the run and always deleted (1 GiB outputs must not pile
    # up in RAM).
    sink_path = None
    if a.sink_dir and a.sink.removesuffix(DISK_BUFFER) in ("text", "ndjson", "ndjson-ecs3", "template"):
        os.makedirs(a.sink_dir, exist_ok=True)
        sink_path = os.path.join(os.path.abspath(a.sink_dir),
                                 f"sink-{os.getpid()}.{a.sink.removesuffix(DISK_BUFFER)}")
        if os.path.lexists(sink_path):
            os.unlink(sink_path)
    write_pipeline(cfg, read_path, a.sink, "beginning", a.parse, sink_path)
    try:
        run_throughput(a, workdir, data_dir, cfg, read_path, size, sink_path)
    finally:
        if sink_path and os.path.lexists(sink_path):
            os.unlink(sink_path)


def check_sink_output(a, sink_path, size, events):
    """Returns (bytes, lines) of the file sink's output; fails when they are
    not plausible, so that a sink that lost or never wrote events cannot
    pass for a fast one."""
    try:
        out_bytes = os.path.getsize(sink_path)
    except OSError:
        fail(f"the file sink wrote no output file ({sink_path})")
    out_lines = count_lines(sink_path)
    if out_bytes == 0:
        fail(f"the file sink's output {sink_path} is empty")
    # Every acknowledged event is one line at least (ndjson escapes newlines;
    # text keeps a multiline event's inner ones).
    want = max(a.lines, int(events))
    if out_lines < want:
        fail(f"the file sink wrote {out_lines} lines, expected at least {want}")
    # Raw lines as text are the input again, byte for byte.
    if a.sink == "text" and not a.parse and out_bytes != size:
        fail(f"the file sink wrote {out_bytes} bytes as text, the input has {size}")
    return out_bytes, out_lines


def run_throughput(a, workdir, data_dir, cfg, read_path, size, sink_path):
    children = []
    install_signal_cleanup(children)
    busy_before = wait_quiet(a.quiet_wait) if a.quiet_wait > 0 else None
    sys0, self0 = system_busy_seconds(), self_cpu_seconds()
    p = Petrel(a.bin, cfg, data_dir, a.threads, os.path.join(workdir, "petrel.log"),
               memory_limit=a.memory_limit)
    children.append(p)
    tap_handle = None
    tap_cpu0 = (0.0, 0.0)
    if a.tap:
        if a.tap != "none":
            tap_handle = open_tap(p, a.tap, a.bin)
        os.link(a.file, read_path)
        # Timed from the first bytes read: finding the new file (a directory
        # event or the next scan) is not what is measured.
        while p.total(p.metrics(), "petrel_component_sent_events_total",
                      component_kind="source") <= 0:
            if time.monotonic() > p.t_start + a.timeout:
                fail("the linked file was not read within the timeout")
            time.sleep(0.002)
        p.t_start = time.monotonic()
        tap_cpu0 = proc_cpu_split(p.pid)
    deadline = p.t_start + a.timeout
    polls = 0
    events = 0.0
    done_at = None
    mem_peak = 0.0
    while True:
        if p.proc.poll() is not None:
            fail(f"petrel exited with status {p.proc.returncode} during the run; see {p.log_path}")
        m = p.metrics(POLLED)
        polls += 1
        events = p.total(m, "petrel_component_sent_events_total", component_kind="sink")
        mem_peak = max(mem_peak, p.total(m, "petrel_memory_used_bytes"))
        if a.lines > 0:
            done = events >= a.lines
        else:
            done = p.total(m, "petrel_file_committed_offset_bytes") >= size
        if done:
            done_at = time.monotonic()
            break
        if time.monotonic() > deadline:
            cpu = proc_cpu_seconds(p.pid)
            p.kill()
            fail(f"run did not complete within {a.timeout}s: sink sent {int(events)} of "
                 f"{a.lines} events, CPU {cpu:.1f}s; see {p.log_path}")
        time.sleep(a.poll)
    utime, stime = proc_cpu_split(p.pid)
    # With --tap, only the CPU from the first batch on (starting, opening
    # the tap and waiting for the file are not the pipeline's work).
    utime, stime = utime - tap_cpu0[0], stime - tap_cpu0[1]
    cpu = utime + stime
    cpu_exact = proc_exec_seconds(p.pid)
    # CPU used by everything else on the machine during the run (other
    # processes competing with petrel); our own polling is subtracted.
    other = (system_busy_seconds() - sys0) - cpu - (self_cpu_seconds() - self0)
    hwm_kb = proc_status_kb(p.pid, "VmHWM")
    threads_now = proc_status_kb(p.pid, "Threads")
    pauses = p.total(m, "petrel_backpressure_pauses_total")
    parse_failed = p.total(m, "petrel_component_errors_total", error_type="parse_failed")
    discarded = p.total(m, "petrel_component_discarded_events_total")
    if parse_failed or discarded:
        print(f"petrel_bench: warning: {int(parse_failed)} parse failures, {int(discarded)} "
              f"discarded events; see {cfg}", file=sys.stderr)
    src_bytes = p.total(m, "petrel_component_sent_bytes_total", component_kind="source")
    tap_skipped = p.total(m, "petrel_tap_skipped_events_total")
    if tap_handle is not None:
        close_tap(tap_handle)
    if a.tap:
        os.unlink(read_path)
    status, stop_s = p.stop()
    if status != 0:
        fail(f"petrel exited with status {status} after SIGTERM; see {p.log_path}")
    # Checked after the stop: the agent has closed the file by then.
    sink_bytes, sink_lines = (check_sink_output(a, sink_path, size, events)
                              if sink_path else (None, None))
    wall = done_at - p.t_start
    tags = dict(t.split("=", 1) for t in a.tag)
    emit({**tags,
        "file": a.file, "sink": a.sink, "threads": a.threads,
        "bytes": size, "lines": a.lines, "events": int(events),
        "source_bytes": int(src_bytes),
        "wall_s": wall, "cpu_s": cpu, "utime_s": utime, "stime_s": stime,
        "cpu_exact_s": cpu_exact,
        "hwm_kb": hwm_kb, "os_threads": threads_now,
        "memory_used_peak_bytes": int(mem_peak), "backpressure_pauses": int(pauses),
        "parse": a.parse, "parse_failed": int(parse_failed), "discarded": int(discarded),
        "stop_s": stop_s, "polls": polls,
        "busy_before": busy_before, "other_cpu_s": max(other, 0.0),
        "tap": a.tap, "tap_skipped": int(tap_skipped),
        "sink_path": sink_path or ("/dev/null" if a.sink in ("text", "ndjson", "ndjson-ecs3", "template") else None),
        "sink_bytes": sink_bytes, "sink_lines": sink_lines,
    })


def cmd_rate(a):
    workdir = os.path.abspath(a.workdir)
    data_dir = os.path.join(workdir, "data")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    log_file = os.path.join(workdir, "tail.log")
    open(log_file, "w").close()
    cfg = os.path.join(workdir, "pipeline.yaml")
    write_pipeline(cfg, log_file, a.sink, "beginning")

    children = []
    install_signal_cleanup(children)
    if a.quiet_wait > 0:
        wait_quiet(a.quiet_wait)
    p = Petrel(a.bin, cfg, data_dir, a.threads, os.path.join(workdir, "petrel.log"),
               memory_limit=a.memory_limit)
    children.append(p)

    # Wait until the (empty) file is being tailed.
    deadline = time.monotonic() + 30
    while p.total(p.metrics(), "petrel_files_open") < 1:
        if time.monotonic() > deadline:
            p.kill()
            fail(f"petrel did not open {log_file} within 30s; see {p.log_path}")
        time.sleep(0.05)

    # Idle baseline: CPU while tailing a file that does not grow.
    time.sleep(1.0)
    c0, e0, t0 = proc_cpu_seconds(p.pid), proc_exec_seconds(p.pid), time.monotonic()
    time.sleep(a.idle)
    dt = time.monotonic() - t0
    idle_pct = 100.0 * (proc_cpu_seconds(p.pid) - c0) / dt
    e1 = proc_exec_seconds(p.pid)
    idle_exact_pct = 100.0 * (e1 - e0) / dt if e0 is not None and e1 is not None else None

    gen_log = open(os.path.join(workdir, "gen.log"), "wb", buffering=0)
    sys0 = system_busy_seconds()
    threads0 = set(os.listdir(f"/proc/{p.pid}/task"))
    cpu0, exec0, t0 = proc_cpu_seconds(p.pid), proc_exec_seconds(p.pid), time.monotonic()
    if a.writer == "gen":
        writer_cmd = [a.bin, "gen", "--format", a.format, "--rate", str(a.rate),
                      "--duration", str(a.duration), "--output", log_file, "--seed", str(a.seed)]
    else:
        writer_cmd = [sys.executable, os.path.abspath(__file__), "write-lines", "--output", log_file,
                      "--rate", str(a.rate), "--duration", str(a.duration)]
    gen = subprocess.Popen(writer_cmd, stdin=subprocess.DEVNULL, stdout=gen_log, stderr=gen_log)
    children.append(gen)

    rss_samples = []
    cpu_samples = []
    lag_samples = []
    last_cpu, last_t = cpu0, t0
    next_sample = t0 + 1.0
    hard_deadline = t0 + a.duration + a.timeout
    gen_done_at = None
    lines = None
    arrived = False
    events = 0.0
    while True:
        now = time.monotonic()
        if next_sample > now:
            time.sleep(min(next_sample - now, 0.05))
        now = time.monotonic()
        if p.proc.poll() is not None:
            fail(f"petrel exited with status {p.proc.returncode} during the rate run; see {p.log_path}")
        if gen_done_at is None and gen.poll() is not None:
            gen_done_at = now
            if gen.returncode != 0:
                p.kill()
                fail(f"petrel gen failed with status {gen.returncode}; see {gen_log.name}")
            lines = gen_lines(gen_log.name) or count_lines(log_file)
        if now >= next_sample:
            cpu = proc_cpu_seconds(p.pid)
            rss_samples.append(proc_status_kb(p.pid, "VmRSS"))
            cpu_samples.append(100.0 * (cpu - last_cpu) / (now - last_t))
            last_cpu, last_t = cpu, now
            next_sample += 1.0
            m = p.metrics()
            lag_samples.append(p.total(m, "petrel_file_lag_bytes"))
        if lines is not None:
            events = p.total(p.metrics(), "petrel_component_sent_events_total", component_kind="sink")
            if events >= lines:
                arrived = True
                break
        if now > hard_deadline:
            break
    t1 = time.monotonic()
    cpu1 = proc_cpu_seconds(p.pid)
    exec1 = proc_exec_seconds(p.pid)
    threads1 = set(os.listdir(f"/proc/{p.pid}/task"))
    sys_busy = system_busy_seconds() - sys0
    hwm_kb = proc_status_kb(p.pid, "VmHWM")
    if gen.poll() is None:
        gen.kill()
        gen.wait()
    status, _ = p.stop()
    gen_log.close()
    if status != 0:
        fail(f"petrel exited with status {status} after SIGTERM; see {p.log_path}")
    written = os.path.getsize(log_file)
    emit({
        "rate": a.rate, "duration": a.duration, "sink": a.sink, "threads": a.threads,
        "writer": a.writer,
        "bytes_written": written, "lines": lines, "events": int(events),
        "arrived": arrived,
        "drain_s": (t1 - gen_done_at) if gen_done_at else None,
        "wall_s": t1 - t0,
        "cpu_s": cpu1 - cpu0,
        "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        # Exact scheduler time; threads that came or went during the run
        # make it approximate (listed in threads_changed).
        "cpu_exact_pct": (100.0 * (exec1 - exec0) / (t1 - t0)
                          if exec0 is not None and exec1 is not None else None),
        "threads_changed": len(threads0 ^ threads1),
        "idle_exact_pct": idle_exact_pct,
        "cpu_pct_max_1s": max(cpu_samples) if cpu_samples else None,
        "idle_cpu_pct": idle_pct,
        "rss_avg_kb": sum(rss_samples) / len(rss_samples) if rss_samples else None,
        "rss_max_kb": max(rss_samples) if rss_samples else None,
        "hwm_kb": hwm_kb,
        "lag_max_bytes": max(lag_samples) if lag_samples else None,
        "samples": len(rss_samples),
        "machine_busy_pct": 100.0 * sys_busy / ((t1 - t0) * (os.cpu_count() or 1)),
    })


def run_figures(r):
    """(MB/s, CPU s per GB, peak RSS MB) of one throughput result. CPU is the
    scheduler's time when the kernel exposes it, else utime+stime."""
    cpu = r["cpu_exact_s"] if r.get("cpu_exact_s") is not None else r["cpu_s"]
    return (r["bytes"] / r["wall_s"] / 1e6, cpu / (r["bytes"] / 1e9), r["hwm_kb"] / 1024)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def cmd_stats(a):
    """One tab-separated line for bench/run.sh about the runs of one row: the
    fastest run (file, wall s, CPU s, VmHWM kB, other procs' CPU s, parse
    failures), then min, max and median MB/s and the medians of CPU s per GB
    and peak RSS MB over all runs."""
    runs = [(f, json.load(open(f))) for f in a.files]
    fig = [run_figures(r) for _, r in runs]
    best_f, best = min(runs, key=lambda fr: fr[1]["wall_s"])
    cpu = best["cpu_exact_s"] if best.get("cpu_exact_s") is not None else best["cpu_s"]
    mbs = [x[0] for x in fig]
    print("\t".join(str(v) for v in (
        best_f, best["wall_s"], cpu, best["hwm_kb"], best["other_cpu_s"], best["parse_failed"],
        f"{min(mbs):.1f}", f"{max(mbs):.1f}", f"{median(mbs):.1f}",
        f"{median([x[1] for x in fig]):.3f}", f"{median([x[2] for x in fig]):.1f}")))


def compare_rows(jsonl):
    """{(dataset, variant, threads): {"base"|"current": [figures...]}} in the
    order the rows were first measured."""
    rows = {}
    with open(jsonl) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                key = (r["dataset"], r["variant"], r["threads"])
                # Other processes' CPU in cores during the run: when one side's
                # runs were crowded and the other's not, its ratio is noise.
                other = r["other_cpu_s"] / r["wall_s"]
                rows.setdefault(key, {"base": [], "current": []})[r["side"]].append(
                    run_figures(r) + (other,))
    return rows


COMPARE_HEADER = (
    "| data set | variant | threads | runs | MB/s base | MB/s current | MB/s ratio "
    "| CPU s/GB base | CPU s/GB current | CPU s/GB ratio | peak RSS MB base "
    "| peak RSS MB current | RSS ratio | other procs base | other procs current |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def compare_line(key, sides):
    """One markdown row: median (min–max) per side and metric, and the ratio
    current/base of the medians."""
    def cell(xs, fmt):
        return f"{fmt.format(median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"
    cells = []
    for i, fmt in ((0, "{:.0f}"), (1, "{:.2f}"), (2, "{:.1f}")):
        b = [x[i] for x in sides["base"]]
        c = [x[i] for x in sides["current"]]
        ratio = f"{median(c) / median(b):.3f}" if b and c and median(b) else "-"
        cells += [cell(b, fmt) if b else "-", cell(c, fmt) if c else "-", ratio]
    for side in ("base", "current"):
        o = [x[3] for x in sides[side]]
        cells.append(f"{median(o):.2f}" if o else "-")
    n = f"{len(sides['base'])}+{len(sides['current'])}"
    return f"| {key[0]} | {key[1]} | {key[2]} | {n} | " + " | ".join(cells) + " |"


def cmd_compare_report(a):
    rows = compare_rows(a.jsonl)
    if a.row:
        # Progress output of bench/compare.sh: the header once, then one line
        # per finished row.
        ds, variant, thr = a.row.split(":")
        key = (ds, variant, int(thr))
        if a.header:
            print(COMPARE_HEADER)
        print(compare_line(key, rows[key]))
        return
    with open(a.md, "w") as out:
        out.write(f"# Petrel: {a.current} against {a.base} ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())})\n\n")
        if a.preamble:
            with open(a.preamble) as f:
                out.write(f.read().rstrip("\n") + "\n\n")
        out.write(COMPARE_HEADER + "\n")
        for key, sides in rows.items():
            out.write(compare_line(key, sides) + "\n")
        out.write(
            "\nEach cell: median (min–max) over the runs of that side; base and current ran "
            "interleaved (base, current, base, current, ...) in the same session. Ratio = "
            "current / base of the medians: MB/s above 1 is faster, CPU s per GB and RSS "
            "below 1 are better. MB = 10^6 bytes, GB = 10^9 bytes. CPU s = on-CPU time of "
            "petrel's threads (se.sum_exec_runtime, else utime+stime). Other procs = median CPU "
            "of the other processes on the machine during the runs, in cores: where the two "
            "sides differ by more than ~0.2, that row's ratio reflects the machine, not the "
            "code; measure it again or with more BENCH_REPEAT.\n")


def gen_lines(log_path):
    """Lines written, from `petrel gen`'s "wrote B bytes, L lines, ..." report."""
    try:
        with open(log_path, "rb") as f:
            m = re.search(rb"wrote (\d+) bytes, (\d+) lines", f.read())
        return int(m.group(2)) if m else None
    except OSError:
        return None


def parse_size(text):
    """Byte counts like petrel's: 1048576, 10MB (10^6), 64MiB (2^20), 1G, 1GiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m:
        fail(f"not a byte count: {text!r}")
    units = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
             "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30}
    unit = m.group(2).lower()
    if unit not in units:
        fail(f"unknown unit in {text!r}")
    return int(m.group(1)) * units[unit]


def cmd_write_lines(a):
    """Appends 128-byte single128-like lines with one write() per line (like
    an application logging line by line, unbuffered), paced every 1 ms, at
    --rate bytes/s for --duration s. Prints the number of lines written."""
    line = (b"[2025-04-03 10:02:06.561793] [info] [131172] "
            b"/root/stdout-test/server_stdout.go:165 log:" + b"x" * 128)[:127] + b"\n"
    per_s = parse_size(a.rate) / len(line)
    fd = os.open(a.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    t0 = time.monotonic()
    n = 0
    while True:
        now = time.monotonic() - t0
        if now >= a.duration:
            break
        due = int(per_s * now)
        while n < due:
            os.write(fd, line)
            n += 1
        time.sleep(0.001)
    os.close(fd)
    print(f"wrote {n * len(line)} bytes, {n} lines", file=sys.stderr)


def count_lines(path):
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return n
            n += b.count(b"\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("throughput")
    t.add_argument("--bin", required=True)
    t.add_argument("--file", required=True)
    t.add_argument("--lines", type=int, required=True,
                   help="events expected at the sink; 0 = wait for committed offset == size")
    t.add_argument("--sink", required=True,
                   help="blackhole, text, ndjson, template (file sink on /dev/null), ndjson-file:PATH, "
                        "elasticsearch:URL, loki:URL, loki-json:URL, http:URL, opentelemetry:URL, s3:URL; "
                        "a name ending in +disk puts the sink behind a disk buffer")
    t.add_argument("--sink-dir", metavar="DIR",
                   help="text/ndjson: the file sink writes DIR/sink-PID.SINK instead of "
                        "/dev/null; the output is checked after the run and deleted")
    t.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                   help="copied into the JSON result (e.g. dataset=single128)")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--workdir", required=True)
    t.add_argument("--timeout", type=float, default=600)
    t.add_argument("--memory-limit", help="petrel's --memory-limit (default: petrel's default)")
    t.add_argument("--parse", metavar="DATASET", choices=sorted(PARSE),
                   help="add the parsing meant for this data set (processors or multiline)")
    t.add_argument("--poll", type=float, default=0.01, help="seconds between /metrics polls")
    t.add_argument("--quiet-wait", type=float, default=300,
                   help="wait up to this long for an idle machine before starting (0: don't)")
    t.add_argument("--tap", choices=["none", "stalled", "reading"],
                   help="start on a link made after a tap on the pipeline is open: none (the "
                        "link flow without a tap), stalled (a client that never reads) or reading "
                        "(`petrel tap` to /dev/null)")
    t.set_defaults(func=cmd_throughput)

    r = sub.add_parser("rate")
    r.add_argument("--bin", required=True)
    r.add_argument("--rate", required=True, help="bytes per second, e.g. 10MB")
    r.add_argument("--duration", type=int, default=60)
    r.add_argument("--format", default="single128")
    r.add_argument("--sink", default="text",
                   help="blackhole, text, ndjson (file sink on /dev/null) or kafka:HOST:PORT (ndjson)")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--memory-limit", help="petrel's --memory-limit (default: petrel's default)")
    r.add_argument("--writer", choices=["gen", "lines"], default="gen",
                   help="gen: `petrel gen --rate` (one write per 10 ms slice); lines: one "
                        "write() per 128-byte line, paced every 1 ms (an unbuffered logger)")
    r.add_argument("--idle", type=float, default=5.0, help="seconds of idle baseline")
    r.add_argument("--workdir", required=True)
    r.add_argument("--timeout", type=float, default=120,
                   help="seconds after the generator's duration to wait for all lines")
    r.add_argument("--quiet-wait", type=float, default=300,
                   help="wait up to this long for an idle machine before starting (0: don't)")
    r.set_defaults(func=cmd_rate)

    w = sub.add_parser("write-lines", help="append lines one write() each at a rate")
    w.add_argument("--output", required=True)
    w.add_argument("--rate", required=True)
    w.add_argument("--duration", type=float, required=True)
    w.set_defaults(func=cmd_write_lines)

    s = sub.add_parser("stats", help="summarise the runs of one bench/run.sh row")
    s.add_argument("files", nargs="+", metavar="RESULT.json")
    s.set_defaults(func=cmd_stats)

    c = sub.add_parser("compare-report", help="bench/compare.sh's table from its jsonl")
    c.add_argument("--jsonl", required=True, help="results tagged side=base|current, dataset, variant")
    c.add_argument("--row", metavar="DATASET:VARIANT:THREADS",
                   help="print this row's markdown line only (with --header, the header first)")
    c.add_argument("--header", action="store_true")
    c.add_argument("--md", help="write the whole table (with --base, --current, --preamble) here")
    c.add_argument("--base", default="base")
    c.add_argument("--current", default="current")
    c.add_argument("--preamble", metavar="FILE", help="markdown put before the table")
    c.set_defaults(func=cmd_compare_report)

    q = sub.add_parser("quiet", help="wait until the machine is idle")
    q.add_argument("--max-wait", type=float, default=300)
    q.set_defaults(func=lambda a: wait_quiet(a.max_wait) if a.max_wait > 0 else None)

    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
