#!/usr/bin/env python3
"""Times `petrel convert --from fluent-bit` on a large generated configuration.

    python3 bench/convert.py [--bin target/ci/petrel] [--inputs 200] [--runs 5]

The configuration has --inputs tail inputs (each with a parser, a grep and
a modify filter matching its tag) and two outputs matching every tag, in
about 25 lines per input: 200 inputs make the issue's 5,000-line file. It
prints the wall time and peak RSS of each run (the conversion includes
loading the written pipelines back, as `petrel validate --offline`), and
the time to read the same bytes with `cat` as the raw limit.

Target (issue 44): <= 1 s for 5,000 lines and 200 inputs.
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(n):
    out = ["[SERVICE]", "    Flush        1", "    Log_Level    info", "    Parsers_File parsers.conf", ""]
    for i in range(n):
        out += [
            "[INPUT]", "    Name           tail", f"    Tag            app{i}.*",
            f"    Path           /var/log/app{i}/*.log", "    Parser         json",
            f"    DB             /var/lib/fluent-bit/app{i}.db", "    Mem_Buf_Limit  5MB",
            "    Read_from_Head On", "    Buffer_Chunk_Size 32k", "    Buffer_Max_Size 64k",
            "    Skip_Long_Lines On", "    Refresh_Interval 10", "    Rotate_Wait 5", "",
            "[FILTER]", "    Name    grep", f"    Match   app{i}.*", "    Exclude level ^debug$", "",
            "[FILTER]", "    Name    modify", f"    Match   app{i}.*", f"    Set     app app{i}",
            "    Rename  msg text", "",
        ]
    out += ["[OUTPUT]", "    Name  es", "    Match *", "    Host  es.example.com", "    Logstash_Format On", "",
            "[OUTPUT]", "    Name    kafka", "    Match   app1*", "    Brokers k1:9092,k2:9092", "    Topics  logs", ""]
    return "\n".join(out) + "\n"


def run(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p.returncode, wall, after.ru_maxrss / 1024, p.stderr.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/ci/petrel"))
    ap.add_argument("--inputs", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="petrel-convert-bench-")
    try:
        main_conf = os.path.join(work, "fluent-bit.conf")
        with open(main_conf, "w") as f:
            text = config(a.inputs)
            f.write(text)
        with open(os.path.join(work, "parsers.conf"), "w") as f:
            f.write("[PARSER]\n    Name   json\n    Format json\n")
        lines = text.count("\n")
        walls, rss = [], 0.0
        for i in range(a.runs):
            out = os.path.join(work, f"out{i}")
            code, wall, maxrss, err = run([a.bin, "convert", "--from", "fluent-bit", main_conf,
                                           "--out", out, "--report", os.path.join(work, "report.md")])
            if code not in (0, 1):
                sys.exit(f"convert failed ({code}):\n{err}")
            walls.append(wall)
            rss = max(rss, maxrss)
        _, cat_wall, _, _ = run(["cat", main_conf])
        print(f"{lines} lines, {a.inputs} inputs, {len(text)} bytes; {a.runs} runs")
        print()
        print("| measure | value | target |")
        print("|---|---:|---|")
        print(f"| petrel convert, min / median / max | {min(walls):.3f} / {statistics.median(walls):.3f} / {max(walls):.3f} s | <= 1 s |")
        print(f"| peak RSS | {rss:.1f} MB | |")
        print(f"| raw limit: cat of the same file | {cat_wall:.3f} s | |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
