"""The operator under disruption (issue 21), against the API emulator with fake pods: a job's
end and its model stay right when pods, the operator or the learner go away.

* a learner pod being deleted (its object lingering, as under a finalizer or a slow kubelet)
  or stopped with exit 0 never ends the job; success needs the stop rule AND the learners'
  own live reports, at a policy version not below the best their group reached;
* after the end nothing is healed, scaled or recounted, also by a handler or a tick acting on
  a copy of the job from before the end;
* restarts and backoffLimit survive the operator; status.restarts is what Failed says;
* learner state: a claim per learner from the default StorageClass (suspend keeps it), else an
  emptyDir and a Durable=False condition that says so; the Planned condition follows /scale.
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import time

import kopf
import pytest

from kube.fakes import FakePodMetrics, worker_report
from kube.operator_harness import (
    JOBS,
    NAMESPACE,
    FakeClock,
    RunningOperator,
    children,
    cond,
    eventually,
    job,
    job_manifest,
    job_with_report_pods,
    run_pods,
    status,
)
from test_operator_reconcile import assert_rbac_covers, created
from tianji_operator import status as st

STS = "apps/v1/statefulsets"
IPS = {"cartpole-learner-0-0": "127.0.0.5", "cartpole-buffer-0-0": "127.0.0.6",
       "cartpole-actor-0-0": "127.0.0.7", "cartpole-actor-0-1": "127.0.0.8"}
LEARNER = "cartpole-learner-0-0"
DEFAULT_CLASS = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "example.com/disk",
                 "metadata": {"name": "standard",
                              "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}


def learner_report(seq: int, version: int, incarnation: str = "inc0", final: bool = False, started: float = 0.0,
                   checkpoint: str | None = None) -> dict:
    rep = worker_report("cartpole", "learner", 0, 0, seq=seq, version=version, incarnation=incarnation,
                        final=final, samples_consumed_total=100.0 * seq)
    rep["started"] += started
    if checkpoint:
        rep["extra"]["checkpoint"] = checkpoint
    return rep


def serve(pods, seq: int, episodes=(), learner: dict | None = None, actor_incarnation: str = "inc0") -> None:
    """Every pod's report: actor 0 finished `episodes`; the learner's as given (None: not served)."""
    pods.reports[IPS["cartpole-actor-0-0"]] = worker_report("cartpole", "actor", 0, 0, seq=seq, episodes=list(episodes),
                                                            incarnation=actor_incarnation, env_frames_total=1000 * seq)
    pods.reports[IPS["cartpole-actor-0-1"]] = worker_report("cartpole", "actor", 0, 1, seq=seq,
                                                            env_frames_total=1000 * seq)
    pods.reports[IPS["cartpole-buffer-0-0"]] = worker_report("cartpole", "buffer", 0, 0, seq=seq,
                                                             samples_received_total=1000 * seq)
    if learner is None:
        pods.reports.pop(IPS[LEARNER], None)
    else:
        pods.reports[IPS[LEARNER]] = learner


async def ticks(op, n: int = 5) -> None:
    """Let the monitor run `n` more times."""
    start = op.metrics.value("tianji_operator_timer_runs_total", timer="monitor")
    await eventually(lambda: op.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= start + n,
                     what=f"{n} monitor ticks")


def terminated(report: dict, exit_code: int = 0) -> dict:
    """A pod whose worker exited (SIGTERM → exit 0), its final report as termination message."""
    return {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [{
        "name": "worker", "ready": False, "restartCount": 0, "image": "tianji-worker:0.1.0", "imageID": "",
        "started": False, "lastState": {},
        "state": {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                 "message": json.dumps(report)}}}]}


@pytest.fixture
async def operator(kube):
    async with RunningOperator(kube) as op:
        yield op
    assert_rbac_covers(kube)


@pytest.fixture
async def env(kube):
    # Near the wall clock: deletionTimestamps are wall-clock times, and a deletion the operator's
    # clock sees as long overdue is a lost node's (nodelost.py), force-deleted: not what is tested.
    clock = FakeClock(time.time())
    async with RunningOperator(kube, clock=clock) as op, FakePodMetrics(list(IPS.values())) as pods:
        yield kube, clock, op, pods
    assert_rbac_covers(kube)


# ----------------------------------------------------------------- 1. a learner pod deleted or stopped
async def test_a_deleted_learner_never_ends_the_job_and_its_successor_must_catch_up(env):
    kube, clock, op, pods = env
    serve(pods, 1, [100.0] * 50, learner_report(1, 40, checkpoint="ckpt-000000000040.pt"))
    # cleanPodPolicy None: the test plays the learner's stop itself (its final report) after the end
    await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}, "runPolicy": {"cleanPodPolicy": "None"}})
    await eventually(lambda: status(kube).get("policyVersion") == 40, what="the learner counted")
    # The learner pod is deleted; its object lingers (a finalizer, a slow kubelet) with the
    # terminal status its worker left: exit 0 on SIGTERM, phase Succeeded, the final report.
    code, _ = await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{LEARNER}",
                             {"metadata": {"finalizers": ["example.com/linger"]}})
    assert code == 200
    code, body = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{LEARNER}")
    assert code == 200 and body["metadata"]["deletionTimestamp"]
    await kube.set_status("v1/pods", NAMESPACE, LEARNER,
                          terminated(learner_report(2, 40, final=True, checkpoint="ckpt-000000000040.pt")))
    # Meanwhile the actors' last 100 episodes reach the target (played by the old policy).
    serve(pods, 2, [100.0] * 50 + [480.0] * 100, learner=None)
    clock.advance(1)
    await ticks(op)
    assert status(kube)["phase"] != "Succeeded" and cond(kube, "Succeeded") is None, status(kube).get("conditions")
    prog = cond(kube, "Progressing")
    assert prog["reason"] == "CatchingUp" and "learner-0-0 has not reported from a running pod" in prog["message"]

    # The object goes; the operator makes the learner again. Its state was lost (an older
    # checkpoint, policy version 30): the job waits for it to pass the 40 its group reached.
    await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{LEARNER}", {"metadata": {"finalizers": []}})
    await eventually(lambda: (p := kube.obj("v1/pods", NAMESPACE, LEARNER)) and not p["metadata"].get(
        "deletionTimestamp"), what="the learner pod made again")
    # (it reports the checkpoint it resumed from: a learner that names none started from scratch)
    serve(pods, 3, [100.0] * 50 + [480.0] * 100, learner_report(1, 30, incarnation="inc1", started=100,
                                                                checkpoint="ckpt-000000000030.pt"))
    await run_pods(kube, "cartpole", ips=IPS)
    clock.advance(1)
    await eventually(lambda: "at policy version 30, below the 40" in cond(kube, "Progressing")["message"],
                     what="waiting for the new learner to catch up")
    assert status(kube)["phase"] == "Running"
    await eventually(lambda: status(kube).get("restartsByRole", {}).get("learner", {}).get("pods") == 1,
                     what="the re-creation counted")

    serve(pods, 4, [100.0] * 50 + [480.0] * 100,
          learner_report(2, 45, incarnation="inc1", started=100, checkpoint="ckpt-000000000045.pt"))
    clock.advance(1)
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    assert "mean return 480" in cond(kube, "Succeeded")["message"]
    # The learner's checkpoint as it named it; then its final one, written as it stopped.
    assert status(kube)["model"] == [{"learner": "learner-0-0", "checkpoint": "ckpt-000000000045.pt",
                                      "policyVersion": 45, "final": False}]
    await kube.set_status("v1/pods", NAMESPACE, LEARNER, terminated(learner_report(
        3, 46, incarnation="inc1", started=100, final=True, checkpoint="ckpt-000000000046.pt")))
    await eventually(lambda: status(kube)["model"][0]["final"], what="the final checkpoint in status")
    assert status(kube)["model"][0]["policyVersion"] == 46 >= status(kube)["policyVersion"]


async def test_a_pod_killed_while_it_is_deleted_does_not_fail_the_job(env):
    """A deleted buffer whose worker outlives its grace period is SIGKILLed: phase Failed, exit 137.
    That is the deletion's doing, not the job's failure; the pod is made again once it is gone."""
    kube, clock, op, pods = env
    serve(pods, 1, [], learner_report(1, 5))
    await job_with_report_pods(kube, pods, IPS, {})
    victim = "cartpole-buffer-0-0"
    await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}",
                   {"metadata": {"finalizers": ["example.com/linger"]}})
    code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}")
    assert code == 200
    await kube.set_status("v1/pods", NAMESPACE, victim, terminated(worker_report(
        "cartpole", "buffer", 0, 0, seq=2, final=True), exit_code=137))
    await ticks(op)
    assert status(kube)["phase"] in ("Pending", "Running") and cond(kube, "Failed")["status"] == "False"
    old = kube.obj("v1/pods", NAMESPACE, victim)["metadata"]["uid"]
    await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}", {"metadata": {"finalizers": []}})
    await eventually(lambda: (p := kube.obj("v1/pods", NAMESPACE, victim)) and p["metadata"]["uid"] != old,
                     what="the buffer pod made again")


async def test_an_untrained_learner_does_not_back_a_target(env):
    kube, clock, op, pods = env
    serve(pods, 1, [480.0] * 100, learner_report(1, 0))
    await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}})
    clock.advance(1)
    await eventually(lambda: status(kube).get("episodes", 0) >= 100, what="the reports counted")
    clock.advance(1)
    await ticks(op)  # the stop rule was checked with 100 returns of 480 and an untrained policy
    assert status(kube)["phase"] == "Running" and cond(kube, "Succeeded") is None, status(kube).get("conditions")
    serve(pods, 2, [480.0] * 100, learner_report(2, 3))
    clock.advance(1)
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")


async def test_a_target_is_reached_only_when_the_saved_policy_meets_it(env):
    """The actors' returns only trigger the confirming evaluation: a pod of its own plays
    learner-0-0's checkpoint (fetched from its metrics port, digest from its report). One that
    evaluates below the target keeps the job running; the next check waits for a newer policy."""
    kube, clock, op, pods = env
    kube.confirm_answer = {"mean_return": 281.6, "std_return": 1.0, "mean_length": 281.6, "episodes": 100}
    serve(pods, 1, [500.0] * 100, learner_report(1, 23))
    await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}})
    clock.advance(1)
    await eventually(lambda: (status(kube).get("targetCheck") or {}).get("count") == 1, what="a first check")
    args = kube.confirmed[0]
    assert kube.confirm_meta[0]["ownerReferences"][0]["kind"] == "TianJiJob"  # it goes with the job
    assert args[args.index("--url") + 1] == f"http://{IPS[LEARNER]}:{pods.port}/checkpoint/ckpt-000000000023.pt"
    assert args[args.index("--sha256") + 1] == "ab" * 32 and args[args.index("--episodes") + 1] == "100"
    assert status(kube)["targetCheck"]["last"]["mean_return"] == 281.6
    await ticks(op, 3)
    assert status(kube)["phase"] == "Running" and len(kube.confirmed) == 1  # not again on the same policy
    assert [e for e in kube.live("v1/events") if e.get("reason") == "TargetNotConfirmed"]
    kube.confirm_answer = {"mean_return": 500.0, "std_return": 0.0, "mean_length": 500.0, "episodes": 100}
    serve(pods, 2, [500.0] * 100, learner_report(2, 24))
    clock.advance(11)  # past RETRY_S
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    st_ = status(kube)
    assert st_["targetEvaluation"]["checkpoint"] == "ckpt-000000000024.pt"
    assert st_["targetEvaluation"]["mean_return"] == 500.0 and st_["targetCheck"]["count"] == 2
    assert "confirmed: ckpt-000000000024.pt" in cond(kube, "TargetReached")["message"]
    assert st_["accounting"]["rejected"] == 0  # the confirm pod's answer is no (refused) report


async def test_a_confirm_pod_no_check_holds_is_replaced(env):
    """An operator stopped between creating the confirm pod and writing that it did: the next
    one finds a confirm pod its status does not hold, deletes it and checks afresh."""
    kube, clock, op, pods = env
    serve(pods, 1, [500.0] * 100, learner_report(1, 5))
    await kube.put_object("v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "cartpole-confirm", "namespace": NAMESPACE,
        "labels": {"tianji.dev/job": "cartpole", "tianji.dev/role": "confirm"}}})
    await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}})
    clock.advance(1)
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    assert status(kube)["targetEvaluation"]["checkpoint"] == "ckpt-000000000005.pt"


# ----------------------------------------------------------------- 2. after the end
async def test_pods_running_after_the_end_do_not_change_its_numbers(env):
    """cleanPodPolicy None keeps the pods: what they (or a pod made again) count after the end is
    not the job's result; only final reports of processes counted before the end are."""
    kube, clock, op, pods = env
    serve(pods, 1, [480.0] * 100, learner_report(1, 9))
    await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}, "runPolicy": {"cleanPodPolicy": "None"}})
    clock.advance(1)
    await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    final = {k: status(kube)[k] for k in ("meanReturn", "episodes", "envFrames", "policyVersion")}
    assert final["meanReturn"] == 480.0
    # An actor made again after the end plays badly; the old learner keeps training.
    serve(pods, 2, [22.0] * 100, learner_report(2, 60), actor_incarnation="late")
    pods.reports[IPS["cartpole-actor-0-0"]]["started"] += 500
    clock.advance(1)
    await ticks(op)
    assert {k: status(kube)[k] for k in final} == final
    assert status(kube)["phase"] == "Succeeded" and "mean return 480" in cond(kube, "Succeeded")["message"]
    # A final report of a process counted before the end still counts (its last frames).
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-actor-0-1", terminated(worker_report(
        "cartpole", "actor", 0, 1, seq=3, final=True, env_frames_total=3500)))
    await eventually(lambda: status(kube)["envFrames"] == final["envFrames"] + 2500, what="the final report counted")


