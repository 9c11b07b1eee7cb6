"""Disruptions on the real control plane: a learner pod deleted mid-run, and a whole node
stopped mid-run (its agent and every process of it killed at once, as a machine that loses
power), while the job trains examples/cartpole-ppo.yaml. The job must not stall: the learner
comes back (on another node when its node is gone), trains on, and its peers find it; and it
must never succeed untrained. (A worker killed with SIGKILL, restarted in place by the kubelet,
and a real node's power loss: test_real_nodes.py.)

The cluster's default StorageClass (localcluster/provisioner.py: volumes every node reaches, as
network storage) holds each learner's checkpoints on a claim of its own, so a re-created learner
resumes where it stopped, on whichever node. Every test waits for the target: the job recovers,
and never succeeds untrained.

Also: a buffer pod and an actor pod deleted (each re-creation counted once, frames counted once),
a suspend and resume
(the learner resumes from its claim; nothing counted as a disruption), and `kubectl scale` while
the learner pod is gone (the scale holds; the scale-up is no re-creation). A job that ends at its
target does so on the confirming evaluation of its saved policy (`status.targetEvaluation`)."""
from __future__ import annotations

import json
import time

import pytest

from cluster_jobs import (
    JOB,
    TARGET_ONLY,
    assert_never_succeeded_untrained,
    condition,
    diagnostics,
    ends_at_a_confirmed_target,
    example,
    pods,
    status,
    training,
    trains_again,
    wait_phase,
    worker_metrics,
)
from clusterkit import get, wait_for

LINGER = "tianji.test/linger"  # a finalizer of the test's own: the object outlives its worker


HOW = ["graceful", "lingering", "forced"]


def delete_pod(c, ns: str, pod: str, how: str) -> None:
    """graceful: `kubectl delete`; lingering: the same while a finalizer keeps the terminated
    object 10 s after its worker stopped (nothing can take its name meanwhile); forced:
    `--grace-period=0 --force` (the object goes at once; no last checkpoint, no final report)."""
    if how == "lingering":
        c.kubectl("patch", "pod", pod, "-n", ns, "--type=merge", "-p",
                  json.dumps({"metadata": {"finalizers": [LINGER]}}))
    if how == "forced":
        c.kubectl("delete", "pod", pod, "-n", ns, "--grace-period=0", "--force", "--wait=false")
        return
    c.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    if how == "lingering":
        wait_for(lambda: (p := get(c, "pod", "-n", ns, pod)) and all(
            "terminated" in (cs.get("state") or {}) for cs in p["status"].get("containerStatuses") or [{}]),
                 120, f"{pod}'s worker stopped under the finalizer", interval=1.0,
                 on_timeout=lambda: diagnostics(c, ns))
        time.sleep(10)  # the object lingers: the job goes on and nothing takes its name meanwhile
        still = get(c, "pod", "-n", ns, pod)
        assert still and still["metadata"].get("deletionTimestamp"), still
        assert status(c, ns).get("phase") in ("Running", "Pending"), status(c, ns)
        c.kubectl("patch", "pod", pod, "-n", ns, "--type=json", "-p",
                  '[{"op": "remove", "path": "/metadata/finalizers"}]')


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", HOW)
def test_a_deleted_learner_pod_comes_back_and_the_job_reaches_its_target(cluster, operator, namespace, how):
    # A periodic checkpoint every 5 s: what a forced delete loses (it writes no last one).
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=example({**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    st = training(cluster, namespace)
    durable = condition(st, "Durable")
    assert durable["status"] == "True" and durable["reason"] == "DefaultStorageClass", durable
    learner = f"{JOB}-learner-0-0"
    old = get(cluster, "pod", "-n", namespace, learner)
    before = worker_metrics(old, ("tianji_policy_version{",))
    delete_pod(cluster, namespace, learner, how)
    new = wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, learner)) and
                   p["metadata"]["uid"] != old["metadata"]["uid"] and p, 120, "the learner pod re-created",
                   on_timeout=lambda: diagnostics(cluster, namespace))
    assert new["spec"]["hostname"] == learner
    resumed = trains_again(cluster, namespace, old["metadata"]["uid"])
    if how != "forced":  # it resumed from the checkpoint it wrote on SIGTERM: its numbering goes on
        assert resumed["tianji_policy_version"] >= max(before.values()), (before, resumed)
    st = ends_at_a_confirmed_target(cluster, namespace)
    assert st["meanReturn"] >= 475 and st["policyVersion"] > 0, st
    assert st["restartsByRole"]["learner"]["pods"] >= 1, st["restartsByRole"]  # the re-creation counted


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
        trains_again(cluster, namespace, learner["metadata"]["uid"])
        assert_never_succeeded_untrained(cluster, namespace)
        assert on_node, "the stopped node ran none of the job's pods"
        # The actors on the surviving node dropped their half-open links to the lost learner
        # (heartbeats: runtime/liveness.py) and follow its replacement: the job reaches its target.
        st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 480)
        assert st["phase"] == "Succeeded" and st["meanReturn"] >= 475, diagnostics(cluster, namespace)
    finally:
        node.start()
        cluster.wait_nodes_ready(120)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", HOW)
