#!/usr/bin/env bash
# Syslog ingestion over loopback, side by side: rsyslog, syslog-ng and Petrel
# each receive the same loggen stream in turn (one receiver runs at a time)
# and write every message to a file.
#
#   bench/syslog.sh                 every case and receiver
#   BENCH_RECEIVERS="rsyslog syslog-ng" bench/syslog.sh
#
# Generator: syslog-ng's loggen (an independent program, package
# syslog-ng-core), RFC 5424 (`--syslog-proto`). loggen's RFC 5424 messages
# are at least 140 bytes: asked for less it still writes 140 but frames
# them with the smaller length and drops the newline, so sizes start at 140.
#   tcp1, tcp4  `--inet --stream --active-connections 1|4`, as fast as
#               loggen goes (--rate 100M per connection) for BENCH_SECONDS;
#               TCP flow control makes loggen wait for a slower receiver, so
#               msgs/s is the receiver's rate unless it reaches loggen's own
#               (the "generator alone" table). Octet-counted framing
#               (RFC 6587, loggen's default); BENCH_FRAMING=newline sends
#               newline-terminated frames instead (`--no-framing`).
#   udp         `--inet --dgram --no-framing` at fixed rates, to show loss.
#
# Receivers (private config files and state under the run's work directory,
# nothing under /etc or /var, nothing on /dev/log or port 514):
#   rsyslog     imptcp and imudp on 127.0.0.1:PORT → ruleset → omfile with a
#               template of the message (%msg%); `rsyslogd -n -f CONF -i PID`
#               (+ -M MODDIR when it is the copy unpacked by
#               scripts/install-syslog-tools.sh). Defaults otherwise.
#   syslog-ng   syslog() sources (tcp, udp; RFC 5424 with RFC 6587 framing)
#               → file() with template ${MSG}; flags(flow-control) in the log
#               path so that TCP input waits for the file instead of
#               dropping (rsyslog and Petrel do not drop TCP input either);
#               with BENCH_FRAMING=newline: network(flags(syslog-protocol)).
#               `syslog-ng -F -f CONF --persist-file --pidfile --control`.
#   petrel      `petrel run --threads 1` with a syslog source (format
#               rfc5424) → file sink (encoding: text); petrel-disk: the same
#               with the source's disk buffer (the spool); petrel-ndjson
#               (not in the default list): memory buffer, every field as
#               ndjson. A row is skipped, with the reason, when
#               `petrel validate` rejects the pipeline (an older binary
#               given as PETREL_BIN).
#
# Each row: messages sent (loggen's own count), received (lines carrying
# loggen's "seq: " in the output file, counted once the file has not grown
# for BENCH_QUIET s after loggen ended), loss %, messages/s (received /
# time from loggen's start to the last growth of the file), the receiver's
# CPU seconds (utime+stime from /proc/PID/stat, after minus before; this
# kernel samples them at timer ticks, 10 ms) and CPU s per million
# messages, peak RSS (VmHWM), and the ratio of CPU per million to Petrel's
# in the same case. UDP rows add the kernel's drop count for the
# receiver's socket (/proc/net/udp "drops"), read before it stops. loggen's
# own CPU seconds are in every row: on 2 cores loggen and the receiver
# share the machine.
#
# Environment:
#   BENCH_SECONDS      seconds loggen sends per run (default 10)
#   BENCH_RECEIVERS    default "rsyslog syslog-ng petrel petrel-disk"
#   BENCH_CASES        default "gen tcp udp" (gen = loggen alone into a
#                      discarding sink, to show the generator's own rate)
#   BENCH_SIZES        TCP message sizes in bytes (default "140 512")
#   BENCH_CONNECTIONS  TCP connections (default "1 4")
#   BENCH_UDP_RATES    messages/s for UDP (default "50000 100000 200000")
#   BENCH_UDP_SIZE     UDP message size (default 140)
#   BENCH_FRAMING      octet (default) or newline, for TCP
#   BENCH_UDP_RCVBUF   UDP socket receive buffer in bytes for every receiver
#                      (rsyslog rcvbufSize, syslog-ng so-rcvbuf, Petrel
#                      receive_buffer_bytes). Default: none set, so all
#                      three keep the kernel's net.core.rmem_default
#   BENCH_QUIET        seconds without growth that mean drained (default 2)
#   BENCH_DRAIN_TIMEOUT  longest wait for that after loggen ends (default 120)
#   BENCH_QUIET_WAIT   before each run, wait up to this many seconds for the
#                      machine to be idle (<15% busy) (default 30; 0 = don't)
#   BENCH_DIR          work directory (default: a new /var/tmp/petrel-syslog.*,
#                      removed at exit; output files are deleted after each run)
#   PETREL_BIN         default ${CARGO_TARGET_DIR:-target}/release/petrel (not
#                      built by this script; a private copy is run)
#   PETREL_THREADS     petrel's --threads (default 1)
#   LOGGEN, RSYSLOGD, SYSLOG_NG  override the programs' paths
#
#   BENCH_RESULT       where the report goes (default
#                      bench/results/syslog-<UTC date>.md)
#   BENCH_TSV          also copy the raw rows (tab-separated: case, receiver,
#                      OK|SKIP, sent, received, seconds, CPU s, VmHWM kB, ...)
#                      to this file (bench/headline.sh reads them)
#
# Results: the tables on stdout and in bench/results/syslog-<UTC date>.md;
# per-run configs and logs stay in BENCH_DIR while it runs. Needs bash,
# python3, awk, grep; the peers from scripts/install-syslog-tools.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LC_ALL=C

