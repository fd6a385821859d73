#!/usr/bin/env bash
# Validates deploy/kubernetes/ with real tools, and fails loudly:
#   - kubeconform (strict: unknown fields, wrong types, missing required
#     fields, duplicate keys) against JSON schemas generated from the
#     Kubernetes OpenAPI spec itself (api/openapi-spec/swagger.json of the
#     k8s.io/kubernetes module at each version in K8S_VERSIONS, converted by
#     scripts/check-kubernetes/openapi2jsonschema.py), on every manifest and
#     on what `kustomize build` makes of them, and of the overlay
#     deploy/kubernetes-overlays/container-files (which must add hostPID, SYS_PTRACE and its
#     pipeline and change nothing else; `petrel validate` takes its pipelines);
#   - negative checks: every scripts/check-kubernetes/invalid/*.yaml must be
#     rejected, with the message its `# expect:` line names;
#   - scripts/check-kubernetes/consistency.py: mounts, args, probes and the
#     pipelines' host paths agree; the RBAC is the read-only metadata
#     ClusterRole and nothing more; the API server's checks the
#     schema cannot express for the fields used (hostPath types, volume and
#     port names, downward-API paths, selector);
#   - the real petrel binary: the DaemonSet's args parse; under the
#     DaemonSet's securityContext, emulated (uid 0 with no capability,
#     no_new_privs, read-only root; unshare + setpriv, needs root), it reads
#     root's logs and checkpoints, and cannot read another owner's log;
#     `petrel validate` accepts the ConfigMap's pipelines as the kubelet
#     mounts them (and rejects one with a misspelled source key);
#   - the Helm chart deploy/helm/petrel: `helm lint` (and --strict), `helm
#     template` with the default values, with containerFiles.enabled=true
#     and with scripts/check-kubernetes/helm/values-full.yaml, validated by
#     the same kubeconform; the defaults render deploy/kubernetes' DaemonSet
#     and ConfigMap (helm-same.py), consistency.py holds for the renders,
#     every scripts/check-kubernetes/helm/invalid/*.yaml values file is
#     rejected for its `# expect:` reason, and the agent accepts the
#     rendered args and pipelines (`petrel validate`); the API over TLS
#     with a token on /metrics (scripts/check-kubernetes/helm/values-api-tls.yaml):
#     Secret mounts without subPath (rotation), HTTPS probes, a
#     ServiceMonitor scraping over HTTPS with the token;
#   - deploy/kubernetes-overlays/api-tls: the same for the DaemonSet of
#     deploy/kubernetes (kustomize build, kubeconform, args accepted);
#   - the chart's mode aggregator: `helm lint --strict` and `helm template`
#     with --set mode=aggregator (a StatefulSet) and with
#     scripts/check-kubernetes/helm/values-aggregator.yaml (a Deployment,
#     every optional part on, the pipelines of deploy/aggregator/),
#     kubeconform -strict on both, scripts/check-kubernetes/aggregator.py
#     (non-root, no capability, no host path, data on an emptyDir, probes,
#     grace period, headless Service, PodDisruptionBudget), and the agent
#     accepts their args and pipelines (`petrel validate`).
# kubeconform, kustomize and helm are built with `go install` from the Go
# module proxy, the OpenAPI spec comes from the same proxy (`go mod download`);
# all cached in the test cache's kubernetes-tools/ (scripts/lib/cache.sh:
# binaries named by version, schemas stamped by the converter's hash), so a
# rerun, from any clone, takes seconds.
# Needs go >= 1.26 (PATH or /usr/local/go/bin), python3 with PyYAML
# (python3-yaml, installed with apt when missing) and cargo (not used when
# PETREL names an agent binary already built: PETREL=path/to/petrel).
# `--tools-only` builds the tools and stops (scripts/test.sh, early).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS

KUBECONFORM_VERSION=v0.8.0
KUSTOMIZE_VERSION=v5.7.1 # v5.8 needs go 1.27
HELM_VERSION=v3.22.0
# The oldest and the newest Kubernetes the manifests are meant for.
K8S_VERSIONS=(1.30.14 1.37.2)

