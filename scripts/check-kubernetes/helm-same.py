#!/usr/bin/env python3
"""The Helm chart with its default values renders deploy/kubernetes.

Usage: helm-same.py BUILT_YAML RENDERED_YAML

BUILT_YAML is `kustomize build deploy/kubernetes`, RENDERED_YAML
`helm template petrel deploy/helm/petrel -n petrel` with the image of
kustomization.yaml. The DaemonSet and the ConfigMap must be equal, field
for field, but for what Helm adds: its labels (app.kubernetes.io/instance,
version and managed-by, helm.sh/chart, also in the selector) and the
pipelines' checksum annotation that rolls the pods on `helm upgrade`. The
Namespace is the plain manifests' alone (Helm installs into one). Checks a
broken copy first (one argument changed), which must differ.
"""
import copy
import sys

import yaml

HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "helm.sh/chart"}
HELM_ANNOTATIONS = {"checksum/pipelines"}


def load(path):
    with open(path, encoding="utf-8") as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def strip_helm(doc):
    doc = copy.deepcopy(doc)

    def clean(meta, key, drop):
        got = meta.get(key)
        if got is not None:
            for k in drop & got.keys():
                del got[k]
            if not got:
                del meta[key]

    clean(doc["metadata"], "labels", HELM_LABELS)
    if doc["kind"] == "DaemonSet":
        clean(doc["spec"]["selector"], "matchLabels", HELM_LABELS)
        clean(doc["spec"]["template"]["metadata"], "labels", HELM_LABELS)
        clean(doc["spec"]["template"]["metadata"], "annotations", HELM_ANNOTATIONS)
    return doc


def diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(a.keys() | b.keys(), key=str):
            if k not in a:
                out.append(f"{path}/{k}: only in the chart: {b[k]!r}")
            elif k not in b:
                out.append(f"{path}/{k}: only in deploy/kubernetes: {a[k]!r}")
            else:
                out += diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}/{i}")]
    return [] if a == b else [f"{path}: deploy/kubernetes {a!r}, the chart {b!r}"]


def differences(plain, chart):
    out = []
    for kind in ("DaemonSet", "ConfigMap"):
        if kind not in chart:
            out.append(f"the chart renders no {kind}")
            continue
        out += [f"{kind}{d}" for d in diff(plain[kind], strip_helm(chart[kind]))]
    extra = chart.keys() - plain.keys()
    if extra:
        out.append(f"the chart renders more kinds by default: {sorted(extra)}")
    return out


def main():
    plain, chart = load(sys.argv[1]), load(sys.argv[2])
    broken = copy.deepcopy(chart)
    broken["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["args"][-1] += "0"
    if not differences(plain, broken):
        sys.exit("helm-same: a chart with one argument changed matched: the check is broken")
    found = differences(plain, chart)
    for d in found:
        print(f"helm-same: {d}", file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"helm-same: the chart's DaemonSet and ConfigMap are deploy/kubernetes' "
          f"(but Helm's labels and the checksum annotation)")


if __name__ == "__main__":
    main()