BENCH_SECONDS="${BENCH_SECONDS:-10}"
BENCH_RECEIVERS="${BENCH_RECEIVERS:-rsyslog syslog-ng petrel petrel-disk}"
BENCH_CASES="${BENCH_CASES:-gen tcp udp}"
BENCH_SIZES="${BENCH_SIZES:-140 512}"
BENCH_CONNECTIONS="${BENCH_CONNECTIONS:-1 4}"
BENCH_UDP_RATES="${BENCH_UDP_RATES:-50000 100000 200000}"
BENCH_UDP_SIZE="${BENCH_UDP_SIZE:-140}"
BENCH_FRAMING="${BENCH_FRAMING:-octet}"
BENCH_UDP_RCVBUF="${BENCH_UDP_RCVBUF:-}"
BENCH_QUIET="${BENCH_QUIET:-2}"
BENCH_DRAIN_TIMEOUT="${BENCH_DRAIN_TIMEOUT:-120}"
BENCH_QUIET_WAIT="${BENCH_QUIET_WAIT:-30}"
PETREL_BIN="${PETREL_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/petrel}"
PETREL_THREADS="${PETREL_THREADS:-1}"
FULL_RATE=100000000   # loggen's --rate per connection for "as fast as it goes"

die() { echo "bench/syslog.sh: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

[[ "$BENCH_FRAMING" == octet || "$BENCH_FRAMING" == newline ]] || die "BENCH_FRAMING must be octet or newline"
for s in $BENCH_SIZES $BENCH_UDP_SIZE; do
    ((s >= 140 && s <= 8192)) || die "message size $s: loggen's RFC 5424 messages are 140 to 8192 bytes"
done

find_loggen() {
    command -v loggen 2>/dev/null && return
    find /usr/lib/syslog-ng -name loggen -type f -perm -u+x 2>/dev/null | sort | tail -1
}
LOGGEN="${LOGGEN:-$(find_loggen)}"
[[ -n "$LOGGEN" && -x "$LOGGEN" ]] || die "loggen not found (scripts/install-syslog-tools.sh)"
if [[ -z "${RSYSLOGD:-}" ]]; then
    if [[ -x /usr/sbin/rsyslogd ]]; then RSYSLOGD=/usr/sbin/rsyslogd
    else RSYSLOGD="$ROOT/.cache/rsyslog/usr/sbin/rsyslogd"; fi
fi
SYSLOG_NG="${SYSLOG_NG:-/usr/sbin/syslog-ng}"
# The unpacked rsyslog needs its module directory named.
RSYSLOG_ARGS=()
if [[ "$RSYSLOGD" != /usr/sbin/rsyslogd ]]; then
    moddir=$(find "$(dirname "$(dirname "$RSYSLOGD")")/lib" -name imptcp.so 2>/dev/null | head -1)
    [[ -z "$moddir" ]] || RSYSLOG_ARGS=(-M "$(dirname "$moddir")")
fi

WORK="${BENCH_DIR:-}"
OWN_WORK=0
if [[ -z "$WORK" ]]; then WORK=$(mktemp -d /var/tmp/petrel-syslog.XXXXXX); OWN_WORK=1; fi
mkdir -p "$WORK"
PIDS=()   # everything this script started and has not stopped yet

cleanup() {
    local rc=$? p
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    ((OWN_WORK == 0)) || rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget_pid() { # PID
    local p keep=()
    for p in "${PIDS[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# Stops PID (TERM, then KILL after 10 s) and reaps it.
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    forget_pid "$pid"
}

now() { date +%s.%N; }
# Floating-point arithmetic; comparisons print 1 or 0 (parenthesised, so
# that awk does not read `>` as a redirection).
calc() { awk "BEGIN { printf \"%.9g\", ($1) }" </dev/null; }

# A port free for both TCP and UDP on 127.0.0.1.
free_port() {
    python3 - <<'EOF'
import socket
for _ in range(100):
    t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        u.close(); t.close()
    print(port); break
EOF
}

# Sockets bound to 127.0.0.1:PORT in /proc/net/{tcp,udp}: "listening tcp
# PORT" is true once a TCP socket listens (state 0A), "listening udp PORT"
# once a UDP socket is bound.
listening() { # tcp|udp PORT
    local hex state
    hex=$(printf '0100007F:%04X' "$2")
    [[ "$1" == tcp ]] && state=0A || state=07
    awk -v a="$hex" -v s="$state" '$2 == a && $4 == s { found = 1 } END { exit !found }' "/proc/net/$1"
}

udp_drops() { # PORT: summed over every socket bound to it (SO_REUSEPORT)
    awk -v a="$(printf '0100007F:%04X' "$1")" '$2 == a { d += $NF } END { print d + 0 }' /proc/net/udp
}

cpu_ticks() { # PID: utime + stime, in clock ticks
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}
# The same with the reaped children's (cutime + cstime).
cpu_ticks_all() { awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)

# CPU seconds all cores spent busy since boot (/proc/stat).
busy_s() { awk -v t="$TICK" 'NR == 1 { print ($2 + $3 + $4 + $7 + $8 + $9) / t; exit }' /proc/stat; }

# Before each run: wait (at most BENCH_QUIET_WAIT s) for the machine to be idle.
wait_quiet() {
    ((BENCH_QUIET_WAIT > 0)) || return 0
    python3 "$ROOT/bench/petrel_bench.py" quiet --max-wait "$BENCH_QUIET_WAIT" >&2 &
    local qp=$!
    PIDS+=("$qp")
    wait "$qp" || true
    forget_pid "$qp"
}

hwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }

size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }

