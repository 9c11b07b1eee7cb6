"""Host-network jobs sharing nodes: each gets its own block of node ports (tianji.control.contracts.ports),
kept in status across operator restarts; a clash or an exhausted range fails the job once."""
from __future__ import annotations

import asyncio

import pytest
import yaml

from kube.operator_harness import NAMESPACE, RunningOperator, children, cond, eventually, job_manifest, status
from tianji.cli import build_parser
from tianji.control.contracts.addressing import METRICS_BLOCK, PORT_BLOCK
from tianji.control.contracts.ports import HostPortError, PortBlock, allocate, assign, parse_port_range
from tianji.control.spec import parse_job

BLOCK = PORT_BLOCK + METRICS_BLOCK  # ports of one slot (groups x buffers = 1 below)
RANGE = f"21000-{21000 + 2 * BLOCK - 1}"  # room for exactly two one-slot jobs
HOSTNET = {"network": {"hostNetwork": True}}


# ----------------------------------------------------------------- the pure choice
def test_allocation_is_first_fit_and_never_overlaps():
    r = parse_port_range("20000-20099")
    a = allocate(2, r, {})
    assert (a.base_port, a.metrics_port) == (20000, 20000 + 2 * PORT_BLOCK)
    b = allocate(3, r, {"a": a})
    assert b.base_port == 20000 + 2 * BLOCK and not a.overlaps(b)
    c = allocate(1, r, {"b": b})  # a's place is free again: the hole is reused
    assert c.base_port == 20000 and not c.overlaps(b)
    with pytest.raises(HostPortError, match="no free block of 88 ports") as e:
        allocate(11, r, {"a": a})  # 16 + 88 > 100
    assert e.value.reason == "HostPortRangeExhausted"
    assert PortBlock.from_status(b.to_status()) == b
    assert PortBlock.from_status({"basePort": "x"}) is None
    with pytest.raises(ValueError, match="FIRST <= LAST"):
        parse_port_range("30000-2000")


def test_pinned_ports_are_kept_or_refused_naming_the_other_job():
    job = parse_job(job_manifest("p", {"network": {"hostNetwork": True, "basePort": 21003, "metricsPort": 23000}}))
    other = PortBlock(21000, 21005, 1)
    with pytest.raises(HostPortError, match=r"overlap those of ns/other") as e:
        assign(job, job.spec.network, {"ns/other": other}, parse_port_range(RANGE))
    assert e.value.reason == "HostPortConflict"
    got = assign(job, job.spec.network, {"ns/far": PortBlock(22000, 22005, 1)}, parse_port_range(RANGE))
    assert (got.base_port, got.metrics_port, got.pinned) == (21003, 23000, True)
    default = parse_job(job_manifest("d", HOSTNET))  # default ports are not pinned: allocated
    assert assign(default, default.spec.network, {}, parse_port_range(RANGE)).base_port == 21000
    kept = PortBlock(21008, 21013, 1)  # recorded in status: kept, if it has the job's slot count
    assert assign(default, default.spec.network, {}, parse_port_range(RANGE), kept) == kept
    assert assign(default, default.spec.network, {}, parse_port_range(RANGE),
                  PortBlock(21008, 21018, 2)).base_port == 21000


# ----------------------------------------------------------------- the operator
def pod_ports(kube, name: str) -> dict[str, list[dict]]:
    """Container ports of the job's pods and actor pod templates, as stored (defaults applied)."""
    out = {}
    for (kind, obj), o in children(kube, name).items():
        if kind == "Pod":
            out[obj] = o["spec"]["containers"][0]
        elif kind == "StatefulSet":
            out[obj] = o["spec"]["template"]["spec"]["containers"][0]
    return out


async def planned(kube, name: str) -> dict:
    await eventually(lambda: status(kube, name).get("hostPorts") and len(pod_ports(kube, name)) == 3,
                     what=f"{name} planned with host ports")
    return status(kube, name)["hostPorts"]


def assert_pods_use(kube, name: str, block: dict) -> set[int]:
    """Every port of the job's pods lies in its block, and the
    workers read the block: the ConfigMap's job and the --metrics-port argument."""
    data = range(block["basePort"], block["basePort"] + PORT_BLOCK * block["slots"])
    metrics = range(block["metricsPort"], block["metricsPort"] + METRICS_BLOCK * block["slots"])
    cm = children(kube, name)["ConfigMap", f"{name}-job"]
    net = yaml.safe_load(cm["data"]["job.yaml"])["spec"]["network"]
    assert (net["basePort"], net["metricsPort"]) == (block["basePort"], block["metricsPort"])
    used = set()
    for pod, c in pod_ports(kube, name).items():
        args = build_parser().parse_args([*c["command"][1:], *c["args"]])
        for p in c["ports"]:
            # On a host-network pod the apiserver makes hostPort = containerPort (SetDefaults_Pod).
            assert p.get("hostPort", p["containerPort"]) == p["containerPort"]
            assert p["containerPort"] in (metrics if p["name"] == "metrics" else data), (pod, p, block)
            used.add(p["containerPort"])
        assert args.metrics_port in metrics
    return used


