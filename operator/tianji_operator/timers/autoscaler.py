"""Actor rescaling from measured throughput (a Kopf timer per TianJiJob).

Every `spec.autoscale.intervalSeconds` the timer takes, per group,

    produced   actors' env frames/s        tianji_env_frames_total{role="actor"}
    received   buffers' samples/s in       tianji_samples_received_total{role="buffer"}
    consumed   learners' samples/s used    tianji_samples_consumed_total{role="learner"}
    capacity   learners' samples per busy second   tianji_learner_capacity_sps (gauge)

either with PromQL against `spec.autoscale.prometheusUrl` (rate over a window),
or, with no URL, from the job's accounting (tianji.control.contracts.accounting, fed by the
monitor from the pods' reports: the same counters). The status numbers (frames,
mean return, lag, rates) are the accounting's in both cases; this module only
decides actor counts.

In `spec.autoscale.mode: planner` (or `enabled: true`), `tianji.control.planner.plan.rebalance`
(the planner's balance: actors_for, observed_bottleneck) turns the rates into an actor
count per group; the operator clamps it to [minActors,
maxActors], does nothing while a group has actors that are not ready yet (no pending
pods piling up), waits `scaleUpCooldownSeconds` / `scaleDownCooldownSeconds` (default
`cooldownSeconds`) after the previous change, patches the group's
StatefulSet `spec.replicas`, posts an event and records the decision in
`.status.autoscale` and the `Rescaled` condition. A job that is not Running is
never rescaled (checked on a fresh read, just before the patch).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Optional

import aiohttp

from tianji.control.contracts.accounting import Accounting
from tianji.control.planner.plan import GroupThroughput, RebalancePolicy, observed_bottleneck, rebalance

ACTOR, BUFFER, LEARNER = "actor", "buffer", "learner"


class MetricsError(RuntimeError):
    """Prometheus or the pods could not be read."""


@dataclass
class Observation:
    groups: dict[int, dict[str, float]]  # group -> {produced, received, consumed}
    source: str = ""

    def throughput(self, actors: dict[int, int]) -> dict[int, GroupThroughput]:
        return {
            g: GroupThroughput(
                produced_fps=v.get("produced", 0.0),
                received_sps=v.get("received", 0.0),
                consumed_sps=v.get("consumed", 0.0),
                actors=actors[g],
                capacity_sps=v.get("capacity"),
            )
            for g, v in self.groups.items()
            if g in actors
        }

    def record(self) -> dict:
        """What the decision was made from (status.autoscale.lastEvaluation)."""
        return {
            "source": self.source,
            "groups": [
                {
                    "group": g,
                    "producedFps": round(v.get("produced", 0.0), 3),
                    "receivedFps": round(v.get("received", 0.0), 3),
                    "consumedSps": round(v.get("consumed", 0.0), 3),
                    **({"capacitySps": round(v["capacity"], 3)} if v.get("capacity") is not None else {}),
                }
                for g, v in sorted(self.groups.items())
            ],
        }


def from_accounting(acc: Accounting, after: Optional[float] = None) -> Optional[Observation]:
    """Per-group rates of the accounting's window; None until the window spans time and,
    with `after` (the previous evaluation's time), holds a sample newer than it. The
    monitor and the autoscale timer tick independently: without these checks a tick that
    runs before the monitor's count is judged on a zero-length window (rates 0) or on the
    data the previous decision already used, and that stale verdict holds for a whole interval."""
    if len(acc.history) < 2:
        return None
    t0, t1 = acc.history[0][0], acc.history[-1][0]
    if t1 <= t0 or (after is not None and t1 <= after):
        return None
    groups = {}
    procs = acc.processes()
    for g in acc.groups():
        r = acc.rates(g)
        groups[g] = {"produced": r["produced_fps"], "received": r["received_fps"], "consumed": r["consumed_sps"]}
        caps = [
            p["capacity_sps"]
            for name, p in procs.items()
            if name.startswith(f"learner-{g}-")
            and isinstance(p.get("capacity_sps"), (int, float))
            and math.isfinite(p["capacity_sps"])
            and p["capacity_sps"] >= 0
        ]
        if caps:
            groups[g]["capacity"] = float(sum(caps))
    return Observation(groups=groups, source="reports")


# ----------------------------------------------------------------- Prometheus
def promql_queries(
    job: str, namespace: Optional[str], window: str, job_label: str = "job", namespace_label: str = "namespace"
) -> dict[str, str]:
    sel = f'{job_label}="{job}"'
    if namespace_label and namespace:
        sel += f',{namespace_label}="{namespace}"'

    def rate_by_group(metric: str, role: str) -> str:
        return f'sum by (group) (rate({metric}{{{sel},role="{role}"}}[{window}]))'

    return {
        "produced": rate_by_group("tianji_env_frames_total", ACTOR),
        "received": rate_by_group("tianji_samples_received_total", BUFFER),
        "consumed": rate_by_group("tianji_samples_consumed_total", LEARNER),
        "capacity": f'sum by (group) (tianji_learner_capacity_sps{{{sel},role="{LEARNER}"}})',
    }


def _vector(payload: Any) -> list[tuple[dict, float]]:
    if not isinstance(payload, dict) or payload.get("status") != "success":
        raise MetricsError(f"Prometheus answered {str(payload)[:200]}")
    data = payload.get("data") or {}
    if data.get("resultType") == "scalar":
        return [({}, float(data["result"][1]))]
    out = []
    for item in data.get("result") or []:
        v = float(item["value"][1])
        if math.isfinite(v):
            out.append((item.get("metric") or {}, v))
    return out


async def query_prometheus(session: aiohttp.ClientSession, url: str, queries: dict[str, str]) -> Observation:
    async def one(q: str) -> list[tuple[dict, float]]:
        try:
            async with session.get(url.rstrip("/") + "/api/v1/query", params={"query": q}) as resp:
                if resp.status != 200:
                    raise MetricsError(f"Prometheus {url}: HTTP {resp.status} for {q}")
                return _vector(await resp.json(content_type=None))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise MetricsError(f"Prometheus {url}: {type(e).__name__}: {e}") from None

    names = list(queries)
    results = dict(zip(names, await asyncio.gather(*(one(queries[n]) for n in names))))
    groups: dict[int, dict[str, float]] = {}
    for key in ("produced", "received", "consumed", "capacity"):
        for labels, v in results.get(key, []):
            try:
                g = int(labels.get("group", ""))
            except ValueError:
                continue
            groups.setdefault(g, {})[key] = v

    return Observation(groups=groups, source="prometheus")


# ----------------------------------------------------------------- decision
@dataclass
class Decision:
    kind: str  # up, down, unchanged, cooldown, bounds
    current: dict[int, int]
    desired: dict[int, int]  # what to patch (== current when nothing changes)
    message: str


def target_ratio(spec: Any) -> float:
    """consumed / produced the rebalancer aims at; paced actors produce up to headroom x need."""
    r = spec.replay_ratio
    return r / spec.staleness.pace_headroom if spec.staleness.pace_actors else r


def prometheus_allowed(url: str, allowed: list[str]) -> bool:
    """`url` lies under one of the allowed base URLs: same scheme, host and port, path below
    (no user info): a job's prometheusUrl cannot make the operator request anything else."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return False
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password:
        return False
    for base in allowed:
        a = urlsplit(base)
        if (u.scheme, u.hostname, port) == (a.scheme, a.hostname, a.port) and (u.path.rstrip("/") + "/").startswith(
            a.path.rstrip("/") + "/"
        ):
            return True
    return False


def decide(
    spec: Any,
    observed: dict[int, GroupThroughput],
    current: dict[int, int],
    last_rescale: Optional[float],
    now: float,
    max_step: int = 4,
    ready: Optional[dict[int, int]] = None,
) -> Decision:
    """`current`: desired actors per group; `ready`: those ready. While a group has actors not
    ready yet, nothing is added (they would be counted as producing nothing, and pending pods
    would pile up); removals and bounds still apply."""
    a = spec.autoscale
    lo, hi = a.min_actors, a.max_actors
    clamped = {g: min(max(n, lo), hi) for g, n in current.items()}
    if clamped != current:  # bounds are hard: applied at once, cooldown or not
        return Decision(
            "bounds", current, clamped, _describe(current, clamped, observed, spec) + f" (bounds [{lo}, {hi}])"
        )
    pending = {g: current[g] - ready.get(g, 0) for g in current if ready is not None and ready.get(g, 0) < current[g]}
    if pending:
        waiting = ", ".join(f"group {g}: {n} of {current[g]}" for g, n in sorted(pending.items()))
        return Decision(
            "pending", current, current, f"waiting for actors to become ready ({waiting} not ready) before rescaling"
        )
    policy = RebalancePolicy(
        target_ratio=target_ratio(spec), band=a.band, min_actors=lo, max_actors=hi, max_step=max_step
    )
    want = dict(current)
    want.update({g: min(max(n, lo), hi) for g, n in rebalance(observed, policy).items() if g in current})
    if want == current:
        return Decision("unchanged", current, current, "production within the band: " + _rates(observed, spec))
    kind = "up" if sum(want.values()) > sum(current.values()) else "down"
    cooldown = a.cooldown(kind)
    if last_rescale is not None and now - last_rescale < cooldown:
        left = cooldown - (now - last_rescale)
        return Decision(
            "cooldown",
            current,
            current,
            f"would rescale ({_describe(current, want, observed, spec)}) but the cooldown has "
            f"{left:.0f} s left (scale-{kind} cooldown {cooldown:g} s)",
        )
    return Decision(kind, current, want, _describe(current, want, observed, spec))


def _needed(o: GroupThroughput, r: float) -> float:
    return max(o.capacity_sps or 0.0, o.consumed_sps) / r


def _rates(observed: dict[int, GroupThroughput], spec: Any) -> str:
    r = target_ratio(spec)
    return "; ".join(
        f"group {g}: produced {o.produced_fps:.1f} frames/s, consumed {o.consumed_sps:.1f} samples/s "
        f"(needs {_needed(o, r):.1f}; {observed_bottleneck(o, r, spec.autoscale.band)})"
        for g, o in sorted(observed.items())
    )


def _describe(current: dict[int, int], want: dict[int, int], observed: dict[int, GroupThroughput], spec: Any) -> str:
    r = target_ratio(spec)
    parts = []
    for g in sorted(want):
        if want[g] == current[g]:
            continue
        o = observed.get(g)
        why = ""
        if o is not None:
            need = _needed(o, r)
            rel = "<" if o.produced_fps < need else ">"
            why = f" (produced {o.produced_fps:.1f} frames/s {rel} needed {need:.1f})"
        parts.append(f"group {g}: {current[g]} -> {want[g]} actors{why}")
    return "; ".join(parts)