# ---------------------------------------------------------------- receivers

# Writes the receiver's config into WD and starts it; sets RPID. Returns 1
# (with the reason in WD/skip) when the receiver cannot run.
start_receiver() { # NAME WD PORT OUT
    local name=$1 wd=$2 port=$3 out=$4
    case "$name" in
    rsyslog)
        mkdir -p "$wd/rsyslog-work"
        # Built outside the here-document: there, quotes inside ${..:+..}
        # are dropped, and rsyslog needs the number quoted.
        local rcvbuf=""
        [[ -z "$BENCH_UDP_RCVBUF" ]] || rcvbuf=" rcvbufSize=\"$BENCH_UDP_RCVBUF\""
        cat > "$wd/rsyslog.conf" <<EOF
# bench/syslog.sh: a private rsyslogd (no imuxsock, no /var paths).
global(workDirectory="$wd/rsyslog-work")
module(load="imptcp")
module(load="imudp")
template(name="bench_msg" type="string" string="%msg%\n")
ruleset(name="bench") {
    action(type="omfile" file="$out" template="bench_msg")
}
input(type="imptcp" address="127.0.0.1" port="$port" ruleset="bench")
input(type="imudp" address="127.0.0.1" port="$port" ruleset="bench"$rcvbuf)
EOF
        if ! "$RSYSLOGD" -N1 -f "$wd/rsyslog.conf" "${RSYSLOG_ARGS[@]}" > "$wd/check.log" 2>&1; then
            echo "rsyslogd rejects its config: $(tr '\n' ' ' < "$wd/check.log")" > "$wd/skip"
            return 1
        fi
        "$RSYSLOGD" -n -f "$wd/rsyslog.conf" -i "$wd/rsyslogd.pid" "${RSYSLOG_ARGS[@]}" > "$wd/receiver.log" 2>&1 &
        ;;
    syslog-ng)
        local src
        if [[ "$BENCH_FRAMING" == octet ]]; then
            src="syslog(ip(\"127.0.0.1\") port($port) transport(\"tcp\") max-connections(64));"
        else
            src="network(ip(\"127.0.0.1\") port($port) transport(\"tcp\") flags(syslog-protocol) max-connections(64));"
        fi
        cat > "$wd/syslog-ng.conf" <<EOF
