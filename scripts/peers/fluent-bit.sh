#!/usr/bin/env bash
# fluent-bit.sh — builds Fluent Bit, a peer of the headline benchmark
# (bench/headline.sh), from a source snapshot into the test cache
# (scripts/lib/cache.sh: $PETREL_TEST_CACHE/fluent-bit-<version>), and
# prints the binary's path. A release build (-DFLB_RELEASE=On: -O2, as the
# project's packages) with only what the benchmark uses: the tail, dummy,
# tcp and syslog inputs, the parser filter, the file, null and stdout
# outputs; the regex and JSON parsers and multiline are part of the core.
#
# The snapshot comes from the agent's fetch mirror
# (/work/.mirror/fluent+fluent-bit/repo, a bare git dir); this machine
# cannot reach GitHub, and CI never runs this script.
#
#   FLUENT_BIT_SRC=/work/.mirror/fluent+fluent-bit/repo scripts/peers/fluent-bit.sh
#   FLUENT_BIT_SRC=~/src/fluent-bit FLUENT_BIT_VERSION=v5.1.1 scripts/peers/fluent-bit.sh
#
# FLUENT_BIT_SRC is a git dir (its newest v4/v5 release tag is exported,
# or FLUENT_BIT_VERSION) or a source tree (FLUENT_BIT_VERSION names it).
# Needs cmake, a C compiler, flex, bison, libyaml-dev, libssl-dev,
# libsqlite3-dev, pkg-config (Debian packages). ~15 min on 2 cores, niced;
# a build that failed or was stopped resumes where it was.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
src=${FLUENT_BIT_SRC:?FLUENT_BIT_SRC: Fluent Bit source (git dir or tree)}
if [ -f "$src/CMakeLists.txt" ]; then
  version=${FLUENT_BIT_VERSION:?FLUENT_BIT_VERSION: the version of the source tree}
else
  version=${FLUENT_BIT_VERSION:-$(git --git-dir="$src" tag --list 'v[45].*' --sort=-v:refname |
    grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | head -1)}
fi
for tool in cmake flex bison pkg-config cc make; do
  command -v "$tool" >/dev/null || { echo "fluent-bit: $tool is required" >&2; exit 1; }
done
# The source tree into $1/src.
extract_source() {
  local out=$1
  rm -rf "$out/src" "$out/build"
  mkdir -p "$out/src" "$out/build"
  if [ -f "$src/CMakeLists.txt" ]; then
    cp -a "$src/." "$out/src/"
  else
    # The mirror's snapshots leave out their largest blobs (here the SQLite
    # amalgamation, lib/sqlite-amalgamation-*/sqlite3.c): the tree is
    # checked out through a scratch index without the blobs that are
    # missing, and SQLite comes from the system (libsqlite3-dev,
    # FLB_PREFER_SYSTEM_LIB_SQLITE below).
    export GIT_INDEX_FILE="$out/index"
    git --git-dir="$src" read-tree "$version"
    git --git-dir="$src" ls-files -s | awk '{print $2}' |
      git --git-dir="$src" cat-file --batch-check='%(objectname) %(objecttype)' 2>/dev/null |
      awk '$2 == "missing" {print $1}' >"$out/missing" || true
    git --git-dir="$src" ls-files -s | awk -F'\t' 'NR==FNR {m[$1]; next} {split($1, a, " ")} (a[2] in m) {print $2}' \
      "$out/missing" - | while read -r path; do
        echo "fluent-bit: $path is not in the snapshot, left out" >&2
        git --git-dir="$src" update-index --force-remove "$path"
      done
    git --git-dir="$src" --work-tree="$out/src" checkout-index -a -f
    unset GIT_INDEX_FILE
    rm -f "$out/index" "$out/missing"
  fi
  touch "$out/.src-done"
}
# A build that did not finish keeps its entry (same recipe, no .complete)
# and resumes where it stopped.
if ! CACHE_KEEP_PARTIAL=1 cache_begin fluent-bit "$version" "$0"; then
  out="$CACHE_ENTRY"
  touch "$out/.building"
  [ -f "$out/.src-done" ] || extract_source "$out"
  # FLB_MINIMAL turns every plugin off; the ones the benchmark runs are
  # turned back on. Off as well, because they do not build here or are not
  # measured: WASM (its runtime needs its own toolchain setup), LuaJIT
  # (scripting, unused), Kafka (librdkafka, unused), Zig and Go plugin
  # proxies (no zig here, unused), the shared library, examples and tests.
  # The HTTP server stays on (as in the image): with it off, v5.1.1 builds
  # only Monkey's core, whose generated mk_core_info.h is then not on the
  # include path and the build fails.
  cmake -S "$out/src" -B "$out/build" \
    -DCMAKE_BUILD_TYPE=Release -DFLB_RELEASE=On -DFLB_DEBUG=Off \
    -DFLB_SIMD=On -DFLB_JEMALLOC=On -DFLB_TLS=On -DFLB_MINIMAL=On \
    -DFLB_IN_TAIL=On -DFLB_IN_DUMMY=On -DFLB_IN_TCP=On -DFLB_IN_SYSLOG=On \
    -DFLB_FILTER_PARSER=On \
    -DFLB_OUT_FILE=On -DFLB_OUT_NULL=On -DFLB_OUT_STDOUT=On \
    -DFLB_REGEX=On -DFLB_PARSER=On -DFLB_INOTIFY=On -DFLB_SQLDB=On \
    -DFLB_PREFER_SYSTEM_LIB_SQLITE=On \
    -DFLB_WASM=Off -DFLB_LUAJIT=Off -DFLB_KAFKA=Off -DFLB_ZIG=Off \
    -DFLB_PROXY_GO=Off -DFLB_SHARED_LIB=Off -DFLB_EXAMPLES=Off \
    -DFLB_TESTS_RUNTIME=Off -DFLB_TESTS_INTERNAL=Off \
    -DFLB_HTTP_SERVER=On -DFLB_STREAM_PROCESSOR=Off \
    >"$out/cmake.log"
  nice -n 19 make -C "$out/build" -j2 fluent-bit-bin >"$out/make.log"
  cp "$out/build/bin/fluent-bit" "$out/fluent-bit"
  rm -rf "$out/src" "$out/build"
  rm -f "$out/.building" "$out/.src-done"
  cache_done
fi
cache_link "$root" fluent-bit
echo "$root/.cache/fluent-bit/fluent-bit"
