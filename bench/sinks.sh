#!/usr/bin/env bash
# Sinks to stores, side by side with the file sink in one run (issue 20):
# json512 through `parse_json` into
#
#   file-ndjson     the file sink, ndjson, into a real file on tmpfs
#   http            the http sink (ndjson)
#   elasticsearch   the elasticsearch sink (bulk, create, auto ids)
#   loki            the loki sink, protobuf + snappy, labels {level}
#   loki-json       the loki sink, JSON
#   opentelemetry   the opentelemetry sink, OTLP/HTTP protobuf (when built in)
#
# against bench/lib/accept_server.py, a local endpoint that answers every
# request at once (its CPU is not the agent's), or with
# BENCH_STORE=victorialogs into a real VictoriaLogs (scripts/victorialogs.sh;
# Loki push, OTLP, its Elasticsearch bulk and JSON-lines endpoints; the
# server's own CPU seconds per GB are reported in a column of their own). Each sink runs BENCH_RUNS
# times (default 3), interleaved; a row reports the median and range of the
# agent's CPU seconds per GB (GB = 10^9 bytes of input), MB/s, peak RSS
# (VmHWM) and peak `petrel_memory_used_bytes`, and the ratio of its CPU per
# GB to the file sink's. Defaults of the agent (--threads 1 for a stable
# figure unless BENCH_THREADS is set).
#
#   bench/sinks.sh
#   BENCH_SIZE=1GiB BENCH_RUNS=3 bench/sinks.sh
#
# Environment: BENCH_SIZE (256MiB), BENCH_RUNS (3), BENCH_THREADS (1),
# BENCH_SINKS (all of the above), PETREL_BIN (target/release/petrel, built
# when missing), BENCH_JSONL (also copy every run's JSON object, with the
# sink's name and the store's CPU, to this file; bench/headline.sh reads
# it), BENCH_QUIET_WAIT (60: before each run, wait up to that many seconds
# for an idle machine). Results: stdout and bench/out/sinks-<store>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=${BENCH_SIZE:-256MiB}
RUNS=${BENCH_RUNS:-3}
THREADS=${BENCH_THREADS:-1}
SINKS=${BENCH_SINKS:-file-ndjson http elasticsearch loki loki-json opentelemetry}
BIN=${PETREL_BIN:-$ROOT/target/release/petrel}
OUT="$ROOT/bench/out"
mkdir -p "$OUT"
[[ -x "$BIN" ]] || cargo build --release -p petrel >&2
WORK=$(mktemp -d /dev/shm/petrel-sinks.XXXXXX)
SERVER=""
cleanup() {
    [[ -z "$SERVER" ]] || kill "$SERVER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
[[ -z "${BENCH_KEEP:-}" ]] || trap - EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$BIN" gen --format json512 --size "$SIZE" --output "$WORK/in.log" >/dev/null
LINES=$(wc -l < "$WORK/in.log")
PORT=$(free_port)
STORE=${BENCH_STORE:-accept}
if [[ "$STORE" == victorialogs ]]; then
    "$ROOT/scripts/victorialogs.sh" >&2
    "$ROOT/.cache/victorialogs/bin/victoria-logs" -httpListenAddr="127.0.0.1:$PORT" \
        -storageDataPath="$WORK/vl" -retentionPeriod=100y -futureRetention=100y \
        -loggerLevel=ERROR > "$WORK/vl.log" 2>&1 &
    SERVER=$!
    echo '"victorialogs v1.52.1"' > "$WORK/server.json"
else
    python3 "$ROOT/bench/lib/accept_server.py" "$PORT" > "$WORK/server.json" &
    SERVER=$!
fi
server_cpu() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
for _ in $(seq 50); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && break
    sleep 0.1
done
URL="http://127.0.0.1:$PORT"
available() {
    # A sink left out of this build (a Cargo feature) is reported, not run.
    local probe="$WORK/probe.yaml"
    printf 'sources:\n  - type: stdin\nsinks:\n  - type: %s\n' "$(case "$1" in file-ndjson) echo file ;; *) echo "${1%%-*}" ;; esac)" > "$probe"
    ! "$BIN" validate --config "$probe" 2>&1 | grep -q "unknown sink type"
}
variant() {
    if [[ "$STORE" == victorialogs ]]; then
        case "$1" in
            file-ndjson) echo "ndjson-file:$WORK/out.ndjson" ;;
            http) echo "http:$URL/insert/jsonline?_msg_field=message" ;;
            elasticsearch) echo "elasticsearch:$URL/insert/elasticsearch" ;;
            opentelemetry) echo "opentelemetry:$URL/insert/opentelemetry" ;;
            *) echo "$1:$URL/insert" ;;
        esac
        return
    fi
    case "$1" in
        file-ndjson) echo "ndjson-file:$WORK/out.ndjson" ;;
        loki-json) echo "loki-json:$URL" ;;
        *) echo "$1:$URL" ;;
    esac
}
: > "$WORK/results.jsonl"
for run in $(seq "$RUNS"); do
    for s in $SINKS; do
        if ! available "$s"; then
            echo "sinks.sh: $s is not in this build; skipped" >&2
            continue
        fi
        rm -f "$WORK/out.ndjson"
        cpu0=$(server_cpu)
        python3 "$ROOT/bench/petrel_bench.py" throughput --bin "$BIN" --file "$WORK/in.log" \
            --lines "$LINES" --sink "$(variant "$s")" --parse json512 --threads "$THREADS" \
            --workdir "$WORK/run" --quiet-wait "${BENCH_QUIET_WAIT:-60}" \
            > "$WORK/one.json"
        # The server's CPU during the run, in clock ticks.
        cpu1=$(server_cpu)
        python3 -c "import json,os,sys; d=json.load(open(sys.argv[1])); d['name']='$s'; d['run']=$run; d['server_cpu_s']=($cpu1-$cpu0)/os.sysconf('SC_CLK_TCK'); print(json.dumps(d))" \
            "$WORK/one.json" >> "$WORK/results.jsonl"
    done
