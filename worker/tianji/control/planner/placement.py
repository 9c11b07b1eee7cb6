"""Where a plan's processes go on K nodes, and which link each kind of traffic crosses.

Processes are packed first-fit decreasing into the nodes (`pack`). A group placed whole on one
node (`place`: groups packed as units) keeps its fragments, batches and parameter broadcast on
that node's loopback; only the traffic between groups (groupSync allreduce: the gradient
all-reduce of all g·n_l ranks; average: the asynchronous averaging bytes) crosses the link
between nodes, and only when the groups sit on more than one node. A group that fits no node
whole spans nodes and all its traffic pays that link (also when the node sizes are unknown:
an explicit topology without resources.cpusPerNode).

The link between nodes is spec.network.link when set, else the one `tianji profile
--link-measure` measured between two hosts (Profile.measured_link), else ethernet-10g
(costmodel.link_for). An explicit spec.network.link is what every process talks over, on one
node too (the user says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tianji.control.planner import costmodel
from tianji.control.planner.costmodel import LinkModel

_EPS = 1e-9


@dataclass(frozen=True)
class Links:
    """The links one prediction charges: within a group, between groups, and the one the
    profile's all-reduce was measured on (loopback)."""

    group: LinkModel
    sync: LinkModel
    measured: LinkModel


def pack(items: list[tuple[float, int, int]], node_cpus: list[float], node_gpus: list[int]) -> Optional[int]:
    """First-fit decreasing of (cpu, gpu, count) classes into nodes: the number of nodes used,
    or None if they do not all fit."""
    free_c, free_g = list(node_cpus), list(node_gpus)
    for cpu, gpu, count in sorted(items, key=lambda t: (-t[1], -t[0])):
        left = count
        for i in range(len(free_c)):
            if left == 0:
                break
            k = int((free_c[i] + _EPS) // cpu) if cpu > 0 else left
            if gpu:
                k = min(k, free_g[i] // gpu)
            k = min(k, left)
            free_c[i] -= k * cpu
            free_g[i] -= k * gpu
            left -= k
        if left:
            return None
    return sum(1 for c, c0, gp, g0 in zip(free_c, node_cpus, free_g, node_gpus) if c < c0 - _EPS or gp < g0)


def process_items(g: int, na: int, nb: int, nl: int, ca: float, cb: float, cl: float, gl: int) -> list:
    return [(cl, gl, g * nl), (ca, 0, g * na), (cb, 0, g * nb)]


def max_packable(
    na: int, nb: int, g: int, ca: float, cb: float, cl: float, gl: int, node_cpus: list[float], node_gpus: list[int]
) -> Optional[int]:
    """Largest n ≤ na (n ≥ nb) actors per group whose processes pack onto the nodes, or None."""

    def fits(n: int) -> bool:
        return pack(process_items(g, n, nb, 1, ca, cb, cl, gl), node_cpus, node_gpus) is not None

    if fits(na):
        return na
    lo, hi = nb, na - 1
    if lo > hi or not fits(lo):
        return None
    while lo < hi:  # invariant: fits(lo)
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def links_for(
    job,
    profile,
    node_cpus: Optional[list[float]],
    node_gpus: Optional[list[int]],
    g: int,
    na: int,
    nb: int,
    nl: int,
    ca: float,
    cb: float,
    cl: float,
    gl: int,
) -> Links:
    """The links of one topology on len(node_cpus) nodes (module docstring). node_cpus None: K =
    resources.nodes of unknown size, every group assumed to span them."""
    s = job.spec
    nodes = len(node_cpus) if node_cpus is not None else s.resources.nodes
    loopback = costmodel.link_for(None, 1, profile.ipc_bytes_per_second)
    cross = costmodel.link_for(s.network.link, nodes, profile.ipc_bytes_per_second, profile.measured_link())
    if s.network.link is not None or nodes <= 1:
        return Links(cross, cross, loopback)
    if node_cpus is None:
        return Links(cross, cross, loopback)
    group = (na * ca + nb * cb + nl * cl, nl * gl, g)
    used = pack([group], node_cpus, node_gpus or [0] * len(node_cpus))
    if used is None:  # a group spans nodes
        return Links(cross, cross, loopback)
    return Links(loopback, loopback if used <= 1 else cross, loopback)


def one_host_links(job, profile) -> Links:
    """Every process on one machine (`tianji run`): loopback, or the spec's explicit link."""
    loopback = costmodel.link_for(None, 1, profile.ipc_bytes_per_second)
    link = costmodel.link_for(job.spec.network.link, 1, profile.ipc_bytes_per_second)
    return Links(link, link, loopback)
