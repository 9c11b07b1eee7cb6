"""`tianji run --metrics-port N`: every role's metrics on one local port, for Prometheus.

A pod serves its own /metrics; local roles are processes on one machine, so the
launcher re-exports what their reports carry, under the same names and labels
(job, role, group, index) a pod's own endpoint uses. A local Prometheus and the
Grafana dashboard then see what the cluster's would. A restarted process starts
its counters from zero, exactly like a restarted pod: PromQL's rate() handles it.
"""
from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Optional

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.rolereport import COUNTERS, GAUGES, REASON_LABELED
from tianji.observability.metrics import LABELS, PREFIX, add_lag_histogram, lag_histogram_family, serve_registry


class JobExporter:
    """A Prometheus collector over the launcher's accounting (a snapshot swapped whole on
    `update()`, so the HTTP thread never reads a dict the launcher is changing)."""

    def __init__(self, job: str):
        self.job = job
        self._families: list[Metric] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.server: Optional[ThreadingHTTPServer] = None

    def update(self, acc: Accounting, launcher_rejected: Optional[dict[str, int]] = None) -> None:
        """`launcher_rejected`: what the launcher itself refused (reports, handshakes), by reason:
        messages_rejected_total{role="launcher"}."""
        counters = {n: CounterMetricFamily(PREFIX + n.removesuffix("_total"), d,
                                           labels=[*LABELS, *(["reason"] if n in REASON_LABELED else [])])
                    for n, d in COUNTERS.items()}
        gauges = {n: GaugeMetricFamily(PREFIX + n, d, labels=list(LABELS)) for n, d in GAUGES.items()}
        lag_samples = lag_histogram_family(list(LABELS))
        for (role, g, i), p in sorted(acc.procs.items()):
            lab = [self.job, role, str(g), str(i)]
            for n, fam in counters.items():
                if n in REASON_LABELED:
                    for reason, v in sorted(p.reasons.get(n, {}).items()):
                        fam.add_metric([*lab, reason], v)
                elif n in p.counts:
                    fam.add_metric(lab, p.counts[n])
            for n, v in p.gauges.items():
                gauges[n].add_metric(lab, v)
            if role == "learner" and p.lag.get("hist"):
                add_lag_histogram(lag_samples, lab, p.lag)
        for reason, v in sorted((launcher_rejected or {}).items()):
            counters["messages_rejected_total"].add_metric([self.job, "launcher", "0", "0", reason], v)
        self._families = [*counters.values(), *gauges.values(), lag_samples]

    def collect(self) -> Iterator[Metric]:
        yield from self._families

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        self.server = serve_registry(self.registry, port, addr)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
