"""The node agent's container runtime (`--runtime=crun`): a pod's container runs from its image
in buildah's local storage under crun, as a kubelet with a CRI runtime would run it.

Per pod: a buildah working container of the image (`buildah from --pull-never`, mounted: the
root filesystem; removed when the pod goes, so a restarted container keeps the pod's writable
layer). Per container start: an OCI bundle (ocibundle.oci_config) with the container's
command/args over the image's ENTRYPOINT/CMD (`$(VAR)` expanded), the image's env under the
pod's (downward API, the node's KUBERNETES_SERVICE_*), workingDir, runAsUser/runAsGroup (else
the image's USER), fsGroup and supplementalGroups, runAsNonRoot, the default capabilities less
`drop` plus `add`, no_new_privs from allowPrivilegeEscalation: false, readOnlyRootFilesystem, the
pod's volumes bind-mounted (what pods.py made of them: host folders), /etc/hosts and
/etc/resolv.conf, the termination-message file, the pod's hostname, and the pod's network
namespace joined (a hostNetwork pod keeps the node's). `crun run` stays in the foreground, its
output in the container's log; stop = `crun kill` SIGTERM, SIGKILL after the grace period.

An image absent from storage: the container waits with reason ErrImageNeverPull (no pulls).
Not enforced: cgroup limits (crun refuses this machine's hybrid cgroups; resources stay
bookkeeping, as in the process mode), the RuntimeDefault seccomp profile, image pulls."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import network
from .containers import Incarnation, PodStartError
from .ocibundle import bind, crun, crun_argv, oci_config, own_volume
from .podinputs import _expand
from .pods import Node, PodWorker

# What containerd gives a container unless its securityContext drops or adds capabilities.
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")


def buildah(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=check)


@dataclass
class PodImage:
    """A pod's working container: its name, mounted root filesystem and the image's config."""
    name: str
    rootfs: str
    config: dict


@dataclass
class CrunContainer:
    """`Incarnation.runtime`: signals through `crun kill`, `crun delete` once it exited."""
    cid: str
    root: str

    def kill(self, sig: int) -> bool:
        return crun("kill", self.cid, str(int(sig)), check=False, root=self.root).returncode == 0

    def finish(self) -> None:
        crun("delete", "--force", self.cid, check=False, root=self.root)


def capabilities(csc: dict) -> list[str]:
    """The container's capability set: containerd's default less `drop` plus `add`."""
    caps = csc.get("capabilities") or {}
    names = [str(c) for c in [*(caps.get("drop") or []), *(caps.get("add") or [])]]
    bad = [c for c in names if not re.fullmatch(r"(CAP_)?[A-Z_]{2,32}", c.upper())]
    if bad:
        raise PodStartError("CreateContainerConfigError", f"capabilities: not capability names: {bad}")
    drop = {c.upper().removeprefix("CAP_") for c in caps.get("drop") or []}
    keep = [] if "ALL" in drop else [c for c in DEFAULT_CAPS if c not in drop]
    add = [c.upper().removeprefix("CAP_") for c in caps.get("add") or []]
    return [f"CAP_{c}" for c in dict.fromkeys([*keep, *add])]


def _image_user(cfg: dict) -> tuple[Optional[int], Optional[int]]:
    user, _, group = (cfg.get("User") or "").partition(":")
    return (int(user) if user.isdigit() else None), (int(group) if group.isdigit() else None)


def _node_key(node_root: Path) -> str:
    return hashlib.sha1(str(Path(node_root).resolve()).encode()).hexdigest()[:12]


def crun_root(node_root: Path) -> str:
    """crun's state folder of the node whose agent has --root `node_root` (short: crun keeps sockets there)."""
    return f"/run/tianji-crun/{_node_key(node_root)}"


def sweep(node_root: Path) -> None:
    """Remove what a node's pods left (an agent killed before it cleaned up): crun containers,
    the pods' buildah working containers (named after the node), crun's folder."""
    root = crun_root(node_root)
    for cid in os.listdir(root) if os.path.isdir(root) else []:
        crun("delete", "--force", cid, check=False, root=root)
    with contextlib.suppress(OSError):
        os.rmdir(root)
    if shutil.which("buildah") is None:
        return
    prefix = f"tianji-pod-{_node_key(node_root)}-"
    names = buildah("containers", "--format", "{{.ContainerName}}").stdout.split()
    for name in (n for n in names if n.startswith(prefix)):
        buildah("rm", name)


