"""Live throughput and actor rescaling (a Kopf timer per TianJiJob).

Every `spec.autoscale.intervalSeconds` the timer measures, per group,

    produced   actors' env frames/s        tianji_env_frames_total{role="actor"}
    received   buffers' samples/s in       tianji_samples_received_total{role="buffer"}
    consumed   learners' samples/s used    tianji_samples_consumed_total{role="learner"}

either with PromQL against `spec.autoscale.prometheusUrl` (rate over a window),
or, with no URL, by scraping each running pod's `/metrics` (named port
`metrics`) and differencing the counters between two ticks. The numbers go
to `.status.throughput` (with policy version, lag and mean return) whether or
not autoscaling is on.

With `spec.autoscale.enabled`, `tianji.control.plan.rebalance` turns them into an
actor count per group; the operator clamps it to [minActors, maxActors],
waits `cooldownSeconds` after the previous change, patches the group's
StatefulSet `spec.replicas`, posts an event and records the decision in
`.status.autoscale` and the `Rescaled` condition.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tianji.control.plan import GroupThroughput, RebalancePolicy, rebalance

from . import status as st

ACTOR, BUFFER, LEARNER = "actor", "buffer", "learner"


class MetricsError(RuntimeError):
    """Prometheus or the pods could not be read."""


@dataclass
class Observation:
    groups: dict[int, dict[str, float]]  # group -> {produced, received, consumed}
    frames_total: Optional[float] = None
    policy_version: Optional[float] = None
    mean_return: Optional[float] = None
    policy_lag: Optional[float] = None
    source: str = ""

    def throughput(self, actors: dict[int, int]) -> dict[int, GroupThroughput]:
        return {g: GroupThroughput(produced_fps=v.get("produced", 0.0), received_sps=v.get("received", 0.0),
                                   consumed_sps=v.get("consumed", 0.0), actors=actors[g])
                for g, v in self.groups.items() if g in actors}

    def status_fields(self, now: float) -> dict:
        tot = {k: sum(v.get(k, 0.0) for v in self.groups.values()) for k in ("produced", "received", "consumed")}
        thr: dict[str, Any] = {
            "framesPerSecond": round(tot["produced"], 3),
            "samplesReceivedPerSecond": round(tot["received"], 3),
            "samplesConsumedPerSecond": round(tot["consumed"], 3),
            "source": self.source,
            "time": st.iso(now),
            "groups": [{"group": g, "framesPerSecond": round(v.get("produced", 0.0), 3),
                        "samplesReceivedPerSecond": round(v.get("received", 0.0), 3),
                        "samplesConsumedPerSecond": round(v.get("consumed", 0.0), 3)}
                       for g, v in sorted(self.groups.items())],
        }
        if tot["produced"] > 0:
            thr["replayRatio"] = round(tot["consumed"] / tot["produced"], 4)
        if self.frames_total is not None:
            thr["framesTotal"] = int(self.frames_total)
        out: dict[str, Any] = {"throughput": thr}
        if self.policy_version is not None:
            out["policyVersion"] = int(self.policy_version)
        if self.mean_return is not None:
            out["meanReturn"] = round(self.mean_return, 4)
        if self.policy_lag is not None:
            out["policyLag"] = round(self.policy_lag, 4)
        return out


# ----------------------------------------------------------------- Prometheus
def promql_queries(job: str, namespace: Optional[str], window: str, job_label: str = "job",
                   namespace_label: str = "namespace") -> dict[str, str]:
    sel = f'{job_label}="{job}"'
    if namespace_label and namespace:
        sel += f',{namespace_label}="{namespace}"'

    def rate_by_group(metric: str, role: str) -> str:
        return f'sum by (group) (rate({metric}{{{sel},role="{role}"}}[{window}]))'

    return {
        "produced": rate_by_group("tianji_env_frames_total", ACTOR),
        "received": rate_by_group("tianji_samples_received_total", BUFFER),
        "consumed": rate_by_group("tianji_samples_consumed_total", LEARNER),
        "frames_total": f'sum(tianji_env_frames_total{{{sel},role="{ACTOR}"}})',
        "policy_version": f'max(tianji_policy_version{{{sel},role="{LEARNER}"}})',
        "mean_return": (f'avg(tianji_episode_return_mean{{{sel},role="{ACTOR}"}} '
                        f'and on (group, index) (tianji_episodes_total{{{sel},role="{ACTOR}"}} > 0))'),
        "policy_lag": (f'sum(rate(tianji_policy_lag_sum{{{sel}}}[{window}])) / '
                       f'sum(rate(tianji_policy_lag_count{{{sel}}}[{window}]))'),
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
    for key in ("produced", "received", "consumed"):
        for labels, v in results[key]:
            try:
                g = int(labels.get("group", ""))
            except ValueError:
                continue
            groups.setdefault(g, {})[key] = v

    def scalar(key: str) -> Optional[float]:
        vals = [v for _, v in results[key]]
        return vals[0] if vals else None

    return Observation(groups=groups, frames_total=scalar("frames_total"), policy_version=scalar("policy_version"),
                       mean_return=scalar("mean_return"), policy_lag=scalar("policy_lag"), source="prometheus")


# ----------------------------------------------------------------- direct scraping
COUNTERS = {"tianji_env_frames_total": "produced", "tianji_samples_received_total": "received",
            "tianji_samples_consumed_total": "consumed"}
ROLE_OF = {"produced": ACTOR, "received": BUFFER, "consumed": LEARNER}


def parse_metrics(text: str) -> dict[str, float]:
    """The sums a pod exposes, keyed by sample name (plus episode bookkeeping)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in COUNTERS or s.name in ("tianji_policy_version", "tianji_episode_return_mean",
                                                "tianji_episodes_total", "tianji_policy_lag_sum",
                                                "tianji_policy_lag_count"):
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


