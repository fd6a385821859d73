# shellcheck shell=bash
# cache.sh — sourced by the scripts that build or download what the tests
# run (servers, clients, tools): one cache outside the clone, so a fresh
# clone on a machine that ran the tests before builds nothing again.
#
#   $PETREL_TEST_CACHE (default ~/.cache/petrel-test)
#     <name>-<version>/<recipe>/  one built server or tool; <recipe> is a
#                             hash of the script that builds it and the
#                             files it names (a pom, sources), so clones
#                             whose recipes differ (a branch changing a
#                             pom) each have their own build and never
#                             remove each other's; complete when its
#                             .complete stamp is there
#     go/{mod,build}          Go's module and build caches (all Go builds)
#     m2/                     Maven's repository (Kafka, OpenSearch)
#     cargo-target/           the Rust target directory of scripts/test.sh
#     cargo-target-fuzz/      the fuzz crates' target directory
#     cargo-tools/            mdbook and other `cargo install`ed tools
#     locks/                  one flock per entry (two clones at once)
#
# An entry is used only when its version (in its name) and its recipe
# match; otherwise it is built from nothing. A recipe not used for 14 days
# is removed when another of the same name and version is used. The
# clone's .cache/<name> is a symlink to the entry in use, so the tests
# find it where they always did. `rm -rf ~/.cache/petrel-test` (or one
# entry) clears it.

PETREL_TEST_CACHE=${PETREL_TEST_CACHE:-${HOME:?}/.cache/petrel-test}
export PETREL_TEST_CACHE

# cache_begin NAME VERSION RECIPE_FILE...
#   Sets CACHE_ENTRY (the entry's directory) and CACHE_STAMP; takes the
#   entry's lock (held until cache_link, or the script's exit). Returns 0
#   when the entry is complete (nothing to build), 1 when it must be built:
#   it is then emptied, unless CACHE_KEEP_PARTIAL=1 (a long build that
#   resumes where an interrupted one of the same recipe stopped).
cache_begin() {
  local name=$1 version=$2 old
  shift 2
  CACHE_STAMP=$(cat "$@" | sha256sum | cut -c1-16)
  CACHE_ENTRY="$PETREL_TEST_CACHE/$name-$version/$CACHE_STAMP"
  mkdir -p "$PETREL_TEST_CACHE/locks" "$CACHE_ENTRY"
  # One fd per entry: its lock is released by cache_link, or when the
  # script exits, whatever the outcome.
  exec {CACHE_LOCK_FD}>"$PETREL_TEST_CACHE/locks/$name-$version-$CACHE_STAMP"
  flock "$CACHE_LOCK_FD"
  touch "$CACHE_ENTRY/.used"
  # Other recipes of this name and version, unused for 14 days.
  for old in "$PETREL_TEST_CACHE/$name-$version"/*/; do
    [ "${old%/}" = "$CACHE_ENTRY" ] && continue
    if [ -f "$old/.used" ] && [ -n "$(find "$old/.used" -mtime +14 2>/dev/null)" ]; then
      rm -rf "$old"
    fi
  done
  if [ -f "$CACHE_ENTRY/.complete" ]; then
    return 0
  fi
  if [ "${CACHE_KEEP_PARTIAL:-}" != 1 ]; then
    find "$CACHE_ENTRY" -mindepth 1 -maxdepth 1 ! -name .used -exec rm -rf {} +
  fi
  return 1
}

# cache_done: marks CACHE_ENTRY complete.
cache_done() {
  touch "$CACHE_ENTRY/.complete"
}

# cache_link ROOT NAME: ROOT/.cache/NAME -> CACHE_ENTRY (replacing what
# was there: a directory of an older layout, or a link to another version).
cache_link() {
  local root=$1 name=$2
  mkdir -p "$root/.cache"
  if [ -e "$root/.cache/$name" ] && [ ! -L "$root/.cache/$name" ]; then
    rm -rf "$root/.cache/$name"
  fi
  ln -sfn "$CACHE_ENTRY" "$root/.cache/$name"
  # Built and linked: let other clones in (and keep the lock out of a
  # server this script may exec).
  if [ -n "${CACHE_LOCK_FD:-}" ]; then
    exec {CACHE_LOCK_FD}>&-
    CACHE_LOCK_FD=
  fi
}

# cache_go_env: Go's module and build caches in the shared cache (both are
# keyed by content, so every Go build may share them).
cache_go_env() {
  export GOPATH="$PETREL_TEST_CACHE/go" GOMODCACHE="$PETREL_TEST_CACHE/go/mod"
  export GOCACHE="$PETREL_TEST_CACHE/go/build" GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false -modcacherw"
}

# cache_go_install ROOT NAME VERSION PACKAGE RECIPE_FILE...: `go install
# PACKAGE@VERSION` into the entry NAME-VERSION's bin/ (once per version and
# recipe), linked from ROOT/.cache/NAME.
cache_go_install() {
  local root=$1 name=$2 version=$3 pkg=$4
  shift 4
  if ! cache_begin "$name" "$version" "$@"; then
    command -v go >/dev/null || { echo "$name: go (1.24 or newer) is required" >&2; return 1; }
    cache_go_env
    GOBIN="$CACHE_ENTRY/bin" go install "$pkg@$version"
    cache_done
  fi
  cache_link "$root" "$name"
}
