#!/usr/bin/env bash
# otelcol.sh — builds the OpenTelemetry Collector the headline benchmark
# (bench/headline.sh) runs as a peer: the contrib filelog receiver and the
# file exporter, nothing else, with the Collector's own builder (ocb), into
# the test cache (scripts/lib/cache.sh: $PETREL_TEST_CACHE/otelcol-filelog-<version>),
# and prints the binary's path.
#
#   scripts/peers/otelcol.sh
#   OTELCOL_VERSION=v0.161.0 scripts/peers/otelcol.sh
#
# Why not scripts/otelcol.sh (the test suite's Collector, v0.161.0): the
# filelog receiver v0.161.0 needs pkg/stanza v0.161.0, whose module zip the
# Go module proxy does not serve ("403 This module version is not
# available", 2026-11-29; v0.149.0 and v0.165.x are served), so a v0.161.0
# build with filelog fails, and adding it to the test suite's manifest
# would break the opentelemetry tests' build. This build is for the
# benchmark alone, at the newest version the proxy serves whole
# (OTELCOL_VERSION, default v0.165.0); the tests keep theirs. At v0.165.0
# the file exporter's tests import otlpencodingextension, whose v0.165.0
# zip is not served either: it is replaced by v0.161.0 (OTELCOL_REPLACES),
# which only `go mod tidy` reads.
#
# Needs go. The module and build caches are the shared ones of the test
# cache (cache_go_env). A few minutes on 2 cores, niced.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=${OTELCOL_VERSION:-v0.165.0}
# PATH@VERSION of contrib modules to replace (see below); none by default
# for another OTELCOL_VERSION.
replaces=
[ "$version" != v0.165.0 ] || replaces=extension/encoding/otlpencodingextension@v0.161.0
replaces=${OTELCOL_REPLACES-$replaces}
command -v go >/dev/null || { echo "otelcol: go is required" >&2; exit 1; }
if ! cache_begin otelcol-filelog "$version" "$0"; then
  cache_go_env
  out="$CACHE_ENTRY"
  cat >"$out/builder.yaml" <<EOF
dist:
  name: otelcol
  description: OpenTelemetry Collector for the Petrel headline benchmark
  output_path: $out/build
receivers:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/receiver/filelogreceiver $version
exporters:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $version
EOF
  # Modules that only the components' tests import, which the builder's
  # `go mod tidy` still resolves, and whose zip the proxy does not serve at
  # this version: replaced by one it serves (never compiled).
  if [ -n "$replaces" ]; then
    echo "replaces:" >>"$out/builder.yaml"
    for r in $replaces; do
      echo "  - github.com/open-telemetry/opentelemetry-collector-contrib/${r%%@*} => github.com/open-telemetry/opentelemetry-collector-contrib/${r%%@*} ${r#*@}" >>"$out/builder.yaml"
    done
  fi
  builder="$GOPATH/bin/builder-$version"
  if [ ! -x "$builder" ]; then
    GOBIN="$out/tools" nice -n 19 go install "go.opentelemetry.io/collector/cmd/builder@$version"
    mkdir -p "$GOPATH/bin"
    mv "$out/tools/builder" "$builder"
    rm -rf "$out/tools"
  fi
  nice -n 19 "$builder" --config="$out/builder.yaml"
  cp "$out/build/otelcol" "$out/otelcol"
  rm -rf "$out/build"
  cache_done
fi
cache_link "$root" otelcol-filelog
echo "$root/.cache/otelcol-filelog/otelcol"
