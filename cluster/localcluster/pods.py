"""What a kubelet does for a pod, shared by the local cluster's node agent (real API server,
`nodeagent.py`) and the tests' emulator kubelet (tests/kube/kubelet.py): every Pod runs as a
local process started from its spec (`Node.launch`; the node agent's `--runtime=crun` runs a
container from the pod's image instead: crunruntime.py).

* container: `command` + `args` (the "image" is this host's Python: there is no ENTRYPOINT,
  `command` is required), env with `$(VAR)` expansion and the downward API (`fieldRef`,
  `resourceFieldRef`, `configMapKeyRef`), HOSTNAME and a UTS namespace with the pod's hostname;
* volumes mounted at their `mountPath` in the process's own mount namespace (`unshare --mount
  --uts`, then `mount --bind`): configMap and secret (items or every key; modes), emptyDir
  (medium Memory: under /dev/shm), hostPath, and whatever the node adds (`Node.volume_source`:
  the agent's projected service-account volumes); `readOnly` and `subPath` are honoured;
* `terminationMessagePath`: a file per container incarnation; its first 4096 bytes become
  `state.terminated.message`;
* status: phase Pending -> Running -> Succeeded/Failed from the exit code and `restartPolicy`,
  restartCount, CrashLoopBackOff back-off (doubling up to a cap, reset after 10 minutes of
  running), conditions; readinessProbe httpGet and tcpSocket with their timing fields;
* graceful deletion: SIGTERM to the container's process group, SIGKILL after the grace
  period, terminal phase, then the node removes the object. The process group plays the
  container's cgroup: when the main process exits, whatever is left in it is SIGKILLed.

The node (`Node` subclass) supplies the API calls, the pod's sandbox (its IP and network
namespace) and the files every pod gets (/etc/hosts, /etc/resolv.conf).

Not supported: several containers per pod (the first runs; init containers and sidecars are
ignored), image pulls, liveness/startup/exec probes, envFrom, ConfigMap updates reaching a
running pod, resource limits (cgroups).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp

log = logging.getLogger("tianji.localcluster.pods")

TERMINATION_MESSAGE_MAX = 4096  # bytes the kubelet keeps of a termination message
BACKOFF_RESET_S = 600.0  # a container that ran this long restarts without back-off
IMAGE_ENV_KEYS = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "LC_ALL")
STAGE = "/mnt/.tianji-kubelet-stage"  # a pod's mount sources, seen before any of its mounts hide them
REPO = Path(__file__).resolve().parents[2]


def unavailable_reason() -> Optional[str]:
    """Why pods cannot run as processes on this machine (None: they can): it needs root and
    unshare(1) able to make mount and UTS namespaces."""
    if os.geteuid() != 0:
        return "running pods as processes needs root (per-pod mount namespaces and bind mounts)"
    exe = shutil.which("unshare")
    if exe is None:
        return "running pods as processes needs unshare(1) (util-linux)"
    import subprocess

    probe = subprocess.run([exe, "--mount", "--uts", "--propagation", "private", "--", "true"],
                           capture_output=True, timeout=10)
    if probe.returncode != 0:
        return f"unshare --mount --uts failed here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def _project(target: Path, data: dict[str, bytes], src: dict, what: str) -> Path:
    """A configMap or secret volume: its items (or every key) as files, with their modes."""
    target.mkdir(parents=True, exist_ok=True)
    for it in src.get("items") or [{"key": k, "path": k} for k in sorted(data)]:
        if it["key"] not in data:
            if src.get("optional"):
                continue
            raise PodStartError("CreateContainerConfigError", f'{what} has no key "{it["key"]}"')
        path = target / it["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[it["key"]])
        os.chmod(path, int(it.get("mode", src.get("defaultMode", 0o644))))
    return target


def _under(path: str, top: str) -> bool:
    return Path(path) == Path(top) or Path(top) in Path(path).parents


def _image_paths(env: dict[str, str], workdir: str) -> list[str]:
    """Host paths a pod's process runs from, outermost first (nested ones need no own mount)."""
    want = {str(REPO), str(Path(sys.prefix).resolve()), workdir,
            *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)}
    out: list[str] = []
    for p in sorted(want, key=lambda x: len(Path(x).parts)):
        if Path(p).exists() and not any(_under(p, q) for q in out):
            out.append(p)
    return out


