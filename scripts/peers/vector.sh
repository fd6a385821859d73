#!/usr/bin/env bash
# vector.sh — builds Vector v0.57.0, a peer of the headline benchmark
# (bench/headline.sh), from source snapshots, into the test cache
# (scripts/lib/cache.sh: $PETREL_TEST_CACHE/vector-v0.57.0), and prints the
# binary's path. Only the components the benchmark uses are built: the file
# source, the remap transform, the file and blackhole sinks, and jemalloc
# (the allocator of Vector's released binaries, a default feature).
#
# Why from snapshots: this machine reaches crates.io but not GitHub, and
# Vector's Cargo.lock names five git repositories (Vector itself,
# tokio-rs/tracing for tracing-tower, vectordotdev/vrl, vectordotdev/heim,
# MSxDOS/ntapi). The snapshots come from the agent's fetch mirror
# (/work/.mirror/<owner>+<name>/repo, bare git dirs); CI never runs this
# script. Each is cloned (bare) into the cache entry and cargo is pointed at
# the clones with url.<clone>.insteadOf in a temporary global git config.
# heim's locked commit (branch update-deps) is not in its snapshot: the
# clone gets an update-deps branch at master and `cargo update -p heim`
# moves the lock onto it (heim is only compiled for host metrics, which
# this build leaves out; cargo still resolves it).
#
#   VECTOR_SRC=/work/.mirror/vectordotdev+vector/repo \
#   VECTOR_TRACING_GIT=/work/.mirror/tokio-rs+tracing/repo \
#   VECTOR_VRL_GIT=/work/.mirror/vectordotdev+vrl/repo \
#   VECTOR_HEIM_GIT=/work/.mirror/vectordotdev+heim/repo \
#   VECTOR_NTAPI_GIT=/work/.mirror/MSxDOS+ntapi/repo \
#     scripts/peers/vector.sh
#
# VECTOR_SRC is a git dir (the tag v0.57.0 is exported) or a source tree.
# The build takes ~26 min on 2 cores (no LTO, 16 codegen units, niced);
# the cargo target directory stays in the entry (so does a half-done build,
# resumed by the next run: the entry is only marked complete at the end).
# Needs protoc (Debian: protobuf-compiler), a C compiler, git.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=v0.57.0
src=${VECTOR_SRC:?VECTOR_SRC: Vector source (git dir or tree)}
command -v protoc >/dev/null || { echo "vector: protoc is required (apt-get install protobuf-compiler)" >&2; exit 1; }

# A build that did not finish keeps its entry (same recipe, no .complete)
# and resumes where it stopped.
if ! CACHE_KEEP_PARTIAL=1 cache_begin vector "$version" "$0"; then
  touch "$CACHE_ENTRY/.building"
  out="$CACHE_ENTRY"
  # Sources.
  if [ ! -f "$out/src/Cargo.toml" ]; then
    rm -rf "$out/src" && mkdir -p "$out/src"
    if [ -f "$src/Cargo.toml" ]; then
      cp -a "$src/." "$out/src/"
    else
      git --git-dir="$src" archive "$version" | tar -x -C "$out/src"
    fi
  fi
  # Local bare clones of the git dependencies, and the URL rewrites.
  gitcfg="$out/gitconfig"
  : >"$gitcfg"
  dep() { # dep NAME ENVVAR URL
    local name=$1 from=${!2:?$2: snapshot of $3} url=$3
    if [ ! -d "$out/git/$name.git" ]; then
      git clone -q --mirror "$from" "$out/git/$name.git"
    fi
    git config -f "$gitcfg" --add "url.file://$out/git/$name.git.insteadOf" "$url"
  }
  dep tracing VECTOR_TRACING_GIT https://github.com/tokio-rs/tracing
  dep vrl VECTOR_VRL_GIT https://github.com/vectordotdev/vrl.git
  dep heim VECTOR_HEIM_GIT https://github.com/vectordotdev/heim.git
  dep ntapi VECTOR_NTAPI_GIT https://github.com/MSxDOS/ntapi.git
  git --git-dir="$out/git/heim.git" rev-parse -q --verify refs/heads/update-deps >/dev/null ||
    git --git-dir="$out/git/heim.git" branch update-deps master
  git config -f "$gitcfg" protocol.file.allow always
  export GIT_CONFIG_GLOBAL="$gitcfg" CARGO_NET_GIT_FETCH_WITH_CLI=true
  export RUSTUP_TOOLCHAIN=stable RUSTFLAGS=--cap-lints=warn
  export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
  export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} CARGO_TARGET_DIR="$out/target"
  export PROTOC=${PROTOC:-$(command -v protoc)}
  cd "$out/src"
  heim_rev=$(sed -n 's|^source = "git+https://github.com/vectordotdev/heim.git?branch=update-deps#||p' Cargo.lock | sed 's/"$//' | head -1)
  if ! git --git-dir="$out/git/heim.git" cat-file -e "$heim_rev^{commit}" 2>/dev/null; then
    cargo update -p heim
  fi
  nice -n 19 cargo build --release --no-default-features \
    --features sources-file,transforms-remap,sinks-file,sinks-blackhole,tikv-jemallocator
  cp "$out/target/release/vector" "$out/vector"
  # Keep the entry small: the target directory is 10+ GB.
  rm -rf "$out/target" "$out/src" "$out/git"
  rm -f "$out/.building"
  cache_done
fi
cache_link "$root" vector
echo "$root/.cache/vector/vector"
