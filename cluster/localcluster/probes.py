"""Readiness probes of the local kubelet (a mixin of pods.PodWorker): httpGet and tcpSocket
with their timing fields; exec and grpc probes are not emulated (the pod never becomes ready)."""
from __future__ import annotations

import asyncio

import aiohttp

from .containers import Incarnation


class Probes:
    """PodWorker supplies container, ip, kubelet, status, _set_ready and _write_status."""

    async def _probe_once(self, probe: dict) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        ports = {p.get("name"): p["containerPort"] for p in self.container.get("ports") or [] if p.get("name")}
        if "httpGet" in probe:
            h = probe["httpGet"]
            port = h.get("port")
            port = ports.get(port, port) if isinstance(port, str) and not port.isdigit() else int(port)
            if isinstance(port, str):
                return False  # a named port the container does not declare
            url = f"{h.get('scheme', 'HTTP').lower()}://{h.get('host') or self.ip}:{port}{h.get('path', '/')}"
            try:
                async with self.kubelet.http.get(url, timeout=aiohttp.ClientTimeout(total=timeout),
                                                 headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []},
                                                 allow_redirects=False) as resp:
                    await resp.read()
                    return 200 <= resp.status < 400
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return False
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            port = t["port"]
            port = ports.get(port, port) if isinstance(port, str) and not port.isdigit() else int(port)
            try:
                _, w = await asyncio.wait_for(asyncio.open_connection(t.get("host") or self.ip, port), timeout)
                w.close()
                return True
            except (OSError, asyncio.TimeoutError):
                return False
        return False  # exec and grpc probes are not emulated: never ready

    async def _probe_loop(self, inc: Incarnation) -> None:
        probe = self.container.get("readinessProbe")
        if not probe:
            self._set_ready(True)
            await self._write_status()
            return
        period = float(probe.get("periodSeconds", 10))
        if self.kubelet.probe_period_cap is not None:
            period = min(period, self.kubelet.probe_period_cap)
        ok_needed, fail_needed = int(probe.get("successThreshold", 1)), int(probe.get("failureThreshold", 3))
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        oks = fails = 0
        ready = False
        while inc.running:
            if await self._probe_once(probe):
                oks, fails = oks + 1, 0
            else:
                oks, fails = 0, fails + 1
            if not ready and oks >= ok_needed:
                ready = True
            elif ready and fails >= fail_needed:
                ready = False
            if ready != self.status["containerStatuses"][0]["ready"] and inc.running:
                self._set_ready(ready)
                await self._write_status()
            await asyncio.sleep(period)
