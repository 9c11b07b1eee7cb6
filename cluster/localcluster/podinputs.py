"""What a pod's container is given (a mixin of pods.PodWorker): its volumes (configMap, secret,
emptyDir, hostPath, and the node's own kinds) as host folders to bind, and its environment
(`$(VAR)` expansion and the downward API: fieldRef, resourceFieldRef, configMapKeyRef).

`project_keys` writes a ConfigMap's or Secret's keys as files: for this kubelet's configMap and
secret volumes, the sources of its projected volumes (projected.py) and the image tier's pods
without a cluster (ocibundle.volume_mounts)."""
from __future__ import annotations

import base64
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

from .containers import PodStartError


def write_file(target: Path, rel: str, data: bytes, mode: int) -> None:
    path = target / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def key_bytes(obj: Optional[dict], secret: bool) -> dict[str, bytes]:
    """A ConfigMap's or Secret's keys as file contents (None: no keys). A Secret's data is base64;
    its stringData is folded in as the apiserver does on write (objects that never went through
    one, the image tier's, still carry it)."""
    obj = obj or {}
    if not secret:
        return {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def project_keys(target: Path, data: dict[str, bytes], src: dict, what: str, *, default_mode: Optional[int] = None,
                 missing: str = "CreateContainerConfigError") -> Path:
    """A configMap or secret volume (or such a source of a projected volume): its items, or every
    key, as files under `target`, each with its item's mode, else `default_mode` (None: the
    source's defaultMode, else 0644). A key the object lacks is skipped when the source is
    optional; otherwise the start fails with reason `missing`."""
    target.mkdir(parents=True, exist_ok=True)
    if default_mode is None:
        default_mode = int(src.get("defaultMode", 0o644))
    for it in src.get("items") or [{"key": k, "path": k} for k in sorted(data)]:
        if it["key"] not in data:
            if src.get("optional"):
                continue
            raise PodStartError(missing, f'{what} has no key "{it["key"]}"')
        mode = it.get("mode")
        write_file(target, it["path"], data[it["key"]], int(mode if mode is not None else default_mode))
    return target


def _quantity(text: Any) -> float:
    """A Kubernetes quantity (cpu or memory) as a float in base units."""
    s = str(text)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
             "Ti": 2 ** 40}
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", s)
    if not m:
        raise ValueError(f"bad quantity {text!r}")
    return float(m.group(1)) * units.get(m.group(2), 1.0)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion (`$$` escapes); unknown references stay as they are."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


class PodInputs:
    """Volumes and env of `self.container` (PodWorker supplies pod, spec, container, kubelet, dir,
    namespace, uid, ip, hostname and shm_dirs)."""

    async def _volume_source(self, vol: dict) -> Path:
        name = vol["name"]
        if "configMap" in vol:
            src = vol["configMap"]
            cm = await self.kubelet.read("configmaps", self.namespace, src["name"])
            target = self.dir / "volumes" / "configmap" / name
            if cm is None:
                if src.get("optional"):
                    target.mkdir(parents=True, exist_ok=True)
                    return target
                raise PodStartError("ContainerCreating", f'MountVolume.SetUp failed for volume "{name}": '
                                    f'configmap "{src["name"]}" not found')
            return project_keys(target, key_bytes(cm, secret=False), src, f'configmap "{src["name"]}"')
        if "secret" in vol:
            src = vol["secret"]
            secret = await self.kubelet.read("secrets", self.namespace, src["secretName"])
            if secret is None:
                raise PodStartError("ContainerCreating", f'MountVolume.SetUp failed for volume "{name}": '
                                    f'secret "{src["secretName"]}" not found')
            return project_keys(self.dir / "volumes" / "secret" / name, key_bytes(secret, secret=True), src,
                                f'secret "{src["secretName"]}"')
        if "emptyDir" in vol:
            if (vol["emptyDir"] or {}).get("medium") == "Memory" and Path("/dev/shm").is_dir():
                target = self.kubelet.shm_root / f"{self.uid[:8]}-{name}"
                self.shm_dirs.append(target)
            else:
                target = self.dir / "volumes" / "empty-dir" / name
            target.mkdir(parents=True, exist_ok=True)
            return target
        if "hostPath" in vol:
            return Path(vol["hostPath"]["path"])
        special = await self.kubelet.volume_source(self, vol)
        if special is not None:
            return special
        kinds = sorted(k for k in vol if k != "name")
        raise PodStartError("CreateContainerConfigError", f'volume "{name}": {kinds} volumes are not emulated')

    async def _mounts(self) -> list[tuple[Path, str, bool]]:
        """(host source, mountPath, readOnly) for each volumeMount of the container."""
        vols = {v["name"]: v for v in self.spec.get("volumes") or []}
        sources: dict[str, Path] = {}
        out = []
        for m in self.container.get("volumeMounts") or []:
            if m["name"] not in vols:
                raise PodStartError("CreateContainerConfigError", f'volumeMount "{m["name"]}": no such volume')
            if m["name"] not in sources:
                sources[m["name"]] = await self._volume_source(vols[m["name"]])
            src = sources[m["name"]]
            if m.get("subPath"):
                src = src / m["subPath"]
                if not src.exists():
                    src.mkdir(parents=True)
            out.append((src, m["mountPath"], bool(m.get("readOnly"))))
        return out

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.spec
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
            "metadata.uid": meta["uid"], "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.podIP": self.ip or "", "status.podIPs": self.ip or "",
            "status.hostIP": self.kubelet.host_ip, "status.hostIPs": self.kubelet.host_ip,
        }
        if path not in values:
            raise PodStartError("CreateContainerConfigError", f"fieldRef {path!r} is not emulated")
        return values[path]

    def _resource_field(self, ref: dict) -> str:
        res = self.container.get("resources") or {}
        kind, _, name = ref["resource"].partition(".")
        value = (res.get(kind) or {}).get(name)
        if value is None:
            value = (res.get("limits") or {}).get(name) if kind == "requests" else None
        if value is None:
            return "0"
        divisor = _quantity(ref.get("divisor", "1"))
        return str(int(math.ceil(_quantity(value) / divisor)))

    async def _env(self) -> dict[str, str]:
        env = dict(await self.kubelet.base_env(self))
        env["HOSTNAME"] = self.hostname
        env.update(self.kubelet.pod_env(self))
        if self.container.get("envFrom"):
            raise PodStartError("CreateContainerConfigError", "envFrom is not emulated")
        for e in self.container.get("env") or []:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    value = self._field(vf["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in vf:
                    value = self._resource_field(vf["resourceFieldRef"])
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    cm = await self.kubelet.read("configmaps", self.namespace, ref["name"]) or {}
                    if ref["key"] not in (cm.get("data") or {}):
                        if ref.get("optional"):
                            continue
                        raise PodStartError("CreateContainerConfigError",
                                            f'configmap "{ref["name"]}" key "{ref["key"]}" not found')
                    value = cm["data"][ref["key"]]
                else:
                    raise PodStartError("CreateContainerConfigError", f"env {e['name']}: {sorted(vf)} not emulated")
            else:
                value = _expand(str(e.get("value", "")), env)
            env[e["name"]] = value
        return env
