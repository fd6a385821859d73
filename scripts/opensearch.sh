#!/usr/bin/env bash
# Builds the single-node OpenSearch 2.19.6 the elasticsearch sink's tests
# run (scripts/opensearch/: a Maven project embedding the server) into the
# test cache (scripts/lib/cache.sh; Maven's repository there too), linked
# from .cache/opensearch: the tests run .cache/opensearch/lib/*.
# Idempotent: an entry of the same version and recipe is used as it is.
#
#   scripts/opensearch.sh            build (once)
#   scripts/opensearch.sh start DIR [PORT] [key=value ...]
#                                    run a node in the foreground, data in DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=2.19.6
src="$root/scripts/opensearch"
grep -q "$version" "$src/pom.xml" ||
  { echo "opensearch: scripts/opensearch/pom.xml does not name $version: update both" >&2; exit 1; }
# The jar's content depends on the pom and the Java sources: a changed one
# rebuilds it.
if ! cache_begin opensearch "$version" "$0" "$src/pom.xml" "$src"/src/main/java/dev/petrel/opensearch/*.java; then
  command -v mvn >/dev/null || { echo "opensearch: mvn (Apache Maven) is required" >&2; exit 1; }
  command -v java >/dev/null || { echo "opensearch: java 17 is required" >&2; exit 1; }
  mkdir -p "$CACHE_ENTRY/lib" "$CACHE_ENTRY/build"
  cp -r "$src/pom.xml" "$src/src" "$CACHE_ENTRY/build/"
  mvn -q -B -f "$CACHE_ENTRY/build/pom.xml" -Dmaven.repo.local="$PETREL_TEST_CACHE/m2" \
    package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$CACHE_ENTRY/lib"
  cp "$CACHE_ENTRY/build/target/petrel-test-opensearch-1.jar" "$CACHE_ENTRY/lib/"
  rm -rf "$CACHE_ENTRY/build"
  cache_done
  echo "opensearch: $(ls "$CACHE_ENTRY/lib" | wc -l) jars in $CACHE_ENTRY/lib"
fi
cache_link "$root" opensearch
lib="$root/.cache/opensearch/lib"
if [ "${1:-}" = start ]; then
  shift
  dir="${1:?usage: opensearch.sh start DIR [PORT] [key=value ...]}"
  shift
  port="${1:-9200}"
  [ $# -gt 0 ] && shift
  exec java -Xms1g -Xmx1g -XX:+UseSerialGC -cp "$lib/*" dev.petrel.opensearch.TestNode "$dir" "$port" "$@"
fi
