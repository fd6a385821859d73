#!/usr/bin/env bash
# Syslog ingestion with an independent generator: syslog-ng's `loggen`
# (Debian package syslog-ng-core) sends RFC 5424 messages over one TCP
# connection at full rate for BENCH_SECONDS into Petrel's syslog source
# (one processing thread) writing a file. Reports messages/s, CPU seconds
# per million messages, peak RSS, and checks that every message arrived.
# Rows: memory buffer with text and ndjson output, disk buffer with text.
# Peers (rsyslog, syslog-ng side by side) are not run yet: see BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${BENCH_SECONDS:-10}
SIZE=${BENCH_MSG_SIZE:-140}
PORT=${BENCH_PORT:-16514}
command -v loggen >/dev/null || { echo "loggen missing: apt-get install syslog-ng-core" >&2; exit 1; }
cargo build --release -q -p petrel
BIN=$PWD/target/release/petrel
WORK=$(mktemp -d)
trap 'pkill -f "$WORK/conf" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir "$WORK/conf"
printf '| case | msgs sent | msgs received | msgs/s | CPU s per million | peak RSS MB |\n|---|---|---|---|---|---|\n'
run() {
    local name=$1 encoding=$2 buffer=$3
    rm -rf "$WORK/data" "$WORK/out"
    cat > "$WORK/conf/b.yaml" <<YAML
sources:
  - type: syslog
    mode: tcp
    address: 127.0.0.1:$PORT
    format: rfc5424
    buffer: { type: $buffer }
sinks:
  - type: file
    path: $WORK/out
    encoding: $encoding
YAML
    "$BIN" run --config "$WORK/conf" --data-dir "$WORK/data" --api-addr 127.0.0.1:0 --threads 1 2>"$WORK/log" &
    local pid=$!
    for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    local t0; t0=$(awk '{print $14+$15}' /proc/$pid/stat)
    local summary; summary=$(loggen --inet --stream -P -s "$SIZE" -I "$SECS" -r 100000000 127.0.0.1 "$PORT" 2>&1 | tail -1)
    local sent; sent=$(sed -n 's/.*count=\([0-9]*\).*/\1/p' <<<"$summary")
    local got=0 prev=-1
    for _ in $(seq 100); do got=$(wc -l < "$WORK/out" 2>/dev/null || echo 0); [[ $got -ge $sent || $got -eq $prev ]] && break; prev=$got; sleep 0.3; done
    local t1; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
    local hwm; hwm=$(awk '/VmHWM/ {print $2}' /proc/$pid/status)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    local tck; tck=$(getconf CLK_TCK)
    awk -v n="$name" -v s="$sent" -v g="$got" -v secs="$SECS" -v c="$((t1-t0))" -v t="$tck" -v h="$hwm" \
        'BEGIN { printf "| %s | %d | %d | %.0f | %.2f | %.1f |\n", n, s, g, s/secs, (c/t)/(g/1e6), h/1024 }'
}
run "tcp, memory buffer, text" text memory
run "tcp, memory buffer, ndjson (all fields)" ndjson memory
run "tcp, disk buffer, text" text disk
