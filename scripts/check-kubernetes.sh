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
#     pipelines' host paths agree; no RBAC;
#   - the real petrel binary: the DaemonSet's args parse, and
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
    fail "kustomization.yaml resources ($(echo $listed)) differ from the manifests present ($(echo $present))"
echo "$(grep -c '^kind:' "$work/built.yaml") objects from: $(echo $listed)"

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

step "consistency: mounts, args, probes, host paths of the pipelines, no RBAC"
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
