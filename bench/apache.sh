#!/usr/bin/env bash
# Seed 004: Apache httpd writing its access log through a piped logger.
# There, `CustomLog "|logger"` into a synchronous local syslog took Apache
# from ~1300 to ~50 requests/s. This measures Apache's requests/s (driven
# by ab) for each way of writing the access log:
#
#   none          no access log (the reference)
#   file          CustomLog to a plain file
#   pipe          CustomLog "|petrel pipe --spool-dir DIR" (no agent running)
#   pipe-stalled  the same, with `petrel run` reading DIR (spool source) into
#                 an http sink whose server accepts connections and does not
#                 answer while ab runs; then Apache stops, the server
#                 answers, and every access-log line must arrive exactly once
#                 (each line carries mod_unique_id's UNIQUE_ID)
#   logger-slow   CustomLog "|logger -t apache -u SOCKET" into a unix
#                 datagram socket read APACHE_SLOW_RATE times a second: the
#                 seed's failure (a synchronous syslog), for context;
#                 time-bounded (ab -t BENCH_SECONDS)
#
#   bench/apache.sh
#   APACHE_VARIANTS="none file" bench/apache.sh
#
# The pipe rows are skipped, with the reason, when `$PETREL_BIN pipe --help`
# fails (the command lands on another branch). Apache is Debian's apache2
# with its own config in a temporary directory (bench/lib/apache.sh: event
# MPM, 127.0.0.1 only, KeepAlive Off, a static index.html); ab runs on the
# same 2 cores.
#
# Environment:
#   APACHE_VARIANTS     default "none file pipe pipe-stalled logger-slow"
#   APACHE_REQUESTS     ab -n (default 50000)
#   APACHE_CONCURRENCY  ab -c values (default "10 50")
#   APACHE_REPEAT       ab runs per row against the same httpd; the fastest
#                       is reported with the range of all (default 3;
#                       logger-slow runs once)
#   APACHE_SLOW_RATE    lines/s the slow syslog socket reads (default 50)
#   APACHE_DELIVERY_TIMEOUT  longest wait for the stalled sink's lines after
#                       it recovers (default 180 s)
#   BENCH_SECONDS       ab's time limit for logger-slow (default 10)
#   BENCH_QUIET_WAIT    before each run, wait up to this many seconds for the
#                       machine to be idle (default 30; 0 = don't)
#   PETREL_BIN          default ${CARGO_TARGET_DIR:-target}/release/petrel
#                       (not built here; a private copy is run)
#   BENCH_DIR           work directory (default: a new /var/tmp/petrel-apache.*,
#                       removed at exit)
# Results: the table on stdout and in bench/results/apache-<UTC date>.md.
# Needs root (httpd binds as root and its workers run as www-data), ab,
# logger, python3; scripts/install-syslog-tools.sh installs them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="$ROOT/bench/lib/apache.sh"
export LC_ALL=C

APACHE_VARIANTS="${APACHE_VARIANTS:-none file pipe pipe-stalled logger-slow}"
APACHE_REQUESTS="${APACHE_REQUESTS:-50000}"
APACHE_CONCURRENCY="${APACHE_CONCURRENCY:-10 50}"
APACHE_REPEAT="${APACHE_REPEAT:-3}"
APACHE_SLOW_RATE="${APACHE_SLOW_RATE:-50}"
APACHE_DELIVERY_TIMEOUT="${APACHE_DELIVERY_TIMEOUT:-180}"
BENCH_SECONDS="${BENCH_SECONDS:-10}"
BENCH_QUIET_WAIT="${BENCH_QUIET_WAIT:-30}"
PETREL_BIN="${PETREL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/petrel}"

die() { echo "bench/apache.sh: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

((EUID == 0)) || die "needs root (httpd starts as root; its workers run as www-data)"
command -v ab >/dev/null || die "ab not found (scripts/install-syslog-tools.sh)"
command -v python3 >/dev/null || die "python3 is required"
for v in $APACHE_VARIANTS; do
    case "$v" in none | file | pipe | pipe-stalled | logger-slow) ;;
    *) die "unknown variant '$v' (none file pipe pipe-stalled logger-slow)" ;; esac
done

WORK="${BENCH_DIR:-}"
OWN_WORK=0
if [[ -z "$WORK" ]]; then WORK=$(mktemp -d /var/tmp/petrel-apache.XXXXXX); OWN_WORK=1; fi
mkdir -p "$WORK"
chmod 755 "$WORK"   # the workers (www-data) read htdocs below it
PIDS=()        # processes this script started and has not stopped
APACHE_DIRS=() # running httpds (stopped through the helper)