def iso(ts: Optional[float] = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if ts is None else ts, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


class PodStartError(RuntimeError):
    """The container cannot be created from this spec (reported as a waiting reason)."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


# ----------------------------------------------------------------- records
@dataclass
class Incarnation:
    """One start of one container: what ran, where its output and termination message went."""

    namespace: str
    pod: str
    uid: str
    container: str
    restart_count: int
    labels: dict
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    termination_path: Path
    pid: int = 0
    started: float = 0.0
    finished: Optional[float] = None
    exit_code: Optional[int] = None
    signals: list[str] = field(default_factory=list)  # what the kubelet sent (SIGTERM, SIGKILL)
    proc: Any = field(default=None, repr=False)
    runtime: Any = field(default=None, repr=False)  # a container runtime's handle (kill, finish); None: a process group

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def pod_dir(self) -> Path:
        """The pod's folder on the node: logs/, termination/, volumes/ (emptyDirs on disk, ConfigMaps)."""
        return self.log_path.parent.parent

    def termination_message(self) -> str:
        """What the kubelet puts in state.terminated.message: the file's first 4096 bytes."""
        try:
            with open(self.termination_path, "rb") as f:
                return f.read(TERMINATION_MESSAGE_MAX).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def final_report(self) -> Optional[dict]:
        """The termination message as JSON (the worker's final report), or None."""
        text = self.termination_message().strip()
        if not text:
            return None
        try:
            out = json.loads(text)
        except ValueError:
            return None
        return out if isinstance(out, dict) else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])




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


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pgid_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[2])


def processes_in_groups(pgids: set[int]) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose process group is in `pgids`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if _pgid_of(pid) in pgids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state == "Z":
                    continue  # exited; only waiting to be reaped
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out.append((pid, cmd))
    return out


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal(inc: Incarnation, sig: int) -> bool:
    """Signal the container: its process group, or through its runtime (crun kill)."""
    return inc.runtime.kill(sig) if inc.runtime is not None else _killpg(inc.pid, sig)


async def reap(inc: Incarnation) -> int:
    """Wait for the container's main process; then SIGKILL whatever is left in its process group
    (the container's cgroup goes with it: no stragglers)."""
    rc = await inc.proc.wait()
    _signal(inc, signal.SIGKILL)
    if inc.runtime is not None:
        await asyncio.to_thread(inc.runtime.finish)
    if inc.exit_code is None:
        inc.exit_code, inc.finished = _exit_code(rc), time.time()
    return inc.exit_code


async def stop_container(inc: Incarnation, grace: float) -> int:
    """SIGTERM the container's process group, SIGKILL it after `grace` seconds (the kubelet's kill)."""
    if inc.exit_code is not None:
        return inc.exit_code
    if inc.proc.returncode is None and _signal(inc, signal.SIGTERM):
        inc.signals.append("SIGTERM")
    try:
        await asyncio.wait_for(asyncio.shield(inc.proc.wait()), max(grace, 0.0))
    except asyncio.TimeoutError:
        if _signal(inc, signal.SIGKILL):
            inc.signals.append("SIGKILL")
    return await reap(inc)


