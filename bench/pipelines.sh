#!/usr/bin/env bash
# Whole-pipeline benchmarks, from the beginning of a page-cached file:
#
#   bench/pipelines.sh processors  # the processing scenarios of seed 000:
#                                  # regex512 + parse_regex, json512 +
#                                  # parse_json, delim512 + parse_delimiter,
#                                  # multiline512 (start_pattern, timestamp),
#                                  # into the file sink (ndjson, /dev/null),
#                                  # --threads 1 and 2
#   bench/pipelines.sh kafka       # single128 and json512 into a Kafka broker
#                                  # on this host (KRaft, single node, from
#                                  # the jars of scripts/fetch-kafka.sh), next
#                                  # to the same data into the file sink,
#                                  # then both at 10 MB/s (BENCH_RATE=0: skip)
#
# Each row: MB/s, events/s, agent CPU seconds per GB, peak RSS, and the
# ratio to the host's raw limit (`wc -l` on the same file, best of 3).
# BENCH_SIZE (default 512MiB) per data set. MB = 10^6 bytes, GB = 10^9.
# BENCH_PERF=1 also records a flat `perf` profile of each agent run into
# bench/out/perf-<data set>-<pipeline>.data (system-wide; BENCH_PERF_ARGS adds
# options) and the agent's CPU seconds per thread into ….threads.
# BENCH_DATASETS picks the data sets of the kafka mode (" ": only the
# fixed-rate rows). BENCH_KAFKA_EXTRA adds one line of settings to the Kafka sink, e.g.
# 'librdkafka: { linger.ms: "50" }'. Output also goes to bench/out/<mode>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/out"
SIZE="${BENCH_SIZE:-512MiB}"
MODE="${1:-processors}"
mkdir -p "$OUT"
cd "$ROOT"
[[ "${BENCH_NO_BUILD:-}" == 1 ]] || cargo build --release -p petrel >&2
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
[[ "${BENCH_DEBUG:-}" == 1 ]] && set -x

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_broker() {
  ./scripts/fetch-kafka.sh >&2
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
  local cp="$ROOT/.cache/kafka/lib/*"
  java -cp "$cp" kafka.tools.StorageTool format -t petrel-bench-cluster-01 -c "$WORK/server.properties" >/dev/null 2>&1
  java -Xms512m -Xmx1g -cp "$cp" kafka.Kafka "$WORK/server.properties" > "$WORK/broker.log" 2>&1 &
  BROKER=$!
  local up=""
  for _ in $(seq 240); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && { up=1; break; }; sleep 0.5; done
  [[ -n "$up" ]] || { echo "bench/pipelines.sh: Kafka did not start; its log:" >&2; tail -50 "$WORK/broker.log" >&2; exit 1; }
  sleep 3
}

metric() { # port name-regex
  # awk stops itself at the first match: `head -1` would make curl or awk
  # die of SIGPIPE, which pipefail turns into a failure.
  curl -s "http://127.0.0.1:$1/metrics" | awk -v re="$2" '$0 ~ re {print $NF; exit}' || true
}

