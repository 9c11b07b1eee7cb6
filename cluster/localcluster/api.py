"""A small asyncio client for the node agent: JSON over HTTPS with a client certificate
(the node's identity, `system:node:<name>`), list + watch, and the verbs a kubelet uses."""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Optional, TypeVar

import aiohttp

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


# What a busy or restarting API server answers for a while: worth another try, as a kubelet does.
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def transient(e: BaseException) -> bool:
    return isinstance(e, TRANSIENT) or isinstance(e, ApiError) and (e.status >= 500 or e.status == 429)


async def retrying(what: str, call: Callable[[], Awaitable[T]], log: logging.Logger, max_delay: float = 5.0) -> T:
    """`call()` until it answers: transient failures (timeouts, refused connections, 5xx, 429)
    are logged and tried again with back-off; any other error is raised."""
    delay = 0.25
    while True:
        try:
            return await call()
        except (ApiError, *TRANSIENT) as e:
            if not transient(e):
                raise
            log.warning("%s: %r; trying again in %.1f s", what, e, delay)
        await asyncio.sleep(delay)
        delay = min(2 * delay, max_delay)


class Api:
    def __init__(self, server: str, ca: str, cert: str, key: str, timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.ssl = ssl.create_default_context(cafile=ca)
        self.ssl.load_cert_chain(cert, key)
        self.timeout = timeout
        self.session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self) -> Api:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=32),
                                             headers={"User-Agent": "tianji-node-agent"})
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, *, params: Optional[dict] = None, body: Any = None,
                      content_type: str = "application/json") -> Optional[dict]:
        """The decoded answer; None on 404; ApiError on any other failure."""
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.server + path, params=params, data=data,
                                        headers={"Content-Type": content_type},
                                        timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
            text = await resp.text()
            if resp.status == 404:
                return None
            if resp.status >= 300:
                try:
                    message = json.loads(text).get("message", text)
                except ValueError:
                    message = text
                raise ApiError(resp.status, f"{method} {path}: {message}")
            return json.loads(text) if text else {}

    async def get(self, path: str, **params: str) -> Optional[dict]:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: dict) -> Optional[dict]:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, body: dict) -> Optional[dict]:
        return await self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    async def put(self, path: str, body: dict) -> Optional[dict]:
        return await self.request("PUT", path, body=body)

    async def delete(self, path: str, body: Optional[dict] = None) -> Optional[dict]:
        return await self.request("DELETE", path, body=body)

    async def watch(self, path: str, resource_version: str, **params: str) -> AsyncIterator[dict]:
        """Watch events from `resource_version` until the server ends the watch (or an error)."""
        q = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
             "timeoutSeconds": "240", **params}
        async with self.session.get(self.server + path, params=q,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=300)) as resp:
            if resp.status >= 300:
                raise ApiError(resp.status, f"watch {path}: {await resp.text()}")
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)

    async def list_and_watch(self, path: str, on_list, on_event, **params: str) -> None:
        """Informer-like: list, then watch from the list's resourceVersion; again on any failure."""
        while True:
            try:
                lst = await self.get(path, **params) or {}
                on_list(lst.get("items") or [])
                rv = (lst.get("metadata") or {}).get("resourceVersion", "0")
                async for ev in self.watch(path, rv, **params):
                    if ev.get("type") == "ERROR":
                        break  # e.g. 410 Gone: too old; list again
                    if ev.get("type") == "BOOKMARK":
                        continue
                    on_event(ev["type"], ev["object"])
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, ApiError, OSError, ValueError):
                await asyncio.sleep(1.0)