. "$root/scripts/lib/cache.sh"
cache=$PETREL_TEST_CACHE/kubernetes-tools
here=$root/scripts/check-kubernetes
manifests=$root/deploy/kubernetes
chart=$root/deploy/helm/petrel

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
# The test cache's Go module and build caches; no toolchain download
# (GOTOOLCHAIN=local).
goenv=(env GOPATH="$PETREL_TEST_CACHE/go" GOMODCACHE="$PETREL_TEST_CACHE/go/mod" GOCACHE="$PETREL_TEST_CACHE/go/build"
    GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0)
go_install() { # $1 = binary name, $2 = package@version
    local bin=$cache/bin/$1-${2##*@}
    if [[ ! -x $bin ]]; then
        echo "go install $2"
        mkdir -p "$cache/gobin-$1"
        "${goenv[@]}" GOBIN="$cache/gobin-$1" "$GO" install "$2" ||
            fail "go install $2"
        mv "$cache/gobin-$1/$1" "$bin"
    fi
    ln -sf "$(basename "$bin")" "$cache/bin/$1"
}
go_install kubeconform github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION
go_install kustomize sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION
go_install helm helm.sh/helm/v3/cmd/helm@$HELM_VERSION
kubeconform=$cache/bin/kubeconform
kustomize=$cache/bin/kustomize
helm=$cache/bin/helm
echo "kubeconform $KUBECONFORM_VERSION, kustomize $("$kustomize" version), helm $("$helm" version --template '{{ .Version }}') ($HELM_VERSION), $("$GO" version)"
# `check-kubernetes.sh --tools-only`: build the tools (scripts/test.sh does
# this in the background while Rust compiles) and stop.
if [[ ${1:-} == --tools-only ]]; then
    exit 0
fi

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

step "consistency: mounts, args, probes, host paths of the pipelines, read-only RBAC, what the schema cannot see"
"$PY" "$here/consistency.py" "$work/built.yaml" "$work"

step "overlay deploy/kubernetes-overlays/container-files: kustomize build, kubeconform -strict, what it changes"
# (Beside the base, not inside it: kustomize refuses an overlay nested in
# the directory of its base.)
overlay=$root/deploy/kubernetes-overlays/container-files
"$kustomize" build "$overlay" >"$work/overlay-container-files.yaml" || fail "kustomize build ${overlay#"$root"/}"
echo "$(grep -c '^kind:' "$work/overlay-container-files.yaml") objects"
validate "$work/overlay-container-files.yaml" || fail "kubeconform rejected what ${overlay#"$root"/} builds (above)"
# hostPID and SYS_PTRACE added, one pipeline added, nothing else changed
# (consistency.py refuses any added capability, so it is not run on it);
# the pipelines are written out for `petrel validate` below.
cat >"$work/overlay-check.py" <<'PYEOF'
import os, sys, yaml
def objs(p):
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(p)) if d}
base, over = objs(sys.argv[1]), objs(sys.argv[2])
if base.keys() != over.keys():
    sys.exit(f"objects differ: {sorted(base)} vs {sorted(over)}")
ds = over[("DaemonSet", "petrel")]
spec = ds["spec"]["template"]["spec"]
caps = spec["containers"][0]["securityContext"]["capabilities"]
if spec.pop("hostPID", None) is not True or caps.pop("add", None) != ["SYS_PTRACE"] or caps.get("drop") != ["ALL"]:
    sys.exit("the overlay's DaemonSet lacks hostPID: true, capabilities.add [SYS_PTRACE] or drop [ALL]")
cm = over[("ConfigMap", "petrel-pipelines")]
data = dict(cm["data"])
text = data.pop("container-files.yaml", "")
if "type: container_files" not in text:
    sys.exit("the overlay's ConfigMap has no container-files.yaml pipeline with a container_files source")
for k, text_k in cm["data"].items():
    with open(os.path.join(sys.argv[3], k), "w", encoding="utf-8") as f:
        f.write(text_k)
