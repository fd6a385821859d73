#!/usr/bin/env bash
# Builds VictoriaLogs v1.52.1 (Apache-2.0) with `go install` into
# .cache/victorialogs/bin: one server that takes the Loki push API (JSON and
# protobuf+snappy), OTLP logs and the Elasticsearch bulk API, and answers
# exact counts through LogsQL. The loki and opentelemetry sink tests run it
# on loopback. Go's module and build caches stay under .cache/go so nothing
# is cached outside the repository. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.cache/victorialogs/bin/victoria-logs"
if [ -x "$bin" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "victorialogs: go (1.24 or newer) is required" >&2; exit 1; }
export GOPATH="$root/.cache/go" GOMODCACHE="$root/.cache/go/mod" GOCACHE="$root/.cache/go/build"
export GOFLAGS=-buildvcs=false GOBIN="$root/.cache/victorialogs/bin"
mkdir -p "$GOBIN"
go install github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@v1.52.1
"$bin" -version
