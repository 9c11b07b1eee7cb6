"""What a TianJiJob runs on: resources, the plan's budget rule, links, network, autoscaling."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tianji.control.contracts.addressing import LAST_PORT_OFFSET
from tianji.control.contracts.curvekeys import ACTOR_ORDINALS
from tianji.control.spec.base import (
    EXTENDED_RESOURCE_PATTERN,
    MIN_CPU,
    MIN_MEMORY,
    QUANTITY_PATTERN,
    _Model,
    quantity_value,
)


class RoleResources(_Model):
    cpu: float = Field(1.0, ge=MIN_CPU, description="cores requested per process (at least 0.001: one millicore)")
    memory: str = Field(
        "1Gi",
        json_schema_extra={"pattern": QUANTITY_PATTERN},
        description=f"a Kubernetes quantity, e.g. 512Mi or 2Gi; at least {MIN_MEMORY}",
    )
    gpu: int = Field(0, ge=0, le=16, description="GPUs per process of the role (learners use them)")
    threads: Optional[int] = Field(None, ge=1, le=256, description="torch threads (default: floor(cpu), >=1)")

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if quantity_value(v) < quantity_value(MIN_MEMORY):
            raise ValueError(f"{v!r} is below the minimum of {MIN_MEMORY} (a unit missing?)")
        return v


def _learner_resources() -> RoleResources:
    return RoleResources(cpu=1.0, memory="2Gi")


class Resources(_Model):
    cpus: Optional[float] = Field(None, gt=0, description="total cores the planner may use (M)")
    gpus: int = Field(0, ge=0, description="planner budget: GPUs for the whole job")
    nodes: int = Field(1, ge=1, description="planner budget: nodes the job may span")
    cpus_per_node: Optional[float] = Field(
        None, gt=0, description="planner budget: cores per node (default: cpus / nodes)"
    )
    actor: RoleResources = Field(default_factory=RoleResources, description="each actor process or pod")
    buffer: RoleResources = Field(
        default_factory=lambda: RoleResources(cpu=0.5, memory="1Gi"), description="each buffer process or pod"
    )
    learner: RoleResources = Field(default_factory=_learner_resources, description="each learner process or pod")
    evaluator: RoleResources = Field(
        default_factory=lambda: RoleResources(cpu=0.5, memory="1Gi"),
        description="the evaluator process (only with spec.evaluation)",
    )


class PlanConfig(_Model):
    """The planner's budget rule (tianji.control.planner.objective)."""

    min_marginal_gain: float = Field(
        0.5,
        ge=0,
        le=1,
        description="topology: auto sizes the job no bigger than its predicted progress pays for: a plan using k "
        "times the resources (cores/M + GPUs/G) of a smaller one must predict at least k^x its "
        "effective progress (samples/s discounted by batch growth and policy lag; time to target is "
        "its inverse). 0.5 (default): doubling must buy at least 41 % more; 0: the most progress the "
        "budget buys; 1: the most per core",
    )


class Link(_Model):
    """The network between the job's processes, for the planner's communication terms:
    a named preset, or bandwidth and latency (tianji.control.planner.costmodel.LINK_PRESETS)."""

    preset: Optional[Literal["loopback", "ethernet-10g", "infiniband-hdr"]] = Field(
        None,
        description="loopback: one machine (the profile's measured message cost); ethernet-10g; "
        "infiniband-hdr (200 Gb/s)",
    )
    bandwidth_gbps: Optional[float] = Field(None, gt=0, le=100_000, description="per-process link, Gbit/s")
    latency_us: Optional[float] = Field(None, ge=0, le=1_000_000, description="one-way, microseconds")

    @model_validator(mode="after")
    def _one_kind(self) -> Link:
        custom = (self.bandwidth_gbps is not None, self.latency_us is not None)
        if not ((self.preset is not None and not any(custom)) or (self.preset is None and all(custom))):
            raise ValueError("give either preset, or both bandwidthGbps and latencyUs")
        return self


