"""TianJiJob `.status`: phase, conditions, replicas per group — pure functions.

phase               Pending | Running | Suspended | Succeeded | Failed
conditions[]        type (Planned, Durable, Ready, Progressing, Rescaled, Suspended, Succeeded, Failed,
                    TargetReached: timers/outcome.py),
                    status, reason, message, lastTransitionTime (changes only when status flips),
                    observedGeneration
observedGeneration  the metadata.generation the operator last reconciled
plan                the planner's output (topology, per-role requests, predictions)
groups[]            {group, actors|buffers|learners: {desired, ready}}
actors              "ready/desired" over all groups (printer column)
envFrames, episodes, meanReturn, meanEpisodeLength, policyVersion, policyLag, throughput, rates, bytesSent,
droppedSamples, rejectedMessages, reportTime
                    tianji.control.contracts.accounting's view (summary.json's numbers, camelCase)
accounting          the accounting's state (an operator restart continues from it)
autoscale           lastRescaleTime, lastDecision, lastEvaluation
restarts            container restarts of the job's pods (runPolicy.backoffLimit); timers/restarts.py
restartsByRole, podsSeen  restarts and pod re-creations by role, and what was counted of each pod
model[]             each learner's newest checkpoint (after the end: the one written as it stopped)
activeSince         creation or last resume (runPolicy.activeDeadlineSeconds counts from it)
startTime, completionTime
endReason           how the job ended: TargetReached, FrameBudget, TimeBudget, or its Failed reason
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Optional

CONDITION_TYPES = (
    "Planned",
    "Durable",
    "Ready",
    "Progressing",
    "Rescaled",
    "Suspended",
    "Succeeded",
    "Failed",
    "TargetReached",
)
PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
SUSPENDED = "Suspended"
TERMINAL = (SUCCEEDED, FAILED)


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def condition(
    ctype: str, status: bool | str, reason: str, message: str = "", *, now: float, generation: Optional[int] = None
) -> dict:
    if ctype not in CONDITION_TYPES:
        raise ValueError(f"unknown condition type {ctype}")
    st = status if isinstance(status, str) else ("True" if status else "False")
    c: dict[str, Any] = {
        "type": ctype,
        "status": st,
        "reason": reason,
        "message": message,
        "lastTransitionTime": iso(now),
    }
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def set_conditions(current: Optional[Iterable[dict]], *updates: dict) -> list[dict]:
    """Merge condition updates by type; keep lastTransitionTime when the status did not flip."""
    out = [dict(c) for c in (current or [])]
    for new in updates:
        for i, old in enumerate(out):
            if old.get("type") == new["type"]:
                if old.get("status") == new["status"]:
                    new = {**new, "lastTransitionTime": old.get("lastTransitionTime", new["lastTransitionTime"])}
                out[i] = new
                break
        else:
            out.append(new)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), 99))


# ----------------------------------------------------------------- pods and groups
def pod_ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def summarize(
    topology: Any, pods: list[dict], statefulsets: Mapping[int, Optional[dict]], label_role: str, label_group: str
) -> tuple[list[dict], str]:
    """Per-group desired/ready counts and the "ready/desired" actors summary."""
    groups = []
    a_ready = a_desired = 0
    for g in range(topology.groups):
        mine = [p for p in pods if p["metadata"].get("labels", {}).get(label_group) == str(g)]
        entry: dict[str, Any] = {"group": g}
        for role, desired in (("learners", topology.learners), ("buffers", topology.buffers)):
            rp = [p for p in mine if p["metadata"]["labels"].get(label_role) == role[:-1]]
            entry[role] = {"desired": desired, "ready": sum(1 for p in rp if pod_ready(p))}
        sts = statefulsets.get(g) or {}
        desired = int((sts.get("spec") or {}).get("replicas") or 0)
        ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
        entry["actors"] = {"desired": desired, "ready": min(ready, desired) if desired else ready}
        a_ready += entry["actors"]["ready"]
        a_desired += desired
        groups.append(
            {"group": g, "actors": entry["actors"], "buffers": entry["buffers"], "learners": entry["learners"]}
        )
    return groups, f"{a_ready}/{a_desired}"


def all_ready(groups: list[dict]) -> bool:
    return all(e[r]["ready"] >= e[r]["desired"] for e in groups for r in ("actors", "buffers", "learners"))


def camel_keys(obj: Any) -> Any:
    """snake_case dict keys → camelCase (Kubernetes API convention), recursively."""
    if isinstance(obj, dict):
        return {
            "".join(w.capitalize() if i else w for i, w in enumerate(str(k).split("_"))): camel_keys(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [camel_keys(v) for v in obj]
    return obj


def diff_paths(old: Any, new: Any, prefix: str = "spec") -> list[tuple[str, Any, Any]]:
    """(path, old, new) for every leaf that differs between two spec dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += diff_paths(old.get(k), new.get(k), f"{prefix}.{k}")
        return out
    return [] if old == new else [(prefix, old, new)]
