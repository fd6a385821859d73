#!/usr/bin/env bash
# The headline of BENCHMARKS.md: Petrel beside Fluent Bit, the OpenTelemetry
# Collector and Vector (those built on this machine) and the raw limit of
# the host, all measured in one run, on the same generated input, with
# their runs interleaved; then the report, the charts and the headline
# section of BENCHMARKS.md (between <!-- headline:begin --> and
# <!-- headline:end -->) are written again. One command regenerates it:
#
#   bench/headline.sh
#   HEADLINE_SIZE=64MiB HEADLINE_REPEAT=1 bench/headline.sh   # a smoke run (~25 min)
#
# Why: a figure means little alone on a shared 2-core machine; beside a
# peer and the raw limit measured in the same minutes it survives the noise.
#
# Rows (HEADLINE_ROWS, default all, in this order):
#   single128 regex512 json512 delim512 multiline512
#             a page-cached file of HEADLINE_SIZE → a file on tmpfs; each
#             agent with its own parser (bench/lib/agents.py), beside `wc -l`
#             and `cat > /dev/null`: MB/s, CPU s per GB, peak RSS
#   rate      HEADLINE_RATE MB/s of single128 (petrel gen --rate) for
#             HEADLINE_RATE_SECONDS: CPU % of one core, average RSS
#   pipelines HEADLINE_PIPELINES inputs (one pipeline, source or receiver
#             each; 4 written at 3 MB/s with bench/kubernetes.py's writer),
#             for the agents in HEADLINE_PIPELINE_AGENTS
#   syslog    bench/syslog.sh: loggen over TCP (1 connection, RFC 5424,
#             HEADLINE_SYSLOG_SIZE-byte messages, HEADLINE_SYSLOG_SECONDS)
#             into Petrel, rsyslog and syslog-ng (those installed:
#             scripts/install-syslog-tools.sh), HEADLINE_REPEAT times
#   sinks     bench/sinks.sh with BENCH_STORE=victorialogs: json512 +
#             parse_json into the elasticsearch, loki and opentelemetry
#             sinks of Petrel and its file sink (Petrel only)
# How a run is measured: the header of bench/headline.py.
#
# The agents:
#   petrel      `cargo build --release -p petrel` (bench/lib/throughput.sh),
#               or BENCH_NO_BUILD=1 (target/release/petrel as it is), or
#               BENCH_BIN=PATH (a given binary; PETREL_COMMIT=... says what
#               it was built from)
#   fluent-bit  FLUENT_BIT_BIN, else built by scripts/peers/fluent-bit.sh when
#               FLUENT_BIT_SRC is set, else the one in the test cache
#               ($PETREL_TEST_CACHE/fluent-bit-*), else left out (said so)
#   otelcol     OTELCOL_BIN, else scripts/peers/otelcol.sh (Go; cached): the
#               filelog receiver and the file exporter
#   vector      VECTOR_BIN, else built by scripts/peers/vector.sh when
#               VECTOR_SRC (and its VECTOR_*_GIT) are set, else the test
#               cache's, else left out
#   HEADLINE_AGENTS picks among them (default: petrel fluent-bit otelcol vector).
#
# Environment (defaults): HEADLINE_SIZE (1GiB), HEADLINE_REPEAT (3),
# HEADLINE_ROWS (all), HEADLINE_AGENTS, HEADLINE_RATE (10, MB/s),
# HEADLINE_RATE_SECONDS (30), HEADLINE_PIPELINES (1000),
# HEADLINE_PIPELINE_RATE (3), HEADLINE_PIPELINE_SECONDS (30),
# HEADLINE_PIPELINE_AGENTS (all four), HEADLINE_SYSLOG_SIZE (512),
# HEADLINE_SYSLOG_SECONDS (10), HEADLINE_SINKS_SIZE (256MiB; a smoke run's size),
# HEADLINE_QUIET_WAIT (30: before each run, wait up to that many seconds
# for the machine to be idle; 0 = don't), HEADLINE_TIMEOUT (1200 s per run:
# Vector's file sink takes minutes for 1 GiB of single128),
# HEADLINE_SMOKE (1 when HEADLINE_SIZE is under 1GiB: the tables say it is
# a smoke run), HEADLINE_WRITE_BENCHMARKS (1: rewrite BENCHMARKS.md's
# section; 0: leave it, and write only bench/out/, bench/results/ and the
# charts: a partial run, e.g. HEADLINE_ROWS=single128, replaces those).
#
# Writes: bench/out/headline.json (every median, the machine, the
# versions), bench/results/headline-<UTC date>.md (the tables and every
# figure with its range), bench/plots/headline-*.png (bench/plot.py;
# matplotlib from a venv under target/, as bench/run.sh does), and the
# section of BENCHMARKS.md. Work files: bench/out/headline/ (the plan,
# every run's JSON, the configs and logs of the file rows' last runs) and
# a tmpfs directory for the outputs, removed at exit. Needs bash, python3, git, wc, cat, awk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HEADLINE_SIZE="${HEADLINE_SIZE:-1GiB}"
HEADLINE_REPEAT="${HEADLINE_REPEAT:-3}"
# The knobs of bench/lib/throughput.sh (data generation, the build, the
# tmpfs output directory, the traps).
BENCH_SIZE="$HEADLINE_SIZE"
BENCH_REPEAT="$HEADLINE_REPEAT"
BENCH_QUIET_WAIT="${HEADLINE_QUIET_WAIT:-30}"
# shellcheck source=bench/lib/throughput.sh
source "$ROOT/bench/lib/throughput.sh"

