"""Prometheus metrics of one role process (names from DESIGN.md, prefix `tianji_`).

Each process owns a registry labelled job/role/group/index. On Kubernetes the
worker serves it on the `metrics` port; locally the same numbers travel to the
launcher in heartbeat reports (`snapshot()`), so there is one source of truth.
"""
from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX = "tianji_"
LABELS = ("job", "role", "group", "index")

COUNTERS = {
    "env_frames_total": "Environment frames stepped by actors",
    "samples_sent_total": "Samples pushed to the next role",
    "samples_received_total": "Samples received from the previous role",
    "samples_consumed_total": "Samples used by learner updates",
    "samples_dropped_total": "Samples dropped, by reason (stale, overflow, hwm)",
    "train_steps_total": "Learner gradient steps",
    "bytes_sent_total": "Payload bytes sent on data sockets",
    "bytes_received_total": "Payload bytes received on data sockets",
    "messages_rejected_total": "Received messages that failed validation, by reason",
    "episodes_total": "Episodes finished by actors",
}
GAUGES = {
    "policy_version": "Policy version this role holds",
    "episode_return_mean": "Mean return of the last 100 episodes this actor finished",
    "queue_depth": "Samples queued in this role",
    "replay_ratio": "Samples consumed / samples inserted",
    "learner_capacity_sps": "Learner consumption capacity (samples per busy second)",
}
HISTOGRAMS = {
    "policy_lag": ("Mean policy lag (learner version - behaviour version) of each consumed batch",
                   (0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 1024)),
}
# Counters whose increments carry a `reason` label.
REASON_LABELED = {"samples_dropped_total", "messages_rejected_total"}


def metric_names() -> set[str]:
    """Every exported series name (as Prometheus exposes it), for dashboards and tests."""
    names = {PREFIX + n for n in COUNTERS} | {PREFIX + n for n in GAUGES}
    for h in HISTOGRAMS:
        names |= {PREFIX + h + s for s in ("_bucket", "_sum", "_count")}
    return names


class RoleMetrics:
    """Counters/gauges of one process plus the plain-number view used in reports."""

    def __init__(self, job: str, role: str, group: int, index: int):
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"job": job, "role": role, "group": str(group), "index": str(index)}
        lab = list(LABELS)
        self._c = {
            n: Counter(PREFIX + n.removesuffix("_total"), d, lab + (["reason"] if n in REASON_LABELED else []),
                       registry=self.registry)
            for n, d in COUNTERS.items()
        }
        self._g = {n: Gauge(PREFIX + n, d, lab, registry=self.registry) for n, d in GAUGES.items()}
        self._h = {n: Histogram(PREFIX + n, d, lab, buckets=b, registry=self.registry) for n, (d, b) in HISTOGRAMS.items()}
        # Plain mirrors: cheap to read for reports, no registry walk on the hot path.
        self.counts: dict[str, float] = {n: 0.0 for n in COUNTERS}
        self.reasons: dict[str, dict[str, float]] = {n: {} for n in REASON_LABELED}
        self.gauges: dict[str, float] = {n: 0.0 for n in GAUGES}
        self.lag = {"min": None, "max": None, "sum": 0.0, "count": 0}

    def inc(self, name: str, value: float = 1.0, reason: Optional[str] = None) -> None:
        if value <= 0:
            return
        if name in REASON_LABELED:
            reason = reason or "unknown"
            self._c[name].labels(**self.labels, reason=reason).inc(value)
            r = self.reasons[name]
            r[reason] = r.get(reason, 0.0) + value
        else:
            self._c[name].labels(**self.labels).inc(value)
        self.counts[name] += value

    def set(self, name: str, value: float) -> None:
        self._g[name].labels(**self.labels).set(value)
        self.gauges[name] = float(value)

    def observe_lag(self, lags) -> None:
        """Record per-sample policy lags (an iterable or numpy array of ints)."""
        import numpy as np

        lags = np.asarray(lags)
        if lags.size == 0:
            return
        # One histogram observation per batch (its mean): per-sample observes
        # would cost more than a DQN update. Min/max/mean stay exact below.
        self._h["policy_lag"].labels(**self.labels).observe(float(lags.mean()))
        lo, hi = float(lags.min()), float(lags.max())
        self.lag["min"] = lo if self.lag["min"] is None else min(self.lag["min"], lo)
        self.lag["max"] = hi if self.lag["max"] is None else max(self.lag["max"], hi)
        self.lag["sum"] += float(lags.sum())
        self.lag["count"] += int(lags.size)

    def snapshot(self) -> dict:
        return {"counts": dict(self.counts), "reasons": {k: dict(v) for k, v in self.reasons.items()},
                "gauges": dict(self.gauges), "lag": dict(self.lag)}

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
