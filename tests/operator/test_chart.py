"""The Helm chart (no helm binary, no cluster): lint, values schema, rendering, the operator
Deployment and the monitoring objects.

The chart is linted and rendered with helm-python-sdk (the Helm SDK as a library), every
rendered object is validated against Kubernetes' own schemas (kubernetes-validate, strict),
and the parts that must agree with the code are checked against the code:

* the operator Deployment's args/env are accepted by the operator's CLI and
  config, its pod labels are admitted by the job NetworkPolicy's scrapers;
* the PodMonitor selects the pods the operator builds, on their `metrics` port;
* the dashboard ConfigMap embeds `dashboards/tianji.json` (its expressions: test_dashboard.py);
* the chart's CRD is `crds/tianjijob.yaml`, byte for byte.

RBAC: test_chart_rbac.py; the container images: test_operator_image.py.
"""
from __future__ import annotations

import copy
import importlib.metadata as md
import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")

from chart_support import (  # noqa: E402
    CHART,
    CUSTOM,
    DASHBOARD,
    K8S_VERSION,
    NAMESPACE,
    OPERATOR_SRC,
    RELEASE,
    ROOT,
    VARIANTS,
    by_kind,
    merged_values,
    one,
    render,
)


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
        merged = merged_values(values)
        assert not list(jsonschema.Draft7Validator(schema).iter_errors(merged)), name



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
                            "ConfigMap", "Job"]), kinds  # Job: the uninstall hook
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
    values = merged_values(VARIANTS[variant])
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
        assert cfg.prometheus_allowed == ["http://kube-prometheus-stack-prometheus.monitoring:9090"]
        assert cfg.host_port_range == "40000-40999"
        defaults = CUSTOM["operator"]["workerDefaults"]
        assert cfg.worker_defaults.model_dump(by_alias=True, exclude_none=True) == defaults | {
            "tolerations": [{**defaults["tolerations"][0]}]}
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
        # The operator's per-job gauges carry the TianJiJob's namespace/job (the dashboard's
        # actor and restart panels filter on them): renamed exported_* they would select nothing.
        assert all(e["honorLabels"] is True for e in sm["spec"]["endpoints"])


def test_servicemonitor_and_podmonitor_are_opt_in():
    assert not by_kind(render(), "PodMonitor") and not by_kind(render(), "ServiceMonitor")
    docs = render(VARIANTS["cluster-monitors"])
    assert len(by_kind(docs, "PodMonitor")) == 1 and len(by_kind(docs, "ServiceMonitor")) == 1
    docs = render({"monitoring": {"podMonitor": {"enabled": True}}})
    assert len(by_kind(docs, "PodMonitor")) == 1 and not by_kind(docs, "ServiceMonitor")


@pytest.mark.parametrize("variant", ["cluster-monitors", "custom"])
def test_podmonitor_selects_the_pods_the_operator_builds(variant):
    from tianji.control.spec import parse_job
    from tianji_operator.children import builders

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
    values = merged_values(VARIANTS[variant])
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



@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_uninstall_hook_releases_the_jobs_as_the_operator(variant):
    """helm uninstall runs tianji_operator.release (pre-delete) with the operator's ServiceAccount,
    whose rules cover what it calls (it lives in the operator package: test_chart_rbac derives them)."""
    from tianji_operator.release import build_parser

    docs = render(VARIANTS[variant])
    hooks = [d for d in docs if d["kind"] == "Job"]
    if not merged_values(VARIANTS[variant])["rbac"]["create"]:
        assert hooks == []  # the ServiceAccount may not be allowed to: a failing hook blocks helm uninstall
        return
    (hook,) = hooks
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = hook["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "tianji_operator.release"]
    args = build_parser().parse_args(c["args"])
    values = merged_values(VARIANTS[variant])
    if values["rbac"]["scope"] == "namespaced":
        assert args.namespace == (values["watchNamespaces"] or [NAMESPACE])
    else:
        assert args.namespace == []
    assert args.wait == 60 and not args.delete_jobs


def test_uninstall_hook_options():
    docs = render({"uninstall": {"deleteJobs": True, "waitSeconds": 5}})
    (hook,) = [d for d in docs if d["kind"] == "Job"]
    assert "--delete-jobs" in hook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [d for d in render({"uninstall": {"releaseJobs": False}}) if d["kind"] == "Job"]