cm["data"] = data
if base != over:
    sys.exit("the overlay changes more than hostPID, SYS_PTRACE and the added pipeline")
print("overlay: hostPID: true, SYS_PTRACE added, pipeline container-files.yaml added, nothing else changed")
PYEOF
mkdir "$work/overlay-pipelines" "$work/overlay-neg"
"$PY" "$work/overlay-check.py" "$work/built.yaml" "$work/overlay-container-files.yaml" "$work/overlay-pipelines" ||
    fail "${overlay#"$root"/}"
# The check can fail: an overlay without SYS_PTRACE, and one changing an
# argument besides, must be refused for their reasons.
overlay_neg() { # $1 = sed expression, $2 = expected message
    sed "$1" "$work/overlay-container-files.yaml" >"$work/overlay-neg.yaml"
    ! cmp -s "$work/overlay-container-files.yaml" "$work/overlay-neg.yaml" || fail "sed '$1' changed nothing"
    if out=$("$PY" "$work/overlay-check.py" "$work/built.yaml" "$work/overlay-neg.yaml" "$work/overlay-neg" 2>&1); then
        fail "the overlay check accepted an overlay edited with sed '$1'"
    fi
    grep -qF -- "$2" <<<"$out" || fail "the overlay edited with sed '$1' was refused, but not with '$2': $out"
    echo "refused as expected: sed '$1': $2"
}
overlay_neg '/- SYS_PTRACE/d' "lacks hostPID: true, capabilities.add [SYS_PTRACE]"
overlay_neg 's/--threads=2/--threads=3/' "changes more than hostPID"

step "helm lint deploy/helm/petrel (and --strict)"
# helm reads no kubeconfig and no repositories: a private, empty home.
export HELM_CACHE_HOME=$work/helm-home/cache HELM_CONFIG_HOME=$work/helm-home/config \
    HELM_DATA_HOME=$work/helm-home/data KUBECONFIG=/dev/null
hvalues=$here/helm/values-full.yaml
avalues=$here/helm/values-aggregator.yaml
tvalues=$here/helm/values-api-tls.yaml
# The aggregator pipelines of deploy/aggregator/ that the aggregator render
# carries (to-archive.yaml writes to a volume the chart does not have).
aexamples=(--set-file "aggregator.config.to-opensearch\.yaml=$root/deploy/aggregator/to-opensearch.yaml"
    --set-file "aggregator.config.mirror-exactly-once\.yaml=$root/deploy/aggregator/mirror-exactly-once.yaml")
"$helm" lint "$chart" || fail "helm lint"
"$helm" lint --strict "$chart" || fail "helm lint --strict"
"$helm" lint --strict "$chart" --set containerFiles.enabled=true || fail "helm lint --strict, containerFiles.enabled=true"
"$helm" lint --strict "$chart" -f "$hvalues" || fail "helm lint --strict -f ${hvalues#"$root"/}"
"$helm" lint --strict "$chart" --set mode=aggregator || fail "helm lint --strict, mode=aggregator"
"$helm" lint --strict "$chart" -f "$avalues" "${aexamples[@]}" || fail "helm lint --strict -f ${avalues#"$root"/}"
"$helm" lint --strict "$chart" -f "$tvalues" || fail "helm lint --strict -f ${tvalues#"$root"/}"

step "helm template: default values, containerFiles.enabled=true, ${hvalues#"$root"/}; kubeconform -strict"
render() { # $1 = output name, then helm flags
    local out=$work/helm-$1.yaml
    shift
    "$helm" template petrel "$chart" --namespace petrel "$@" >"$out" || fail "helm template $*"
    local flags="${*:-(default values)}"
    echo "helm template ${flags//"$root"\//}: $(grep -c '^kind:' "$out") objects: $(sed -n 's/^kind: //p' "$out" | paste -sd' ')"
}
render default
render container-files --set containerFiles.enabled=true
render full -f "$hvalues"
render aggregator --set mode=aggregator
render aggregator-full -f "$avalues" "${aexamples[@]}"
validate "$work"/helm-{default,container-files,full,aggregator,aggregator-full}.yaml ||
    fail "kubeconform rejected what the chart renders (above)"

