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
cache_go_install "$root" victorialogs v1.52.1 github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs "$0"
"$root/.cache/victorialogs/bin/victoria-logs" -version
