#!/usr/bin/env bash
# Validates deploy/kubernetes/ with real tools, and fails loudly:
#   - kubeconform (strict: unknown fields, wrong types, missing required
#     fields, duplicate keys) against JSON schemas generated from the
#     Kubernetes OpenAPI spec itself (api/openapi-spec/swagger.json of the
#     k8s.io/kubernetes module at each version in K8S_VERSIONS, converted by
#     scripts/check-kubernetes/openapi2jsonschema.py), on every manifest and
#     on what `kustomize build` makes of them;
#   - negative checks: every scripts/check-kubernetes/invalid/*.yaml must be
#     rejected, with the message its `# expect:` line names;
#   - scripts/check-kubernetes/consistency.py: mounts, args, probes and the
#     pipelines' host paths agree; no RBAC; the API server's checks the
#     schema cannot express for the fields used (hostPath types, volume and
#     port names, downward-API paths, selector);
#   - the real petrel binary: the DaemonSet's args parse; under the
#     DaemonSet's securityContext, emulated (uid 0 with no capability,
#     no_new_privs, read-only root; unshare + setpriv, needs root), it reads
#     root's logs and checkpoints, and cannot read another owner's log;
#     `petrel validate` accepts the ConfigMap's pipelines as the kubelet
#     mounts them (and rejects one with a misspelled source key).
# kubeconform and kustomize are built with `go install` from the Go module
# proxy, the OpenAPI spec comes from the same proxy (`go mod download`);
# all cached in .cache/kubernetes/ (git-ignored), so a rerun takes seconds.
# Needs go >= 1.26 (PATH or /usr/local/go/bin), python3 with PyYAML
# (python3-yaml, installed with apt when missing) and cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS

KUBECONFORM_VERSION=v0.8.0
KUSTOMIZE_VERSION=v5.7.1 # v5.8 needs go 1.27
# The oldest and the newest Kubernetes the manifests are meant for.
K8S_VERSIONS=(1.30.14 1.37.2)

cache=$root/.cache/kubernetes
here=$root/scripts/check-kubernetes
manifests=$root/deploy/kubernetes

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "check-kubernetes: FAILED: $*" >&2
    exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step "tools"
GO=$(command -v go || true)
[[ -n $GO ]] || GO=/usr/local/go/bin/go
[[ -x $GO ]] || fail "go not found (PATH or /usr/local/go/bin): needed to build kubeconform and kustomize"
PY=python3
if ! "$PY" -c 'import yaml' 2>/dev/null; then
    PY=/usr/bin/python3
    if ! "$PY" -c 'import yaml' 2>/dev/null; then
        [[ $(id -u) -eq 0 ]] || fail "python3 has no PyYAML; install python3-yaml"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-yaml
    fi
fi
mkdir -p "$cache/bin"
# A private Go module and build cache, removed once the tools are built
# (about 500 MB); no toolchain download (GOTOOLCHAIN=local).
goenv=(env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build"
    GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0)