@version: $("$SYSLOG_NG" --version | awk '/^Config version:/ { print $3 }')
# bench/syslog.sh: a private syslog-ng (no system() or /dev/log source).
source s_bench {
    $src
    syslog(ip("127.0.0.1") port($port) transport("udp")${BENCH_UDP_RCVBUF:+ so-rcvbuf($BENCH_UDP_RCVBUF)});
};
destination d_bench { file("$out" template("\${MSG}\n")); };
log { source(s_bench); destination(d_bench); flags(flow-control); };
EOF
        if ! "$SYSLOG_NG" -s -f "$wd/syslog-ng.conf" > "$wd/check.log" 2>&1; then
            echo "syslog-ng rejects its config: $(tr '\n' ' ' < "$wd/check.log")" > "$wd/skip"
            return 1
        fi
        "$SYSLOG_NG" -F -f "$wd/syslog-ng.conf" --persist-file "$wd/syslog-ng.persist" \
            --pidfile "$wd/syslog-ng.pid" --control "$wd/syslog-ng.ctl" > "$wd/receiver.log" 2>&1 &
        ;;
    petrel | petrel-disk | petrel-ndjson)
        if [[ -z "$PETREL" ]]; then
            echo "$PETREL_SKIP" > "$wd/skip"
            return 1
        fi
        local mode=$5 buffer="" encoding=text
        [[ "$mode" != udp || -z "$BENCH_UDP_RCVBUF" ]] || buffer="
    receive_buffer_bytes: $BENCH_UDP_RCVBUF"
        [[ "$name" != petrel-disk ]] || buffer="$buffer
    buffer:
      type: disk"
        [[ "$name" != petrel-ndjson ]] || encoding=ndjson
        # One pipeline per file, named by its stem (like examples/ and
        # bench/pipelines.sh write them).
        cat > "$wd/bench.yaml" <<EOF
sources:
  - type: syslog
    mode: $mode
    address: 127.0.0.1:$port
    format: rfc5424$buffer
sinks:
  - type: file
    path: $out
    encoding: $encoding
EOF
        if ! "$PETREL" validate --config "$wd/bench.yaml" > "$wd/check.log" 2>&1; then
            echo "petrel validate rejects the syslog pipeline (no syslog source in this build?): $(tr '\n' ' ' < "$wd/check.log")" > "$wd/skip"
            return 1
        fi
        "$PETREL" run --config "$wd/bench.yaml" --data-dir "$wd/data" --threads "$PETREL_THREADS" \
            --api-addr 127.0.0.1:0 > "$wd/receiver.log" 2>&1 &
        ;;
    *) die "unknown receiver '$name'" ;;
    esac
    RPID=$!
    PIDS+=("$RPID")
    local proto=tcp deadline=$((SECONDS + 30))
    [[ "$5" == udp ]] && proto=udp
    until listening "$proto" "$port"; do
        if ! kill -0 "$RPID" 2>/dev/null || ((SECONDS > deadline)); then
            echo "$name did not listen on 127.0.0.1:$port/$proto within 30 s: $(tail -5 "$wd/receiver.log" | tr '\n' ' ')" > "$wd/skip"
            stop_pid "$RPID"
            return 1
        fi
        sleep 0.05
    done
}

# ------------------------------------------------------------------ loggen

