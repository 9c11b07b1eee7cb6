"""Disruptions under the kubelet, on the real cluster's two real nodes (conftest.py's `real`: the
kubelet and containerd, the checkout's image pulled from its registry, NetworkPolicy enforced),
while the job trains examples/cartpole-ppo.yaml to a return of 200 (cluster_jobs.TARGET): the
learner pod deleted (gracefully, lingering under a finalizer, or forced) and its worker
SIGKILLed, a buffer pod and an actor pod deleted gracefully and forced (each re-creation counted
once, frames counted once), a suspend and resume (the learner resumes from its claim; nothing
counted as a disruption), and `kubectl scale` while the learner pod is gone (the scale holds;
the scale-up is no re-creation). The job must not stall, must never succeed untrained, and ends
on the confirming evaluation of its saved policy (`status.targetEvaluation`). A real node's
power loss: test_real_nodes.py.

The cluster's default StorageClass (localcluster/provisioner.py: volumes every node reaches, as
network storage) holds each learner's checkpoints on a claim of its own, so a re-created learner
resumes where it stopped, on whichever node. The job's NetworkPolicy admits this machine to its
pods' metrics port only, as it admits Prometheus (the chart's `metricsScrapers`)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from cluster_jobs import (
    HOW,
    JOB,
    TARGET,
    TARGET_ONLY,
    condition,
    delete_pod,
    diagnostics,
    ends_at_a_confirmed_target,
    on_real_nodes,
    pods,
    status,
    training,
    trains_again,
    wait_phase,
    worker_metrics,
    worker_pid,
)
from clusterkit import get, wait_for

# A pod's deletion three ways on the learner; on the buffer and an actor, the two that differ for
# their peers: graceful (a last report from the old pod) and forced (the successor starts while
# the old container may still run). What lingering adds, a name held after the worker stopped,
# is the operator's own path for the learner and buffer pods alike, and the learner's case runs.
BY_PEERS = ["graceful", "forced"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", HOW)
def test_a_deleted_learner_pod_comes_back_and_the_job_reaches_its_target(real, real_operator, ns, how):
    """The learner pod deleted (graceful, lingering under a finalizer, or forced) while the job
    trains: the kubelet stops its container, the operator makes the pod again, it resumes from
    its checkpoint claim, its peers find it by name, and the job reaches its confirmed target."""
    # A periodic checkpoint every 5 s: what a forced delete loses (it writes no last one).
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(
        real, {**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    st = training(real, ns)
    durable = condition(st, "Durable")
    assert durable["status"] == "True" and durable["reason"] == "DefaultStorageClass", durable
    learner = f"{JOB}-learner-0-0"
    old = get(real, "pod", "-n", ns, learner)
    before = worker_metrics(old, ("tianji_policy_version{",))
    delete_pod(real, ns, learner, how)
    new = wait_for(lambda: (p := get(real, "pod", "-n", ns, learner)) and p["metadata"]["uid"] != old["metadata"][
        "uid"] and p, 120, "the learner pod re-created", on_timeout=lambda: diagnostics(real, ns))
    assert new["spec"]["hostname"] == learner
    resumed = trains_again(real, ns, old["metadata"]["uid"])
    if how != "forced":  # it resumed from the checkpoint it wrote on SIGTERM: its numbering goes on
        assert resumed["tianji_policy_version"] >= max(before.values()), (before, resumed)
    st = ends_at_a_confirmed_target(real, ns)
    assert st["meanReturn"] >= TARGET and st["policyVersion"] > 0, st
    assert st["restartsByRole"]["learner"]["pods"] >= 1, st["restartsByRole"]  # the re-creation counted



@pytest.mark.timeout(900)
def test_a_learner_killed_with_sigkill_is_restarted_in_place_by_the_kubelet_and_counted(real, real_operator, ns):
    """The learner's worker, its container's first process, SIGKILLed from the machine as the
    kernel's OOM killer or a crash would: the kubelet restarts the container in the same pod
    (its restartCount, exit code 137), the operator counts one container restart and no
    re-creation, and the job resumes from its checkpoint to the confirmed target."""
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(
        real, {**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    training(real, ns)
    learner = f"{JOB}-learner-0-0"
    uid = get(real, "pod", "-n", ns, learner)["metadata"]["uid"]
    os.kill(worker_pid(ns, learner), signal.SIGKILL)
    restarted = wait_for(lambda: (p := get(real, "pod", "-n", ns, learner)) and p["status"].get(
        "containerStatuses", [{}])[0].get("restartCount", 0) >= 1 and p, 120, "the kubelet restarting the learner",
        on_timeout=lambda: diagnostics(real, ns))
    assert restarted["metadata"]["uid"] == uid, "re-created, not restarted in place"
    last = restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137, last
    wait_for(lambda: status(real, ns).get("restartsByRole", {}).get("learner", {}).get("containers", 0) >= 1,
             120, "the learner's container restart counted", on_timeout=lambda: diagnostics(real, ns))
    st = ends_at_a_confirmed_target(real, ns)
    assert st["restartsByRole"]["learner"] == {"containers": 1, "pods": 0}, st["restartsByRole"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", BY_PEERS)
def test_a_deleted_buffer_pod_is_counted_once_and_the_job_reaches_its_target(real, real_operator, ns, how):
    """The buffer's replacement: frames counted once (the status never grows much faster than
    before the delete: a double count of a re-created pod's reports would), the re-creation
    counted, the job at its target."""
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, TARGET_ONLY))
    s0 = training(real, ns)
    t0 = time.monotonic()
    s1 = wait_for(lambda: (s := status(real, ns)).get("envFrames", 0) >= s0.get("envFrames", 0) + 5_000 and s,
                  120, "5k more frames", interval=1.0, on_timeout=lambda: diagnostics(real, ns))
    before = (s1["envFrames"] - s0.get("envFrames", 0)) / max(time.monotonic() - t0, 1e-3)
    buffer = f"{JOB}-buffer-0-0"
    old = get(real, "pod", "-n", ns, buffer)
    t_del, f_del, samples = time.monotonic(), s1["envFrames"], []
    delete_pod(real, ns, buffer, how)
    # Its successor, seen while the job runs (after the end, cleanPodPolicy may remove it).
    gone = old["metadata"]["uid"]
    wait_for(lambda: (p := get(real, "pod", "-n", ns, buffer)) and p["metadata"]["uid"] != gone, 120,
             "the buffer pod made again", on_timeout=lambda: diagnostics(real, ns))

    def ended():
        s = status(real, ns)
        samples.append((time.monotonic() - t_del, s.get("envFrames", 0) - f_del))
        return s if s.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for(ended, 480, "the job's end", interval=2.0, on_timeout=lambda: diagnostics(real, ns))
    fast = [(round(t, 1), df) for t, df in samples if df > 3 * before * t + 20_000]
    assert not fast, f"frames grew faster than 3x the {before:.0f}/s before the delete: {fast[:5]}"
    assert st["phase"] == "Succeeded" and st.get("endReason") == "TargetReached", diagnostics(real, ns)
    assert st["targetEvaluation"]["mean_return"] >= TARGET, st["targetEvaluation"]
    assert st["restartsByRole"]["buffer"]["pods"] >= 1, st["restartsByRole"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", BY_PEERS)
def test_a_deleted_actor_pod_is_counted_once_and_the_job_reaches_its_target(real, real_operator, ns, how):
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, TARGET_ONLY))
    training(real, ns)
    actor = f"{JOB}-actor-0-1"
    old = get(real, "pod", "-n", ns, actor)
    delete_pod(real, ns, actor, how)
    gone = old["metadata"]["uid"]
    wait_for(lambda: (p := get(real, "pod", "-n", ns, actor)) and p["metadata"]["uid"] != gone, 120,
             "the StatefulSet to make the actor again", on_timeout=lambda: diagnostics(real, ns))
    st = ends_at_a_confirmed_target(real, ns)
    # podsSeen's uids and the Recreated events tell a second re-creation from a second count
    assert st["restartsByRole"]["actor"]["pods"] == 1, (st["restartsByRole"], diagnostics(real, ns))


@pytest.mark.timeout(900)
def test_a_suspended_job_resumes_from_its_checkpoint_and_reaches_its_target(real, real_operator, ns):
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, TARGET_ONLY))
    training(real, ns)
    real.kubectl("patch", "tjj", JOB, "-n", ns, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
    wait_phase(real, ns, ("Suspended",), 120)
    wait_for(lambda: not [p for p in pods(real, ns) if p["metadata"]["labels"].get("tianji.dev/role")
                          in ("learner", "buffer")], 120, "the learner and buffer pods gone",
             on_timeout=lambda: diagnostics(real, ns))
    version = status(real, ns).get("policyVersion", 0)
    real.kubectl("patch", "tjj", JOB, "-n", ns, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": False}}}))
    st = ends_at_a_confirmed_target(real, ns)
    assert st["policyVersion"] >= version, (version, st["policyVersion"])  # resumed, not from scratch
    by_role = st["restartsByRole"]
    assert all(v == {"containers": 0, "pods": 0} for v in by_role.values()), by_role  # the operator's own doing


@pytest.mark.timeout(900)
def test_a_scale_while_the_learner_is_re_created_holds_and_the_job_reaches_its_target(real, real_operator, ns):
    """`kubectl scale` lands while the learner pod is gone: the new actor count holds, the learner
    comes back and trains, its re-creation is counted once and the scale-up is no re-creation."""
    real.kubectl("apply", "-n", ns, "-f", "-",
                    input=on_real_nodes(real, {**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    training(real, ns)
    learner = f"{JOB}-learner-0-0"
    old = get(real, "pod", "-n", ns, learner)
    real.kubectl("delete", "pod", learner, "-n", ns, "--wait=false")
    real.kubectl("scale", f"tjj/{JOB}", "-n", ns, "--replicas=3")
    trains_again(real, ns, old["metadata"]["uid"])
    wait_for(lambda: get(real, "statefulset", "-n", ns, f"{JOB}-actor-0")["spec"]["replicas"] == 3, 120,
             "the actors' StatefulSet at 3", on_timeout=lambda: diagnostics(real, ns))
    st = ends_at_a_confirmed_target(real, ns)  # (an ended job's actors are scaled to 0)
    by_role = st["restartsByRole"]
    assert by_role["learner"]["pods"] == 1 and by_role["actor"]["pods"] == 0, by_role