cleanup() {
    local rc=$? d p
    for d in "${APACHE_DIRS[@]}"; do "$LIB" stop "$d" >/dev/null 2>&1 || true; done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    ((OWN_WORK == 0)) || rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget() { # ARRAY-NAME VALUE
    local -n arr=$1
    local x keep=()
    for x in "${arr[@]}"; do [[ "$x" == "$2" ]] || keep+=("$x"); done
    arr=("${keep[@]}")
}

stop_pid() { # PID: TERM, KILL after 15 s, reaped
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    forget PIDS "$1"
}

# Runs "$@" in the background and waits, so that a signal's trap runs at once.
run_child() {
    "$@" &
    local p=$!
    PIDS+=("$p")
    local rc=0
    wait "$p" || rc=$?
    forget PIDS "$p"
    return "$rc"
}

wait_quiet() {
    ((BENCH_QUIET_WAIT > 0)) || return 0
    run_child python3 "$ROOT/bench/petrel_bench.py" quiet --max-wait "$BENCH_QUIET_WAIT" >&2 || true
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

listening() { # PORT
    awk -v a="$(printf '0100007F:%04X' "$1")" '$2 == a && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp
}

wait_listening() { # PORT PID WHAT
    local deadline=$((SECONDS + 30))
    until listening "$1"; do
        kill -0 "$2" 2>/dev/null || die "$3 exited before listening on 127.0.0.1:$1"
        ((SECONDS < deadline)) || die "$3 did not listen on 127.0.0.1:$1 within 30 s"
        sleep 0.05
    done
}

# ------------------------------------------------------------ helpers

# An HTTP server that accepts POSTs and holds each without answering until
# it gets SIGUSR1; then it answers 200 and appends the bodies to OUT. A
# request whose client gave up meanwhile (closed its end) is not counted.
# STATE gets {"held": requests that waited, "accepted", "abandoned"}.
stalled_server() { # PORT OUT STATE
    # exec: the caller's $! is then python's pid, for SIGUSR1 and cleanup.
    exec python3 - "$@" <<'EOF'
import http.server, json, signal, socket, sys, threading
port, out, state_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
recovered = threading.Event()
lock = threading.Lock()
state = {"held": 0, "accepted": 0, "abandoned": 0}

def save():
    with open(state_path + ".tmp", "w") as f:
        json.dump(state, f)
    import os
    os.replace(state_path + ".tmp", state_path)

signal.signal(signal.SIGUSR1, lambda *_: recovered.set())
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        if not recovered.is_set():
            with lock:
                state["held"] += 1
                save()
            recovered.wait()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        # After the body nothing more is due; EOF means the client left.
        sock = self.connection
        sock.setblocking(False)
        try:
            gone = sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        sock.setblocking(True)
        with lock:
            if gone:
                state["abandoned"] += 1
                save()
                return
            with open(out, "ab") as f:
                f.write(body if body.endswith(b"\n") or not body else body + b"\n")
            state["accepted"] += 1
            save()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

save()
Server(("127.0.0.1", port), Handler).serve_forever(poll_interval=0.1)
EOF
}

# A syslog that reads RATE datagrams a second from a unix socket: a
# synchronous syslog writing to a slow disk, as far as its writers can tell.
slow_syslog() { # SOCKET RATE COUNT_FILE
    exec python3 - "$@" <<'EOF'
import os, signal, socket, sys, time
path, rate, count_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
os.chmod(path, 0o666)
n = 0
while True:
    s.recv(65536)
    n += 1
    with open(count_path, "w") as f:
        f.write(f"{n}\n")
    time.sleep(1 / rate)
EOF
}

# Runs ab; sets AB_COMPLETE AB_FAILED AB_RPS AB_MEAN AB_P99.
run_ab() { # PORT CONCURRENCY OUTFILE [time-limited]
    local args=(-q -c "$2" -s 60)
    if [[ "${4:-}" == timed ]]; then
        args+=(-t "$BENCH_SECONDS" -n 100000000)
    else
        args+=(-n "$APACHE_REQUESTS")
    fi
    run_child timeout -k 5 $((BENCH_SECONDS + 600)) ab "${args[@]}" "http://127.0.0.1:$1/" > "$3" 2>&1 || true
    AB_COMPLETE=$(awk '/^Complete requests:/ { print $3 }' "$3")
    AB_FAILED=$(awk '/^Failed requests:/ { print $3 }' "$3")
    AB_RPS=$(awk '/^Requests per second:/ { print $4 }' "$3")
    AB_MEAN=$(awk '/^Time per request:.*\(mean\)$/ { print $4 }' "$3")
    AB_P99=$(awk '$1 == "99%" { print $2 }' "$3")
    if [[ -z "$AB_RPS" ]]; then
        note "ab did not finish: $(tail -3 "$3" | tr '\n' ' ')"
        AB_COMPLETE=${AB_COMPLETE:-0}; AB_FAILED=${AB_FAILED:--}; AB_RPS=0; AB_MEAN=-; AB_P99=-
    fi
}

# Counts lines, distinct UNIQUE_IDs (the last word of each access-log line)
# and the IDs of the expected count: prints "LINES DISTINCT".
count_delivered() { # NDJSON_FILE
    python3 - "$1" <<'EOF'
import json, sys
lines = 0
ids = set()
try:
    with open(sys.argv[1], "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            lines += 1
            try:
                msg = json.loads(raw).get("message", "")
            except ValueError:
                msg = raw.decode("utf-8", "replace")
            ids.add(msg.rstrip().rsplit(" ", 1)[-1])
except FileNotFoundError:
    pass
print(lines, len(ids))
EOF
}

# -------------------------------------------------------------- petrel

PETREL=""
PETREL_SKIP=""
if [[ " $APACHE_VARIANTS " == *" pipe"* ]]; then
    if [[ ! -x "$PETREL_BIN" ]]; then
        PETREL_SKIP="$PETREL_BIN not found (cargo build --release -p petrel, or set PETREL_BIN)"
    elif ! "$PETREL_BIN" pipe --help > "$WORK/pipe-help.txt" 2>&1; then
        PETREL_SKIP="\`$PETREL_BIN pipe --help\` fails (no pipe command in this build): $(head -2 "$WORK/pipe-help.txt" | tr '\n' ' ')"
    else
        # A private copy: others may rebuild target/ meanwhile.
        cp "$PETREL_BIN" "$WORK/petrel"
        PETREL="$WORK/petrel"
    fi
    [[ -z "$PETREL_SKIP" ]] || note "petrel pipe rows skipped: $PETREL_SKIP"
fi

# ---------------------------------------------------------------- runs

ROWS="$WORK/rows.tsv"
: > "$ROWS"
row() { # VARIANT C COMPLETE FAILED RPS MEAN P99 LOGGED NOTES RANGE
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$ROWS"
    note "$(printf '%-13s c=%-3s %s req/s (%s requests, %s failed), mean %s ms, p99 %s ms; logged: %s; %s' "$1" "$2" "$5" "$3" "$4" "$6" "$7" "$8" "$9")"
}

run_variant() { # VARIANT CONCURRENCY
    local v=$1 c=$2 wd="$WORK/$1-c$2" port log="" notes="" logged="-"
    rm -rf "$wd"; mkdir -p "$wd"; chmod 755 "$wd"
    if [[ "$v" == pipe* && -z "$PETREL" ]]; then
        printf '%s\t%s\tSKIP\t%s\n' "$v" "$c" "$PETREL_SKIP" >> "$ROWS"
        return 0
    fi
    port=$(free_port)
    local agent="" server="" sport=""
    case "$v" in
    none) ;;
    file) log="CustomLog \"$wd/access.log\" bench" ;;
    pipe | pipe-stalled)
        mkdir -p "$wd/spool"
        log="CustomLog \"|$PETREL pipe --spool-dir $wd/spool --name apache\" bench"
        ;;
    logger-slow)
        slow_syslog "$wd/syslog.sock" "$APACHE_SLOW_RATE" "$wd/syslog.count" 2> "$wd/syslog.err" &
        server=$!
        PIDS+=("$server")
        for _ in $(seq 100); do [[ -S "$wd/syslog.sock" ]] && break; sleep 0.05; done
        [[ -S "$wd/syslog.sock" ]] || die "slow syslog did not start: $(cat "$wd/syslog.err")"
        log="CustomLog \"|/usr/bin/logger -t apache -u $wd/syslog.sock\" bench"
        ;;
    esac
    if [[ "$v" == pipe-stalled ]]; then
        sport=$(free_port)
        stalled_server "$sport" "$wd/received.ndjson" "$wd/server.state" 2> "$wd/server.err" &
        server=$!
        PIDS+=("$server")
        wait_listening "$sport" "$server" "the stalled HTTP server"
        cat > "$wd/apache-spool.yaml" <<EOF
