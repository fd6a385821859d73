#!/usr/bin/env bash
# What an open `petrel tap` costs the pipeline it samples: single128 (a
# page-cached file, BENCH_SIZE) → blackhole sink, one processing thread,
# best of BENCH_REPEAT runs with
#   none     no tap (the same start: the file is linked in after start)
#   reading  `petrel tap pipeline > /dev/null` reading everything it gets
#   stalled  a client that requests /tap and never reads (its events are
#            skipped and counted; the pipeline must not wait)
# Reports MB/s, CPU s per GB, peak RSS, events skipped for the tap, and the
# ratio of MB/s to `none` (issue 12: a slow tap client costs ≤ 5 %).
#   bench/tap.sh                         # BENCH_SIZE=512MiB BENCH_REPEAT=5
# Needs python3; PETREL_BIN (default target/release/petrel, not built here).
# Results: stdout and bench/results/tap-<UTC date>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=${BENCH_SIZE:-512MiB}
REPEAT=${BENCH_REPEAT:-5}
PETREL=${PETREL_BIN:-$ROOT/target/release/petrel}
[[ -x "$PETREL" ]] || { echo "bench/tap.sh: $PETREL missing: cargo build --release -p petrel" >&2; exit 1; }
DATA=$ROOT/bench/out/data/single128-$SIZE.log
mkdir -p "$ROOT/bench/out/data"
[[ -s "$DATA" ]] || "$PETREL" gen --format single128 --size "$SIZE" --output "$DATA" >/dev/null
cat "$DATA" > /dev/null   # page cache
LINES=$(wc -l < "$DATA")
WORK=$(mktemp -d /var/tmp/petrel-tap.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
RESULT=$ROOT/bench/results/tap-$(date -u +%Y%m%d-%H%M).md
{
    echo "# Cost of an open tap ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "Command: \`BENCH_SIZE=$SIZE BENCH_REPEAT=$REPEAT bench/tap.sh\`; single128 → blackhole, --threads 1, best of $REPEAT; $(nproc) cores, load at start $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "| tap | MB/s (best) | MB/s range | CPU s per GB | peak RSS MB | events skipped for the tap | vs none |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
} > "$RESULT.tmp"
BASE=""
for mode in none reading stalled; do
    best="" lo="" hi="" line=""
    for r in $(seq "$REPEAT"); do
        j=$(python3 "$ROOT/bench/petrel_bench.py" throughput --bin "$PETREL" --file "$DATA" \
            --lines "$LINES" --sink blackhole --threads 1 --workdir "$WORK/$mode" --tap "$mode" --quiet-wait 30)
        mbs=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.0f" % (d["bytes"]/1e6/d["wall_s"]))' "$j")
        [[ -z "$lo" || $mbs -lt $lo ]] && lo=$mbs
        [[ -z "$hi" || $mbs -gt $hi ]] && hi=$mbs
        if [[ -z "$best" || $mbs -gt $best ]]; then best=$mbs line=$j; fi
    done
    [[ $mode == none ]] && BASE=$best
    python3 - "$line" "$best" "$lo" "$hi" "$BASE" "$mode" <<'PY' | tee -a "$RESULT.tmp"
import json, sys
d = json.loads(sys.argv[1]); best, lo, hi, base, mode = sys.argv[2:7]
gb = d["bytes"] / 1e9
print(f"| {mode} | {best} | {lo}-{hi} | {d['cpu_s'] / gb:.2f} | {d['hwm_kb'] / 1024:.1f} | {d['tap_skipped']} | {int(best) / int(base):.2f} |")
PY
done
mv "$RESULT.tmp" "$RESULT"
echo "== wrote $RESULT" >&2
