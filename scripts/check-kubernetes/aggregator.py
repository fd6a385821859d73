#!/usr/bin/env python3
"""The chart's mode aggregator: what a schema cannot see.

Usage: aggregator.py RENDERED_YAML OUT_DIR KIND SHUTDOWN_TIMEOUT

RENDERED_YAML is `helm template ... --set mode=aggregator`. Checks that
  - the workload is one KIND (StatefulSet or Deployment), and no
    DaemonSet, RBAC object or ServiceAccount token is rendered;
  - nothing of the node is used: no hostPath volume, no hostPID,
    hostNetwork or hostIPC, no capability added;
  - the securityContext is the hardened one: not root (runAsNonRoot,
    a non-zero uid), every capability dropped, no privilege escalation,
    read-only root file system, seccomp RuntimeDefault;
  - --data-dir is a writable emptyDir mount, --config the mount of the
    rendered pipelines ConfigMap, the probes GET /health/live and
    /health/ready on the --api-addr port;
  - terminationGracePeriodSeconds is SHUTDOWN_TIMEOUT + 15;
  - a StatefulSet's serviceName is a rendered headless Service whose
    selector matches the pods; the PodDisruptionBudget (if any) selects
    the pods; every volume mount names a volume;
  - no pipeline uses a source of the node role (file, kubernetes_logs,
    container_files).
Then writes OUT_DIR/args and OUT_DIR/pipelines/ as consistency.py does.
Runs against broken copies first (a hostPath data dir, uid 0), which
must fail.
"""
import copy
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consistency import arg, write_out  # noqa: E402

NODE_SOURCES = {"file", "kubernetes_logs", "container_files"}
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def problems(docs, kind, shutdown):
    out = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for k in (RBAC_KINDS | {"DaemonSet"}) & by_kind.keys():
        out.append(f"{k} rendered in mode aggregator")
    other = {"StatefulSet", "Deployment"} - {kind}
    for k in other & by_kind.keys():
        out.append(f"{k} rendered, but aggregator.kind is {kind}")
    if len(by_kind.get(kind, [])) != 1:
        return out + [f"not one {kind}: {len(by_kind.get(kind, []))}"]
    (w,) = by_kind[kind]
    tmpl = w["spec"]["template"]
    spec = tmpl["spec"]
    labels = tmpl["metadata"].get("labels", {})
    if not selects(w["spec"]["selector"].get("matchLabels"), labels):
        out.append("the selector does not match the pod template's labels")
    if spec.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken must be false")
    for k in ("hostPID", "hostNetwork", "hostIPC"):
        if spec.get(k):
            out.append(f"{k}: true")
    if spec.get("terminationGracePeriodSeconds") != shutdown + 15:
        out.append(f"terminationGracePeriodSeconds {spec.get('terminationGracePeriodSeconds')}, "
                   f"not shutdownTimeout + 15 = {shutdown + 15}")
    psc = spec.get("securityContext", {})
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        out.append("pod seccompProfile is not RuntimeDefault")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for v in vols.values():
        if "hostPath" in v:
            out.append(f"volume {v['name']} is a hostPath")
    (c,) = [c for c in spec["containers"] if c["name"] == "petrel"]
    sc = c.get("securityContext", {})
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")) or uid in (None, 0):
        out.append(f"not non-root: runAsNonRoot {sc.get('runAsNonRoot')!r}, runAsUser {uid!r}")
    want = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
    for k, v in want.items():
        if sc.get(k) != v:
            out.append(f"securityContext.{k} is {sc.get(k)!r}, not {v!r}")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or caps.get("add") or sc.get("privileged"):
        out.append(f"capabilities {caps}: all must be dropped and none added")
    mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}
    for m in c.get("volumeMounts", []):
        if m["name"] not in vols:
            out.append(f"volumeMount {m['name']} names no volume")
    args = c.get("args", [])
    data = (arg(args, "--data-dir") or "").rstrip("/")
    m = mounts.get(data)
    if not m or "emptyDir" not in vols.get(m["name"], {}) or m.get("readOnly"):
        out.append(f"--data-dir {data} is not a writable emptyDir mount")
    config = (arg(args, "--config") or "").rstrip("/")
    m = mounts.get(config)
    cm_name = m and vols.get(m["name"], {}).get("configMap", {}).get("name")
    cms = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    if cm_name not in cms:
        out.append(f"--config {config} is not the mount of a rendered ConfigMap")
    else:
        for key, text in cms[cm_name].get("data", {}).items():
            for i, src in enumerate(yaml.safe_load(text).get("sources", [])):
                if src.get("type") in NODE_SOURCES:
                    out.append(f"{key}: sources[{i}] is a {src['type']} source, of the node role")
    port = (arg(args, "--api-addr") or "").rsplit(":", 1)[-1]
    ports = {p.get("name"): str(p["containerPort"]) for p in c.get("ports", [])}
    for probe, path in (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or str(ports.get(get.get("port"), get.get("port"))) != port:
            out.append(f"{probe} is not GET {path} on the --api-addr port {port}")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    if kind == "StatefulSet":
        s = services.get(w["spec"].get("serviceName"))
        if not s or s["spec"].get("clusterIP") != "None":
            out.append(f"serviceName {w['spec'].get('serviceName')!r} is not a rendered headless Service")
        elif not selects(s["spec"].get("selector"), labels):
            out.append("the headless Service does not select the pods")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not selects(pdb["spec"].get("selector", {}).get("matchLabels"), labels):
            out.append(f"PodDisruptionBudget {pdb['metadata']['name']} does not select the pods")
    return out


def main():
    rendered, out_dir, kind, shutdown = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(rendered, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for name, breaks in (
        ("a hostPath data dir", lambda s, c: [v.update({"hostPath": {"path": "/x"}}) or v.pop("emptyDir")
                                           for v in s["volumes"] if v["name"] == "data"]),
        ("uid 0", lambda s, c: c["securityContext"].update({"runAsUser": 0})),
    ):
        broken = copy.deepcopy(docs)
        for d in broken:
            if d["kind"] == kind:
                s = d["spec"]["template"]["spec"]
                breaks(s, s["containers"][0])
        if not problems(broken, kind, shutdown):
            sys.exit(f"aggregator: a {kind} with {name} passed: the check is broken")
    found = problems(docs, kind, shutdown)
    for p in found:
        print(f"aggregator: {p}", file=sys.stderr)
    if found:
        sys.exit(1)
    write_out(docs, out_dir)
    print(f"aggregator: a {kind}, non-root with no capability, no host path, data on an emptyDir, "
          f"probes, grace period, Services and PodDisruptionBudget agree")


if __name__ == "__main__":
    main()