@contextlib.contextmanager
def kopf_context():
    """What Kopf sets around a handler (its settings, for kopf.info/warn), for a handler called by hand."""
    from kopf._core.engines import posting

    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    token = posting.settings_var.set(settings)
    try:
        yield
    finally:
        posting.settings_var.reset(token)


async def test_handlers_with_a_copy_from_before_the_end_change_nothing(kube):
    """A resume handler or a monitor tick acting on the job as it was before it ended (a handler's
    cached body) neither brings the actors back nor re-creates the pods cleanPodPolicy deleted."""
    from tianji_operator.config import OperatorConfig
    from tianji_operator.context import Operator
    from tianji_operator.reconcile import reconcile
    from tianji_operator.timers.monitor import monitor

    clock = FakeClock()
    async with RunningOperator(kube, clock=clock):
        await kube.create_job(job_manifest("cartpole", {"stop": {"seconds": 10}}))
        await created(kube)
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running", what="phase Running")
        before_end = copy.deepcopy(job(kube))
        clock.advance(11)
        await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
        await eventually(lambda: kube.obj(STS, NAMESPACE, "cartpole-actor-0")["spec"]["replicas"] == 0
                         and not [n for (k, n) in children(kube) if k == "Pod"], what="the clean-up")
    ended = copy.deepcopy(status(kube))
    op = Operator(OperatorConfig(clock=clock, connection=kopf.ConnectionInfo(
        server=str(kube.url).rstrip("/"), insecure=True)))
    try:
        with kopf_context():
            await reconcile(op, before_end, {}, logging.getLogger("test"), "resume")
            await monitor(op, before_end, {}, logging.getLogger("test"), [])
    finally:
        await op.close()
    assert kube.obj(STS, NAMESPACE, "cartpole-actor-0")["spec"]["replicas"] == 0
    assert not [n for (k, n) in children(kube) if k == "Pod"]
    assert status(kube)["phase"] == "Succeeded" and status(kube)["conditions"] == ended["conditions"]


