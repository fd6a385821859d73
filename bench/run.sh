#!/usr/bin/env bash
# Petrel benchmarks. See BENCHMARKS.md for results and how to read them.
#
#   bench/run.sh [DATASET...]      throughput mode (default: all data sets)
#   bench/run.sh rate              rate mode: 1 MB/s and 10 MB/s of single128
#
# Environment:
#   BENCH_SIZE      size of each generated data set (default 1GiB; e.g. 256MiB)
#   BENCH_SINKS     variants (default "blackhole text ndjson parse-blackhole parse-ndjson"):
#                   blackhole, text, ndjson: raw lines (processors: []) into the
#                   blackhole sink, or the file sink on /dev/null (text or ndjson);
#                   parse-blackhole, parse-ndjson: the parsing each data set is
#                   made for (regex512: parse_regex, json512: parse_json, delim512:
#                   parse_delimiter, multiline512: multiline start pattern,
#                   nginx283: parse_regex; none for single128, which is skipped).
#   BENCH_THREADS   --threads values for every data set (default: 1, plus 2 for single128)
#   BENCH_REPEAT    runs per configuration; the fastest is reported, with the
#                   range over all runs (default 3)
#   BENCH_TIMEOUT   seconds before a run counts as hung (default 600)
#   BENCH_REGEN=1   regenerate data files even if present
#   BENCH_SEED      generator seed (default 1)
#   BENCH_QUIET_WAIT  before each run, wait up to this many seconds for the
#                   machine to be idle (<15% busy) (default 30; 0 = don't)
#   RATE_DURATION   seconds per rate-mode run (default 60)
#   RATE_RATES      rates for rate mode (default "1MB 10MB"; MB = 10^6 bytes)
#   RATE_WRITERS    how the file is written in rate mode (default "gen lines"):
#                   gen = `petrel gen --rate` (one write per 10 ms slice);
#                   lines = one write() per 128-byte line, paced every 1 ms
#                   (an application logging line by line without buffering)
#   BENCH_MEMORY    petrel's --memory-limit for every run (default: petrel's default)
#   BENCH_NO_BUILD=1  skip `cargo build --release -p petrel`
#   BENCH_PLOT=0    no charts (by default bench/plot.py redraws bench/plots/*.png
#                   from everything in bench/out/ after each run)
#
# Units: MB = 10^6 bytes, GB = 10^9 bytes. Everything lands in bench/out/
# (git-ignored): data/ (generated once), results.md and results.jsonl
# (throughput), rate.md and rate.jsonl, runs/NAME/ (pipeline.yaml and
# petrel.log of the last run of each configuration). Needs bash, python3
# (standard library only), cargo, wc, awk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/bench/out"
BUILT="${CARGO_TARGET_DIR:-$ROOT/target}/release/petrel"
# Benchmarks run a private copy: others may rebuild target/ meanwhile.
BIN="$OUT/petrel"
HELPER="$ROOT/bench/petrel_bench.py"
ALL_DATASETS=(single128 regex512 json512 delim512 multiline512 nginx283)

BENCH_SIZE="${BENCH_SIZE:-1GiB}"
BENCH_SINKS="${BENCH_SINKS:-blackhole text ndjson parse-blackhole parse-ndjson}"
BENCH_REPEAT="${BENCH_REPEAT:-3}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-600}"
BENCH_SEED="${BENCH_SEED:-1}"
BENCH_QUIET_WAIT="${BENCH_QUIET_WAIT:-30}"
RATE_DURATION="${RATE_DURATION:-60}"
RATE_RATES="${RATE_RATES:-1MB 10MB}"
RATE_WRITERS="${RATE_WRITERS:-gen lines}"

export LC_ALL=C
export PYTHONDONTWRITEBYTECODE=1

