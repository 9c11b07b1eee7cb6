"""Where each role's sockets live: one naming scheme for both engines.

Stable endpoints (the receivers of sender-initiated pushes and the parameter
publisher) bind; everybody else connects. Locally the endpoints are ipc://
files under the run directory; on Kubernetes they are tcp ports on the stable
DNS names that the job's headless Service gives learner and buffer pods.

Ports (offsets from `spec.network.basePort`):
  buffer  : fragments PULL (+0), credits PULL (+1)
  learner : batches PULL (+2), params PUB (+3); learner 0 of group 0 also hosts the
            torch.distributed rendezvous (+4) when a job has several learners

Host networking (`spec.network.hostNetwork`): pods bind on the node's IP, so two
pods on one node must not share a port. Each (group, index) slot then gets its own
block of PORT_BLOCK data ports, `basePort + PORT_BLOCK * (group * buffers + index)`
+ the offset above (buffer i and learner i of a group share a slot: their offsets
differ), and each pod its own metrics port, `metricsPort + METRICS_BLOCK * slot +
{learner 0, buffer 1, actor 2}` (actors of a group share one: the scheduler keeps
pods with the same host port on different nodes). The workers learn `buffers` from
TIANJI_HOST_PORT_SLOTS (set by tianji.control.contracts.launch); without it the ports are fixed.

A StatefulSet pod's index (`--index auto`) comes from TIANJI_INDEX (the downward
API's `apps.kubernetes.io/pod-index` label, Kubernetes >= 1.28) or, on older
clusters, the ordinal at the end of TIANJI_POD_NAME (metadata.name), never from
HOSTNAME: under host networking that is the node's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROLES = ("actor", "buffer", "learner", "evaluator")

PORTS = {"fragments": 0, "credits": 1, "batches": 2, "params": 3}
OWNER = {"fragments": "buffer", "credits": "buffer", "batches": "learner", "params": "learner"}
DIST_PORT_OFFSET = 4
LAST_PORT_OFFSET = max(*PORTS.values(), DIST_PORT_OFFSET)  # basePort..basePort+LAST_PORT_OFFSET are taken
PORT_BLOCK = LAST_PORT_OFFSET + 1  # data ports per slot under host networking
METRICS_BLOCK = 3
# the evaluator (one per job, group 0) binds no data port and takes the actors' metrics port of
# group 0: pods with the same host port go to different nodes, as actors of a group already do
METRICS_OFFSET = {"learner": 0, "buffer": 1, "actor": 2, "evaluator": 2}
ENV_HOST_PORT_SLOTS = "TIANJI_HOST_PORT_SLOTS"
ENV_INDEX = "TIANJI_INDEX"
ENV_POD_NAME = "TIANJI_POD_NAME"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def data_port(base: int, channel: str, group: int, index: int, slots: Optional[int] = None) -> int:
    """The port of `channel` on its owner (group, index); `slots` (buffers per group) under
    host networking, None for the fixed ports of a pod network."""
    if slots is None:
        return base + PORTS[channel]
    return base + PORT_BLOCK * (group * slots + index) + PORTS[channel]


def dist_port(base: int) -> int:
    """torch.distributed rendezvous on learner 0 of group 0 (slot 0 in either layout)."""
    return base + DIST_PORT_OFFSET


def metrics_port(metrics: int, role: str, group: int, index: int, slots: Optional[int] = None) -> int:
    """A pod's metrics port: fixed on a pod network, one per (slot, role) under host networking."""
    if slots is None:
        return metrics
    slot = group * slots + (0 if role in ("actor", "evaluator") else index)
    return metrics + METRICS_BLOCK * slot + METRICS_OFFSET[role]


def host_port_ranges(base: int, metrics: int, groups: int, slots: int) -> tuple[range, range]:
    """(data ports, metrics ports) a host-network job takes on the nodes."""
    n = groups * slots
    return range(base, base + PORT_BLOCK * n), range(metrics, metrics + METRICS_BLOCK * n)


def pod_name(job: str, role: str, group: int, index: int) -> str:
    """Learner/buffer pod name and hostname; actors are `<job>-actor-<g>-<ordinal>` (StatefulSet)."""
    return f"{job}-{role}-{group}-{index}"


def actor_set_name(job: str, group: int) -> str:
    return f"{job}-actor-{group}"


def service_name(job: str) -> str:
    return job


def buffer_for_actor(actor: int, buffers: int) -> int:
    return actor % buffers


def learner_for_buffer(buffer: int, learners: int) -> int:
    return buffer % learners


def learner_for_actor(actor: int, buffers: int, learners: int) -> int:
    return learner_for_buffer(buffer_for_actor(actor, buffers), learners)


