#!/usr/bin/env bash
# Compares the current tree with a commit, in one session (issue 22): on a
# shared, noisy machine absolute MB/s drift from hour to hour, but two
# binaries run interleaved see the same noise, so the ratio survives.
#
#   bench/compare.sh COMMIT [DATASET...]    (default: all data sets)
#
# 1. Builds COMMIT's release binary (cargo build --release -p petrel; with
#    BENCH_PROFILE=ci the test command's profile, minutes instead of twenty) in a
#    git worktree bench/out/compare/<short-sha>/src with CARGO_TARGET_DIR
#    bench/out/compare/target (shared by every compared commit; seeded once
#    from the current tree's target/release, so that the dependencies are
#    not built again), keeps the binary as bench/out/compare/<short-sha>/petrel
#    and removes the worktree. That binary is reused when present: delete it
#    to rebuild.
# 2. Builds the current tree and copies its binary as bench/run.sh does
#    (BENCH_NO_BUILD=1: take target/release/petrel as it is).
# 3. For every row (data set x variant x threads) runs base, current, base,
#    current, ... BENCH_REPEAT times each, exactly as bench/run.sh runs a
#    row (bench/lib/throughput.sh: run_once), and prints a markdown line per
#    row as it finishes: median (min-max) of MB/s, CPU s per GB and peak RSS
#    MB for each side, the ratios current/base of the medians (MB/s above
#    1 = faster; CPU s per GB and RSS below 1 = better), and the median CPU
#    of other processes during each side's runs, in cores: a row where the
#    two differ much was measured under different noise, whatever its ratio.
#
# Same environment as bench/run.sh (see its header): BENCH_SINKS,
# BENCH_THREADS, BENCH_SIZE, BENCH_REPEAT (default 3), BENCH_MEMORY,
# BENCH_QUIET_WAIT, BENCH_TIMEOUT, BENCH_OUT_DIR / BENCH_DEVNULL (the file
# sink writes a file on tmpfs by default), BENCH_SEED, BENCH_REGEN,
# BENCH_NO_BUILD.
#
# Writes bench/out/compare.md (the table, machine and both binaries) and
# bench/out/compare.jsonl (every run, tagged side=base|current, commit,
# dataset, variant); per-run logs in bench/out/runs/cmp-*. The base binary
# is driven by the current tree's bench/petrel_bench.py, so COMMIT must
# understand the same `petrel run` flags and /metrics names. COMMIT may be
# HEAD itself: an A/A comparison shows how far the ratios move by noise alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib/throughput.sh
source "$ROOT/bench/lib/throughput.sh"
CMP="$OUT/compare"

(($# >= 1)) || die "usage: bench/compare.sh COMMIT [DATASET...]"
command -v python3 >/dev/null || die "python3 is required"
BASE_SHA=$(git -C "$ROOT" rev-parse --verify --quiet "$1^{commit}") || die "'$1' is not a commit"
BASE_SHORT=$(git -C "$ROOT" rev-parse --short "$BASE_SHA")
BASE_DIR="$CMP/$BASE_SHORT-$BENCH_PROFILE"
BASE_BIN="$BASE_DIR/petrel"
shift
datasets=("$@")
((${#datasets[@]})) || datasets=("${ALL_DATASETS[@]}")
check_datasets "${datasets[@]}"

build_base() {
    if [[ -x "$BASE_BIN" ]]; then
        echo "== reusing $BASE_BIN ($BASE_SHORT)" >&2
        return
    fi
    local src="$BASE_DIR/src" target="$CMP/target"
    mkdir -p "$BASE_DIR"
    # A worktree left by an interrupted build is reused; --force re-adds one
    # whose directory was deleted by hand (still registered in git).
    if [[ ! -e "$src/.git" ]]; then
        rm -rf -- "$src"
        git -C "$ROOT" worktree add --force --detach "$src" "$BASE_SHA" >&2 || die "git worktree add failed"
    fi
    local own_target="${CARGO_TARGET_DIR:-$ROOT/target}/$BENCH_PROFILE"
    if [[ ! -d "$target/$BENCH_PROFILE" && -d "$own_target" ]]; then
        echo "== seeding $target from $own_target (dependencies are then not rebuilt)" >&2
        mkdir -p "$target"
        cp -a --reflink=auto "$own_target" "$target/" || die "could not copy $own_target"
    fi
    echo "== $(build_command) at $BASE_SHORT (in $src)" >&2
    (cd "$src" && CARGO_TARGET_DIR="$target" $(build_command)) \
        || die "$BENCH_PROFILE build of $BASE_SHORT failed"
    cp "$target/$BENCH_PROFILE/petrel" "$BASE_BIN.tmp" && mv "$BASE_BIN.tmp" "$BASE_BIN"
    # The binary is what is reused; a registered worktree would linger in
    # everyone's `git worktree list`.
    git -C "$ROOT" worktree remove --force "$src" || echo "$SCRIPT_NAME: warning: could not remove the worktree $src" >&2
}

build_base
build
echo "== base $BASE_SHORT: $BASE_BIN (sha256 $(sha256sum "$BASE_BIN" | cut -c1-12)); current: $BUILT_FROM" >&2
echo "== file sink output: $(sink_where)" >&2
jsonl="$OUT/compare.jsonl"
: > "$jsonl"
header=--header
for ds in "${datasets[@]}"; do
    f=$(gen_file "$ds")
    gen_events=$(sed -n 3p "$f.gen")
    lines=$(wc -l < "$f")
    for variant in $BENCH_SINKS; do
        variant_setup "$ds" "$variant" "$lines" "$gen_events" || continue
        # A sink's address (elasticsearch:URL) is no part of a row's name:
        # it would put slashes in file names and colons in the row key.
        label=${variant%%:*}
        for thr in $(threads_for "$ds"); do
            name="cmp-$ds-$label-t$thr"
            # Interleaved, so that both sides share each stretch of noise.
            for rep in $(seq "$BENCH_REPEAT"); do
                run_once "$BASE_BIN" "$f" "$thr" "$name-base" "$rep" \
                    side=base "commit=$BASE_SHORT" "dataset=$ds" "variant=$label"
                cat "$RUN_RESULT" >> "$jsonl"
                run_once "$BIN" "$f" "$thr" "$name-current" "$rep" \
                    side=current "commit=$BUILT_FROM" "dataset=$ds" "variant=$label"
                cat "$RUN_RESULT" >> "$jsonl"
            done
            python3 "$HELPER" compare-report --jsonl "$jsonl" --row "$ds:$label:$thr" $header
            header=
        done
    done
done

preamble="$OUT/compare.preamble.md"
{
    echo "Base: $BASE_SHORT \"$(git -C "$ROOT" log -1 --format=%s "$BASE_SHA" | cut -c1-80)…\", binary sha256 $(sha256sum "$BASE_BIN" | cut -c1-12)."
    echo "Current: working tree at build time $BUILT_FROM, binary sha256 $(sha256sum "$BIN" | cut -c1-12)."
    echo
    echo "BENCH_SIZE=$BENCH_SIZE, BENCH_REPEAT=$BENCH_REPEAT runs per side, interleaved; BENCH_MEMORY=${BENCH_MEMORY:-default}; file sink output: $(sink_where)."
    echo
    machine_facts | sed 's/^/- /'
} > "$preamble"
python3 "$HELPER" compare-report --jsonl "$jsonl" --md "$OUT/compare.md" \
    --base "$BASE_SHORT" --current "$BUILT_FROM" --preamble "$preamble"
rm -f "$preamble"
echo "wrote $OUT/compare.md and $jsonl" >&2
