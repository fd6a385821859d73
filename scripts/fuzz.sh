#!/usr/bin/env bash
# Fuzzes the parsing processors (parse_regex, parse_json, parse_delimiter),
# the container log decoder (container_format)
# and the syslog parser and framer (syslog_parse, octet_framer, in
# fuzz/syslog) with cargo-fuzz (libFuzzer, address sanitizer), each target for a bounded
# time. Needs a nightly toolchain; installs cargo-fuzz when it is missing.
#
#   scripts/fuzz.sh                   # every target, 30 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh  # longer
#   scripts/fuzz.sh parse_json        # some targets only
#
# Environment: FUZZ_SECONDS (default 30) per target; FUZZ_JOBS (default 1)
# parallel fuzzing processes per target; FUZZ_SANITIZER (default address;
# `none` builds faster and runs about twice as fast).
#
# `scripts/test.sh` runs every target briefly (FUZZ_SECONDS=20,
# FUZZ_SANITIZER=none: a panic or an overflow is what Rust code can fail
# with, and the build is minutes shorter).
#
# Corpora are kept in fuzz/corpus/<target> (fuzz/syslog/corpus/<target>) (seeded from the benchmark data
# shapes on the first run); a crash leaves its input in
# fuzz/artifacts/<target>/ and makes this script exit non-zero. Reproduce
# with `cd fuzz && cargo +nightly fuzz run <target> <artifact>`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-1}
sanitizer=${FUZZ_SANITIZER:-address}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(parse_regex parse_json parse_delimiter container_format syslog_parse octet_framer)

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz.sh: cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
    echo "fuzz.sh: the seeded random tests in the processors' unit tests run on stable:" >&2
    echo "         cargo test -p petrel --release random_inputs" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

cd fuzz
# Seed corpora (never a NUL byte: bash strings cannot hold one). The first
# byte of an input selects the processor
# configuration modulo their number (see fuzz_targets/*.rs), the rest is
# the line.
seed() {
    local dir=corpus/$1
    shift
    [ -d "$dir" ] && return
    mkdir -p "$dir"
    local i=0
    for line in "$@"; do
        printf '%s' "$line" > "$dir/seed$i"
        i=$((i + 1))
    done
}
seed parse_regex \
    $'\x0f[2025-04-03 10:02:06.561793] [info] [131172] /root/stdout-test/server_stdout.go:165 log:ZQsC8JI2' \
    $'\x03yyy\xff' $'\x06k=v z=\'q q\' y=' $'\x09word tail' $'\x0cababac'
seed parse_json \
    $'\x09{"time":"2025-04-03 10:02:06.561793","level":"info","pid":131172,"file":"/root/x.go","line":165,"log":"ZQsC8JI2"}' \
    $'\x03{"a":{"b":[1,2.5e3,-0,true,null,"x\\u00e9\\n"]},"a":{"c":{}}}' $'\x06{"message":"m","k":"\\"q\\""}' \
    $'\x03{"a":99999999999999999999999,"b":-1234567890123456789}'
seed container_format \
    $'\x022024-03-01T10:20:30.123456789Z stdout P part-a\n2024-03-01T10:20:30.1Z stderr F err\n2024-03-01T10:20:30.2Z stdout F end\n' \
    $'\x05{"log":"abc","stream":"stdout","time":"2024-03-01T10:20:31Z"}\n{"log":"d\\u00e9\\n","stream":"stdout","time":"2024-03-01T10:20:31Z"}\n' \
    $'\x11garbage\n2024-03-01T10:20:30Z stdout X x\n{"stream":"stderr","log":"r\\n"}\n'
seed parse_delimiter \
    $'\x2d2025-04-03 10:02:06.561793|info|131172|/root/x.go|165|ZQsC8JI2' \
    $'\x2d"a|b"|"say ""hi"""||x|y|z|w' $'\x12\'x, y\', z, \'w\'\'\', v, u' $'\x24a::"b::c"::d'

status=0
for t in "${targets[@]}"; do
    echo "== fuzzing $t for ${seconds}s"
    case $t in
        syslog_parse | octet_framer)
            # Own project; committed seeds are read, new inputs go to corpus/.
            dir=syslog
            mkdir -p "syslog/corpus/$t"
            corpora=("syslog/corpus/$t" "syslog/seeds/$t")
            ;;
        *)
            dir=.
            corpora=("corpus/$t")
            ;;
    esac
    if ! cargo +nightly fuzz run --fuzz-dir "$dir" --sanitizer "$sanitizer" --jobs "$jobs" \
        "$t" "${corpora[@]}" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048; then
        echo "== $t FAILED: see fuzz/$dir/artifacts/$t/" >&2
        status=1
    fi
done
exit $status
