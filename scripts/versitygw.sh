#!/usr/bin/env bash
# Builds Versity's S3 gateway v1.8.0 (Apache-2.0) with `go install` into
# the test cache (scripts/lib/cache.sh), linked from .cache/versitygw: an
# S3 API (SigV4, multipart uploads, ListObjectsV2) over a POSIX directory,
# root keys from its command line. The s3 sink tests run
# .cache/versitygw/bin/versitygw on loopback. Idempotent: a cache entry of
# the same version and recipe is used as it is.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v1.8.0
if ! cache_begin versitygw "$version" "$0"; then
  command -v go >/dev/null || { echo "versitygw: go (1.24 or newer) is required" >&2; exit 1; }
  cache_go_env
  GOBIN="$CACHE_ENTRY/bin" go install "github.com/versity/versitygw/cmd/versitygw@$version"
  cache_done
fi
cache_link "$root" versitygw
"$CACHE_ENTRY/bin/versitygw" --version
