"""Disruptions on the real control plane: a learner pod deleted mid-run, and a whole node
stopped mid-run (its agent and every process of it killed at once, as a machine that loses
power), while the job trains examples/cartpole-ppo.yaml. The job must end Succeeded at its
target, or say why it cannot: never stall silently, never succeed untrained."""
from __future__ import annotations

import pytest

from clusterkit import get, wait_for
from cluster_jobs import JOB, condition, diagnostics, example, pods, status, wait_phase

# Only the target ends these jobs (the example's frame and time budgets could end a job whose
# learner had to start over before it got back to 475).
TARGET_ONLY = {"stop": {"meanReturn": 475, "envFrames": None, "seconds": 900}}


def training(c, ns: str, frames: int = 20_000) -> dict:
    return wait_for(lambda: (s := status(c, ns)).get("envFrames", 0) >= frames and s, 300,
                    f"{frames} frames counted", interval=2.0, on_timeout=lambda: diagnostics(c, ns))


def assert_trained(c, ns: str, st: dict) -> None:
    ok = condition(st, "Succeeded")
    assert st["phase"] == "Succeeded" and ok and ok["reason"] == "StopConditionReached", diagnostics(c, ns)
    assert st["meanReturn"] >= 475, st
    assert st.get("policyVersion", 0) > 0, st


@pytest.mark.timeout(1200)
def test_a_deleted_learner_pod_comes_back_and_the_job_reaches_its_target(cluster, operator, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(TARGET_ONLY))
    training(cluster, namespace)
    learner = f"{JOB}-learner-0-0"
    old = get(cluster, "pod", "-n", namespace, learner)
    cluster.kubectl("delete", "pod", learner, "-n", namespace, "--wait=false")
    new = wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, learner)) and
                   p["metadata"]["uid"] != old["metadata"]["uid"] and p, 120, "the learner pod re-created",
                   on_timeout=lambda: diagnostics(cluster, namespace))
    assert new["spec"]["hostname"] == learner
    st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 900)
    assert_trained(cluster, namespace, st)


@pytest.mark.timeout(1200)
def test_a_stopped_node_is_named_and_its_pods_come_back_elsewhere(cluster, operator, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(TARGET_ONLY))
    training(cluster, namespace)
    learner = get(cluster, "pod", "-n", namespace, f"{JOB}-learner-0-0")
    node_name = learner["spec"]["nodeName"]
    node = next(n for n in cluster.nodes if n.name == node_name)
    on_node = sorted(p["metadata"]["name"] for p in pods(cluster, namespace) if p["spec"]["nodeName"] == node_name)
    node.stop()
    try:
        # The lifecycle controller marks the node, evicts its pods; the operator releases the
        # stuck ones and says which node it lost.
        events = wait_for(lambda: [e for e in (get(cluster, "events", "-n", namespace) or {}).get("items", [])
                                   if e.get("reason") == "NodeLost"], 240, "a NodeLost event",
                          interval=2.0, on_timeout=lambda: diagnostics(cluster, namespace))
        assert any(node_name in e["message"] for e in events), [e["message"] for e in events]
        moved = wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, f"{JOB}-learner-0-0")) and
                         p["spec"].get("nodeName") not in (None, node_name) and p, 180,
                         "the learner on another node", interval=2.0,
                         on_timeout=lambda: diagnostics(cluster, namespace))
        assert moved["metadata"]["uid"] != learner["metadata"]["uid"]
        st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 900)
        assert_trained(cluster, namespace, st)
        assert on_node, "the stopped node ran none of the job's pods"
    finally:
        node.start()
        cluster.wait_nodes_ready(120)
