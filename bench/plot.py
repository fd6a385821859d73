#!/usr/bin/env python3
"""Charts of the benchmark results (matplotlib), for BENCHMARKS.md.

Reads what bench/run.sh leaves in bench/out/:
  results.jsonl  throughput runs (every repeat; the fastest per case is used)
  limits.tsv     the raw limit per data set (`wc -l` on the page-cached file)
  rate.jsonl     fixed-rate runs (CPU % and RSS against the input rate)
and writes PNGs to bench/plots/:
  throughput.png  MB/s and CPU s per GB by data set and variant, one
                  processing thread, with the raw limit as a line
  rate.png        CPU % of one core and RSS against the input rate
  threads.png     MB/s with 1 and 2 processing threads per data set

With --headline FILE (bench/out/headline.json, written by bench/headline.sh)
it draws the headline's charts instead:
  headline-throughput.png  MB/s and CPU s per GB of every agent on each
                  file row, with the raw limit (`wc -l`) as a line
  headline-rate.png  CPU % of one core and average RSS of every agent on
                  the fixed-rate rows

  bench/plot.py [--out DIR] [--results DIR]
  bench/plot.py --headline bench/out/headline.json [--out DIR]

Needs matplotlib (bench/run.sh installs it into a venv under target/ when
it is missing). Charts whose input is missing are skipped with a note.
"""

import argparse
import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["single128", "nginx283", "regex512", "json512", "delim512", "multiline512"]


def dataset_of(path):
    return os.path.basename(path).split("-")[0]


def variant_of(r):
    return ("parse-" if r.get("parse") else "") + r["sink"]


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def best_runs(rows):
    """(dataset, variant, threads) → the fastest run."""
    best = {}
    for r in rows:
        if not r.get("wall_s"):
            continue
        k = (dataset_of(r["file"]), variant_of(r), r["threads"])
        mbs = r["bytes"] / 1e6 / r["wall_s"]
        if k not in best or mbs > best[k][0]:
            best[k] = (mbs, r)
    return best