HEADLINE_ROWS="${HEADLINE_ROWS:-single128 regex512 json512 delim512 multiline512 rate pipelines syslog sinks}"
HEADLINE_AGENTS="${HEADLINE_AGENTS:-petrel fluent-bit otelcol vector}"
HEADLINE_RATE="${HEADLINE_RATE:-10}"
HEADLINE_RATE_SECONDS="${HEADLINE_RATE_SECONDS:-30}"
HEADLINE_PIPELINES="${HEADLINE_PIPELINES:-1000}"
HEADLINE_PIPELINE_RATE="${HEADLINE_PIPELINE_RATE:-3}"
HEADLINE_PIPELINE_SECONDS="${HEADLINE_PIPELINE_SECONDS:-30}"
HEADLINE_PIPELINE_AGENTS="${HEADLINE_PIPELINE_AGENTS:-petrel fluent-bit otelcol vector}"
HEADLINE_SYSLOG_SIZE="${HEADLINE_SYSLOG_SIZE:-512}"
HEADLINE_SYSLOG_SECONDS="${HEADLINE_SYSLOG_SECONDS:-10}"
HEADLINE_TIMEOUT="${HEADLINE_TIMEOUT:-1200}"
HEADLINE_WRITE_BENCHMARKS="${HEADLINE_WRITE_BENCHMARKS:-1}"
if [[ -z "${HEADLINE_SMOKE:-}" ]]; then
    HEADLINE_SMOKE=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import petrel_bench as p; print(int(p.parse_size(sys.argv[2]) < 2**30))' \
        "$ROOT/bench" "$HEADLINE_SIZE")
fi
# A smoke run sends its own size to the stores too.
if [[ "$HEADLINE_SMOKE" == 1 ]]; then
    HEADLINE_SINKS_SIZE="${HEADLINE_SINKS_SIZE:-$HEADLINE_SIZE}"
else
    HEADLINE_SINKS_SIZE="${HEADLINE_SINKS_SIZE:-256MiB}"
fi
. "$ROOT/scripts/lib/cache.sh"

WORK="$OUT/headline"
rm -rf "$WORK"
mkdir -p "$WORK" "$SINK_DIR"
note() { echo "== $*" >&2; }
has_row() { [[ " $HEADLINE_ROWS " == *" $1 "* ]]; }
has_agent() { [[ " $HEADLINE_AGENTS " == *" $1 "* ]]; }

