#!/usr/bin/env bash
# Builds the OpenTelemetry Collector v0.161.0 the opentelemetry sink and
# source tests run, with the collector's own builder (ocb), into the test
# cache (scripts/lib/cache.sh), linked from .cache/otelcol: the otlp
# receiver, the batch processor, the debug, otlp (gRPC), otlp_http and file
# exporters. Idempotent: an entry of the same version and recipe (this
# script, with its manifest) is used as it is.
#
#   scripts/otelcol.sh               build (once); prints the binary's path
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v0.161.0
command -v go >/dev/null || { echo "otelcol: go is required" >&2; exit 1; }
if ! cache_begin otelcol "$version" "$0"; then
  cache_go_env
  out="$CACHE_ENTRY"
  manifest="$out/builder.yaml"
  cat >"$manifest" <<EOF2
dist:
  name: otelcol
  description: OpenTelemetry Collector for the Petrel tests
  output_path: $out/build
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver $version
processors:
  - gomod: go.opentelemetry.io/collector/processor/batchprocessor $version
exporters:
  - gomod: go.opentelemetry.io/collector/exporter/debugexporter $version
  - gomod: go.opentelemetry.io/collector/exporter/otlpexporter $version
  - gomod: go.opentelemetry.io/collector/exporter/otlphttpexporter $version
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $version
EOF2
  builder="$GOPATH/bin/builder-$version"
  if [ ! -x "$builder" ]; then
    GOBIN="$out/tools" go install "go.opentelemetry.io/collector/cmd/builder@$version"
    mkdir -p "$GOPATH/bin"
    mv "$out/tools/builder" "$builder"
    rm -rf "$out/tools"
  fi
  "$builder" --config="$manifest"
  cp "$out/build/otelcol" "$out/otelcol"
  rm -rf "$out/build"
  cache_done
fi
cache_link "$root" otelcol
echo "$root/.cache/otelcol/otelcol"