sources:
  - type: spool
    path: $wd/spool
sinks:
  - type: http
    url: http://127.0.0.1:$sport/ingest
    encoding: ndjson
EOF
        "$PETREL" validate --config "$wd/apache-spool.yaml" > "$wd/validate.log" 2>&1 \
            || die "petrel validate rejects the spool → http pipeline: $(cat "$wd/validate.log")"
        "$PETREL" run --config "$wd/apache-spool.yaml" --data-dir "$wd/data" --threads 1 \
            --api-addr 127.0.0.1:0 > "$wd/agent.log" 2>&1 &
        agent=$!
        PIDS+=("$agent")
    fi

    local pid
    pid=$("$LIB" start "$wd/httpd" "$port" "$log") || die "httpd did not start (see above)"
    APACHE_DIRS+=("$wd/httpd")
    note "$v, concurrency $c: httpd pid $pid on 127.0.0.1:$port"
    local extra=0
    if [[ "$v" == pipe-stalled ]]; then
        # One request first, so that the sink is stalled (its request to
        # the server held) before ab starts; its line is expected too.
        ab -q -n 1 -c 1 "http://127.0.0.1:$port/" > /dev/null 2>&1 || die "the first request to httpd failed"
        extra=1
        local deadline=$((SECONDS + 60))
        until (($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["held"])' "$wd/server.state") > 0)); do
            kill -0 "$agent" 2>/dev/null || die "petrel run exited: $(tail -5 "$wd/agent.log")"
            ((SECONDS < deadline)) || die "the agent sent nothing to the stalled server within 60 s: $(tail -5 "$wd/agent.log")"
            sleep 0.1
        done
    fi
    # APACHE_REPEAT ab runs against this httpd (one for logger-slow, which
    # stays blocked): the fastest is reported, the range shows the spread,
    # and the requests of all runs add up (every one was logged).
    local reps=$APACHE_REPEAT r total=0 failed=0 best="" range_lo="" range_hi="" b_mean=- b_p99=-
    [[ "$v" != logger-slow ]] || reps=1
    for r in $(seq "$reps"); do
        wait_quiet
        if [[ "$v" == logger-slow ]]; then
            run_ab "$port" "$c" "$wd/ab.$r.txt" timed
        else
            run_ab "$port" "$c" "$wd/ab.$r.txt"
        fi
        total=$((total + AB_COMPLETE))
        [[ "$AB_FAILED" == - ]] || failed=$((failed + AB_FAILED))
        if [[ -z "$best" ]] || (($(awk -v a="$AB_RPS" -v b="$best" 'BEGIN { print (a > b) }'))); then
            best=$AB_RPS b_mean=$AB_MEAN b_p99=$AB_P99
        fi
        if [[ -z "$range_lo" ]] || (($(awk -v a="$AB_RPS" -v b="$range_lo" 'BEGIN { print (a < b) }'))); then range_lo=$AB_RPS; fi
        if [[ -z "$range_hi" ]] || (($(awk -v a="$AB_RPS" -v b="$range_hi" 'BEGIN { print (a > b) }'))); then range_hi=$AB_RPS; fi
    done
    AB_COMPLETE=$total AB_FAILED=$failed
    local held=""
    [[ "$v" != pipe-stalled ]] || held=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["held"])' "$wd/server.state")
    "$LIB" stop "$wd/httpd" > /dev/null
    forget APACHE_DIRS "$wd/httpd"

    case "$v" in
    file)
        logged=$(wc -l < "$wd/access.log")
        ;;
    pipe)
        logged="$(du -sk "$wd/spool" | cut -f1) KiB spooled"
        ;;
    pipe-stalled)
        # The pipe has seen EOF and synced; now the sink recovers.
        kill -USR1 "$server"
        local want=$((AB_COMPLETE + extra))
        local deadline=$((SECONDS + APACHE_DELIVERY_TIMEOUT)) lines=0 distinct=0
        while ((SECONDS < deadline)); do
            read -r lines distinct < <(count_delivered "$wd/received.ndjson")
            ((lines < want)) || break
            kill -0 "$agent" 2>/dev/null || break
            sleep 0.5
        done
        sleep 1   # anything beyond the expected count (duplicates) comes now
        read -r lines distinct < <(count_delivered "$wd/received.ndjson")
        local abandoned
        abandoned=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["abandoned"])' "$wd/server.state")
        logged="$lines delivered, $distinct distinct"
        if ((lines == want && distinct == want)); then
            notes="exactly once after recovery: yes ($want lines: ab's and the first request's)"
        else
            notes="exactly once after recovery: NO (expected $want: $((want - distinct)) missing, $((lines - distinct)) duplicates)"
        fi
        notes="$notes; $held requests of the agent held unanswered when ab ended; $abandoned abandoned by the agent (timeouts) and not counted"
        kill -0 "$agent" 2>/dev/null || notes="$notes; petrel run DIED: $(tail -3 "$wd/agent.log" | tr '\n' ' ')"
        stop_pid "$agent"
        stop_pid "$server"
        ;;
    logger-slow)
        logged="$(cat "$wd/syslog.count" 2>/dev/null || echo 0) read by the slow syslog"
        notes="ab -t $BENCH_SECONDS; syslog reads $APACHE_SLOW_RATE lines/s"
        stop_pid "$server"
        ;;
    esac
    [[ "$AB_FAILED" == 0 ]] || notes="${notes:+$notes; }$AB_FAILED failed requests"
    row "$v" "$c" "$AB_COMPLETE" "$AB_FAILED" "$best" "$b_mean" "$b_p99" "$logged" "$notes" \
        "$(awk -v a="$range_lo" -v b="$range_hi" 'BEGIN { printf "%.0f-%.0f", a, b }')"
}

