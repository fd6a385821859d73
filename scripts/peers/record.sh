#!/usr/bin/env bash
# record.sh — records the golden files of a peer agent whose build does not
# fit the test command's budget, for crates/petrel/tests/layouts.rs to
# compare Petrel's output against: the peer runs on the same inputs, with
# the same pods in the test's kube-apiserver, and what it writes is kept
# in crates/petrel/tests/data/layouts/<peer>-<version>.json, stamped with
# the version. Run it again whenever the test's inputs or the peer's
# version change (the test names the file it reads).
#
#   scripts/peers/record.sh fluent-bit
#
# fluent-bit: Fluent Bit built from its source snapshot (the agent's fetch
# mirror, or FLUENT_BIT_SRC: a git dir or a source tree with
# FLUENT_BIT_VERSION) with the tail input, the kubernetes filter and the
# file output, into the test cache (scripts/lib/cache.sh:
# fluent-bit-kubernetes-<version>; scripts/peers/fluent-bit.sh builds the
# benchmark's, which has no kubernetes filter). About 15 min on 2 cores.
# Needs cmake, a C compiler, flex, bison, libyaml-dev, libssl-dev,
# libsqlite3-dev, pkg-config, and what the kubernetes_api tests need
# (scripts/kube-apiserver.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
peer=${1:?usage: scripts/peers/record.sh fluent-bit}
case "$peer" in
  fluent-bit) ;;
  *) echo "record.sh: unknown peer '$peer' (fluent-bit)" >&2; exit 2 ;;
esac
src=${FLUENT_BIT_SRC:-/work/.mirror/fluent+fluent-bit/repo}
version=${FLUENT_BIT_VERSION:-v5.1.1}
for tool in cmake flex bison pkg-config cc make; do
  command -v "$tool" >/dev/null || { echo "record.sh: $tool is required" >&2; exit 1; }
done
if ! cache_begin fluent-bit-kubernetes "$version" "$0"; then
  out="$CACHE_ENTRY"
  mkdir -p "$out/src" "$out/build"
  if [ -f "$src/CMakeLists.txt" ]; then
    cp -a "$src/." "$out/src/"
  else
    # The mirror's snapshots leave out their largest blobs (the SQLite
    # amalgamation): checked out through a scratch index without them;
    # SQLite comes from the system (FLB_PREFER_SYSTEM_LIB_SQLITE).
    export GIT_INDEX_FILE="$out/index"
    git --git-dir="$src" read-tree "$version"
    git --git-dir="$src" ls-files -s | awk '{print $2}' |
      git --git-dir="$src" cat-file --batch-check='%(objectname) %(objecttype)' 2>/dev/null |
      awk '$2 == "missing" {print $1}' >"$out/missing" || true
    git --git-dir="$src" ls-files -s | awk -F'\t' 'NR==FNR {m[$1]; next} {split($1, a, " ")} (a[2] in m) {print $2}' \
      "$out/missing" - | while read -r path; do
        git --git-dir="$src" update-index --force-remove "$path"
      done
    git --git-dir="$src" --work-tree="$out/src" checkout-index -a -f
    unset GIT_INDEX_FILE
    rm -f "$out/index" "$out/missing"
  fi
  # Only what the recording runs: tail, the CRI parser (core), the
  # kubernetes filter (HTTP client and TLS to the API server), the file
  # output.
  cmake -S "$out/src" -B "$out/build" \
    -DCMAKE_BUILD_TYPE=Release -DFLB_RELEASE=On -DFLB_DEBUG=Off \
    -DFLB_JEMALLOC=Off -DFLB_TLS=On -DFLB_MINIMAL=On \
    -DFLB_IN_TAIL=On -DFLB_FILTER_KUBERNETES=On -DFLB_OUT_FILE=On -DFLB_OUT_STDOUT=On \
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
  cache_done
fi
cache_link "$root" fluent-bit-kubernetes
bin="$root/.cache/fluent-bit-kubernetes/fluent-bit"
"$root/scripts/kube-apiserver.sh" >/dev/null
# The recording is a test of the layouts suite that runs only when asked
# (ignored otherwise): the same scenario as the comparison, with Fluent
# Bit in Petrel's place; it writes the golden file.
cd "$root"
PETREL_RECORD_FLUENT_BIT="$bin" PETREL_RECORD_VERSION="$version" \
  cargo test --profile ci -p petrel --test layouts record_fluent_bit -- --ignored --exact
echo "recorded crates/petrel/tests/data/layouts/fluent-bit-$version.json"
