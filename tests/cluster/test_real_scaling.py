"""Rescaling on the real nodes: `kubectl scale tjj` through the CRD's scale subresource, and the
operator's autoscaler deciding from a real Prometheus that discovered the job's pods with
kubernetes_sd_configs (the chart's PodMonitor, as prometheus-operator renders it) and scraped
them through their enforced NetworkPolicy (the chart's `metricsScrapers` admit it)."""
from __future__ import annotations

import json

import pytest

from cluster_jobs import FOREVER, JOB, condition, diagnostics, on_real_nodes, pods, running, status
from clusterkit import get, wait_for
from tianji_operator.timers import autoscaler as asc

STS = f"{JOB}-actor-0"


@pytest.mark.timeout(600)
def test_kubectl_scale_sets_the_actor_count(real, real_operator, ns):
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, FOREVER))
    wait_for(lambda: len(running(real, ns, "actor")) == 2, 180, "2 actor pods running",
             on_timeout=lambda: diagnostics(real, ns))
    real.kubectl("scale", f"tjj/{JOB}", "-n", ns, "--replicas=3")
    wait_for(lambda: len(running(real, ns, "actor")) == 3, 180, "3 actor pods running",
             on_timeout=lambda: diagnostics(real, ns))
    assert get(real, "statefulset", "-n", ns, STS)["spec"]["replicas"] == 3
    scale = json.loads(real.kubectl("get", "--raw",
                                    f"/apis/tianji.dev/v1alpha1/namespaces/{ns}/tianjijobs/{JOB}/scale").stdout)
    assert scale["spec"]["replicas"] == 3
    wait_for(lambda: status(real, ns).get("actorReplicas") == 3, 60, "status.actorReplicas 3")
    # the StatefulSet's pods are placed by the real scheduler on the two real nodes
    nodes = {p["spec"]["nodeName"] for p in running(real, ns, "actor").values()}
    assert nodes <= {"node-2", "node-3"} and nodes, nodes


@pytest.mark.timeout(600)
def test_the_autoscaler_rescales_from_a_real_prometheus(real, real_operator, prometheus, ns):
    # Unpaced actors and replayRatio 4: produced/needed >= 4 > 1 + band once the learner consumes
    # anything, so the autoscaler removes one actor (2 -> 1, the minimum).
    spec = {"autoscale": {"enabled": True, "prometheusUrl": prometheus.url, "minActors": 1, "maxActors": 2,
                          "band": 0.15, "cooldownSeconds": 0, "intervalSeconds": 2},
            "staleness": {"paceActors": False, "replayRatio": 4}, **FOREVER}
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, spec))
    wait_for(lambda: ((get(real, "statefulset", "-n", ns, STS) or {}).get("spec") or {}).get("replicas") == 1,
             150,
             "the autoscaler to scale the actors down", interval=2.0,
             on_timeout=lambda: diagnostics(real, ns))
    st = status(real, ns)
    decision = st["autoscale"]["lastDecision"]
    assert decision["decision"] == "down" and decision["source"] == "prometheus", decision
    assert decision["groups"][0]["producedFps"] > 0, decision
    rescaled = condition(st, "Rescaled")
    assert rescaled and rescaled["reason"] == "ScaledDown", st
    # The operator asked this Prometheus its queries, and it scraped the workers themselves.
    wanted = asc.promql_queries(JOB, ns, "10s")
    assert set(wanted.values()) <= set(prometheus.queries()), sorted(set(wanted.values()) - set(prometheus.queries()))
    frames = prometheus.query(f'tianji_env_frames_total{{job="{JOB}",namespace="{ns}",role="actor"}}')
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(real, ns)}
    assert frames, frames
    for r in frames:
        assert r["metric"]["pod"].startswith(f"{JOB}-actor-0-")
        if r["metric"]["pod"] in ips:
            assert r["metric"]["instance"].split(":")[0] == ips[r["metric"]["pod"]]
