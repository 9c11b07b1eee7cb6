"""The Helm chart, Grafana dashboard and container images (no helm binary, no cluster).

The chart is linted and rendered with helm-python-sdk (the Helm SDK as a
library), every rendered object is validated against Kubernetes' own schemas
(kubernetes-validate, strict), and the parts that must agree with the code are
checked against the code:

* RBAC == `tianji_operator.rbac.RULES` == what the operator's code calls
  (Kopf's needs derived from its handlers, the operator's from its
  `KubeClient` call sites), so a new API call without a rule fails here;
* the operator Deployment's args/env are accepted by the operator's CLI and
  config, its pod labels are admitted by the job NetworkPolicy's scrapers;
* the PodMonitor selects the pods the operator builds, on their `metrics` port;
* every metric the dashboard queries is exported by `tianji.observability.metrics`
  (or is on an explicit allow-list of kube-state-metrics series);
* the chart's CRD is `crds/tianjijob.yaml`, byte for byte;
* the images pin the torch the project pins, run as non-root, and the slim
  operator image installs every distribution the operator imports.
"""
from __future__ import annotations

import ast
import copy
import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")

from helpers import operator_image_requirements  # noqa: E402
from tianji.observability import metrics as tianji_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "tianji-operator"
DASHBOARD = CHART / "dashboards" / "tianji.json"
OPERATOR_SRC = ROOT / "operator" / "tianji_operator"
IMAGES = ROOT / "images"
K8S_VERSION = "1.33.0"
RELEASE, NAMESPACE = "tianji", "tianji-system"

# Values that change every branch of the templates.
CUSTOM = {
    "image": {"repository": "registry.example.com/ml/tianji-operator", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "fullnameOverride": "tj-op",
    "rbac": {"create": True, "scope": "namespaced", "discovery": True},
    "watchNamespaces": ["rl-team", "rl-bench"],
    "serviceAccount": {"create": True, "name": "tianji-sa", "annotations": {"iam.example.com/role": "tianji"}},
    "operator": {"monitorInterval": 5, "autoscaleTick": 2.5, "handlerBackoff": 3, "promqlWindow": "2m",
                 "metricsScrapers": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "vmagent"}}}],
                 "verbose": True, "extraEnv": [{"name": "TIANJI_PROMQL_NAMESPACE_LABEL", "value": "kubernetes_namespace"}]},
    "metrics": {"port": 9100, "service": {"type": "ClusterIP", "annotations": {"example.com/scrape": "true"}}},
    "health": {"port": 9101},
    "resources": {"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": 2, "memory": "1Gi"}},
    "podAnnotations": {"example.com/team": "rl"},
    "podLabels": {"team": "rl"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}}]}},
    "priorityClassName": "system-cluster-critical",
    "runAsUser": 20000,
    "runAsGroup": 20000,
    "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "interval": "10s"},
                   "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                                      "interval": "1m"}},
    "dashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "rl"},
                  "annotations": {"grafana_folder": "TianJi"}},
}
VARIANTS = {
    "default": {},
    "custom": CUSTOM,
    "cluster-monitors": {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}},
    "namespaced-release-ns": {"rbac": {"create": True, "scope": "namespaced", "discovery": False}},
    "minimal": {"rbac": {"create": False, "scope": "cluster"}, "serviceAccount": {"create": False},
                "dashboard": {"enabled": False}},
}


