"""Role reports from pods: what the operator feeds tianji.control.contracts.accounting.

A running pod answers `GET http://<podIP>:<metrics port>/report` with its report;
a container that ended left its final report as its termination message
(`state.terminated.message`, or `lastState.terminated.message` once it restarted),
so the counts it made after the last scrape are not lost. Both are validated by
`parse_report` like the local launcher's pushed reports; what fails is counted,
never trusted. A report counts only as the pod it came from (`as_pod`): its
(role, group, index) must be the pod's labels, so an actor pod cannot report as
the learner or as another actor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp

from tianji.control.contracts.addressing import POD_INDEX_LABEL
from tianji.control.contracts.rolereport import Report, ReportError, parse_report

from .. import status as st
from ..children.builders import LABEL_GROUP, LABEL_INDEX, LABEL_ROLE


def as_pod(rep: Report, pod: dict) -> Report:
    """`rep` if its (role, group, index) is the pod's own (labels; an actor's index is its ordinal),
    else ReportError."""
    meta = pod.get("metadata") or {}
    lab = meta.get("labels") or {}
    index = lab.get(LABEL_INDEX) or lab.get(POD_INDEX_LABEL) or str(meta.get("name", "")).rsplit("-", 1)[-1]
    if (rep.role, str(rep.group), str(rep.index)) != (lab.get(LABEL_ROLE), lab.get(LABEL_GROUP), index):
        raise ReportError(
            f"{meta.get('name')}: a report as {rep.role}-{rep.group}-{rep.index} from "
            f"{lab.get(LABEL_ROLE)}-{lab.get(LABEL_GROUP)}-{index}"
        )
    return rep


def terminated_reports(pod: dict, job: str) -> Iterator[Report | ReportError]:
    """Final reports in a pod's container statuses (current and previous container)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (cs.get("state"), cs.get("lastState")):
            msg = ((state or {}).get("terminated") or {}).get("message")
            if not msg:
                continue
            try:
                yield as_pod(parse_report(json.loads(msg), job), pod)
            except (ValueError, ReportError) as e:  # JSONDecodeError is a ValueError
                yield ReportError(f"{pod['metadata']['name']}: termination message: {e}")


def pod_port(pod: dict, name: str, default: int) -> int:
    """A named container port of the pod (per pod under host networking), else `default`."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name and p.get("containerPort"):
                return int(p["containerPort"])
    return default


async def scrape_reports(
    session: aiohttp.ClientSession, pods: list[dict], port: int, job: str
) -> tuple[list[Report], list[str]]:
    """(reports, errors) from every running pod's /report; a pod that does not answer is
    an error, not a zero."""
    targets = [
        p
        for p in pods
        if (p.get("status") or {}).get("podIP")
        and st.pod_phase(p) == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]

    async def one(pod: dict) -> Report | str:
        name = pod["metadata"]["name"]
        url = f"http://{pod['status']['podIP']}:{pod_port(pod, 'metrics', port)}/report"
        try:
            async with session.get(url) as resp:
                if resp.status != 200:
                    return f"{name}: HTTP {resp.status} from {url}"
                return as_pod(parse_report(json.loads(await resp.read()), job), pod)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return f"{name}: {type(e).__name__} from {url}: {e}"
        except (ValueError, ReportError) as e:
            return f"{name}: bad report: {e}"

    got: list[Any] = await asyncio.gather(*(one(p) for p in targets))
    return [r for r in got if isinstance(r, Report)], [r for r in got if isinstance(r, str)]