go_install() { # $1 = binary name, $2 = package@version
    local bin=$cache/bin/$1-${2##*@}
    if [[ ! -x $bin ]]; then
        echo "go install $2"
        mkdir -p "$cache/go/bin-$1"
        "${goenv[@]}" GOBIN="$cache/go/bin-$1" "$GO" install "$2" ||
            fail "go install $2"
        mv "$cache/go/bin-$1/$1" "$bin"
    fi
    ln -sf "$(basename "$bin")" "$cache/bin/$1"
}
go_install kubeconform github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION
go_install kustomize sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION
kubeconform=$cache/bin/kubeconform
kustomize=$cache/bin/kustomize
echo "kubeconform $KUBECONFORM_VERSION, kustomize $("$kustomize" version), $("$GO" version)"

step "schemas from the Kubernetes OpenAPI spec (${K8S_VERSIONS[*]})"
# Regenerated when the converter changes (its hash is in the stamp).
conv_hash=$(sha256sum "$here/openapi2jsonschema.py" | cut -d' ' -f1)
for v in "${K8S_VERSIONS[@]}"; do
    dir=$cache/schemas/v$v
    if [[ $(cat "$dir/.stamp" 2>/dev/null) == "$conv_hash" ]]; then
        echo "v$v: cached ($(find "$dir" -name '*.json' | wc -l) kinds)"
        continue
    fi
    spec=$cache/openapi/v$v.json
    if [[ ! -s $spec ]]; then
        echo "go mod download k8s.io/kubernetes@v$v (for api/openapi-spec/swagger.json)"
        moddir=$(cd "$work" && "${goenv[@]}" "$GO" mod download -json "k8s.io/kubernetes@v$v" |
            "$PY" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') ||
            fail "go mod download k8s.io/kubernetes@v$v"
        mkdir -p "$cache/openapi"
        cp "$moddir/api/openapi-spec/swagger.json" "$spec.tmp"
        mv "$spec.tmp" "$spec"
    fi
    rm -rf "$dir"
    "$PY" "$here/openapi2jsonschema.py" "$spec" "$dir"
    echo "$conv_hash" >"$dir/.stamp"
done
rm -rf "$cache/go"

validate() { # files...: kubeconform against every version; prints its output
    local v rc=0
    for v in "${K8S_VERSIONS[@]}"; do
        "$kubeconform" -strict -summary -kubernetes-version "$v" \
            -schema-location "$cache/schemas/{{ .NormalizedKubernetesVersion }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
            "$@" || rc=1
    done
    return $rc
}

step "kustomize build deploy/kubernetes"
"$kustomize" build "$manifests" >"$work/built.yaml" || fail "kustomize build"
listed=$("$PY" -c 'import sys, yaml; print("\n".join(sorted(yaml.safe_load(open(sys.argv[1]))["resources"])))' \
    "$manifests/kustomization.yaml")
present=$(cd "$manifests" && find . -name '*.yaml' -o -name '*.yml' | sed 's|^\./||' | grep -vx kustomization.yaml | sort)
[[ $listed == "$present" ]] ||
    fail "kustomization.yaml resources (${listed//$'\n'/ }) differ from the manifests present (${present//$'\n'/ })"
echo "$(grep -c '^kind:' "$work/built.yaml") objects from: ${listed//$'\n'/ }"

step "kubeconform -strict: every manifest, and the kustomize output"
files=()
while IFS= read -r f; do files+=("$manifests/$f"); done <<<"$present"
cp "$work/built.yaml" "$work/kustomize-build.yaml"
validate "${files[@]}" "$work/kustomize-build.yaml" || fail "kubeconform rejected deploy/kubernetes (above)"

step "negative checks: each invalid manifest must be rejected, for its reason"
n=0
for f in "$here"/invalid/*.yaml; do
    want=$(sed -n 's/^# expect: //p' "$f")
    [[ -n $want ]] || fail "$f has no '# expect: ' line"
    if out=$(validate "$f" 2>&1); then
        echo "$out"
        fail "kubeconform accepted $f: the validator proves nothing"
    fi
    grep -qF -- "$want" <<<"$out" || {
        echo "$out"
        fail "kubeconform rejected $f, but not with '$want'"
    }
    echo "rejected as expected: ${f#"$root"/}: $want"
    n=$((n + 1))
done
((n >= 3)) || fail "only $n negative cases"

step "consistency: mounts, args, probes, host paths of the pipelines, no RBAC, what the schema cannot see"
"$PY" "$here/consistency.py" "$work/built.yaml" "$work"

step "the real agent: the DaemonSet's args and the ConfigMap's pipelines"
# Builds only when the binary is stale (after `cargo test --release` it is not).
cargo build --release --locked -p petrel
petrel=${CARGO_TARGET_DIR:-$root/target}/release/petrel
mapfile -t args <"$work/args"
# clap parses every flag and value before honouring a trailing --help:
# exit 0 means the agent accepts these args as they are.
"$petrel" "${args[@]}" --help >/dev/null || fail "petrel rejects the DaemonSet's args: ${args[*]}"
echo "args accepted: ${args[*]}"

step "the DaemonSet's securityContext, emulated: uid 0, no capability, read-only root"
# As the container runs (consistency.py checked the manifest says so):
# uid 0, every capability dropped, no_new_privs, the root file system
# read-only but the data dir. The agent must read root's 0640 logs in 0710
# directories (as kubelet and containerd leave them) and write its
# checkpoints; a 0600 log of another owner must stay unreadable, or the
# capabilities were not really dropped and the check proves nothing.
# (A file source: the permission checks are those of kubernetes_logs.)
[[ $(id -u) -eq 0 ]] || fail "this step needs root (unshare, setpriv)"
if ! command -v setpriv >/dev/null || ! command -v unshare >/dev/null; then
    fail "setpriv/unshare (util-linux) not found"
fi
sc=$work/sc
pod=$sc/pods/ns_pod_0000/c
mkdir -p "$pod" "$sc/data"
chmod 755 "$work" "$sc" "$sc/pods"
chmod 710 "$sc/pods/ns_pod_0000" "$pod"
echo "root-owned line" >"$pod/0.log"
chmod 640 "$pod/0.log"
echo "line of another owner" >"$pod/1.log"
chown 65534:65534 "$pod/1.log"
chmod 600 "$pod/1.log"
printf 'sources:\n  - type: file\n    include: ["%s/pods/*/*/*.log"]\n    read_from: beginning\nsinks:\n  - type: file\n    path: %s/data/out.log\n' \
    "$sc" "$sc" >"$sc/p.yaml"
# A private mount namespace: / read-only there only; the data dir is a
# writable bind mount, as the hostPath volume is.
# shellcheck disable=SC2016 # $1..$3 are the inner shell's arguments
unshare --mount --propagation private sh -c '
    mount --bind "$1" "$1" && mount -o remount,bind,ro / || exit 97
    exec setpriv --reuid=0 --regid=0 --clear-groups --inh-caps=-all --bounding-set=-all \
        --no-new-privs -- "$2" run --config "$3" --data-dir "$1" --api-addr 127.0.0.1:0 --no-watch-config
' sh "$sc/data" "$petrel" "$sc/p.yaml" 2>"$sc/agent.log" &
agent=$!
for ((i = 0; i < 300; i++)); do
    grep -q "root-owned line" "$sc/data/out.log" 2>/dev/null && grep -q "1.log.*Permission denied" "$sc/agent.log" && break
    kill -0 "$agent" 2>/dev/null || break
    sleep 0.1
done
kill -TERM "$agent" 2>/dev/null || true
rc=0
wait "$agent" || rc=$?
if ! grep -qx "root-owned line" "$sc/data/out.log" 2>/dev/null || [[ $rc -ne 0 ]] ||
    [[ ! -s $sc/data/checkpoints.json ]]; then
    cat "$sc/agent.log"
    fail "as uid 0 with no capability on a read-only root, the agent did not read root's log, write its checkpoints and exit 0 (rc $rc)"
fi
if grep -q "another owner" "$sc/data/out.log" || ! grep -q "1.log.*Permission denied" "$sc/agent.log"; then
    cat "$sc/agent.log"
    fail "the agent read a 0600 log of another owner: capabilities were not dropped, the check proves nothing"
fi
echo "read root's 0640 log in 0710 directories, checkpointed on a read-only root, exit 0; another owner's 0600 log refused"

step "petrel validate: the ConfigMap's pipelines"
# The ConfigMap as the kubelet mounts it (symlinks through ..data).
"$petrel" validate --config "$work/pipelines/" ||
    fail "petrel validate rejects the pipelines of deploy/kubernetes/configmap.yaml (above)"
# And a misspelled key of the source is caught (so the pass above means the
# keys are the ones the source knows).
mkdir "$work/bad"
sed 's/max_merged_line_bytes:/max_merged_line_byte:/' "$work/pipelines/kubernetes.yaml" >"$work/bad/kubernetes.yaml"
grep -q 'max_merged_line_byte:' "$work/bad/kubernetes.yaml" || fail "the negative pipeline was not made"
if out=$("$petrel" validate --config "$work/bad/" 2>&1); then
    fail "petrel validate accepted a misspelled key (max_merged_line_byte)"
fi
grep -qF 'max_merged_line_byte`' <<<"$out" || {
    echo "$out"
    fail "petrel validate rejected the misspelled key, but without naming it"
}
echo "misspelled key rejected: $out"

echo
echo "check-kubernetes: OK in $((SECONDS - start)) s"
