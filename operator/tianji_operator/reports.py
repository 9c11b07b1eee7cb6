"""Role reports from pods: what the operator feeds tianji.control.accounting.

A running pod answers `GET http://<podIP>:<metrics port>/report` with its report;
a container that ended left its final report as its termination message
(`state.terminated.message`, or `lastState.terminated.message` once it restarted),
so the counts it made after the last scrape are not lost. Both are validated by
`parse_report` like the local launcher's pushed reports; what fails is counted,
never trusted.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator

import aiohttp

from tianji.control.report import Report, ReportError, parse_report

from . import status as st


def terminated_reports(pod: dict, job: str) -> Iterator[Report | ReportError]:
    """Final reports in a pod's container statuses (current and previous container)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (cs.get("state"), cs.get("lastState")):
            msg = ((state or {}).get("terminated") or {}).get("message")
            if not msg:
                continue
            try:
                yield parse_report(json.loads(msg), job)
            except (ValueError, ReportError) as e:  # JSONDecodeError is a ValueError
                yield ReportError(f"{pod['metadata']['name']}: termination message: {e}")


def pod_port(pod: dict, name: str, default: int) -> int:
    """A named container port of the pod (per pod under host networking), else `default`."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name and p.get("containerPort"):
                return int(p["containerPort"])
    return default


async def scrape_reports(session: aiohttp.ClientSession, pods: list[dict], port: int,
                         job: str) -> tuple[list[Report], list[str]]:
    """(reports, errors) from every running pod's /report; a pod that does not answer is
    an error, not a zero."""
    targets = [p for p in pods if (p.get("status") or {}).get("podIP") and st.pod_phase(p) == "Running"
               and not p["metadata"].get("deletionTimestamp")]

    async def one(pod: dict) -> Report | str:
        name = pod["metadata"]["name"]
        url = f"http://{pod['status']['podIP']}:{pod_port(pod, 'metrics', port)}/report"
        try:
            async with session.get(url) as resp:
                if resp.status != 200:
                    return f"{name}: HTTP {resp.status} from {url}"
                return parse_report(json.loads(await resp.read()), job)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return f"{name}: {type(e).__name__} from {url}: {e}"
        except (ValueError, ReportError) as e:
            return f"{name}: bad report: {e}"

    got: list[Any] = await asyncio.gather(*(one(p) for p in targets))
    return [r for r in got if isinstance(r, Report)], [r for r in got if isinstance(r, str)]
