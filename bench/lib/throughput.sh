# shellcheck shell=bash
# Shared by bench/run.sh and bench/compare.sh (sourced, not run): the knobs,
# the data sets, building and copying the binary, and one throughput run
# (run_once), so that both scripts measure a row the same way. See the
# header of bench/run.sh for the environment variables.
#
# The sourcing script sets ROOT (the repository) before sourcing; this file
# sets OUT, BIN, HELPER, the knobs' defaults and the traps.

OUT="$ROOT/bench/out"
# BENCH_PROFILE=ci measures the test command's build (release without LTO,
# minutes to build instead of twenty); both sides of bench/compare.sh then
# use it, so that the ratio compares code, not profiles.
BENCH_PROFILE="${BENCH_PROFILE:-release}"
# BENCH_BIN: a given binary, run as it is (nothing is built).
BUILT="${BENCH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/$BENCH_PROFILE/petrel}"
# Benchmarks run a private copy: others may rebuild target/ meanwhile.
BIN="$OUT/petrel"
HELPER="$ROOT/bench/petrel_bench.py"
ALL_DATASETS=(single128 regex512 json512 delim512 multiline512 nginx283)
SCRIPT_NAME="bench/$(basename "$0")"

BENCH_SIZE="${BENCH_SIZE:-1GiB}"
BENCH_SINKS="${BENCH_SINKS:-blackhole text ndjson parse-blackhole parse-ndjson}"
BENCH_REPEAT="${BENCH_REPEAT:-3}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-600}"
BENCH_SEED="${BENCH_SEED:-1}"
BENCH_QUIET_WAIT="${BENCH_QUIET_WAIT:-30}"
BENCH_DEVNULL="${BENCH_DEVNULL:-0}"
# The file sink's output directory: tmpfs, so that the write is paid (issue
# 22: "into a real file on tmpfs — not /dev/null") but no disk is measured.
# Only a directory this script made is removed at exit; each output file is
# deleted after its run either way.
if [[ -n "${BENCH_OUT_DIR:-}" ]]; then
    SINK_DIR="$BENCH_OUT_DIR"; SINK_DIR_OURS=0
else
    SINK_DIR="/dev/shm/petrel-bench-$$"; SINK_DIR_OURS=1
fi

export LC_ALL=C
export PYTHONDONTWRITEBYTECODE=1

CHILD=""
cleanup() {
    local rc=$?
    if [[ -n "$CHILD" ]] && kill -0 "$CHILD" 2>/dev/null; then
        # The helper kills the petrel it started (and deletes the sink's
        # output) when it gets SIGTERM.
        kill -TERM "$CHILD" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$CHILD" 2>/dev/null || true
    fi
    if ((SINK_DIR_OURS)) && [[ -d "$SINK_DIR" ]]; then rm -rf -- "$SINK_DIR"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "$SCRIPT_NAME: $*" >&2; exit 1; }

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

# The cargo command that builds the agent in BENCH_PROFILE. The ci profile
# builds the workspace as the test command does (a `-p petrel` build would
# unify other features and rebuild the dependencies).
build_command() {
    if [[ "$BENCH_PROFILE" == release ]]; then
        echo "cargo build --release -p petrel"
    else
        echo "cargo build --profile $BENCH_PROFILE --workspace --locked"
    fi
}

# Builds the current tree (unless BENCH_NO_BUILD=1) and copies its binary
# to $BIN; BUILT_FROM says what it was built from.
build() {
    if [[ "${BENCH_NO_BUILD:-0}" != 1 && -z "${BENCH_BIN:-}" ]]; then
        echo "== $(build_command)" >&2
        (cd "$ROOT" && $(build_command)) || die "$BENCH_PROFILE build failed"
    fi
    [[ -x "$BUILT" ]] || die "$BUILT not found; run $(build_command)"
    cp "$BUILT" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
    # What the copied binary was built from (others may commit meanwhile).
    if [[ -n "${BENCH_BIN:-}" ]]; then
        BUILT_FROM="${PETREL_COMMIT:-not known (BENCH_BIN=$BENCH_BIN)}"
    else
        BUILT_FROM="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo 'no git')$(cd "$ROOT" && git diff --quiet HEAD -- crates 2>/dev/null || echo ' + uncommitted changes in crates/')"
    fi
    echo "== using $BIN (sha256 $(sha256sum "$BIN" | cut -c1-12))" >&2
}

