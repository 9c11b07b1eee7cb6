"""spec.runPolicy and terminal states against the emulator: backoffLimit, activeDeadlineSeconds,
ttlSecondsAfterFinished, cleanPodPolicy (and its deprecated old place), suspend; Succeeded/Failed
conditions with observedGeneration; unschedulable pods and refused creations (Pod Security) in
status and Events without retrying."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from kube.operator_harness import (
    NAMESPACE,
    FakeClock,
    RunningOperator,
    children,
    cond,
    eventually,
    job,
    job_manifest,
    run_pods,
    start_cluster,
    status,
)
from kube.pod_security import ENFORCE_LABEL
from test_operator_reconcile import assert_rbac_covers, created, events


@pytest.fixture
async def env(kube):
    clock = FakeClock()
    async with RunningOperator(kube, clock=clock) as op:
        yield kube, clock, op
    assert_rbac_covers(kube)


def pods(kube, name="cartpole"):
    return {n for (k, n) in children(kube, name) if k == "Pod"}


def replicas(kube, name="cartpole"):
    return children(kube, name)["StatefulSet", f"{name}-actor-0"]["spec"]["replicas"]


async def running(kube, spec=None, name="cartpole"):
    await kube.create_job(job_manifest(name, spec or {}))
    await created(kube, name)
    await run_pods(kube, name)
    await eventually(lambda: status(kube, name).get("phase") == "Running", what="phase Running")


def crash(restarts: int) -> dict:
    return {"phase": "Running", "containerStatuses": [{
        "name": "worker", "ready": False, "restartCount": restarts, "image": "tianji-worker:0.1.0",
        "imageID": "", "started": False,
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}


# ----------------------------------------------------------------- backoffLimit
async def test_a_crash_looping_learner_fails_the_job_after_backoff_limit(env):
    kube, clock, op = env
    await running(kube, {"runPolicy": {"backoffLimit": 2}})
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-learner-0-0", crash(2))
    await eventually(lambda: status(kube).get("restarts") == 2, what="2 restarts counted")
    assert status(kube)["phase"] == "Running"  # at the limit, not over it
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-learner-0-0", crash(3))
    await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
    failed, succeeded = cond(kube, "Failed"), cond(kube, "Succeeded")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert "runPolicy.backoffLimit (2)" in failed["message"] and "cartpole-learner-0-0" in failed["message"]
    assert "Error, exit code 1" in failed["message"]
    # Kubernetes conventions: `kubectl wait --for=condition=Failed` sees the generation it is about.
    assert failed["observedGeneration"] == job(kube)["metadata"]["generation"]
    assert succeeded["status"] == "False" and succeeded["observedGeneration"] == failed["observedGeneration"]
    await eventually(lambda: [e for e in events(kube, "Failed") if "BackoffLimitExceeded" in e["message"]],
                     what="a Failed event naming the reason")


# ----------------------------------------------------------------- activeDeadlineSeconds
async def test_active_deadline_fails_the_job(env):
    kube, clock, op = env
    await running(kube, {"runPolicy": {"activeDeadlineSeconds": 600}})
    clock.advance(599)
    await eventually(lambda: status(kube).get("reportTime") == st_iso(clock.t), what="a tick at 599 s")
    assert status(kube)["phase"] == "Running"
    clock.advance(2)
    await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
    assert cond(kube, "Failed")["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds is 600" in cond(kube, "Failed")["message"]
    await eventually(lambda: replicas(kube) == 0, what="actors scaled to 0 (cleanPodPolicy Running)")


def st_iso(t):
    from tianji_operator.status import iso
    return iso(t)


# ----------------------------------------------------------------- ttlSecondsAfterFinished
async def test_a_finished_job_is_deleted_after_its_ttl(env):
    kube, clock, op = env
    await running(kube, {"runPolicy": {"ttlSecondsAfterFinished": 300}, "stop": {"seconds": 10}})
    clock.advance(11)
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    clock.advance(299)
    await asyncio.sleep(0.5)  # several monitor ticks (an ended job's status is not rewritten each tick)
    assert job(kube) is not None
    clock.advance(2)
    await eventually(lambda: job(kube) is None, what="the job deleted")
    assert children(kube) == {}


# ----------------------------------------------------------------- suspend
async def test_suspend_deletes_the_pods_and_resume_brings_them_back(env):
    kube, clock, op = env
    await kube.create_job(job_manifest("cartpole", {"runPolicy": {"suspend": True}}))
    # Created suspended (as Kueue creates jobs): planned, no pods, actors at 0.
    await eventually(lambda: status(kube).get("phase") == "Suspended", what="phase Suspended")
    assert cond(kube, "Suspended")["status"] == "True" and cond(kube, "Planned")["status"] == "True"
    assert pods(kube) == set() and replicas(kube) == 0
    assert ("ConfigMap", "cartpole-job") in children(kube)

    await kube.patch_job("cartpole", {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(lambda: pods(kube) == {"cartpole-learner-0-0", "cartpole-buffer-0-0"}, what="pods created")
    await eventually(lambda: replicas(kube) == 2, what="actors back")
    await eventually(lambda: cond(kube, "Suspended")["status"] == "False"
                     and cond(kube, "Suspended")["reason"] == "Resumed", what="Suspended=False Resumed")
    await run_pods(kube, "cartpole")
    await eventually(lambda: status(kube).get("phase") == "Running", what="phase Running")
    cm_uid = children(kube)["ConfigMap", "cartpole-job"]["metadata"]["uid"]

    # Suspending a running job: pods go, the job (plan, counts, ConfigMap) stays.
    await kube.patch_job("cartpole", {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: pods(kube) == set() and replicas(kube) == 0, what="pods deleted")
    await eventually(lambda: status(kube).get("phase") == "Suspended", what="phase Suspended")
    clock.advance(60)
    await eventually(lambda: op.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= 3,
                     what="monitor ticks")
    assert pods(kube) == set() and status(kube)["phase"] == "Suspended"  # no self-healing while suspended
    assert children(kube)["ConfigMap", "cartpole-job"]["metadata"]["uid"] == cm_uid


# ----------------------------------------------------------------- cleanPodPolicy's old place
async def test_the_deprecated_top_level_clean_pod_policy_is_honoured_with_a_warning():
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack, validate_crd=False)  # an older CRD still declaring it
        clock = FakeClock()
        async with RunningOperator(kube, clock=clock):
            await running(kube, {"cleanPodPolicy": "None", "stop": {"seconds": 10}})
            await eventually(lambda: [e for e in events(kube, "DeprecatedField")
                                      if "spec.runPolicy.cleanPodPolicy" in e["message"]],
                             what="a DeprecatedField event")
            clock.advance(11)
            await eventually(lambda: status(kube).get("phase") == "Succeeded")
            await eventually(lambda: events(kube, "Succeeded"))
            assert pods(kube) == {"cartpole-learner-0-0", "cartpole-buffer-0-0"}  # None: nothing deleted


# ----------------------------------------------------------------- terminal states survive restarts
async def test_a_restart_never_rewrites_a_terminal_condition(kube):
    clock = FakeClock()
    async with RunningOperator(kube, clock=clock):
        await running(kube, {"runPolicy": {"backoffLimit": 0}})
        await kube.set_status("v1/pods", NAMESPACE, "cartpole-buffer-0-0", crash(1))
        await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
    final = [c for c in status(kube)["conditions"] if c["type"] in ("Succeeded", "Failed", "Progressing", "Ready")]
    done = status(kube)["completionTime"]
    clock.advance(3600)
    async with RunningOperator(kube, clock=clock) as second:
        await eventually(lambda: second.metrics.value("tianji_operator_reconciles_total", handler="resume",
                                                      result="ok") == 1, what="the resume handler")
        await eventually(lambda: second.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= 2,
                         what="monitor ticks")
    assert status(kube)["phase"] == "Failed" and status(kube)["completionTime"] == done
    assert [c for c in status(kube)["conditions"] if c["type"] in ("Succeeded", "Failed", "Progressing",
                                                                   "Ready")] == final


# ----------------------------------------------------------------- unschedulable, refused
async def test_unschedulable_pods_show_in_status_and_events(env):
    kube, clock, op = env
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-learner-0-0", {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}]})
    await eventually(lambda: cond(kube, "Ready")["reason"] == "Unschedulable", what="Ready=False Unschedulable")
    assert why in cond(kube, "Ready")["message"] and "cartpole-learner-0-0" in cond(kube, "Ready")["message"]
    ev = await eventually(lambda: events(kube, "Unschedulable"), what="an Unschedulable event")
    assert why in ev[0]["message"] and ev[0]["type"] == "Warning"
    clock.advance(30)
    await eventually(lambda: op.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= 4,
                     what="more monitor ticks")
    assert len(events(kube, "Unschedulable")) == 1  # one Event per pod, not one per tick


async def test_an_image_that_cannot_be_pulled_shows_in_status_and_events(env):
    kube, clock, op = env
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    msg = 'rpc error: code = NotFound desc = failed to resolve image: "reg:5000/absent:1": not found'
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-buffer-0-0", {"phase": "Pending", "containerStatuses": [
        {"name": "worker", "image": "reg:5000/absent:1", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ErrImagePull", "message": msg}}}]})
    await eventually(lambda: cond(kube, "Ready")["reason"] == "ImagePullFailed", what="Ready=False ImagePullFailed")
    said = cond(kube, "Ready")["message"]
    assert "cartpole-buffer-0-0" in said and "ErrImagePull: reg:5000/absent:1" in said and msg in said
    ev = await eventually(lambda: events(kube, "ImagePullFailed"), what="an ImagePullFailed event")
    assert ev[0]["type"] == "Warning" and "reg:5000/absent:1" in ev[0]["message"]
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-buffer-0-0", {"phase": "Pending", "containerStatuses": [
        {"name": "worker", "image": "reg:5000/absent:1", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]})
    clock.advance(30)
    await eventually(lambda: "ImagePullBackOff" in cond(kube, "Ready")["message"], what="the back-off said")
    assert len(events(kube, "ImagePullFailed")) == 1


async def test_a_container_killed_over_its_memory_limit_says_which_limit(env):
    """Ready=False OOMKilled names the pod, the limit and the spec field; one Event per kill."""
    kube, clock, op = env
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    limit = children(kube)["Pod", "cartpole-buffer-0-0"]["spec"]["containers"][0]["resources"]["limits"]["memory"]

    async def killed(restarts: int) -> None:
        await kube.set_status("v1/pods", NAMESPACE, "cartpole-buffer-0-0", {"phase": "Running", "containerStatuses": [
            {"name": "worker", "image": "w:1", "ready": False, "restartCount": restarts,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]})
    await killed(1)
    await eventually(lambda: cond(kube, "Ready")["reason"] == "OOMKilled", what="Ready=False OOMKilled")
    said = cond(kube, "Ready")["message"]
    assert "cartpole-buffer-0-0" in said and f"memory limit {limit}" in said and "spec.resources.buffer.memory" in said
    await eventually(lambda: events(kube, "OOMKilled"), what="an OOMKilled event")
    clock.advance(30)
    await eventually(lambda: op.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= 4,
                     what="more monitor ticks")
    assert len(events(kube, "OOMKilled")) == 1  # one per kill, not one per tick
    await killed(2)
    await eventually(lambda: len(events(kube, "OOMKilled")) == 2, what="the second kill's event")


async def _restricted_namespace(kube):
    ns = kube.obj("v1/namespaces", None, NAMESPACE)
    code, _ = await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}",
                             {"metadata": {"labels": {ENFORCE_LABEL: "restricted"}}})
    assert code == 200, ns


async def test_host_network_in_a_restricted_namespace_fails_once_with_the_reason(kube):
    await _restricted_namespace(kube)
    async with RunningOperator(kube, expected_refusals=("violates PodSecurity",)) as op:
        await kube.create_job(job_manifest("cartpole", {"network": {"hostNetwork": True}}))
        await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
        failed = cond(kube, "Failed")
        assert failed["reason"] == "PodSecurityRejected"
        assert 'violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true)' in failed["message"]
        assert "pod-security.kubernetes.io/enforce=privileged" in failed["message"]
        await eventually(lambda: [e for e in events(kube, "Failed") if "PodSecurityRejected" in e["message"]],
                         what="a Failed event")
        tries = op.metrics.value("tianji_operator_api_requests_total", verb="create", kind="Pod", code="403")
        await asyncio.sleep(1.0)  # ten monitor intervals, several handler backoffs
        assert tries == 1
        assert op.metrics.value("tianji_operator_api_requests_total", verb="create", kind="Pod", code="403") == 1
    assert_rbac_covers(kube)


async def test_a_gpu_pool_job_with_overlays_is_admitted(kube):
    """spec.pods and the chart's workerDefaults reach the pods the apiserver stores."""
    from test_operator_builders import GPU_POOL

    await _restricted_namespace(kube)
    async with RunningOperator(kube, worker_defaults={"priorityClassName": "cluster-default",
                                                      "nodeSelector": {"arch": "amd64"}}):
        await kube.create_job(job_manifest("cartpole", GPU_POOL))
        await created(kube)
        learner = children(kube)["Pod", "cartpole-learner-0-0"]["spec"]
        assert learner["nodeSelector"] == {"arch": "amd64", "pool": "a100", "zone": "a"}
        assert learner["priorityClassName"] == "rl-batch"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in learner["tolerations"]
        assert job(kube)["spec"]["pods"]["learner"]["affinity"]  # kept by the CRD (not pruned)
    assert not kube.refused


