"""Disruptions with pods that really train (issue 21): the CartPole PPO example in the pod harness
(tests/kube/cluster.py: emulator, kubelet, StatefulSet controller, the real operator), one
learner pod deleted mid-run with its object lingering after its worker stopped, then a suspend
and a resume. The learner keeps its state on its claim (the cluster has a default
StorageClass), resumes at the version it stopped at, and the job ends Succeeded only at its
target, with a final checkpoint at least as new as what reached it."""
from __future__ import annotations

import asyncio
import re

import pytest

from kube.cluster import PodCluster
from kube.kubelet import unavailable_reason
from kube.operator_harness import NAMESPACE, eventually
from pod_jobs import JOB, assert_succeeded, example_job, wait_pods_gone

LEARNER = f"{JOB}-learner-0-0"
NO_KUBELET = unavailable_reason()
pytestmark = pytest.mark.skipif(NO_KUBELET is not None, reason=str(NO_KUBELET))


def resumed_version(inc) -> int | None:
    """The policy version a learner incarnation says it resumed at (None: it started afresh)."""
    m = re.search(r"resumed from \S+ at policy_version (\d+)", inc.log_path.read_text(errors="replace"))
    return int(m.group(1)) if m else None


async def sample(c: PodCluster, into: list, stop: asyncio.Event) -> None:
    """The job's phase, mean return and policy version every 0.5 s (what `kubectl get -w` shows)."""
    while not stop.is_set():
        s = c.status(JOB)
        into.append((s.get("phase"), s.get("meanReturn"), s.get("policyVersion")))
        await asyncio.sleep(0.5)


async def learner_stopped(c: PodCluster, old_uid: str):
    (inc,) = [i for i in c.kubelet.pod_incarnations(LEARNER) if i.uid == old_uid]
    await eventually(lambda: inc.exit_code is not None, timeout=60, what="the deleted learner's exit")
    return inc


async def new_learner(c: PodCluster, old_uid: str):
    return (await eventually(lambda: [i for i in c.kubelet.pod_incarnations(LEARNER)
                                      if i.uid != old_uid and i.running and resumed_version(i) is not None],
                             timeout=120, interval=0.5, what="a new learner that resumed from its claim"))[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_deleted_and_a_suspended_learner_resume_and_the_job_ends_at_its_target(tmp_path):
    samples: list = []
    done = asyncio.Event()
    async with PodCluster(tmp_path, kubelet={"removal_delay": 5.0}) as c:
        watcher = asyncio.create_task(sample(c, samples, done))
        await c.kube.create_job(example_job())
        await eventually(lambda: (c.status(JOB).get("policyVersion") or 0) >= 10, timeout=240, interval=0.5,
                         what="the learner to train a little")

        # 1. The learner pod is deleted: SIGTERM, its final checkpoint, exit 0, the object lingers 5 s.
        old = c.kube.obj("v1/pods", NAMESPACE, LEARNER)
        code, _ = await c.kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{LEARNER}")
        assert code == 200
        stopped = await learner_stopped(c, old["metadata"]["uid"])
        assert stopped.exit_code == 0 and stopped.signals == ["SIGTERM"]
        at_stop = stopped.final_report()["extra"]["version"]
        lingering = c.kube.obj("v1/pods", NAMESPACE, LEARNER)
        assert lingering and lingering["metadata"]["uid"] == old["metadata"]["uid"]  # deleted, terminal, still there
        inc = await new_learner(c, old["metadata"]["uid"])
        assert resumed_version(inc) == at_stop > 0  # from its claim, not from 0
        await eventually(lambda: c.status(JOB).get("restartsByRole", {}).get("learner", {}).get("pods") == 1,
                         timeout=30, what="the re-creation in status")

        # 2. Suspend and resume: the pods go, the learner comes back at the version it stopped at.
        if c.status(JOB).get("phase") not in ("Succeeded", "Failed"):
            await c.kube.patch_job(JOB, {"spec": {"runPolicy": {"suspend": True}}})
            await eventually(lambda: c.status(JOB).get("phase") in ("Suspended", "Succeeded"), timeout=30,
                             what="suspended")
            if c.status(JOB)["phase"] == "Suspended":
                assert "learner checkpoints kept" in next(x for x in c.status(JOB)["conditions"]
                                                          if x["type"] == "Suspended")["message"]
                await eventually(lambda: not c.pods(JOB, role="learner") and inc.exit_code is not None, timeout=60,
                                 what="the learner gone")
                suspended_at = inc.final_report()["extra"]["version"]
                await c.kube.patch_job(JOB, {"spec": {"runPolicy": {"suspend": False}}})
                again = await new_learner(c, inc.uid)
                assert resumed_version(again) == suspended_at >= at_stop

        await eventually(lambda: c.status(JOB).get("phase") in ("Succeeded", "Failed"), timeout=400, interval=0.5,
                         what="the job to finish")
        st = c.status(JOB)
        assert_succeeded(st)
        assert st["meanReturn"] >= 475 and "mean return" in next(
            x for x in st["conditions"] if x["type"] == "Succeeded")["message"], st
        ended_at = st["policyVersion"]
        await wait_pods_gone(c)
        # The job's output: the checkpoint the learner wrote as it stopped, not older than the end's.
        model = await eventually(lambda: [m for m in c.status(JOB).get("model", []) if m.get("final")], timeout=30,
                                 what="the final checkpoint in status")
        assert model[0]["policyVersion"] >= ended_at > 0, (model, ended_at)
        (state,) = c.kubelet.claim_dirs(NAMESPACE, f"{LEARNER}-state")
        assert (state / "checkpoints" / "0-0" / model[0]["checkpoint"]).exists()
        done.set()
        await watcher
    # Never Succeeded below the target: the first Succeeded sample already shows it reached.
    first = next(s for s in samples if s[0] == "Succeeded")
    assert first[1] >= 475, first
    assert not c.leftovers, c.leftovers
