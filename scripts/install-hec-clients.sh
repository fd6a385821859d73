#!/usr/bin/env bash
# Installs the Splunk HEC client the splunk_hec source tests and
# bench/hec.py drive: Splunk's own Node.js library `splunk-logging`
# (npm), into the test cache (scripts/lib/cache.sh), linked from
# .cache/hec-clients (the tests load .cache/hec-clients/node_modules). Node.js and npm come from
# apt when missing (needs root then). Idempotent: a second run with the
# same version does nothing.
#
#   scripts/install-hec-clients.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
splunk_logging=0.11.1
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "install-hec-clients.sh: the splunk_hec tests need node and npm; run as root or install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
if ! cache_begin hec-clients "$splunk_logging" "$0"; then
    out=$CACHE_ENTRY
    [ -f "$out/package.json" ] || echo '{"name":"petrel-hec-clients","private":true}' >"$out/package.json"
    npm install --prefix "$out" --no-audit --no-fund --loglevel=error "splunk-logging@$splunk_logging"
    cache_done
fi
cache_link "$root" hec-clients
out="$root/.cache/hec-clients"
node -e "require('$out/node_modules/splunk-logging'); console.log('splunk-logging $splunk_logging ready in $out')"
