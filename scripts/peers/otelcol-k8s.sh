#!/usr/bin/env bash
# otelcol-k8s.sh — builds the OpenTelemetry Collector the `otel` metadata
# layout is compared with (crates/petrel/tests/layouts.rs): the filelog
# receiver (its `container` operator reads kubelet's CRI logs), the
# k8sattributes processor (pod metadata from the API server) and the
# file exporter, with the Collector's builder (ocb), into the test cache
# (scripts/lib/cache.sh: otelcol-k8s-<version>), linked from
# .cache/otelcol-k8s; prints the binary's path.
#
# The releases the Go module proxy reachable here lets build: filelog and
# the file exporter of contrib v0.165.0 (filelog's pkg/stanza is refused
# at v0.161.0 to v0.164.0: 403, "not available"), k8sattributes v1.3.1
# (contrib v0.164.0; stable, so versioned 1.x: its v1.4.x of v0.165.0
# needs an OpenTelemetry Go pseudo-version the proxy refuses, and the
# v0.161.0 of the suite's own Collector is refused too), and the file
# exporter's otlpencodingextension of v0.161.0 (v0.165.0 is refused), as
# the headline benchmark's Collector build does. So the suite's own
# Collector (scripts/otelcol.sh, v0.161.0, which the OTLP/HTTP exporter
# of v0.165.0 could not join either) does not take them. About 10 min on
# 2 cores.
#
#   scripts/peers/otelcol-k8s.sh       build (once); prints the binary
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v0.165.0
k8sattributes=v1.3.1
command -v go >/dev/null || { echo "otelcol-k8s: go is required" >&2; exit 1; }
if ! cache_begin otelcol-k8s "$version" "$0"; then
  cache_go_env
  out="$CACHE_ENTRY"
  manifest="$out/builder.yaml"
  contrib=github.com/open-telemetry/opentelemetry-collector-contrib
  cat >"$manifest" <<EOF2
dist:
  name: otelcol
  description: OpenTelemetry Collector, the peer of Petrel's otel layout
  output_path: $out/build
receivers:
  - gomod: $contrib/receiver/filelogreceiver $version
processors:
  - gomod: $contrib/processor/k8sattributesprocessor $k8sattributes
exporters:
  - gomod: $contrib/exporter/fileexporter $version
replaces:
  - $contrib/extension/encoding/otlpencodingextension => $contrib/extension/encoding/otlpencodingextension v0.161.0
  - $contrib/internal/kubelet => $contrib/internal/kubelet v0.165.0
EOF2
  builder="$GOPATH/bin/builder-$version"
  if [ ! -x "$builder" ]; then
    GOBIN="$out/tools" go install "go.opentelemetry.io/collector/cmd/builder@$version"
    mkdir -p "$GOPATH/bin"
    mv "$out/tools/builder" "$builder"
    rm -rf "$out/tools"
  fi
  # Sources only: the builder's `go mod tidy` would also fetch what the
  # components' own tests import, some of which the proxy refuses. The
  # module is written here, the collector's modules at the versions of
  # that release (v1.71.0 for the stable ones), and `go build -mod=mod`
  # fetches only what the binary imports.
  nice "$builder" --config="$manifest" --skip-get-modules --skip-compilation
  col=go.opentelemetry.io/collector
  cat >"$out/build/go.mod" <<EOF2
module petrel.test/otelcol-k8s

go 1.25.0

require (
	$contrib/receiver/filelogreceiver $version
	$contrib/processor/k8sattributesprocessor $k8sattributes
	$contrib/exporter/fileexporter $version
	$col/component v1.71.0
	$col/confmap v1.71.0
	$col/confmap/provider/envprovider v1.71.0
	$col/confmap/provider/fileprovider v1.71.0
	$col/confmap/provider/httpprovider v1.71.0
	$col/confmap/provider/httpsprovider v1.71.0
	$col/confmap/provider/yamlprovider v1.71.0
	$col/connector v0.165.0
	$col/exporter v1.71.0
	$col/extension v1.71.0
	$col/otelcol v0.165.0
	$col/processor v1.71.0
	$col/receiver v1.71.0
	$col/service v0.165.0
)

replace $contrib/extension/encoding/otlpencodingextension => $contrib/extension/encoding/otlpencodingextension v0.161.0

replace $contrib/internal/kubelet => $contrib/internal/kubelet v0.165.0
EOF2
  (cd "$out/build" && GOFLAGS="$GOFLAGS -mod=mod" nice go build -trimpath -o otelcol .)
  cp "$out/build/otelcol" "$out/otelcol"
  rm -rf "$out/build"
  cache_done
fi
cache_link "$root" otelcol-k8s
echo "$root/.cache/otelcol-k8s/otelcol"