@dataclass
class ScrapeState:
    """Counter values of the previous scrape, per pod uid, to difference into rates."""
    samples: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)


async def scrape_pods(session: aiohttp.ClientSession, pods: list[dict], port: int, state: ScrapeState,
                      now: float, label_role: str, label_group: str) -> Optional[Observation]:
    """Scrape running pods; rates need two scrapes, so the first call returns None."""
    targets = []
    for p in pods:
        ip = (p.get("status") or {}).get("podIP")
        if ip and st.pod_phase(p) == "Running":
            targets.append(p)

    async def one(pod: dict) -> Optional[dict[str, float]]:
        url = f"http://{pod['status']['podIP']}:{port}/metrics"
        try:
            async with session.get(url) as resp:
                if resp.status != 200:
                    return None
                return parse_metrics(await resp.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    scraped = await asyncio.gather(*(one(p) for p in targets))
    if targets and all(s is None for s in scraped):
        raise MetricsError(f"none of the {len(targets)} running pods answered on :{port}/metrics")
    groups: dict[int, dict[str, float]] = {}
    have_rates = False
    frames_total = 0.0
    versions, returns, lag_sum, lag_count = [], [], 0.0, 0.0
    seen = set()
    for pod, values in zip(targets, scraped):
        if values is None:
            continue
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        seen.add(uid)
        labels = pod["metadata"].get("labels", {})
        role = labels.get(label_role)
        try:
            g = int(labels.get(label_group, ""))
        except ValueError:
            continue
        prev = state.samples.get(uid)
        state.samples[uid] = (now, values)
        if role == ACTOR:
            frames_total += values.get("tianji_env_frames_total", 0.0)
            if values.get("tianji_episodes_total", 0.0) > 0 and "tianji_episode_return_mean" in values:
                returns.append(values["tianji_episode_return_mean"])
        if role == LEARNER and "tianji_policy_version" in values:
            versions.append(values["tianji_policy_version"])
        entry = groups.setdefault(g, {"produced": 0.0, "received": 0.0, "consumed": 0.0})
        if prev is None or now <= prev[0]:
            continue
        dt = now - prev[0]
        have_rates = True
        for name, key in COUNTERS.items():
            if ROLE_OF[key] != role or name not in values:
                continue
            delta = values[name] - prev[1].get(name, 0.0)
            entry[key] += (values[name] if delta < 0 else delta) / dt  # a restart resets counters
        d_sum = values.get("tianji_policy_lag_sum", 0.0) - prev[1].get("tianji_policy_lag_sum", 0.0)
        d_cnt = values.get("tianji_policy_lag_count", 0.0) - prev[1].get("tianji_policy_lag_count", 0.0)
        if d_cnt > 0 and d_sum >= 0:
            lag_sum, lag_count = lag_sum + d_sum, lag_count + d_cnt
    for uid in list(state.samples):
        if uid not in seen:
            del state.samples[uid]
    if not have_rates:
        return None
    return Observation(groups=groups, frames_total=frames_total,
                       policy_version=max(versions) if versions else None,
                       mean_return=sum(returns) / len(returns) if returns else None,
                       policy_lag=lag_sum / lag_count if lag_count else None, source="scrape")


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


def decide(spec: Any, observed: dict[int, GroupThroughput], current: dict[int, int], last_rescale: Optional[float],
           now: float, max_step: int = 4) -> Decision:
    a = spec.autoscale
    lo, hi = a.min_actors, a.max_actors
    clamped = {g: min(max(n, lo), hi) for g, n in current.items()}
    if clamped != current:  # bounds are hard: applied at once, cooldown or not
        return Decision("bounds", current, clamped, _describe(current, clamped, observed, spec)
                        + f" (bounds [{lo}, {hi}])")
    policy = RebalancePolicy(target_ratio=target_ratio(spec), band=a.band, min_actors=lo, max_actors=hi,
                             max_step=max_step)
    want = dict(current)
    want.update({g: min(max(n, lo), hi) for g, n in rebalance(observed, policy).items() if g in current})
    if want == current:
        return Decision("unchanged", current, current, "production within the band: " + _rates(observed, spec))
    if last_rescale is not None and now - last_rescale < a.cooldown_seconds:
        left = a.cooldown_seconds - (now - last_rescale)
        return Decision("cooldown", current, current,
                        f"would rescale ({_describe(current, want, observed, spec)}) but the cooldown has "
                        f"{left:.0f} s left")
    kind = "up" if sum(want.values()) > sum(current.values()) else "down"
    return Decision(kind, current, want, _describe(current, want, observed, spec))


def _rates(observed: dict[int, GroupThroughput], spec: Any) -> str:
    r = target_ratio(spec)
    return "; ".join(f"group {g}: produced {o.produced_fps:.1f} frames/s, consumed {o.consumed_sps:.1f} samples/s "
                     f"(needs {o.consumed_sps / r:.1f})" for g, o in sorted(observed.items()))


def _describe(current: dict[int, int], want: dict[int, int], observed: dict[int, GroupThroughput], spec: Any) -> str:
    r = target_ratio(spec)
    parts = []
    for g in sorted(want):
        if want[g] == current[g]:
            continue
        o = observed.get(g)
        why = ""
        if o is not None:
            need = o.consumed_sps / r
            rel = "<" if o.produced_fps < need else ">"
            why = f" (produced {o.produced_fps:.1f} frames/s {rel} needed {need:.1f})"
        parts.append(f"group {g}: {current[g]} -> {want[g]} actors{why}")
    return "; ".join(parts)
