"""A small asyncio Kubernetes client for the operator's own calls (aiohttp, JSON dicts).

Kopf watches and patches TianJiJobs with its own client; the operator needs a
few verbs on a few kinds for the children. Every call goes through `KubeClient`
and its KINDS table, so the RBAC the operator needs is exactly the (verb,
resource) pairs used here plus Kopf's own (see `rbac.py`, docs/operator.md).

Credentials are a `kopf.ConnectionInfo`, the same the Kopf login handler
returns (service account in a pod, kubeconfig outside). On 401 the client
logs in again once and retries (rotated service-account tokens).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import ssl
import tempfile
from collections.abc import Callable
from typing import Any, Optional
from urllib.parse import quote

import aiohttp

# kind → (group, version, plural)
KINDS: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Event": ("", "v1", "events"),  # read only: the StatefulSet controller's FailedCreate
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "StorageClass": ("storage.k8s.io", "v1", "storageclasses"),  # read only: is there a default class
    "Secret": ("", "v1", "secrets"),
    "Service": ("", "v1", "services"),
    "Pod": ("", "v1", "pods"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "TianJiJob": ("tianji.dev", "v1alpha1", "tianjijobs"),  # status only; Kopf does the rest
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        method: str = "",
        path: str = "",
        causes: Optional[list] = None,
    ):
        super().__init__(f"{method} {path}: {status} {reason}: {message}".strip())
        self.status, self.reason, self.message = status, reason, message
        self.causes = causes or []  # Status.details.causes: field-level validation failures


def path_of(kind: str, namespace: Optional[str], name: Optional[str] = None, subresource: Optional[str] = None) -> str:
    group, version, plural = KINDS[kind]
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    if name:
        base += f"/{quote(name)}"
    if subresource:
        base += f"/{subresource}"
    return base


def ssl_context(info: Any) -> ssl.SSLContext:
    """TLS settings of a kopf.ConnectionInfo (its own method where this Kopf has it)."""
    if hasattr(info, "as_ssl_context"):
        return info.as_ssl_context()
    with contextlib.ExitStack() as stack:

        def path(p: Any, data: Any) -> Any:
            if p or not data:
                return p
            f = stack.enter_context(tempfile.NamedTemporaryFile(buffering=0))
            f.write(_pem(data).encode("ascii"))
            return f.name

        ctx = ssl.create_default_context(cafile=info.ca_path, cadata=_pem(info.ca_data) if info.ca_data else None)
        cert, key = (
            path(info.certificate_path, info.certificate_data),
            path(info.private_key_path, info.private_key_data),
        )
        if cert and key:
            ctx.load_cert_chain(certfile=cert, keyfile=key)
    if info.insecure:
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def auth_headers(info: Any) -> dict[str, str]:
    if hasattr(info, "as_http_headers"):
        return dict(info.as_http_headers())
    if info.username and info.password:
        return {"Authorization": aiohttp.BasicAuth(info.username, info.password).encode()}
    if info.token:
        return {"Authorization": f"{info.scheme or 'Bearer'} {info.token}"}
    return {}


def _pem(data: Any) -> str:
    if isinstance(data, bytes):
        data = data.decode("ascii")
    return data if data.startswith("-----BEGIN ") else base64.b64decode(data).decode("ascii")


class KubeClient:
    """JSON in, JSON out. `login()` returns a kopf.ConnectionInfo (called lazily, again on 401)."""

    def __init__(self, login: Callable[[], Any], timeout: float = 30.0, on_request: Optional[Callable] = None):
        self._login = login
        self._info: Any = None
        self._session: Optional[aiohttp.ClientSession] = None
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._on_request = on_request  # (verb, kind, status) for the operator's metrics
        self._closed = False

    async def _get_session(self) -> tuple[aiohttp.ClientSession, str]:
        async with self._lock:
            if self._closed:
                raise ApiError(0, "Closed", "the operator is stopping")
            if self._session is None or self._session.closed:
                self._info = self._info or self._login()
                if self._info is None:
                    raise ApiError(0, "NoCredentials", "no Kubernetes credentials found (in-cluster or kubeconfig)")
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=ssl_context(self._info)),
                    headers={**auth_headers(self._info), "User-Agent": "tianji-operator"},
                    timeout=aiohttp.ClientTimeout(total=self._timeout),
                )
            return self._session, self._info.server.rstrip("/")

    async def _relogin(self) -> None:
        async with self._lock:
            if self._session is not None:
                await self._session.close()
            self._session, self._info = None, self._login()

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Optional[dict] = None,
        body: Any = None,
        content_type: str = "application/json",
        verb: str = "",
        kind: str = "",
    ) -> Any:
        for attempt in (0, 1):
            session, server = await self._get_session()
            data = None if body is None else json.dumps(body)
            headers = {"Content-Type": content_type, "Accept": "application/json"}
            async with session.request(method, server + path, params=params, data=data, headers=headers) as resp:
                text = await resp.text()
                if self._on_request is not None:
                    self._on_request(verb or method.lower(), kind, resp.status)
                if resp.status == 401 and attempt == 0:
                    await self._relogin()
                    continue
                if resp.status >= 400:
                    reason, message = resp.reason or "", text[:500]
                    causes: list = []
                    try:
                        st = json.loads(text)
                        reason, message = st.get("reason", reason), st.get("message", message)
                        causes = (st.get("details") or {}).get("causes") or []
                    except (ValueError, AttributeError):
                        pass
                    raise ApiError(resp.status, reason, message, method, path, causes)
                return json.loads(text) if text else None
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------- verbs
    async def get(self, kind: str, namespace: Optional[str], name: str) -> Optional[dict]:
        try:
            return await self.request("GET", path_of(kind, namespace, name), verb="get", kind=kind)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self,
        kind: str,
        namespace: Optional[str],
        label_selector: Optional[str] = None,
        field_selector: Optional[str] = None,
    ) -> list[dict]:
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v} or None
        out = await self.request("GET", path_of(kind, namespace), params=params, verb="list", kind=kind)
        return list((out or {}).get("items") or [])

    async def create(self, obj: dict) -> dict:
        ns = obj["metadata"]["namespace"]
        return await self.request("POST", path_of(obj["kind"], ns), body=obj, verb="create", kind=obj["kind"])

    async def ensure(self, obj: dict) -> tuple[dict, bool]:
        """Create `obj` unless an object of that name exists: (the object, created?)."""
        try:
            return await self.create(obj), True
        except ApiError as e:
            if e.status != 409:
                raise
        existing = await self.get(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if existing is None:  # deleted in between: try once more
            return await self.create(obj), True
        return existing, False

    async def patch(self, kind: str, namespace: Optional[str], name: str, patch: dict) -> dict:
        """JSON merge patch (RFC 7386)."""
        return await self.request(
            "PATCH",
            path_of(kind, namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
            verb="patch",
            kind=kind,
        )

    async def patch_status(
        self,
        kind: str,
        namespace: Optional[str],
        name: str,
        resource_version: str,
        fields: dict,
        has_status: bool = True,
    ) -> bool:
        """Set top-level `.status` fields with optimistic concurrency: a JSON patch that first
        tests metadata.resourceVersion. False (nothing written) if the object changed since."""
        ops: list[dict] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
        if has_status:
            ops += [
                {"op": "add", "path": "/status/" + k.replace("~", "~0").replace("/", "~1"), "value": v}
                for k, v in fields.items()
            ]
        else:
            ops.append({"op": "add", "path": "/status", "value": fields})
        try:
            await self.request(
                "PATCH",
                path_of(kind, namespace, name, "status"),
                body=ops,
                content_type="application/json-patch+json",
                verb="patch",
                kind=kind,
            )
            return True
        except ApiError as e:
            # A failed `test` is 422 without causes; a status the schema refuses is 422 *with*
            # causes: that one is a bug to surface, not a conflict to retry forever.
            if e.status == 409 or (e.status == 422 and not e.causes):
                return False
            raise

    async def delete(
        self,
        kind: str,
        namespace: Optional[str],
        name: str,
        *,
        grace_seconds: Optional[int] = None,
        uid: Optional[str] = None,
    ) -> bool:
        """DELETE (background propagation); `grace_seconds=0` with `uid` is a forced delete of exactly
        that object (`kubectl delete --force --grace-period=0`)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path_of(kind, namespace, name), body=body, verb="delete", kind=kind)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise


def in_cluster_login(settings: Any) -> Any:
    """The pod's service account, at the API server address the kubelet puts in the pod's env
    (KUBERNETES_SERVICE_HOST/PORT), as client-go's in-cluster config does. Kopf's own helper
    always dials https://kubernetes.default.svc, which needs cluster DNS and a routed Service IP;
    the env address needs neither. None outside a pod."""
    import kopf

    info = kopf.login_with_service_account(settings=settings)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is not None and host and port:
        host = f"[{host}]" if ":" in host else host
        info = dataclasses.replace(info, server=f"https://{host}:{port}")
    return info
