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
    OMP_WAIT_POLICY     PASSIVE where the learners' threads outnumber the host's cores
                        (`omp_wait_policy`; the user's own setting wins)
  pods only
    TIANJI_NAMESPACE    downward API metadata.namespace: peers' DNS names
    TIANJI_POD_IP       downward API status.podIP: data ports and /metrics bind here,
                        not on every interface (host networking shares the node's);
                        /metrics also on 127.0.0.1, where `kubectl port-forward` connects
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
    TIANJI_CURVE_KEYS   the pod's CurveZMQ keyring file: its role's Secret (learner, buffer,
                        evaluator), or, for an actor, its own key pair, which the pod's init
                        container `tianji actor-key` derives from the job's actor seed into a
                        memory-backed volume; only that init container mounts the seed
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
CURVE_DIR = "/etc/tianji-curve"  # pods: the process's keyring is here (see runtime/security.py)
CURVE_FILE = "curve.json"
ROLE_KEYED = ("learner", "buffer", "evaluator")  # pods: one CURVE identity (Secret) per role
SEEDED_ROLES = ("learner", "buffer")  # pods whose keyring holds the actor seed (they admit actors)
ISSUER_DIR = "/etc/tianji-curve-issuer"  # actor pods: the actor seed, mounted into the init container only
ISSUER_FILE = "issuer.json"
ACTOR_KEY_INIT = "actor-key"  # that init container's name, and the `tianji` subcommand it runs


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


def omp_wait_policy(job, host_cores: int) -> Optional[str]:
    """OMP_WAIT_POLICY for one host's workers: PASSIVE where the learners' torch threads together
    outnumber its cores, else None (OpenMP's default: spin, then sleep). A spinning thread assumes
    a core of its own; without one it burns the core that the thread it waits for needs. CartPole
    PPO with 2-thread learners on 2 cores (bench/omp_wait.py, medians): 2 groups of 3 actors
    consume 669 samples/s spinning, 10,467 under this rule; 1 group of 2 actors 7,042 under this
    rule (spinning), 4,951 passive."""
    t = job.spec.topology
    return "PASSIVE" if t.groups * t.learners * torch_threads(job, "learner") > host_cores else None


@dataclass(frozen=True)
class WorkerLaunch:
    """What starts one role process: `command + args`, `env`, and (pods) downward-API variables."""

    command: list[str]
    args: list[str]
    env: dict[str, str]
    field_env: dict[str, str] = field(default_factory=dict)  # name -> fieldPath (pods only)
    volumes: list = field(default_factory=list)  # pods only: what the container mounts, besides the job's own
    volume_mounts: list = field(default_factory=list)
    init: Optional[dict] = None  # pods only: an init container (name, command, args, field_env, volume_mounts)

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
    host_cores: Optional[int] = None,
) -> WorkerLaunch:
    """The one way a role process is described. `index` is an int, or "auto" (a StatefulSet
    pod's ordinal, from its hostname)."""
    args = ["--role", role, "--group", str(group), "--index", str(index), "--job", job_file]
    env = {"OMP_NUM_THREADS": str(torch_threads(job, role)), "GLIBC_TUNABLES": MALLOC_TUNABLES, "PYTHONUNBUFFERED": "1"}
    field_env: dict[str, str] = {}
    volumes: list = []
    mounts: list = []
    init = None
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
        policy = omp_wait_policy(job, host_cores) if host_cores else None
        if policy:
            env["OMP_WAIT_POLICY"] = policy
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
        if job.spec.network.encryption == "curve":  # operator: builders.curve_secrets
            env[ENV_CURVE_KEYS] = f"{CURVE_DIR}/{CURVE_FILE}"
            mounts.append({"name": "curve", "mountPath": CURVE_DIR, "readOnly": True})
            if role == "actor":
                volumes += actor_key_volumes(job.name)
                init = actor_key_init(command or WORKER_COMMAND, group, index, field_env)
            else:
                volumes.append(_secret_volume("curve", curve_secret_name(job.name, role), CURVE_FILE))
    else:
        raise ValueError(f"unknown engine {engine!r}")
    if metrics_port:
        args += ["--metrics-port", str(metrics_port)]
    if dist_init:
        env[ENV_DIST_INIT] = dist_init
    return WorkerLaunch(list(command or WORKER_COMMAND), args, env, field_env, volumes, mounts, init)


def sibling_command(command: list[str], sub: str) -> list[str]:
    """`tianji SUB` from the same installation as `command` (the workers' `tianji worker`)."""
    return [*command[:-1], sub] if command and command[-1] == "worker" else ["tianji", sub]


def _secret_volume(name: str, secret: str, key: str) -> dict:
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o400, "items": [{"key": key, "path": key}]}}


def actor_key_volumes(job: str) -> list[dict]:
    """An actor pod's key volumes: the job's actor issuer (the seed; its init container's only) and
    the memory-backed volume its own keyring is written to (the worker's, read-only)."""
    return [
        _secret_volume("curve-issuer", curve_secret_name(job, "actor"), ISSUER_FILE),
        {"name": "curve", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]


def actor_key_init(command: list[str], group: int, index: Union[int, str], field_env: dict[str, str]) -> dict:
    """The init container that derives the actor's own keyring (`tianji actor-key`): it alone
    mounts the seed, so the worker, where user env code runs, holds one actor's key and no other."""
    return {
        "name": ACTOR_KEY_INIT,
        "command": sibling_command(command, ACTOR_KEY_INIT),
        "args": [
            "--group",
            str(group),
            "--index",
            str(index),
            "--issuer",
            f"{ISSUER_DIR}/{ISSUER_FILE}",
            "--out",
            f"{CURVE_DIR}/{CURVE_FILE}",
        ],
        "field_env": {k: field_env[k] for k in (ENV_POD_NAME, ENV_INDEX) if k in field_env},
        "volume_mounts": [
            {"name": "curve-issuer", "mountPath": ISSUER_DIR, "readOnly": True},
            {"name": "curve", "mountPath": CURVE_DIR},
        ],
    }


def curve_secret_name(job: str, role: str) -> str:
    """The Secret holding one role's CurveZMQ keyring (mounted only into that role's pods), or,
    for "actor", the actor issuer (mounted only into actor pods' init containers)."""
    return f"{job}-curve-{role}"
