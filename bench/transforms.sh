#!/usr/bin/env bash
# Cost of the transforms (issue 32), into an ndjson file on tmpfs, 1
# thread. Prints CPU s per GB, peak RSS, and each row's CPU and RSS against
# the baseline (parse_json alone on json512) of the same run:
# - throttle, dedupe, sample after parse_json, keyed by `pid` (100 000
#   distinct values in json512);
# - remap `. = merge(., object!(parse_json!(.message)))` + `.level =
#   upcase!(.level)` (json512-remap) beside parse_json + fields setting
#   `level` (json512-fields);
# - a filter reading one field and dropping 90 %, as a regex
#   (json512-filter-regex) and as VRL (json512-filter-vrl);
# - nginx283 with parse_regex (nginx283) and with VRL's parse_nginx_log
#   (nginx283-remap).
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
# BENCH_VARIANTS: a subset, in this order (json512 first: the baseline).
VARIANTS=${BENCH_VARIANTS:-json512 json512-throttle json512-dedupe json512-sample json512-fields json512-remap json512-filter-regex json512-filter-vrl nginx283 nginx283-remap}
for variant in $VARIANTS; do
    if [[ $variant == nginx283 ]]; then
        # The nginx rows read their own data set; ratios stay against
        # parse_json on json512 (compare nginx283-remap with nginx283).
        f=$(gen_file nginx283); size=$(stat -c %s "$f")
    fi
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