async def test_an_operator_stopped_between_the_end_and_its_clean_up_cleans_up_when_back(kube):
    """The end is written first, the clean-up comes after: an operator killed in between leaves
    running pods behind, which the next one deletes (cleanPodPolicy holds) without touching the end."""
    clock = FakeClock()
    async with RunningOperator(kube, clock=clock):
        await kube.create_job(job_manifest("cartpole"))
        await created(kube)
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running", what="phase Running")
    now = st.iso(clock.t)
    ended = [st.condition(t, ok, r, "mean return 480 >= stop.meanReturn 475", now=clock.t)
             for t, ok, r in (("Succeeded", True, "StopConditionReached"), ("Failed", False, "JobSucceeded"))]
    await kube.set_status(JOBS, NAMESPACE, "cartpole", {"phase": "Succeeded", "completionTime": now,
                                                         "conditions": st.set_conditions(
                                                             status(kube)["conditions"], *ended)})
    conditions = status(kube)["conditions"]
    async with RunningOperator(kube, clock=clock):
        await eventually(lambda: not [n for (k, n) in children(kube) if k == "Pod"]
                         and kube.obj(STS, NAMESPACE, "cartpole-actor-0")["spec"]["replicas"] == 0,
                         what="cleanPodPolicy Running applied")
        await kube.set_status(STS, NAMESPACE, "cartpole-actor-0", {"replicas": 0, "readyReplicas": 0})  # its controller
        await eventually(lambda: status(kube).get("actors") == "0/0", what="no actors left in status")
    assert status(kube)["phase"] == "Succeeded" and status(kube)["completionTime"] == now
    assert status(kube)["conditions"] == conditions


