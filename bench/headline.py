#!/usr/bin/env python3
"""The measuring and reporting half of bench/headline.sh (Python standard
library only). bench/headline.sh builds Petrel, finds the peers, generates
the data and writes a plan (JSON); this script runs the agents on it and
writes the report.

  headline.py measure PLAN   the file rows, the raw limit, the 10 MB/s row
                             and the pipelines row; every run appends one
                             JSON object to <work>/runs.jsonl
  headline.py report PLAN    runs.jsonl + the syslog and sinks rows
                             (bench/syslog.sh's and bench/sinks.sh's own
                             results) → bench/out/headline.json,
                             bench/results/headline-<date>.md and the
                             headline section of BENCHMARKS.md

How a file row is measured (the same for every agent, peers and Petrel):
the input is a generated file (bench/lib/throughput.sh gen_file, `petrel
gen`), page-cached before each run; the agent starts with a fresh state
directory, reads it from the beginning and writes a file on tmpfs; the run
ends when that file holds one event per input event (a newline per event,
or the Collector's per-record key, bench/lib/agents.py), counted as it
grows. Wall time counts from the agent's start. CPU = the agent's on-CPU
time from the scheduler (se.sum_exec_runtime of its threads; utime+stime
when the kernel lacks it), read before it is stopped; peak RSS = VmHWM.
The raw limit is `wc -l` and `cat > /dev/null` on the same page-cached
file, with their CPU from wait4(). Runs are interleaved:
repetition 1 of every agent, then repetition 2, ...; the report gives the
median of each figure over the repetitions.

Rate rows (10 MB/s, pipelines): the agent starts on empty files, is
considered ready when its start-up is over (wait_ready: its CPU under 5 %
of a core for a second, or steady for three seconds; at most 120 s), then a writer appends at the rate (`petrel gen --rate` for
single128; bench/kubernetes.py's writer for the pipelines row, 283-byte
nginx messages, CRI-wrapped, every 20 ms); CPU % = the agent's on-CPU time
from the writer's start until every written line is in the output, over
that wall time; RSS is sampled every second (average) and VmHWM read at the
end.
"""

import datetime
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "lib"))
import agents  # noqa: E402  bench/lib/agents.py
import petrel_bench as pb  # noqa: E402  bench/petrel_bench.py: /proc readers, quiet wait

FILE_ROWS = ("single128", "regex512", "json512", "delim512", "multiline512")
ROW_TITLES = {
    "single128": "single128 → file (raw lines)",
    "regex512": "regex512 → ndjson (regex parser)",
    "json512": "json512 → ndjson (JSON parser)",
    "delim512": "delim512 → ndjson (delimiter parser)",
    "multiline512": "multiline512 → ndjson (start pattern, 23-line events)",
}
LIMITS = ("wc -l", "cat")


def log(msg):
    print(f"headline: {msg}", file=sys.stderr, flush=True)


def load_plan(path):
    with open(path) as f:
        return json.load(f)


def append(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


class Counter:
    """Counts `marker` in the files matching `pattern` (a path, or a
    prefix followed by `*`) as they grow, reading only the new bytes."""

    def __init__(self, pattern, marker):
        self.pattern, self.marker = pattern, marker
        self.files = {}  # path -> [fd, offset, count, tail]

    def count(self):
        for path in glob.glob(self.pattern):
            if path not in self.files:
                try:
                    self.files[path] = [os.open(path, os.O_RDONLY), 0, 0, b""]
                except OSError:
                    continue
        keep = len(self.marker) - 1
        total = 0
        for st in self.files.values():
            while True:
                b = os.read(st[0], 4 << 20)
                if not b:
                    break
                buf = st[3] + b
                st[2] += buf.count(self.marker)
                # A marker cut between two reads is counted once: the kept
                # tail is shorter than the marker.
                st[3] = buf[-keep:] if keep else b""
                st[1] += len(b)
            total += st[2]
        return total

    def bytes(self):
        return sum(st[1] for st in self.files.values())

    def close(self):
        for st in self.files.values():
            os.close(st[0])
        self.files = {}


def cpu_of(pid):
    """(on-CPU seconds, from the scheduler or else from ticks)."""
    exact = pb.proc_exec_seconds(pid)
    return exact if exact is not None else pb.proc_cpu_seconds(pid)


def start(agent, argv, workdir):
    logf = open(os.path.join(workdir, "agent.log"), "wb")
    env = dict(os.environ)
    env.update(agent.env() or {})
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                         env=env, cwd=workdir, start_new_session=True)
    logf.close()
    return p


