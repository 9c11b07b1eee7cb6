"""Host-network port blocks across jobs: which node ports each host-network job takes.

Under `spec.network.hostNetwork` a pod binds on its node's IP, so two jobs whose pods land
on one node must not share a port. tianji.control.contracts.addressing lays one job's ports out from
(basePort, metricsPort): `slots = groups x buffers` blocks of PORT_BLOCK data ports, then
METRICS_BLOCK metrics ports per slot. Here each job gets one contiguous block of
`(PORT_BLOCK + METRICS_BLOCK) x slots` ports:

    basePort    = block start                          data ports: PORT_BLOCK x slots
    metricsPort = block start + PORT_BLOCK x slots     metrics ports: METRICS_BLOCK x slots

taken first-fit from the operator's range (chart value `hostNetwork.portRange`), unless
the job pinned its ports (network.basePort or network.metricsPort not the default): then its own
ports are checked against every other job's block. Pure functions: the operator records
the block in the job's status (an operator restart keeps it) and writes it into the
planned job that the pods read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from tianji.control.contracts.addressing import METRICS_BLOCK, PORT_BLOCK, host_port_ranges

DEFAULT_PORT_RANGE = "20000-29999"  # below the NodePort range (30000-32767) and the ephemeral ports


HOST_PORT_REASONS = ("HostPortConflict", "HostPortRangeExhausted")


class HostPortError(ValueError):
    """A host-network job cannot have ports: `reason` is the status/Event reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def parse_port_range(text: str) -> range:
    """`"20000-29999"` -> range(20000, 30000); both ends within 1024-65535."""
    try:
        lo, hi = (int(x) for x in str(text).split("-"))
    except ValueError:
        raise ValueError(f"host port range {text!r}: expected FIRST-LAST, e.g. {DEFAULT_PORT_RANGE}") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"host port range {text!r}: need 1024 <= FIRST <= LAST <= 65535")
    return range(lo, hi + 1)


def _span(r: range) -> str:
    return f"{r.start}-{r.stop - 1}"


@dataclass(frozen=True)
class PortBlock:
    """The node ports of one host-network job (addressing.py's layout from these two ports)."""

    base_port: int
    metrics_port: int
    slots: int  # groups x buffers
    pinned: bool = False  # the job's own ports, not allocated

    @property
    def ranges(self) -> tuple[range, range]:
        """(data ports, metrics ports); slots = groups x buffers, as one group of `slots` buffers."""
        return host_port_ranges(self.base_port, self.metrics_port, 1, self.slots)

    def overlaps(self, other: PortBlock) -> bool:
        return any(a.start < b.stop and b.start < a.stop for a in self.ranges for b in other.ranges)

    def describe(self) -> str:
        data, metrics = self.ranges
        return f"data ports {_span(data)}, metrics ports {_span(metrics)}"

    def to_status(self) -> dict:
        data, metrics = self.ranges
        return {
            "basePort": self.base_port,
            "metricsPort": self.metrics_port,
            "slots": self.slots,
            "dataPorts": _span(data),
            "metricsPorts": _span(metrics),
            "pinned": self.pinned,
        }

    @classmethod
    def from_status(cls, d: Mapping) -> Optional[PortBlock]:
        """status.hostPorts back (None when absent or unreadable: hand-edited)."""
        try:
            block = cls(int(d["basePort"]), int(d["metricsPort"]), int(d["slots"]), bool(d.get("pinned", False)))
        except (KeyError, TypeError, ValueError):
            return None
        return block if block.slots >= 1 else None


def slots_of(job) -> int:
    t = job.spec.topology
    return t.groups * t.buffers


def is_pinned(network) -> bool:
    """The job chose its ports: network.basePort or network.metricsPort is not the default.
    (Set or not cannot be told apart: the apiserver writes the CRD schema's defaults into
    the stored spec, so the defaults themselves mean "allocate".)"""
    fields = type(network).model_fields
    return network.base_port != fields["base_port"].default or network.metrics_port != fields["metrics_port"].default


def block_of(job, pinned: bool) -> PortBlock:
    """The block a planned job's own network fields describe."""
    net = job.spec.network
    return PortBlock(net.base_port, net.metrics_port, slots_of(job), pinned)


def allocate(slots: int, port_range: range, taken: Mapping[str, PortBlock]) -> PortBlock:
    """The lowest free block of `slots` slots in `port_range` (first fit), else HostPortError."""
    size = (PORT_BLOCK + METRICS_BLOCK) * slots
    spans = sorted((r.start, r.stop) for b in taken.values() for r in b.ranges)
    start = port_range.start
    for lo, hi in spans:
        if start + size <= lo:
            break
        start = max(start, hi)
    if start + size > port_range.stop:
        raise HostPortError(
            "HostPortRangeExhausted",
            f"hostNetwork: no free block of {size} ports ({slots} slot(s) x "
            f"{PORT_BLOCK + METRICS_BLOCK}) in the operator's range {_span(port_range)}: "
            f"{len(taken)} other host-network job(s) hold blocks; delete one, or widen the chart "
            "value hostNetwork.portRange",
        )
    return PortBlock(start, start + PORT_BLOCK * slots, slots)


def assign(
    planned, requested_network, taken: Mapping[str, PortBlock], port_range: range, recorded: Optional[PortBlock] = None
) -> PortBlock:
    """The block of a host-network job: the one recorded in its status (for as many slots), else its pinned ports
    (refused if they overlap another job's block), else a free block of `port_range`.
    `planned`: the job as planned (its topology fixed); `requested_network`: the spec as
    written (to tell pinned ports from defaults); `taken`: the other jobs' blocks by name."""
    if recorded is not None and recorded.slots == slots_of(planned):
        return recorded
    if is_pinned(requested_network):
        mine = block_of(planned, True)
        clash = sorted(name for name, b in taken.items() if mine.overlaps(b))
        if clash:
            raise HostPortError(
                "HostPortConflict",
                f"hostNetwork: the job's ports ({mine.describe()}) overlap those of "
                f"{', '.join(clash)}; their pods could not share a node: choose other "
                "network.basePort/metricsPort, or leave both unset for the operator to allocate",
            )
        return mine
    return allocate(slots_of(planned), port_range, taken)


def with_block(manifest: dict, block: PortBlock) -> dict:
    """A job manifest (a dict) whose network ports are `block`'s."""
    net = manifest["spec"].setdefault("network", {})
    net["basePort"], net["metricsPort"] = block.base_port, block.metrics_port
    return manifest
