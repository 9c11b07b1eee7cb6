"""Rescaling on the real control plane: `kubectl scale tjj` through the CRD's scale subresource,
and the operator's autoscaler deciding from a real Prometheus that discovered the job's pods
with kubernetes_sd_configs (the chart's PodMonitor, as prometheus-operator renders it)."""
from __future__ import annotations

import json

import pytest

from cluster_jobs import JOB, condition, diagnostics, example, pods, status
from clusterkit import get, wait_for
from tianji_operator.timers import autoscaler as asc

STS = f"{JOB}-actor-0"
FOREVER = {"stop": {"meanReturn": None, "envFrames": None, "seconds": 600}}


def actor_pods(c, ns: str) -> list[dict]:
    return [p for p in pods(c, ns) if p["metadata"]["labels"].get("tianji.dev/role") == "actor"
            and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


@pytest.mark.timeout(600)
def test_kubectl_scale_sets_the_actor_count(cluster, operator, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(FOREVER))
    wait_for(lambda: len(actor_pods(cluster, namespace)) == 2, 180, "2 actor pods running",
             on_timeout=lambda: diagnostics(cluster, namespace))
    cluster.kubectl("scale", f"tjj/{JOB}", "-n", namespace, "--replicas=3")
    wait_for(lambda: len(actor_pods(cluster, namespace)) == 3, 180, "3 actor pods running",
             on_timeout=lambda: diagnostics(cluster, namespace))
    assert get(cluster, "statefulset", "-n", namespace, STS)["spec"]["replicas"] == 3
    scale = json.loads(cluster.kubectl("get", "--raw",
                                       f"/apis/tianji.dev/v1alpha1/namespaces/{namespace}/tianjijobs/{JOB}/scale").stdout)
    assert scale["spec"]["replicas"] == 3
    wait_for(lambda: status(cluster, namespace).get("actorReplicas") == 3, 60, "status.actorReplicas 3")
    # the StatefulSet's pods are spread by the real scheduler over the two nodes' capacity
    nodes = {p["spec"]["nodeName"] for p in actor_pods(cluster, namespace)}
    assert nodes <= {"node-1", "node-2"} and nodes, nodes


@pytest.mark.timeout(600)
def test_the_autoscaler_rescales_from_a_real_prometheus(cluster, operator, prometheus, namespace):
    # Unpaced actors and replayRatio 4: produced/needed >= 4 > 1 + band once the learner consumes
    # anything, so the autoscaler removes one actor (2 -> 1, the minimum).
    spec = {"autoscale": {"enabled": True, "prometheusUrl": prometheus.url, "minActors": 1, "maxActors": 2,
                          "band": 0.15, "cooldownSeconds": 0, "intervalSeconds": 2},
            "staleness": {"paceActors": False, "replayRatio": 4}, **FOREVER}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(spec))
    wait_for(lambda: ((get(cluster, "statefulset", "-n", namespace, STS) or {}).get("spec") or {}).get("replicas") == 1,
             150,
             "the autoscaler to scale the actors down", interval=2.0,
             on_timeout=lambda: diagnostics(cluster, namespace))
    st = status(cluster, namespace)
    decision = st["autoscale"]["lastDecision"]
    assert decision["decision"] == "down" and decision["source"] == "prometheus", decision
    assert decision["groups"][0]["producedFps"] > 0, decision
    rescaled = condition(st, "Rescaled")
    assert rescaled and rescaled["reason"] == "ScaledDown", st
    # The operator asked this Prometheus its queries, and it scraped the workers themselves.
    wanted = asc.promql_queries(JOB, namespace, "10s")
    assert set(wanted.values()) <= set(prometheus.queries()), sorted(set(wanted.values()) - set(prometheus.queries()))
    frames = prometheus.query(f'tianji_env_frames_total{{job="{JOB}",namespace="{namespace}",role="actor"}}')
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(cluster, namespace)}
    assert frames, frames
    for r in frames:
        assert r["metric"]["pod"].startswith(f"{JOB}-actor-0-")
        if r["metric"]["pod"] in ips:
            assert r["metric"]["instance"].split(":")[0] == ips[r["metric"]["pod"]]
