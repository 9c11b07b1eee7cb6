"""The restart ledger (operator timers/restarts.py) on its own: tick after tick of pod lists, as
the watch's index shows them, each charged once.

* a container restart before the operator first records the job's pods is charged (a new job
  has neither `restarts` nor `podsSeen`), so backoffLimit sees it; only a job counted by an
  operator from before the ledger (`restarts` without `podsSeen`) starts from what it has;
* a pod re-created under its name is counted once, whether a tick sees the gap or not, and
  the replaced object showing up again after its successor (the watch delivers each object's
  events on their own) counts nothing;
* a pod gone for a tick but still expected is remembered; one scaled away is forgotten, so its
  scale-up is no re-creation;
* what the pod watch delivered between ticks (`watch_pod`) is counted too: a pod re-created
  before the first tick, or several times between two, with the restarts its objects reached;
  pods created before the job (a deleted namesake's) are not its own;
* a pod still terminating from before a suspend or resume (the ledger was reset) is not
  recorded: its successor is the operator's own doing, no re-creation."""
from __future__ import annotations

from tianji_operator.children.builders import LABEL_ROLE
from tianji_operator.timers.restarts import Ledger, watch_pod

ACTOR = "j-actor-0-0"
LEARNER = "j-learner-0-0"


JOB_CREATED = "2026-11-27T00:00:00Z"


def pod(name: str, uid: str, restarts: int = 0, role: str = "actor", deleting: bool = False,
        created: str = "2026-11-27T00:00:05Z") -> dict:
    meta = {"name": name, "uid": uid, "labels": {LABEL_ROLE: role}, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [
        {"name": "worker", "restartCount": restarts,
         "lastState": {"terminated": {"reason": "Error", "exitCode": 1}} if restarts else {}}]}}


def tick(status: dict, pods: list[dict], expected: set[str] = frozenset({ACTOR, LEARNER}),
         watched: dict | None = None) -> tuple[dict, Ledger]:
    """One monitor tick: the ledger from status, the pods observed (and what the watch
    delivered before, when given), the fields written back."""
    ledger = Ledger(status)
    ledger.observe(pods, set(expected), watched, JOB_CREATED)
    return {**status, **ledger.fields()}, ledger


def test_a_restart_before_the_first_tick_is_charged():
    status, ledger = tick({"phase": "Pending"}, [pod(LEARNER, "l1", restarts=2, role="learner"), pod(ACTOR, "a1")])
    assert status["restarts"] == 2 and status["restartsByRole"]["learner"]["containers"] == 2
    assert "learner-0-0 restarted 2 time(s)" in ledger.last
    status, _ = tick(status, [pod(LEARNER, "l1", restarts=2, role="learner"), pod(ACTOR, "a1")])
    assert status["restarts"] == 2  # the next tick adds nothing


def test_a_job_counted_before_the_ledger_is_not_charged_again():
    status, _ = tick({"restarts": 3}, [pod(LEARNER, "l1", restarts=3, role="learner")])
    assert status["restarts"] == 3
    status, _ = tick(status, [pod(LEARNER, "l1", restarts=4, role="learner")])
    assert status["restarts"] == 4


def test_a_recreated_actor_is_counted_once_with_or_without_a_gap():
    status, _ = tick({}, [pod(ACTOR, "a1")])
    status, _ = tick(status, [pod(ACTOR, "a1", deleting=True)])
    status, _ = tick(status, [])  # deleted, its successor not made yet: still expected
    status, ledger = tick(status, [pod(ACTOR, "a2")])
    assert ledger.recreated == [ACTOR] and status["restartsByRole"]["actor"]["pods"] == 1
    status, ledger = tick(status, [pod(ACTOR, "a2")])
    assert not ledger.recreated and status["restartsByRole"]["actor"]["pods"] == 1


def test_the_replaced_object_seen_after_its_successor_counts_nothing():
    status, _ = tick({}, [pod(ACTOR, "a1")])
    status, _ = tick(status, [pod(ACTOR, "a2")])  # re-made within a tick
    status, ledger = tick(status, [pod(ACTOR, "a1", deleting=True)])  # the old object's late event
    assert not ledger.recreated
    status, ledger = tick(status, [pod(ACTOR, "a2", restarts=1)])
    assert not ledger.recreated
    assert status["restartsByRole"]["actor"] == {"containers": 1, "pods": 1}
    assert status["podsSeen"][ACTOR]["uid"] == "a2"


def test_every_recreation_in_a_row_is_counted():
    status, _ = tick({}, [pod(ACTOR, "a1")])
    for uid in ("a2", "a3", "a4"):
        status, _ = tick(status, [pod(ACTOR, uid)])
    assert status["restartsByRole"]["actor"]["pods"] == 3


def test_a_pod_scaled_away_and_back_is_no_recreation():
    status, _ = tick({}, [pod(ACTOR, "a1")])
    status, _ = tick(status, [], expected={LEARNER})  # scaled to 0 actors
    assert ACTOR not in status["podsSeen"]
    status, ledger = tick(status, [pod(ACTOR, "a9")])
    assert not ledger.recreated and status["restartsByRole"]["actor"]["pods"] == 0


