#!/usr/bin/env bash
# Builds VictoriaLogs v1.52.1 (Apache-2.0) with `go install` into the test
# cache (scripts/lib/cache.sh), linked from .cache/victorialogs: one server
# that takes the Loki push API (JSON and protobuf+snappy), OTLP logs and the
# Elasticsearch bulk API, and answers exact counts through LogsQL. The loki
# and opentelemetry sink tests run .cache/victorialogs/bin/victoria-logs on
# loopback. Idempotent: a cache entry of the same version and recipe is
# used as it is.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v1.52.1
if ! cache_begin victorialogs "$version" "$0"; then
  command -v go >/dev/null || { echo "victorialogs: go (1.24 or newer) is required" >&2; exit 1; }
  cache_go_env
  GOBIN="$CACHE_ENTRY/bin" go install "github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@$version"
  cache_done
fi
cache_link "$root" victorialogs
"$CACHE_ENTRY/bin/victoria-logs" -version