# --- the agents ----------------------------------------------------------------

declare -A AGENT_BIN=() AGENT_VERSION=() SKIPPED=()
build
AGENT_BIN[petrel]="$BIN"

# The newest complete entry NAME-<version>/<recipe>/ of the test cache
# (scripts/lib/cache.sh's layout) that holds FILE. Only versions after
# NAME- (v1.2.3 or 1.2.3): fluent-bit-kubernetes-* is another build.
cached() { # NAME FILE
    local d best=""
    for d in "$PETREL_TEST_CACHE/$1"-[v0-9]*/*/; do
        [[ -x "$d$2" && -e "$d.complete" ]] && best="$d$2"
    done
    [[ -n "$best" ]] && echo "$best"
}

find_fluent_bit() {
    if [[ -n "${FLUENT_BIT_BIN:-}" ]]; then echo "$FLUENT_BIT_BIN"; return; fi
    if [[ -n "${FLUENT_BIT_SRC:-}" ]]; then
        note "scripts/peers/fluent-bit.sh (FLUENT_BIT_SRC=$FLUENT_BIT_SRC)"
        "$ROOT/scripts/peers/fluent-bit.sh" | tail -1
        return
    fi
    cached fluent-bit fluent-bit
}

find_vector() {
    if [[ -n "${VECTOR_BIN:-}" ]]; then echo "$VECTOR_BIN"; return; fi
    if [[ -n "${VECTOR_SRC:-}" ]]; then
        note "scripts/peers/vector.sh (VECTOR_SRC=$VECTOR_SRC; ~26 min on 2 cores the first time)"
        "$ROOT/scripts/peers/vector.sh" | tail -1
        return
    fi
    cached vector vector
}

find_otelcol() {
    if [[ -n "${OTELCOL_BIN:-}" ]]; then echo "$OTELCOL_BIN"; return; fi
    command -v go >/dev/null || return 0
    note "scripts/peers/otelcol.sh (Go; cached after the first build)"
    "$ROOT/scripts/peers/otelcol.sh" 2>"$WORK/otelcol-build.log" | tail -1
}

for a in fluent-bit otelcol vector; do
    has_agent "$a" || continue
    bin=""
    case "$a" in
    fluent-bit)
        bin=$(find_fluent_bit) || true
        why="not built here: FLUENT_BIT_SRC=<fluent-bit source> scripts/peers/fluent-bit.sh, or FLUENT_BIT_BIN" ;;
    otelcol)
        bin=$(find_otelcol) || true
        why="not built here: scripts/peers/otelcol.sh (needs go; see $WORK/otelcol-build.log), or OTELCOL_BIN" ;;
    vector)
        bin=$(find_vector) || true
        why="not built here: VECTOR_SRC=... scripts/peers/vector.sh (see its header), or VECTOR_BIN" ;;
    esac
    if [[ -z "$bin" || ! -x "$bin" ]]; then
        SKIPPED[$a]="$why"
        note "$a left out: $why"
        continue
    fi
    if [[ "$a" == otelcol ]] && ! "$bin" components 2>/dev/null | grep -q filelog; then
        SKIPPED[$a]="$bin has no filelog receiver (scripts/peers/otelcol.sh builds one that has)"
        note "$a left out: ${SKIPPED[$a]}"
        continue
    fi
    AGENT_BIN[$a]="$bin"
    note "$a: $bin"
done
for a in fluent-bit otelcol vector; do
    [[ -z "${AGENT_BIN[$a]:-}" ]] && continue
    if [[ "$a" == otelcol ]]; then
        # An ocb build has no version of its own: its components' modules.
        AGENT_VERSION[$a]="ocb build: $({ "${AGENT_BIN[$a]}" components 2>&1 || true; } |
            sed -n 's|^ *module: .*/\([a-z]*\) \(v[0-9.]*\)$|\1 \2|p' | grep -E '(receiver|exporter) ' | paste -sd, | sed 's/,/, /g')"
    else
        AGENT_VERSION[$a]=$({ "${AGENT_BIN[$a]}" --version 2>&1 || true; } | sed -n '1s/^ *//p')
    fi
done

# What Petrel was built from: the commit, -dirty when the checkout differs.
if [[ -n "${BENCH_BIN:-}" ]]; then
    PETREL_COMMIT="${PETREL_COMMIT:-not known (BENCH_BIN=$BENCH_BIN)}"
else
    PETREL_COMMIT="$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && [[ -z "$(git status --porcelain --untracked-files=no)" ]] || echo -dirty)"
fi

# --- the data ------------------------------------------------------------------

DATA_TSV="$WORK/data.tsv"
: > "$DATA_TSV"
for ds in single128 regex512 json512 delim512 multiline512; do
    has_row "$ds" || continue
    f=$(gen_file "$ds")
    printf '%s\t%s\t%s\t%s\n' "$ds" "$f" "$(stat -c %s "$f")" "$(sed -n 3p "$f.gen")" >> "$DATA_TSV"
done

# --- the plan, then the file and rate rows ---------------------------------------

PLAN="$WORK/plan.json"
COMMAND=""
for v in HEADLINE_SIZE HEADLINE_REPEAT HEADLINE_ROWS HEADLINE_AGENTS HEADLINE_RATE HEADLINE_RATE_SECONDS \
    HEADLINE_PIPELINES HEADLINE_PIPELINE_RATE HEADLINE_PIPELINE_SECONDS HEADLINE_PIPELINE_AGENTS \
    HEADLINE_SYSLOG_SIZE HEADLINE_SYSLOG_SECONDS HEADLINE_SINKS_SIZE HEADLINE_QUIET_WAIT \
    BENCH_NO_BUILD BENCH_BIN PETREL_COMMIT; do
    # Only the knobs given on the command line.
    if [[ -n "${!v+x}" ]] && env | grep -q "^$v="; then
        val=${!v}
        [[ "$val" =~ ^[A-Za-z0-9._/-]+$ ]] || val="\"$val\""
        COMMAND="$COMMAND$v=$val "
    fi
done
COMMAND="${COMMAND}bench/headline.sh"
# The venv with matplotlib (bench/run.sh's, under target/).
PLOT_PY=""
VENV="${CARGO_TARGET_DIR:-$ROOT/target}/plot-venv"
if "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    PLOT_PY="$VENV/bin/python"
elif python3 -m venv "$VENV" >/dev/null 2>&1 && "$VENV/bin/pip" install -q matplotlib >/dev/null 2>&1; then
    PLOT_PY="$VENV/bin/python"
else
    note "matplotlib could not be installed into $VENV: no charts"
fi

write_plan() {
    local agents_json versions_json skipped_json
    agents_json=$(for a in petrel fluent-bit otelcol vector; do
        [[ -n "${AGENT_BIN[$a]:-}" ]] && printf '%s\t%s\n' "$a" "${AGENT_BIN[$a]}"; done || true)
    versions_json=$(for a in fluent-bit otelcol vector; do
        [[ -n "${AGENT_VERSION[$a]:-}" ]] && printf '%s\t%s\n' "$a" "${AGENT_VERSION[$a]}"; done || true)
    skipped_json=$(for a in "${!SKIPPED[@]}"; do printf '%s\t%s\n' "$a" "${SKIPPED[$a]}"; done)
    AGENTS_TSV="$agents_json" VERSIONS_TSV="$versions_json" SKIPPED_TSV="$skipped_json" \
    FACTS="$(machine_facts)" python3 - "$PLAN" <<'PY'
import json, os, sys, datetime, subprocess
def tsv(name):
    return dict(l.split("\t", 1) for l in os.environ.get(name, "").splitlines() if "\t" in l)
e = os.environ
data = {}
with open(os.path.join(e["WORK"], "data.tsv")) as f:
    for l in f:
        ds, path, size, events = l.rstrip("\n").split("\t")
        data[ds] = {"file": path, "bytes": int(size), "events": int(events)}
facts = e["FACTS"].splitlines()
def fact(k):
    return next((l.split(":", 1)[1].strip() for l in facts if l.startswith(k + ":")), "?")
order = ["petrel", "fluent-bit", "otelcol", "vector"]
ag = tsv("AGENTS_TSV")
plan = {
    "work": e["WORK"], "sink_dir": e["SINK_DIR"], "petrel": e["BIN"],
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%MZ"),
    "command": e["COMMAND"],
    "machine": {"nproc": fact("nproc"), "cpu": fact("cpu"), "kernel": fact("kernel"),
                "memory": fact("memory"), "facts": facts},
    "petrel_info": {"version": subprocess.run([e["BIN"], "--version"], capture_output=True,
                                              text=True).stdout.strip(),
                    "commit": e["PETREL_COMMIT"]},
    "agents": {a: ag[a] for a in order if a in ag},
    "versions": tsv("VERSIONS_TSV"), "skipped": tsv("SKIPPED_TSV"),
    "versions_extra": {},
    "rows": e["HEADLINE_ROWS"].split(), "repeat": int(e["HEADLINE_REPEAT"]),
    "data": data, "quiet_wait": float(e["BENCH_QUIET_WAIT"]),
    "timeout": float(e["HEADLINE_TIMEOUT"]), "rate_drain": 120.0,
    "rate": {"mb_s": float(e["HEADLINE_RATE"]), "seconds": int(e["HEADLINE_RATE_SECONDS"])},
    "pipelines": {"count": int(e["HEADLINE_PIPELINES"]), "active": 4,
                  "mb_s": float(e["HEADLINE_PIPELINE_RATE"]),
                  "seconds": int(e["HEADLINE_PIPELINE_SECONDS"]),
                  "agents": e["HEADLINE_PIPELINE_AGENTS"].split()},
    "syslog": {"size": int(e["HEADLINE_SYSLOG_SIZE"]), "seconds": int(e["HEADLINE_SYSLOG_SECONDS"])},
    "knobs": {"size": e["HEADLINE_SIZE"], "repeat": int(e["HEADLINE_REPEAT"]),
              "rate_seconds": int(e["HEADLINE_RATE_SECONDS"]),
              "smoke": e["HEADLINE_SMOKE"] == "1",
              "write_benchmarks": e["HEADLINE_WRITE_BENCHMARKS"] == "1"},
    "plot_python": e.get("PLOT_PY") or None,
}
with open(sys.argv[1], "w") as f:
    json.dump(plan, f, indent=1)
PY
}
export WORK SINK_DIR BIN COMMAND PETREL_COMMIT HEADLINE_ROWS HEADLINE_REPEAT BENCH_QUIET_WAIT \
    HEADLINE_TIMEOUT HEADLINE_RATE HEADLINE_RATE_SECONDS HEADLINE_PIPELINES HEADLINE_PIPELINE_RATE \
    HEADLINE_PIPELINE_SECONDS HEADLINE_PIPELINE_AGENTS HEADLINE_SYSLOG_SIZE HEADLINE_SYSLOG_SECONDS \
    HEADLINE_SIZE HEADLINE_SMOKE HEADLINE_WRITE_BENCHMARKS PLOT_PY
write_plan
note "plan: $PLAN"
run_child python3 "$ROOT/bench/headline.py" measure "$PLAN"

# --- syslog: bench/syslog.sh, HEADLINE_REPEAT times ---------------------------------

if has_row syslog; then
    receivers="petrel"
    if [[ -x /usr/sbin/rsyslogd || -x "$ROOT/.cache/rsyslog/usr/sbin/rsyslogd" ]]; then
        receivers="$receivers rsyslog"
    else
        note "rsyslog not installed (scripts/install-syslog-tools.sh): left out of the syslog row"
    fi
    [[ -x /usr/sbin/syslog-ng ]] && receivers="$receivers syslog-ng" \
        || note "syslog-ng not installed (scripts/install-syslog-tools.sh): left out of the syslog row"
    if command -v loggen >/dev/null || compgen -G '/usr/lib/syslog-ng/*/loggen' >/dev/null; then
        for rep in $(seq "$HEADLINE_REPEAT"); do
            note "bench/syslog.sh, run $rep of $HEADLINE_REPEAT ($receivers)"
            BENCH_CASES=tcp BENCH_SIZES="$HEADLINE_SYSLOG_SIZE" BENCH_CONNECTIONS=1 \
                BENCH_RECEIVERS="$receivers" BENCH_SECONDS="$HEADLINE_SYSLOG_SECONDS" \
                BENCH_QUIET_WAIT="$BENCH_QUIET_WAIT" PETREL_BIN="$BIN" \
                BENCH_TSV="$WORK/syslog-$rep.tsv" BENCH_RESULT="$WORK/syslog-$rep.md" \
                run_child "$ROOT/bench/syslog.sh" > "$WORK/syslog-$rep.out" 2>&1 \
                || { note "bench/syslog.sh failed: $(tail -3 "$WORK/syslog-$rep.out")"; break; }
        done
        for v in rsyslog syslog-ng; do
            [[ " $receivers " == *" $v "* ]] || continue
            # "- rsyslog: PATH, rsyslogd 8.x ...", "- syslog-ng: syslog-ng 3 (3.38.1)"
            grep -m1 "^- $v: " "$WORK/syslog-1.md" 2>/dev/null |
                sed -e "s/^- $v: //" -e 's/^[^ ,]*, //' -e "s/^/$v\t/" >> "$WORK/versions-extra.tsv" || true
        done
    else
        note "loggen not installed (scripts/install-syslog-tools.sh): no syslog row"
    fi
fi

# --- sinks: bench/sinks.sh into VictoriaLogs -------------------------------------------

if has_row sinks; then
    note "bench/sinks.sh into VictoriaLogs ($HEADLINE_SINKS_SIZE, $HEADLINE_REPEAT runs per sink)"
    BENCH_STORE=victorialogs BENCH_SIZE="$HEADLINE_SINKS_SIZE" BENCH_RUNS="$HEADLINE_REPEAT" \
        BENCH_QUIET_WAIT="$BENCH_QUIET_WAIT" \
        BENCH_SINKS="file-ndjson elasticsearch loki opentelemetry" PETREL_BIN="$BIN" \
        BENCH_JSONL="$WORK/sinks.jsonl" run_child "$ROOT/bench/sinks.sh" > "$WORK/sinks.out" 2>&1 \
        || note "bench/sinks.sh failed: $(tail -3 "$WORK/sinks.out")"
    # go install leaves its -version empty: the version scripts/victorialogs.sh builds.
    printf 'VictoriaLogs\t%s\n' "$(sed -n 's/^cache_go_install "$root" victorialogs \([^ ]*\) .*/\1/p' "$ROOT/scripts/victorialogs.sh")" >> "$WORK/versions-extra.tsv"
fi

# --- the report ----------------------------------------------------------------------

python3 - "$PLAN" "$WORK/versions-extra.tsv" <<'PY'
import json, os, sys
plan = json.load(open(sys.argv[1]))
if os.path.exists(sys.argv[2]):
    for l in open(sys.argv[2]):
        if "\t" in l:
            k, v = l.rstrip("\n").split("\t", 1)
            plan["versions_extra"][k] = v
json.dump(plan, open(sys.argv[1], "w"), indent=1)
PY
run_child python3 "$ROOT/bench/headline.py" report "$PLAN"
