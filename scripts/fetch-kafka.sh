#!/usr/bin/env bash
# Fetches the Apache Kafka broker jars (see scripts/kafka/pom.xml) from Maven
# Central into .cache/kafka/lib, with Maven's own repository kept in
# .cache/m2 so nothing is cached outside the repository. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/.cache/kafka/lib"
if [ -f "$lib/.complete" ]; then
  exit 0
fi
command -v mvn >/dev/null || { echo "fetch-kafka: mvn (Apache Maven) is required" >&2; exit 1; }
command -v java >/dev/null || { echo "fetch-kafka: java (17 or newer) is required" >&2; exit 1; }
rm -rf "$lib"
mkdir -p "$lib"
mvn -q -B -f "$root/scripts/kafka/pom.xml" \
  -Dmaven.repo.local="$root/.cache/m2" \
  dependency:copy-dependencies -DoutputDirectory="$lib"
ls "$lib"/kafka_2.13-*.jar >/dev/null
touch "$lib/.complete"
echo "fetch-kafka: $(ls "$lib" | wc -l) jars in $lib"
