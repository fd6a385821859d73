#!/usr/bin/env python3
"""What a schema cannot see in deploy/kubernetes: the pieces agree.

Usage: consistency.py BUILT_YAML OUT_DIR

BUILT_YAML is `kustomize build deploy/kubernetes`. Checks that
  - the RBAC is the agent's read-only metadata access, nothing more: a
    ServiceAccount that the DaemonSet runs as with its token mounted, one
    ClusterRole granting exactly get, list and watch on pods, namespaces,
    nodes (core), replicasets (apps) and jobs (batch), and one
    ClusterRoleBinding of that role to that account in the DaemonSet's
    namespace; no Role or RoleBinding;
  - the agent's --config is where the pipelines ConfigMap is mounted,
    --data-dir is a writable hostPath mount, the probes and --api-addr use
    the same port, liveness probes /health/live and readiness
    /health/ready, NODE_NAME comes from spec.nodeName;
  - every host path a pipeline reads (pods_dir, docker_dir,
    containerd_socket) is mounted at that same path from that host path;
  - maxSurge is 0 (two agents on one data dir: the second is refused);
  - what the API server checks beyond the schema, for the fields used here
    (the OpenAPI spec has no enums and no cross-references): volume mounts
    name existing volumes and every volume is mounted, hostPath types,
    downward-API field paths, port names, the selector matches the pod's
    labels;
  - the securityContext is the one scripts/check-kubernetes.sh emulates
    (uid 0, every capability dropped and none added, no privilege
    escalation, read-only root file system, not privileged).
Then writes, for the next steps of scripts/check-kubernetes.sh:
  OUT_DIR/args            the container's args, one per line
  OUT_DIR/pipelines/      the ConfigMap as the kubelet mounts it: the keys
                          are symlinks to ..data/KEY, ..data a symlink to a
                          timestamped directory holding the files.
Runs its own checks against broken copies first (a mount moved, a
misspelled hostPath type), which must fail, so a pass means something.
"""
import copy
import os
import re
import sys

import yaml

HOSTPATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                  "CharDevice", "BlockDevice"}
ENV_FIELD_PATHS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                   "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
                   "status.podIPs"}
PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")
HOST_KEYS = ("pods_dir", "docker_dir", "containerd_socket")


def arg(args, name):
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


# What the agent's Kubernetes API metadata lists and watches: nothing else
# may be granted.
RBAC_RULES = {("", "pods"), ("", "namespaces"), ("", "nodes"), ("apps", "replicasets"),
              ("batch", "jobs")}
RBAC_VERBS = {"get", "list", "watch"}


def rbac_problems(by_kind, ds):
    out = []
    for k in ("Role", "RoleBinding"):
        if k in by_kind:
            out.append(f"{k} found: the agent needs only its ClusterRole")
    spec = ds["spec"]["template"]["spec"]
    ns = ds["metadata"].get("namespace")
    sas = by_kind.get("ServiceAccount", [])
    roles = by_kind.get("ClusterRole", [])
    bindings = by_kind.get("ClusterRoleBinding", [])
    # The ServiceAccount is rendered, or an existing one is named
    # (the chart's serviceAccountName).
    if len(sas) > 1 or len(roles) != 1 or len(bindings) != 1:
        out.append("want at most one ServiceAccount, one ClusterRole and one ClusterRoleBinding "
                   f"(found {len(sas)}, {len(roles)}, {len(bindings)})")
        return out
    (role,), (binding,) = roles, bindings
    sa_name = spec.get("serviceAccountName")
    if not sa_name:
        out.append("the DaemonSet names no serviceAccountName")
    for sa in sas:
        if sa["metadata"]["name"] != sa_name:
            out.append(f"the DaemonSet runs as {sa_name!r}, not the ServiceAccount "
                       f"{sa['metadata']['name']!r}")
        if sa["metadata"].get("namespace") != ns:
            out.append("the ServiceAccount is not in the DaemonSet's namespace")
    if spec.get("automountServiceAccountToken") is not True:
        out.append("automountServiceAccountToken must be true: the API metadata needs the token")
    granted = set()
    for r in role.get("rules", []):
        verbs = set(r.get("verbs", []))
        if verbs != RBAC_VERBS:
            out.append(f"ClusterRole rule {r!r}: verbs must be exactly get, list, watch")
        if r.get("resourceNames") or r.get("nonResourceURLs"):
            out.append(f"ClusterRole rule {r!r}: no resourceNames or nonResourceURLs")
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                granted.add((g, res))
    if granted != RBAC_RULES:
        out.append(f"ClusterRole grants {sorted(granted)}, want exactly {sorted(RBAC_RULES)}")
    ref = binding.get("roleRef", {})
    if ref.get("kind") != "ClusterRole" or ref.get("name") != role["metadata"]["name"]:
        out.append(f"the ClusterRoleBinding refers to {ref!r}, not the ClusterRole")
    subjects = binding.get("subjects", [])
    want = [{"kind": "ServiceAccount", "name": sa_name, "namespace": ns}]
    if subjects != want:
        out.append(f"the ClusterRoleBinding's subjects are {subjects!r}, want {want!r}")
    return out