def test_a_deleted_buffer_pod_is_counted_once_and_the_job_reaches_its_target(cluster, operator, namespace, how):
    """The buffer's replacement: frames counted once (the status never grows much faster than
    before the delete: a double count of a re-created pod's reports would), the re-creation
    counted, the job at its target."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(TARGET_ONLY))
    s0 = training(cluster, namespace)
    t0 = time.monotonic()
    s1 = wait_for(lambda: (s := status(cluster, namespace)).get("envFrames", 0) >= s0["envFrames"] + 10_000 and s,
                  120, "10k more frames", interval=1.0, on_timeout=lambda: diagnostics(cluster, namespace))
    before = (s1["envFrames"] - s0["envFrames"]) / max(time.monotonic() - t0, 1e-3)
    buffer = f"{JOB}-buffer-0-0"
    old = get(cluster, "pod", "-n", namespace, buffer)
    t_del, f_del, samples = time.monotonic(), s1["envFrames"], []
    delete_pod(cluster, namespace, buffer, how)
    # Its successor, seen while the job runs (after the end, cleanPodPolicy may remove it).
    gone = old["metadata"]["uid"]
    wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, buffer)) and p["metadata"]["uid"] != gone, 120,
             "the buffer pod made again", on_timeout=lambda: diagnostics(cluster, namespace))

    def ended():
        s = status(cluster, namespace)
        samples.append((time.monotonic() - t_del, s.get("envFrames", 0) - f_del))
        return s if s.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for(ended, 480, "the job's end", interval=2.0, on_timeout=lambda: diagnostics(cluster, namespace))
    fast = [(round(t, 1), df) for t, df in samples if df > 3 * before * t + 20_000]
    assert not fast, f"frames grew faster than 3x the {before:.0f}/s before the delete: {fast[:5]}"
    assert st["phase"] == "Succeeded" and st.get("endReason") == "TargetReached", diagnostics(cluster, namespace)
    assert st["targetEvaluation"]["mean_return"] >= 475, st["targetEvaluation"]
    assert st["restartsByRole"]["buffer"]["pods"] >= 1, st["restartsByRole"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", HOW)
def test_a_deleted_actor_pod_is_counted_once_and_the_job_reaches_its_target(cluster, operator, namespace, how):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(TARGET_ONLY))
    training(cluster, namespace)
    actor = f"{JOB}-actor-0-1"
    old = get(cluster, "pod", "-n", namespace, actor)
    delete_pod(cluster, namespace, actor, how)
    gone = old["metadata"]["uid"]
    wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, actor)) and p["metadata"]["uid"] != gone, 120,
             "the StatefulSet to make the actor again", on_timeout=lambda: diagnostics(cluster, namespace))
    st = ends_at_a_confirmed_target(cluster, namespace)
    assert st["restartsByRole"]["actor"]["pods"] == 1, st["restartsByRole"]


@pytest.mark.timeout(900)
def test_a_suspended_job_resumes_from_its_checkpoint_and_reaches_its_target(cluster, operator, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(TARGET_ONLY))
    training(cluster, namespace)
    cluster.kubectl("patch", "tjj", JOB, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
    wait_phase(cluster, namespace, ("Suspended",), 120)
    wait_for(lambda: not [p for p in pods(cluster, namespace) if p["metadata"]["labels"].get("tianji.dev/role")
                          in ("learner", "buffer")], 120, "the learner and buffer pods gone",
             on_timeout=lambda: diagnostics(cluster, namespace))
    version = status(cluster, namespace).get("policyVersion", 0)
    cluster.kubectl("patch", "tjj", JOB, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": False}}}))
    st = ends_at_a_confirmed_target(cluster, namespace)
    assert st["policyVersion"] >= version, (version, st["policyVersion"])  # resumed, not from scratch
    by_role = st["restartsByRole"]
    assert all(v == {"containers": 0, "pods": 0} for v in by_role.values()), by_role  # the operator's own doing


@pytest.mark.timeout(900)
def test_a_scale_while_the_learner_is_re_created_holds_and_the_job_reaches_its_target(cluster, operator, namespace):
    """`kubectl scale` lands while the learner pod is gone: the new actor count holds, the learner
    comes back and trains, its re-creation is counted once and the scale-up is no re-creation."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=example({**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    training(cluster, namespace)
    learner = f"{JOB}-learner-0-0"
    old = get(cluster, "pod", "-n", namespace, learner)
    cluster.kubectl("delete", "pod", learner, "-n", namespace, "--wait=false")
    cluster.kubectl("scale", f"tjj/{JOB}", "-n", namespace, "--replicas=3")
    trains_again(cluster, namespace, old["metadata"]["uid"])
    wait_for(lambda: get(cluster, "statefulset", "-n", namespace, f"{JOB}-actor-0")["spec"]["replicas"] == 3, 120,
             "the actors' StatefulSet at 3", on_timeout=lambda: diagnostics(cluster, namespace))
    st = ends_at_a_confirmed_target(cluster, namespace)  # (an ended job's actors are scaled to 0)
    by_role = st["restartsByRole"]
    assert by_role["learner"]["pods"] == 1 and by_role["actor"]["pods"] == 0, by_role