CHILD=""
cleanup() {
    local rc=$?
    if [[ -n "$CHILD" ]] && kill -0 "$CHILD" 2>/dev/null; then
        # The helper kills the petrel it started when it gets SIGTERM.
        kill -TERM "$CHILD" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$CHILD" 2>/dev/null || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "bench/run.sh: $*" >&2; exit 1; }

# Runs a command in the background so that the traps fire at once, and waits.
run_child() {
    "$@" &
    CHILD=$!
    local rc=0
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

json_get() { # FILE KEY
    python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v)' "$1" "$2"
}

now() { date +%s.%N; }

# Floating-point arithmetic (awk, so that no bc is needed): calc "1 / 3".
# Comparisons print 1 or 0.
calc() { awk "BEGIN { printf \"%.9g\", $1 }" </dev/null; }

build() {
    if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
        echo "== cargo build --release -p petrel" >&2
        (cd "$ROOT" && cargo build --release -p petrel) || die "release build failed"
    fi
    [[ -x "$BUILT" ]] || die "$BUILT not found; run cargo build --release -p petrel"
    cp "$BUILT" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
    # What the copied binary was built from (others may commit meanwhile).
    BUILT_FROM="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo 'no git')$(cd "$ROOT" && git diff --quiet HEAD -- crates 2>/dev/null || echo ' + uncommitted changes in crates/')"
    echo "== using $BIN (sha256 $(sha256sum "$BIN" | cut -c1-12))" >&2
}

machine_facts() {
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "kernel: $(uname -r)"
    echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "petrel: $("$BIN" --version 2>/dev/null || echo '?'), binary sha256 $(sha256sum "$BIN" | cut -c1-12), working tree at build time: ${BUILT_FROM:-?}"
}

# Generates bench/out/<dataset>-<size>.log once (a .gen stamp remembers the
# parameters and the resulting size).
gen_file() { # DATASET -> prints path
    local ds=$1 f="$OUT/data/$1-$BENCH_SIZE.log"
    local stamp="$f.gen" want="$ds $BENCH_SIZE seed=$BENCH_SEED" report
    mkdir -p "$OUT/data"
    if [[ "${BENCH_REGEN:-0}" == 1 || ! -f "$f" || ! -f "$stamp" ]] \
        || [[ "$(head -1 "$stamp")" != "$want" ]] \
        || [[ "$(sed -n 2p "$stamp")" != "$(stat -c %s "$f")" ]] \
        || [[ -z "$(sed -n 3p "$stamp")" ]]; then
        echo "== petrel gen --format $ds --size $BENCH_SIZE" >&2
        rm -f "$f" "$stamp"
        report=$("$BIN" gen --format "$ds" --size "$BENCH_SIZE" --seed "$BENCH_SEED" --output "$f" 2>&1) \
            || die "petrel gen --format $ds failed: $report"
        echo "$report" >&2
        # Line 3: events as the generator counts them (multiline512: 23 lines each).
        printf '%s\n%s\n%s\n' "$want" "$(stat -c %s "$f")" \
            "$(echo "$report" | sed -n 's/.* \([0-9]*\) events.*/\1/p')" > "$stamp"
    fi
    echo "$f"
}

page_cache() { cat "$1" > /dev/null; }

# Best of 3 `wc -l` on the page-cached file: prints "LINES SECONDS".
wc_limit() {
    local f=$1 best="" lines t0 t1 dt
    page_cache "$f"
    python3 "$HELPER" quiet --max-wait "$BENCH_QUIET_WAIT" >&2
    for _ in 1 2 3; do
        t0=$(now); lines=$(wc -l < "$f"); t1=$(now)
        dt=$(calc "$t1 - $t0")
        if [[ -z "$best" ]] || (( $(calc "$dt < $best") )); then best=$dt; fi
    done
    echo "$lines $best"
}

threads_for() { # DATASET
    if [[ -n "${BENCH_THREADS:-}" ]]; then echo "$BENCH_THREADS"
    elif [[ "$1" == single128 ]]; then echo "1 2"
    else echo "1"; fi
}

throughput() {
    local datasets=("$@")
    ((${#datasets[@]})) || datasets=("${ALL_DATASETS[@]}")
    for ds in "${datasets[@]}"; do
        [[ " ${ALL_DATASETS[*]} " == *" $ds "* ]] || die "unknown data set '$ds' (one of: ${ALL_DATASETS[*]})"
    done
    build
    mkdir -p "$OUT/runs"
    local rows="$OUT/results.tsv" jsonl="$OUT/results.jsonl"
    : > "$rows"; : > "$jsonl"
    local limits="$OUT/limits.tsv"; : > "$limits"

    printf '%-13s %-16s %3s %9s %11s %9s %8s %7s\n' \
        "data set" variant thr "MB/s" "events/s" "CPU s/GB" "RSS MB" "vs wc"
    for ds in "${datasets[@]}"; do
        local f size lines wc_s wc_mbs gen_events
        f=$(gen_file "$ds")
        size=$(stat -c %s "$f")
        gen_events=$(sed -n 3p "$f.gen")
        read -r lines wc_s < <(wc_limit "$f")
        wc_mbs=$(calc "$size / $wc_s / 1000000")
        printf '%s\t%s\t%s\t%s\t%.1f\n' "$ds" "$size" "$lines" "$wc_s" "$wc_mbs" >> "$limits"
        printf '%-13s %-16s %3s %9.0f %11s %9s %8s %7s   (%d lines, %d bytes)\n' \
            "$ds" "wc -l" "-" "$wc_mbs" "-" "-" "-" "1.00" "$lines" "$size"
        for variant in $BENCH_SINKS; do
            local sink=$variant parse=() expect=$lines
            if [[ "$variant" == parse-* ]]; then
                [[ "$ds" != single128 ]] || continue   # nothing to parse
                sink=${variant#parse-}
                parse=(--parse "$ds")
                # Multiline joins lines: the sink sees the generator's events.
                # The last one is held until the file has not grown for
                # timeout_ms (1 s) by design, so completion is all but it.
                [[ "$ds" != multiline512 ]] || expect=$((gen_events - 1))
            fi
            for thr in $(threads_for "$ds"); do
                local name="$ds-$variant-t$thr" results=()
                for rep in $(seq "$BENCH_REPEAT"); do
                    local wd="$OUT/runs/$name" res="$OUT/runs/$name.$rep.json"
                    page_cache "$f"
                    run_child python3 "$HELPER" throughput --bin "$BIN" --file "$f" \
                        --lines "$expect" --sink "$sink" --threads "$thr" "${parse[@]}" \
                        ${BENCH_MEMORY:+--memory-limit "$BENCH_MEMORY"} \
                        --workdir "$wd" --timeout "$BENCH_TIMEOUT" --quiet-wait "$BENCH_QUIET_WAIT" > "$res" \
                        || die "run $name #$rep failed (logs in $wd)"
                    cat "$res" >> "$jsonl"
                    results+=("$res")
                done
                # Fastest run (like wc -l's best of 3); the range shows the spread.
                local pick walls wmin wmax
                walls=$(for r in "${results[@]}"; do echo "$(json_get "$r" wall_s) $r"; done | sort -g)
                # (No `| head` here: with pipefail its SIGPIPE would end the script.)
                read -r wmin pick <<< "$walls"
                local last=${walls##*$'\n'}
                wmax=${last%% *}
                local range
                range=$(printf '%.0f-%.0f' "$(calc "$size / $wmax / 1000000")" \
                    "$(calc "$size / $wmin / 1000000")")
                local wall cpu hwm other
                wall=$(json_get "$pick" wall_s); hwm=$(json_get "$pick" hwm_kb)
                # Scheduler time when the kernel exposes it, else utime+stime.
                cpu=$(json_get "$pick" cpu_exact_s)
                [[ "$cpu" != None ]] || cpu=$(json_get "$pick" cpu_s)
                # Cores used by other processes during the run (noise indicator).
                other=$(calc "$(json_get "$pick" other_cpu_s) / $wall")
                local mbs evs cpugb rss ratio
                mbs=$(calc "$size / $wall / 1000000")
                evs=$(calc "$expect / $wall")
                cpugb=$(calc "$cpu / ($size / 1000000000)")
                rss=$(calc "$hwm / 1024")
                ratio=$(calc "$mbs / $wc_mbs")
                printf '%-13s %-16s %3s %9.0f %11.0f %9.2f %8.1f %7.3f   range %s MB/s, other procs %.2f cores%s\n' \
                    "$ds" "$variant" "$thr" "$mbs" "$evs" "$cpugb" "$rss" "$ratio" "$range" "$other" \
                    "$(pf=$(json_get "$pick" parse_failed); [[ "$pf" == 0 ]] || echo ", $pf PARSE FAILURES")"
                printf '%s\t%s\t%s\t%.1f\t%.0f\t%.2f\t%.1f\t%.3f\t%.3f\t%.2f\t%.2f\t%s\n' \
                    "$ds" "$variant" "$thr" "$mbs" "$evs" "$cpugb" "$rss" "$ratio" "$wall" "$cpu" "$other" "$range" >> "$rows"
            done
        done
    done

    {
        echo "# Petrel throughput ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo "BENCH_SIZE=$BENCH_SIZE; each row is the fastest of BENCH_REPEAT=$BENCH_REPEAT runs (range over all runs in the last column). MB = 10^6 bytes."
        echo
        machine_facts | sed 's/^/- /'
        echo
        echo "Raw limit (\`wc -l\`, page-cached, best of 3):"
        echo
        echo "| data set | bytes | lines | wc -l s | wc -l MB/s |"
        echo "|---|---:|---:|---:|---:|"
        awk -F'\t' '{printf "| %s | %d | %d | %.3f | %.0f |\n", $1, $2, $3, $4, $5}' "$limits"
        echo
        echo "| data set | variant | threads | MB/s | events/s | CPU s per GB | peak RSS MB | ratio to wc -l | wall s | CPU s | other procs (cores) | MB/s range |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        awk -F'\t' '{printf "| %s | %s | %s | %.0f | %.0f | %.2f | %.1f | %.3f | %.3f | %.2f | %.2f | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12}' "$rows"
        echo
        echo "CPU s = petrel's on-CPU time from start to completion (se.sum_exec_runtime of its threads; utime+stime where unavailable); CPU s per GB = that / file GB. \"threads\" is --threads, the processing workers; the input thread and the sink runtime come in addition, so one worker can use more than one core."
        echo
        echo "Variants: blackhole / text / ndjson = raw lines (processors: []) into the blackhole sink or the file sink on /dev/null; parse-* = the data set's parser (regex512, nginx283: parse_regex; json512: parse_json; delim512: parse_delimiter; multiline512: multiline start_pattern in the source, events/s counts 23-line events) into the blackhole or the ndjson file sink."
        echo
        echo "\"other procs\" = CPU used by other processes on the machine during the run, in cores (wall-normalised); above ~0.2 the run competed for the CPU."
    } > "$OUT/results.md"
    echo "wrote $OUT/results.md" >&2
}

rate() {
    build
    mkdir -p "$OUT/runs"
    local jsonl="$OUT/rate.jsonl"; : > "$jsonl"
    printf '%-8s %-6s %6s %8s %8s %8s %10s %10s %10s %9s %s\n' \
        rate writer secs "CPU %" "ticks %" "idle %" "RSS avg" "RSS peak" "VmHWM" "drain s" "all lines arrived"
    for w in $RATE_WRITERS; do
    for r in $RATE_RATES; do
        local wd="$OUT/runs/rate-$w-$r" res="$OUT/runs/rate-$w-$r.json"
        run_child python3 "$HELPER" rate --bin "$BIN" --rate "$r" --duration "$RATE_DURATION" --writer "$w" \
            --format single128 --sink text --threads 1 --workdir "$wd" \
            --quiet-wait "$BENCH_QUIET_WAIT" > "$res" \
            || die "rate run $r failed (logs in $wd)"
        cat "$res" >> "$jsonl"
        python3 - "$res" "$r" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ok = "yes" if d["arrived"] else f"NO ({d['events']} of {d['lines']})"
ex = d.get("cpu_exact_pct")
print(f"{sys.argv[2]:<8} {d['writer']:<6} {d['duration']:>6} {ex if ex is not None else float('nan'):>8.2f} {d['cpu_pct']:>8.2f} "
      f"{d['idle_exact_pct'] if d.get('idle_exact_pct') is not None else d['idle_cpu_pct']:>8.2f} "
      f"{d['rss_avg_kb']/1024:>8.1f}MB {d['rss_max_kb']/1024:>8.1f}MB {d['hwm_kb']/1024:>8.1f}MB "
      f"{d['drain_s']:>9.2f} {ok}  ({d['lines']} lines)")
EOF
    done
    done
    {
        echo "# Petrel at a fixed rate ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo "single128, file sink (text) on /dev/null, --threads 1, RATE_DURATION=$RATE_DURATION s."
        echo "CPU % = petrel's on-CPU time (sum of se.sum_exec_runtime of its threads, /proc/PID/task/*/sched) / wall time from generator start until the last line left the sink, in % of one core. \"ticks\" is the same from utime+stime, which this kernel (CONFIG_TICK_CPU_ACCOUNTING) samples at timer ticks: coarse, and can be biased for a process that wakes every 10 ms in short bursts. Idle = the same, over 5 s of tailing a file that does not grow."
        echo "RSS sampled every 1 s (VmRSS); VmHWM is the peak over the whole process life."
        echo "Writers: gen = \`petrel gen --rate\` (appends one block per 10 ms slice); lines = one write() per 128-byte line, paced every 1 ms, like an application that logs line by line without buffering (bench/petrel_bench.py write-lines)."
        echo
        machine_facts | sed 's/^/- /'
        echo
        echo "| rate | writer | CPU % of one core | CPU % (ticks) | max 1 s CPU % (ticks) | idle CPU % | RSS avg MB | RSS peak MB (1 s samples) | VmHWM MB | lines | all arrived | drain s |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
        python3 - "$jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    rate = d['rate'][:-2] + " MB/s" if d['rate'].endswith('MB') else d['rate'] + " B/s"
    ex = d.get("cpu_exact_pct")
    idle = d.get("idle_exact_pct")
    print(f"| {rate} | {d['writer']} | {ex if ex is not None else float('nan'):.2f} | {d['cpu_pct']:.2f} | {d['cpu_pct_max_1s']:.1f} | "
          f"{idle if idle is not None else d['idle_cpu_pct']:.2f} | "
          f"{d['rss_avg_kb']/1024:.1f} | {d['rss_max_kb']/1024:.1f} | {d['hwm_kb']/1024:.1f} | "
          f"{d['lines']} | {'yes' if d['arrived'] else 'NO'} | {d['drain_s']:.2f} |")
EOF
    } > "$OUT/rate.md"
    echo "wrote $OUT/rate.md" >&2
}

# Charts of everything in $OUT (bench/plot.py) into bench/plots/, next to
# BENCHMARKS.md; matplotlib comes from a venv under target/ (pip).
plots() {
    [[ "${BENCH_PLOT:-1}" != 0 ]] || return 0
    local venv="${CARGO_TARGET_DIR:-$ROOT/target}/plot-venv"
    if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
        python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib \
            || { echo "bench/run.sh: matplotlib could not be installed; no charts" >&2; return 0; }
    fi
    "$venv/bin/python" "$ROOT/bench/plot.py" --results "$OUT" --out "$ROOT/bench/plots"
}

command -v python3 >/dev/null || die "python3 is required"
mkdir -p "$OUT"
if [[ "${1:-}" == rate ]]; then
    shift
    (($# == 0)) || die "rate mode takes no arguments"
    rate
else
    throughput "$@"
fi
plots
