#!/usr/bin/env bash
# filebeat.sh — builds Filebeat v7.17.29, the peer of the `ecs` metadata
# layout (crates/petrel/tests/layouts.rs), into the test cache
# (scripts/lib/cache.sh: $PETREL_TEST_CACHE/filebeat-<version>) and prints
# the binary's path. The Go module proxy serves github.com/elastic/beats/v7
# up to 7.17 (8.x and 9.x are refused, 403): the module is downloaded,
# copied out of the read-only module cache, and `./filebeat` is built
# inside it with GOFLAGS=-mod=mod (its go.mod's replace lines are kept).
# About 2 minutes on 2 cores once the modules are in the Go cache.
#
#   scripts/peers/filebeat.sh            build (once); prints the binary
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v7.17.29
command -v go >/dev/null || { echo "filebeat: go is required" >&2; exit 1; }
if ! cache_begin filebeat "$version" "$0"; then
  cache_go_env
  out="$CACHE_ENTRY"
  dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/elastic/beats/v7@$version" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp -r "$dir" "$out/src"
  chmod -R u+w "$out/src"
  (cd "$out/src" && GOFLAGS="$GOFLAGS -mod=mod" nice go build -o "$out/filebeat.tmp" ./filebeat)
  mv "$out/filebeat.tmp" "$out/filebeat"
  rm -rf "$out/src"
  cache_done
fi
cache_link "$root" filebeat
echo "$root/.cache/filebeat/filebeat"