step "the chart's API over TLS with a token, scraped by a ServiceMonitor (${tvalues#"$root"/})"
render api-tls -f "$tvalues"
render aggregator-api-tls -f "$tvalues" --set mode=aggregator
# kubeconform has no schema for the Prometheus Operator's CRD: the
# ServiceMonitor is checked by the script below instead.
for v in "${K8S_VERSIONS[@]}"; do
    "$kubeconform" -strict -summary -kubernetes-version "$v" -skip ServiceMonitor \
        -schema-location "$cache/schemas/{{ .NormalizedKubernetesVersion }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
        "$work"/helm-{api-tls,aggregator-api-tls}.yaml || fail "kubeconform rejected the api-tls renders (above)"
done
"$PY" - "$work/helm-api-tls.yaml" "$work/helm-aggregator-api-tls.yaml" "$work/api-tls-args" <<'PYEOF' || fail "api.tls / api.auth / serviceMonitor (above)"
import sys, yaml
def check(path, kind):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    (w,) = [d for d in docs if d["kind"] == kind]
    pod = w["spec"]["template"]
    c = pod["spec"]["containers"][0]
    args = c["args"]
    want = ["--api-tls-cert=/etc/petrel/api-tls/tls.crt", "--api-tls-key=/etc/petrel/api-tls/tls.key",
            "--api-auth=metrics", "--api-token-file=/etc/petrel/api-token/token"]
    missing = [a for a in want if a not in args]
    assert not missing, f"{kind}: args lack {missing}"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    for name, path, secret in (("api-tls", "/etc/petrel/api-tls", "petrel-api-tls"), ("api-token", "/etc/petrel/api-token", "petrel-api")):
        m = mounts.get(name)
        assert m and m["mountPath"] == path and m.get("readOnly") and "subPath" not in m, f"{kind}: mount {name}: {m}"
        assert vols[name]["secret"]["secretName"] == secret, f"{kind}: volume {name}: {vols[name]}"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"].get("scheme") == "HTTPS", f"{kind}: {probe} is not HTTPS"
    assert pod["metadata"]["annotations"].get("prometheus.io/scheme") == "https", f"{kind}: no prometheus.io/scheme"
    return docs, args
def selected(docs):
    """The Services the ServiceMonitor's selector picks (matchLabels, and
    matchExpressions with DoesNotExist, the only operator the chart uses)."""
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    sel = sm["spec"]["selector"]
    out = []
    for svc in [d for d in docs if d["kind"] == "Service"]:
        labels = svc["metadata"]["labels"]
        ok = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
        for e in sel.get("matchExpressions", []):
            assert e["operator"] == "DoesNotExist", e
            ok = ok and e["key"] not in labels
        if ok:
            out.append(svc)
    return sm, out
docs, args = check(sys.argv[1], "DaemonSet")
adocs, _ = check(sys.argv[2], "StatefulSet")
sm, (svc,) = selected(docs)
_, (asvc,) = selected(adocs)
assert not asvc["metadata"]["name"].endswith("-headless"), "the ServiceMonitor picks the headless Service"
assert sm["apiVersion"] == "monitoring.coreos.com/v1"
assert sm["metadata"]["labels"].get("release") == "prometheus"
(ep,) = sm["spec"]["endpoints"]
assert ep["port"] == svc["spec"]["ports"][0]["name"] and ep["path"] == "/metrics" and ep["scheme"] == "https", ep
assert ep["tlsConfig"]["ca"]["secret"] == {"name": "petrel-api-tls", "key": "ca.crt"}, ep
assert ep["bearerTokenSecret"] == {"name": "petrel-api", "key": "token"}, ep
open(sys.argv[3], "w").write("\n".join(args) + "\n")
print("api.tls, api.auth metrics, serviceMonitor: Secret mounts, args, HTTPS probes and the ServiceMonitor as expected")
PYEOF

