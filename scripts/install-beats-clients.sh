#!/usr/bin/env bash
# Builds the Lumberjack v2 client the `beats` source's tests
# (crates/petrel/tests/beats.rs) and bench/beats.py drive: `tst-send` from
# github.com/elastic/go-lumber, Elastic's own Lumberjack v2 library (the one
# Filebeat's and Logstash forwarders' `logstash` output uses), with
# `go install` into .cache/beats-clients/bin. Go's module and build caches
# stay under .cache/go as for the other Go builds. Idempotent.
#
#   scripts/install-beats-clients.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.cache/beats-clients/bin/tst-send"
if [ -x "$bin" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "install-beats-clients: go (1.21 or newer) is required" >&2; exit 1; }
export GOPATH="$root/.cache/go" GOMODCACHE="$root/.cache/go/mod" GOCACHE="$root/.cache/go/build"
export GOFLAGS=-buildvcs=false GOBIN="$root/.cache/beats-clients/bin"
mkdir -p "$GOBIN"
go install github.com/elastic/go-lumber/cmd/tst-send@v0.2.0
echo "tst-send (go-lumber v0.2.0): $bin"
