"""OCI bundles for crun: a container as a kubelet would run it from an image (the image's
root filesystem from a buildah mount, the container's command/args in place of the image's
ENTRYPOINT/CMD, env, user, capabilities, no_new_privs, readOnlyRootFilesystem, bind-mounted
volumes, hostname, optionally a network namespace to join).

`oci_config` is the one config writer and `own_volume` the one volume-ownership rule; the local
cluster's crun runtime (crunruntime.py) and the image tier (tests/images: `pod_container`, a pod
without a cluster, configMap/secret keys written as the local kubelet writes them
(podinputs.project_keys), emptyDirs as fresh directories, a cluster hosts file at /etc/hosts)
use them.

Not modelled: cgroup limits (crun refuses this machine's hybrid cgroups, see CRUN), the
RuntimeDefault seccomp profile."""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .podinputs import key_bytes, project_keys

CRUN_ROOT = "/run/tianji-images-crun"  # the image tier's container state, apart from anyone else's
MASKED = ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"]
READONLY = ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# crun refuses hybrid cgroup hosts (v1 controllers, plus a v2 hierarchy with controllers at
# /sys/fs/cgroup/unified), even with cgroups disabled: it runs in a mount namespace of its own
# without the v2 mount, where it sees plain v1, and leaves cgroups alone.
def crun_argv(root: str = CRUN_ROOT) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'if mountpoint -q /sys/fs/cgroup/unified; then umount -l /sys/fs/cgroup/unified; fi; exec "$@"',
            "crun", "crun", "--root", root, "--cgroup-manager=disabled"]


CRUN = crun_argv()


def crun(*args: str, check: bool = True, root: str = CRUN_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*crun_argv(root), *args], capture_output=True, text=True, check=check)


def _field(pod: dict, path: str, ip: str) -> str:
    meta = pod["metadata"]
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if m:
        return str((meta.get("labels") or {}).get(m.group(1), ""))
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "status.podIP": ip}
    assert path in values, f"fieldRef {path} not modelled"
    return values[path]


def container_env(pod: dict, container: dict, image_env: list[str], ip: str) -> list[str]:
    env = dict(e.split("=", 1) for e in image_env)
    env["HOSTNAME"] = pod["spec"].get("hostname") or pod["metadata"]["name"]
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        assert ref or "valueFrom" not in e, f"env {e['name']}: only fieldRef is modelled"
        env[e["name"]] = _field(pod, ref["fieldPath"], ip) if ref else str(e.get("value", ""))
    return [f"{k}={v}" for k, v in env.items()]


def own_volume(top: Path, writable: bool, fs_group: Optional[int]) -> None:
    """Volume ownership as a kubelet sets it (a process runtime runs as root and needs none): a
    writable volume (emptyDir) world-writable; with fsGroup every file group-owned by it,
    readable (0440) in configMap/secret/projected volumes, writable (0660) in emptyDirs,
    folders setgid."""
    if writable:
        top.chmod(0o777)
    if fs_group is None:
        return
    for path in [top, *top.rglob("*")]:
        os.lchown(path, -1, fs_group)
        if path.is_dir():
            path.chmod(path.stat().st_mode & 0o7777 | 0o2000 | (0o070 if writable else 0o050))
        elif path.is_file():
            path.chmod(path.stat().st_mode & 0o7777 | (0o660 if writable else 0o440))


def volume_mounts(pod: dict, container: dict, objects: dict, vol_dir: Path) -> list[dict]:
    """OCI mounts for the container's volumeMounts; `objects`: (kind, name) -> ConfigMap/Secret."""
    fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    mounts = []
    for vm in container.get("volumeMounts") or []:
        vol = volumes[vm["name"]]
        src = vol_dir / vm["name"]
        if "emptyDir" in vol:  # medium Memory too: a folder the pod's containers (init ones too) share
            src.mkdir(parents=True, exist_ok=True)
            own_volume(src, True, fs_group)
        elif "configMap" in vol or "secret" in vol:
            kind, ref = ("ConfigMap", vol["configMap"]) if "configMap" in vol else ("Secret", vol["secret"])
            name = ref.get("name") or ref.get("secretName")
            project_keys(src, key_bytes(objects[(kind, name)], secret=kind == "Secret"), ref,
                         f'{kind.lower()} "{name}"')
            own_volume(src, False, fs_group)
        else:
            raise AssertionError(f"volume {vm['name']}: {sorted(vol)} not modelled")
        mounts.append(bind(src, vm["mountPath"], bool(vm.get("readOnly"))))
    return mounts


def _base_mounts() -> list[dict]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]


