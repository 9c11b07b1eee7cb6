"""A real Prometheus for the local cluster (built by `make cluster` with Kubernetes service
discovery, which Debian's package leaves out): it discovers pods through
`kubernetes_sd_configs` against the local API server (with a client certificate of its own,
`prometheus`, allowed to list and watch pods by RBAC) and relabels them as prometheus-operator
renders the chart's PodMonitor (charts/tianji-operator/templates/podmonitor.yaml): pods
labelled by the operator, their container port named `metrics`, `honor_labels`, target labels
namespace/pod/container. It scrapes the operator as prometheus-operator renders the chart's
ServiceMonitor (templates/servicemonitor.yaml, rendered by `helm template` and turned into a
scrape config here): the metrics Service's endpoints, its selector and port, honorLabels, and job
set to the Service's name. It listens on the cluster's bridge address, so pods reach it."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

import yaml

from localcluster.cluster import BIN, LocalCluster
from localcluster.controlplane import Proc

PORT = 19090  # on the cluster's own bridge address: nothing else listens there


def prometheus_url(c: LocalCluster) -> str:
    return f"http://{c.net.gateway}:{PORT}"


RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tianji-test-prometheus}
rules: [{apiGroups: [""], resources: [pods, services, endpoints], verbs: [list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tianji-test-prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tianji-test-prometheus}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: prometheus}]
"""


def _sd(c: LocalCluster, cert, role: str, namespaces: Optional[list[str]] = None) -> list[dict]:
    sd = {"role": role, "api_server": c.cp.server,
          "tls_config": {"ca_file": str(c.cp.pki.ca.cert), "cert_file": str(cert.cert), "key_file": str(cert.key)}}
    if namespaces:
        sd["namespaces"] = {"names": namespaces}
    return [sd]


def pod_monitor_scrape_config(c: LocalCluster, cert, interval: str) -> dict:
    label = lambda name: f"__meta_kubernetes_pod_label_{name}"
    return {
        "job_name": "podMonitor/tianji-system/tianji-jobs/0", "honor_labels": True, "metrics_path": "/metrics",
        "scrape_interval": interval, "scrape_timeout": interval,
        "kubernetes_sd_configs": _sd(c, cert, "pod"),
        "relabel_configs": [
            {"source_labels": [label("app_kubernetes_io_managed_by")], "regex": "tianji-operator", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_labelpresent_tianji_dev_job"], "regex": "true",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ],
    }


def service_monitor_scrape_config(c: LocalCluster, cert, interval: str, sm: dict) -> dict:
    """The scrape config prometheus-operator generates for `sm` (a rendered ServiceMonitor with
    one endpoint, matchLabels and matchNames), role endpoints as it uses by default."""
    (ep,) = sm["spec"]["endpoints"]
    meta = sm["metadata"]
    name = lambda k: "".join(ch if ch.isalnum() else "_" for ch in k)
    keep = [{"source_labels": [f"__meta_kubernetes_service_label_{name(k)}",
                               f"__meta_kubernetes_service_labelpresent_{name(k)}"],
             "regex": f"({v});true", "action": "keep"} for k, v in sm["spec"]["selector"]["matchLabels"].items()]
    target = lambda kind, label: {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                                                    "__meta_kubernetes_endpoint_address_target_name"],
                                  "separator": ";", "regex": f"{kind};(.*)", "replacement": "${1}",
                                  "target_label": label}
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(ep.get("honorLabels", False)), "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": interval, "scrape_timeout": interval,
        "kubernetes_sd_configs": _sd(c, cert, "endpoints", sm["spec"]["namespaceSelector"]["matchNames"]),
        "relabel_configs": [
            *keep,
            {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"], "action": "keep"},
            target("Node", "node"), target("Pod", "pod"),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ],
    }


class ClusterPrometheus:
    def __init__(self, c: LocalCluster, root: Path, interval: str = "1s", service_monitor: Optional[dict] = None):
        self.c, self.root, self.interval, self.service_monitor = c, Path(root), interval, service_monitor
        self.proc: Optional[Proc] = None
        self.url = ""

    def start(self) -> ClusterPrometheus:
        exe = BIN / "prometheus"
        if not exe.is_file():
            raise RuntimeError(f"no {exe}: run `make cluster` (it builds Prometheus with Kubernetes discovery)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.c.kubectl("apply", "-f", "-", input=RBAC)
        cert = self.c.cp.pki.issue("prometheus", "prometheus")
        cfg = {"global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                          "query_log_file": str(self.root / "queries.jsonl")},
               "scrape_configs": [pod_monitor_scrape_config(self.c, cert, self.interval)]}
        if self.service_monitor:
            cfg["scrape_configs"].append(service_monitor_scrape_config(self.c, cert, self.interval,
                                                                       self.service_monitor))
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.url = prometheus_url(self.c)
        host, port = self.c.net.gateway, PORT
        self.proc = Proc("prometheus", [str(exe), f"--config.file={self.root / 'prometheus.yml'}",
                                        f"--storage.tsdb.path={self.root / 'data'}",
                                        f"--web.listen-address={host}:{port}", "--storage.tsdb.retention.time=1h",
                                        "--log.level=warn"], self.root / "prometheus.log").start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200 and self.proc.alive():  # ours, not a leftover on the address
                        time.sleep(1.0)
                        if self.proc.alive():
                            return self
            except OSError:
                pass
            if not self.proc.alive():
                break
            time.sleep(0.3)
        raise RuntimeError(f"prometheus did not become ready:\n{self.proc.tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def query(self, promql: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=30) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise AssertionError(f"prometheus: {promql}: {body}")
        return body["data"]["result"]

    def queries(self) -> list[str]:
        """The PromQL expressions this server was asked (its query log)."""
        out = []
        path = self.root / "queries.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line)["params"]["query"])
            except (ValueError, KeyError):
                continue
        return out
