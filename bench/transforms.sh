#!/usr/bin/env bash
# Cost of the throttle, dedupe and sample processors (issue 32): json512
# through parse_json into an ndjson file on tmpfs, 1 thread, with and
# without the processor, keyed by `pid` (100 000 distinct values in
# json512). Prints CPU s per GB, peak RSS, and each row's CPU and RSS
# against the baseline (parse_json alone) of the same run.
#
#   bench/transforms.sh
#
# Environment: BENCH_SIZE (default 256MiB), BENCH_REPEAT (default 3; the
# row shows the run with the least CPU), BENCH_MEMORY (petrel's
# --memory-limit, default 64MiB), BENCH_NO_BUILD=1, BENCH_QUIET_WAIT
# (default 30), as bench/run.sh. Results land in bench/out/transforms.jsonl.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_SIZE="${BENCH_SIZE:-256MiB}"
BENCH_MEMORY="${BENCH_MEMORY:-64MiB}"
# shellcheck source=bench/lib/throughput.sh
source "$ROOT/bench/lib/throughput.sh"

mkdir -p "$OUT"
build
mkdir -p "$OUT/runs" "$SINK_DIR"
f=$(gen_file json512)
size=$(stat -c %s "$f")
jsonl="$OUT/transforms.jsonl"; : > "$jsonl"
machine_facts >&2
echo "== $f ($size bytes), 1 thread, --memory-limit $BENCH_MEMORY, ndjson to $SINK_DIR" >&2
printf '%-18s %9s %9s %8s %9s %8s %10s %9s\n' \
    variant "MB/s" "CPU s/GB" "RSS MB" "events" "out" "CPU ratio" "RSS diff"
base_cpu="" base_rss=""
for variant in json512 json512-throttle json512-dedupe json512-sample; do
    best=""
    for r in $(seq "$BENCH_REPEAT"); do
        res="$OUT/runs/transforms-$variant-$r.json"
        page_cache "$f"
        run_child python3 "$HELPER" throughput --bin "$BIN" --file "$f" --lines 0 \
            --sink ndjson --sink-dir "$SINK_DIR" --threads 1 --parse "$variant" \
            --memory-limit "$BENCH_MEMORY" --quiet-wait "$BENCH_QUIET_WAIT" \
            --timeout "$BENCH_TIMEOUT" --workdir "$OUT/runs/transforms-$variant" \
            --tag variant="$variant" --tag run="$r" > "$res" \
            || die "run $variant #$r failed"
        cat "$res" >> "$jsonl"
        if [[ -z "$best" ]] || (( $(calc "$(json_get "$res" cpu_s) < $(json_get "$best" cpu_s)") )); then
            best="$res"
        fi
    done
    cpu=$(json_get "$best" cpu_s); wall=$(json_get "$best" wall_s)
    rss=$(calc "$(json_get "$best" hwm_kb) / 1024")
    cpu_gb=$(calc "$cpu / ($size / 1e9)")
    if [[ -z "$base_cpu" ]]; then base_cpu=$cpu_gb; base_rss=$rss; fi
    printf '%-18s %9.1f %9.2f %8.1f %9s %8s %9.2fx %+8.1f\n' "$variant" \
        "$(calc "$size / 1e6 / $wall")" "$cpu_gb" "$rss" \
        "$(json_get "$best" events)" "$(json_get "$best" sink_lines)" \
        "$(calc "$cpu_gb / $base_cpu")" "$(calc "$rss - $base_rss")"
done
