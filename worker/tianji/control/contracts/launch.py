"""The worker launch contract: how every role process starts, under either engine.

`tianji run` (processes) and the operator (pods) both call `worker_launch()`;
neither builds a worker command or a TIANJI_* variable of its own. A role
process is always `tianji worker ARGS` with this environment:

    OMP_NUM_THREADS     torch intra-op threads (= `torch_threads()`; the worker also
                        calls torch.set_num_threads with it: no oversubscription)
    GLIBC_TUNABLES      malloc tunables for large messages (below)
    PYTHONUNBUFFERED    logs reach the log file / `kubectl logs` as they are written
  local engine only
    TIANJI_SOCK_DIR     the 0700 folder of the run's ipc sockets
    TIANJI_PARENT_PID   the launcher: the worker dies with it (PR_SET_PDEATHSIG)
    TIANJI_CURVE_KEYS_FD  the descriptor the worker inherits its CurveZMQ keyring on (read once,
                        closed; set by the launcher as it starts the process: runtime/security.py)
  pods only
    TIANJI_NAMESPACE    downward API metadata.namespace: peers' DNS names
    TIANJI_POD_IP       downward API status.podIP: data ports and /metrics bind here,
                        not on every interface (host networking shares the node's)
    TIANJI_POD_NAME     downward API metadata.name
    TIANJI_INDEX        `--index auto` (actors): downward API label apps.kubernetes.io/pod-index
                        (the StatefulSet ordinal; never HOSTNAME, the node's name under
                        host networking); older clusters: the ordinal of TIANJI_POD_NAME
    TIANJI_HOST_PORT_SLOTS  host networking: buffers per group, for the per-slot port
                        layout of tianji.control.contracts.addressing (pods sharing a node)
    GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME  spec.network.interface, when set: the learners'
                        torch.distributed traffic on the same interface as ZeroMQ's
    TIANJI_STATE_DIR    checkpoints (a volume)
    HOME, TMPDIR        SCRATCH_DIR (an emptyDir): the root filesystem is read-only
                        (Pod Security "restricted"), so caches (torch, triton, ALE) and
                        temporary files go there
    TIANJI_TERMINATION_LOG  where the worker writes its final report as it exits; the
                        kubelet copies it into the pod status (terminationMessagePath),
                        so counts made after the last scrape are not lost
  both, when the job has several learners
    TIANJI_DIST_INIT    torch.distributed rendezvous (set locally; in pods derived from DNS)
  local engine, learners given a GPU
    TIANJI_DEVICE       the learner's CUDA device, cuda:<k mod visible GPUs> for the k-th learner
                        of the job (`learner_device`): one GPU each while there are enough. Pods
                        never get it: the device plugin exposes only the pod's own GPU
                        (CUDA_VISIBLE_DEVICES), which is cuda:0 there

Malloc: libzmq mallocs every received message; a receiver that holds a
multi-MB message for microseconds makes glibc trim the heap and fault the
pages back in on the next one. Keeping large buffers on the heap brought the
wire from ~0.5 to 0.82-0.99 of raw pyzmq at >= 256 KB (bench/transport.py
--tuned-malloc). glibc reads GLIBC_TUNABLES at process start only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from tianji.control.contracts.addressing import ENV_HOST_PORT_SLOTS, ENV_INDEX, ENV_POD_NAME, POD_INDEX_LABEL

MALLOC_TUNABLES = (
    "glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432:glibc.malloc.top_pad=67108864"
)

WORKER_COMMAND = ["tianji", "worker"]  # the worker image's entry point
CONFIG_DIR = "/etc/tianji"  # pods: the job's ConfigMap is mounted here
JOB_FILE = "job.yaml"
STATE_DIR = "/var/lib/tianji"
SCRATCH_DIR = "/tmp"  # pods: a writable emptyDir under a read-only root filesystem
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
TERMINATION_MESSAGE_MAX = 4096  # bytes the kubelet keeps of it

ENV_NAMESPACE = "TIANJI_NAMESPACE"
ENV_POD_IP = "TIANJI_POD_IP"
ENV_STATE_DIR = "TIANJI_STATE_DIR"
ENV_SOCK_DIR = "TIANJI_SOCK_DIR"
ENV_PARENT_PID = "TIANJI_PARENT_PID"
ENV_DIST_INIT = "TIANJI_DIST_INIT"
ENV_TERMINATION_LOG = "TIANJI_TERMINATION_LOG"
ENV_DEVICE = "TIANJI_DEVICE"
ENV_CURVE_KEYS = "TIANJI_CURVE_KEYS"  # pods: the file of this process's CurveZMQ keyring (runtime/security.py)
ENV_CURVE_KEYS_FD = "TIANJI_CURVE_KEYS_FD"  # local: the inherited descriptor that holds it (never a file)
CURVE_DIR = "/etc/tianji-curve"  # pods: the role's key Secret is mounted here (see runtime/security.py)
CURVE_FILE = "curve.json"
KEYED_ROLES = ("learner", "buffer", "actor", "evaluator")  # pods: one CURVE identity (Secret) per role


def learner_device(job, group: int, index: int, visible_gpus: int) -> Optional[str]:
    """The local learner (group, index)'s device: cuda:<k mod visible_gpus> for the job's k-th learner
    (k = group x learners + index), when the plan gives learners a GPU and one is visible; else None
    (the learner decides: the CPU, with a warning if it was given a GPU)."""
    if job.spec.resources.learner.gpu <= 0 or visible_gpus <= 0:
        return None
    k = group * job.spec.topology.learners + index
    return f"cuda:{k % visible_gpus}"


def torch_threads(job, role: str) -> int:
    """torch threads of one role process: `resources.<role>.threads`, default floor(cpu), >= 1."""
    r = getattr(job.spec.resources, role)
    return r.threads or max(1, math.floor(r.cpu))


@dataclass(frozen=True)
class WorkerLaunch:
    """What starts one role process: `command + args`, `env`, and (pods) downward-API variables."""

    command: list[str]
    args: list[str]
    env: dict[str, str]
    field_env: dict[str, str] = field(default_factory=dict)  # name -> fieldPath (pods only)
    volumes: list = field(default_factory=list)  # pods only: what the container mounts, besides the job's own
    volume_mounts: list = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


def worker_launch(
    job,
    role: str,
    group: int,
    index: Union[int, str],
    *,
    engine: Literal["local", "pod"],
    job_file: str,
    command: Optional[list[str]] = None,
    run_dir: Optional[str] = None,
    report: Optional[str] = None,
    metrics_port: Optional[int] = None,
    sock_dir: Optional[str] = None,
    parent_pid: Optional[int] = None,
    dist_init: Optional[str] = None,
    curve_keys: Optional[str] = None,
    device: Optional[str] = None,
) -> WorkerLaunch:
    """The one way a role process is described. `index` is an int, or "auto" (a StatefulSet
    pod's ordinal, from its hostname)."""
    args = ["--role", role, "--group", str(group), "--index", str(index), "--job", job_file]
    env = {"OMP_NUM_THREADS": str(torch_threads(job, role)), "GLIBC_TUNABLES": MALLOC_TUNABLES, "PYTHONUNBUFFERED": "1"}
    field_env: dict[str, str] = {}
    volumes: list = []
    mounts: list = []
    if engine == "local":
        if run_dir is None or sock_dir is None:
            raise ValueError("a local worker needs run_dir and sock_dir")
        args += ["--run-dir", run_dir]
        env[ENV_SOCK_DIR] = sock_dir
        if parent_pid is not None:
            env[ENV_PARENT_PID] = str(parent_pid)
        if report:
            args += ["--report", report]
        if curve_keys:
            env[ENV_CURVE_KEYS] = curve_keys
        if device:
            env[ENV_DEVICE] = device
    elif engine == "pod":
        field_env = {ENV_NAMESPACE: "metadata.namespace", ENV_POD_IP: "status.podIP", ENV_POD_NAME: "metadata.name"}
        if str(index) == "auto":
            field_env[ENV_INDEX] = f"metadata.labels['{POD_INDEX_LABEL}']"
        if job.spec.network.host_network:
            env[ENV_HOST_PORT_SLOTS] = str(job.spec.topology.buffers)
        env[ENV_STATE_DIR] = STATE_DIR
        env["HOME"] = env["TMPDIR"] = SCRATCH_DIR
        env[ENV_TERMINATION_LOG] = TERMINATION_LOG
        if job.spec.network.interface:  # learners' torch.distributed traffic on the same fabric
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = job.spec.network.interface
        if job.spec.network.encryption == "curve":  # this role's key Secret (operator: builders.curve_secrets)
            env[ENV_CURVE_KEYS] = f"{CURVE_DIR}/{CURVE_FILE}"
            volumes.append(
                {
                    "name": "curve",
                    "secret": {
                        "secretName": curve_secret_name(job.name, role),
                        "defaultMode": 0o400,
                        "items": [{"key": CURVE_FILE, "path": CURVE_FILE}],
                    },
                }
            )
            mounts.append({"name": "curve", "mountPath": CURVE_DIR, "readOnly": True})
    else:
        raise ValueError(f"unknown engine {engine!r}")
    if metrics_port:
        args += ["--metrics-port", str(metrics_port)]
    if dist_init:
        env[ENV_DIST_INIT] = dist_init
    return WorkerLaunch(list(command or WORKER_COMMAND), args, env, field_env, volumes, mounts)


def curve_secret_name(job: str, role: str) -> str:
    """The Secret holding one role's CurveZMQ keyring (mounted only into that role's pods)."""
    return f"{job}-curve-{role}"
