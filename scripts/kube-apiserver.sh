#!/usr/bin/env bash
# Builds kube-apiserver v1.34.4 (Apache-2.0) from the Go module proxy into
# the test cache (scripts/lib/cache.sh), linked from .cache/kube-apiserver
# (the tests run .cache/kube-apiserver/bin/kube-apiserver), and installs etcd (Debian's etcd-server) when
# missing: the kubernetes_api tests run both on 127.0.0.1.
#
# `go install k8s.io/kubernetes/cmd/kube-apiserver@...` cannot work: the
# module's go.mod `replace`s its staging modules (k8s.io/api, k8s.io/apiserver,
# ...) by relative paths (./staging/src/...), which the module zip does not
# carry. So the module is copied, those replace lines (and any go.work) are
# dropped, the staging modules are required at their published v0.34.4, and
# the server is built from the copy (about 10 minutes on 2 cores, under nice).
# Idempotent: an entry of the same version and recipe is used as it is.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
k8s_version=v1.34.4
staging_version=v0.34.4

if ! command -v etcd >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "kube-apiserver: the kubernetes_api tests need etcd (etcd-server); run as root or install it" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server
fi

if cache_begin kube-apiserver "$k8s_version" "$0"; then
    cache_link "$root" kube-apiserver
    exit 0
fi
dir="$CACHE_ENTRY"
bin="$dir/bin/kube-apiserver"
command -v go >/dev/null || { echo "kube-apiserver: go (1.24 or newer) is required" >&2; exit 1; }
cache_go_env
export GOTOOLCHAIN=local

mod_dir="$(go mod download -json "k8s.io/kubernetes@$k8s_version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
src="$dir/src"
rm -rf "$src"
mkdir -p "$dir/bin"
cp -r "$mod_dir" "$src"
chmod -R u+w "$src"
# The vendor/ tree was made for the replaced staging paths: build from the
# module cache instead (-mod=mod), which also records the new go.sum lines.
rm -rf "$src/go.work" "$src/go.work.sum" "$src/vendor"
cd "$src"
# Drop the `k8s.io/x => ./staging/src/k8s.io/x` lines and require every
# staging module at its published version instead of v0.0.0.
python3 - "$staging_version" <<'EOF'
import re, sys
version = sys.argv[1]
text = open("go.mod").read()
text = "\n".join(l for l in text.split("\n") if "=> ./staging/" not in l)
text = re.sub(r"(?m)^(\s*(?:require\s+)?k8s\.io/[A-Za-z0-9._/-]+) v0\.0\.0(?=\s|$)", lambda m: m.group(1) + " " + version, text)
# An empty replace ( ) block is valid go.mod, nothing else to tidy.
open("go.mod", "w").write(text)
EOF
nice -n 10 go build -mod=mod -o "$bin.tmp" ./cmd/kube-apiserver
mv "$bin.tmp" "$bin"
cd "$root"
rm -rf "$src"
"$bin" --version
cache_done
cache_link "$root" kube-apiserver