async def test_two_host_network_jobs_get_disjoint_blocks_kept_across_a_restart(kube):
    async with RunningOperator(kube, host_port_range=RANGE):
        await kube.create_job(job_manifest("a", HOSTNET))
        await kube.create_job(job_manifest("b", HOSTNET))
        blocks = {n: await planned(kube, n) for n in ("a", "b")}
    ports = {n: assert_pods_use(kube, n, blocks[n]) for n in blocks}
    assert not ports["a"] & ports["b"]
    assert {blocks["a"]["basePort"], blocks["b"]["basePort"]} == {21000, 21000 + BLOCK}
    assert blocks["a"]["dataPorts"] == f"{blocks['a']['basePort']}-{blocks['a']['basePort'] + PORT_BLOCK - 1}"

    # A new operator: the blocks stay; a third job finds the range full; a lost ConfigMap
    # comes back with the job's ports.
    async with RunningOperator(kube, host_port_range=RANGE, expected_refusals=("HostPortRangeExhausted",)):
        await kube.create_job(job_manifest("c", HOSTNET))
        await eventually(lambda: (cond(kube, "Failed", "c") or {}).get("status") == "True", what="c failed")
        await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/configmaps/a-job")
        await eventually(lambda: ("ConfigMap", "a-job") in children(kube, "a"), what="a's ConfigMap back")
        await asyncio.sleep(0.5)  # monitor ticks (0.1 s): nothing is retried
    assert {n: status(kube, n)["hostPorts"] for n in blocks} == blocks
    assert_pods_use(kube, "a", blocks["a"])
    failed = cond(kube, "Failed", "c")
    assert failed["reason"] == "HostPortRangeExhausted" and "hostNetwork.portRange" in failed["message"]
    assert status(kube, "c")["phase"] == "Failed" and "hostPorts" not in status(kube, "c")
    assert not children(kube, "c")
    warned = [e for e in kube.live("v1/events", NAMESPACE) if e.get("reason") == "HostPortRangeExhausted"]
    assert len(warned) == 1 and warned[0]["type"] == "Warning"

    # Restarted with room to spare, the operator leaves c's end as it was.
    async with RunningOperator(kube, host_port_range="21000-21999") as op:
        await eventually(lambda: op.metrics.value("tianji_operator_reconciles_total", handler="resume",
                                                  result="KeptFailed") == 1, what="c resumed", timeout=20)
    assert status(kube, "c")["phase"] == "Failed" and not children(kube, "c")


async def test_pinned_ports_that_clash_fail_the_job_once(kube):
    async with RunningOperator(kube, host_port_range=RANGE, expected_refusals=("HostPortConflict",)):
        await kube.create_job(job_manifest("a", HOSTNET))
        block = await planned(kube, "a")
        clash = {"network": {"hostNetwork": True, "basePort": block["basePort"] + 2, "metricsPort": 9090}}
        await kube.create_job(job_manifest("pinned", clash))
        await eventually(lambda: (cond(kube, "Failed", "pinned") or {}).get("status") == "True", what="refused")
        await kube.create_job(job_manifest("apart", {"network": {"hostNetwork": True, "basePort": 24000}}))
        apart = await planned(kube, "apart")
        await asyncio.sleep(0.5)
    failed = cond(kube, "Failed", "pinned")
    assert failed["reason"] == "HostPortConflict" and f"{NAMESPACE}/a" in failed["message"]
    assert not children(kube, "pinned")
    assert len([e for e in kube.live("v1/events", NAMESPACE) if e.get("reason") == "HostPortConflict"]) == 1
    assert (apart["basePort"], apart["metricsPort"], apart["pinned"]) == (24000, 9090, True)
    assert_pods_use(kube, "apart", apart)


async def test_pod_network_jobs_keep_their_fixed_ports(kube):
    async with RunningOperator(kube, host_port_range=RANGE):
        await kube.create_job(job_manifest("plain"))
        await eventually(lambda: status(kube, "plain").get("plan") and len(pod_ports(kube, "plain")) == 3,
                         what="planned")
    assert "hostPorts" not in status(kube, "plain")
    c = pod_ports(kube, "plain")["plain-buffer-0-0"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"fragments": 5550, "credits": 5551,
                                                                   "metrics": 9090}
    assert all("hostPort" not in p for p in c["ports"])
