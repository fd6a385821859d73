#!/usr/bin/env bash
# Builds the Python producer package (PyO3 + maturin) into a private venv
# and runs its pytest suite against a real `petrel run`.
#   scripts/test-python-producer.sh [pytest args...]
# Uses PETREL_TEST_BIN, else $CARGO_TARGET_DIR/release/petrel (built when
# missing).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
export PETREL_TEST_BIN="${PETREL_TEST_BIN:-$target/release/petrel}"
if [ ! -x "$PETREL_TEST_BIN" ]; then
    cargo build --release --locked -p petrel
fi
venv="$target/py-producer-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
export PATH="$venv/bin:$PATH"
"$venv/bin/python" -m pip install --quiet --upgrade "maturin>=1.5,<2" pytest
# The extension's own build directory, reused between runs.
CARGO_TARGET_DIR="$target/py-producer" \
    "$venv/bin/python" -m pip install --quiet --force-reinstall --no-build-isolation ./crates/petrel-producer-py
exec "$venv/bin/python" -m pytest -q crates/petrel-producer-py/tests "$@"