# ----------------------------------------------------------------- one pod
class PodWorker:
    """The kubelet's worker for one pod (by uid): sandbox, volumes, container starts, probes,
    restarts, status, graceful termination."""

    def __init__(self, kubelet: "Node", pod: dict):
        self.kubelet = kubelet
        meta = pod["metadata"]
        self.pod = pod
        self.uid, self.name, self.namespace = meta["uid"], meta["name"], meta.get("namespace")
        self.labels = dict(meta.get("labels") or {})
        self.spec = pod.get("spec") or {}
        self.container = (self.spec.get("containers") or [{}])[0]
        self.dir = kubelet.root / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.deleting = asyncio.Event()
        self.gone = False  # the object vanished (forced delete): no status writes, no removal
        self.ip: Optional[str] = None
        self.status: dict = {}
        self.current: Optional[Incarnation] = None
        self.incarnations: list[Incarnation] = []
        self.task: Optional[asyncio.Task] = None
        self.shm_dirs: list[Path] = []
        self.sandbox_ns: Optional[str] = None  # the pod's own network namespace, if the node made one

    # ------------------------------------------------------------ inputs from the sync loop
    def observe(self, pod: Optional[dict]) -> None:
        if pod is None:
            self.gone = True
            self.deleting.set()
            return
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.deleting.set()

    @property
    def hostname(self) -> str:
        return self.spec.get("hostname") or self.name

    def grace_period(self) -> float:
        if self.gone:
            return self.kubelet.force_grace
        meta = self.pod["metadata"]
        g = meta.get("deletionGracePeriodSeconds")
        if g is None:
            g = self.spec.get("terminationGracePeriodSeconds", 30)
        return float(g)

    # ------------------------------------------------------------ API calls (the node's)
    async def _write_status(self) -> None:
        if not self.gone:
            await self.kubelet.write_status(self)

    async def _remove(self) -> None:
        """The last step of graceful deletion: DELETE with a grace period of 0."""
        if not self.gone:
            await self.kubelet.remove(self)

    # ------------------------------------------------------------ status pieces
    def _condition(self, ctype: str, ok: bool) -> None:
        conds = self.status.setdefault("conditions", [])
        want = "True" if ok else "False"
        for c in conds:
            if c["type"] == ctype:
                if c["status"] != want:
                    c.update(status=want, lastTransitionTime=iso())
                return
        conds.append({"type": ctype, "status": want, "lastProbeTime": None, "lastTransitionTime": iso()})

    def _set_ready(self, ready: bool) -> None:
        cs = self.status["containerStatuses"][0]
        cs["ready"] = ready
        self._condition("ContainersReady", ready)
        self._condition("Ready", ready)

    def _qos(self) -> str:
        res = self.container.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if not req and not lim:
            return "BestEffort"
        if all(k in lim and (req.get(k, lim[k]) == lim[k]) for k in ("cpu", "memory")):
            return "Guaranteed"
        return "Burstable"

    def _initial_status(self) -> None:
        c = self.container
        self.status = {
            "phase": "Pending",
            "hostIP": self.kubelet.host_ip, "hostIPs": [{"ip": self.kubelet.host_ip}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "startTime": iso(),
            "qosClass": self._qos(),
            "conditions": [],
            "containerStatuses": [{
                "name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
                "ready": False, "started": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {},
            }],
        }
        for ctype, ok in (("PodReadyToStartContainers", True), ("Initialized", True), ("Ready", False),
                          ("ContainersReady", False), ("PodScheduled", True)):
            self._condition(ctype, ok)

    # ------------------------------------------------------------ volumes and env
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
            data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
            return _project(target, data, src, f'configmap "{src["name"]}"')
        if "secret" in vol:
            src = vol["secret"]
            secret = await self.kubelet.read("secrets", self.namespace, src["secretName"])
            if secret is None:
                raise PodStartError("ContainerCreating", f'MountVolume.SetUp failed for volume "{name}": '
                                    f'secret "{src["secretName"]}" not found')
            data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            return _project(self.dir / "volumes" / "secret" / name, data, src, f'secret "{src["secretName"]}"')
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

    # ------------------------------------------------------------ the container
    def _argv(self, mounts: list[tuple[Path, str, bool]], termination: Path, env: dict[str, str]) -> list[str]:
        command = self.container.get("command")
        if not command:
            raise PodStartError("CreateContainerConfigError",
                                "no command: the emulated image has no ENTRYPOINT")
        cmd = [_expand(str(a), env) for a in [*command, *(self.container.get("args") or [])]]
        script = ["set -e"]
        binds = [*mounts, *self.kubelet.sandbox_files(self)]
        tpath = self.container.get("terminationMessagePath", "/dev/termination-log")
        if tpath:
            binds.append((termination, tpath, False))
        # Every source is first bound into a private staging tmpfs, then the targets are mounted
        # from there, parents first: a mount over a directory that holds other sources (an
        # emptyDir at /tmp, where the test's files live) cannot hide them.
        Node.ensure_mount_point(STAGE, directory=True)
        script.append(f"mount -t tmpfs tianji-stage {STAGE}")
        for i, (src, dst, ro) in enumerate(binds):
            stage = f"{STAGE}/{i}"
            script.append(f"mkdir {stage}" if src.is_dir() else f"touch {stage}")
            script.append(f"mount --bind {shlex.quote(str(src))} {stage}")
        workdir = self.container.get("workingDir") or str(self.dir / "rootfs")
        Path(workdir).mkdir(parents=True, exist_ok=True)
        # The "image" is this machine: keep what the process runs from (the checkout, the venv,
        # PYTHONPATH, its working dir) visible where a volume is mounted over an ancestor of it.
        hidden = [k for k in _image_paths(env, workdir) if any(_under(k, dst) for _, dst, _ in binds)]
        for j, keep in enumerate(hidden):
            script.append(f"mkdir {STAGE}/keep{j} && mount --bind {shlex.quote(keep)} {STAGE}/keep{j}")
        for i, (src, dst, ro) in sorted(enumerate(binds), key=lambda b: len(Path(b[1][1]).parts)):
            Node.ensure_mount_point(dst, directory=src.is_dir())
            script.append(f"mount --bind {STAGE}/{i} {shlex.quote(dst)}")
            if ro:
                script.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")
        for j, keep in enumerate(hidden):
            script.append(f"mkdir -p {shlex.quote(keep)} && mount --bind {STAGE}/keep{j} {shlex.quote(keep)}")
        script.append(f"echo {shlex.quote(self.hostname[:64])} > /proc/sys/kernel/hostname")
        script.append(f"cd {shlex.quote(workdir)}")
        script.append('exec "$@"')
        return [*self.kubelet.sandbox_prefix(self), "unshare", "--mount", "--uts", "--propagation", "private",
                "--", "sh", "-c", "\n".join(script), "container", *cmd]

    async def _start(self, restart: int) -> Incarnation:
        cname = self.container.get("name", "main")
        env = await self._env()
        mounts = await self._mounts()
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / "termination").mkdir(parents=True, exist_ok=True)
        termination = self.dir / "termination" / f"{cname}-{restart}"
        termination.write_bytes(b"")
        inc = Incarnation(self.namespace, self.name, self.uid, cname, restart, dict(self.labels),
                          argv=[], env=env, log_path=self.dir / "logs" / f"{cname}-{restart}.log",
                          termination_path=termination)
        await self.kubelet.launch(self, inc, mounts)
        inc.pid, inc.started = inc.proc.pid, time.time()
        self.kubelet.pgids.add(inc.pid)
        self.kubelet.incarnations.append(inc)
        self.incarnations.append(inc)
        self.current = inc
        return inc

    async def _run_container(self, inc: Incarnation) -> int:
        """Wait for the process to exit, or for the pod's deletion (then stop it)."""
        exited = asyncio.ensure_future(asyncio.shield(inc.proc.wait()))
        deleted = asyncio.ensure_future(self.deleting.wait())
        probe = asyncio.ensure_future(self._probe_loop(inc))
        try:
            await asyncio.wait({exited, deleted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            probe.cancel()
            deleted.cancel()
            exited.cancel()
            await asyncio.gather(probe, deleted, exited, return_exceptions=True)
        if inc.proc.returncode is None:
            self.kubelet.event(self, "Killing", f"stopping container {inc.container} (grace {self.grace_period():g}s)")
            return await stop_container(inc, self.grace_period())
        return await reap(inc)

    # ------------------------------------------------------------ probes
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

    # ------------------------------------------------------------ lifecycle
    def _terminated(self, inc: Incarnation) -> dict:
        t = {"exitCode": inc.exit_code, "reason": "Completed" if inc.exit_code == 0 else "Error",
             "startedAt": iso(inc.started), "finishedAt": iso(inc.finished),
             "containerID": f"local://{inc.pid}"}
        if inc.exit_code and inc.exit_code > 128:
            t["signal"] = inc.exit_code - 128
        msg = inc.termination_message()
        if msg:
            t["message"] = msg
        return t

    async def _wait_or_deleted(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), seconds)

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave a process behind or hang the test
            log.exception("kubelet: pod %s/%s", self.namespace, self.name)
            self.kubelet.errors.append(f"{self.namespace}/{self.name}: {type(e).__name__}: {e}")
        finally:  # cancelled (the kubelet stops) or failed: the container goes too
            if self.current is not None and self.current.running:
                await asyncio.shield(stop_container(self.current, self.kubelet.teardown_grace))
            with contextlib.suppress(Exception):
                await asyncio.shield(self.kubelet.release_sandbox(self))
            self.kubelet.pods_changed()

    async def _run(self) -> None:
        if self.deleting.is_set() or not await self.kubelet.admit(self):
            return
        self.ip = await self.kubelet.sandbox(self)
        self.kubelet.event(self, "Scheduled", f"on {self.kubelet.node_name}, IP {self.ip}")
        self._initial_status()
        await self._write_status()
        self.kubelet.pods_changed()
        policy = self.spec.get("restartPolicy", "Always")
        restart, backoff = 0, self.kubelet.backoff_base
        cs = self.status["containerStatuses"][0]
        while not self.deleting.is_set():
            try:
                inc = await self._start(restart)
            except PodStartError as e:
                cs["state"] = {"waiting": {"reason": e.reason, "message": e.message}}
                await self._write_status()
                await self._wait_or_deleted(1.0)  # the kubelet retries the pod's sync
                continue
            self.kubelet.event(self, "Started", f"container {inc.container} #{restart}, pid {inc.pid}")
            cs.update(state={"running": {"startedAt": iso(inc.started)}}, started=True,
                      containerID=f"local://{inc.pid}", restartCount=restart)
            self.status["phase"] = "Running"
            await self._write_status()
            await self._run_container(inc)
            self.kubelet.event(self, "Exited", f"pid {inc.pid} exit code {inc.exit_code}, signals {inc.signals}")
            cs.update(state={"terminated": self._terminated(inc)}, started=False)
            self._set_ready(False)
            if self.deleting.is_set() or not (policy == "Always" or (policy == "OnFailure" and inc.exit_code != 0)):
                break
            if inc.finished - inc.started >= BACKOFF_RESET_S:
                backoff = self.kubelet.backoff_base
            cs["lastState"] = {"terminated": cs["state"]["terminated"]}
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                       f"back-off {backoff:g}s restarting failed container={cs['name']} "
                                       f"pod={self.name}_{self.namespace}({self.uid})"}}
            await self._write_status()
            self.kubelet.event(self, "BackOff", f"back-off {backoff:g}s restarting failed container")
            await self._wait_or_deleted(backoff)
            backoff = min(backoff * 2, self.kubelet.backoff_max)
            restart += 1
        # Terminal: by exit code when the container stopped for good; on deletion too (Kubernetes
        # >= 1.27 moves a deleted pod to a terminal phase before the object goes).
        last = self.current
        if last is None:  # deleted before its container ever started
            self.status["phase"] = "Failed"
            cs["state"] = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": iso(),
                                          "message": "The container could not be located when the pod was deleted."}}
        else:
            self.status["phase"] = "Succeeded" if last.exit_code == 0 else "Failed"
        await self._write_status()
        self.kubelet.pods_changed()
        self.kubelet.event(self, self.status["phase"], "")
        await self.deleting.wait()  # a finished pod stays (with its status) until it is deleted
        await self._remove()
        for d in self.shm_dirs:  # memory-backed emptyDirs go with the pod (those on disk stay, for tests)
            shutil.rmtree(d, ignore_errors=True)
        self.kubelet.event(self, "Removed", "deleted with grace period 0" if not self.gone else "object gone")