def render(values: dict | None = None, name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict]:
    chart = helm_python.Chart.load(str(CHART))
    out = chart.render(copy.deepcopy(values or {}), name=name, namespace=namespace)
    docs = []
    for path, text in sorted(out.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# ----------------------------------------------------------------- chart basics
def test_chart_metadata():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "tianji-operator"
    assert meta["version"] == "0.1.0" and str(meta["appVersion"]) == "0.1.0"
    assert md.version("tianji") == meta["appVersion"], "chart appVersion != the tianji package version"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chart_lints_strict(variant):
    result = helm_python.lint(str(CHART), copy.deepcopy(VARIANTS[variant]), strict=True, kube_version="v1.30.0",
                              namespace=NAMESPACE)
    assert result["errors"] == [], result
    # Severity: 1 info (e.g. "icon is recommended"), 2 warning, 3 error; --strict fails on warnings.
    assert [m for m in result["messages"] if m["severity"] >= 2] == [], result


def test_values_yaml_validates_against_its_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    for name, values in VARIANTS.items():
        merged = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
        assert not list(jsonschema.Draft7Validator(schema).iter_errors(merged)), name


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@pytest.mark.parametrize("bad", [
    {"replicaCount": 2},                                           # unknown top-level key
    {"image": {"repository": "x", "tga": "1"}},                    # typo in a nested key
    {"image": {"repository": ""}},
    {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
    {"rbac": {"create": True, "scope": "everything"}},
    {"rbac": {"create": "yes", "scope": "cluster"}},
    {"watchNamespaces": ["Not_A_Namespace"]},
    {"metrics": {"port": 80}},                                     # privileged port for a non-root process
    {"health": {"port": 70000}},
    {"runAsUser": 0},                                              # root
    {"resources": {"requests": {"cpu": "lots"}}},
    {"resources": {"reqests": {"cpu": "1"}}},
    {"operator": {"monitorInterval": 0}},
    {"operator": {"promqlWindow": "one minute"}},
    {"operator": {"metricsScrapers": [{"podSelecter": {}}]}},
    {"monitoring": {"podMonitor": {"enabled": "true"}}},
    {"monitoring": {"podMonitor": {"enabled": True, "interval": "often"}}},
    {"monitoring": {"prometheusRule": {"enabled": True}}},
    {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": 1}}},
    {"serviceAccount": {"create": True, "annotation": {}}},
])
def test_values_breaking_the_schema_are_refused(bad):
    with pytest.raises(helm_python.HelmError, match="schema"):
        render(bad)


def test_default_render_objects():
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                            "ConfigMap"]), kinds
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert d["metadata"]["labels"]["helm.sh/chart"] == "tianji-operator-0.1.0"
    # The monitoring.coreos.com kinds are opt-in: .Capabilities cannot tell whether their CRDs exist.
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]