run() { # dataset sink-yaml label threads events-per-line-divisor extra-yaml
  local ds=$1 sink=$2 label=$3 threads=${4:-1} div=${5:-1} extra=${6:-} data="$OUT/$1.$SIZE.log"
  [[ -f "$data" ]] || "$BIN" gen --format "$ds" --size "$SIZE" --output "$data" >&2
  cat "$data" > /dev/null
  local lines bytes; lines=$(( $(wc -l < "$data") / div )); bytes=$(stat -c %s "$data")
  local wc_s; wc_s=$(python3 - "$data" <<'EOPY'
import subprocess, sys, time
best = 1e9
for _ in range(3):
    t = time.perf_counter(); subprocess.run(["wc", "-l", sys.argv[1]], stdout=subprocess.DEVNULL, check=True)
    best = min(best, time.perf_counter() - t)
print(best)
EOPY
)
  # One data directory per run: a checkpoint left by an earlier run of the
  # same pipeline would make this one start at the end of the file.
  local dir="$WORK/run-$ds-${label// /_}-t$threads"; mkdir -p "$dir"
  printf 'sources:\n  - type: file\n    include: ["%s"]\n    read_from: beginning\n%s\nsinks:\n%s\n' "$data" "$extra" "$sink" > "$dir/p.yaml"
  local t0; t0=$(date +%s.%N)
  "$BIN" run --config "$dir/p.yaml" --data-dir "$dir/data" --threads "$threads" --api-addr 127.0.0.1:0 > /dev/null 2> "$dir/err" &
  AGENT=$!
  local port=""
  for _ in $(seq 1200); do port=$(grep -o -m1 'http://127.0.0.1:[0-9]*' "$dir/err" | sed 's/.*://' || true); [[ -n "$port" ]] && break; sleep 0.05; done
  [[ -n "$port" ]] || { echo "bench/pipelines.sh: petrel did not start; its log:" >&2; cat "$dir/err" >&2; exit 1; }
  local perf=""
  if [[ -n "${BENCH_PERF:-}" ]]; then
    # System-wide: `-p` would miss threads started later (librdkafka's
    # broker threads); `perf report --pid` picks the agent out.
    perf record -F 999 ${BENCH_PERF_ARGS:-} -a -o "$OUT/perf-$ds-${label// /_}.data" >/dev/null 2>&1 &
    perf=$!
  fi
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
  [[ -n "$perf" ]] && { kill -INT "$perf"; wait "$perf" || true; }
  if [[ -n "${BENCH_PERF:-}" ]]; then
    # CPU seconds per thread (name), next to the profile.
    for t in /proc/"$AGENT"/task/*; do
      awk '{ match($0, /\(.*\)/); name = substr($0, RSTART + 1, RLENGTH - 2); split(substr($0, RSTART + RLENGTH), f, " "); printf "%s\t%.2f\n", name, (f[12] + f[13]) / 100 }' "$t/stat"
    done | sort | awk -F'\t' '{ s[$1] += $2 } END { for (k in s) printf "%s=%.2f ", k, s[k]; print "" }' > "$OUT/perf-$ds-${label// /_}.threads"
  fi
  kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=""
  [[ "${n%.*}" == "$lines" ]] || { echo "bench/pipelines.sh: $ds $label did not complete ($n of $lines)" >&2; exit 1; }
  python3 - "$ds" "$label" "$threads" "$bytes" "$lines" "$t0" "$t1" "$cpu" "$rss" "$wc_s" <<'EOPY'
import sys
ds, label, th, b, l, t0, t1, cpu, rss, wc = sys.argv[1:]
b, l, w, cpu, rss, wc = int(b), int(l), float(t1) - float(t0), float(cpu), float(rss), float(wc)
print(f"| {ds} | {label} | {th} | {b/w/1e6:.0f} | {l/w:.0f} | {cpu/(b/1e9):.2f} | {rss:.0f} | {b/wc/1e6:.0f} | {(b/w)/(b/wc):.3f} |")
EOPY
}

# The same 10 MB/s of single128 (`petrel gen --rate`, one append per 10 ms)
# into the file sink and into Kafka, for RATE_DURATION s each (default 30):
# the agent's share of one core when the broker keeps up.
rate_rows() {
  [[ "${BENCH_RATE:-1}" == 1 ]] || return 0
  echo
  echo "Fixed rate, single128 written by \`petrel gen --rate\` for ${RATE_DURATION:-30} s, ndjson:"
  echo
  echo "| rate | sink | CPU % of one core | VmHWM MB | all lines arrived |"
  echo "|---|---|---:|---:|---|"
  local r sink
  for r in ${RATE_RATES:-10MB}; do
    for sink in ndjson "kafka:127.0.0.1:$PORT"; do
      python3 "$ROOT/bench/petrel_bench.py" rate --bin "$BIN" --rate "$r" --duration "${RATE_DURATION:-30}" \
        --format single128 --sink "$sink" --threads 1 --workdir "$WORK/rate-$r-${sink%%:*}" --quiet-wait 0 \
        > "$WORK/rate.json" || { echo "bench/pipelines.sh: rate run $r $sink failed" >&2; exit 1; }
      python3 - "$WORK/rate.json" "$r" "${sink%%:*}" <<'EOPY'
import json, sys
d = json.load(open(sys.argv[1]))
cpu = d.get("cpu_exact_pct") or d["cpu_pct"]
sink = "file ndjson" if sys.argv[3] == "ndjson" else "kafka ndjson"
print(f"| {sys.argv[2][:-2]} MB/s | {sink} | {cpu:.2f} | {d['hwm_kb']/1024:.1f} | {'yes' if d['arrived'] else 'NO'} |")
EOPY
    done
  done
}

header() {
  echo "| data set | pipeline | threads | MB/s | events/s | CPU s per GB | peak RSS MB | wc -l MB/s | ratio to wc -l |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
}
NDJSON="  - type: file
    path: /dev/null
    encoding: ndjson"
REGEX='\[(?<time>[^]]+)]\s\[(?<level>\w+)]\s\[(?<pid>\d+)]\s(?<file>\S+):(?<line>\d+)\slog:(?<log>.*)'
case "$MODE" in
processors)
  exec > >(tee "$OUT/processors.md")
  {
    echo "# Processing pipelines ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "BENCH_SIZE=$SIZE, file from the beginning → processor → file sink (ndjson) on /dev/null. Wall time includes start-up and, for multiline, the 50 ms flush of the last event."
    echo
    header
    for t in ${BENCH_THREADS:-1 2}; do
      run regex512 "$NDJSON" "parse_regex" "$t" 1 "processors:
  - type: parse_regex
    pattern: '$REGEX'"
      run json512 "$NDJSON" "parse_json" "$t" 1 "processors:
  - type: parse_json"
      run delim512 "$NDJSON" "parse_delimiter" "$t" 1 "processors:
  - type: parse_delimiter
    separator: '|'
    keys: [time, level, pid, file, line, log]"
      run multiline512 "$NDJSON" "multiline start_pattern" "$t" 23 "    multiline:
      start_pattern: '\\['
      timeout_ms: 50"
      run multiline512 "$NDJSON" "multiline timestamp" "$t" 23 "    multiline:
      mode: timestamp
      timeout_ms: 50"
    done
  }
  ;;
kafka)
  start_broker
  exec > >(tee "$OUT/kafka.md")
  {
    echo "# File → Kafka vs file sink ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "BENCH_SIZE=$SIZE, --threads 1, broker on this host (Kafka 3.9.1, KRaft, 3 partitions). One Kafka message per event, acks=all, idempotent producer."
    echo
    header
    for ds in ${BENCH_DATASETS:-single128 json512}; do
      run "$ds" "$NDJSON" "file ndjson"
      for c in none lz4; do
        run "$ds" "  - type: kafka
    brokers: [\"127.0.0.1:$PORT\"]
    topic: bench-$ds-$c
    encoding: ndjson
    compression: $c${BENCH_KAFKA_EXTRA:+
    $BENCH_KAFKA_EXTRA}" "kafka ndjson $c"
      done
    done
    rate_rows
  }
  ;;
*) echo "usage: bench/pipelines.sh processors|kafka" >&2; exit 2 ;;
esac
