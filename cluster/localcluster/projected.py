"""Projected volumes as a kubelet fills them: the ServiceAccount admission plugin gives every pod
one (`kube-api-access-*`: a bound token, the cluster CA from the kube-root-ca.crt ConfigMap and
the namespace). The token comes from the TokenRequest API, bound to the pod, so it dies with it.
Tokens are not refreshed: test pods live far shorter than the token's hour."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .podinputs import key_bytes, project_keys, write_file
from .pods import PodStartError

if TYPE_CHECKING:
    from .nodeagent import NodeAgent
    from .pods import PodWorker


async def _token(agent: NodeAgent, w: PodWorker, src: dict) -> bytes:
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


async def project(agent: NodeAgent, w: PodWorker, proj: dict, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    default_mode = int(proj.get("defaultMode", 0o644))
    for src in proj.get("sources") or []:
        if "serviceAccountToken" in src:
            s = src["serviceAccountToken"]
            write_file(target, s.get("path", "token"), await _token(agent, w, s), default_mode)
        elif "configMap" in src or "secret" in src:
            kind = "configmap" if "configMap" in src else "secret"
            s = src["configMap" if kind == "configmap" else "secret"]
            obj = await agent.read(f"{kind}s", w.namespace, s["name"])
            if obj is None and not s.get("optional"):
                raise PodStartError("ContainerCreating", f'{kind} "{s["name"]}" not found')
            # a key it lacks fails the volume's mount: the pod stays ContainerCreating
            project_keys(target, key_bytes(obj, secret=kind == "secret"), s, f'{kind} "{s["name"]}"',
                         default_mode=default_mode, missing="ContainerCreating")
        elif "downwardAPI" in src:
            for it in src["downwardAPI"].get("items") or []:
                if "fieldRef" in it:
                    mode = it.get("mode")
                    write_file(target, it["path"], w._field(it["fieldRef"]["fieldPath"]).encode(),
                               int(mode) if mode is not None else default_mode)
    return target
