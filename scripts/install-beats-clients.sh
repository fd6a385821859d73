#!/usr/bin/env bash
# Builds the Lumberjack v2 client the `beats` source's tests
# (crates/petrel/tests/beats.rs) and bench/beats.py drive: `tst-send` from
# github.com/elastic/go-lumber, Elastic's own Lumberjack v2 library (the one
# Filebeat's and Logstash forwarders' `logstash` output uses), with
# `go install` into the test cache (scripts/lib/cache.sh), linked from
# .cache/beats-clients. Idempotent.
#
#   scripts/install-beats-clients.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
cache_go_install "$root" beats-clients v0.2.0 github.com/elastic/go-lumber/cmd/tst-send "$0"
echo "tst-send (go-lumber v0.2.0): $root/.cache/beats-clients/bin/tst-send"
