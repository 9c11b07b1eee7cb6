"""Projected volumes as a kubelet fills them: the ServiceAccount admission plugin gives every pod
one (`kube-api-access-*`: a bound token, the cluster CA from the kube-root-ca.crt ConfigMap and
the namespace). The token comes from the TokenRequest API, bound to the pod, so it dies with it.
Tokens are not refreshed: test pods live far shorter than the token's hour."""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .pods import PodStartError

if TYPE_CHECKING:
    from .nodeagent import NodeAgent
    from .pods import PodWorker


def _write(target: Path, rel: str, data: bytes, mode: int) -> None:
    path = target / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


async def _token(agent: "NodeAgent", w: "PodWorker", src: dict) -> bytes:
    sa = w.spec.get("serviceAccountName") or "default"
    body: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": int(src.get("expirationSeconds", 3607)),
                                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": w.name,
                                                        "uid": w.uid}}}
    if src.get("audience"):
        body["spec"]["audiences"] = [src["audience"]]
    out = await agent.api.create(
        f"/api/v1/namespaces/{quote(w.namespace)}/serviceaccounts/{quote(sa)}/token", body)
    if not out:
        raise PodStartError("ContainerCreating", f'serviceaccount "{sa}" not found')
    return out["status"]["token"].encode()


def _items(data: dict[str, bytes], spec: dict, what: str) -> list[tuple[str, bytes, Any]]:
    out = []
    for it in spec.get("items") or [{"key": k, "path": k} for k in sorted(data)]:
        if it["key"] not in data:
            if spec.get("optional"):
                continue
            raise PodStartError("ContainerCreating", f'{what} has no key "{it["key"]}"')
        out.append((it["path"], data[it["key"]], it.get("mode")))
    return out


async def project(agent: "NodeAgent", w: "PodWorker", proj: dict, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    default_mode = int(proj.get("defaultMode", 0o644))
    for src in proj.get("sources") or []:
        files: list[tuple[str, bytes, Any]] = []
        if "serviceAccountToken" in src:
            s = src["serviceAccountToken"]
            files = [(s.get("path", "token"), await _token(agent, w, s), None)]
        elif "configMap" in src:
            s = src["configMap"]
            cm = await agent.read("configmaps", w.namespace, s["name"])
            if cm is None and not s.get("optional"):
                raise PodStartError("ContainerCreating", f'configmap "{s["name"]}" not found')
            files = _items({k: v.encode() for k, v in ((cm or {}).get("data") or {}).items()}, s,
                           f'configmap "{s["name"]}"')
        elif "secret" in src:
            s = src["secret"]
            sec = await agent.read("secrets", w.namespace, s["name"])
            if sec is None and not s.get("optional"):
                raise PodStartError("ContainerCreating", f'secret "{s["name"]}" not found')
            files = _items({k: base64.b64decode(v) for k, v in ((sec or {}).get("data") or {}).items()}, s,
                           f'secret "{s["name"]}"')
        elif "downwardAPI" in src:
            files = [(it["path"], w._field(it["fieldRef"]["fieldPath"]).encode(), it.get("mode"))
                     for it in src["downwardAPI"].get("items") or [] if "fieldRef" in it]
        for rel, data, mode in files:
            _write(target, rel, data, int(mode) if mode is not None else default_mode)
    return target
