"""A real Prometheus (Debian's `prometheus` binary) scraping the pods the local kubelet runs.

`PrometheusServer` stands in for the cluster's Prometheus together with what the
chart's PodMonitor asks of it (charts/tianji-operator/templates/podmonitor.yaml):
scrape every running pod's container port named `metrics` at /metrics, keep the
workers' own labels (`honor_labels: true`, so their `job` label is the TianJiJob's
name, not the scrape job's) and add `namespace`, `pod` and `container` target labels.

Service discovery is file-based: a task follows the emulator's pods and rewrites
a file_sd JSON (atomically, by rename) with `podIP:port` of each Running pod that
has a podIP; Prometheus re-reads it every second. Config: scrape and evaluation
interval 1 s, a temporary TSDB directory, a free port on 127.0.0.1.

No binary (a machine where `make test` could not apt-get it): `binary()` is None
and tests skip, naming it.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Optional

import aiohttp
import yaml

from .emulator import KubeEmulator

BINARY = "prometheus"


def binary() -> Optional[str]:
    return shutil.which(BINARY)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PrometheusServer:
    """A Prometheus process with file-based discovery of the emulator's pods (module doc)."""

    def __init__(self, kube: KubeEmulator, root: Path, *, scrape_interval: str = "1s", port_name: str = "metrics"):
        self.kube = kube
        self.root = Path(root)
        self.scrape_interval = scrape_interval
        self.port_name = port_name
        self.port = 0
        self.url = ""
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.targets: list[dict] = []
        self.log_path = self.root / "prometheus.log"
        self._task: Optional[asyncio.Task] = None
        self._http: Optional[aiohttp.ClientSession] = None

    @property
    def pgid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def config(self) -> dict:
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval,
                       "scrape_timeout": self.scrape_interval,
                       # Every PromQL query it answers, one JSON line each (`queries()`).
                       "query_log_file": str(self.root / "queries.jsonl")},
            "scrape_configs": [{
                "job_name": "pods",
                "honor_labels": True,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(self.root / "targets.json")], "refresh_interval": "1s"}],
            }],
        }

    # ------------------------------------------------------------ discovery
    def _targets(self) -> list[dict]:
        out = []
        for pod in self.kube.live("v1/pods"):
            st, meta = pod.get("status") or {}, pod["metadata"]
            if st.get("phase") != "Running" or not st.get("podIP") or meta.get("deletionTimestamp"):
                continue
            for c in (pod.get("spec") or {}).get("containers") or []:
                for p in c.get("ports") or []:
                    if p.get("name") == self.port_name:
                        out.append({"targets": [f"{st['podIP']}:{p['containerPort']}"],
                                    "labels": {"namespace": meta.get("namespace", ""), "pod": meta["name"],
                                               "container": c.get("name", "")}})
        return sorted(out, key=lambda t: t["targets"][0])

    def _write_targets(self) -> None:
        targets = self._targets()
        if targets == self.targets and (self.root / "targets.json").exists():
            return
        tmp = self.root / "targets.json.tmp"
        tmp.write_text(json.dumps(targets))
        os.replace(tmp, self.root / "targets.json")
        self.targets = targets

    async def _follow(self) -> None:
        while True:
            changed = self.kube._signal()
            self._write_targets()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.5)
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "PrometheusServer":
        exe = binary()
        if exe is None:
            raise FileNotFoundError(f"no `{BINARY}` binary on PATH")
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_targets()
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(self.log_path, "ab") as logf:
            self.proc = await asyncio.create_subprocess_exec(
                exe, f"--config.file={self.root / 'prometheus.yml'}", f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--log.level=warn", stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        # 30 s: on a loaded 2-core box (unpaced actors) Prometheus answers slowly
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._task = asyncio.create_task(self._follow(), name="prometheus-sd")
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with self._http.get(self.url + "/-/ready") as resp:
                    if resp.status == 200:
                        return self
            if self.proc.returncode is not None or time.monotonic() > deadline:
                await self.stop()
                raise RuntimeError(f"prometheus did not become ready: {self.log_tail()}")
            await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ------------------------------------------------------------ queries (for assertions)
    async def query(self, promql: str) -> list[dict]:
        """An instant query's result vector (`[{"metric": {...}, "value": [t, "v"]}, ...]`)."""
        async with self._http.get(self.url + "/api/v1/query", params={"query": promql}) as resp:
            body = await resp.json(content_type=None)
        if body.get("status") != "success":
            raise AssertionError(f"prometheus: {promql}: {body}")
        return body["data"]["result"]

    async def active_targets(self) -> list[dict]:
        async with self._http.get(self.url + "/api/v1/targets", params={"state": "active"}) as resp:
            body = await resp.json(content_type=None)
        return body["data"]["activeTargets"]

    def queries(self) -> list[str]:
        """The PromQL expressions this server was asked, in order (from its query log)."""
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in (self.root / "queries.jsonl").read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    out.append(json.loads(line)["params"]["query"])
        return out

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""
