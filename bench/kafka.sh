#!/usr/bin/env bash
# File → Kafka benchmark: single128 and json512 into a Kafka broker on this
# host (KRaft, single node, started here from the jars of
# scripts/fetch-kafka.sh), next to the same data into the file sink on
# /dev/null. Prints agent CPU seconds per GB, events/s and peak RSS, and
# the ratio of the Kafka sink's CPU per GB to the file sink's.
#
#   bench/kafka.sh                 # BENCH_SIZE (default 256MiB) per data set
#
# MB = 10^6 bytes, GB = 10^9 bytes. Output also goes to bench/out/kafka.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/out"
SIZE="${BENCH_SIZE:-256MiB}"
mkdir -p "$OUT"
cd "$ROOT"
[[ "${BENCH_NO_BUILD:-}" == 1 ]] || cargo build --release -p petrel >&2
./scripts/fetch-kafka.sh >&2
BIN="$ROOT/target/release/petrel"
WORK="$(mktemp -d)"
BROKER=""
AGENT=""
cleanup() {
  [[ -n "$AGENT" ]] && kill -9 "$AGENT" 2>/dev/null || true
  [[ -n "$BROKER" ]] && kill "$BROKER" 2>/dev/null && sleep 2 && kill -9 "$BROKER" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port); CTRL=$(free_port)
cat > "$WORK/server.properties" <<EOP
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CTRL
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CTRL
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$WORK/kafka-data
num.partitions=3
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
EOP
CP="$ROOT/.cache/kafka/lib/*"
java -cp "$CP" kafka.tools.StorageTool format -t petrel-bench-cluster-01 -c "$WORK/server.properties" >/dev/null 2>&1
java -Xms512m -Xmx1g -cp "$CP" kafka.Kafka "$WORK/server.properties" > "$WORK/broker.log" 2>&1 &
BROKER=$!
for _ in $(seq 120); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.5; done
sleep 3

metric() { # port name-regex
  curl -s "http://127.0.0.1:$1/metrics" | awk -v re="$2" '$0 ~ re {print $NF}' | head -1
}

run() { # dataset sink-yaml label
  local ds=$1 sink=$2 label=$3 data="$OUT/$1.$SIZE.log"
  [[ -f "$data" ]] || "$BIN" gen --format "$ds" --size "$SIZE" --output "$data" >&2
  cat "$data" > /dev/null
  local lines bytes; lines=$(wc -l < "$data"); bytes=$(stat -c %s "$data")
  local dir="$WORK/run-$ds-$label"; mkdir -p "$dir"
  printf 'sources:\n  - type: file\n    include: ["%s"]\n    read_from: beginning\nsinks:\n%s\n' "$data" "$sink" > "$dir/p.yaml"
  local t0; t0=$(date +%s.%N)
  "$BIN" run --config "$dir/p.yaml" --data-dir "$dir/data" --threads 1 --api-addr 127.0.0.1:0 2> "$dir/err" &
  AGENT=$!
  local port=""
  for _ in $(seq 200); do port=$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/err" | head -1 | sed 's/.*://'); [[ -n "$port" ]] && break; sleep 0.05; done
  local n=0 deadline=$((SECONDS + 900))
  while (( SECONDS < deadline )); do
    n=$(metric "$port" '^petrel_component_sent_events_total\\{.*component_kind="sink"')
    [[ "${n%.*}" == "$lines" ]] && break
    sleep 0.05
  done
  local t1; t1=$(date +%s.%N)
  local cpu rss
  cpu=$(awk '{print ($14+$15)/100}' "/proc/$AGENT/stat")
  rss=$(awk '/VmHWM/ {print $2/1024}' "/proc/$AGENT/status")
  kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=""
  [[ "${n%.*}" == "$lines" ]] || { echo "bench/kafka.sh: $ds $label did not complete ($n of $lines)" >&2; exit 1; }
  python3 - "$ds" "$label" "$bytes" "$lines" "$t0" "$t1" "$cpu" "$rss" <<'EOPY'
import sys
ds, label, b, l, t0, t1, cpu, rss = sys.argv[1:]
b, l, w, cpu, rss = int(b), int(l), float(t1) - float(t0), float(cpu), float(rss)
print(f"| {ds} | {label} | {b/w/1e6:.0f} | {l/w:.0f} | {cpu/(b/1e9):.2f} | {rss:.0f} |")
EOPY
}

{
  echo "# File → Kafka vs file sink ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "BENCH_SIZE=$SIZE, --threads 1, broker on this host (Kafka 3.9.1, KRaft, 3 partitions). One Kafka message per event, acks=all, idempotent producer."
  echo
  echo "| data set | sink | MB/s | events/s | CPU s per GB | peak RSS MB |"
  echo "|---|---|---:|---:|---:|---:|"
  for ds in single128 json512; do
    run "$ds" "  - type: file
    path: /dev/null
    encoding: ndjson" "file ndjson"
    for c in none lz4; do
      run "$ds" "  - type: kafka
    brokers: [\"127.0.0.1:$PORT\"]
    topic: bench-$ds-$c
    encoding: ndjson
    compression: $c" "kafka ndjson $c"
    done
  done
} | tee "$OUT/kafka.md"
