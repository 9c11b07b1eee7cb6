"""What a kubelet does for a pod: the local cluster's node agent (real API server,
`nodeagent.py`) runs every pod with it (tests/unit/test_localcluster_pods.py checks it on a node
whose API server is a dict). Every Pod runs as a local process started from its spec
(`Node.launch`; the node agent's `--runtime=crun` runs a container from the pod's image
instead: crunruntime.py).

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

Split by concern: containers.py (a container as a process group, its record and its kill),
podinputs.py (volumes and env), probes.py (readiness), this module (the pod's lifecycle, its
mount namespace, and the `Node` base). The node (`Node` subclass) supplies the API calls, the
pod's sandbox (its IP and network namespace) and the files every pod gets (/etc/hosts,
/etc/resolv.conf).

Init containers run to completion, in order, each in its own mount namespace with its own
volume mounts, before the pod's container (one that fails runs again after a back-off).

Not supported: several containers per pod (the first runs; sidecars are ignored), image pulls,
liveness/startup/exec probes, envFrom, ConfigMap updates reaching a running pod, resource
limits (cgroups).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import aiohttp

from .containers import Incarnation, PodStartError, iso, kill_group, processes_in_groups, reap, stop_container
from .podinputs import PodInputs, _expand
from .probes import Probes

log = logging.getLogger("tianji.localcluster.pods")

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


# ----------------------------------------------------------------- one pod
class PodWorker(PodInputs, Probes):
    """The kubelet's worker for one pod (by uid): sandbox, volumes, container starts, probes,
    restarts, status, graceful termination."""

    def __init__(self, kubelet: Node, pod: dict):
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
        for i, (src, _dst, _ro) in enumerate(binds):
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

    async def _run_init_containers(self, policy: str) -> bool:
        """Each init container to completion, in order, before the pod's container (the kubelet's
        rule): one that fails runs again after a back-off, or, under restartPolicy Never, fails the
        pod. False: the pod failed or was deleted first."""
        inits = self.spec.get("initContainers") or []
        if not inits:
            return True
        main, backoff = self.container, self.kubelet.backoff_base
        statuses = self.status["initContainerStatuses"] = [
            {"name": c.get("name", f"init-{i}"), "image": c.get("image", ""), "imageID": "", "ready": False,
             "started": False, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}},
             "lastState": {}} for i, c in enumerate(inits)]
        self._condition("Initialized", False)
        await self._write_status()
        try:
            for self.container, cs in zip(inits, statuses):
                restart = 0
                while not cs["ready"]:
                    if self.deleting.is_set():
                        return False
                    try:
                        inc = await self._start(restart)
                    except PodStartError as e:
                        cs["state"] = {"waiting": {"reason": e.reason, "message": e.message}}
                        await self._write_status()
                        await self._wait_or_deleted(1.0)
                        continue
                    cs.update(state={"running": {"startedAt": iso(inc.started)}}, started=True, restartCount=restart)
                    await self._write_status()
                    await self._run_container(inc)
                    self.kubelet.event(self, "Exited", f"init container {inc.container} exit code {inc.exit_code}")
                    cs.update(state={"terminated": self._terminated(inc)}, started=False, ready=inc.exit_code == 0)
                    if cs["ready"]:
                        break
                    if policy == "Never" or self.deleting.is_set():
                        return False
                    cs["lastState"] = {"terminated": cs["state"]["terminated"]}
                    cs["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                               "message": f"back-off {backoff:g}s restarting failed container"}}
                    await self._write_status()
                    await self._wait_or_deleted(backoff)
                    backoff, restart = min(backoff * 2, self.kubelet.backoff_max), restart + 1
        finally:
            self.container = main
        self._condition("Initialized", True)
        return True

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
        initialized = await self._run_init_containers(policy)
        while initialized and not self.deleting.is_set():
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
        """May this node run the pod? False: it is gone."""
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
            kill_group(pgid, signal.SIGKILL)
        # SIGKILL is delivered at once, but a process takes a moment to exit (its command line
        # already empty): stop returns when the groups are empty, as a kubelet's teardown does.
        deadline = time.monotonic() + 5.0
        while processes_in_groups(set(self.pgids)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
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
