#!/usr/bin/env bash
# Fetches the Apache Kafka broker jars (see scripts/kafka/pom.xml) from Maven
# Central into the test cache (scripts/lib/cache.sh; Maven's own repository
# there too), linked from .cache/kafka: the tests run .cache/kafka/lib/*.
# Idempotent: an entry of the same version and recipe is used as it is.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
version=3.9.1
grep -q "<version>$version</version>" "$root/scripts/kafka/pom.xml" ||
  { echo "fetch-kafka: scripts/kafka/pom.xml does not name Kafka $version: update both" >&2; exit 1; }
if ! cache_begin kafka "$version" "$0" "$root/scripts/kafka/pom.xml"; then
  command -v mvn >/dev/null || { echo "fetch-kafka: mvn (Apache Maven) is required" >&2; exit 1; }
  command -v java >/dev/null || { echo "fetch-kafka: java (17 or newer) is required" >&2; exit 1; }
  mvn -q -B -f "$root/scripts/kafka/pom.xml" \
    -Dmaven.repo.local="$PETREL_TEST_CACHE/m2" \
    dependency:copy-dependencies -DoutputDirectory="$CACHE_ENTRY/lib"
  ls "$CACHE_ENTRY"/lib/kafka_2.13-*.jar >/dev/null
  cache_done
fi
cache_link "$root" kafka
echo "fetch-kafka: $(ls "$CACHE_ENTRY/lib" | wc -l) jars in $CACHE_ENTRY/lib"
