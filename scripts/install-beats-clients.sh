#!/usr/bin/env bash
# Builds the Lumberjack v2 client the `beats` source's tests
# (crates/petrel/tests/beats.rs) and bench/beats.py drive: `tst-send` from
# github.com/elastic/go-lumber, Elastic's own Lumberjack v2 library (the one
# Filebeat's and Logstash forwarders' `logstash` output uses), with
# `go install` into the test cache (scripts/lib/cache.sh), linked from
# .cache/beats-clients. Idempotent.
#
#   scripts/install-beats-clients.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v0.2.0
if ! cache_begin beats-clients "$version" "$0"; then
  command -v go >/dev/null || { echo "install-beats-clients: go (1.21 or newer) is required" >&2; exit 1; }
  cache_go_env
  GOBIN="$CACHE_ENTRY/bin" go install "github.com/elastic/go-lumber/cmd/tst-send@$version"
  cache_done
fi
cache_link "$root" beats-clients
echo "tst-send (go-lumber $version): $root/.cache/beats-clients/bin/tst-send"
