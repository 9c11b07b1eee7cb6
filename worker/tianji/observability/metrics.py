"""Prometheus metrics of one role process (the table is tianji.control.contracts.rolereport's, prefix `tianji_`).

Each process owns a registry labelled job/role/group/index, and plain mirrors of
the same numbers (`snapshot()`) that go into its report (tianji.control.contracts.rolereport).
`serve()` answers on one port: /metrics (Prometheus text) and /report (the report,
JSON; what the operator counts), so Prometheus and the operator read one process
the same way the local launcher does. A learner's also serves /checkpoint/<name>, its saved
checkpoints, which the operator's confirming evaluation (`tianji confirm`) downloads.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

from tianji.control.contracts.fabric import FABRIC_PATH, fabric_reply
from tianji.control.contracts.rolereport import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    LAG_BOUNDS,
    LAG_SAMPLES_HISTOGRAM,
    LEARNER_STATS,
    REASON_LABELED,
)

PREFIX = "tianji_"
LABELS = ("job", "role", "group", "index")
CHECKPOINT_PATH = "/checkpoint/"  # a learner's checkpoints, for the operator's confirming evaluation


def metric_names() -> set[str]:
    """Every exported series name (as Prometheus exposes it), for dashboards and tests."""
    names = {PREFIX + n for n in COUNTERS} | {PREFIX + n for n in GAUGES}
    for h in (*HISTOGRAMS, LAG_SAMPLES_HISTOGRAM[0]):
        names |= {PREFIX + h + s for s in ("_bucket", "_sum", "_count")}
    return names


def lag_histogram_family(labels: list[str]) -> HistogramMetricFamily:
    name, doc = LAG_SAMPLES_HISTOGRAM
    return HistogramMetricFamily(PREFIX + name, doc, labels=labels)


def add_lag_histogram(fam: HistogramMetricFamily, label_values: list[str], lag: dict) -> None:
    """One series of the per-sample lag histogram from a report's lag (its bucket counts `hist`;
    the sum is the mean lag x samples: every lag entry stands for equally many samples)."""
    cum, buckets = 0.0, []
    for le, n in zip([*(str(float(b)) for b in LAG_BOUNDS), "+Inf"], lag["hist"]):
        cum += n
        buckets.append((le, cum))
    mean = lag["sum"] / lag["count"] if lag.get("count") else 0.0
    fam.add_metric(label_values, buckets, sum_value=mean * cum)


class _LagSamples:
    """Collector: the per-sample lag histogram from RoleMetrics' bucket counts (a Prometheus
    Histogram takes one observe() per value: too slow for every sample of a batch)."""

    def __init__(self, owner: RoleMetrics):
        self.owner = owner

    def collect(self):
        fam = lag_histogram_family(list(LABELS))
        add_lag_histogram(fam, [self.owner.labels[k] for k in LABELS], dict(self.owner.lag))
        yield fam


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
        self._h = {n: Histogram(PREFIX + n, d, lab, buckets=b, registry=self.registry)
                   for n, (d, b) in HISTOGRAMS.items()}
        # Plain mirrors: cheap to read for reports, no registry walk on the hot path.
        self.counts: dict[str, float] = {n: 0.0 for n in COUNTERS}
        self.reasons: dict[str, dict[str, float]] = {n: {} for n in REASON_LABELED}
        # Learner statistics appear once computed: a PPO learner reports no DQN loss of 0; nor
        # does any role report an evaluation return before the evaluator's first evaluation.
        self.gauges: dict[str, float] = {n: 0.0 for n in GAUGES if n.removeprefix("learner_") not in LEARNER_STATS
                                         and n != "eval_return_mean"}
        self.lag = {"min": None, "max": None, "sum": 0.0, "count": 0, "hist": [0.0] * (len(LAG_BOUNDS) + 1)}
        if role == "learner":
            self.registry.register(_LagSamples(self))

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

    def observe_lag(self, lags, samples_each: int = 1) -> None:
        """Record policy lags (an iterable or numpy array of ints), each the lag of `samples_each`
        consumed samples (a PPO batch carries one version per env column of T steps)."""
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
        # Bucket i counts lags <= LAG_BOUNDS[i] (and > the bound before); the last, lags beyond them all.
        counts = np.bincount(np.searchsorted(LAG_BOUNDS, lags.ravel(), side="left"), minlength=len(LAG_BOUNDS) + 1)
        self.lag["hist"] = [h + float(c) * samples_each for h, c in zip(self.lag["hist"], counts)]

    def snapshot(self) -> dict:
        return {"counts": dict(self.counts), "reasons": {k: dict(v) for k, v in self.reasons.items()},
                "gauges": dict(self.gauges), "lag": {**self.lag, "hist": list(self.lag["hist"])}}

    def serve(self, port: int, addr: str = "0.0.0.0", report: Optional[Callable[[], bytes]] = None,
              fabric: Optional[str] = None,
              checkpoint: Optional[Callable[[str], Optional[bytes]]] = None) -> ThreadingHTTPServer:
        return serve_registry(self.registry, port, addr, report, fabric, checkpoint)


def serve_registry(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
                   report: Optional[Callable[[], bytes]] = None, fabric: Optional[str] = None,
                   checkpoint: Optional[Callable[[str], Optional[bytes]]] = None) -> ThreadingHTTPServer:
    """/metrics and /report (JSON bytes from `report()`, which must be safe to call from
    the server's thread) on addr:port, in a daemon thread; with `fabric` (an address) also
    /fabric, where peers learn where this process's data sockets are (tianji.control.contracts.fabric);
    with `checkpoint` (a learner's) also /checkpoint/<name>: the bytes `checkpoint(name)` returns
    (the raw name, not URL-decoded), 404 where it returns None."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            elif path == "/report" and report is not None:
                body, ctype = report(), "application/json"
            elif path == FABRIC_PATH and fabric is not None:
                body, ctype = fabric_reply(fabric), "application/json"
            elif path.startswith(CHECKPOINT_PATH) and checkpoint is not None:
                body, ctype = checkpoint(path[len(CHECKPOINT_PATH):]), "application/octet-stream"
                if body is None:
                    self.send_error(404)
                    return
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes every second would flood the log
            pass

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