# Runs loggen (bounded by timeout) and sets SENT and GEN_S (its own count
# and time) and GEN_CPU (its CPU seconds: the growth of this shell's
# children times, which only loggen adds to meanwhile). In the background
# with `wait`, so that a signal's trap runs at once.
run_loggen() { # PORT PROTO SIZE CONNS RATE
    local port=$1 proto=$2 size=$3 conns=$4 rate=$5 args=(--inet --syslog-proto -Q)
    if [[ "$proto" == udp ]]; then
        args+=(--dgram --no-framing)
    else
        args+=(--stream --active-connections "$conns")
        [[ "$BENCH_FRAMING" == octet ]] || args+=(--no-framing)
    fi
    args+=(--size "$size" --rate "$rate" --interval "$BENCH_SECONDS")
    local log="$WORK/loggen.log" lp
    # `times` prints this shell's children's user and system time on line
    # 2 (into a file: in a pipeline or $(...) it would run in a fork).
    times > "$WORK/times.0"
    timeout -k 5 $((BENCH_SECONDS + 60)) "$LOGGEN" "${args[@]}" 127.0.0.1 "$port" > "$log" 2>&1 &
    lp=$!
    PIDS+=("$lp")
    wait "$lp" || true
    forget_pid "$lp"
    times > "$WORK/times.1"
    GEN_CPU=$(awk 'FNR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t[FILENAME] += a[1] * 60 + a[2] } }
        END { printf "%.2f", t[ARGV[2]] - t[ARGV[1]] }' "$WORK/times.0" "$WORK/times.1")
    read -r SENT GEN_S < <(awk '/average rate/ {
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^count=/) { sub(/^count=/, "", $i); sub(/,$/, "", $i); n = $i }
            if ($i ~ /^time=/) { sub(/^time=/, "", $i); sub(/,$/, "", $i); t = $i }
        }
    } END { if (n == "") { n = 0; t = 0 } print n, t }' "$log")
}

# ---------------------------------------------------------------- one run

ROWS="$WORK/rows.tsv"
: > "$ROWS"

# Runs one receiver on one case and appends a row to ROWS.
run_case() { # RECEIVER CASE PROTO SIZE CONNS RATE
    local recv=$1 case=$2 proto=$3 size=$4 conns=$5 rate=$6
    local wd="$WORK/$recv-$case" port out
    rm -rf "$wd"; mkdir -p "$wd"
    port=$(free_port)
    out="$wd/out.log"
    RPID=""
    if ! start_receiver "$recv" "$wd" "$port" "$out" "$proto"; then
        note "$recv $case: skipped: $(cat "$wd/skip")"
        printf '%s\t%s\tSKIP\t%s\n' "$case" "$recv" "$(cat "$wd/skip")" >> "$ROWS"
        return 0
    fi
    sleep 0.5   # let it finish starting (threads, files)
    wait_quiet
    local cpu0 t0 t_end busy0
    cpu0=$(cpu_ticks "$RPID")
    busy0=$(busy_s)
    t0=$(now)
    run_loggen "$port" "$proto" "$size" "$conns" "$rate"
    t_end=$(now)
    local sent=$SENT gen_s=$GEN_S gen_cpu=$GEN_CPU
    # Drained: the file has not grown for BENCH_QUIET s (bounded).
    local last_size last_t cur deadline
    last_size=$(size_of "$out"); last_t=$(now)
    deadline=$((SECONDS + BENCH_DRAIN_TIMEOUT))
    local drained=0
    while ((SECONDS < deadline)); do
        sleep 0.1
        cur=$(size_of "$out")
        if [[ "$cur" != "$last_size" ]]; then
            last_size=$cur; last_t=$(now)
        elif (($(calc "$(now) - $last_t >= $BENCH_QUIET"))); then
            drained=1; break
        fi
        kill -0 "$RPID" 2>/dev/null || break
    done
    local alive=1
    kill -0 "$RPID" 2>/dev/null || alive=0
    local cpu1=0 hwm=0 drops="" busy1
    busy1=$(busy_s)
    if ((alive)); then
        cpu1=$(cpu_ticks "$RPID")
        hwm=$(hwm_kb "$RPID")
        [[ "$proto" != udp ]] || drops=$(udp_drops "$port")
    fi
    stop_pid "$RPID"
    # Petrel's disk buffer (GBs at full rate): not needed after the run.
    rm -rf "$wd/data"
    local notes=()
    ((alive)) || notes+=("receiver DIED (log: $(tail -3 "$wd/receiver.log" | tr '\n' ' '))")
    ((drained || !alive)) || notes+=("still growing after ${BENCH_DRAIN_TIMEOUT} s")
    [[ "$(size_of "$out")" == "$last_size" ]] || notes+=("wrote more when stopped")
    local got
    got=$(grep -cF 'seq: ' "$out" 2>/dev/null || true)
    got=${got:-0}
    head -c 4096 "$out" > "$wd/out.head" 2>/dev/null || true
    rm -f "$out"
    # Time from loggen's start to the last growth of the output file; a
    # receiver that wrote nothing gets loggen's time.
    local dur
    dur=$(calc "$last_t - $t0")
    ((got > 0)) || dur=$(calc "$t_end - $t0")
    local cpu other
    cpu=$(calc "($cpu1 - $cpu0) / $TICK")
    # Cores used by everything else (not the receiver, not loggen) from
    # loggen's start until the receiver drained: the noise indicator.
    other=$(calc "($busy1 - $busy0 - $cpu - $gen_cpu) / ($(now) - $t0)")
    (($(calc "$other > 0"))) || other=0
    printf '%s\t%s\tOK\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$case" "$recv" "$sent" "$got" "$dur" "$cpu" "$hwm" "${drops:--}" "$gen_s" "$gen_cpu" "$rate" \
        "$(IFS=';'; echo "${notes[*]:-}")" "$size" "$other" >> "$ROWS"
    awk -F'\t' 'END { printf "%-10s %-12s sent %d received %d in %.2f s, CPU %.2f s, VmHWM %.1f MB, drops %s %s\n", $1, $2, $4, $5, $6, $7, $8 / 1024, $9, $13 }' "$ROWS" >&2
}

