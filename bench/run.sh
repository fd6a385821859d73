#!/usr/bin/env bash
# Petrel benchmarks. See BENCHMARKS.md for results and how to read them.
#
#   bench/run.sh [DATASET...]      throughput mode (default: all data sets)
#   bench/run.sh rate              rate mode: 1 MB/s and 10 MB/s of single128
#                                  (file sink on /dev/null: CPU at a rate, not the write)
#
# Environment:
#   BENCH_SIZE      size of each generated data set (default 1GiB; e.g. 256MiB)
#   BENCH_SINKS     variants (default "blackhole text ndjson parse-blackhole parse-ndjson"):
#                   blackhole, text, ndjson: raw lines (processors: []) into the
#                   blackhole sink, or the file sink (text or ndjson encoding)
#                   writing a real file on tmpfs (see BENCH_OUT_DIR);
#                   parse-blackhole, parse-ndjson: the parsing each data set is
#                   made for (regex512: parse_regex, json512: parse_json, delim512:
#                   parse_delimiter, multiline512: multiline start pattern,
#                   nginx283: parse_regex; none for single128, which is skipped).
#   BENCH_THREADS   --threads values for every data set (default: 1, plus 2 for single128)
#   BENCH_REPEAT    runs per configuration; the fastest is reported, with the
#                   median MB/s and the range over all runs (default 3)
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
#   BENCH_OUT_DIR   where the file sink (text, ndjson, parse-ndjson) writes
#                   (default: /dev/shm/petrel-bench-<pid>/, tmpfs, removed at
#                   exit). The output is deleted after each run, and checked
#                   first: non-empty, a line per event at least, and for
#                   `text` of raw lines the input's size exactly, so that a
#                   broken sink cannot look fast.
#   BENCH_DEVNULL=1 the file sink writes /dev/null instead (the tables of
#                   BENCHMARKS.md before issue 22); not the default
#   BENCH_NO_BUILD=1  skip `cargo build --release -p petrel`
#   BENCH_BIN=PATH  run this petrel binary as it is (nothing is built;
#                   PETREL_COMMIT=... names what it was built from)
#   BENCH_PROFILE=ci  build and run target/ci/petrel (the test command's
#                   profile: release without LTO) instead of target/release
#   BENCH_PLOT=0    no charts (by default bench/plot.py redraws bench/plots/*.png
#                   from everything in bench/out/ after each run)
#
# Units: MB = 10^6 bytes, GB = 10^9 bytes. Everything lands in bench/out/
# (git-ignored): data/ (generated once), results.md and results.jsonl
# (throughput), rate.md and rate.jsonl, runs/NAME/ (pipeline.yaml and
# petrel.log of the last run of each configuration). Needs bash, python3
# (standard library only), cargo, wc, awk.
#
# To compare the current tree with a commit on a noisy machine (interleaved
# runs, ratios of medians), see bench/compare.sh; both share one run's
# logic, bench/lib/throughput.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib/throughput.sh
source "$ROOT/bench/lib/throughput.sh"
RATE_DURATION="${RATE_DURATION:-60}"
RATE_RATES="${RATE_RATES:-1MB 10MB}"
RATE_WRITERS="${RATE_WRITERS:-gen lines}"

