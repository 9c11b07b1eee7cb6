"""Where each role's sockets live: one naming scheme for both engines.

Stable endpoints (the receivers of sender-initiated pushes and the parameter
publisher) bind; everybody else connects. Locally the endpoints are ipc://
files under the run directory; on Kubernetes they are tcp ports on the stable
DNS names that the job's headless Service gives learner and buffer pods.

Ports (offsets from `spec.network.basePort`):
  buffer  : fragments PULL (+0), credits PULL (+1)
  learner : batches PULL (+2), params PUB (+3); learner 0 of group 0 also hosts the
            torch.distributed rendezvous (+4) when a job has several learners
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROLES = ("actor", "buffer", "learner")

PORTS = {"fragments": 0, "credits": 1, "batches": 2, "params": 3}
OWNER = {"fragments": "buffer", "credits": "buffer", "batches": "learner", "params": "learner"}
DIST_PORT_OFFSET = 4
LAST_PORT_OFFSET = max(*PORTS.values(), DIST_PORT_OFFSET)  # basePort..basePort+LAST_PORT_OFFSET are taken


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

    @classmethod
    def from_env(cls, job: str, base_port: int, run_dir: Optional[str]) -> "Addresses":
        if run_dir:
            return cls(job, base_port, Path(run_dir))
        return cls(job, base_port, None, os.environ.get("TIANJI_NAMESPACE"), os.environ.get("TIANJI_POD_IP") or "*")

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
        return f"tcp://{self.bind_host}:{self.base_port + PORTS[channel]}"

    def connect(self, channel: str, group: int, index: int) -> str:
        owner = self._check(channel)
        if self.run_dir is not None:
            return f"ipc://{self.ipc_path(channel, group, index)}"
        host = f"{pod_name(self.job, owner, group, index)}.{service_name(self.job)}"
        if self.namespace:
            host += f".{self.namespace}.svc"
        return f"tcp://{host}:{self.base_port + PORTS[channel]}"


def sock_dir(run_dir: Optional[Path]) -> Path:
    """ipc socket folder: TIANJI_SOCK_DIR (set by the launcher when the run dir path is too
    long for a unix socket's 107 bytes), else <run_dir>/sock."""
    env = os.environ.get("TIANJI_SOCK_DIR")
    if env:
        return Path(env)
    if run_dir is None:
        raise ValueError("local engine needs a run dir")
    return Path(run_dir) / "sock"


def dist_init_method(addrs: "Addresses") -> str:
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
    return f"tcp://{host}:{addrs.base_port + DIST_PORT_OFFSET}"


def index_from_hostname(hostname: Optional[str] = None) -> int:
    """A StatefulSet pod's ordinal: `cartpole-actor-0-3` → 3."""
    hostname = hostname or os.environ.get("HOSTNAME", "")
    tail = hostname.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise ValueError(f"cannot derive an index from hostname {hostname!r}; pass --index")
    return int(tail)
