#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes, a few at a time.

`cargo test` runs its test binaries one after another; most of the
end-to-end suites spend their time waiting for servers (a JVM starting,
a broker electing a leader, an agent's flush interval), so on two cores
several of them fit side by side. This runner:

1. builds every test binary once (`cargo test --no-run`, the `ci` profile
   by default) and learns their paths from cargo's JSON messages;
2. runs them, longest first (durations of the previous run, kept in the
   test cache), as many at a time as their weights allow: each suite
   weighs 1, a suite that starts several servers or loads both cores
   more, and the suites listed in ALONE run with nothing beside them
   (they measure memory or time, or load the machine on purpose);
3. runs the doc tests as one more job;
4. prints each binary as it ends, the output of every failure in full,
   a table of seconds per suite, and a closing line with the counts.

A failed binary is run again alone, for its failed tests only: a test that
then passes is reported as FLAKY (with the first failure's output), counted
in the closing line, and fails the run when --no-flaky is given. A test that
fails twice fails the run.

A suite given with --after NAME=FILE starts only once FILE exists (the
test command writes it when the server that suite needs is built, in the
background, while the other suites run); FILE holds "ok", or else the
suite fails without running, with FILE's text as the reason.

  scripts/run-tests.py [--profile ci] [--capacity 3] [--only NAME ...]
                       [--after NAME=FILE ...] [--times FILE] [--no-flaky]
                       [-- cargo test args]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Suites that run with nothing else beside them, and why. A suite's name is
# "<package>/<test target>" ("petrel/lib" for the library's unit tests).
ALONE = {
    # Measure the agent's RSS under load, or fill a disk on purpose.
    "petrel/faults": "measures RSS under a memory limit",
    "petrel/scale": "thousands of files and pipelines at once",
    # Starts several group members against one broker: a loaded machine
    # starves their heartbeats and turns a planned rebalance into a lost one.
    "petrel/kafka_source": "consumer-group rebalances need both cores",
}

# Weights of the suites that are heavier than one (capacity is 3 by
# default: two light suites and a heavy one, or three light ones).
WEIGHTS = {
    "petrel/elasticsearch_sink": 2,  # an OpenSearch JVM
    "petrel/sink_buffer": 2,  # OpenSearch and versitygw
    "petrel/kafka_sink": 2,  # a Kafka JVM, RSS bounds
    "petrel/kubernetes_api": 2,  # etcd, kube-apiserver, containerd
    "petrel/daemonset": 2,  # containerd, kill -9 runs
    "petrel/opentelemetry": 2,  # the Collector, a connection flood
    "petrel/processing": 2,  # 1 GiB-class throughput checks
    "petrel/file_source": 2,  # an inotify storm with an RSS bound
    "petrel/lib": 2,  # hundreds of unit tests on every core
}

# Seconds a suite took when nothing is known of it (first run, new suite).
DEFAULT_SECONDS = 10.0

# What the suites took in a run one at a time (a fresh machine, 2026-11-29),
# to order a first run whose cache holds no durations yet.
FIRST_GUESS = {
    "petrel/kafka_source": 395, "petrel/elasticsearch_sink": 174,
    "petrel/kubernetes_api": 161, "petrel/kafka_sink": 117,
    "petrel/sink_buffer": 72, "petrel/daemonset": 71, "petrel/s3_sink": 63,
    "petrel/reload": 53, "petrel/http_sink": 36, "petrel/faults": 33,
    "petrel/containerd": 21, "petrel/file_source": 18, "petrel/lifecycle": 17,
    "petrel/processing": 15, "petrel/fluent": 15, "petrel/opentelemetry": 14,
    "petrel/journald": 12, "petrel/engine": 11, "petrel/lib": 20,
    "petrel-cri/docker": 30, "petrel-cri/containerd": 20, "doc-tests": 60,
}

RESULT_RE = re.compile(
    r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)
FAILED_RE = re.compile(r"^test (\S+) \.\.\. FAILED$", re.M)


def log(msg):
    print(msg, flush=True)


class Job:
    def __init__(self, name, argv, cwd, weight, alone):
        self.name = name
        self.argv = argv
        self.cwd = cwd
        self.weight = weight
        self.alone = alone
        self.seconds = 0.0
        self.rc = None
        self.output = ""
        self.passed = self.failed = self.ignored = 0
        self.failed_tests = []
        self.flaky = []
        self.lane = 0
        # --after: a file that must exist before the suite may start.
        self.after = None


def build(profile, extra):
    """Builds every test binary; returns [(name, executable, cwd)]."""
    cmd = [
        "cargo", "test", "--workspace", "--profile", profile, "--locked",
        "--no-run", "--message-format=json-render-diagnostics",
    ] + extra
    log("== " + " ".join(cmd))
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            sys.stdout.write(line)
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        exe = msg.get("executable")
        if not exe or not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        pkg = msg["package_id"]
        # package_id: "path+file:///x/crates/petrel#0.1.0" (new form) or
        # "petrel 0.1.0 (path+file:///...)" (old form).
        m = re.search(r"file://([^#)\s]+)", pkg)
        pkg_dir = m.group(1) if m else ROOT
        pkg_name = os.path.basename(pkg_dir.rstrip("/"))
        kinds = target.get("kind", [])
        tname = "lib" if any(k in ("lib", "rlib", "proc-macro") for k in kinds) else target["name"]
        if "bin" in kinds:
            tname = "bin-" + target["name"]
        out.append((f"{pkg_name}/{tname}", exe, pkg_dir))
    rc = p.wait()
    if rc != 0:
        log(f"cargo test --no-run failed ({rc})")
        sys.exit(rc)
    log(f"   built {len(out)} test binaries in {time.monotonic() - t0:.0f} s")
    return out


def parse(job):
    job.passed = job.failed = job.ignored = 0
    for m in RESULT_RE.finditer(job.output):
        job.passed += int(m.group(2))
        job.failed += int(m.group(3))
        job.ignored += int(m.group(4))
    job.failed_tests = FAILED_RE.findall(job.output)


def run_job(job, env, argv=None):
    t0 = time.monotonic()
    p = subprocess.run(
        argv or job.argv, cwd=job.cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace",
    )
    return p.returncode, p.stdout, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=os.environ.get("PETREL_PROFILE", "ci"))
    ap.add_argument("--capacity", type=int, default=int(os.environ.get("PETREL_TEST_CAPACITY", "3")),
                    help="sum of the weights of the suites that run at once (default 3)")
    ap.add_argument("--only", action="append", default=[], help="run only suites whose name contains this")
    ap.add_argument("--times", default=os.path.join(
        os.environ.get("PETREL_TEST_CACHE", os.path.expanduser("~/.cache/petrel-test")), "test-times.json"))
    ap.add_argument("--no-flaky", action="store_true", help="a test that passes only on its second run fails the run")
    ap.add_argument("--no-doc", action="store_true", help="skip the doc tests")
    ap.add_argument("--after", action="append", default=[], metavar="NAME=FILE",
                    help="start suite NAME only once FILE exists (holding ok; anything else fails it)")
    ap.add_argument("cargo_args", nargs="*")
    a = ap.parse_args()
    after = {}
    for spec in a.after:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            ap.error(f"--after {spec}: expected NAME=FILE")
        after[name] = path

    known = dict(FIRST_GUESS)
    try:
        with open(a.times) as f:
            known.update(json.load(f))
    except (OSError, ValueError):
        pass

    jobs = []
    for name, exe, cwd in build(a.profile, a.cargo_args):
        if a.only and not any(o in name for o in a.only):
            continue
        alone = name in ALONE
        weight = a.capacity if alone else min(WEIGHTS.get(name, 1), a.capacity)
        job = Job(name, [exe], cwd, weight, alone)
        job.after = after.get(name)
        jobs.append(job)
    if not a.no_doc and not a.only:
        # Doc tests compile each example: a job of their own, beside the rest.
        jobs.append(Job("doc-tests", ["cargo", "test", "--workspace", "--profile", a.profile,
                                      "--locked", "--doc", "-q"], ROOT, 1, False))
    # Longest first: the long suites start while short ones fill the gaps.
    jobs.sort(key=lambda j: -known.get(j.name, DEFAULT_SECONDS))

    env = dict(os.environ)
    env.setdefault("RUST_BACKTRACE", "1")
    lock = threading.Condition()
    state = {"used": 0, "alone": False, "done": 0, "lanes": set()}
    total = len(jobs)
    wall0 = time.monotonic()

    def ready(job):
        return job.after is None or os.path.exists(job.after)

    def runner(job):
        status = None
        if job.after is not None:
            try:
                with open(job.after) as f:
                    status = f.read().strip()
            except OSError as e:
                status = str(e)
        if status not in (None, "ok"):
            rc, out, secs = 1, f"not run: what it needs was not built ({job.after}): {status}\n", 0.0
        else:
            rc, out, secs = run_job(job, env)
        job.rc, job.output, job.seconds = rc, out, secs
        parse(job)
        with lock:
            state["used"] -= job.weight
            state["lanes"].discard(job.lane)
            state["done"] += 1
            status = "PASS" if rc == 0 else "FAIL"
            log(f"[{state['done']:>3}/{total}] {status} {job.name:<34} {job.passed:>4} passed {job.failed:>3} failed"
                f" {secs:7.1f} s  (lane {job.lane})")
            lock.notify_all()

    threads = []
    pending = list(jobs)
    with lock:
        while pending:
            # The first job (longest) that fits now; an alone job waits
            # until nothing runs, and nothing starts beside it.
            pick = None
            for j in pending:
                if state["alone"]:
                    break
                if not ready(j):
                    continue
                if j.alone:
                    if state["used"] == 0:
                        pick = j
                        break
                    continue
                if state["used"] + j.weight <= a.capacity:
                    pick = j
                    break
            if pick is None:
                # A timeout: a suite waiting for --after's file is not
                # woken by another suite's end.
                lock.wait(timeout=2)
                if state["used"] == 0:
                    state["alone"] = False
                continue
            pending.remove(pick)
            state["used"] += pick.weight
            if pick.alone:
                state["alone"] = True
            lane = 1
            while lane in state["lanes"]:
                lane += 1
            state["lanes"].add(lane)
            pick.lane = lane
            t = threading.Thread(target=runner, args=(pick,), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    wall = time.monotonic() - wall0

    # Failures: print the output, then run the failed tests again, alone.
    failed_hard = []
    for j in jobs:
        if j.rc == 0:
            continue
        log(f"\n======== {j.name} FAILED (exit {j.rc}); its output:\n{j.output}\n======== end of {j.name}")
        if not j.failed_tests or j.name == "doc-tests":
            why = "(not run: what it needs was not built)" if j.output.startswith("not run:") \
                else "(the binary failed outside a test)"
            failed_hard.append((j.name, [why] if not j.failed_tests else j.failed_tests))
            continue
        log(f"== running {j.name}'s failed tests again, alone: {' '.join(j.failed_tests)}")
        still = []
        for t in j.failed_tests:
            rc, out, _ = run_job(j, env, j.argv + ["--exact", t])
            if rc == 0 and RESULT_RE.search(out) and " 1 passed" in out:
                j.flaky.append(t)
            else:
                still.append(t)
                log(f"---- {j.name} {t} failed again:\n{out}")
        if still:
            failed_hard.append((j.name, still))

    # Durations for the next run's order.
    for j in jobs:
        if j.seconds > 0:
            known[j.name] = round(j.seconds, 1)
    try:
        os.makedirs(os.path.dirname(a.times), exist_ok=True)
        with open(a.times + ".tmp", "w") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(a.times + ".tmp", a.times)
    except OSError as e:
        log(f"(could not record the durations: {e})")

    log("\n== seconds per test suite (longest first)")
    for j in sorted(jobs, key=lambda j: -j.seconds):
        mark = "" if j.rc == 0 else ("  FLAKY" if not [n for n, _ in failed_hard if n == j.name] else "  FAILED")
        extra = "  (alone)" if j.alone else (f"  (weight {j.weight})" if j.weight > 1 else "")
        log(f"{j.seconds:8.1f}  {j.name}{extra}{mark}")
    summed = sum(j.seconds for j in jobs)
    passed = sum(j.passed for j in jobs)
    failed = sum(len(t) for _, t in failed_hard)
    ignored = sum(j.ignored for j in jobs)
    flaky = [(j.name, t) for j in jobs for t in j.flaky]
    if flaky:
        log("\nFLAKY (failed beside other suites, passed alone; the first output is above):")
        for n, t in flaky:
            log(f"    {n}: {t}")
    if failed_hard:
        log("\nFAILED:")
        for n, ts in failed_hard:
            for t in ts:
                log(f"    {n}: {t}")
    ok = not failed_hard and not (flaky and a.no_flaky)
    log(f"\ntest result: {'ok' if ok else 'FAILED'}. {passed + len(flaky)} passed; {failed} failed; "
        f"{ignored} ignored; {len(flaky)} flaky; {len(jobs)} suites in {wall:.0f} s wall ({summed:.0f} s summed)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
