#!/usr/bin/env bash
# Seed 002's producer baseline, scaled down: the producer SDK
# (crates/petrel-producer, examples/producer_bench) in one process sends
# COUNT logs to `petrel run` (HTTP source → blackhole sink) in another, for
# the seed's three log shapes and 1 and 2 IO threads:
#   plain          one ~485-letter random string (`log`) + time_ns (~526 B ndjson)
#   structured     content + 10 keys of 30 random letters + time_ns (~555 B)
#   newstructured  content + 10 keys of 28 random letters + logTime (~535 B)
# One application thread calls send(); lz4 compression (the default); the
# other knobs at the seed's defaults (1 MiB batches, 100 MiB cap).
#
#   bench/producer.sh               COUNT=2000000 by default
#   BENCH_COUNT=5000000 BENCH_IO="1 2 4" bench/producer.sh
#
# Each row: MB/s and logs/s (ndjson bytes before compression, first send
# to close() returning with everything admitted by the agent), the
# producer's CPU % and CPU seconds per GB (getrusage), and the agent's CPU
# seconds (utime+stime from /proc/PID/stat, once it went idle after the
# producer closed; its idle ticks are included) — both run on the same machine,
# so on 2 cores the agent's parsing bounds the wall-clock rate.
# Results: stdout and bench/results/producer-<UTC date>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
COUNT="${BENCH_COUNT:-2000000}"
IOS="${BENCH_IO:-1 2}"
KINDS="${BENCH_KINDS:-plain structured newstructured}"
COMPRESSION="${BENCH_COMPRESSION:-lz4}"
(cd "$ROOT" && cargo build --release --locked -p petrel -p petrel-producer --example producer_bench >&2)
PETREL="$TARGET/release/petrel"
BENCH="$TARGET/release/examples/producer_bench"
WORK="$(mktemp -d /tmp/petrel-producer-bench.XXXXXX)"
AGENT=""
cleanup() {
    [ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
TICK=$(getconf CLK_TCK)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$WORK/agent.yaml" <<YAML
sources:
  - type: http
    address: 127.0.0.1:$port
    path: /ingest
    max_body_bytes: 16MiB
sinks:
  - type: blackhole
YAML
agent_ticks() { awk '{print $14+$15}' "/proc/$AGENT/stat"; }

RESULT="$ROOT/bench/results/producer-$(date -u +%Y%m%d-%H%M).md"
{
    echo "# Producer SDK (seed 002), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); $COUNT logs per row; compression $COMPRESSION;"
    echo "one application thread; producer and \`petrel run\` (HTTP → blackhole) on the same machine."
    echo
    echo "| logs | IO threads | MB/s | logs/s | producer CPU % | producer CPU s/GB | agent CPU s | agent CPU s/GB |"
    echo "|---|---|---|---|---|---|---|---|"
} > "$WORK/table.md"
for kind in $KINDS; do
    for io in $IOS; do
        "$PETREL" run --config "$WORK/agent.yaml" --data-dir "$WORK/data" --api-addr 127.0.0.1:0 2>"$WORK/agent.log" &
        AGENT=$!
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
        a0=$(agent_ticks)
        line=$("$BENCH" "http://127.0.0.1:$port/ingest" "$kind" "$COUNT" "$io" "$COMPRESSION")
        # Admitted is not yet processed: wait until the agent is idle
        # (its CPU time still for 0.5 s, at most 30 s) before reading it.
        a1=$(agent_ticks)
        for _ in $(seq 60); do
            sleep 0.5
            a2=$(agent_ticks)
            [ "$a2" = "$a1" ] && break
            a1=$a2
        done
        kill "$AGENT"; wait "$AGENT" 2>/dev/null || true; AGENT=""
        rm -rf "$WORK/data"
        echo "$line" >&2
        eval "$(echo "$line" | tr ' ' '\n' | grep -E '^(records|bytes|wall_s|cpu_s|undelivered)=' | sed 's/^/r_/')"
        [ "$r_undelivered" = 0 ] && [ "$r_records" = "$COUNT" ] || { echo "row $kind/$io: only $r_records of $COUNT delivered" >&2; exit 1; }
        awk -v k="$kind" -v io="$io" -v n="$r_records" -v b="$r_bytes" -v w="$r_wall_s" -v c="$r_cpu_s" \
            -v at="$((a1 - a0))" -v tick="$TICK" 'BEGIN {
            mb = b / 1e6; gb = b / 1e9; ac = at / tick
            printf "| %s | %d | %.1f | %.0f | %.0f %% | %.2f | %.2f | %.2f |\n", k, io, mb / w, n / w, 100 * c / w, c / gb, ac, ac / gb
        }' >> "$WORK/table.md"
    done
done
{
    echo
    echo "Seed 002's published rows (Java producer, 4 vCPU VM, 100M logs; CPU % of the VM):"
    echo
    echo "| logs | IO threads 2 | 4 | 6 |"
    echo "|---|---|---|---|"
    echo "| plain ~510 B | 7.8 MB/s, 15k/s, 9% CPU | 15.4 MB/s, 31k/s, 19% | 19.7 MB/s, 39k/s, 27% |"
    echo "| structured, 10 keys ~550 B | 18.7 MB/s, 35k/s, 13% | 34.6, 64k/s, 25% | 42.7, 78k/s, 32% |"
    echo "| new structured ~540 B | 23.7 MB/s, 45k/s, 11% | 45.6, 87k/s, 23% | 54.7, 103k/s, 30% |"
} >> "$WORK/table.md"
cat "$WORK/table.md"
cp "$WORK/table.md" "$RESULT"
echo "written: $RESULT" >&2