@dataclass
class Container:
    """One running container: `crun run` in the foreground, its output in `log`."""
    cid: str
    bundle: Path
    log: Path
    termination: Path
    proc: Optional[subprocess.Popen] = None
    extra: dict = field(default_factory=dict)

    def start(self) -> Container:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*CRUN, "run", "--bundle", str(self.bundle), self.cid],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        return self

    def pid(self) -> Optional[int]:
        r = crun("state", self.cid, check=False)
        return json.loads(r.stdout).get("pid") if r.returncode == 0 else None

    def stop(self, grace: float = 20.0) -> Optional[int]:
        """SIGTERM, SIGKILL after `grace` seconds (a kubelet's stop); the exit code."""
        for sig, wait in (("TERM", grace), ("KILL", 20.0)):
            if self.proc is None or self.proc.poll() is not None:
                break
            crun("kill", self.cid, sig, check=False)
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        crun("delete", "--force", self.cid, check=False)
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def bind(source: Path, destination: str, readonly: bool) -> dict:
    return {"destination": destination, "type": "bind", "source": str(source),
            "options": ["rbind", "ro" if readonly else "rw", "nosuid", "nodev"]}


def oci_config(argv: list[str], *, cwd: str, env: list[str], rootfs: str, user: tuple[int, int, list[int]],
               caps: list[str], no_new_privs: bool, readonly: bool, hostname: str, mounts: list[dict],
               netns: Optional[str] = None) -> dict:
    """An OCI runtime config: `caps` the capability set (CAP_*), `mounts` beyond /proc, /dev and
    /sys, `netns` a network namespace to join (None: crun's own, e.g. the node's)."""
    uid, gid, groups = user
    cap_sets = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    cap_sets.update(inheritable=[], ambient=[])
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if netns:
        namespaces.append({"type": "network", "path": netns})
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "args": argv, "cwd": cwd, "env": env,
                    "user": {"uid": uid, "gid": gid, "additionalGids": groups},
                    "capabilities": cap_sets, "noNewPrivileges": no_new_privs},
        "root": {"path": rootfs, "readonly": readonly},
        "hostname": hostname[:63],
        "mounts": [*_base_mounts(), *mounts],
        "linux": {"namespaces": namespaces, "maskedPaths": MASKED, "readonlyPaths": READONLY},
    }


def pod_container(pod: dict, image_cfg: dict, rootfs: str, ip: str, objects: dict, hosts: Path,
                  work: Path, cid: str, container: Optional[dict] = None, volumes: Optional[Path] = None) -> Container:
    """A crun bundle under `work` for the pod's container, or `container` (one of its init
    containers), not started; its volumes under `volumes` (default `work`/volumes: give an init
    container the pod container's, so that they share emptyDirs)."""
    spec = pod["spec"]
    if container is None:
        (c,) = spec["containers"]
    else:
        c = container
    sc, csc = spec.get("securityContext") or {}, c.get("securityContext") or {}
    assert not (csc.get("capabilities") or {}).get("add"), "added capabilities are not modelled"
    work.mkdir(parents=True, exist_ok=True)
    termination = work / "termination-log"
    termination.write_bytes(b"")
    termination.chmod(0o666)
    uid, gid = csc.get("runAsUser", sc.get("runAsUser")), csc.get("runAsGroup", sc.get("runAsGroup"))
    argv = [*(c.get("command") or image_cfg.get("Entrypoint") or []), *(c.get("args") or image_cfg.get("Cmd") or [])]
    mounts = [*volume_mounts(pod, c, objects, volumes or work / "volumes"),
              {"destination": "/etc/hosts", "type": "bind", "source": str(hosts), "options": ["rbind", "ro"]},
              {"destination": c.get("terminationMessagePath", "/dev/termination-log"), "type": "bind",
               "source": str(termination), "options": ["rbind", "rw"]}]
    config = oci_config(argv, cwd=c.get("workingDir") or image_cfg.get("WorkingDir") or "/",
                        env=container_env(pod, c, image_cfg.get("Env") or [], ip), rootfs=rootfs,
                        user=(uid, gid, [sc["fsGroup"]] if "fsGroup" in sc else []), caps=[],
                        no_new_privs=csc.get("allowPrivilegeEscalation") is False,
                        readonly=bool(csc.get("readOnlyRootFilesystem")),
                        hostname=spec.get("hostname") or pod["metadata"]["name"], mounts=mounts)
    (work / "config.json").write_text(json.dumps(config, indent=1))
    return Container(cid, work, work / "container.log", termination)


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a map (Uid, Gid, CapEff, NoNewPrivs, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out