# ----------------------------------------------------------------- the node
class Node:
    """What every node gives its pods: bookkeeping, teardown and the hooks a subclass fills."""

    _ids = 0

    def __init__(self, root: Path, *, node_name: str, host_ip: str, backoff_base: float = 10.0,
                 backoff_max: float = 300.0, probe_period_cap: Optional[float] = None, force_grace: float = 2.0,
                 image_env: Optional[dict[str, str]] = None):
        Node._ids += 1
        self.id = f"{os.getpid()}-{Node._ids}"
        self.root = Path(root)
        self.node_name = node_name
        self.host_ip = host_ip
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.probe_period_cap = probe_period_cap
        self.force_grace = force_grace
        self.teardown_grace = 0.0  # SIGTERM -> SIGKILL delay for a container whose pod worker fails
        # The "image": this host's Python, with the variables an image's ENV would set.
        self.image_env = image_env if image_env is not None else {
            "HOME": "/root", **{k: os.environ[k] for k in IMAGE_ENV_KEYS if k in os.environ}}
        self.shm_root = Path("/dev/shm") / f"tianji-kubelet-{self.id}"  # emptyDirs of medium Memory
        self.workers: dict[str, PodWorker] = {}
        self.incarnations: list[Incarnation] = []
        self.pgids: set[int] = set()
        self.errors: list[str] = []
        self.events: list[tuple[float, str, str, str]] = []  # (time, namespace/pod, reason, message)
        self.http: Optional[aiohttp.ClientSession] = None

    # ------------------------------------------------------------ hooks
    async def admit(self, worker: PodWorker) -> bool:
        """May this node run the pod (the emulator binds it here)? False: it is gone."""
        return True

    async def sandbox(self, worker: PodWorker) -> str:
        """Make the pod's sandbox; returns its IP."""
        raise NotImplementedError

    async def release_sandbox(self, worker: PodWorker) -> None:
        """Undo `sandbox` once the pod's container is gone."""

    def sandbox_prefix(self, worker: PodWorker) -> list[str]:
        """argv words that put the container's process into the sandbox (e.g. nsenter)."""
        return []

    def sandbox_files(self, worker: PodWorker) -> list[tuple[Path, str, bool]]:
        """(host file, path in the container, read-only) every container of the pod gets."""
        return []

    def pod_env(self, worker: PodWorker) -> dict[str, str]:
        """Variables the node sets in every container (before the container's own env)."""
        return {}

    async def volume_source(self, worker: PodWorker, vol: dict) -> Optional[Path]:
        """A volume kind this node provides (projected, ...); None: not one of them."""
        return None

    async def base_env(self, worker: PodWorker) -> dict[str, str]:
        """The image's variables, under everything else (here: this host's Python's)."""
        return self.image_env

    async def launch(self, worker: PodWorker, inc: Incarnation, mounts: list[tuple[Path, str, bool]]) -> None:
        """Start the container (sets `inc.proc`): here a process in a mount and UTS namespace of
        its own (a container runtime overrides this; crunruntime.py)."""
        inc.argv = worker._argv(mounts, inc.termination_path, inc.env)
        with open(inc.log_path, "ab") as logf:
            inc.proc = await asyncio.create_subprocess_exec(
                *inc.argv, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                env=inc.env, start_new_session=True)

    async def read(self, resource: str, namespace: str, name: str) -> Optional[dict]:
        """A ConfigMap or Secret (`resource` configmaps|secrets) the pod refers to; None if absent."""
        raise NotImplementedError

    async def write_status(self, worker: PodWorker) -> None:
        raise NotImplementedError

    async def remove(self, worker: PodWorker) -> None:
        raise NotImplementedError

    def pods_changed(self) -> None:
        """A pod got or lost its IP, readiness or phase."""

    # ------------------------------------------------------------ teardown
    async def stop_pods(self, grace: float = 5.0) -> None:
        """SIGTERM every container, SIGKILL what is left after `grace` seconds."""
        workers = list(self.workers.values())
        self.teardown_grace = grace
        for w in workers:  # each worker stops its container as it is cancelled
            if w.task is not None:
                w.task.cancel()
        await asyncio.gather(*(w.task for w in workers if w.task is not None), return_exceptions=True)
        running = [i for i in self.incarnations if i.running]
        await asyncio.gather(*(stop_container(inc, 0) for inc in running), return_exceptions=True)
        for pgid in self.pgids:
            _killpg(pgid, signal.SIGKILL)
        shutil.rmtree(self.shm_root, ignore_errors=True)

    def start_worker(self, pod: dict) -> PodWorker:
        w = self.workers[pod["metadata"]["uid"]] = PodWorker(self, pod)
        w.task = asyncio.create_task(w.run(), name=f"pod {pod['metadata']['name']}")
        return w

    # ------------------------------------------------------------ for tests
    @staticmethod
    def ensure_mount_point(path: str, directory: bool) -> None:
        """Bind mounts need an existing target: create it on the host (a directory or an empty file)."""
        p = Path(path)
        if directory:
            p.mkdir(parents=True, exist_ok=True)
        elif not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()

    def pod_incarnations(self, name: Optional[str] = None, labels: Optional[dict] = None) -> list[Incarnation]:
        """Container starts, oldest first, of the pod `name` and/or of pods with these labels."""
        return [i for i in self.incarnations if (name is None or i.pod == name)
                and all(i.labels.get(k) == v for k, v in (labels or {}).items())]

    def running(self) -> list[Incarnation]:
        return [i for i in self.incarnations if i.running]

    def leftover_processes(self) -> list[tuple[int, str]]:
        """Live processes in any process group this node started (should be none after stop)."""
        return processes_in_groups(set(self.pgids))

    def event(self, worker: PodWorker, reason: str, message: str = "") -> None:
        """What `kubectl get events` would show for the pod (kept here)."""
        self.events.append((time.time(), f"{worker.namespace}/{worker.name}", reason, message))

    def log_tails(self, lines: int = 25) -> str:
        out = ["----- kubelet events"]
        t0 = self.events[0][0] if self.events else 0.0
        out += [f"{t - t0:8.2f}s {pod} {reason} {msg}" for t, pod, reason, msg in self.events]
        for inc in self.incarnations:
            state = "running" if inc.running else f"exit {inc.exit_code}"
            out.append(f"----- {inc.namespace}/{inc.pod} #{inc.restart_count} pid {inc.pid} ({state}; "
                       f"signals {inc.signals}) {inc.log_path}\n{inc.log_tail(lines)}")
        if self.errors:
            out.append("----- kubelet errors\n" + "\n".join(self.errors))
        return "\n".join(out)
