#!/usr/bin/env bash
# Builds the single-node OpenSearch 2.19.6 the elasticsearch sink's tests
# run (scripts/opensearch/: a Maven project embedding the server) into
# .cache/opensearch/lib, with Maven's repository in .cache/m2 so nothing is
# cached outside the repository. Idempotent.
#
#   scripts/opensearch.sh            build (once)
#   scripts/opensearch.sh start DIR [PORT] [key=value ...]
#                                    run a node in the foreground, data in DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.cache/opensearch"
lib="$out/lib"
src="$root/scripts/opensearch"
# The jar's content depends on these files: a changed one rebuilds it.
stamp="$(cat "$src/pom.xml" "$src"/src/main/java/dev/petrel/opensearch/*.java | sha256sum | cut -c1-16)"
if [ ! -f "$lib/.complete-$stamp" ]; then
  command -v mvn >/dev/null || { echo "opensearch: mvn (Apache Maven) is required" >&2; exit 1; }
  command -v java >/dev/null || { echo "opensearch: java 17 is required" >&2; exit 1; }
  rm -rf "$lib" "$out/build"
  mkdir -p "$lib" "$out/build"
  cp -r "$src/pom.xml" "$src/src" "$out/build/"
  mvn -q -B -f "$out/build/pom.xml" -Dmaven.repo.local="$root/.cache/m2" \
    package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib"
  cp "$out/build/target/petrel-test-opensearch-1.jar" "$lib/"
  touch "$lib/.complete-$stamp"
  echo "opensearch: $(ls "$lib" | wc -l) jars in $lib"
fi
if [ "${1:-}" = start ]; then
  shift
  dir="${1:?usage: opensearch.sh start DIR [PORT] [key=value ...]}"
  shift
  port="${1:-9200}"
  [ $# -gt 0 ] && shift
  exec java -Xms1g -Xmx1g -XX:+UseSerialGC -cp "$lib/*" dev.petrel.opensearch.TestNode "$dir" "$port" "$@"
fi
