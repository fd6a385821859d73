#!/usr/bin/env bash
# Installs what the tests need and runs every test: formatting, lints, unit
# tests, and end-to-end tests against the real binary, a real Apache Kafka
# broker (Maven Central jars, scripts/fetch-kafka.sh), a real OpenSearch
# 2.19.6 node (Maven Central jars, scripts/opensearch.sh), a real
# VictoriaLogs (go install, scripts/victorialogs.sh), a real Versity S3
# gateway v1.8.0 (go install, scripts/versitygw.sh), a real OpenTelemetry
# Collector v0.161.0 (its builder, scripts/otelcol.sh), a real Kubernetes
# API server (kube-apiserver v1.34.4, scripts/kube-apiserver.sh, over
# Debian's etcd) and real HTTP servers, util-linux logger and openssl as
# syslog/TLS clients, a real Apache httpd driven by ab (seed 004), private
# containerd and Docker daemons from the distribution's packages (container
# logs and metadata, scripts/cri-lab.sh and docker-lab.sh), all on
# 127.0.0.1; the Python producer package against a real agent, the Debian
# package and the operations artefacts checked by their real tools, the
# book (docs/, mdBook) built with its links checked, then every fuzz target
# for a short bounded time (nightly toolchain and cargo-fuzz installed when
# missing).
#
# What is built once is kept outside the clone, in the test cache
# (PETREL_TEST_CACHE, default ~/.cache/petrel-test; scripts/lib/cache.sh):
# the servers and clients by version and recipe, Go's and Maven's
# downloads, and the Rust target directory (CARGO_TARGET_DIR, default
# <cache>/cargo-target). A fresh machine builds them all; a machine that
# ran the tests before reuses them from any clone.
#
# The servers build in the background while the Rust workspace compiles;
# the test binaries then run a few at a time (scripts/run-tests.py), the
# Kubernetes API suite as soon as kube-apiserver, still building beside
# them on a fresh machine, is ready. At the end: the seconds of every step,
# and the counts.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TERM_COLOR=never
. scripts/lib/cache.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PETREL_TEST_CACHE/cargo-target}
mkdir -p "$CARGO_TARGET_DIR"
# The tests, and the scripts after them, run the `ci` profile's build
# (release without link-time optimisation, Cargo.toml): one build of the
# agent for every step.
export PETREL_PROFILE=ci
petrel_bin="$CARGO_TARGET_DIR/ci/petrel"

# ---- timing: every step's seconds, printed at the end (and on failure)
t_start=$SECONDS
timings=$(mktemp)
bglog=$(mktemp -d)
print_timings() {
    local rc=$?
    # A run that stopped early leaves no fuzzer behind (its own session).
    if [[ -n ${fuzz_pid:-} ]]; then
        kill -- -"$fuzz_pid" 2>/dev/null || true
    fi
    echo
    echo "== seconds per step (scripts/test.sh, $((SECONDS - t_start)) s in all)"
    awk '{ printf "%8d  %s\n", $1, substr($0, index($0, $2)) }' "$timings" | sort -s -k1,1 -n -r || true
    # The closing line: the test counts (scripts/run-tests.py's), or why
    # there are none.
    if grep -q '^test result:' "$bglog/tests.log" 2>/dev/null; then
        grep '^test result:' "$bglog/tests.log" | tail -1
        if [[ $rc -ne 0 ]]; then
            echo "scripts/test.sh FAILED after the tests (exit $rc): see the step above the timings"
        fi
    elif [[ $rc -ne 0 ]]; then
        echo "test result: FAILED before the tests ran (exit $rc): see the step above the timings"
    fi
    rm -rf "$timings" "$bglog"
    return $rc
}
trap print_timings EXIT
# step NAME CMD...: runs CMD in the foreground and records its seconds.
step() {
    local name=$1 t0=$SECONDS
    shift
    echo "== $name"
    "$@"
    echo "$((SECONDS - t0)) $name" >>"$timings"
}

