#!/usr/bin/env python3
"""Markdown table of an interleaved base/current run (compare_sinks.sh):
per sink and side the median (min–max) of the agent's CPU s per GB
(utime+stime of its process; GB = 10^9 bytes of input), MB/s, peak RSS
(VmHWM), the CPU of other processes during the runs; and the ratios
current/base: of the medians, and the median of the per-repetition
(paired) ratios."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
size, runs, store = sys.argv[2], sys.argv[3], sys.argv[4]
gb = lambda r: r["bytes"] / 1e9
by = {}
for r in rows:
    by.setdefault(r["name"], {}).setdefault(r["side"], []).append(r)
def fmt(xs, p=2):
    return f"{st.median(xs):.{p}f} ({min(xs):.{p}f}–{max(xs):.{p}f})"
print(f"json512 {size} + parse_json, --threads 1, {runs} runs per side, interleaved; endpoint: {store}\n")
print("| sink | side | CPU s/GB | MB/s | peak RSS MB | other procs, cores | CPU/GB current/base (medians) | paired ratios: median (min–max) |")
print("|---|---|---|---|---|---|---|---|")
for name, sides in by.items():
    cpu = {s: [r["cpu_s"] / gb(r) for r in rs] for s, rs in sides.items()}
    pair = {s: {r["run"]: r["cpu_s"] / gb(r) for r in rs} for s, rs in sides.items()}
    for side in ("base", "current"):
        rs = sides[side]
        mbs = [r["bytes"] / 1e6 / r["wall_s"] for r in rs]
        rss = [r["hwm_kb"] / 1024 for r in rs]
        oth = [r["other_cpu_s"] / r["wall_s"] for r in rs]
        ratio = pr = ""
        if side == "current":
            ratio = f"**{st.median(cpu['current']) / st.median(cpu['base']):.3f}**"
            ps = [pair["current"][k] / pair["base"][k] for k in pair["current"] if k in pair["base"]]
            pr = f"{st.median(ps):.3f} ({min(ps):.2f}–{max(ps):.2f})"
        print(f"| {name} | {side} | {fmt(cpu[side])} | {fmt(mbs, 0)} | {fmt(rss, 0)} | {st.median(oth):.2f} | {ratio} | {pr} |")