class Network(_Model):
    host_network: bool = Field(
        False,
        description="pods use the node's network namespace (RDMA, no overlay); the "
        "operator gives each job its own node ports",
    )
    rdma: Optional[str] = Field(
        None,
        json_schema_extra={"pattern": EXTENDED_RESOURCE_PATTERN},
        description="RDMA device resource name, e.g. rdma/hca_shared_devices_a",
    )
    base_port: int = Field(
        5550,
        ge=1024,
        le=65535 - LAST_PORT_OFFSET,
        description=f"the data ports are basePort..basePort+{LAST_PORT_OFFSET}",
    )
    encryption: Literal["curve", "none"] = Field(
        "curve",
        description="curve: every socket of the job authenticated and encrypted with the job's own "
        "CurveZMQ key pair; none: plaintext, and anyone who can reach a socket can talk to it",
    )
    metrics_port: int = Field(
        9090,
        ge=1024,
        le=65535,
        description=f"must lie outside basePort..basePort+{LAST_PORT_OFFSET}; with "
        "hostNetwork every pod gets its own ports (docs/kubernetes.md)",
    )
    interface: Optional[str] = Field(
        None,
        json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$"},
        description="hostNetwork only: the node interface whose IPv4 address the data sockets bind on and "
        "peers connect to, e.g. ib0 (ZeroMQ over TCP on IPoIB); unset: the node's IP",
    )
    link: Optional[Link] = Field(
        None,
        description="for the planner; unset: loopback on one node, across nodes "
        "the profile's measured link (tianji profile --link-measure), "
        "else ethernet-10g",
    )

    @field_validator("rdma")
    @classmethod
    def _extended_resource(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not re.fullmatch(EXTENDED_RESOURCE_PATTERN, v) or len(v.split("/")[0]) > 253:
            raise ValueError(
                f"{v!r} is not an extended resource name: expected domain/name, e.g. rdma/hca_shared_devices_a"
            )
        domain = v.split("/")[0]
        if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
            raise ValueError(f"{v!r}: the kubernetes.io domain is reserved for Kubernetes' own resources")
        if v == "nvidia.com/gpu":
            raise ValueError("nvidia.com/gpu is requested by resources.<role>.gpu, not as the RDMA device")
        return v

    @model_validator(mode="after")
    def _interface_needs_host_network(self) -> Network:
        if self.interface is not None:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}", self.interface):
                raise ValueError(f"interface {self.interface!r} is not a network interface name")
            if not self.host_network:
                raise ValueError(
                    "interface needs hostNetwork: true (a pod on the pod network has only its own interface)"
                )
        return self

    @field_validator("metrics_port")
    @classmethod
    def _outside_data_ports(cls, v: int, info: ValidationInfo) -> int:
        base = info.data.get("base_port")  # absent when basePort itself is invalid
        if base is not None and base <= v <= base + LAST_PORT_OFFSET:
            raise ValueError(
                f"{v} is one of the data ports basePort..basePort+{LAST_PORT_OFFSET} ({base}-{base + LAST_PORT_OFFSET})"
            )
        return v


class Autoscale(_Model):
    enabled: bool = Field(False, description="shorthand for mode: planner (when mode is unset)")
    mode: Optional[Literal["planner", "external", "off"]] = Field(
        None,
        description="planner: the operator rescales actors from throughput; external: HPA/KEDA/a person "
        "set actors (the scale subresource or the StatefulSets) and the operator adopts them; "
        "off: topology.actors. Unset: planner if enabled, else off",
    )
    prometheus_url: Optional[str] = Field(
        None, description="must match the operator's allow-list (chart operator.prometheusAllowList)"
    )
    min_actors: int = Field(1, ge=1, description="fewest actors per group the autoscaler sets")
    max_actors: int = Field(64, ge=1, le=ACTOR_ORDINALS, description="most actors per group the autoscaler sets")
    band: float = Field(0.15, ge=0, lt=1, description="hysteresis band on production/consumption")
    cooldown_seconds: float = Field(60.0, ge=0, description="default of both cooldowns below")
    scale_up_cooldown_seconds: Optional[float] = Field(None, ge=0, description="after any change, before adding")
    scale_down_cooldown_seconds: Optional[float] = Field(None, ge=0, description="after any change, before removing")
    interval_seconds: float = Field(15.0, gt=0, description="seconds between the autoscaler's decisions")

    @property
    def effective_mode(self) -> str:
        return self.mode or ("planner" if self.enabled else "off")

    def cooldown(self, direction: str) -> float:
        own = self.scale_up_cooldown_seconds if direction == "up" else self.scale_down_cooldown_seconds
        return self.cooldown_seconds if own is None else own

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.min_actors > self.max_actors:
            raise ValueError(f"minActors ({self.min_actors}) > maxActors ({self.max_actors})")
        return self