done
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
[[ -z "${BENCH_JSONL:-}" ]] || cp "$WORK/results.jsonl" "$BENCH_JSONL"
[[ "$STORE" != victorialogs ]] || echo '"victorialogs v1.52.1"' > "$WORK/server.json"
python3 - "$WORK/results.jsonl" "$SIZE" "$RUNS" "$(cat "$WORK/server.json")" <<'PY' | tee "$OUT/sinks-$STORE.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
size, runs, server = sys.argv[2], sys.argv[3], sys.argv[4]
by = {}
for r in rows:
    by.setdefault(r["name"], []).append(r)
def gb(r): return r["bytes"] / 1e9
base = statistics.median(r["cpu_s"] / gb(r) for r in by.get("file-ndjson", [])) if "file-ndjson" in by else None
print(f"json512 {size} + parse_json, {runs} runs per sink (median, range); endpoint: {server}\n")
print("| sink | CPU s/GB | range | MB/s | peak RSS MB | peak memory_used MB | × file-ndjson | server CPU s/GB |")
print("|---|---|---|---|---|---|---|---|")
for name, rs in by.items():
    cpu = [r["cpu_s"] / gb(r) for r in rs]
    mbs = [r["bytes"] / 1e6 / r["wall_s"] for r in rs]
    med = statistics.median(cpu)
    ratio = f"{med / base:.2f}" if base else "—"
    print(f"| {name} | {med:.2f} | {min(cpu):.2f}–{max(cpu):.2f} | {statistics.median(mbs):.0f} | "
          f"{max(r['hwm_kb'] for r in rs) / 1024:.0f} | {max(r['memory_used_peak_bytes'] for r in rs) / 2**20:.1f} | {ratio} | "
          f"{statistics.median(r['server_cpu_s'] / gb(r) for r in rs):.2f} |")
PY
