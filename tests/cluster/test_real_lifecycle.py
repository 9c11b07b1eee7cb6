"""The operator's own life on the real real (its pod on the process-mode node, the jobs' pods
on the real nodes, conftest.py's `real`): restarted mid-run by its Deployment
(no duplicate child, no terminal condition rewritten, no actor of an ended job revived), stopped
while pods are lost (each re-creation counted when it returns), and `helm uninstall` with a job
running (no object left, no finalizer stuck)."""
from __future__ import annotations

import time

import pytest

from cluster_jobs import (
    JOB,
    TARGET_ONLY,
    diagnostics,
    install_real_operator,
    on_real_nodes,
    pods,
    status,
    training,
    wait_phase,
)
from clusterkit import OPERATOR_NS, RELEASE, get, helm, wait_for

OPERATOR_POD = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"


def operator_pod(c) -> dict | None:
    items = (get(c, "pods", "-n", OPERATOR_NS, "-l", OPERATOR_POD) or {}).get("items") or []
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else None


def stateful_pods(c, ns: str) -> dict[str, str]:
    """Name -> uid of the job's learner and buffer pods: the ones a restarted operator must keep."""
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(c, ns)
            if p["metadata"]["labels"].get("tianji.dev/role") in ("learner", "buffer")}


def ready(p: dict | None) -> bool:
    return bool(p) and any(x["type"] == "Ready" and x["status"] == "True" for x in p["status"].get("conditions", []))


def restart_operator(c) -> None:
    old = operator_pod(c)
    c.kubectl("delete", "pod", "-n", OPERATOR_NS, old["metadata"]["name"])
    wait_for(lambda: (p := operator_pod(c)) and p["metadata"]["uid"] != old["metadata"]["uid"] and ready(p),
             120, "a new operator pod, Ready")


@pytest.mark.timeout(900)
def test_an_operator_restart_keeps_ended_jobs_ended_and_running_ones_single(real, real_operator, ns):
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(  # an end soon, on a frame budget
        real, {"stop": {"meanReturn": None, "envFrames": 10_000}}, name="done"))
    wait_phase(real, ns, ("Succeeded", "Failed"), 600, name="done")
    wait_for(lambda: not pods(real, ns, "done"), 120, "the ended job's pods gone")
    # the final reports of the pods that stopped at the end are counted once they are gone
    time.sleep(5)  # a few monitor ticks (1 s) to count them
    ended = status(real, ns, "done")
    # The second job runs on a time budget, so no end (a target met, its confirming pod) falls
    # inside the restart, however fast it trains.
    real.kubectl("apply", "-n", ns, "-f", "-",
                    input=on_real_nodes(real, {"stop": {"meanReturn": None, "envFrames": None, "seconds": 90}}))
    wait_for(lambda: status(real, ns).get("envFrames", 0) > 5000, 300, "the second job training",
             on_timeout=lambda: diagnostics(real, ns))
    before = stateful_pods(real, ns)
    assert len(before) == 2, before  # learner-0-0 and buffer-0-0
    restart_operator(real)
    # The running job keeps its children: the same learner and buffer pods, one StatefulSet, no
    # second learner (actors may be rescaled meanwhile: not a re-creation).
    frames = status(real, ns).get("envFrames", 0)
    wait_for(lambda: status(real, ns).get("envFrames", 0) > frames + 10_000, 120, "training to go on")
    assert stateful_pods(real, ns) == before
    sets = get(real, "statefulsets", "-n", ns, "-l", f"tianji.dev/job={JOB}")["items"]
    assert len(sets) == 1, [s["metadata"]["name"] for s in sets]
    # The ended job: same phase, conditions and numbers; its actors stay at 0.
    now = status(real, ns, "done")
    for key in ("phase", "conditions", "meanReturn", "envFrames", "episodes", "completionTime"):
        assert now.get(key) == ended.get(key), (key, ended.get(key), now.get(key))
    assert not pods(real, ns, "done")
    done_sets = get(real, "statefulsets", "-n", ns, "-l", "tianji.dev/job=done")["items"]
    assert all(s["spec"]["replicas"] == 0 for s in done_sets), [s["spec"] for s in done_sets]
    st = wait_phase(real, ns, ("Succeeded", "Failed"), 600)
    assert st["phase"] == "Succeeded" and st.get("endReason") == "TimeBudget", st