def stop(p, timeout=30):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def log_tail(workdir):
    try:
        with open(os.path.join(workdir, "agent.log"), "rb") as f:
            return f.read()[-1500:].decode("utf-8", "replace")
    except OSError:
        return ""


def page_cache(path):
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


# --- file rows -------------------------------------------------------------

def run_file(plan, agent, ds, rep):
    data = plan["data"][ds]
    work = os.path.join(plan["work"], "runs", f"{ds}-{agent.name}")
    outdir = os.path.join(plan["sink_dir"], f"{ds}-{agent.name}")
    fresh(work)
    fresh(outdir)
    output = os.path.join(outdir, "out")
    parse = None if ds == "single128" else ds
    argv = agent.command(work, [data["file"]], output, parse)
    # Multiline: the last event waits for each agent's flush timeout by
    # design; the run is complete with all the others.
    expect = data["events"] - 1 if ds == "multiline512" else data["events"]
    page_cache(data["file"])
    if plan["quiet_wait"] > 0:
        pb.wait_quiet(plan["quiet_wait"])
    counter = Counter(output + "*", agent.marker)
    sys0, self0 = pb.system_busy_seconds(), pb.self_cpu_seconds()
    t0 = time.monotonic()
    p = start(agent, argv, work)
    result = {"kind": "file", "row": ds, "agent": agent.name, "rep": rep,
              "bytes": data["bytes"], "events": expect}
    try:
        deadline = t0 + plan["timeout"]
        n = 0
        while True:
            if p.poll() is not None:
                result["error"] = f"exited with status {p.returncode}: {log_tail(work)}"
                break
            n = counter.count()
            if n >= expect:
                break
            if time.monotonic() > deadline:
                result["error"] = f"timeout after {plan['timeout']} s: {n} of {expect} events"
                break
            time.sleep(0.01)
        done = time.monotonic()
        if "error" not in result:
            cpu = cpu_of(p.pid)
            result.update({
                "wall_s": done - t0, "cpu_s": cpu, "hwm_kb": pb.proc_status_kb(p.pid, "VmHWM"),
                "threads": pb.proc_status_kb(p.pid, "Threads"),
                "out_events": n, "out_bytes": counter.bytes(),
                "other_cpu_s": max(0.0, pb.system_busy_seconds() - sys0 - cpu
                                   - (pb.self_cpu_seconds() - self0)),
            })
    finally:
        stop(p)
        counter.close()
        shutil.rmtree(outdir, ignore_errors=True)
        shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
    return result


def run_limit(plan, name, ds, rep):
    """`wc -l` or `cat > /dev/null` on the page-cached file: wall and CPU of
    the child (wait4)."""
    data = plan["data"][ds]
    page_cache(data["file"])
    if plan["quiet_wait"] > 0:
        pb.wait_quiet(plan["quiet_wait"])
    with open(data["file"], "rb") as f:
        argv = ["wc", "-l"] if name == "wc -l" else ["cat"]
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdin=f, stdout=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    # No peak RSS: the child's high-water mark counts the pages it shared
    # with this Python process between fork and exec.
    return {"kind": "file", "row": ds, "agent": name, "rep": rep, "bytes": data["bytes"],
            "events": data["events"], "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
            "hwm_kb": None, "other_cpu_s": None}


# --- rate rows ---------------------------------------------------------------

