"""The node agent's kubelet port (10250, HTTPS): what `kubectl logs` reaches through the API
server (`GET /containerLogs/{namespace}/{pod}/{container}`, with `follow`, `tailLines`,
`limitBytes` and `previous`), and `/healthz`.

Only the API server may call it: the client certificate must chain to the cluster CA and name
the API server's kubelet-client identity (a real kubelet delegates that check to a
SubjectAccessReview; this cluster has exactly one such client). The serving certificate is
issued for the node's IP, so the API server verifies the node too
(`--kubelet-certificate-authority`). `kubectl exec`/`attach`/`port-forward` (SPDY/WebSocket
upgrades) are not served.
"""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from aiohttp import web

if TYPE_CHECKING:
    from .containers import Incarnation
    from .pods import Node

PORT = 10250
API_SERVER_CLIENT = "kube-apiserver-kubelet-client"  # CN of the API server's client certificate
FOLLOW_POLL_S = 0.2
CHUNK = 64 * 1024


def _tail(data: bytes, lines: Optional[int]) -> bytes:
    if lines is None:
        return data
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def _int_param(request: web.Request, name: str) -> Optional[int]:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: not an integer: {raw!r}") from None
    if value < 0:
        raise web.HTTPBadRequest(text=f"{name}: must not be negative")
    return value


class KubeletServer:
    def __init__(self, node: Node, ip: str, ca: Path, cert: Path, key: Path):
        self.node, self.ip = node, ip
        self.ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        self.ssl.load_cert_chain(str(cert), str(key))
        self.ssl.verify_mode = ssl.CERT_REQUIRED
        self.runner: Optional[web.AppRunner] = None

    async def start(self) -> None:
        app = web.Application(middlewares=[self._only_api_server])
        app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.ip, PORT, ssl_context=self.ssl).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @web.middleware
    async def _only_api_server(self, request: web.Request, handler):
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = [v for rdn in (peer or {}).get("subject", ()) for k, v in rdn if k == "commonName"]
        if names != [API_SERVER_CLIENT]:
            raise web.HTTPForbidden(text=f"forbidden: {names or 'no client certificate'} is not the API server")
        return await handler(request)

    def _incarnation(self, namespace: str, pod: str, container: str, previous: bool) -> Incarnation:
        starts = [i for i in self.node.incarnations if i.namespace == namespace and i.pod == pod]
        if not starts:
            raise web.HTTPNotFound(text=f'pod "{pod}" in namespace "{namespace}" has no containers on this node')
        mine = [i for i in starts if i.container == container]
        if not mine:
            names = sorted({i.container for i in starts})
            raise web.HTTPBadRequest(text=f'container "{container}" is not valid for pod "{pod}": {names}')
        mine = [i for i in mine if i.uid == mine[-1].uid]  # the current pod object's starts only
        if previous:
            if len(mine) < 2:
                raise web.HTTPBadRequest(text=f'previous terminated container "{container}" in pod "{pod}" '
                                         "not found")
            return mine[-2]
        return mine[-1]

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        previous = request.query.get("previous", "false").lower() == "true"
        follow = request.query.get("follow", "false").lower() == "true" and not previous
        tail, limit = _int_param(request, "tailLines"), _int_param(request, "limitBytes")
        inc = self._incarnation(m["namespace"], m["pod"], m["container"], previous)
        try:
            data = inc.log_path.read_bytes()
        except FileNotFoundError:
            data = b""
        offset = len(data)
        out = _tail(data, tail)
        if limit is not None:
            out = out[:limit]
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(out)
        sent = len(out)
        while follow and (limit is None or sent < limit):
            running = inc.running  # read before the file: what it wrote before exiting is sent too
            await asyncio.sleep(FOLLOW_POLL_S if running else 0)
            with open(inc.log_path, "rb") as f:
                f.seek(offset)
                more = f.read(CHUNK)
            if more:
                offset += len(more)
                more = more if limit is None else more[:limit - sent]
                await resp.write(more)
                sent += len(more)
            elif not running:
                break
        await resp.write_eof()
        return resp