def problems(docs):
    out = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    (ds,) = by_kind["DaemonSet"]
    cms = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    spec = ds["spec"]["template"]["spec"]
    out += rbac_problems(by_kind, ds)
    surge = ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {}).get("maxSurge")
    if surge not in (0, "0", "0%"):
        out.append(f"maxSurge is {surge!r}: must be 0, one agent per data dir")
    (c,) = [c for c in spec["containers"] if c["name"] == "petrel"]
    args = c.get("args", [])
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}

    labels = ds["spec"]["template"]["metadata"].get("labels", {})
    for k, v in ds["spec"]["selector"].get("matchLabels", {}).items():
        if labels.get(k) != v:
            out.append(f"selector {k}={v} does not match the pod template's labels")
    used = {m["name"] for m in c.get("volumeMounts", [])}
    for name in used - vols.keys():
        out.append(f"volumeMount {name} names no volume")
    for name in vols.keys() - used:
        out.append(f"volume {name} is not mounted")
    for v in vols.values():
        t = v.get("hostPath", {}).get("type", "")
        if t not in HOSTPATH_TYPES:
            out.append(f"volume {v['name']}: hostPath type {t!r} is not one of {sorted(HOSTPATH_TYPES)}")
    for e in c.get("env", []):
        fp = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if fp is not None and fp not in ENV_FIELD_PATHS and not re.match(
            r"^metadata\.(labels|annotations)\['[^']+'\]$", fp
        ):
            out.append(f"env {e['name']}: fieldPath {fp!r} is not one the downward API offers")
    for p in c.get("ports", []):
        if "name" in p and not PORT_NAME.match(p["name"]):
            out.append(f"port name {p['name']!r} is not a valid IANA service name (15 chars, a-z0-9-)")

    def mount_of(path):
        return mounts.get(path.rstrip("/"))

    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    want = {"runAsUser": 0, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
    for k, v in want.items():
        if sc.get(k) != v:
            out.append(f"securityContext.{k} is {sc.get(k)!r}, not {v!r} as the check emulates")
    if caps.get("drop") != ["ALL"] or caps.get("add") or sc.get("privileged"):
        out.append(f"capabilities {caps}: all dropped and none added is what the check emulates")
    config = arg(args, "--config")
    m = config and mount_of(config)
    cm_name = m and vols.get(m["name"], {}).get("configMap", {}).get("name")
    if not cm_name or cm_name not in cms:
        out.append(f"--config {config} is not the mount of a ConfigMap of this deployment")
        pipelines = {}
    else:
        pipelines = cms[cm_name].get("data", {})
    data = arg(args, "--data-dir")
    m = data and mount_of(data)
    if not m or "hostPath" not in vols.get(m["name"], {}) or m.get("readOnly"):
        out.append(f"--data-dir {data} is not a writable hostPath mount")
    api = arg(args, "--api-addr") or ""
    port = api.rsplit(":", 1)[-1]
    ports = {p.get("name"): str(p["containerPort"]) for p in c.get("ports", [])}
    # Liveness must not be /health or /health/ready: those fail while a
    # sink cannot deliver, and a restart does not bring a collector back.
    for probe, path in (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live")):
        get = c.get(probe, {}).get("httpGet", {})
        p = str(ports.get(get.get("port"), get.get("port")))
        if get.get("path") != path or p != port:
            out.append(f"{probe} is not GET {path} on the --api-addr port {port}")
    if not api.startswith("0.0.0.0:"):
        out.append(f"--api-addr {api}: the kubelet probes the pod's address")
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if ref != "spec.nodeName":
        out.append("NODE_NAME must come from the downward API (spec.nodeName)")
    if not pipelines:
        out.append("no pipeline in the ConfigMap")
    for key, text in pipelines.items():
        for i, src in enumerate(yaml.safe_load(text).get("sources", [])):
            for k in HOST_KEYS:
                if k not in src:
                    continue
                m = mount_of(src[k])
                host = m and vols.get(m["name"], {}).get("hostPath", {}).get("path")
                if host != src[k]:
                    out.append(f"{key}: sources[{i}].{k} {src[k]} is not mounted from the host's {src[k]}")
    return out


def write_out(docs, out_dir):
    (ds,) = [d for d in docs if d["kind"] in ("DaemonSet", "StatefulSet", "Deployment")]
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "petrel"]
    with open(os.path.join(out_dir, "args"), "w", encoding="utf-8") as f:
        f.write("".join(a + "\n" for a in c["args"]))
    p = os.path.join(out_dir, "pipelines")
    stamp = os.path.join(p, "..2026_11_23_12_00_00.000000001")
    os.makedirs(stamp)
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        for key, text in cm.get("data", {}).items():
            with open(os.path.join(stamp, key), "w", encoding="utf-8") as f:
                f.write(text)
            os.symlink(os.path.join("..data", key), os.path.join(p, key))
    os.symlink(os.path.basename(stamp), os.path.join(p, "..data"))


def main():
    built, out_dir = sys.argv[1], sys.argv[2]
    with open(built, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    broken = copy.deepcopy(docs)
    for d in broken:
        if d["kind"] == "DaemonSet":
            for m in d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]:
                if m["mountPath"] == "/var/log/pods":
                    m["mountPath"] = "/host/var/log/pods"
    if not problems(broken):
        sys.exit("consistency: a DaemonSet with /var/log/pods mounted elsewhere passed: the check is broken")
    broken = copy.deepcopy(docs)
    for d in broken:
        if d["kind"] == "DaemonSet":
            for v in d["spec"]["template"]["spec"]["volumes"]:
                if "hostPath" in v:
                    v["hostPath"]["type"] = "Directroy"
    if not problems(broken):
        sys.exit("consistency: a hostPath of type 'Directroy' passed: the check is broken")
    broken = copy.deepcopy(docs)
    for d in broken:
        if d["kind"] == "ClusterRole":
            d["rules"][0]["verbs"].append("delete")
    if not problems(broken):
        sys.exit("consistency: a ClusterRole that may delete pods passed: the check is broken")
    found = problems(docs)
    for p in found:
        print(f"consistency: {p}", file=sys.stderr)
    if found:
        sys.exit(1)
    write_out(docs, out_dir)
    print("consistency: mounts, args, probes and pipelines agree; RBAC read-only, metadata kinds only")


if __name__ == "__main__":
    main()