def _check_monitoring_object(doc: dict) -> None:
    """Structural check of the Prometheus Operator objects (no schema in kubernetes-validate):
    the subset of their CRD schemas this chart uses, unknown fields refused."""
    selector = {"type": "object", "additionalProperties": False, "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}}}}
    endpoint = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
        "port": {"type": "string", "minLength": 1}, "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                                  "(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
        "honorLabels": {"type": "boolean"}}}
    namespace_selector = {"type": "object", "additionalProperties": False, "properties": {
        "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
    list_key = {"PodMonitor": "podMetricsEndpoints", "ServiceMonitor": "endpoints"}[doc["kind"]]
    schema = {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
              "properties": {
                  "apiVersion": {"const": "monitoring.coreos.com/v1"},
                  "kind": {"enum": ["PodMonitor", "ServiceMonitor"]},
                  "metadata": {"type": "object", "required": ["name", "namespace"]},
                  "spec": {"type": "object", "additionalProperties": False, "required": ["selector", list_key],
                           "properties": {"selector": selector, "namespaceSelector": namespace_selector,
                                          list_key: {"type": "array", "minItems": 1, "items": endpoint}}}}}
    jsonschema.validate(doc, schema)
    # metadata itself is an ordinary ObjectMeta: validate it through a kind that has a schema.
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                 K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_manifest_validates_strictly(variant):
    docs = render(VARIANTS[variant])
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            _check_monitoring_object(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_chart_crd_is_the_repository_crd_byte_for_byte():
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["tianjijob.yaml"]
    assert (CHART / "crds" / "tianjijob.yaml").read_bytes() == (ROOT / "crds" / "tianjijob.yaml").read_bytes(), \
        "charts/tianji-operator/crds/tianjijob.yaml differs from crds/tianjijob.yaml: run `make crd`"
    crd = yaml.safe_load((CHART / "crds" / "tianjijob.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


# ----------------------------------------------------------------- the operator Deployment
def _container(docs: list[dict]) -> dict:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("variant", ["default", "custom"])
def test_deployment_is_hardened(variant):
    docs = render(VARIANTS[variant])
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"  # Kopf standalone
    pod = dep["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["runAsGroup"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    c = _container(docs)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc and not pod.get("hostNetwork") and not pod.get("hostPID")
    # Something writable for Python/Kopf temp files despite the read-only root.
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in vol
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] == "health", probe
    assert ports["health"] != ports["metrics"]
    assert c["command"] == ["python", "-m", "tianji_operator"]


def test_deployment_defaults_match_the_operator():
    """Ports 8080 (metrics) and 8081 (liveness), as the operator's CLI defaults."""
    from tianji_operator.__main__ import build_parser

    c = _container(render())
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    defaults = build_parser().parse_args([])
    assert ports == {"metrics": defaults.metrics_port, "health": defaults.liveness_port} == \
        {"metrics": 8080, "health": 8081}
    assert _image(render()) == "tianji-operator:0.1.0"


def _image(docs):
    return _container(docs)["image"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_operator_cli_and_config_accept_what_the_chart_passes(variant):
    from tianji_operator.__main__ import build_parser
    from tianji_operator.config import OperatorConfig

    docs = render(VARIANTS[variant])
    c = _container(docs)
    args = build_parser().parse_args(c["args"])  # argparse exits on an unknown flag
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.metrics_port == ports["metrics"] and args.liveness_port == ports["health"]
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), VARIANTS[variant])
    if values["rbac"]["scope"] == "namespaced":
        assert args.namespace == (values["watchNamespaces"] or [NAMESPACE])
    else:
        assert args.namespace == []  # all namespaces (Kopf clusterwide)
    env = {e["name"]: e.get("value") for e in c["env"]}
    tianji_env = {k: v for k, v in env.items() if k.startswith("TIANJI_")}
    config_src = (OPERATOR_SRC / "config.py").read_text()
    for k in tianji_env:
        assert f'"{k}"' in config_src, f"{k} is not read by OperatorConfig.from_env"
    cfg = OperatorConfig.from_env(tianji_env)
    if variant == "custom":
        assert (cfg.monitor_interval, cfg.autoscale_tick, cfg.handler_backoff, cfg.promql_window) == (5, 2.5, 3, "2m")
        assert cfg.metrics_scrapers == CUSTOM["operator"]["metricsScrapers"]
        assert cfg.promql_namespace_label == "kubernetes_namespace"
        assert args.verbose
        assert _image(docs) == "registry.example.com/ml/tianji-operator:0.1.0-rc1"
        assert c["imagePullPolicy"] == "Always"
        assert c["resources"] == CUSTOM["resources"]
        pod = one(docs, "Deployment")["spec"]["template"]
        assert pod["metadata"]["labels"]["team"] == "rl"
        assert pod["metadata"]["annotations"] == {"example.com/team": "rl"}
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["spec"]["securityContext"]["runAsUser"] == 20000
        assert pod["spec"]["serviceAccountName"] == "tianji-sa"
    elif variant == "default":
        assert tianji_env == {}  # the operator's own defaults apply


def test_operator_pods_are_admitted_by_the_job_networkpolicy_scrapers():
    """With no Prometheus URL the operator scrapes job pods itself; the NetworkPolicy it
    writes admits pods labelled like the chart's operator pod."""
    from tianji_operator.config import DEFAULT_SCRAPERS

    labels = one(render(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert any(all(labels.get(k) == v for k, v in p["podSelector"]["matchLabels"].items())
               for p in DEFAULT_SCRAPERS), (labels, DEFAULT_SCRAPERS)
    # ... whatever the release is called.
    labels = one(render({"fullnameOverride": "x"}, name="other"), "Deployment")["spec"]["template"]["metadata"]
    assert labels["labels"]["app.kubernetes.io/name"] == "tianji-operator"


@pytest.mark.parametrize("variant", ["default", "custom"])
def test_metrics_service_and_servicemonitor_reach_the_operator(variant):
    docs = render(VARIANTS[variant])
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service")
    assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics"
    assert port["port"] == {p["name"]: p["containerPort"] for p in _container(docs)["ports"]}["metrics"]
    for sm in by_kind(docs, "ServiceMonitor"):
        assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
        assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]


def test_servicemonitor_and_podmonitor_are_opt_in():
    assert not by_kind(render(), "PodMonitor") and not by_kind(render(), "ServiceMonitor")
    docs = render(VARIANTS["cluster-monitors"])
    assert len(by_kind(docs, "PodMonitor")) == 1 and len(by_kind(docs, "ServiceMonitor")) == 1
    docs = render({"monitoring": {"podMonitor": {"enabled": True}}})
    assert len(by_kind(docs, "PodMonitor")) == 1 and not by_kind(docs, "ServiceMonitor")


@pytest.mark.parametrize("variant", ["cluster-monitors", "custom"])
def test_podmonitor_selects_the_pods_the_operator_builds(variant):
    from tianji.control.spec import parse_job
    from tianji_operator import builders

    docs = render(VARIANTS[variant])
    pm = one(docs, "PodMonitor")
    job = parse_job(yaml.safe_load((ROOT / "examples" / "cartpole-ppo.yaml").read_text()))
    pods = [builders.role_pod(job, "learner", 0, 0, ["tianji", "worker"]),
            builders.actor_statefulset(job, 0, 2, ["tianji", "worker"])["spec"]["template"]]
    sel = pm["spec"]["selector"]
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items()), labels
        for e in sel.get("matchExpressions", []):
            assert e["operator"] == "Exists" and e["key"] in labels
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= ports
    # The workers label their series job=<TianJiJob>; without honorLabels Prometheus would
    # rename it exported_job and the dashboard's and autoscaler's job="..." filters would miss.
    assert all(e["honorLabels"] is True for e in pm["spec"]["podMetricsEndpoints"])
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), VARIANTS[variant])
    if values["rbac"]["scope"] == "namespaced":
        assert pm["spec"]["namespaceSelector"] == {"matchNames": values["watchNamespaces"]}
    else:
        assert pm["spec"]["namespaceSelector"] == {"any": True}


def test_dashboard_configmap_embeds_the_dashboard():
    for variant in ("default", "custom"):
        docs = render(VARIANTS[variant])
        (cm,) = [d for d in by_kind(docs, "ConfigMap") if "tianji.json" in d.get("data", {})]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"]["tianji.json"].strip() == DASHBOARD.read_text().strip()
        assert json.loads(cm["data"]["tianji.json"]) == json.loads(DASHBOARD.read_text())
    assert one(render(CUSTOM), "ConfigMap")["metadata"]["namespace"] == "monitoring"
    assert not by_kind(render({"dashboard": {"enabled": False}}), "ConfigMap")


# ----------------------------------------------------------------- RBAC
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}


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
    kind the child builders (builders.py) write. `patch_status` patches the status
    subresource (verb "patch/status"). A call this function cannot attribute fails the
    test, so a new way of calling the API cannot slip past the RBAC check."""
    from tianji_operator.kube import KINDS

    built = _built_kinds()
    assert built and built <= set(KINDS), (built, set(KINDS))
    calls: set[tuple[str, str]] = set()
    unknown = []
    for path in sorted(OPERATOR_SRC.glob("*.py")):
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
    tree = ast.parse((OPERATOR_SRC / "builders.py").read_text())
    return {v.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
            for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and k.value == "kind" and isinstance(v, ast.Constant)}


def _kopf_needs() -> set[tuple[str, str, str]]:
    """What Kopf itself calls for the way the operator uses it (kopf 1.x):
    handlers on the CRD → list+watch (the watch stream) and patch (finalizer, progress and
    diff-base annotations); status written through the status subresource when the CRD has
    one; events for kopf.info/warn/exception (core v1 events); the CRD observer; and the
    namespace observer, which runs only when the operator is given namespaces."""
    from tianji.control.crd import GROUP, PLURAL

    src = "\n".join(p.read_text() for p in OPERATOR_SRC.glob("*.py"))
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
    for group, _version, plural in re.findall(r'@kopf\.on\.event\("([^"]*)", "([^"]*)", "([^"]*)"', src):
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
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), VARIANTS[variant])
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


# ----------------------------------------------------------------- dashboard
# Series the dashboard reads that TianJi does not export: kube-state-metrics.
EXTERNAL_METRICS = {
    "kube_statefulset_replicas",               # actors desired (StatefulSet <job>-actor-<g>)
    "kube_statefulset_status_replicas_ready",  # actors ready
    "kube_pod_container_status_restarts_total",
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}
RANGE_FUNCS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes"}
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
TIANJI_LABELS = set(tianji_metrics.LABELS) | {"reason", "le", "namespace", "pod", "instance"}


def _blank_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in a PromQL expression."""
    s = _blank_strings(expr)
    s = re.sub(r"\[[^\]]*\]", "", s)  # range/subquery durations (may hold $__rate_interval)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*(\([^)]*\))?", " ", s)
    out = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", s):
        name, matchers = m.group(1), m.group(2)
        if s[m.end():].lstrip().startswith("(") and not matchers:
            continue  # a function or an aggregation
        if name.lower() in PROMQL_WORDS or s[max(0, m.start() - 1)] == "$":
            continue
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        out.append((name, labels))
    return out


def test_promql_selector_parser():
    got = promql_selectors('histogram_quantile(0.9, sum by (le) (rate(tianji_policy_lag_bucket{job="$job", '
                           'group=~"a|b"}[$__rate_interval]))) / on (group) group_left max(kube_x) and up')
    assert got == [("tianji_policy_lag_bucket", {"job", "group"}), ("kube_x", set()), ("up", set())]


def _dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and variable query."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)\s*", q)
            assert m, f"variable {v['name']}: expected label_values(<selector>, <label>), got {q}"
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def test_dashboard_json_is_a_grafana_dashboard_with_variables():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "job", "group"} <= set(variables)
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert variables["job"]["type"] == "query" and variables["group"]["type"] == "query"
    assert variables["group"]["multi"] and variables["group"]["includeAll"] and variables["group"]["allValue"] == ".*"
    ids, grid = set(), []
    for p in dash["panels"]:
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        grid.append(g)
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
            assert '$job' in t["expr"], f"panel {p['title']!r} does not filter by the job variable"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_metric_is_exported():
    dash = json.loads(DASHBOARD.read_text())
    exported = tianji_metrics.metric_names()
    used: set[str] = set()
    problems = []
    for where, expr in _dashboard_exprs(dash):
        bare = _blank_strings(expr)
        for o, c in ("()", "{}", "[]"):
            depth = 0
            for ch in bare:
                depth += (ch == o) - (ch == c)
                assert depth >= 0, f"{where}: unbalanced {o}{c} in {expr}"
            assert depth == 0, f"{where}: unbalanced {o}{c} in {expr}"
        sels = promql_selectors(expr)
        assert sels, f"{where}: no metric in {expr}"
        for name, labels in sels:
            used.add(name)
            if name.startswith(tianji_metrics.PREFIX):
                if name not in exported:
                    problems.append(f"{where}: {name} is not exported by tianji.observability.metrics")
                if labels - TIANJI_LABELS:
                    problems.append(f"{where}: {name} has no label(s) {sorted(labels - TIANJI_LABELS)}")
                base = name.removeprefix(tianji_metrics.PREFIX)
                if "reason" in labels and base not in tianji_metrics.REASON_LABELED:
                    problems.append(f"{where}: {name} has no reason label")
            elif name not in EXTERNAL_METRICS:
                problems.append(f"{where}: {name} is neither a tianji_ metric nor on the external allow-list")
        for fn, metric in re.findall(r"\b(\w+)\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*\{", _blank_strings(expr)):
            if fn in RANGE_FUNCS and not metric.endswith(COUNTER_SUFFIXES):
                problems.append(f"{where}: {fn}() over {metric}, which is not a counter")
    assert not problems, "\n".join(problems)
    # What the dashboard promises to show.
    p = tianji_metrics.PREFIX
    must = {p + "env_frames_total", p + "samples_received_total", p + "samples_consumed_total",
            p + "policy_lag_bucket", p + "policy_version", p + "replay_ratio", p + "episode_return_mean",
            p + "messages_rejected_total", p + "samples_dropped_total"} | EXTERNAL_METRICS
    assert must <= used, sorted(must - used)
    assert EXTERNAL_METRICS <= used, "an allow-listed external metric is no longer used: drop it from the list"