# ----------------------------------------------------------------- 3. restarts survive the operator
def crash(restarts: int) -> dict:
    return {"phase": "Running", "containerStatuses": [{
        "name": "worker", "ready": False, "restartCount": restarts, "image": "tianji-worker:0.1.0",
        "imageID": "", "started": False, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}


async def test_backoff_limit_is_charged_across_operator_restarts(kube):
    clock = FakeClock()
    async with RunningOperator(kube, clock=clock):
        await kube.create_job(job_manifest("cartpole", {"runPolicy": {"backoffLimit": 1}}))
        await created(kube)
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running", what="phase Running")
        await kube.set_status("v1/pods", NAMESPACE, LEARNER, crash(1))
        await eventually(lambda: status(kube).get("restarts") == 1, what="1 restart counted")
        assert status(kube)["phase"] == "Running"  # at the limit, not over it
    # No operator: the learner pod is deleted (a node drained) and nobody makes it again.
    code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{LEARNER}")
    assert code == 200
    async with RunningOperator(kube, clock=clock) as second:
        new = await eventually(lambda: (p := kube.obj("v1/pods", NAMESPACE, LEARNER)) and p, what="learner back")
        await run_pods(kube, "cartpole")
        await ticks(second, 3)
        assert status(kube)["restarts"] == 1  # never backwards: the gone pod's restart stays counted
        assert status(kube)["restartsByRole"]["learner"] == {"containers": 1, "pods": 1}
        assert status(kube)["podsSeen"][LEARNER]["uid"] == new["metadata"]["uid"]
        await kube.set_status("v1/pods", NAMESPACE, LEARNER, crash(1))  # the new pod's first restart
        await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
    failed = cond(kube, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"].startswith(f"{status(kube)['restarts']} container restarts") and \
        status(kube)["restarts"] == 2, (failed["message"], status(kube)["restarts"])


async def test_an_actor_pod_made_again_is_in_status_and_events(env):
    kube, clock, op, pods = env
    serve(pods, 1, [], learner_report(1, 1))
    await job_with_report_pods(kube, pods, IPS, {})
    await ticks(op, 2)
    code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/cartpole-actor-0-1")
    assert code == 200
    await kube.put_object("v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "cartpole-actor-0-1", "namespace": NAMESPACE,
        "labels": {"tianji.dev/job": "cartpole", "tianji.dev/role": "actor", "tianji.dev/group": "0"}}})
    await eventually(lambda: status(kube).get("restartsByRole", {}).get("actor", {}).get("pods") == 1,
                     what="the actor re-creation counted")
    await eventually(lambda: [e for e in kube.live("v1/events") if e.get("reason") == "Recreated"
                              and "Pod/cartpole-actor-0-1" in e["message"]], what="a Recreated event")


async def test_every_actor_pod_made_again_between_two_ticks_is_counted(kube):
    """A StatefulSet replaces a pod in about a second; the monitor ticks every 10 s by default.
    Two re-creations between two ticks are two (the pod watch saw each uid)."""
    clock = FakeClock(time.time())
    async with RunningOperator(kube, clock=clock, monitor_interval=2.0) as op, \
            FakePodMetrics(list(IPS.values())) as pods:
        serve(pods, 1, [], learner_report(1, 1))
        await job_with_report_pods(kube, pods, IPS, {})
        await eventually(lambda: "cartpole-actor-0-1" in status(kube).get("podsSeen", {}), what="the actor recorded")
        await ticks(op, 1)
        first = op.metrics.value("tianji_operator_timer_runs_total", timer="monitor")
        for _ in range(2):
            code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/cartpole-actor-0-1")
            assert code == 200
            await kube.put_object("v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "cartpole-actor-0-1", "namespace": NAMESPACE,
                "labels": {"tianji.dev/job": "cartpole", "tianji.dev/role": "actor", "tianji.dev/group": "0"}}})
        assert op.metrics.value("tianji_operator_timer_runs_total", timer="monitor") == first, "a tick between"
        await eventually(lambda: status(kube).get("restartsByRole", {}).get("actor", {}).get("pods") == 2,
                         what="both re-creations counted")
        await ticks(op, 1)
        assert status(kube)["restartsByRole"]["actor"]["pods"] == 2