# ---- 1. packages from the distribution (one dpkg at a time)
step "install the test clients (logger, openssl, tmux)" ./scripts/install-test-tools.sh
step "install apache2, ab, loggen, rsyslog (seed-004 test, syslog sink)" ./scripts/install-syslog-tools.sh
step "install systemd-journal-remote, journalctl" ./scripts/install-journal-tools.sh
step "containerd, runc, umoci, local busybox and pause images" ./scripts/cri-lab.sh setup
step "Docker from the distribution" ./scripts/docker-lab.sh setup
need=()
# OpenSearch 2.19 runs on Java 17 (nothing newer is taken).
java -version 2>&1 | grep -q 'version "17' || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v go >/dev/null 2>&1 || need+=(golang-go)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# What the packaging and manifest checks use, installed now, with the
# rest, rather than one apt run at a time later.
command -v lintian >/dev/null 2>&1 || need+=(lintian)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
python3 -c 'import yaml' 2>/dev/null || /usr/bin/python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "the tests need ${need[*]}; run as root or install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# ---- 2. servers and clients, in the background, while Rust compiles.
# Each is a cache entry: on a warm machine these take seconds. Run at a
# lower priority so the Rust build, the longer path, keeps its pace.
# The tools of the checks after the tests (mdbook, cargo-deb, the nightly
# toolchain with cargo-fuzz, kubeconform/kustomize/helm) build here too.
servers() {
    local s t0
    for s in fetch-kafka opensearch victorialogs versitygw otelcol opamp-server \
        install-hec-clients install-fluent-clients install-beats-clients \
        "check-docs --tools-only" "check-kubernetes --tools-only" cargo-deb cargo-fuzz; do
        t0=$SECONDS
        echo "== $s"
        case $s in
        cargo-deb)
            cargo deb --version >/dev/null 2>&1 || nice -n 5 cargo install cargo-deb --locked
            ;;
        cargo-fuzz)
            rustup toolchain list | grep -q '^nightly' ||
                rustup toolchain install nightly --profile minimal
            cargo +nightly fuzz --version >/dev/null 2>&1 || nice -n 5 cargo install cargo-fuzz --locked
            ;;
        *)
            local script=${s%% *} args=()
            [[ $s == *" "* ]] && args=("${s#* }")
            if ! nice -n 5 "./scripts/$script.sh" "${args[@]}"; then
                echo "scripts/$s FAILED" >&2
                return 1
            fi
            ;;
        esac
        echo "$((SECONDS - t0)) background: $s" >>"$timings"
    done
}
servers >"$bglog/servers.log" 2>&1 &
servers_pid=$!
# kube-apiserver, the longest build (about 15 minutes from nothing on 2
# cores), is needed by two suites only: it builds beside the rest, and
# run-tests.py starts kubernetes_api when its status file says "ok"
# (--after), while the other suites run. Then the peers of the metadata
# layouts (Filebeat 7.17, about 2 minutes; the Collector with filelog and
# k8sattributes, about 10), which only the layouts suite needs, behind a
# status file of their own.
late_status=$bglog/kube-apiserver.status
peers_status=$bglog/peers.status
late_build() { # STATUS-FILE NAME SCRIPT...
    local status=$1 name=$2 t0=$SECONDS s
    shift 2
    for s in "$@"; do
        echo "== $s"
        if ! nice -n 5 "./scripts/$s.sh"; then
            { echo "scripts/$s.sh failed; its last lines:"; tail -n 40 "$bglog/late.log"; } >"$status.tmp"
            mv "$status.tmp" "$status"
            return 1
        fi
    done
    echo "$((SECONDS - t0)) background: $name" >>"$timings"
    echo ok >"$status.tmp"
    mv "$status.tmp" "$status"
}
late_servers() {
    if late_build "$late_status" kube-apiserver kube-apiserver; then
        late_build "$peers_status" "layout peers (Filebeat, the Collector with k8sattributes)" \
            peers/filebeat peers/otelcol-k8s
    else
        cp "$late_status" "$peers_status"
    fi
}
late_servers >"$bglog/late.log" 2>&1 &
late_pid=$!
echo "== servers and clients build in the background (their output follows once the Rust build is done)"

# ---- 3. Rust: format, lints, the test build
step "cargo fmt --check" cargo fmt --all -- --check
# In the ci profile, as the test build after it: both then share the build
# scripts' work (librdkafka with OpenSSL, Kerberos and Cyrus SASL compiled
# from source) and the proc-macros, which the dev profile would build a
# second time.
step "cargo clippy" cargo clippy --workspace --all-targets --profile ci --locked -- -D warnings
step "cargo test --no-run (the ci profile's test binaries)" \
    cargo test --workspace --profile ci --locked --no-run
# (The test build above also builds the agent, target/ci/petrel, which the
# integration tests and the checks after them run: no second build.)

t0=$SECONDS
echo "== waiting for the servers and clients"
if ! wait "$servers_pid"; then
    cat "$bglog/servers.log"
    echo "building the test servers failed (above)" >&2
    exit 1
fi
cat "$bglog/servers.log"
echo "$((SECONDS - t0)) waiting for the background builds after the Rust build" >>"$timings"

# ---- 4. the tests, a few suites at a time; beside them, at the lowest
# priority, every fuzz target for a bounded time: the suites mostly wait
# for their servers, and the fuzzer takes the idle CPU (at nice 19 the
# scheduler gives it next to nothing while a suite wants both cores). The
# fuzz crates build with nightly and their own flags: a target directory
# of their own in the cache.
fuzz_log=$bglog/fuzz.log
setsid env FUZZ_SECONDS="${FUZZ_SECONDS:-20}" FUZZ_SANITIZER="${FUZZ_SANITIZER:-none}" \
    CARGO_TARGET_DIR="$PETREL_TEST_CACHE/cargo-target-fuzz" \
    nice -n 19 ./scripts/fuzz.sh >"$fuzz_log" 2>&1 &
fuzz_pid=$!
fuzz_t0=$SECONDS
step "cargo test (scripts/run-tests.py: suites in lanes)" \
    bash -c 'set -o pipefail; python3 scripts/run-tests.py --profile ci --after "petrel/kubernetes_api=$2" --after "petrel/layouts=$3" | tee "$1"' \
    _ "$bglog/tests.log" "$late_status" "$peers_status"
wait "$late_pid" || true
cat "$bglog/late.log"
step "the Python producer package (maturin + pytest in a private venv)" \
    env PETREL_TEST_BIN="$petrel_bin" ./scripts/test-python-producer.sh
step "packaging: .deb (cargo-deb, lintian), systemd unit, promtool rules, dashboard" \
    ./scripts/check-packaging.sh
step "the book: mdbook build docs, its links" ./scripts/check-docs.sh
step "Kubernetes manifests: kubeconform, kustomize, helm, petrel validate" \
    env PETREL="$petrel_bin" ./scripts/check-kubernetes.sh
t0=$SECONDS
echo "== fuzz every target briefly (scripts/fuzz.sh, started beside the tests)"
if ! wait "$fuzz_pid"; then
    fuzz_pid=
    cat "$fuzz_log"
    echo "fuzzing failed (above)" >&2
    exit 1
fi
fuzz_pid=
grep -E '^== |^Done ' "$fuzz_log" || true
echo "$((SECONDS - fuzz_t0)) fuzz every target briefly (beside the tests; $((SECONDS - t0)) s waited for after the other steps)" >>"$timings"
echo "== every step passed"
