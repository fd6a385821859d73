#!/usr/bin/env bash
# Installs the real Fluent Forward protocol clients the `fluent` source's
# tests (crates/petrel/tests/fluent.rs) and bench/fluent.py drive, only what
# is missing (running it again changes nothing):
#
#   fluent-logger (PyPI)        in a private venv .cache/fluent-clients/venv
#                               (.cache/fluent-clients: the test cache's entry)
#                               (with its dependency msgpack, which the
#                               tests and the benchmark also use to write
#                               PackedForward chunks)
#   @fluent-org/logger (npm)    in .cache/fluent-clients/node/node_modules
#
#   scripts/install-fluent-clients.sh
#
# Docker's `fluentd` log driver comes with Debian's docker.io, installed by
# `scripts/docker-lab.sh setup`. Needs python3 (with venv) and npm; as root
# it installs them with apt-get when missing.
set -euo pipefail
export LC_ALL=C

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/cache.sh"
PY_PKGS=(fluent-logger==0.11.1 msgpack==1.1.2)
NODE_PKG="@fluent-org/logger@1.0.10"

die() { echo "install-fluent-clients.sh: $*" >&2; exit 1; }

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v npm >/dev/null || need+=(npm)
if ((${#need[@]})); then
    ((EUID == 0)) || die "needs ${need[*]}; run as root or install them"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# .cache/fluent-clients links to the test cache's entry (scripts/lib/cache.sh);
# an entry of another recipe starts empty, and what is missing is installed.
cache_begin fluent-clients 0.11.1-1.0.10 "$0" || true
DIR=$CACHE_ENTRY
if ! "$DIR/venv/bin/python" -c 'import fluent.sender, fluent.asyncsender, msgpack' 2>/dev/null; then
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install --quiet --disable-pip-version-check "${PY_PKGS[@]}"
fi

if [ ! -f "$DIR/node/node_modules/@fluent-org/logger/package.json" ]; then
    mkdir -p "$DIR/node"
    (cd "$DIR/node" && [ -f package.json ] || echo '{"name":"petrel-fluent-clients","private":true}' > package.json)
    (cd "$DIR/node" && npm install --silent --no-audit --no-fund "$NODE_PKG")
fi
cache_done
cache_link "$ROOT" fluent-clients

echo "fluent-logger $("$DIR/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("fluent-logger"))'), @fluent-org/logger $(node -p "require('$DIR/node/node_modules/@fluent-org/logger/package.json').version")"
