"""The operator's side of tianji.control.accounting: pods' reports in, status numbers out.

Running pods answer /report; ended containers left their final report as termination
message (`on_pod_event` catches those of pods being deleted, before the message is gone).
The numbers written are `Accounting.view()`: what a local run's summary.json shows.
"""
from __future__ import annotations

import logging
from typing import Optional

from tianji.control.accounting import Accounting, status_numbers

from . import builders as b
from . import status as st
from .reports import scrape_reports, terminated_reports
from .context import JobMemory, Operator


# ----------------------------------------------------------------- accounting
async def count_reports(op: Operator, mem: JobMemory, name: str, pods: list[dict], port: int) -> Accounting:
    """Feed the job's accounting: every running pod's /report, and the final reports that
    ended containers left in their termination messages. The caller has loaded `mem`'s
    accounting (JobMemory.accounting) from the job's status."""
    for pod in pods:
        for rep in terminated_reports(pod, name):
            mem.take(rep)
    reports, errors = await scrape_reports(op.http(), pods, port, name)
    for rep in reports:
        mem.take(rep)
    if errors:
        op.metrics.errors.labels(where="reports").inc(len(errors))
        mem.refuse(errors, counted=False)  # unreachable pods are errors, not rejected reports
    return mem.acc


def elapsed_since_start(status: dict, now: float) -> float:
    """Seconds the job has run: since startTime, until completionTime once it ended."""
    start = st.parse_iso(status.get("startTime"))
    end = st.parse_iso(status.get("completionTime")) or now
    return max(0.0, end - start) if start is not None else 0.0


def counted_fields(acc: Accounting, status: dict, now: float) -> dict:
    """The accounting's status fields (summary.json's numbers) and its state."""
    return {**status_numbers(acc.view(elapsed_since_start(status, now))), "reportTime": st.iso(now),
            "accounting": acc.state()}


def final_counted_fields(acc: Accounting, status: dict, now: float) -> Optional[dict]:
    """An ended job's numbers, only when a final report changed a count (no write every tick)."""
    fields = counted_fields(acc, status, now)
    fields.pop("rates")  # nothing runs any more: the last live rates stay as they were
    if all(status.get(k) == v for k, v in fields.items() if k != "reportTime"):
        return None
    return fields


def on_pod_event(op: Operator, event: dict, logger: logging.Logger) -> None:
    """A job's pod changed or went away: count the final report its container left, before
    the pod object (and with it the termination message) is gone."""
    pod = event.get("object") or {}
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(b.LABEL_JOB)
    if not job:
        return
    mem = op.jobs.get((meta.get("namespace") or "", job))
    if mem is None or mem.acc is None:
        return  # not counting this job yet: the monitor reads termination messages itself
    for rep in terminated_reports(pod, job):
        mem.take(rep)