def wait_ready(p, max_wait=120.0):
    """Until the agent's start-up is over, from its CPU per second: under
    5 % of a core; or, for an agent that never idles (polling a thousand
    inputs), three seconds within 25 % of each other at half its start-up
    peak or less, or after 60 s three such seconds at any level."""
    t0 = time.monotonic()
    seen, peak = [], 0.0
    while time.monotonic() < t0 + max_wait:
        if p.poll() is not None:
            return False
        c0 = cpu_of(p.pid)
        time.sleep(1.0)
        used = cpu_of(p.pid) - c0
        if used < 0.05:
            return True
        seen.append(used)
        peak = max(peak, used)
        last = seen[-3:]
        if len(last) == 3 and max(last) <= 1.25 * min(last):
            mean = sum(last) / 3
            if mean <= 0.5 * peak or time.monotonic() - t0 >= 60:
                return True
    return p.poll() is None


def run_rate(plan, agent, row, rep):
    """10 MB/s of single128 into one file (row "rate"), or the pipelines
    row: N inputs (globs over directories), 4 of them written at a
    total rate, each agent with one input (source, receiver) per pipeline."""
    r = plan["rate"] if row == "rate" else plan["pipelines"]
    work = os.path.join(plan["work"], "runs", f"{row}-{agent.name}")
    outdir = os.path.join(plan["sink_dir"], f"{row}-{agent.name}")
    fresh(work)
    fresh(outdir)
    output = os.path.join(outdir, "out")
    if row == "rate":
        infile = os.path.join(outdir, "in.log")
        open(infile, "wb").close()
        inputs, files = [infile], [infile]
    else:
        inputs, files = [], []
        for i in range(r["count"]):
            d = os.path.join(work, "apps", f"app-{i}")
            os.makedirs(d)
            inputs.append(os.path.join(d, "*.log"))
            if i < r["active"]:
                open(os.path.join(d, "0.log"), "wb").close()
                files.append(os.path.join(d, "0.log"))
    argv = agent.command(work, inputs, output)
    result = {"kind": "rate", "row": row, "agent": agent.name, "rep": rep,
              "rate_mb_s": r["mb_s"], "seconds": r["seconds"], "inputs": len(inputs)}
    if plan["quiet_wait"] > 0:
        pb.wait_quiet(plan["quiet_wait"])
    p = start(agent, argv, work)
    writer = None
    counter = Counter(output + "*", agent.marker)
    try:
        t_start = time.monotonic()
        if not wait_ready(p):
            result["error"] = f"not ready (exited {p.returncode}): {log_tail(work)}"
            return result
        result["ready_s"] = time.monotonic() - t_start
        result["rss_ready_kb"] = pb.proc_status_kb(p.pid, "VmRSS")
        wlog = open(os.path.join(work, "writer.log"), "wb")
        if row == "rate":
            wargv = [plan["petrel"], "gen", "--format", "single128", "--rate", f"{r['mb_s']:g}MB",
                     "--duration", str(r["seconds"]), "--output", infile, "--seed", "1"]
        else:
            lst = os.path.join(work, "writer-files")
            with open(lst, "w") as f:
                f.write("\n".join(files) + "\n")
            wargv = [sys.executable, os.path.join(HERE, "kubernetes.py"), "--writer",
                     "--writer-rate", str(r["mb_s"]), "--writer-duration", str(r["seconds"]),
                     "--writer-files-from", lst]
        c0, t0 = cpu_of(p.pid), time.monotonic()
        writer = subprocess.Popen(wargv, stdin=subprocess.DEVNULL, stdout=wlog, stderr=wlog)
        rss, next_sample = [], t0 + 1.0
        lines = None
        deadline = t0 + r["seconds"] + plan["rate_drain"]
        n = 0
        while True:
            if p.poll() is not None:
                result["error"] = f"exited with status {p.returncode}: {log_tail(work)}"
                return result
            now = time.monotonic()
            if now >= next_sample:
                rss.append(pb.proc_status_kb(p.pid, "VmRSS"))
                next_sample += 1.0
            if lines is None and writer.poll() is not None:
                wlog.close()
                with open(os.path.join(work, "writer.log"), "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                m = re.search(r"wrote \d+ bytes, (\d+) lines", text) or re.search(r'"lines": (\d+)', text)
                if writer.returncode != 0 or not m:
                    result["error"] = f"writer failed: {text[-500:]}"
                    return result
                lines = int(m.group(1))
            n = counter.count()
            if lines is not None and n >= lines:
                break
            if now > deadline:
                result["error"] = f"{n} of {lines} lines arrived within {plan['rate_drain']} s of the writer's end"
                return result
            time.sleep(0.05)
        t1 = time.monotonic()
        cpu = cpu_of(p.pid) - c0
        result.update({
            "lines": lines, "arrived": n, "wall_s": t1 - t0, "cpu_s": cpu,
            "cpu_pct": 100.0 * cpu / (t1 - t0),
            "rss_avg_kb": sum(rss) / len(rss) if rss else None,
            "rss_max_kb": max(rss) if rss else None,
            "hwm_kb": pb.proc_status_kb(p.pid, "VmHWM"),
            "threads": pb.proc_status_kb(p.pid, "Threads"),
        })
        return result
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        stop(p)
        counter.close()
        shutil.rmtree(outdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def cmd_measure(plan_path):
    plan = load_plan(plan_path)
    runs = os.path.join(plan["work"], "runs.jsonl")
    ags = [agents.make(n, b) for n, b in plan["agents"].items()]

    def record(res):
        append(runs, res)
        if res.get("error"):
            log(f"{res['row']} {res['agent']} #{res['rep']}: FAILED: {res['error'][:300]}")
        elif res["kind"] == "file":
            rss = f", {res['hwm_kb'] / 1024:.1f} MB" if res.get("hwm_kb") is not None else ""
            log(f"{res['row']} {res['agent']} #{res['rep']}: {res['bytes'] / res['wall_s'] / 1e6:.0f} MB/s, "
                f"{res['cpu_s'] / (res['bytes'] / 1e9):.2f} CPU s/GB{rss}")
        else:
            log(f"{res['row']} {res['agent']} #{res['rep']}: {res['cpu_pct']:.2f} % CPU, "
                f"RSS avg {res['rss_avg_kb'] / 1024:.1f} MB, ready in {res['ready_s']:.1f} s")

    for row in plan["rows"]:
        for rep in range(1, plan["repeat"] + 1):
            if row in FILE_ROWS:
                for name in LIMITS:
                    record(run_limit(plan, name, row, rep))
                for a in ags:
                    record(run_file(plan, a, row, rep))
            elif row in ("rate", "pipelines"):
                for a in ags:
                    if row == "pipelines" and a.name not in plan["pipelines"]["agents"]:
                        continue
                    record(run_rate(plan, a, row, rep))


# --- report -------------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def file_figures(rs):
    ok = [r for r in rs if not r.get("error")]
    if not ok:
        return None
    return {
        "runs": len(ok), "failed": len(rs) - len(ok),
        "mb_s": med([r["bytes"] / r["wall_s"] / 1e6 for r in ok]),
        "events_s": med([r["events"] / r["wall_s"] for r in ok]),
        "cpu_s_per_gb": med([r["cpu_s"] / (r["bytes"] / 1e9) for r in ok]),
        "cpu_s_per_m_events": med([r["cpu_s"] / (r["events"] / 1e6) for r in ok]),
        "peak_rss_mb": med([r["hwm_kb"] / 1024 for r in ok if r.get("hwm_kb") is not None]),
        "mb_s_range": [min(r["bytes"] / r["wall_s"] / 1e6 for r in ok),
                       max(r["bytes"] / r["wall_s"] / 1e6 for r in ok)],
        "other_cpu_cores": med([r["other_cpu_s"] / r["wall_s"] for r in ok
                                if r.get("other_cpu_s") is not None]),
    }


def rate_figures(rs):
    ok = [r for r in rs if not r.get("error")]
    if not ok:
        return None
    return {
        "runs": len(ok), "failed": len(rs) - len(ok),
        "cpu_pct": med([r["cpu_pct"] for r in ok]),
        "rss_avg_mb": med([r["rss_avg_kb"] / 1024 for r in ok if r.get("rss_avg_kb")]),
        "peak_rss_mb": med([r["hwm_kb"] / 1024 for r in ok]),
        "rss_ready_mb": med([r["rss_ready_kb"] / 1024 for r in ok]),
        "ready_s": med([r["ready_s"] for r in ok]),
        "lines": med([r["lines"] for r in ok]),
    }


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def syslog_rows(plan):
    """bench/syslog.sh's rows (its TSV, one file per repetition): per
    receiver, medians of msgs/s, CPU s per million and peak RSS."""
    by = {}
    for path in sorted(glob.glob(os.path.join(plan["work"], "syslog-*.tsv"))):
        with open(path) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) < 9 or p[2] != "OK":
                    if len(p) >= 4 and p[2] == "SKIP":
                        by.setdefault(p[1], {"skip": p[3], "runs": []})
                    continue
                case, recv = p[0], p[1]
                sent, got, dur, cpu, hwm = int(p[3]), int(p[4]), float(p[5]), float(p[6]), float(p[7])
                if got <= 0 or dur <= 0:
                    continue
                by.setdefault(recv, {"runs": []})["runs"].append({
                    "case": case, "sent": sent, "received": got, "msgs_s": got / dur,
                    "cpu_s_per_m": cpu / (got / 1e6), "peak_rss_mb": hwm / 1024,
                    "loss_pct": 100.0 * (sent - got) / sent if sent else 0.0})
    out = {}
    for recv, d in by.items():
        rs = d["runs"]
        if not rs:
            out[recv] = {"skip": d.get("skip", "no result")}
            continue
        out[recv] = {"case": rs[0]["case"], "runs": len(rs),
                     "msgs_s": med([r["msgs_s"] for r in rs]),
                     "cpu_s_per_m": med([r["cpu_s_per_m"] for r in rs]),
                     "peak_rss_mb": med([r["peak_rss_mb"] for r in rs]),
                     "loss_pct": max(r["loss_pct"] for r in rs)}
    return out


def sinks_rows(plan):
    rows = load_jsonl(os.path.join(plan["work"], "sinks.jsonl"))
    by = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    out = {}
    for name, rs in by.items():
        gb = rs[0]["bytes"] / 1e9
        out[name] = {"runs": len(rs),
                     "mb_s": med([r["bytes"] / 1e6 / r["wall_s"] for r in rs]),
                     "cpu_s_per_gb": med([(r["cpu_exact_s"] if r.get("cpu_exact_s") is not None
                                           else r["cpu_s"]) / gb for r in rs]),
                     "peak_rss_mb": med([r["hwm_kb"] / 1024 for r in rs]),
                     "server_cpu_s_per_gb": med([r["server_cpu_s"] / gb for r in rs])}
    return out


def fmt(x, digits=0):
    if x is None:
        return "–"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def build_json(plan):
    runs = load_jsonl(os.path.join(plan["work"], "runs.jsonl"))
    rows = []
    for row in plan["rows"]:
        if row in FILE_ROWS:
            for name in list(LIMITS) + list(plan["agents"]):
                rs = [r for r in runs if r["row"] == row and r["agent"] == name]
                if rs:
                    rows.append({"row": row, "agent": name, "kind": "file",
                                 "figures": file_figures(rs),
                                 "errors": [r["error"] for r in rs if r.get("error")]})
        elif row in ("rate", "pipelines"):
            for name in plan["agents"]:
                rs = [r for r in runs if r["row"] == row and r["agent"] == name]
                if rs:
                    rows.append({"row": row, "agent": name, "kind": "rate",
                                 "figures": rate_figures(rs),
                                 "errors": [r["error"] for r in rs if r.get("error")]})
    return {
        "date": plan["date"], "command": plan["command"], "machine": plan["machine"],
        "petrel": plan["petrel_info"], "peers": plan["versions"], "skipped": plan["skipped"],
        "knobs": plan["knobs"], "rate": plan["rate"], "pipelines": plan["pipelines"], "rows": rows,
        "syslog": syslog_rows(plan) if "syslog" in plan["rows"] else None,
        "sinks": sinks_rows(plan) if "sinks" in plan["rows"] else None,
    }


def cell_file(f):
    if not f:
        return "failed"
    s = f"**{fmt(f['mb_s'])}** · {fmt(f['cpu_s_per_gb'], 2)} · {fmt(f['peak_rss_mb'], 1)}"
    return s


def cell_rate(f):
    if not f:
        return "failed"
    return f"**{fmt(f['cpu_pct'], 2)} %** · {fmt(f['rss_avg_mb'], 1)} · {fmt(f['peak_rss_mb'], 1)}"


def agent_label(name):
    return agents.AGENTS[name].label if name in agents.AGENTS else name


def markdown(h, plan, plots_rel):
    """The headline section (also the top of the results file)."""
    names = list(plan["agents"])
    L = []
    smoke = plan["knobs"].get("smoke")
    k = plan["knobs"]
    if smoke:
        L += [f"> **Smoke run, to be replaced** ({k['size']} per data set, {k['repeat']} run(s) "
              f"per agent, {k['rate_seconds']} s rate rows, {h['date']}): it shows that every row "
              "runs and produces numbers; they are not the measurement (small inputs, few runs, "
              "other work on the machine: see the \"other procs\" column of the results file). "
              "The full run is `bench/headline.sh` on a quiet machine.", ""]
    m = h["machine"]
    def named(label, v):
        return v if label.lower() in v.lower() else f"{label} {v}"
    L += [f"Measured {h['date']} on {m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, "
          f"{m['memory']}; {named('Petrel', h['petrel']['version'])} at commit {h['petrel']['commit']}; "
          + "; ".join([named(agent_label(n), v) for n, v in h["peers"].items()]
                      + [named(n, v) for n, v in plan.get("versions_extra", {}).items()]) + ".",
          f"Command: `{h['command']}`. Median of {k['repeat']} interleaved run(s); "
          f"{k['size']} per data set; MB = 10^6 bytes, GB = 10^9 bytes.", ""]
    # File rows.
    by = {(r["row"], r["agent"]): r for r in h["rows"]}
    cols = ["raw limit: wc -l / cat"] + [agent_label(n) for n in names]
    if any(r in plan["rows"] for r in FILE_ROWS):
        L += ["| page-cached file → file on tmpfs | " + " | ".join(cols) + " |",
              "|---|" + "---:|" * len(cols)]
    for row in FILE_ROWS:
        if row not in plan["rows"]:
            continue
        wc, cat = by.get((row, "wc -l")), by.get((row, "cat"))
        lim = (f"{fmt(wc['figures']['mb_s'])} / {fmt(cat['figures']['mb_s'])}"
               if wc and cat and wc["figures"] and cat["figures"] else "–")
        cells = [lim]
        for n in names:
            r = by.get((row, n))
            cells.append(cell_file(r["figures"]) if r else "–")
        L.append(f"| {ROW_TITLES[row]} | " + " | ".join(cells) + " |")
    if any(r in plan["rows"] for r in FILE_ROWS):
        L += ["", "Cells: **MB/s** · CPU seconds per GB · peak RSS MB (VmHWM). Raw lines go "
              "out as they came, except from the Collector, whose file exporter writes OTLP "
              "JSON.", ""]
    # Rate rows.
    rate_rows = [x for x in ("rate", "pipelines") if x in plan["rows"]]
    if rate_rows:
        pl = plan["pipelines"]
        titles = {"rate": f"{plan['rate']['mb_s']:g} MB/s of single128 for {plan['rate']['seconds']} s",
                  "pipelines": f"{pl['count']:,} pipelines, {pl['active']} written at {pl['mb_s']:g} MB/s "
                               f"for {pl['seconds']} s"}
        L += ["| at a fixed rate → file on tmpfs | " + " | ".join(agent_label(n) for n in names) + " |",
              "|---|" + "---:|" * len(names)]
        for row in rate_rows:
            cells = []
            for n in names:
                r = by.get((row, n))
                if r:
                    cells.append(cell_rate(r["figures"]))
                elif row == "pipelines":
                    cells.append("not run")
                else:
                    cells.append("–")
            L.append(f"| {titles[row]} | " + " | ".join(cells) + " |")
        L += ["", "Cells: **CPU % of one core** (from the writer's start until every line is "
              "out) · average RSS MB · peak RSS MB. Output: a file on tmpfs."]
        if "pipelines" in rate_rows:
            L += [f"Pipelines: {pl['count']:,} inputs, each over its own directory "
                  "(`app-N/*.log`), 4 of them written (283-byte nginx lines, CRI-wrapped, every "
                  "20 ms); Petrel: a config directory of one pipeline per file, each a file source "
                  "and a file sink; Fluent Bit: that many tail inputs in one config (on the stat "
                  "watcher: each inotify watcher is an inotify instance, and a user gets 128); the "
                  "Collector: that many filelog receivers in one pipeline; Vector: that many file "
                  "sources into one sink."]
        L.append("")
    if h.get("syslog"):
        s = h["syslog"]
        L += ["| syslog over TCP (loggen, RFC 5424, 1 connection, "
              f"{plan['syslog']['size']} B) → file | msgs/s | CPU s per million | peak RSS MB | loss % |",
              "|---|---:|---:|---:|---:|"]
        for recv in ("petrel", "rsyslog", "syslog-ng"):
            d = s.get(recv)
            if not d:
                continue
            label = {"petrel": "Petrel"}.get(recv, recv)
            if "skip" in d:
                L.append(f"| {label} | skipped: {d['skip']} | | | |")
                continue
            L.append(f"| {label} | {fmt(d['msgs_s'])} | {fmt(d['cpu_s_per_m'], 2)} | "
                     f"{fmt(d['peak_rss_mb'], 1)} | {fmt(d['loss_pct'], 2)} |")
        L.append("")
    if h.get("sinks"):
        s = h["sinks"]
        L += [f"| json512 + parse_json → store (Petrel; VictoriaLogs {plan['versions_extra'].get('VictoriaLogs', '')}) "
              "| MB/s | CPU s per GB | peak RSS MB | store's CPU s per GB |",
              "|---|---:|---:|---:|---:|"]
        for name, d in s.items():
            store = "–" if name.startswith("file") else fmt(d["server_cpu_s_per_gb"], 2)
            L.append(f"| {name} | {fmt(d['mb_s'])} | {fmt(d['cpu_s_per_gb'], 2)} | "
                     f"{fmt(d['peak_rss_mb'], 1)} | {store} |")
        L.append("")
    notes = []
    for n in names:
        if n in agents.AGENTS and agents.AGENTS[n].note:
            notes.append(f"- {agents.AGENTS[n].note}")
    for n, why in h["skipped"].items():
        notes.append(f"- {agent_label(n)} not measured: {why}")
    for r in h["rows"]:
        for e in r["errors"]:
            notes.append(f"- {r['row']}, {agent_label(r['agent'])}: a run failed: {e[:200]}")
    if notes:
        L += ["Notes:", ""] + notes + [""]
    for p in plots_rel:
        L += [f"![{p['title']}]({p['path']})", ""]
    return L


PLOTS = [("headline-throughput.png", "MB/s and CPU seconds per GB, each agent beside the raw limit"),
         ("headline-rate.png", "CPU and memory at a fixed rate")]


def draw(plan, out_json):
    """bench/plot.py --headline (matplotlib, from bench/run.sh's venv):
    the charts that it drew, as {title, path} relative to the root."""
    plots_dir = os.path.join(ROOT, "bench", "plots")
    for name, _ in PLOTS:
        if os.path.exists(os.path.join(plots_dir, name)):
            os.unlink(os.path.join(plots_dir, name))
    if not plan.get("plot_python"):
        log("no matplotlib: no charts")
        return []
    subprocess.run([plan["plot_python"], os.path.join(HERE, "plot.py"), "--headline", out_json,
                    "--out", plots_dir], check=False)
    return [{"title": t, "path": f"bench/plots/{n}"} for n, t in PLOTS
            if os.path.exists(os.path.join(plots_dir, n))]


def cmd_report(plan_path):
    plan = load_plan(plan_path)
    h = build_json(plan)
    out_json = os.path.join(ROOT, "bench", "out", "headline.json")
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump(h, f, indent=1)
    log(f"wrote {os.path.relpath(out_json, ROOT)}")
    plots = draw(plan, out_json)
    section = markdown(h, plan, plots)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    res = os.path.join(ROOT, "bench", "results", f"headline-{stamp}.md")
    detail = detail_tables(h, plan)
    # The results file sits in bench/results/: its image links go up one.
    with open(res, "w") as f:
        f.write("# Headline: Petrel beside its peers\n\n"
                + "\n".join(section).replace("](bench/plots/", "](../plots/") + "\n"
                + "\n".join(detail) + "\n")
    log(f"wrote {os.path.relpath(res, ROOT)}")
    bm = os.path.join(ROOT, "BENCHMARKS.md")
    if plan["knobs"].get("write_benchmarks", True) and os.path.exists(bm):
        with open(bm) as f:
            text = f.read()
        begin, end = "<!-- headline:begin -->", "<!-- headline:end -->"
        if begin in text and end in text:
            a, rest = text.split(begin, 1)
            _, b = rest.split(end, 1)
            body = ("\n<!-- generated by bench/headline.sh: edits between these markers are "
                    "overwritten -->\n\n" + "\n".join(section).rstrip("\n")
                    + f"\n\nEvery run, with ranges: `{os.path.relpath(res, ROOT)}`.\n\n")
            with open(bm, "w") as f:
                f.write(a + begin + body + end + b)
            log("rewrote the headline section of BENCHMARKS.md")
        else:
            log("BENCHMARKS.md has no headline markers; left as it is")
    print("\n".join(section))


def detail_tables(h, plan):
    L = ["## Every figure", "",
         "| row | agent | runs | MB/s (median) | MB/s range | events/s | CPU s per GB | CPU s per million events | peak RSS MB | × wc -l | other procs (cores) |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["row"], r["agent"]): r for r in h["rows"]}
    for r in h["rows"]:
        if r["kind"] != "file":
            continue
        f = r["figures"]
        if not f:
            L.append(f"| {r['row']} | {r['agent']} | 0 | failed | | | | | | | |")
            continue
        wc = by.get((r["row"], "wc -l"))
        ratio = (f"{f['mb_s'] / wc['figures']['mb_s']:.3f}"
                 if wc and wc["figures"] and wc["figures"]["mb_s"] else "–")
        L.append(f"| {r['row']} | {agent_label(r['agent'])} | {f['runs']} | {fmt(f['mb_s'])} | "
                 f"{fmt(f['mb_s_range'][0])}–{fmt(f['mb_s_range'][1])} | {fmt(f['events_s'])} | "
                 f"{fmt(f['cpu_s_per_gb'], 2)} | {fmt(f['cpu_s_per_m_events'], 3)} | "
                 f"{fmt(f['peak_rss_mb'], 1)} | {ratio} | {fmt(f['other_cpu_cores'], 2)} |")
    L += ["", "| row | agent | runs | CPU % of one core | RSS avg MB | peak RSS MB | RSS when ready MB | ready after s | lines |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in h["rows"]:
        if r["kind"] != "rate":
            continue
        f = r["figures"]
        if not f:
            L.append(f"| {r['row']} | {r['agent']} | 0 | failed | | | | | |")
            continue
        L.append(f"| {r['row']} | {agent_label(r['agent'])} | {f['runs']} | {fmt(f['cpu_pct'], 2)} | "
                 f"{fmt(f['rss_avg_mb'], 1)} | {fmt(f['peak_rss_mb'], 1)} | {fmt(f['rss_ready_mb'], 1)} | "
                 f"{fmt(f['ready_s'], 1)} | {fmt(f['lines'])} |")
    L += ["", "Agents' configs: bench/lib/agents.py (written per run under bench/out/headline/). "
          "Machine: " + "; ".join(plan["machine"]["facts"]), ""]
    return L


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("measure", "report"):
        sys.exit(__doc__)
    {"measure": cmd_measure, "report": cmd_report}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