step "overlay deploy/kubernetes-overlays/api-tls: kustomize build, kubeconform -strict, what it changes"
toverlay=$root/deploy/kubernetes-overlays/api-tls
"$kustomize" build "$toverlay" >"$work/overlay-api-tls.yaml" || fail "kustomize build ${toverlay#"$root"/}"
validate "$work/overlay-api-tls.yaml" || fail "kubeconform rejected what ${toverlay#"$root"/} builds (above)"
"$PY" - "$work/built.yaml" "$work/overlay-api-tls.yaml" "$work/overlay-api-tls-args" <<'PYEOF' || fail "${toverlay#"$root"/} (above)"
import sys, yaml
def ds(p):
    (d,) = [d for d in yaml.safe_load_all(open(p)) if d and d["kind"] == "DaemonSet"]
    return d
base, over = ds(sys.argv[1]), ds(sys.argv[2])
c = over["spec"]["template"]["spec"]["containers"][0]
added = c["args"][len(base["spec"]["template"]["spec"]["containers"][0]["args"]):]
assert added == ["--api-tls-cert=/etc/petrel/api-tls/tls.crt", "--api-tls-key=/etc/petrel/api-tls/tls.key",
                 "--api-auth=metrics", "--api-token-file=/etc/petrel/api-token/token"], added
for probe in ("readinessProbe", "livenessProbe"):
    assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
mounts = {m["name"]: m for m in c["volumeMounts"]}
assert all(n in mounts and "subPath" not in mounts[n] for n in ("api-tls", "api-token")), mounts
open(sys.argv[3], "w").write("\n".join(c["args"]) + "\n")
print("overlay api-tls: TLS and token args appended, HTTPS probes, the Secrets mounted as directories")
PYEOF

step "the chart's defaults render deploy/kubernetes; container_files adds hostPID and SYS_PTRACE only"
"$PY" "$here/helm-same.py" "$work/built.yaml" "$work/helm-default.yaml" ||
    fail "the chart's default values do not render deploy/kubernetes (above)"
"$PY" - "$work/helm-default.yaml" "$work/helm-container-files.yaml" <<'PYEOF' || fail "containerFiles.enabled=true"
import sys, yaml
def ds(p):
    (d,) = [d for d in yaml.safe_load_all(open(p)) if d and d["kind"] == "DaemonSet"]
    d["spec"]["template"]["metadata"]["annotations"].pop("checksum/pipelines")
    return d
plain, cf = ds(sys.argv[1]), ds(sys.argv[2])
spec = cf["spec"]["template"]["spec"]
caps = spec["containers"][0]["securityContext"]["capabilities"]
if spec.pop("hostPID", None) is not True or caps.pop("add", None) != ["SYS_PTRACE"]:
    sys.exit("containerFiles.enabled=true: no hostPID: true and capabilities.add [SYS_PTRACE]")
if plain != cf:
    sys.exit("containerFiles.enabled=true changes more than hostPID and SYS_PTRACE")
print("containerFiles.enabled=true: hostPID: true and SYS_PTRACE added, nothing else changed")
PYEOF

step "consistency of the chart's renders (default values, ${hvalues#"$root"/})"
# Not the container_files render: it adds a capability, which consistency.py
# refuses (the securityContext emulated below has none).
for r in default full; do
    mkdir "$work/helm-$r"
    "$PY" "$here/consistency.py" "$work/helm-$r.yaml" "$work/helm-$r" || fail "consistency of the chart's $r render"
done

step "the chart's mode aggregator: non-root, no capability, no host path, data on an emptyDir, Services, PodDisruptionBudget"
mkdir "$work/helm-aggregator" "$work/helm-aggregator-full"
"$PY" "$here/aggregator.py" "$work/helm-aggregator.yaml" "$work/helm-aggregator" StatefulSet 30 ||
    fail "mode aggregator, default values (above)"
"$PY" "$here/aggregator.py" "$work/helm-aggregator-full.yaml" "$work/helm-aggregator-full" Deployment 20 ||
    fail "mode aggregator, ${avalues#"$root"/} (above)"
