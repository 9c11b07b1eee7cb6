"""What the chart, dashboard and image tests share: paths, the values variants that exercise
every template branch, and rendering the chart with helm-python-sdk (no helm binary)."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

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
                 "prometheusAllowList": ["http://kube-prometheus-stack-prometheus.monitoring:9090"],
                 "workerDefaults": {"priorityClassName": "rl-batch", "imagePullSecrets": ["registry-creds"],
                                    "nodeSelector": {"pool": "rl"},
                                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl",
                                                     "effect": "NoSchedule"}]},
                 "verbose": True,
                 "extraEnv": [{"name": "TIANJI_PROMQL_NAMESPACE_LABEL", "value": "kubernetes_namespace"}]},
    "hostNetwork": {"portRange": "40000-40999"},
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
    import helm_python  # the callers' modules skip without it (pytest.importorskip)

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


def merge(base: dict, over: dict) -> dict:
    """`over` merged into `base` the way Helm merges values (dicts recursively, the rest replaced)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def default_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def merged_values(over: dict) -> dict:
    """The values a release with `over` renders with."""
    return merge(default_values(), over)