def test_backoff_limit_sees_the_early_restarts_across_operators():
    """Two operators in turn: each reads what the other wrote; nothing is charged twice."""
    status, _ = tick({}, [pod(LEARNER, "l1", restarts=1, role="learner")])
    status, _ = tick(dict(status), [pod(LEARNER, "l2", restarts=0, role="learner")])
    status, ledger = tick(dict(status), [pod(LEARNER, "l2", restarts=2, role="learner")])
    assert ledger.total == 3 and status["restartsByRole"]["learner"] == {"containers": 3, "pods": 1}


def watch(*pods: dict, into: dict | None = None) -> dict:
    """What the pod watch records of these objects, in the order delivered."""
    into = {} if into is None else into
    for p in pods:
        watch_pod(into, p)
    return into


def test_a_pod_recreated_before_the_first_tick_is_counted():
    watched = watch(pod(ACTOR, "a1", restarts=1), pod(ACTOR, "a1", deleting=True, restarts=1), pod(ACTOR, "a2"))
    status, ledger = tick({}, [pod(ACTOR, "a2")], watched=watched)
    assert ledger.recreated == [ACTOR]
    assert status["restartsByRole"]["actor"] == {"containers": 1, "pods": 1}
    status, ledger = tick(status, [pod(ACTOR, "a1", deleting=True), pod(ACTOR, "a2")], watched=watched)
    assert not ledger.recreated and status["restartsByRole"]["actor"] == {"containers": 1, "pods": 1}


def test_every_recreation_between_two_ticks_is_counted_with_its_restarts():
    watched = watch(pod(LEARNER, "l1", role="learner"))
    status, _ = tick({}, [pod(LEARNER, "l1", role="learner")], watched=watched)
    # l1 restarts twice more after the tick, then is replaced by l2 (restarted once), then by l3
    watch(pod(LEARNER, "l1", restarts=2, role="learner"), pod(LEARNER, "l2", restarts=1, role="learner"),
          pod(LEARNER, "l3", role="learner"), into=watched)
    status, ledger = tick(status, [pod(LEARNER, "l3", role="learner")], watched=watched)
    assert status["restartsByRole"]["learner"] == {"containers": 3, "pods": 2}
    assert ledger.total == 3
    status, ledger = tick(status, [pod(LEARNER, "l2", role="learner", deleting=True),
                                   pod(LEARNER, "l3", role="learner")], watched=watched)
    assert not ledger.recreated and status["restartsByRole"]["learner"] == {"containers": 3, "pods": 2}


def test_a_deleted_namesake_jobs_pods_are_not_this_jobs():
    old = pod(ACTOR, "old", restarts=4, created="2026-11-26T23:59:00Z")
    watched = watch(old, pod(ACTOR, "a1"))
    status, ledger = tick({}, [pod(ACTOR, "a1")], watched=watched)
    assert not ledger.recreated and status["restarts"] == 0


def test_the_watch_record_keeps_a_few_uids_per_name():
    watched = watch(*(pod(ACTOR, f"a{i}") for i in range(20)))
    assert list(watched[ACTOR]) == [f"a{i}" for i in range(12, 20)]


def test_a_pod_still_terminating_from_before_a_resume_is_no_recreation():
    """The actors' StatefulSet scaled to 0 on suspend; on resume (podsSeen {}, the watch's record
    cleared, `since` the resume) the old actor pod is still going away, then its successor comes."""
    resumed = "2026-11-27T00:10:00Z"
    old = pod(ACTOR, "a1", restarts=1, deleting=True, created="2026-11-27T00:00:05Z")
    ledger = Ledger({"podsSeen": {}})
    ledger.observe([old, pod(LEARNER, "l2", role="learner", created=resumed)], {ACTOR, LEARNER}, {}, resumed)
    status = ledger.fields()
    assert ACTOR not in status["podsSeen"] and status["restarts"] == 0
    watched = watch(old, pod(ACTOR, "a2", created=resumed))
    ledger = Ledger(status)
    ledger.observe([pod(ACTOR, "a2", created=resumed), pod(LEARNER, "l2", role="learner", created=resumed)],
                   {ACTOR, LEARNER}, watched, resumed)
    assert not ledger.recreated and ledger.fields()["restartsByRole"]["actor"] == {"containers": 0, "pods": 0}
    # deleted after the resume, it is the job's own pod: its successor is a re-creation
    ledger.observe([pod(ACTOR, "a2", deleting=True, created=resumed)], {ACTOR, LEARNER}, watched, resumed)
    ledger.observe([pod(ACTOR, "a3", created=resumed)], {ACTOR, LEARNER}, watched, resumed)
    assert ledger.recreated == [ACTOR] and ledger.fields()["restartsByRole"]["actor"]["pods"] == 1