def test_dashboard_reads_actor_statefulsets_by_the_operator_names():
    from tianji.control.addressing import actor_set_name

    text = DASHBOARD.read_text()
    assert actor_set_name("$job", 0).replace("0", "$group") in text  # statefulset=~"$job-actor-$group"


# ----------------------------------------------------------------- images
def _dockerfile(name: str) -> str:
    return (IMAGES / f"{name}.Dockerfile").read_text()


def _arg_default(text: str, arg: str) -> str:
    m = re.search(rf"^ARG {arg}=(\S+)$", text, re.M)
    assert m, f"ARG {arg}=... missing"
    return m.group(1)


def _pyproject_torch() -> str:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in deps if re.match(r"torch\b", d)]
    return torch.split("==")[1]


@pytest.mark.parametrize("name", ["worker", "operator"])
def test_images_are_multistage_slim_and_non_root(name):
    text = _dockerfile(name)
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    assert len(froms) >= 2 and froms[-1][1] == "runtime", froms
    assert _arg_default(text, "BASE_IMAGE").startswith("python:3.11-slim")
    assert "COPY --from=build /opt/venv /opt/venv" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and all(u.split(":")[0] not in ("0", "root") for u in users)
    uid = int(users[-1].split(":")[0])
    assert uid > 0
    assert yaml.safe_load((CHART / "values.yaml").read_text())["runAsUser"] == uid or name == "worker"
    assert "pip install -c /tmp/constraints.txt" in text
    # The build context is the repository root: everything but the sources stays out (.venv!).
    ignore = [line.strip() for line in (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()]
    assert "*" in ignore and not any(line.startswith("!.venv") for line in ignore)


def test_worker_image_pins_cpu_torch_with_a_cuda_option():
    text = _dockerfile("worker")
    assert _arg_default(text, "TORCH_VERSION") == _pyproject_torch() == "2.13.0"
    assert _arg_default(text, "TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    assert '"torch==${TORCH_VERSION}"' in text and '--index-url "${TORCH_INDEX_URL}"' in text
    assert re.search(r"^ENTRYPOINT \[\"tianji\"\]$", text, re.M)
    pins = _constraints()
    assert pins["torch"] == _pyproject_torch()


def test_operator_image_entrypoint():
    text = _dockerfile("operator")
    assert re.search(r'^ENTRYPOINT \["python", "-m", "tianji_operator"\]$', text, re.M)
    assert "torch" not in re.sub(r"#.*", "", text)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _constraints() -> dict[str, str]:
    out = {}
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[_canon(name)] = version
    return out


def _closure(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    seen: set[str] = set()
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name = _canon(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        for r in dist.requires or []:
            r = Requirement(r)
            extras = [""] + sorted(req.extras)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
                stack.append(r)
    return seen


def test_image_constraints_pin_every_dependency():
    pins = _constraints()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.]*", v) for v in pins.values()), pins
    worker = _closure(["tianji"]) - {"tianji"}
    operator = _closure(operator_image_requirements())
    # Platform-conditional packages (nvidia-*, triton) are pinned exactly by torch itself.
    missing = sorted(n for n in (worker | operator) if n not in pins and not n.startswith(("nvidia-", "triton")))
    assert not missing, f"images/constraints.txt does not pin {missing}"


def test_operator_image_installs_everything_the_operator_imports():
    """The operator image installs tianji --no-deps plus operator-requirements.txt. Simulate it:
    import the operator in a subprocess where every third-party distribution outside that set
    is unimportable (optional imports then fall back exactly as they would in the image)."""
    allowed = sorted(_closure(operator_image_requirements()))
    code = r"""
import importlib.abc, importlib.metadata as md, json, re, sys
allowed = set(json.loads(sys.argv[1]))
owners = md.packages_distributions()
blocked = set()
class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ("tianji", "tianji_operator"):
            return None
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(top, [])}
        if dists and not dists & allowed:
            blocked.add(top)
            raise ModuleNotFoundError(f"No module named {name!r} (not in the operator image)", name=name)
        return None
sys.meta_path.insert(0, NotInImage())
import tianji_operator.__main__, tianji_operator.handlers, tianji_operator.autoscaler, tianji_operator.rbac
tianji_operator.__main__.build_parser().parse_args([])
print(json.dumps({"torch": "torch" in sys.modules, "blocked": sorted(blocked)}))
"""
    res = subprocess.run([sys.executable, "-c", code, json.dumps(allowed)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"the operator does not import with only its image's packages:\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert not out["torch"], "the operator imports torch: its image would need it (see operator.Dockerfile)"
