"""Restarts and pod re-creations, counted from status so that they survive the operator.

    status.restarts         container restarts of all the job's pods (runPolicy.backoffLimit
                            charges these); never goes backwards
    status.restartsByRole   {role: {containers: container restarts, pods: pods re-created}}
                            (a pod re-created under its name: deleted, evicted, or exited
                            while the job ran)
    status.podsSeen         {pod name: {uid, restarts, before: [the uid it replaced]}}: what was
                            already counted of each pod, so a tick (of this operator or of the
                            next one) adds only what is new

A pod seen under a new uid is a re-creation; its restartCount starts again. A pod first seen
is charged its whole restartCount, however early: a container that restarted before the first
tick is a restart all the same. Only a job whose status has `restarts` but no `podsSeen` (counted
by an operator from before the ledger) starts without charging what its pods already hold.

The watch delivers each pod object's events on their own, so the index may show the old
object (being deleted) after the new one under the same name: a uid once replaced (kept in
`before`) is that leftover, never a re-creation of its own. A pod absent
from a tick is forgotten only when the job no longer expects it (actors scaled away), so that
one gone for a moment (deleted, not made again yet) is still known when its successor comes.

Between two ticks (or before the first) a pod can be deleted and made again, even several
times: the pod watch records every uid it delivers under each name (`watch_pod`, kept in the
operator's memory of the job), and a tick charges each uid that came before the current one and
was never counted, with the container restarts the watch saw it reach. Pods created before the
job was (a deleted namesake job's) are not its own. After an operator restart the watch's record
starts empty: a re-creation between the last tick of the old operator and the first of the new
one is still counted by uid; only intermediate uids in that gap are not.

The ledger is reset (podsSeen {}) when a job is suspended or resumed: pods deleted and made
again by the operator's own hand are not disruptions. A pod still terminating then (created
before the suspend or resume) is not recorded, so its successor is no re-creation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Optional

from tianji.control.contracts.addressing import actor_set_name, pod_name

from ..children import builders as b

ROLES = ("learner", "buffer", "actor", "evaluator")
WATCHED_PER_NAME = 8  # uids the watch's record keeps per pod name
BEFORE_KEPT = 4  # replaced uids kept per pod in podsSeen (their late events are no re-creation)


def _restart_count(pod: dict) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def _last_restart(pod: dict) -> str:
    n = _restart_count(pod)
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (c.get("lastState") or {}).get("terminated") or {}
        detail = ", ".join(
            x for x in (term.get("reason"), f"exit code {term['exitCode']}" if "exitCode" in term else None) if x
        )
        if term:
            return f"pod {pod['metadata']['name']} restarted {n} time(s)" + (f" ({detail})" if detail else "")
    return f"pod {pod['metadata']['name']} restarted {n} time(s)"


class Ledger:
    """One tick's view of the counts, loaded from status and advanced by `observe`."""

    def __init__(self, status: dict):
        # Counted by an operator from before the ledger: its pods' restarts may be counted already.
        # A job with neither field is new: what its pods hold is charged in full.
        self.legacy = "podsSeen" not in status and "restarts" in status
        self.seen: dict[str, dict] = copy.deepcopy(status.get("podsSeen") or {})
        self.total = int(status.get("restarts") or 0)
        by = status.get("restartsByRole") or {}
        self.by_role = {
            r: {
                "containers": int((by.get(r) or {}).get("containers") or 0),
                "pods": int((by.get(r) or {}).get("pods") or 0),
            }
            for r in ROLES
        }
        self.last = ""
        self.recreated: list[str] = []  # pod names seen under a new uid this tick

    def observe(
        self,
        pods: list[dict],
        expected: set[str],
        watched: Optional[Mapping[str, Mapping[str, dict]]] = None,
        since: Optional[str] = None,
    ) -> None:
        """Charge what is new in `pods`, and the uids the watch saw come and go under their names
        (`watched`, from `watch_pod`; those created before `since`, the job's creationTimestamp,
        are not the job's); forget pods that are neither there nor expected (actors scaled
        away), so that a later scale-up is not a re-creation."""
        last_n = -1
        for p in pods:
            meta = p["metadata"]
            name, uid = meta["name"], meta.get("uid") or meta["name"]
            role = (meta.get("labels") or {}).get(b.LABEL_ROLE)
            if role not in ROLES:
                continue
            n, prev = _restart_count(p), self.seen.get(name)
            if prev is not None and uid in (prev.get("before") or ()):
                continue  # the replaced object's last events, delivered after its successor's
            if prev is None and _leftover(meta, since):
                continue  # going away from before a suspend or resume (or a namesake job): not ours
            gone, gone_restarts = _between((watched or {}).get(name) or {}, uid, prev, since)
            held = 0
            if prev is None and not gone:
                new = 0 if self.legacy else n
            elif prev is None or prev.get("uid") != uid:
                replaced = len(gone) + (prev is not None)
                self.by_role[role]["pods"] += replaced
                self.recreated.append(name)
                new = n + gone_restarts
            else:
                held = int(prev.get("restarts") or 0)
                new = max(0, n - held)
            self.seen[name] = _entry(uid, max(n, held), prev, gone)
            if new:
                self.total += new
                self.by_role[role]["containers"] += new
            if n > last_n and n:
                self.last, last_n = _last_restart(p), n
        present = {p["metadata"]["name"] for p in pods}
        self.seen = {k: v for k, v in self.seen.items() if k in present or k in expected}

    def fields(self) -> dict[str, Any]:
        return {"restarts": self.total, "restartsByRole": self.by_role, "podsSeen": self.seen}

    def summary(self) -> str:
        """e.g. "learner: 1 pod re-created; actor: 2 container restarts" (empty: nothing happened)."""
        parts = []
        for r in ROLES:
            c, p = self.by_role[r]["containers"], self.by_role[r]["pods"]
            bits = [f"{c} container restart(s)" if c else "", f"{p} pod(s) re-created" if p else ""]
            if any(bits):
                parts.append(f"{r}: " + ", ".join(x for x in bits if x))
        return "; ".join(parts)