def scale_operator(c, replicas: int) -> None:
    c.kubectl("scale", "deployment", "-n", OPERATOR_NS, "-l", OPERATOR_POD, f"--replicas={replicas}")
    if replicas:
        wait_for(lambda: ready(operator_pod(c)), 120, "the operator pod, Ready")
    else:
        wait_for(lambda: not (get(c, "pods", "-n", OPERATOR_NS, "-l", OPERATOR_POD) or {}).get("items"), 120,
                 "the operator pod gone")


@pytest.mark.timeout(900)
def test_pods_lost_while_the_operator_is_down_are_counted_when_it_returns(real, real_operator, ns):
    """With no operator running, an actor pod is deleted (its StatefulSet makes it again) and so is
    the learner pod (nothing makes it again). The operator that comes back counts both
    re-creations, makes the learner again, and the job still ends at its target."""
    real.kubectl("apply", "-n", ns, "-f", "-",
                    input=on_real_nodes(real, {**TARGET_ONLY, "checkpoint": {"intervalSeconds": 5}}))
    training(real, ns)
    actor, learner = f"{JOB}-actor-0-1", f"{JOB}-learner-0-0"
    gone = {n: get(real, "pod", "-n", ns, n)["metadata"]["uid"] for n in (actor, learner)}
    scale_operator(real, 0)
    try:
        for name in (actor, learner):
            real.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
        wait_for(lambda: (p := get(real, "pod", "-n", ns, actor)) and p["metadata"]["uid"] != gone[actor],
                 120, "the StatefulSet to make the actor again", on_timeout=lambda: diagnostics(real, ns))
        wait_for(lambda: get(real, "pod", "-n", ns, learner) is None, 120, "the learner pod gone")
    finally:
        scale_operator(real, 1)
    wait_for(lambda: (p := get(real, "pod", "-n", ns, learner)) and p["metadata"]["uid"] != gone[learner],
             120, "the operator to make the learner again", on_timeout=lambda: diagnostics(real, ns))
    st = wait_phase(real, ns, ("Succeeded", "Failed"), 480)
    assert st["phase"] == "Succeeded" and st.get("endReason") == "TargetReached", diagnostics(real, ns)
    by_role = st["restartsByRole"]
    assert by_role["actor"]["pods"] == 1 and by_role["learner"]["pods"] == 1, by_role


@pytest.mark.timeout(600)
def test_helm_uninstall_with_a_running_job_leaves_nothing_stuck(real, real_operator, ns):
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, {"stop": {"meanReturn": None,
                                                                                   "envFrames": None}}))
    wait_for(lambda: status(real, ns).get("phase") == "Running", 300, "the job running",
             on_timeout=lambda: diagnostics(real, ns))
    try:
        helm(real, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout=180s")
        job = get(real, "tjj", "-n", ns, JOB)
        assert job is None or not job["metadata"].get("finalizers"), job["metadata"]
        # Deleting the job now needs no operator: nothing holds it, garbage collection takes the children.
        real.kubectl("delete", "tjj", JOB, "-n", ns, "--timeout=60s", check=False)
        wait_for(lambda: get(real, "tjj", "-n", ns, JOB) is None, 60, "the job gone")
        wait_for(lambda: not pods(real, ns), 120, "its pods gone (garbage collector)")
        real.kubectl("delete", "ns", ns, "--timeout=120s")
        left = real.kubectl("get", "all", "-n", OPERATOR_NS, "-o", "name").stdout.split()
        assert not [x for x in left if "tianji" in x], left
    finally:  # the session's later tests keep an operator
        install_real_operator(real)
