"""Host-network port blocks, applied: which blocks other jobs hold, and this job's block.

The choice itself is tianji.control.contracts.ports (pure). Here: the other jobs' blocks come from
their status.hostPorts (what the operator recorded, kept across restarts), from the
pinned ports of jobs not yet recorded, and from blocks this process handed out whose
status write has not landed yet (`Operator.host_ports`). One lock per operator makes
two jobs created at once take turns.
"""

from __future__ import annotations

from typing import Any, Optional

from tianji.control.contracts.ports import PortBlock, assign, block_of, is_pinned, parse_port_range
from tianji.control.spec import SpecError, TianJiJob, parse_job

from .. import status as st
from ..context import Operator, manifest_of
from ..kube import ApiError


def key(ns: Optional[str], name: str) -> str:
    return f"{ns}/{name}" if ns else name


async def _jobs(op: Operator, ns: Optional[str]) -> list[dict]:
    """Every TianJiJob the operator may read: all namespaces (pods of jobs in different
    namespaces share nodes), else (namespaced RBAC) the job's own."""
    try:
        return await op.kube.list("TianJiJob", None)
    except ApiError as e:
        if e.status != 403:
            raise
        return await op.kube.list("TianJiJob", ns)


def _held(body: dict) -> Optional[PortBlock]:
    """The block another job holds: recorded in its status, else its pinned ports (topology fixed)."""
    s = body.get("status") or {}
    if s.get("hostPorts"):
        return PortBlock.from_status(s["hostPorts"])
    try:
        job = parse_job(manifest_of(body), "TianJiJob")
    except SpecError:
        return None
    net = job.spec.network
    if not net.host_network or job.spec.topology.auto or not is_pinned(net) or s.get("phase") in st.TERMINAL:
        return None
    return block_of(job, True)


async def taken_blocks(op: Operator, ns: Optional[str], name: str) -> dict[str, PortBlock]:
    me = key(ns, name)
    out = {k: b for k, b in op.host_ports.items() if k != me}
    for body in await _jobs(op, ns):
        meta = body["metadata"]
        k = key(meta.get("namespace"), meta["name"])
        if k == me or meta.get("deletionTimestamp"):
            continue
        held = _held(body)
        if held is not None:
            out[k] = held
    return out


async def job_block(
    op: Operator, ns: Optional[str], name: str, planned: TianJiJob, requested: TianJiJob, recorded: Optional[dict]
) -> PortBlock:
    """This job's block (tianji.control.contracts.ports.assign); HostPortError when it cannot have one."""
    async with op.host_ports_lock:
        block = assign(
            planned,
            requested.spec.network,
            await taken_blocks(op, ns, name),
            parse_port_range(op.config.host_port_range),
            PortBlock.from_status(recorded) if recorded else None,
        )
        op.host_ports[key(ns, name)] = block
        return block


def release(op: Operator, ns: Optional[str], name: str) -> None:
    op.host_ports.pop(key(ns, name), None)


def recorded_block(body: Any) -> Optional[dict]:
    return (body.get("status") or {}).get("hostPorts") or None
