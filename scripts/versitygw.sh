#!/usr/bin/env bash
# Builds Versity's S3 gateway v1.8.0 (Apache-2.0) with `go install` into
# .cache/versitygw/bin: an S3 API (SigV4, multipart uploads, ListObjectsV2)
# over a POSIX directory, root keys from its command line. The s3 sink
# tests run it on loopback. Go's module and build caches stay under
# .cache/go so nothing is cached outside the repository. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.cache/versitygw/bin/versitygw"
if [ -x "$bin" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "versitygw: go (1.24 or newer) is required" >&2; exit 1; }
export GOPATH="$root/.cache/go" GOMODCACHE="$root/.cache/go/mod" GOCACHE="$root/.cache/go/build"
export GOFLAGS=-buildvcs=false GOBIN="$root/.cache/versitygw/bin"
mkdir -p "$GOBIN"
go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
"$bin" --version
