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
cache_go_install "$root" versitygw v1.8.0 github.com/versity/versitygw/cmd/versitygw "$0"
"$root/.cache/versitygw/bin/versitygw" --version