# loggen alone into a sink that reads and discards: socat into /dev/null
# (1 MiB reads, a process per TCP connection) when installed, else python3.
GEN_ROWS="$WORK/gen.tsv"
: > "$GEN_ROWS"
if command -v socat >/dev/null; then GEN_SINK=socat; else GEN_SINK=python3; fi
run_gen() { # CASE PROTO SIZE CONNS
    local case=$1 proto=$2 size=$3 conns=$4 port wd="$WORK/gen-$1"
    mkdir -p "$wd"
    port=$(free_port)
    if [[ "$GEN_SINK" == socat ]]; then
        if [[ "$proto" == udp ]]; then
            socat -u -b 65536 "UDP-RECV:$port,bind=127.0.0.1,rcvbuf=8388608" OPEN:/dev/null 2> "$wd/sink.err" &
        else
            socat -u -b 1048576 "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" OPEN:/dev/null 2> "$wd/sink.err" &
        fi
    else
    python3 - "$proto" "$port" > "$wd/sink.out" 2> "$wd/sink.err" <<'EOF' &
import selectors, signal, socket, sys
proto, port = sys.argv[1], int(sys.argv[2])
sel = selectors.DefaultSelector()
total = 0
def done(*_):
    print(total, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
if proto == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("127.0.0.1", port))
    buf = bytearray(65536)
    while True:
        total += 1 if s.recv_into(buf) else 0
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(64)
sel.register(ls, selectors.EVENT_READ)
buf = bytearray(1 << 20)
while True:
    for key, _ in sel.select():
        c = key.fileobj
        if c is ls:
            conn, _ = ls.accept()
            sel.register(conn, selectors.EVENT_READ)
            continue
        n = c.recv_into(buf)
        if n == 0:
            sel.unregister(c)
            c.close()
        total += n
EOF
    fi
    local spid=$!
    PIDS+=("$spid")
    local deadline=$((SECONDS + 20))
    until listening "$proto" "$port"; do
        if ((SECONDS > deadline)) || ! kill -0 "$spid" 2>/dev/null; then
            die "discarding sink did not start: $(cat "$wd/sink.err")"
        fi
        sleep 0.05
    done
    local cpu0 cpu1
    wait_quiet
    cpu0=$(cpu_ticks_all "$spid")
    run_loggen "$port" "$proto" "$size" "$conns" "$FULL_RATE"
    local sent=$SENT gen_s=$GEN_S gen_cpu=$GEN_CPU
    sleep 0.5   # socat's per-connection children exit and are reaped
    cpu1=$(cpu_ticks_all "$spid")
    stop_pid "$spid"
    printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$sent" "$gen_s" "$gen_cpu" "$(calc "($cpu1 - $cpu0) / $TICK")" >> "$GEN_ROWS"
    awk -F'\t' 'END { printf "%-10s loggen alone: %d messages in %.2f s = %.0f msg/s, loggen CPU %.2f s, sink CPU %.2f s\n", $1, $2, $3, $2 / $3, $4, $5 }' "$GEN_ROWS" >&2
}

