"""Disruptions on the real control plane, on process-mode nodes, while the job trains
examples/cartpole-ppo.yaml: a buffer pod and an actor pod deleted mid-run (gracefully, lingering
under a finalizer, or forced; each re-creation counted once, frames counted once), a suspend and
resume (the learner resumes from its claim; nothing counted as a disruption), and `kubectl
scale` while the learner pod is gone (the scale holds; the scale-up is no re-creation). The job
must not stall, and must never succeed untrained. A job that ends at its target does so on the
confirming evaluation of its saved policy (`status.targetEvaluation`).

The learner's own disruptions run under the kubelet, in test_real_nodes.py: its pod deleted
(the same three ways), its worker SIGKILLed, its node's power lost.

The cluster's default StorageClass (localcluster/provisioner.py: volumes every node reaches, as
network storage) holds each learner's checkpoints on a claim of its own, so a re-created learner
resumes where it stopped, on whichever node."""
from __future__ import annotations

import json
import time

import pytest

from cluster_jobs import (
    HOW,
    JOB,
    TARGET_ONLY,
    delete_pod,
    diagnostics,
    ends_at_a_confirmed_target,
    example,
    pods,
    status,
    training,
    trains_again,
    wait_phase,
)
from clusterkit import get, wait_for


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
