"""Canned metric sources for autoscaler tests that need exact numbers: a Prometheus HTTP API
answering fixed vectors, and pods serving fixed /metrics text."""
from __future__ import annotations

import json
from typing import Any, Optional

import aiohttp.web

# metric in a query -> (FakePrometheus.values key, "one" value or "vec"tor by group)
QUERIED = {"tianji_policy_lag_sum": ("policy_lag", "one"), "tianji_episode_return_mean": ("mean_return", "one"),
           "tianji_policy_version": ("policy_version", "one"), "tianji_env_frames_total": ("produced", "vec"),
           "tianji_samples_received_total": ("received", "vec"), "tianji_samples_consumed_total": ("consumed", "vec"),
           "tianji_learner_capacity_sps": ("capacity", "vec")}


class FakePrometheus:
    """Answers instant PromQL queries (`/api/v1/query`) from per-group numbers set by the test.

    The query is recognised by the metric it names (what the operator asks for); `values` maps
    produced/received/consumed/capacity to {group: rate} and frames_total/policy_version/mean_return/
    policy_lag to scalars (None: empty result)."""

    def __init__(self):
        self.values: dict[str, Any] = {"produced": {}, "received": {}, "consumed": {}, "capacity": {},
                                       "frames_total": None,
                                       "policy_version": None, "mean_return": None, "policy_lag": None}
        self.queries: list[str] = []
        self.fail = False
        self.url = ""
        self._runner: Optional[aiohttp.web.AppRunner] = None

    def _answer(self, q: str) -> list[dict]:
        def vec(d):
            return [{"metric": {"group": str(g)}, "value": [0, str(v)]} for g, v in sorted(d.items())]

        def one(v):
            return [] if v is None else [{"metric": {}, "value": [0, str(v)]}]

        if "tianji_env_frames_total" in q and "rate(" not in q:
            return one(self.values["frames_total"])
        for metric, (key, shape) in QUERIED.items():
            if metric in q:
                return (vec if shape == "vec" else one)(self.values[key])
        return []

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        q = request.query.get("query", "")
        self.queries.append(q)
        if self.fail:
            return aiohttp.web.json_response({"status": "error", "error": "boom"}, status=503)
        return aiohttp.web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": self._answer(q)}})

    async def __aenter__(self) -> FakePrometheus:
        app = aiohttp.web.Application()
        app.router.add_get("/api/v1/query", self._handle)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._runner.cleanup()


class FakePodMetrics:
    """Several pods' metrics port on one port number, told apart by loopback address
    (127.0.0.2, ...): `/metrics` serves `text[ip]`, `/report` serves `reports[ip]` (a dict,
    JSON-encoded; see `worker_report`). Tests rewrite them between scrapes."""

    def __init__(self, ips: list[str]):
        self.ips = ips
        self.text: dict[str, str] = {ip: "" for ip in ips}
        self.reports: dict[str, Any] = {}
        self.port = 0
        self.hits: dict[str, int] = {ip: 0 for ip in ips}
        self._runners: list[aiohttp.web.AppRunner] = []

    async def _metrics(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        ip = request.transport.get_extra_info("sockname")[0]
        self.hits[ip] += 1
        return aiohttp.web.Response(text=self.text.get(ip, ""), content_type="text/plain")

    async def _report(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        ip = request.transport.get_extra_info("sockname")[0]
        self.hits[ip] += 1
        if ip not in self.reports:
            return aiohttp.web.Response(status=404)
        return aiohttp.web.Response(text=json.dumps(self.reports[ip]), content_type="application/json")

    async def __aenter__(self) -> FakePodMetrics:
        for ip in self.ips:
            app = aiohttp.web.Application()
            app.router.add_get("/metrics", self._metrics)
            app.router.add_get("/report", self._report)
            runner = aiohttp.web.AppRunner(app, access_log=None)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, ip, self.port)
            await site.start()
            self.port = self.port or site._server.sockets[0].getsockname()[1]
            self._runners.append(runner)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for r in self._runners:
            await r.cleanup()


def worker_report(job: str, role: str, group: int, index: int, *, seq: int = 1, incarnation: str = "inc0",
                  episodes: list[float] = (), episodes_total: int | None = None, final: bool = False,
                  version: int = 0, checkpoint: str | None = None, lengths: list[int] = (),
                  **counts: float) -> dict:
    """A role's report as a worker builds it (RoleMetrics + build_report), with these counts. A
    learner past version 0 reports its checkpoint at that version (and a digest), as one that
    checkpoints every version would; `checkpoint=""` reports none."""
    from tianji.control.contracts.rolereport import build_report
    from tianji.observability.metrics import RoleMetrics

    m = RoleMetrics(job, role, group, index)
    for name, v in counts.items():
        m.inc(name, v)
    eps = list(episodes)
    return build_report(job=job, role=role, group=group, index=index, incarnation=incarnation, pid=1,
                        started=1_800_000_000.0, seq=seq,
                        time=1_800_000_000.0 + seq, final=final, snapshot=m.snapshot(),
                        episodes_total=len(eps) if episodes_total is None else episodes_total,
                        recent=[(1_800_000_000.0 + seq + i * 1e-3, r, *lengths[i:i + 1]) for i, r in enumerate(eps)],
                        extra=_learner_extra(version, checkpoint) if role == "learner" else {})


def _learner_extra(version: int, checkpoint: str | None) -> dict:
    name = f"ckpt-{version:012d}.pt" if checkpoint is None and version > 0 else checkpoint
    return {"version": version, **({"checkpoint": name, "checkpoint_sha256": "ab" * 32} if name else {})}