# ----------------------------------------------------------------- 4. learner state and what status says
async def test_learners_keep_their_state_on_a_claim_of_the_default_class(kube):
    await kube.put_object("storage.k8s.io/v1/storageclasses", DEFAULT_CLASS)
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole", {"runPolicy": {"suspend": False}}))
        await created(kube, n=7)
        claim = children(kube)["PersistentVolumeClaim", f"{LEARNER}-state"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in claim["spec"]
        assert claim["metadata"]["ownerReferences"][0]["kind"] == "TianJiJob"
        vol = {"name": "state", "persistentVolumeClaim": {"claimName": f"{LEARNER}-state"}}
        assert vol in children(kube)["Pod", LEARNER]["spec"]["volumes"]
        assert {"name": "state", "emptyDir": {}} in children(kube)["Pod", "cartpole-buffer-0-0"]["spec"]["volumes"]
        durable = cond(kube, "Durable")
        assert (durable["status"], durable["reason"]) == ("True", "DefaultStorageClass"), durable
        assert "StorageClass standard" in durable["message"]
        await kube.patch_job("cartpole", {"spec": {"runPolicy": {"suspend": True}}})
        await eventually(lambda: status(kube).get("phase") == "Suspended", what="suspended")
        assert cond(kube, "Suspended")["message"].endswith("counts and learner checkpoints kept")
        assert ("PersistentVolumeClaim", f"{LEARNER}-state") in children(kube)  # kept while suspended
        # A default class added or removed later never switches a created job's volumes.
        await kube.api("DELETE", "/apis/storage.k8s.io/v1/storageclasses/standard")
        await kube.patch_job("cartpole", {"spec": {"runPolicy": {"suspend": False}}})
        new = await eventually(lambda: children(kube).get(("Pod", LEARNER)), what="the learner back")
        assert vol in new["spec"]["volumes"]
    assert_rbac_covers(kube)


async def test_without_a_default_class_the_job_says_its_learner_state_is_lost(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    durable = cond(kube, "Durable")
    assert (durable["status"], durable["reason"]) == ("False", "NoDefaultStorageClass"), durable
    assert "the cluster has no default StorageClass" in durable["message"]
    assert "starts again from policy version 0" in durable["message"]
    assert {"name": "state", "emptyDir": {}} in children(kube)["Pod", LEARNER]["spec"]["volumes"]
    await kube.patch_job("cartpole", {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: status(kube).get("phase") == "Suspended", what="suspended")
    msg = cond(kube, "Suspended")["message"]
    assert "learner state is in an emptyDir and is lost" in msg and "checkpoints kept" not in msg


async def test_ephemeral_asks_for_an_empty_dir(kube):
    await kube.put_object("storage.k8s.io/v1/storageclasses", DEFAULT_CLASS)
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole", {"checkpoint": {"ephemeral": True}}))
        await created(kube)
        assert not [n for (k, n) in children(kube) if k == "PersistentVolumeClaim"]
        assert (cond(kube, "Durable")["status"], cond(kube, "Durable")["reason"]) == ("False", "Ephemeral")


async def test_the_planned_condition_follows_scale(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    assert "(2 actors, 1 buffers, 1 learners)" in cond(kube, "Planned")["message"]
    code, _ = await kube.api("PATCH", f"/apis/tianji.dev/v1alpha1/namespaces/{NAMESPACE}/tianjijobs/cartpole/scale",
                             {"spec": {"replicas": 3}})
    assert code == 200
    await eventually(lambda: "3 actors (planned 2)" in cond(kube, "Planned")["message"], what="Planned at 3 actors")
    assert kube.obj(STS, NAMESPACE, "cartpole-actor-0")["spec"]["replicas"] == 3
