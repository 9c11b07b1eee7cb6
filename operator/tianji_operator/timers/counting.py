"""The operator's side of tianji.control.contracts.accounting: pods' reports in, status numbers out.

Running pods answer /report; ended containers left their final report as termination
message (`on_pod_event` catches those of pods being deleted, before the message is gone).
The numbers written are `Accounting.view()`: what a local run's summary.json shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

import kopf

from tianji.control.contracts.accounting import Accounting, status_numbers
from tianji.control.contracts.rolereport import Report

from .. import status as st
from ..children import builders as b
from ..context import JobMemory, Operator
from .podreports import scrape_reports, terminated_reports
from .restarts import watch_pod


# ----------------------------------------------------------------- accounting
async def count_reports(
    op: Operator, mem: JobMemory, name: str, pods: list[dict], port: int, ended: bool = False
) -> tuple[Accounting, list[Report]]:
    """Feed the job's accounting: every running pod's /report, and the final reports that
    ended containers left in their termination messages. The caller has loaded `mem`'s
    accounting (JobMemory.accounting) from the job's status. Returns the accounting and the
    reports live processes answered with this time.

    After the end (`ended`) only final reports count, and only of processes counted before
    it: the job's numbers are its result, not what pods kept running (cleanPodPolicy None) or
    made again afterwards do."""
    acc = mem.acc
    assert acc is not None, "count_reports: the caller loads the job's accounting first (JobMemory.accounting)"
    mem.ended = ended
    for pod in pods:
        for rep in terminated_reports(pod, name):
            mem.take(rep)
    if ended:
        return acc, []
    reports, errors = await scrape_reports(op.http(), pods, port, name)
    for rep in reports:
        mem.take(rep)
    if errors:
        op.metrics.errors.labels(where="reports").inc(len(errors))
        mem.refuse(errors, counted=False)  # unreachable pods are errors, not rejected reports
    return acc, reports


def best_versions(acc: Accounting) -> dict[int, int]:
    """The highest policy version any learner incarnation of each group reported (current or
    replaced: the accounting keeps both, also across operator restarts)."""
    out: dict[int, int] = {}
    procs = [p for (r, _, _), p in acc.procs.items() if r == "learner"]
    procs += [p for p in acc.gone.values() if p.role == "learner"]
    for p in procs:
        out[p.group] = max(out.get(p.group, 0), int(p.extra.get("version", 0) or 0))
    return out


def learners_behind(acc: Accounting, live: list[Report], topology: Any, trained: bool) -> list[str]:
    """Why the learners do not back an end yet (empty: they do). Every planned learner must
    have answered this tick from its running process (not a final report: a pod being deleted
    or stopped is never "done") with a policy version not below the best its group reached
    (a learner that restarted from an older checkpoint first catches up), and, when `trained`
    is asked, above 0 (an untrained network is no result)."""
    best = best_versions(acc)
    mine = {r.key: r for r in live if r.role == "learner" and not r.final}
    out = []
    for g in range(topology.groups):
        for i in range(topology.learners):
            rep = mine.get(("learner", g, i))
            if rep is None:
                out.append(f"learner-{g}-{i} has not reported from a running pod")
                continue
            v = int(rep.extra.get("version", 0) or 0)
            if v < best.get(g, 0):
                out.append(f"learner-{g}-{i} is at policy version {v}, below the {best[g]} its group reached")
            elif trained and v <= 0:
                out.append(f"learner-{g}-{i} has not trained yet (policy version 0)")
    return out


CHECKPOINT_NAME = re.compile(r"^ckpt-(\d{1,18})\.pt$")  # tianji.runtime.checkpoint's file names


def model_entries(acc: Accounting, current: Any) -> list[dict]:
    """status.model: each learner's newest checkpoint as it named it (its last report; after the
    end, its final report: the checkpoint written as it stopped), with the policy version in
    the name. Entries the accounting no longer holds (an operator restart) are kept."""
    out = {e["learner"]: e for e in current or [] if isinstance(e, dict) and isinstance(e.get("learner"), str)}
    for (role, g, i), p in sorted(acc.procs.items()):
        m = CHECKPOINT_NAME.match(str(p.extra.get("checkpoint") or "")) if role == "learner" else None
        if m:
            out[f"learner-{g}-{i}"] = {
                "learner": f"learner-{g}-{i}",
                "checkpoint": m.group(0),
                "policyVersion": int(m.group(1)),
                "final": bool(p.final),
            }
    return [out[k] for k in sorted(out)]


def elapsed_since_start(status: dict, now: float) -> float:
    """Seconds the job has run: since startTime, until completionTime once it ended."""
    start = st.parse_iso(status.get("startTime"))
    end = st.parse_iso(status.get("completionTime")) or now
    return max(0.0, end - start) if start is not None else 0.0


def counted_fields(acc: Accounting, status: dict, now: float) -> dict:
    """The accounting's status fields (summary.json's numbers) and its state."""
    fields = {
        **status_numbers(acc.view(elapsed_since_start(status, now))),
        "reportTime": st.iso(now),
        "accounting": acc.state(),
    }
    model = model_entries(acc, status.get("model"))
    if model:
        fields["model"] = model
    return fields


def final_counted_fields(acc: Accounting, status: dict, now: float) -> Optional[dict]:
    """An ended job's numbers, only when a final report changed a count (no write every tick)."""
    fields = counted_fields(acc, status, now)
    fields.pop("rates")  # nothing runs any more: the last live rates stay as they were
    if all(status.get(k) == v for k, v in fields.items() if k != "reportTime"):
        return None
    return fields


def on_pod_event(op: Operator, event: Mapping[str, Any], logger: kopf.Logger) -> None:
    """A job's pod changed or went away: count the final report its container left, before
    the pod object (and with it the termination message) is gone."""
    pod = event.get("object") or {}
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(b.LABEL_JOB)
    if not job or (meta.get("labels") or {}).get(b.LABEL_ROLE) == b.CONFIRM_ROLE:
        return  # the confirm pod's termination message is an evaluation (timers/confirm.py), no report
    mem = op.jobs.get((meta.get("namespace") or "", job))
    if mem is None:
        return  # not a job this operator reconciled (yet)
    watch_pod(mem.watched, pod)
    if mem.acc is None:
        return  # not counting this job yet: the monitor reads termination messages itself
    for rep in terminated_reports(pod, job):
        mem.take(rep)