# ----------------------------------------------------------------- checkpoints that survive a pod
async def test_a_recreated_learner_mounts_the_same_checkpoint_claim(kube):
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole", {"checkpoint": {"size": "5Gi"}}))
        await created(kube, n=7)
        objs = children(kube)
        assert objs["PersistentVolumeClaim", "cartpole-checkpoints"]["metadata"]["ownerReferences"][0]["kind"] == \
            "TianJiJob"
        old = objs["Pod", "cartpole-learner-0-0"]
        code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/cartpole-learner-0-0")
        assert code == 200
        new = await eventually(lambda: (p := children(kube).get(("Pod", "cartpole-learner-0-0")))
                               and p["metadata"]["uid"] != old["metadata"]["uid"] and p, what="the learner back")
        claim = {"name": "state", "persistentVolumeClaim": {"claimName": "cartpole-checkpoints"}}
        assert claim in new["spec"]["volumes"] and claim in old["spec"]["volumes"]
    assert_rbac_covers(kube)


async def test_actor_pods_the_statefulset_cannot_create_show_in_status(env):
    """Admission refusing the StatefulSet's pods: the controller's FailedCreate event becomes the
    job's Ready condition and one Warning event of the job."""
    kube, clock, op = env
    await kube.create_job(job_manifest("cartpole", {"network": {"hostNetwork": True}}))
    await created(kube)
    why = ('create Pod cartpole-actor-0-0 in StatefulSet cartpole-actor-0 failed error: pods "cartpole-actor-0-0" '
           'is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)')
    sts = children(kube)["StatefulSet", "cartpole-actor-0"]
    await kube.put_object("v1/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "cartpole-actor-0.1", "namespace": NAMESPACE},
        "involvedObject": {"kind": "StatefulSet", "name": "cartpole-actor-0", "namespace": NAMESPACE,
                           "uid": sts["metadata"]["uid"], "apiVersion": "apps/v1"},
        "reason": "FailedCreate", "type": "Warning", "message": why, "source": {"component": "statefulset-controller"}})
    await eventually(lambda: cond(kube, "Ready")["reason"] == "FailedCreate", what="Ready=False FailedCreate")
    assert why in cond(kube, "Ready")["message"] and "enforce=privileged" in cond(kube, "Ready")["message"]
    await eventually(lambda: [e for e in events(kube, "FailedCreate") if e.get("source", {}).get("component")
                              != "statefulset-controller"], what="the job's FailedCreate event")