# ------------------------------------------------------------------ main

PETREL=""
PETREL_SKIP=""
if [[ " $BENCH_RECEIVERS " == *" petrel"* ]]; then
    if [[ -x "$PETREL_BIN" ]]; then
        # A private copy: others may rebuild target/ meanwhile.
        cp "$PETREL_BIN" "$WORK/petrel"
        PETREL="$WORK/petrel"
    else
        PETREL_SKIP="$PETREL_BIN not found (cargo build --release -p petrel, or set PETREL_BIN)"
        note "Petrel rows skipped: $PETREL_SKIP"
    fi
fi
for r in $BENCH_RECEIVERS; do
    case "$r" in
    rsyslog) [[ -x "$RSYSLOGD" ]] || die "rsyslogd not found at $RSYSLOGD (scripts/install-syslog-tools.sh)" ;;
    syslog-ng) [[ -x "$SYSLOG_NG" ]] || die "syslog-ng not found at $SYSLOG_NG (scripts/install-syslog-tools.sh)" ;;
    petrel | petrel-disk | petrel-ndjson) ;;
    *) die "unknown receiver '$r' (rsyslog, syslog-ng, petrel, petrel-disk, petrel-ndjson)" ;;
    esac
done

machine_facts() {
    echo "nproc: $(nproc); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); kernel $(uname -r); memory $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "UDP receive buffers: net.core.rmem_default=$(cat /proc/sys/net/core/rmem_default), rmem_max=$(cat /proc/sys/net/core/rmem_max)"
    echo "loggen: $LOGGEN (syslog-ng-core $(dpkg-query -W -f='${Version}' syslog-ng-core 2>/dev/null || echo '?'))"
    [[ " $BENCH_RECEIVERS " != *" rsyslog "* ]] || echo "rsyslog: $RSYSLOGD, $("$RSYSLOGD" -v | head -1 | tr -s ' \t' ' ' | sed 's/ compiled with://')"
    [[ " $BENCH_RECEIVERS " != *" syslog-ng "* ]] || echo "syslog-ng: $("$SYSLOG_NG" --version | head -1)"
    if [[ -n "$PETREL" ]]; then
        echo "petrel: $("$PETREL" --version), sha256 $(sha256sum "$PETREL" | cut -c1-12), tree $(cd "$ROOT" && git rev-parse --short HEAD)"
    fi
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
}

START=$(date -u +%Y-%m-%dT%H:%MZ)
FACTS=$(machine_facts)
note "work directory $WORK"

if [[ " $BENCH_CASES " == *" gen "* ]]; then
    for conns in $BENCH_CONNECTIONS; do
        for size in $BENCH_SIZES; do
            run_gen "tcp$conns-$size" tcp "$size" "$conns"
        done
    done
    run_gen "udp-$BENCH_UDP_SIZE" udp "$BENCH_UDP_SIZE" 1
fi
if [[ " $BENCH_CASES " == *" tcp "* ]]; then
    for conns in $BENCH_CONNECTIONS; do
        for size in $BENCH_SIZES; do
            for r in $BENCH_RECEIVERS; do
                run_case "$r" "tcp$conns-$size" tcp "$size" "$conns" "$FULL_RATE"
            done
        done
    done
fi
if [[ " $BENCH_CASES " == *" udp "* ]]; then
    for rate in $BENCH_UDP_RATES; do
        for r in $BENCH_RECEIVERS; do
            run_case "$r" "udp-$BENCH_UDP_SIZE@$((rate / 1000))k" udp "$BENCH_UDP_SIZE" 1 "$rate"
        done
    done
fi

