"""The operator's RBAC: `tianji_operator.rbac.RULES` is exactly what the operator's code calls
(Kopf's needs derived from its handlers, the operator's from its `KubeClient` call sites), so
a new API call without a rule fails here, and the chart grants exactly RULES, cluster-wide or
per watched namespace."""
from __future__ import annotations

import ast
import re

import pytest
import yaml

pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")

from chart_support import NAMESPACE, OPERATOR_SRC, ROOT, VARIANTS, by_kind, merged_values, one, render  # noqa: E402

CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"),
                  ("storage.k8s.io", "storageclasses")}


def triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    out = set()
    for r in rules:
        assert "*" not in r["apiGroups"] + r["resources"] + r["verbs"], f"wildcard in {r}"
        assert not r.get("resourceNames") and not r.get("nonResourceURLs"), r
        out |= {(g, res, v) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    return out


def _operator_client_calls() -> set[tuple[str, str]]:
    """(verb, kind) of every `<x>.kube.<verb>(...)` call in the operator package.

    `create`/`ensure` (create, and get on 409) take whole objects: they may create/get every
    kind the child builders (children/builders.py) write. `patch_status` patches the status
    subresource (verb "patch/status"). A call this function cannot attribute fails the
    test, so a new way of calling the API cannot slip past the RBAC check."""
    from tianji_operator.kube import KINDS

    built = _built_kinds()
    assert built and built <= set(KINDS), (built, set(KINDS))
    calls: set[tuple[str, str]] = set()
    unknown = []
    for path in sorted(OPERATOR_SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            recv = node.func.value
            if not ((isinstance(recv, ast.Attribute) and recv.attr == "kube")
                    or (isinstance(recv, ast.Name) and recv.id == "kube")):
                continue
            verb, where = node.func.attr, f"{path.name}:{node.lineno}"
            if verb in ("get", "list", "patch", "delete", "patch_status"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in KINDS:
                    calls.add(("patch/status" if verb == "patch_status" else verb, arg.value))
                else:
                    unknown.append(f"{where} kube.{verb} with a kind that is not a literal of KINDS")
            elif verb in ("create", "ensure"):
                calls |= {("create", k) for k in built}
                if verb == "ensure":
                    calls |= {("get", k) for k in built}
            elif verb == "close":
                continue
            else:
                unknown.append(f"{where} kube.{verb}: a call this test does not know (add it here and to RBAC)")
        if path.name != "kube.py":
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "request":
                    base = node.value
                    if isinstance(base, ast.Attribute) and base.attr == "kube":
                        unknown.append(f"{path.name}:{node.lineno} raw kube.request: map it to a verb in kube.py")
    assert not unknown, unknown
    return calls


def _built_kinds() -> set[str]:
    """Every `"kind": "<Kind>"` literal in the child builders."""
    tree = ast.parse((OPERATOR_SRC / "children" / "builders.py").read_text())
    return {v.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
            for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and k.value == "kind" and isinstance(v, ast.Constant)}


def _kopf_needs() -> set[tuple[str, str, str]]:
    """What Kopf itself calls for the way the operator uses it (kopf 1.x):
    handlers on the CRD → list+watch (the watch stream) and patch (finalizer, progress and
    diff-base annotations); status written through the status subresource when the CRD has
    one; events for kopf.info/warn/exception (core v1 events); the CRD observer; and the
    namespace observer, which runs only when the operator is given namespaces."""
    from tianji.control.spec.crd import GROUP, PLURAL

    src = "\n".join(p.read_text() for p in OPERATOR_SRC.rglob("*.py"))
    needs: set[tuple[str, str, str]] = set()
    assert re.search(r"@kopf\.(on\.(create|update|resume|delete|field|event)|timer|daemon)\(", src)
    needs |= {(GROUP, PLURAL, v) for v in ("list", "watch", "patch")}
    crd = yaml.safe_load((ROOT / "crds" / "tianjijob.yaml").read_text())
    if "status" in crd["spec"]["versions"][0].get("subresources", {}):
        needs.add((GROUP, f"{PLURAL}/status", "patch"))
    if re.search(r"\bkopf\.(info|warn|event|exception)\(", src):
        needs.add(("", "events", "create"))
    if "kopf.adopt(" in src:  # blockOwnerDeletion → OwnerReferencesPermissionEnforcement
        needs.add((GROUP, f"{PLURAL}/finalizers", "update"))
    needs |= {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    needs |= {("", "namespaces", v) for v in ("list", "watch")}
    # Event handlers on other resources (e.g. the job's pods) watch them too.
    for group, _version, plural in re.findall(r'@kopf\.(?:on\.event|index)\("([^"]*)", "([^"]*)", "([^"]*)"', src):
        needs |= {(group, plural, v) for v in ("list", "watch")}
    return needs


def test_operator_rbac_rules_are_exactly_what_the_code_calls():
    """The operator's RULES (the single source of truth the chart follows) cover every API call
    in its code, and nothing else."""
    from tianji_operator.kube import KINDS
    from tianji_operator.rbac import RULES

    needed = set(_kopf_needs())
    for verb, kind in _operator_client_calls():
        group, _version, plural = KINDS[kind]
        if verb == "patch/status":
            needed.add((group, f"{plural}/status", "patch"))
        else:
            needed.add((group, plural, verb))
    have = triples(RULES)
    assert have - needed == set(), f"RULES grant what the operator never calls: {sorted(have - needed)}"
    assert needed - have == set(), f"the operator calls what RULES do not grant: {sorted(needed - have)}"


def _rbac(docs: list[dict]) -> dict[str, list[dict]]:
    return {k: by_kind(docs, k) for k in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")}


def _bound(docs: list[dict], sa: str) -> None:
    """Every role is bound to the operator's service account, and only to it."""
    r = _rbac(docs)
    for b in r["ClusterRoleBinding"] + r["RoleBinding"]:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}], b
        kind = b["roleRef"]["kind"]
        targets = [x for x in r[kind] if x["metadata"]["name"] == b["roleRef"]["name"]
                   and x["metadata"].get("namespace") == b["metadata"].get("namespace")]
        assert len(targets) == 1, b
    assert len(r["ClusterRoleBinding"]) == len(r["ClusterRole"]) and len(r["RoleBinding"]) == len(r["Role"])


def test_cluster_rbac_is_the_operator_rules():
    from tianji_operator.rbac import RULES

    docs = render()
    r = _rbac(docs)
    assert not r["Role"] and len(r["ClusterRole"]) == 1
    granted = triples(r["ClusterRole"][0]["rules"])
    # Watching all namespaces (no --namespace), Kopf's namespace observer makes no call:
    # the only RULES entry a cluster-wide install leaves out.
    assert granted == {t for t in triples(RULES) if t[:2] != ("", "namespaces")}
    _bound(docs, one(docs, "ServiceAccount")["metadata"]["name"])
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == \
        one(docs, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("variant", ["custom", "namespaced-release-ns"])
def test_namespaced_rbac_is_the_operator_rules(variant):
    from tianji_operator.rbac import RULES

    docs = render(VARIANTS[variant])
    values = merged_values(VARIANTS[variant])
    namespaces = values["watchNamespaces"] or [NAMESPACE]
    r = _rbac(docs)
    assert sorted(x["metadata"]["namespace"] for x in r["Role"]) == sorted(namespaces)
    namespaced = {t for t in triples(RULES) if t[:2] not in CLUSTER_SCOPED}
    for role in r["Role"]:
        assert triples(role["rules"]) == namespaced, role["metadata"]
    if values["rbac"]["discovery"]:
        (cr,) = r["ClusterRole"]
        assert triples(cr["rules"]) == {t for t in triples(RULES) if t[:2] in CLUSTER_SCOPED}
        assert {v for *_, v in triples(cr["rules"])} == {"list", "watch"}  # read-only
    else:
        assert not r["ClusterRole"]  # no cluster-wide permission at all
    _bound(docs, "tianji-sa" if variant == "custom" else one(docs, "ServiceAccount")["metadata"]["name"])


def test_rbac_create_false_renders_no_rbac():
    docs = render(VARIANTS["minimal"])
    assert not any(_rbac(docs).values()) and not by_kind(docs, "ServiceAccount")
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "default"
