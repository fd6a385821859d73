#!/usr/bin/env bash
# Builds the OpAMP server of the fleet management tests
# (crates/petrel/tests/opamp.rs) and bench/opamp_load.sh: opamp-go's own
# server, github.com/open-telemetry/opamp-go/server v0.23.0 (Apache-2.0),
# with the control API of crates/petrel/tests/opamp_server/main.go, into
# the test cache (scripts/lib/cache.sh), linked from .cache/opamp-server.
# The module's go.sum pins every dependency. Idempotent: an entry of the
# same version and recipe (this script, go.mod, go.sum, main.go) is used
# as it is.
#
#   scripts/opamp-server.sh          build (once); prints the binary's path
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
src="$root/crates/petrel/tests/opamp_server"
if ! cache_begin opamp-server v0.23.0 "$0" "$src/go.mod" "$src/go.sum" "$src/main.go"; then
  command -v go >/dev/null || { echo "opamp-server: go (1.24 or newer) is required" >&2; exit 1; }
  cache_go_env
  (cd "$src" && go build -trimpath -o "$CACHE_ENTRY/bin/opamp-test-server" .)
  cache_done
fi
cache_link "$root" opamp-server
echo "$root/.cache/opamp-server/bin/opamp-test-server"