def limits(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            parts = line.split("\t")
            if len(parts) >= 5:
                out[parts[0]] = float(parts[4])
    return out


def datasets_in(keys):
    present = {k[0] for k in keys}
    return [d for d in ORDER if d in present] + sorted(present - set(ORDER))


def plot_throughput(best, lim, out):
    keys = [k for k in best if k[2] == 1]
    if not keys:
        print("plot.py: no one-thread throughput runs; throughput.png skipped", file=sys.stderr)
        return False
    sets = datasets_in(keys)
    variants = sorted({k[1] for k in keys})
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs, mbs, cpu = [], [], []
        for j, d in enumerate(sets):
            b = best.get((d, v, 1))
            if b:
                xs.append(j + (i - (len(variants) - 1) / 2) * width)
                mbs.append(b[0])
                cpu.append(b[1]["cpu_s"] / (b[1]["bytes"] / 1e9))
        ax1.bar(xs, mbs, width, label=v)
        ax2.bar(xs, cpu, width, label=v)
    for j, d in enumerate(sets):
        if d in lim:
            ax1.hlines(lim[d], j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                       label="raw limit (wc -l)" if j == 0 else None)
    ax1.set_ylabel("MB/s (one processing thread)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax1.set_title("Throughput by data set (page-cached file → sink)")
    ax2.set_ylabel("CPU seconds per GB")
    ax2.set_xticks(range(len(sets)))
    ax2.set_xticklabels(sets)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=100)
    plt.close(fig)
    return True


def plot_threads(best, out):
    by = collections.defaultdict(dict)
    for (d, v, t), (mbs, _) in best.items():
        by[(d, v)][t] = mbs
    pairs = [(k, ts) for k, ts in by.items() if 1 in ts and 2 in ts]
    if not pairs:
        print("plot.py: no runs with both 1 and 2 threads; threads.png skipped", file=sys.stderr)
        return False
    pairs.sort(key=lambda p: (ORDER.index(p[0][0]) if p[0][0] in ORDER else 99, p[0][1]))
    labels = [f"{d}\n{v}" for (d, v), _ in pairs]
    fig, ax = plt.subplots(figsize=(max(8, len(pairs) * 0.9), 5))
    xs = range(len(pairs))
    ax.bar([x - 0.2 for x in xs], [ts[1] for _, ts in pairs], 0.4, label="1 thread")
    ax.bar([x + 0.2 for x in xs], [ts[2] for _, ts in pairs], 0.4, label="2 threads")
    for x, (_, ts) in zip(xs, pairs):
        ax.annotate(f"{ts[2] / ts[1]:.2f}×", (x + 0.2, ts[2]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("MB/s")
    ax.set_title("Scaling with processing threads (2-core machine)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "threads.png"), dpi=100)
    plt.close(fig)
    return True


def rate_mb(text):
    units = {"KB": 1e-3, "MB": 1.0, "GB": 1e3}
    for u, f in units.items():
        if str(text).upper().endswith(u):
            return float(str(text)[: -len(u)]) * f
    return float(text) / 1e6


def plot_rate(rows, out):
    rows = [r for r in rows if r.get("cpu_pct") is not None]
    if not rows:
        print("plot.py: no rate runs; rate.png skipped", file=sys.stderr)
        return False
    series = collections.defaultdict(list)
    for r in rows:
        series[(r.get("writer", "gen"), r.get("sink", "text"))].append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for (writer, sink), rs in sorted(series.items()):
        rs.sort(key=lambda r: rate_mb(r["rate"]))
        x = [rate_mb(r["rate"]) for r in rs]
        label = f"{sink}, writer {writer}"
        ax1.plot(x, [r["cpu_pct"] for r in rs], marker="o", label=label)
        ax2.plot(x, [(r.get("rss_avg_kb") or 0) / 1024 for r in rs], marker="o", label=label)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("input rate, MB/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("CPU % of one core")
    ax1.set_title("CPU against input rate")
    ax2.set_ylabel("RSS, MiB (average)")
    ax2.set_title("Memory against input rate")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "rate.png"), dpi=100)
    plt.close(fig)
    return True


AGENT_LABELS = {"petrel": "Petrel", "fluent-bit": "Fluent Bit", "otelcol": "OTel Collector",
                "vector": "Vector", "cat": "cat > /dev/null"}


def plot_headline(h, out):
    """The headline's charts from bench/out/headline.json."""
    made = 0
    files = [r for r in h["rows"] if r["kind"] == "file" and r["figures"]]
    rows = [x for x in ORDER if any(r["row"] == x for r in files)]
    agents = [a for a in ("petrel", "fluent-bit", "otelcol", "vector", "cat")
              if any(r["agent"] == a for r in files)]
    if rows and agents:
        by = {(r["row"], r["agent"]): r["figures"] for r in files}
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
        width = 0.8 / len(agents)
        for i, a in enumerate(agents):
            xs, mbs, cpu = [], [], []
            for j, d in enumerate(rows):
                f = by.get((d, a))
                if f:
                    xs.append(j + (i - (len(agents) - 1) / 2) * width)
                    mbs.append(f["mb_s"])
                    cpu.append(f["cpu_s_per_gb"])
            ax1.bar(xs, mbs, width, label=AGENT_LABELS.get(a, a))
            ax2.bar(xs, cpu, width, label=AGENT_LABELS.get(a, a))
        for j, d in enumerate(rows):
            wc = by.get((d, "wc -l"))
            if wc:
                ax1.hlines(wc["mb_s"], j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                           label="wc -l (raw limit)" if j == 0 else None)
        ax1.set_ylabel("MB/s")
        ax1.set_yscale("log")
        ax1.legend(fontsize=8)
        ax1.set_title(f"Page-cached file → file on tmpfs ({h['knobs']['size']}, {h['date']})")
        ax2.set_ylabel("CPU seconds per GB")
        ax2.set_yscale("log")
        ax2.set_xticks(range(len(rows)))
        ax2.set_xticklabels(rows)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "headline-throughput.png"), dpi=100)
        plt.close(fig)
        made += 1
    rates = [r for r in h["rows"] if r["kind"] == "rate" and r["figures"]]
    if rates:
        rrows = [x for x in ("rate", "pipelines") if any(r["row"] == x for r in rates)]
        ragents = [a for a in ("petrel", "fluent-bit", "otelcol", "vector")
                   if any(r["agent"] == a for r in rates)]
        by = {(r["row"], r["agent"]): r["figures"] for r in rates}
        r, pl = h.get("rate", {}), h.get("pipelines", {})
        labels = {"rate": f"{r.get('mb_s', 10):g} MB/s, 1 file",
                  "pipelines": f"{pl.get('count', 1000):,} inputs, {pl.get('active', 4)} at "
                               f"{pl.get('mb_s', 3):g} MB/s"}
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
        width = 0.8 / len(ragents)
        for i, a in enumerate(ragents):
            xs, cpu, rss = [], [], []
            for j, d in enumerate(rrows):
                f = by.get((d, a))
                if f:
                    xs.append(j + (i - (len(ragents) - 1) / 2) * width)
                    cpu.append(f["cpu_pct"])
                    rss.append(f["rss_avg_mb"] or 0)
            ax1.bar(xs, cpu, width, label=AGENT_LABELS.get(a, a))
            ax2.bar(xs, rss, width, label=AGENT_LABELS.get(a, a))
        for ax in (ax1, ax2):
            ax.set_xticks(range(len(rrows)))
            ax.set_xticklabels([labels.get(r, r) for r in rrows])
            ax.legend(fontsize=8)
        ax1.set_ylabel("CPU % of one core")
        ax1.set_title("CPU at a fixed rate")
        ax2.set_ylabel("RSS, MiB (average)")
        ax2.set_title("Memory at a fixed rate")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "headline-rate.png"), dpi=100)
        plt.close(fig)
        made += 1
    return made


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(root, "bench", "out"))
    ap.add_argument("--out", default=os.path.join(root, "bench", "plots"))
    ap.add_argument("--headline", metavar="FILE",
                    help="draw the headline's charts from bench/out/headline.json")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.headline:
        with open(a.headline) as f:
            made = plot_headline(json.load(f), a.out)
        print(f"plot.py: {made} headline chart(s) in {a.out}", file=sys.stderr)
        return 0 if made else 1
    best = best_runs(load_jsonl(os.path.join(a.results, "results.jsonl")))
    lim = limits(os.path.join(a.results, "limits.tsv"))
    made = [
        plot_throughput(best, lim, a.out),
        plot_threads(best, a.out),
        plot_rate(load_jsonl(os.path.join(a.results, "rate.jsonl")), a.out),
    ]
    print(f"plot.py: {sum(made)} chart(s) in {a.out}", file=sys.stderr)
    return 0 if any(made) else 1


if __name__ == "__main__":
    sys.exit(main())