class CrunRuntime:
    def __init__(self, node: Node):
        self.node = node
        self.root = crun_root(node.root)
        self.prefix = f"tianji-pod-{_node_key(node.root)}-"
        self.pods: dict[str, PodImage] = {}

    async def image(self, w: PodWorker) -> PodImage:
        """The pod's working container, made on first use; ErrImageNeverPull if the image is absent."""
        if w.uid in self.pods:
            return self.pods[w.uid]
        ref = str(w.container.get("image") or "")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}", ref):  # (never a buildah option)
            raise PodStartError("InvalidImageName", f'image "{ref[:100]}" is not an image reference')
        r = await asyncio.to_thread(buildah, "inspect", "--type", "image", ref)
        if r.returncode != 0:
            raise PodStartError("ErrImageNeverPull", f'image "{ref}" is not in this node\'s storage '
                                f'(`buildah images`; this node pulls nothing: build it with images/build.sh)')
        cfg = json.loads(r.stdout)["OCIv1"]["config"]
        name = f"{self.prefix}{w.uid}"
        await asyncio.to_thread(buildah, "rm", name)  # a leftover of a killed agent
        made = await asyncio.to_thread(buildah, "from", "--pull-never", "--name", name, ref)
        mounted = await asyncio.to_thread(buildah, "mount", name) if made.returncode == 0 else made
        if mounted.returncode != 0:
            raise PodStartError("CreateContainerError", f"buildah: {mounted.stderr.strip()[-300:]}")
        self.pods[w.uid] = PodImage(name, mounted.stdout.strip(), cfg)
        return self.pods[w.uid]

    async def base_env(self, w: PodWorker) -> dict[str, str]:
        cfg = (await self.image(w)).config
        env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
        env.setdefault("HOME", "/")
        return env

    def _user(self, w: PodWorker, cfg: dict) -> tuple[int, int, list[int]]:
        sc, csc = w.spec.get("securityContext") or {}, w.container.get("securityContext") or {}
        img_uid, img_gid = _image_user(cfg)
        uid = csc.get("runAsUser", sc.get("runAsUser", img_uid))
        gid = csc.get("runAsGroup", sc.get("runAsGroup", img_gid))
        if uid is None:
            raise PodStartError("CreateContainerConfigError", f"image user {cfg.get('User')!r} is not numeric "
                                "and no runAsUser is set")
        if csc.get("runAsNonRoot", sc.get("runAsNonRoot")) and uid == 0:
            raise PodStartError("CreateContainerConfigError", "container has runAsNonRoot and image will run as root")
        groups = [*([sc["fsGroup"]] if "fsGroup" in sc else []), *(sc.get("supplementalGroups") or [])]
        return int(uid), int(gid or 0), [int(g) for g in groups]

    def _argv(self, w: PodWorker, cfg: dict, env: dict[str, str]) -> list[str]:
        c = w.container
        if c.get("command"):
            argv = [*c["command"], *(c.get("args") or [])]
        else:
            argv = [*(cfg.get("Entrypoint") or []), *(c["args"] if "args" in c else cfg.get("Cmd") or [])]
        if not argv:
            raise PodStartError("CreateContainerConfigError", "no command and the image has no ENTRYPOINT or CMD")
        return [_expand(str(a), env) for a in argv]

    def _volume_dirs(self, w: PodWorker) -> list[tuple[Path, bool]]:
        """(host folder, written by the pod) of the pod's volumes that pods.py made."""
        kinds = {"emptyDir": "empty-dir", "configMap": "configmap", "secret": "secret", "projected": "projected"}
        out = []
        for vol in w.spec.get("volumes") or []:
            kind = next((k for k in kinds if k in vol), None)
            if kind is not None:
                out.append((w.dir / "volumes" / kinds[kind] / vol["name"], kind == "emptyDir"))
                if kind == "emptyDir":
                    out.append((self.node.shm_root / f"{w.uid[:8]}-{vol['name']}", True))
        return [(d, rw) for d, rw in out if d.is_dir()]

    def _own_volumes(self, w: PodWorker, fs_group: Optional[int]) -> None:
        for top, rw in self._volume_dirs(w):
            own_volume(top, rw, fs_group)

    async def launch(self, w: PodWorker, inc: Incarnation, mounts: list[tuple[Path, str, bool]]) -> None:
        img = await self.image(w)
        csc = w.container.get("securityContext") or {}
        user = self._user(w, img.config)
        self._own_volumes(w, (w.spec.get("securityContext") or {}).get("fsGroup"))
        inc.termination_path.chmod(0o666)
        binds = [*mounts, *self.node.sandbox_files(w)]
        tpath = w.container.get("terminationMessagePath", "/dev/termination-log")
        if tpath:
            binds.append((inc.termination_path, tpath, False))
        netns = str(network.NETNS_DIR / w.sandbox_ns) if w.sandbox_ns else None
        config = oci_config(self._argv(w, img.config, inc.env),
                            cwd=w.container.get("workingDir") or img.config.get("WorkingDir") or "/",
                            env=[f"{k}={v}" for k, v in inc.env.items()], rootfs=img.rootfs, user=user,
                            caps=capabilities(csc), no_new_privs=csc.get("allowPrivilegeEscalation") is False,
                            readonly=bool(csc.get("readOnlyRootFilesystem")), hostname=w.hostname,
                            mounts=[bind(s, d, ro) for s, d, ro in binds], netns=netns)
        bundle = w.dir / "bundles" / f"{inc.container}-{inc.restart_count}"
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        cid = f"{w.uid[:13]}-{inc.container}-{inc.restart_count}"
        await asyncio.to_thread(crun, "delete", "--force", cid, check=False, root=self.root)
        inc.argv = [*crun_argv(self.root), "run", "--bundle", str(bundle), cid]
        inc.runtime = CrunContainer(cid, self.root)
        with open(inc.log_path, "ab") as logf:
            inc.proc = await asyncio.create_subprocess_exec(
                *inc.argv, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)

    async def release(self, w: PodWorker) -> None:
        """The pod is gone: its working container (and root filesystem) too."""
        img = self.pods.pop(w.uid, None)
        if img is not None:
            await asyncio.to_thread(buildah, "rm", img.name)

    async def close(self) -> None:
        """The agent stops (its pods are stopped): what is left of them."""
        self.pods.clear()
        await asyncio.to_thread(sweep, self.node.root)
