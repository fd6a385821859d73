#!/usr/bin/env bash
# Builds the OpenTelemetry Collector v0.161.0 the opentelemetry sink and
# source tests run, with the collector's own builder (ocb), into
# .cache/otelcol/otelcol: the otlp receiver, the batch processor, the debug,
# otlp (gRPC), otlp_http and file exporters. Go's module and build caches
# live in .cache/go so nothing is cached outside the repository. Idempotent:
# a second run with the same configuration does nothing.
#
#   scripts/otelcol.sh               build (once); prints the binary's path
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=v0.161.0
out="$root/.cache/otelcol"
go_root="$root/.cache/go"
command -v go >/dev/null || { echo "otelcol: go is required" >&2; exit 1; }
export GOPATH="$go_root" GOMODCACHE="$go_root/pkg/mod" GOCACHE="$go_root/cache" GOFLAGS=-buildvcs=false
mkdir -p "$out"
manifest="$out/builder.yaml"
cat >"$manifest.new" <<EOF
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
EOF
stamp="$(sha256sum <"$manifest.new" | cut -c1-16)"
if [ ! -x "$out/otelcol" ] || [ ! -f "$out/.complete-$stamp" ]; then
  mv "$manifest.new" "$manifest"
  builder="$go_root/bin/builder"
  if [ ! -x "$builder" ] || ! "$builder" version 2>/dev/null | grep -q "${version#v}"; then
    go install "go.opentelemetry.io/collector/cmd/builder@$version"
  fi
  rm -rf "$out/build" "$out"/.complete-*
  "$builder" --config="$manifest"
  cp "$out/build/otelcol" "$out/otelcol"
  touch "$out/.complete-$stamp"
else
  rm -f "$manifest.new"
fi
echo "$out/otelcol"
