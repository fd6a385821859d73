#!/usr/bin/env bash
# Installs what the tests need and runs every test: formatting, lints, unit
# and end-to-end tests against the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --release --locked