machine_facts() {
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "kernel: $(uname -r)"
    echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "petrel: $("$BIN" --version 2>/dev/null || echo '?'), binary sha256 $(sha256sum "$BIN" | cut -c1-12), working tree at build time: ${BUILT_FROM:-?}"
}

sink_where() {
    if [[ "$BENCH_DEVNULL" == 1 ]]; then echo "/dev/null (BENCH_DEVNULL=1)"
    else
        # The directory may not exist yet: its parent tells the file system.
        local fs
        fs=$(stat -f -c %T "$SINK_DIR" 2>/dev/null || stat -f -c %T "$(dirname "$SINK_DIR")" 2>/dev/null || echo '?')
        echo "a file in $SINK_DIR ($fs), deleted after each run"
    fi
}

check_datasets() { # DATASET...
    for ds in "$@"; do
        [[ " ${ALL_DATASETS[*]} " == *" $ds "* ]] || die "unknown data set '$ds' (one of: ${ALL_DATASETS[*]})"
    done
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

# What a variant means for a data set: sets V_SINK, V_PARSE (helper
# arguments) and V_EXPECT (events the sink must send). Returns 1 when the
# variant does not apply (parse-* on single128: nothing to parse).
variant_setup() { # DATASET VARIANT LINES GEN_EVENTS
    local ds=$1 variant=$2
    V_SINK=$variant V_PARSE=() V_EXPECT=$3
    if [[ "$variant" == parse-* ]]; then
        [[ "$ds" != single128 ]] || return 1
        V_SINK=${variant#parse-}
        V_PARSE=(--parse "$ds")
        # Multiline joins lines: the sink sees the generator's events.
        # The last one is held until the file has not grown for
        # timeout_ms (1 s) by design, so completion is all but it.
        [[ "$ds" != multiline512 ]] || V_EXPECT=$(($4 - 1))
    fi
    return 0
}

# One throughput run of PETREL_BIN on FILE with the V_* of variant_setup;
# the JSON result goes to $OUT/runs/NAME.REP.json (its path in RUN_RESULT,
# not printed: a command substitution would run it outside the traps), the
# agent's log and pipeline to $OUT/runs/NAME/. Extra KEY=VALUE arguments
# are copied into the result.
run_once() { # PETREL_BIN FILE THREADS NAME REP [KEY=VALUE...]
    local bin=$1 f=$2 thr=$3 name=$4 rep=$5
    shift 5
    local wd="$OUT/runs/$name" res="$OUT/runs/$name.$rep.json" tags=() sinkdir=()
    for t in "$@"; do tags+=(--tag "$t"); done
    [[ "$BENCH_DEVNULL" == 1 ]] || sinkdir=(--sink-dir "$SINK_DIR")
    mkdir -p "$OUT/runs"
    page_cache "$f"
    run_child python3 "$HELPER" throughput --bin "$bin" --file "$f" \
        --lines "$V_EXPECT" --sink "$V_SINK" --threads "$thr" "${V_PARSE[@]}" "${sinkdir[@]}" \
        ${BENCH_MEMORY:+--memory-limit "$BENCH_MEMORY"} "${tags[@]}" \
        --workdir "$wd" --timeout "$BENCH_TIMEOUT" --quiet-wait "$BENCH_QUIET_WAIT" > "$res" \
        || die "run $name #$rep failed (logs in $wd)"
    # shellcheck disable=SC2034 # read by the caller
    RUN_RESULT=$res
}
