#!/usr/bin/env bash
# Installs what the tests need and runs every test: formatting, lints, unit
# tests, and end-to-end tests against the real binary, a real Apache Kafka
# broker (fetched from Maven Central into .cache/ by scripts/fetch-kafka.sh),
# a real OpenSearch 2.19.6 node (built from Maven Central into .cache/ by
# scripts/opensearch.sh), a real VictoriaLogs (go install, scripts/victorialogs.sh),
# a real Versity S3 gateway v1.8.0 (go install, scripts/versitygw.sh),
# a real OpenTelemetry Collector v0.161.0 (built with its builder into
# .cache/ by scripts/otelcol.sh), a real Kubernetes API server (kube-apiserver
# v1.34.4 built into .cache/ by scripts/kube-apiserver.sh, over Debian's etcd)
# and real HTTP servers, util-linux logger and openssl as syslog/TLS
# clients, a real Apache httpd driven by ab (seed 004), private containerd
# and Docker daemons from the distribution's packages (container logs and
# metadata, scripts/cri-lab.sh and docker-lab.sh), all on 127.0.0.1;
# the Python producer package against a real agent, the Debian package
# and the operations artefacts checked by their real tools, the book
# (docs/, mdBook) built with its links checked, then every
# fuzz target for a short bounded time (nightly toolchain and cargo-fuzz
# installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# The tests, and the scripts after them, run the `ci` profile's build
# (release without link-time optimisation, Cargo.toml): one build of the
# agent for every step.
export PETREL_PROFILE=ci
petrel_bin="${CARGO_TARGET_DIR:-$PWD/target}/ci/petrel"
echo "== install the test clients (logger, openssl)"
./scripts/install-test-tools.sh
echo "== install apache2, ab, loggen, rsyslog (the seed-004 test and the syslog benchmarks)"
./scripts/install-syslog-tools.sh
./scripts/install-journal-tools.sh
echo "== containerd, runc, umoci and Docker from the distribution, local busybox and pause images (container tests, scripts/image.sh)"
./scripts/cri-lab.sh setup
./scripts/docker-lab.sh setup
echo "== fetch the Kafka broker used by the tests"
./scripts/fetch-kafka.sh
echo "== build the OpenSearch node used by the elasticsearch sink tests (Java 17, Maven)"
# OpenSearch 2.19 runs on Java 17 (nothing newer is taken).
need=()
java -version 2>&1 | grep -q 'version "17' || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "the elasticsearch sink tests need ${need[*]}; run as root or install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
./scripts/opensearch.sh
echo "== build VictoriaLogs v1.52.1 with go install (loki sink tests)"
if ! command -v go >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "the loki sink tests need Go (golang-go); run as root or install it" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go
fi
./scripts/victorialogs.sh
echo "== build versitygw v1.8.0 with go install (s3 sink tests)"
./scripts/versitygw.sh
echo "== build kube-apiserver v1.34.4 from the Go module proxy, etcd from Debian (kubernetes_api tests)"
./scripts/kube-apiserver.sh
echo "== build the OpenTelemetry Collector v0.161.0 used by the opentelemetry sink and source tests (Go)"
./scripts/otelcol.sh
./scripts/install-hec-clients.sh  # splunk-logging (npm) for the splunk_hec source tests
echo "== the Forward protocol clients of the fluent source tests (fluent-logger from PyPI, @fluent-org/logger from npm)"
./scripts/install-fluent-clients.sh
echo "== go-lumber's tst-send, the Lumberjack v2 client of the beats source tests (go install)"
./scripts/install-beats-clients.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --profile ci --locked
echo "== the Python producer package (maturin + pytest in a private venv)"
PETREL_TEST_BIN="$petrel_bin" ./scripts/test-python-producer.sh
echo "== packaging: .deb (cargo-deb, lintian), systemd unit, promtool rules, dashboard"
./scripts/check-packaging.sh
echo "== the book: mdbook build docs (mdbook installed into .cache/cargo-tools), its links"
./scripts/check-docs.sh
echo "== Kubernetes manifests: kubeconform, kustomize, the pod's security settings, petrel validate"
PETREL="$petrel_bin" ./scripts/check-kubernetes.sh
echo "== fuzz every target briefly (scripts/fuzz.sh)"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
FUZZ_SECONDS=${FUZZ_SECONDS:-20} FUZZ_SANITIZER=${FUZZ_SANITIZER:-none} ./scripts/fuzz.sh