report() {
    echo "# Syslog ingestion over loopback ($START)"
    echo
    echo "Command: \`BENCH_SECONDS=$BENCH_SECONDS BENCH_RECEIVERS=\"$BENCH_RECEIVERS\" BENCH_CASES=\"$BENCH_CASES\" bench/syslog.sh\`; loggen RFC 5424 (\`--syslog-proto\`), TCP framing: $BENCH_FRAMING; UDP receive buffer: ${BENCH_UDP_RCVBUF:-default per receiver}; each receiver alone on the stream, writing every message to a file."
    echo
    while IFS= read -r line; do echo "- $line"; done <<< "$FACTS"
    if [[ -s "$GEN_ROWS" ]]; then
        echo
        echo "loggen alone, as fast as it goes, into a discarding sink ($GEN_SINK → /dev/null):"
        echo
        echo "| case | loggen msgs/s | sent | loggen s | loggen CPU s | sink CPU s |"
        echo "|---|---:|---:|---:|---:|---:|"
        awk -F'\t' '{ printf "| %s | %.0f | %d | %.2f | %.2f | %.2f |\n", $1, ($3 > 0 ? $2 / $3 : 0), $2, $3, $4, $5 }' "$GEN_ROWS"
    fi
    [[ -s "$ROWS" ]] || return 0
    echo
    echo "| case | receiver | sent | received | loss % | kernel drops | msgs/s | CPU s | CPU s per M msgs | peak RSS MB | CPU/M vs Petrel | loggen msgs/s sent | loggen CPU s | other procs (cores) | notes |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    # CPU per million of Petrel (memory buffer) in each case, for the ratio.
    awk -F'\t' '
        $3 == "OK" && $2 == "petrel" && $5 > 0 { ref[$1] = $7 / ($5 / 1e6) }
        { rows[NR] = $0 }
        END {
            for (i = 1; i <= NR; i++) {
                split(rows[i], f, "\t")
                if (f[3] != "OK") {
                    printf "| %s | %s | - | - | - | - | - | - | - | - | - | - | - | - | skipped: %s |\n", f[1], f[2], f[4]
                    continue
                }
                sent = f[4]; got = f[5]; dur = f[6]; cpu = f[7]
                loss = sent > 0 ? (sent - got) * 100 / sent : 0
                cpum = got > 0 ? sprintf("%.2f", cpu / (got / 1e6)) : "-"
                ratio = (got > 0 && (f[1] in ref) && ref[f[1]] > 0) ? sprintf("%.2f", (cpu / (got / 1e6)) / ref[f[1]]) : "-"
                printf "| %s | %s | %d | %d | %.2f | %s | %.0f | %.2f | %s | %.1f | %s | %.0f | %.2f | %.2f | %s |\n",
                    f[1], f[2], sent, got, loss, f[9], (dur > 0 ? got / dur : 0), cpu, cpum, f[8] / 1024,
                    ratio, (f[10] > 0 ? sent / f[10] : 0), f[11], f[15], f[13]
            }
        }' "$ROWS"
    echo
    echo "Receivers: rsyslog = imptcp/imudp → omfile, template %msg% (which keeps the message's UTF-8 BOM, 3 bytes a line); syslog-ng = syslog() sources → file(), template \${MSG}, flags(flow-control); petrel = syslog source (format rfc5424, memory buffer) → file sink, encoding text, --threads $PETREL_THREADS; petrel-disk = the same with \`buffer: {type: disk}\`; petrel-ndjson = memory buffer, encoding ndjson. The configs are written by bench/syslog.sh."
    echo
    echo "Cases: tcpN-S = N connections, S-byte messages, loggen as fast as it goes for $BENCH_SECONDS s (TCP flow control paces it to the receiver); udp-S@Rk = one UDP socket at R thousand messages/s for $BENCH_SECONDS s. msgs/s = received / (loggen start → last growth of the output file). CPU s = the receiver's utime+stime over that window (10 ms ticks). Loss = (sent − received) / sent; kernel drops = /proc/net/udp drops of the receiver's socket, part of that loss. CPU/M vs Petrel = the receiver's CPU per million messages / Petrel's (memory buffer) in the same case. loggen shares the 2 cores with the receiver; its --rate is approximate (it sent 4-30 % more than asked in our runs, more on a busy machine), so the sent rate is measured; a UDP rate above loggen's own maximum (first table) means as fast as it goes. other procs = cores used by everything but the receiver and loggen during the run; above ~0.2 the run competed for the CPU."
}
mkdir -p "$ROOT/bench/results"
RESULT="${BENCH_RESULT:-$ROOT/bench/results/syslog-$(date -u +%Y%m%d-%H%M).md}"
report | tee "$RESULT"
[[ -z "${BENCH_TSV:-}" ]] || cp "$ROWS" "$BENCH_TSV"
note "wrote $RESULT"