# The pipelines rendered are the ones given: the chart's example in the
# first, exactly the two files of deploy/aggregator/ in the second.
keys() { find "$1" -maxdepth 1 -name '*.yaml' -printf '%f\n' | sort | paste -sd' '; }
[[ $(keys "$work/helm-aggregator/pipelines") == kafka-to-http.yaml ]] ||
    fail "mode aggregator renders $(keys "$work/helm-aggregator/pipelines"), not the example kafka-to-http.yaml"
[[ $(keys "$work/helm-aggregator-full/pipelines") == "mirror-exactly-once.yaml to-opensearch.yaml" ]] ||
    fail "${avalues#"$root"/} renders $(keys "$work/helm-aggregator-full/pipelines"), not the two files of deploy/aggregator/"
for f in to-opensearch mirror-exactly-once; do
    cmp -s "$work/helm-aggregator-full/pipelines/$f.yaml" "$root/deploy/aggregator/$f.yaml" ||
        fail "the rendered $f.yaml differs from deploy/aggregator/$f.yaml"
done

step "negative checks: the chart rejects each invalid values file, for its reason"
n=0
for f in "$here"/helm/invalid/*.yaml; do
    want=$(sed -n 's/^# expect: //p' "$f")
    [[ -n $want ]] || fail "$f has no '# expect: ' line"
    # Rejected by the values schema (lint and template), or else by
    # kubeconform on what the chart renders.
    if out=$("$helm" lint --strict "$chart" -f "$f" 2>&1); then
        out=$("$helm" template petrel "$chart" --namespace petrel -f "$f" 2>&1 >"$work/neg.yaml") &&
            out=$(validate "$work/neg.yaml" 2>&1) && {
            echo "$out"
            fail "helm lint, helm template and kubeconform accepted $f: the checks prove nothing"
        }
    elif "$helm" template petrel "$chart" -f "$f" >/dev/null 2>&1; then
        fail "helm lint rejected $f but helm template accepted it"
    fi
    grep -qF -- "$want" <<<"$out" || {
        echo "$out"
        fail "$f was rejected, but not with '$want'"
    }
    echo "rejected as expected: ${f#"$root"/}: $want"
    n=$((n + 1))
done
((n >= 3)) || fail "only $n negative values files"

step "the real agent: the DaemonSet's args and the ConfigMap's pipelines"
if [[ -n ${PETREL:-} ]]; then
    petrel=$PETREL
    [[ -x $petrel ]] || fail "PETREL=$petrel is not an executable"
else
    # Builds only when the binary is stale (after `cargo test --release` it is not).
    cargo build --release --locked -p petrel
    petrel=${CARGO_TARGET_DIR:-$root/target}/release/petrel
fi
mapfile -t args <"$work/args"
# clap parses every flag and value before honouring a trailing --help:
# exit 0 means the agent accepts these args as they are.
"$petrel" "${args[@]}" --help >/dev/null || fail "petrel rejects the DaemonSet's args: ${args[*]}"
echo "args accepted: ${args[*]}"
mapfile -t args <"$work/api-tls-args"
"$petrel" "${args[@]}" --help >/dev/null || fail "petrel rejects the api-tls render's args: ${args[*]}"
echo "args accepted (api-tls render): ${args[*]}"
mapfile -t args <"$work/overlay-api-tls-args"
"$petrel" "${args[@]}" --help >/dev/null || fail "petrel rejects the api-tls overlay's args: ${args[*]}"
echo "args accepted (api-tls overlay): ${args[*]}"

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

step "the aggregator's securityContext, emulated: its non-root uid, no capability, read-only root, data on an emptyDir"
# Mode aggregator as aggregator.py checked it renders: the uid of the
# StatefulSet, no capability, no_new_privs, / read-only, the data dir a
# world-writable directory as an emptyDir is. The rendered kafka pipeline,
# its brokers and collector moved to a closed local port: the agent must
# start, answer /health/live, take its data dir's lock and exit 0 on SIGTERM.
agg_uid=$("$PY" -c '
import sys, yaml
(w,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "StatefulSet"]
print(w["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"])
' "$work/helm-aggregator.yaml")
[[ $agg_uid =~ ^[1-9][0-9]*$ ]] || fail "the aggregator's runAsUser is '$agg_uid'"
asc=$work/asc
mkdir -p "$asc/data" "$asc/pipelines"
chmod 755 "$work"
chmod 755 "$asc" "$asc/pipelines"
chmod 777 "$asc/data"
sed -e 's|brokers: .*|brokers: ["127.0.0.1:1"]|' -e 's|url: .*|url: "http://127.0.0.1:1/ingest"|' \
    "$work/helm-aggregator/pipelines/kafka-to-http.yaml" >"$asc/pipelines/kafka-to-http.yaml"
grep -q '127.0.0.1:1"]' "$asc/pipelines/kafka-to-http.yaml" || fail "the aggregator's pipeline was not made local"
# The binary where uid $agg_uid may run it.
install -m 755 "$petrel" "$asc/petrel"
# shellcheck disable=SC2016 # $1..$4 are the inner shell's arguments
unshare --mount --propagation private sh -c '
    mount --bind "$1" "$1" && mount -o remount,bind,ro / || exit 97
    exec setpriv --reuid="$4" --regid="$4" --clear-groups --inh-caps=-all --bounding-set=-all \
        --no-new-privs -- "$2" run --config "$3" --data-dir "$1" --api-addr 127.0.0.1:0 --no-watch-config \
        --shutdown-timeout 5
' sh "$asc/data" "$asc/petrel" "$asc/pipelines/" "$agg_uid" 2>"$asc/agent.log" &
agent=$!
live=""
for ((i = 0; i < 100; i++)); do
    addr=$(sed -n 's|.*API listening on http://\([0-9.:]*\).*|\1|p' "$asc/agent.log" | head -1)
    if [[ -n $addr ]]; then
        live=$("$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)' \
            "http://$addr/health/live" 2>/dev/null) && [[ $live == 200 ]] && break
    fi
    kill -0 "$agent" 2>/dev/null || break
    sleep 0.1
done
kill -TERM "$agent" 2>/dev/null || true
rc=0
wait "$agent" || rc=$?
if [[ $live != 200 || $rc -ne 0 || $(stat -c %u "$asc/data/petrel.lock" 2>/dev/null) != "$agg_uid" ]]; then
    cat "$asc/agent.log"
    fail "as uid $agg_uid with no capability on a read-only root, the aggregator did not answer /health/live (${live:-no answer}), lock its data dir and exit 0 (rc $rc)"
fi
echo "uid $agg_uid, no capability, read-only root: the kafka pipeline started, /health/live 200, data dir locked, exit 0"

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

step "petrel validate: the pipelines of deploy/kubernetes-overlays/container-files"
"$petrel" validate --config "$work/overlay-pipelines/" ||
    fail "petrel validate rejects the pipelines of deploy/kubernetes-overlays/container-files (above)"
echo "overlay pipelines valid: $(cd "$work/overlay-pipelines" && echo *)"

step "the chart's renders: the agent takes their args, petrel validate their pipelines"
for r in default full aggregator aggregator-full; do
    mapfile -t args <"$work/helm-$r/args"
    "$petrel" "${args[@]}" --help >/dev/null || fail "petrel rejects the args the chart renders ($r): ${args[*]}"
    echo "$r: args accepted: ${args[*]}"
    # The variables the pod gets from Secrets, set as the kubelet would.
    mapfile -t secret_env < <("$PY" -c '
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
        for e in d["spec"]["template"]["spec"]["containers"][0].get("env", []):
            if "secretKeyRef" in e.get("valueFrom", {}):
                print(e["name"] + "=from-a-secret")
' "$work/helm-$r.yaml")
    env "${secret_env[@]}" "$petrel" validate --config "$work/helm-$r/pipelines/" ||
        fail "petrel validate rejects the pipelines the chart renders ($r, above)"
    echo "$r: pipelines valid (with ${secret_env[*]:-no secret})"
done

echo
echo "check-kubernetes: OK in $((SECONDS - start)) s"