def expected_pods(name: str, topology: Any, sets: dict[int, Any], evaluator: bool) -> set[str]:
    """Names of the pods a job runs now: its learners and buffers, actors up to each set's replicas."""
    out = {
        pod_name(name, r, g, i)
        for g in range(topology.groups)
        for r, n in (("learner", topology.learners), ("buffer", topology.buffers))
        for i in range(n)
    }
    for g, s in sets.items():
        n = int(((s or {}).get("spec") or {}).get("replicas") or 0)
        out |= {f"{actor_set_name(name, g)}-{i}" for i in range(n)}
    if evaluator:
        out.add(pod_name(name, "evaluator", 0, 0))
    return out


def _leftover(meta: Mapping[str, Any], since: Optional[str]) -> bool:
    """A pod being deleted that was created before `since`: one the operator's suspend or resume
    replaced, or a deleted namesake job's, still terminating. Recorded, its successor would be a
    re-creation."""
    created = str(meta.get("creationTimestamp") or "")
    return bool(meta.get("deletionTimestamp")) and since is not None and bool(created) and created < since


def _entry(uid: str, restarts: int, prev: Optional[dict], gone: list[str]) -> dict:
    """podsSeen's record of a pod: its uid, the restarts counted, the uids it replaced."""
    before = list((prev or {}).get("before") or [])
    if prev is not None and prev.get("uid") != uid:
        before.append(prev.get("uid"))
    before += [u for u in gone if u not in before]
    entry = {"uid": uid, "restarts": restarts}
    if before:
        entry["before"] = before[-BEFORE_KEPT:]
    return entry


def _between(seen: Mapping[str, dict], uid: str, prev: Optional[dict], since: Optional[str]) -> tuple[list[str], int]:
    """The uids the watch delivered under this name before `uid` that podsSeen does not hold
    (made and replaced between two ticks), and the container restarts not counted yet: theirs,
    and those the watch saw the held one (`prev`, replaced since) reach beyond its count."""
    prev = prev or {}
    known = {prev.get("uid"), *(prev.get("before") or ())}
    gone, restarts = [], 0
    for u, e in seen.items():
        if u == uid:
            break
        if u == prev.get("uid"):
            restarts += max(0, int(e.get("restarts") or 0) - int(prev.get("restarts") or 0))
        elif u not in known and (since is None or str(e.get("created") or "") >= since):
            gone.append(u)
            restarts += int(e.get("restarts") or 0)
    return gone, restarts


def watch_pod(watched: dict[str, dict[str, dict]], pod: Mapping[str, Any]) -> None:
    """Record what the pod watch delivered: the uid under its name (in order of first sight),
    when it was created and the most container restarts seen of it."""
    meta = pod.get("metadata") or {}
    name, uid = meta.get("name"), meta.get("uid")
    if not name or not uid:
        return
    seen = watched.setdefault(name, {})
    e = seen.setdefault(uid, {"created": meta.get("creationTimestamp") or "", "restarts": 0})
    e["restarts"] = max(int(e["restarts"]), _restart_count(dict(pod)))
    while len(seen) > WATCHED_PER_NAME:
        del seen[next(iter(seen))]