throughput() {
    local datasets=("$@")
    ((${#datasets[@]})) || datasets=("${ALL_DATASETS[@]}")
    check_datasets "${datasets[@]}"
    build
    mkdir -p "$OUT/runs"
    local rows="$OUT/results.tsv" jsonl="$OUT/results.jsonl"
    : > "$rows"; : > "$jsonl"
    local limits="$OUT/limits.tsv"; : > "$limits"

    echo "== file sink output: $(sink_where)" >&2
    printf '%-13s %-16s %3s %9s %11s %9s %8s %7s %9s\n' \
        "data set" variant thr "MB/s" "events/s" "CPU s/GB" "RSS MB" "vs wc" "med MB/s"
    for ds in "${datasets[@]}"; do
        local f size lines wc_s wc_mbs gen_events
        f=$(gen_file "$ds")
        size=$(stat -c %s "$f")
        gen_events=$(sed -n 3p "$f.gen")
        read -r lines wc_s < <(wc_limit "$f")
        wc_mbs=$(calc "$size / $wc_s / 1000000")
        printf '%s\t%s\t%s\t%s\t%.1f\n' "$ds" "$size" "$lines" "$wc_s" "$wc_mbs" >> "$limits"
        printf '%-13s %-16s %3s %9.0f %11s %9s %8s %7s %9s   (%d lines, %d bytes)\n' \
            "$ds" "wc -l" "-" "$wc_mbs" "-" "-" "-" "1.00" "-" "$lines" "$size"
        for variant in $BENCH_SINKS; do
            variant_setup "$ds" "$variant" "$lines" "$gen_events" || continue
            local expect=$V_EXPECT
            for thr in $(threads_for "$ds"); do
                local name="$ds-$variant-t$thr" results=()
                for rep in $(seq "$BENCH_REPEAT"); do
                    run_once "$BIN" "$f" "$thr" "$name" "$rep" "dataset=$ds" "variant=$variant"
                    cat "$RUN_RESULT" >> "$jsonl"
                    results+=("$RUN_RESULT")
                done
                # The fastest run (like wc -l's best of 3) fills the row; the
                # median and the range over all runs show the spread.
                local _pick wall cpu hwm other_s pf mbs_min mbs_max mbs_med cpugb_med rss_med
                IFS=$'\t' read -r _pick wall cpu hwm other_s pf mbs_min mbs_max mbs_med cpugb_med rss_med \
                    < <(python3 "$HELPER" stats "${results[@]}")
                local range
                range=$(printf '%.0f-%.0f' "$mbs_min" "$mbs_max")
                # Cores used by other processes during the run (noise indicator).
                local other
                other=$(calc "$other_s / $wall")
                local mbs evs cpugb rss ratio
                mbs=$(calc "$size / $wall / 1000000")
                evs=$(calc "$expect / $wall")
                cpugb=$(calc "$cpu / ($size / 1000000000)")
                rss=$(calc "$hwm / 1024")
                ratio=$(calc "$mbs / $wc_mbs")
                printf '%-13s %-16s %3s %9.0f %11.0f %9.2f %8.1f %7.3f %9.0f   range %s MB/s, other procs %.2f cores%s\n' \
                    "$ds" "$variant" "$thr" "$mbs" "$evs" "$cpugb" "$rss" "$ratio" "$mbs_med" "$range" "$other" \
                    "$([[ "$pf" == 0 ]] || echo ", $pf PARSE FAILURES")"
                # The median comes last so that readers of the older columns keep working.
                printf '%s\t%s\t%s\t%.1f\t%.0f\t%.2f\t%.1f\t%.3f\t%.3f\t%.2f\t%.2f\t%s\t%.0f\t%.2f\t%.1f\n' \
                    "$ds" "$variant" "$thr" "$mbs" "$evs" "$cpugb" "$rss" "$ratio" "$wall" "$cpu" "$other" "$range" \
                    "$mbs_med" "$cpugb_med" "$rss_med" >> "$rows"
            done
        done
    done

    {
        echo "# Petrel throughput ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo "BENCH_SIZE=$BENCH_SIZE; each row is the fastest of BENCH_REPEAT=$BENCH_REPEAT runs, with the median and the range over all runs in the last columns. MB = 10^6 bytes."
        echo
        echo "File sink output (text, ndjson, parse-ndjson): $(sink_where)."
        echo
        machine_facts | sed 's/^/- /'
        echo
        echo "Raw limit (\`wc -l\`, page-cached, best of 3):"
        echo
        echo "| data set | bytes | lines | wc -l s | wc -l MB/s |"
        echo "|---|---:|---:|---:|---:|"
        awk -F'\t' '{printf "| %s | %d | %d | %.3f | %.0f |\n", $1, $2, $3, $4, $5}' "$limits"
        echo
        echo "| data set | variant | threads | MB/s | events/s | CPU s per GB | peak RSS MB | ratio to wc -l | wall s | CPU s | other procs (cores) | MB/s range | median MB/s | median CPU s per GB | median peak RSS MB |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        awk -F'\t' '{printf "| %s | %s | %s | %.0f | %.0f | %.2f | %.1f | %.3f | %.3f | %.2f | %.2f | %s | %.0f | %.2f | %.1f |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15}' "$rows"
        echo
        echo "CPU s = petrel's on-CPU time from start to completion (se.sum_exec_runtime of its threads; utime+stime where unavailable); CPU s per GB = that / file GB. \"threads\" is --threads, the processing workers; the input thread and the sink runtime come in addition, so one worker can use more than one core."
        echo
        echo "Variants: blackhole / text / ndjson = raw lines (processors: []) into the blackhole sink or the file sink ($(sink_where)); parse-* = the data set's parser (regex512, nginx283: parse_regex; json512: parse_json; delim512: parse_delimiter; multiline512: multiline start_pattern in the source, events/s counts 23-line events) into the blackhole or the ndjson file sink."
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
