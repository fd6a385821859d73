#!/usr/bin/env bash
# Cost of the output layouts and of removing source metadata (issue 41),
# json512 parsed by parse_json into an ndjson file on tmpfs, 1 thread, four
# rows run interleaved (base, current, current, current, base, ...) so that
# they share each stretch of a shared machine's noise:
#   base       the base commit's binary, parse_json -> ndjson
#   ndjson     this tree, the same pipeline (default layout: flat)
#   ecs3       this tree, ndjson with `metadata: {layout: ecs}` and
#              `except_fields: [pid, line, level]` (target: CPU s/GB at
#              most 1.15 x base)
#   rmhostfile this tree, parse_json + `fields: {remove: [host, file]}` ->
#              ndjson (target: at most 1.05 x the ndjson row)
# Prints the median (min-max) CPU s per GB and MB/s of each row and the
# ratios of the medians; writes every run to bench/out/output_layouts.jsonl.
# The default-layout rows against the base (single128 -> text, json512
# parse -> ndjson within 3 %) are bench/compare.sh's:
#
#   BENCH_PROFILE=ci BENCH_SINKS="text ndjson parse-ndjson" bench/compare.sh 72606c6 single128 json512
#   BENCH_PROFILE=ci bench/output_layouts.sh 72606c6
#
# The base binary is the one bench/compare.sh builds and keeps
# (bench/out/compare/<short-sha>-<profile>/petrel): run it first. The
# environment is bench/run.sh's (BENCH_SIZE, default 1GiB; BENCH_REPEAT,
# default 5 here; BENCH_MEMORY, BENCH_QUIET_WAIT, BENCH_NO_BUILD,
# BENCH_PROFILE).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_REPEAT="${BENCH_REPEAT:-5}"
# shellcheck source=bench/lib/throughput.sh
source "$ROOT/bench/lib/throughput.sh"

(($# == 1)) || die "usage: bench/output_layouts.sh BASE_COMMIT"
BASE_SHORT=$(git -C "$ROOT" rev-parse --short "$1^{commit}" 2>/dev/null) || die "'$1' is not a commit"
BASE_BIN="$OUT/compare/$BASE_SHORT-$BENCH_PROFILE/petrel"
[[ -x "$BASE_BIN" ]] || die "$BASE_BIN not found: run BENCH_PROFILE=$BENCH_PROFILE bench/compare.sh $1 json512 first (it builds the base binary)"

mkdir -p "$OUT/runs"
build
f=$(gen_file json512)
lines=$(wc -l < "$f")
jsonl="$OUT/output_layouts.jsonl"; : > "$jsonl"
machine_facts >&2
echo "== base $BASE_SHORT: $BASE_BIN (sha256 $(sha256sum "$BASE_BIN" | cut -c1-12)); current: $BUILT_FROM" >&2
echo "== $f ($(stat -c %s "$f") bytes, $lines lines), 1 thread, $(sink_where)" >&2

# ROW BINARY SINK PARSE
ROWS=(
    "base $BASE_BIN ndjson json512"
    "ndjson $BIN ndjson json512"
    "ecs3 $BIN ndjson-ecs3 json512"
    "rmhostfile $BIN ndjson json512-rmhostfile"
)
for rep in $(seq "$BENCH_REPEAT"); do
    for row in "${ROWS[@]}"; do
        read -r name bin sink parse <<<"$row"
        V_SINK=$sink V_PARSE=(--parse "$parse") V_EXPECT=$lines
        run_once "$bin" "$f" 1 "layouts-$name" "$rep" "row=$name"
        cat "$RUN_RESULT" >> "$jsonl"
        echo "== $name #$rep: cpu $(json_get "$RUN_RESULT" cpu_s) s, wall $(json_get "$RUN_RESULT" wall_s) s" >&2
    done
done

python3 - "$jsonl" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        rows.setdefault(r["row"], []).append(r)
# As bench/petrel_bench.py's run_figures: the scheduler's CPU time when the
# kernel exposes it.
def cpu_gb(r):
    cpu = r["cpu_exact_s"] if r.get("cpu_exact_s") is not None else r["cpu_s"]
    return cpu / (r["bytes"] / 1e9)
def mbs(r): return r["bytes"] / 1e6 / r["wall_s"]
med = {k: statistics.median(cpu_gb(r) for r in v) for k, v in rows.items()}
print("| row | CPU s/GB median (min-max) | MB/s median | other CPU (cores) | runs |")
print("|---|---|---|---|---|")
for k, v in rows.items():
    c = [cpu_gb(r) for r in v]
    print(f"| {k} | {med[k]:.2f} ({min(c):.2f}-{max(c):.2f}) | "
          f"{statistics.median(mbs(r) for r in v):.1f} | "
          f"{statistics.median(r['other_cpu_s'] / r['wall_s'] for r in v):.2f} | {len(v)} |")
print()
print(f"- ndjson / base: {med['ndjson'] / med['base']:.3f} (target: within 3 %)")
print(f"- ecs3 / base: {med['ecs3'] / med['base']:.3f} (target: at most 1.15)")
print(f"- rmhostfile / ndjson: {med['rmhostfile'] / med['ndjson']:.3f} (target: at most 1.05)")
EOF
