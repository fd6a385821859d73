#!/usr/bin/env bash
# json512 → s3 (gzip, text lines), into a real versitygw (scripts/versitygw.sh)
# serving a directory on tmpfs, with its peers in the same run:
#
#   s3-gzip      the s3 sink: gzip objects of 10 MiB of lines (the default)
#   file-text    the file sink writing the same lines to tmpfs (no
#                compression): the agent's cost without the archive
#   gzip -1      gzip -1 of the same input to /dev/null: the raw limit of
#                compressing it (one core, CPU s per GB)
#
# Each runs BENCH_RUNS times (default 3), interleaved; a row reports the
# median and range of CPU seconds per GB of input (GB = 10^9 bytes), MB/s
# and peak RSS (VmHWM); versitygw's own CPU per GB has a column of its own.
# Defaults of the agent (--threads 1 unless BENCH_THREADS is set).
#
#   bench/s3.sh
#   BENCH_SIZE=1GiB BENCH_RUNS=3 bench/s3.sh
#
# Environment: BENCH_SIZE (256MiB), BENCH_RUNS (3), BENCH_THREADS (1),
# PETREL_BIN (target/release/petrel, built when missing). Results: stdout
# and bench/out/s3.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=${BENCH_SIZE:-256MiB}
RUNS=${BENCH_RUNS:-3}
THREADS=${BENCH_THREADS:-1}
BIN=${PETREL_BIN:-$ROOT/target/release/petrel}
OUT="$ROOT/bench/out"
mkdir -p "$OUT"
[[ -x "$BIN" ]] || cargo build --release -p petrel >&2
"$ROOT/scripts/versitygw.sh" >&2
WORK=$(mktemp -d /dev/shm/petrel-s3.XXXXXX)
SERVER=""
cleanup() {
    [[ -z "$SERVER" ]] || kill "$SERVER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$BIN" gen --format json512 --size "$SIZE" --output "$WORK/in.log" >/dev/null
LINES=$(wc -l < "$WORK/in.log")
BYTES=$(stat -c %s "$WORK/in.log")
PORT=$(free_port)
mkdir -p "$WORK/s3/bench"
"$ROOT/.cache/versitygw/bin/versitygw" --access bench-key --secret bench-secret-0123456789 \
    --port "127.0.0.1:$PORT" posix "$WORK/s3" > "$WORK/versitygw.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && break
    sleep 0.1
done
server_cpu() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
: > "$WORK/results.jsonl"
for run in $(seq "$RUNS"); do
    for s in s3-gzip file-text gzip-1; do
        cpu0=$(server_cpu)
        case "$s" in
            s3-gzip)
                rm -rf "$WORK/s3/bench/json512"
                python3 "$ROOT/bench/petrel_bench.py" throughput --bin "$BIN" --file "$WORK/in.log" \
                    --lines "$LINES" --sink "s3:http://127.0.0.1:$PORT" --threads "$THREADS" \
                    --workdir "$WORK/run" --quiet-wait 60 > "$WORK/one.json"
                ;;
            file-text)
                python3 "$ROOT/bench/petrel_bench.py" throughput --bin "$BIN" --file "$WORK/in.log" \
                    --lines "$LINES" --sink text --sink-dir "$WORK" --threads "$THREADS" \
                    --workdir "$WORK/run" --quiet-wait 60 > "$WORK/one.json"
                ;;
            gzip-1)
                # CPU and peak RSS of gzip itself, from GNU time's format.
                t0=$(date +%s.%N)
                /usr/bin/time -f '%U %S %M' -o "$WORK/time.txt" gzip -1 -c "$WORK/in.log" > /dev/null
                t1=$(date +%s.%N)
                read -r u sy kb < "$WORK/time.txt"
                python3 -c "import json,sys; print(json.dumps({'bytes': $BYTES, 'cpu_s': $u + $sy, 'wall_s': $t1 - $t0, 'hwm_kb': $kb}))" > "$WORK/one.json"
                ;;
        esac
        cpu1=$(server_cpu)
        python3 -c "import json,os,sys; d=json.load(open(sys.argv[1])); d['name']='$s'; d['run']=$run; d['server_cpu_s']=($cpu1-$cpu0)/os.sysconf('SC_CLK_TCK'); print(json.dumps(d))" \
            "$WORK/one.json" >> "$WORK/results.jsonl"
    done
done
STORED=$(du -sb "$WORK/s3/bench" | cut -f1)
python3 - "$WORK/results.jsonl" "$SIZE" "$RUNS" "$STORED" <<'PY' | tee "$OUT/s3.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
size, runs, stored = sys.argv[2], sys.argv[3], int(sys.argv[4])
by = {}
for r in rows:
    by.setdefault(r["name"], []).append(r)
def gb(r): return r["bytes"] / 1e9
print(f"json512 {size}, text lines, {runs} runs each (median, range); versitygw v1.8.0 on tmpfs; "
      f"the last s3 run stored {stored / 1e6:.1f} MB\n")
print("| row | CPU s/GB | range | MB/s | peak RSS MB | versitygw CPU s/GB |")
print("|---|---|---|---|---|---|")
for name, rs in by.items():
    cpu = [r["cpu_s"] / gb(r) for r in rs]
    mbs = [r["bytes"] / 1e6 / r["wall_s"] for r in rs]
    print(f"| {name} | {statistics.median(cpu):.2f} | {min(cpu):.2f}–{max(cpu):.2f} | "
          f"{statistics.median(mbs):.0f} | {max(r['hwm_kb'] for r in rs) / 1024:.0f} | "
          f"{statistics.median(r['server_cpu_s'] / gb(r) for r in rs):.2f} |")
PY