@dataclass(frozen=True)
class Addresses:
    """Resolve endpoints for one job. `run_dir` set → local ipc; else Kubernetes DNS + tcp."""

    job: str
    base_port: int = 5550
    run_dir: Optional[Path] = None
    namespace: Optional[str] = None
    bind_host: str = "*"  # pods: TIANJI_POD_IP, so that pods sharing a network never collide
    port_slots: Optional[int] = None  # host networking: buffers per group (TIANJI_HOST_PORT_SLOTS)
    # network.interface: peers' metrics ports (spec.network.metricsPort) answer /fabric with the
    # address to connect to (tianji.control.contracts.fabric); None: connect to the pod's DNS name
    fabric_metrics_port: Optional[int] = None

    @classmethod
    def from_env(cls, job: str, base_port: int, run_dir: Optional[str]) -> Addresses:
        if run_dir:
            return cls(job, base_port, Path(run_dir))
        slots = os.environ.get(ENV_HOST_PORT_SLOTS)
        return cls(
            job,
            base_port,
            None,
            os.environ.get("TIANJI_NAMESPACE"),
            os.environ.get("TIANJI_POD_IP") or "*",
            int(slots) if slots else None,
        )

    def _check(self, channel: str) -> str:
        if channel not in PORTS:
            raise ValueError(f"unknown channel {channel!r}")
        return OWNER[channel]

    def ipc_path(self, channel: str, group: int, index: int) -> Path:
        return sock_dir(self.run_dir) / f"{self._check(channel)}-{group}-{index}-{channel}"

    def bind(self, channel: str, group: int, index: int) -> str:
        if self.run_dir is not None:
            return f"ipc://{self.ipc_path(channel, group, index)}"
        self._check(channel)
        return f"tcp://{self.bind_host}:{data_port(self.base_port, channel, group, index, self.port_slots)}"

    def connect(self, channel: str, group: int, index: int) -> str:
        owner = self._check(channel)
        if self.run_dir is not None:
            return f"ipc://{self.ipc_path(channel, group, index)}"
        host = f"{pod_name(self.job, owner, group, index)}.{service_name(self.job)}"
        if self.namespace:
            host += f".{self.namespace}.svc"
        if self.fabric_metrics_port is not None:  # waits for the peer's metrics port to answer
            from tianji.control.contracts.fabric import fetch_fabric_address

            host = fetch_fabric_address(
                host, metrics_port(self.fabric_metrics_port, owner, group, index, self.port_slots)
            )
        return f"tcp://{host}:{data_port(self.base_port, channel, group, index, self.port_slots)}"


def sock_dir(run_dir: Optional[Path]) -> Path:
    """ipc socket folder: TIANJI_SOCK_DIR (set by the launcher when the run dir path is too
    long for a unix socket's 107 bytes), else <run_dir>/sock."""
    env = os.environ.get("TIANJI_SOCK_DIR")
    if env:
        return Path(env)
    if run_dir is None:
        raise ValueError("local engine needs a run dir")
    return Path(run_dir) / "sock"


def dist_init_method(addrs: Addresses) -> str:
    """torch.distributed rendezvous: TIANJI_DIST_INIT (the local launcher picks a free port),
    else learner 0 of group 0 through the headless Service."""
    env = os.environ.get("TIANJI_DIST_INIT")
    if env:
        return env
    if addrs.run_dir is not None:
        raise ValueError("local engine with several learners needs TIANJI_DIST_INIT (set by tianji run)")
    host = f"{pod_name(addrs.job, 'learner', 0, 0)}.{service_name(addrs.job)}"
    if addrs.namespace:
        host += f".{addrs.namespace}.svc"
    return f"tcp://{host}:{dist_port(addrs.base_port)}"


def auto_index(env: Optional[Mapping[str, str]] = None) -> int:
    """A StatefulSet pod's ordinal (`--index auto`): TIANJI_INDEX (the pod-index label), else
    the ordinal ending TIANJI_POD_NAME (`cartpole-actor-0-3` -> 3). Never HOSTNAME."""
    env = os.environ if env is None else env
    given = (env.get(ENV_INDEX) or "").strip()
    if given:
        if not given.isdigit():
            raise ValueError(f"{ENV_INDEX}={given!r} is not an index")
        return int(given)
    name = env.get(ENV_POD_NAME) or ""
    tail = name.rsplit("-", 1)[-1]
    if not name or not tail.isdigit():
        raise ValueError(
            f"--index auto needs {ENV_INDEX} (downward API label {POD_INDEX_LABEL}) or "
            f"{ENV_POD_NAME} (metadata.name) ending in the ordinal; got {name!r}; pass --index"
        )
    return int(tail)