START=$(date -u +%Y-%m-%dT%H:%MZ)
FACTS="nproc: $(nproc); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); kernel $(uname -r)
$(/usr/sbin/apache2 -v | head -1) (Debian $(dpkg-query -W -f='${Version}' apache2 2>/dev/null)), ${APACHE_MPM:-event} MPM; $(ab -V | head -1 | sed 's/, Version/ version/')
unix datagram queue (net.unix.max_dgram_qlen): $(cat /proc/sys/net/unix/max_dgram_qlen)
load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n "$PETREL" ]]; then
    FACTS="$FACTS
petrel: $("$PETREL" --version), sha256 $(sha256sum "$PETREL" | cut -c1-12)"
fi
note "work directory $WORK"

for c in $APACHE_CONCURRENCY; do
    for v in $APACHE_VARIANTS; do
        run_variant "$v" "$c"
    done
done

report() {
    echo "# Apache access logging (seed 004) ($START)"
    echo
    echo "Command: \`APACHE_VARIANTS=\"$APACHE_VARIANTS\" APACHE_REQUESTS=$APACHE_REQUESTS APACHE_CONCURRENCY=\"$APACHE_CONCURRENCY\" APACHE_REPEAT=$APACHE_REPEAT bench/apache.sh\`; ab -n $APACHE_REQUESTS, $APACHE_REPEAT runs per row, the fastest shown (logger-slow: one ab -t $BENCH_SECONDS) against a static page, KeepAlive off, ab on the same 2 cores. requests = all runs' requests, each logged once."
    echo
    while IFS= read -r line; do echo "- $line"; done <<< "$FACTS"
    echo
    echo "| variant | concurrency | requests | failed | requests/s | ratio to no log | requests/s range | mean ms | p99 ms | access log | notes |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    awk -F'\t' '
        $1 == "none" && $3 != "SKIP" { ref[$2] = $5 }
        { rows[NR] = $0 }
        END {
            for (i = 1; i <= NR; i++) {
                split(rows[i], f, "\t")
                if (f[3] == "SKIP") {
                    printf "| %s | %s | - | - | - | - | - | - | - | - | skipped: %s |\n", f[1], f[2], f[4]
                    continue
                }
                ratio = ((f[2] in ref) && ref[f[2]] > 0) ? sprintf("%.3f", f[5] / ref[f[2]]) : "-"
                printf "| %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4], f[5], ratio, f[10], f[6], f[7], f[8], f[9]
            }
        }' "$ROWS"
    echo
    echo "Variants: none = no access log; file = \`CustomLog FILE bench\`; pipe = \`CustomLog \"|petrel pipe --spool-dir DIR --name apache\" bench\` with no agent; pipe-stalled = the same while \`petrel run\` (spool source → http sink, --threads 1) sends to a server that holds every request unanswered until ab is done and Apache stopped, then answers: every line must arrive once (one request before ab makes sure the sink is stalled when ab starts); logger-slow = \`CustomLog \"|/usr/bin/logger -t apache -u SOCKET\" bench\` into a unix datagram socket read $APACHE_SLOW_RATE times a second (the seed's synchronous syslog). Format \`bench\` = combined + UNIQUE_ID. mean ms = ab's mean time per request (concurrency × wall time / requests), p99 = ab's 99th percentile of the request times."
}
mkdir -p "$ROOT/bench/results"
RESULT="$ROOT/bench/results/apache-$(date -u +%Y%m%d-%H%M).md"
report | tee "$RESULT"
note "wrote $RESULT"
