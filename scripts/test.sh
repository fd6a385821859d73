#!/usr/bin/env bash
# Installs what the tests need and runs every test: formatting, lints, unit
# tests, and end-to-end tests against the real binary, a real Apache Kafka
# broker (fetched from Maven Central into .cache/ by scripts/fetch-kafka.sh)
# and real HTTP servers, util-linux logger and openssl as syslog/TLS
# clients, all on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "== install the test clients (logger, openssl)"
./scripts/install-test-tools.sh
echo "== fetch the Kafka broker used by the tests"
./scripts/fetch-kafka.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --release --locked
