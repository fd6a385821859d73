#!/usr/bin/env bash
# HTTP ingest: ApacheBench (`ab`, package apache2-utils) POSTs the same
# 1 MiB body over keep-alive connections for BENCH_SECONDS into
#
#   petrel-ndjson       Petrel's http source (ndjson: every object's fields
#                       become event fields) → blackhole sink, memory buffer
#   petrel-ndjson-disk  the same with `buffer: {type: disk}` (every 200 OK
#                       only after its body was fdatasync'ed)
#   petrel-text         text/plain body (one event per line) → blackhole
#   apache-discard      Apache httpd (bench/lib/apache.sh) answering every
#                       POST with its static page and discarding the body:
#                       the loopback + generator limit, as the raw ceiling
#
# Body: complete lines of the json512 data set (`petrel gen`), 1 MiB at
# most. Petrel runs with --threads 1. Reports MB/s (MB = 10^6 bytes) of
# accepted bodies (ab's complete requests, all 2xx or the row says so),
# the receiver's CPU seconds (utime+stime of its processes from /proc),
# MB per receiver CPU second (the target is ≥ 500 per core), CPU s per
# GB, peak RSS (VmHWM), ab's own CPU, and the ratio of MB/s to
# apache-discard's.
#
#   bench/http.sh
#   BENCH_SECONDS=20 BENCH_CONCURRENCY=4 bench/http.sh
#
# Environment: BENCH_SECONDS (10), BENCH_CONCURRENCY (ab -c, 2),
# BENCH_RECEIVERS (default "apache-discard petrel-ndjson petrel-ndjson-disk
# petrel-text"), PETREL_BIN (default target/release/petrel; not built
# here). Results: stdout and bench/results/http-<UTC date>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LC_ALL=C
SECS=${BENCH_SECONDS:-10}
CONC=${BENCH_CONCURRENCY:-2}
RECEIVERS=${BENCH_RECEIVERS:-apache-discard petrel-ndjson petrel-ndjson-disk petrel-text}
PETREL=${PETREL_BIN:-$ROOT/target/release/petrel}
LIB=$ROOT/bench/lib/apache.sh

die() { echo "bench/http.sh: $*" >&2; exit 1; }
command -v ab >/dev/null || die "ab not found: scripts/install-syslog-tools.sh"
[[ -x "$PETREL" ]] || die "$PETREL not found: cargo build --release -p petrel"

WORK=$(mktemp -d /var/tmp/petrel-http.XXXXXX)
chmod 755 "$WORK"
AGENT=""
cleanup() {
    [[ -z "$AGENT" ]] || kill "$AGENT" 2>/dev/null || true
    "$LIB" stop "$WORK/httpd" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1 MiB of whole json512 lines.
"$PETREL" gen --format json512 --size 2MiB --output "$WORK/gen.ndjson" >/dev/null
python3 - "$WORK/gen.ndjson" "$WORK/body" <<'EOF'
import sys
out, n = [], 0
for line in open(sys.argv[1], "rb"):
    if n + len(line) > 1 << 20:
        break
    out.append(line); n += len(line)
open(sys.argv[2], "wb").write(b"".join(out))
EOF
BODY_BYTES=$(stat -c %s "$WORK/body")
BODY_LINES=$(wc -l < "$WORK/body")

# utime+stime in seconds of PID and its descendants.
cpu_of() {
    local total=0 p
    for p in $1 $(pgrep -P "$1" 2>/dev/null || true); do
        [[ -r /proc/$p/stat ]] || continue
        total=$(awk -v t="$total" -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print t + ($12 + $13) / hz }' "/proc/$p/stat")
    done
    echo "$total"
}
hwm_of() { awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo -; }

RESULT=$ROOT/bench/results/http-$(date -u +%Y%m%d-%H%M).md
{
    echo "# HTTP ingest ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "Command: \`BENCH_SECONDS=$SECS BENCH_CONCURRENCY=$CONC bench/http.sh\`; body $BODY_BYTES bytes, $BODY_LINES json512 lines; ab -k -c $CONC; petrel --threads 1; $(nproc) cores, load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "| receiver | requests | non-2xx | MB/s | receiver CPU s | MB per CPU s | CPU s per GB | peak RSS MB | ab CPU s | vs apache-discard |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} > "$RESULT.tmp"

RAW=""
for r in $RECEIVERS; do
    port=$(free_port)
    ctype=application/x-ndjson
    pid=""
    case $r in
    apache-discard)
        pid=$("$LIB" start "$WORK/httpd" "$port" none) || die "httpd did not start"
        ;;
    petrel-*)
        buffer=memory
        [[ $r == *-disk ]] && buffer=disk
        [[ $r == petrel-text ]] && ctype=text/plain
        rm -rf "$WORK/data"
        cat > "$WORK/http.yaml" <<EOF
sources:
  - type: http
    address: 127.0.0.1:$port
    path: /ingest
    max_body_bytes: 2MiB
    buffer: { type: $buffer }
sinks:
  - type: blackhole
EOF
        "$PETREL" run --config "$WORK/http.yaml" --data-dir "$WORK/data" --threads 1 \
            --api-addr 127.0.0.1:0 > "$WORK/agent.log" 2>&1 &
        AGENT=$!
        pid=$AGENT
        for _ in $(seq 200); do
            curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break
            sleep 0.05
        done
        ;;
    *) die "unknown receiver $r" ;;
    esac
    path=/ingest
    [[ $r == apache-discard ]] && path=/index.html
    c0=$(cpu_of "$pid")
    /usr/bin/time -f '%U %S' -o "$WORK/ab.time" \
        ab -q -k -c "$CONC" -t "$SECS" -n 10000000 -p "$WORK/body" -T "$ctype" \
        "http://127.0.0.1:$port$path" > "$WORK/ab.out" 2>&1 || die "ab failed: $(tail -5 "$WORK/ab.out")"
    c1=$(cpu_of "$pid")
    hwm=$(hwm_of "$pid")
    if [[ $r == apache-discard ]]; then
        "$LIB" stop "$WORK/httpd" >/dev/null
    else
        kill "$AGENT"; wait "$AGENT" 2>/dev/null || true; AGENT=""
    fi
    complete=$(awk '/^Complete requests:/ { print $3 }' "$WORK/ab.out")
    non2xx=$(awk '/^Non-2xx responses:/ { print $3 }' "$WORK/ab.out")
    [[ $r == apache-discard ]] && non2xx="- (405 expected)"
    took=$(awk '/^Time taken for tests:/ { print $5 }' "$WORK/ab.out")
    abcpu=$(awk '{ print $1 + $2 }' "$WORK/ab.time")
    read -r mbs cpu mbcpu cpugb < <(awk -v n="$complete" -v b="$BODY_BYTES" -v t="$took" -v c0="$c0" -v c1="$c1" \
        'BEGIN { mb = n * b / 1e6; c = c1 - c0; printf "%.0f %.2f %.0f %.2f\n", mb / t, c, (c > 0 ? mb / c : 0), (mb > 0 ? c / (mb / 1000) : 0) }')
    [[ $r == apache-discard ]] && RAW=$mbs
    ratio=-
    [[ -z "$RAW" ]] || ratio=$(awk -v a="$mbs" -v b="$RAW" 'BEGIN { printf "%.2f", a / b }')
    echo "| $r | $complete | ${non2xx:-0} | $mbs | $cpu | $mbcpu | $cpugb | $hwm | $abcpu | $ratio |" | tee -a "$RESULT.tmp"
done
mv "$RESULT.tmp" "$RESULT"
echo "== wrote $RESULT" >&2
