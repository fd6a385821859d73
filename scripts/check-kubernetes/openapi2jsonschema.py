#!/usr/bin/env python3
"""Kubernetes OpenAPI v2 (swagger.json) -> strict JSON schemas for kubeconform.

Usage: openapi2jsonschema.py SWAGGER_JSON OUT_DIR

Writes one file per API kind, named as kubeconform's default
`{{ .ResourceKind }}{{ .KindSuffix }}.json` template expects (daemonset-apps-v1.json,
configmap-v1.json, ...). Each file is the kind's definition plus, under
`definitions`, every definition it reaches (so the recursive ones, such as
JSONSchemaProps, stay references instead of being inlined forever).

What the published kubernetes-json-schema "-strict" schemas do, done here:
  - strict: every object schema with `properties` and no `additionalProperties`
    gets `additionalProperties: false` (kubectl's and the API server's field
    validation: an unknown or misspelled field is an error), except where the
    spec says `x-kubernetes-preserve-unknown-fields`;
  - `format: int-or-string` (IntOrString: ports, maxUnavailable) accepts a
    string or an integer;
  - resource.Quantity (cpu: 1, memory: 64Mi) accepts a string or a number;
  - null is accepted for an optional field given inline (`args: null`) and
    for the scalar definitions (`creationTimestamp: null`, Time, Quantity),
    as the API server takes null for "unset"; a required field never is.
Only the standard library: no dependency to install.
"""
import json
import os
import sys

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
REF = "#/definitions/"


def strict(node):
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string":
        out = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        if "description" in node:
            out["description"] = node["description"]
        return out
    out = {k: strict(v) for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        required = set(out.get("required", []))
        for key, prop in props.items():
            if key not in required and isinstance(prop.get("type"), str):
                prop["type"] = [prop["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def refs(node, found):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith(REF):
            found.add(r[len(REF):])
        for v in node.values():
            refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


def closure(name, defs):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        if n not in defs:
            sys.exit(f"openapi2jsonschema: {n} is referenced but not defined")
        seen.add(n)
        found = set()
        refs(defs[n], found)
        todo.extend(found - seen)
    return seen


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    swagger, out_dir = sys.argv[1], sys.argv[2]
    with open(swagger, encoding="utf-8") as f:
        spec = json.load(f)
    defs = {k: strict(v) for k, v in spec["definitions"].items()}
    if QUANTITY in defs:
        defs[QUANTITY] = {
            "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}],
            "description": defs[QUANTITY].get("description", ""),
        }
    for name, schema in defs.items():
        if schema.get("type") in ("string", "integer", "number", "boolean"):
            schema["type"] = [schema["type"], "null"]
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for name, schema in sorted(defs.items()):
        for gvk in spec["definitions"][name].get("x-kubernetes-group-version-kind", []):
            group, kind, version = gvk.get("group", ""), gvk["kind"], gvk["version"]
            # kubeconform: "-" + first dot-separated part of the group (or the
            # version for the core group) + "-" + version
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            fname = f"{kind.lower()}{suffix}.json"
            # DeleteOptions, WatchEvent, ... are listed under every group;
            # the first definition wins, as in the published schemas.
            if fname in written:
                continue
            doc = {"$schema": "http://json-schema.org/draft-04/schema#"}
            doc.update(schema)
            doc["definitions"] = {n: defs[n] for n in sorted(closure(name, defs)) if n != name}
            # a root that is itself referenced (recursion) resolves through definitions
            doc["definitions"][name] = schema
            with open(os.path.join(out_dir, fname), "w", encoding="utf-8") as f:
                json.dump(doc, f, separators=(",", ":"))
            written[fname] = name
    if not written:
        sys.exit("openapi2jsonschema: no kind found (no x-kubernetes-group-version-kind)")
    print(f"openapi2jsonschema: {len(written)} kinds from {swagger} -> {out_dir}")


if __name__ == "__main__":
    main()
