"""The worker image runs a job as the operator writes it: examples/cartpole-ppo.yaml's pods (the
operator's own builders: learner, buffer, the actor StatefulSet's two pods), each a crun container
of the image as uid 10001 with a read-only root filesystem, no capabilities and the pod's
volumes, train CartPole to its stop.meanReturn, counted as the operator counts it (each pod's
/report, StopRule). The same for the user-package image (examples/custom-env built in with
USER_PACKAGE/USER_IMPORTS) and its job, with the spaces declared as docs/custom-envs.md asks."""
from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml

from kube.podnet import ClusterDNS, LoopbackIPAM
from localcluster.ocibundle import crun, pod_container, proc_status
from tianji.control.contracts.accounting import Accounting, StopRule
from tianji.control.contracts.addressing import POD_INDEX_LABEL
from tianji.control.contracts.launch import WORKER_COMMAND
from tianji.control.planner.plan import resolve
from tianji.control.spec import parse_job
from tianji_operator.children import builders as b
from tianji_operator.children.builders import WORKER_UID
from tianji_operator.config import DEFAULT_SCRAPERS
from tianji_operator.timers.podreports import scrape_reports

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 480


REACH_GOAL_SPACES = {"observation": {"shape": [2], "dtype": "float32"}, "action": {"n": 3}}
JOBS = {  # job file, image fixture, env patch
    "cartpole": ("examples/cartpole-ppo.yaml", "worker", {}),
    "reach-goal": ("examples/custom-env/reach-goal-ppo.yaml", "reach_goal", {"spaces": REACH_GOAL_SPACES}),
}


def job_pods(path: str, env_patch: dict) -> tuple[object, list[dict], dict, list[dict]]:
    """(resolved job, pods, {(kind, name): ConfigMap/Secret}, services) for the job file."""
    doc = yaml.safe_load((ROOT / path).read_text())
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["env"].update(env_patch)
    job = parse_job(doc)
    resolved, _plan = resolve(job)
    objs = b.children(resolved, job.spec, {}, scrapers=DEFAULT_SCRAPERS, command=WORKER_COMMAND)
    pods = [o for o in objs if o["kind"] == "Pod"]
    for sts in (o for o in objs if o["kind"] == "StatefulSet"):  # what the StatefulSet controller makes
        for i in range(sts["spec"]["replicas"]):
            pod = copy.deepcopy(sts["spec"]["template"])
            name = f"{sts['metadata']['name']}-{i}"
            pod["metadata"].update(name=name, namespace="default")
            pod["metadata"]["labels"][POD_INDEX_LABEL] = str(i)
            pod["spec"].update(hostname=name, subdomain=sts["spec"]["serviceName"])
            pods.append(pod)
    refs = {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in ("ConfigMap", "Secret")}
    return resolved, pods, refs, [o for o in objs if o["kind"] == "Service"]


def _check_process(c) -> None:
    """The container's process: uid/gid 10001, no capabilities at all, no_new_privs."""
    st = proc_status(c.pid())
    assert st["Uid"].split() == [str(WORKER_UID)] * 4 and st["Gid"].split() == [str(WORKER_UID)] * 4, st
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[cap], 16) == 0, (cap, st[cap])
    assert st["NoNewPrivs"] == "1"
    # The root filesystem is read-only, for root too; the volumes are writable by the worker.
    probe = crun("exec", c.cid, "sh", "-c", "touch /opt/venv/probe", check=False)
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr + probe.stdout, probe
    assert crun("exec", "--user", f"{WORKER_UID}:{WORKER_UID}", c.cid, "sh", "-c",
                "touch /tmp/probe /var/lib/tianji/probe", check=False).returncode == 0


async def _train(resolved, pods: list[dict], containers: dict) -> tuple[str, Accounting]:
    rule, acc, t0, checked = StopRule(resolved.spec.stop), Accounting(), time.monotonic(), False
    name = resolved.metadata.name
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while time.monotonic() - t0 < DEADLINE_S:
            await asyncio.sleep(2)
            ended = {n: c.proc.returncode for n, c in containers.items() if c.proc.poll() is not None}
            assert not ended, f"containers exited: {ended}\n" + "\n".join(
                f"--- {n}\n{containers[n].log_tail()}" for n in ended)
            reports, _errors = await scrape_reports(http, pods, resolved.spec.network.metrics_port, name)
            for rep in reports:
                acc.take(rep)
            if not checked and len(reports) == len(pods):
                for c in containers.values():
                    _check_process(c)
                checked = True
            why = rule.check(acc, time.monotonic() - t0)
            if why:
                assert checked, "stopped before every pod answered"
                return why, acc
    raise AssertionError("no stop condition in time:\n" + "\n".join(
        f"--- {n}\n{c.log_tail()}" for n, c in containers.items()))


@pytest.mark.parametrize("case", sorted(JOBS))
async def test_a_job_trains_in_worker_containers(case, request, tmp_path):
    path, image, env_patch = JOBS[case]
    cfg = request.getfixturevalue(f"{image}_image").config
    rootfs = request.getfixturevalue(f"{image}_rootfs")
    assert cfg["User"] == f"{WORKER_UID}:{WORKER_UID}" and cfg["Entrypoint"] == ["tianji"]
    resolved, pods, refs, services = job_pods(path, env_patch)
    t = resolved.spec.topology
    roles = sorted(p["metadata"]["labels"][b.LABEL_ROLE] for p in pods)
    assert roles == sorted(["actor"] * t.actors + ["buffer"] * t.buffers + ["learner"] * t.learners)
    ipam = LoopbackIPAM()
    for pod in pods:
        pod["status"] = {"podIP": ipam.allocate(), "phase": "Running",
                         "conditions": [{"type": "Ready", "status": "True"}]}
    dns = ClusterDNS(tmp_path / "hosts")
    dns.sync(pods, services)
    run = uuid.uuid4().hex[:6]
    containers = {}
    try:
        for pod in pods:
            n = pod["metadata"]["name"]
            for init in pod["spec"].get("initContainers") or []:  # actors: their own key, first
                ic = pod_container(pod, cfg, rootfs, pod["status"]["podIP"], refs, dns.path, tmp_path / n / "init",
                                   f"tianji-img-{run}-{n}-init", container=init, volumes=tmp_path / n / "volumes")
                code = ic.start().proc.wait(timeout=120)
                ic.stop()
                assert code == 0, ic.log_tail()
            containers[n] = pod_container(pod, cfg, rootfs, pod["status"]["podIP"], refs, dns.path,
                                          tmp_path / n, f"tianji-img-{run}-{n}").start()
        why, acc = await _train(resolved, pods, containers)
    finally:
        codes = {n: c.stop() for n, c in containers.items()}
    assert why == "target", (why, acc.mean_return(), acc.totals())
    assert acc.mean_return() >= resolved.spec.stop.mean_return and acc.policy_version() > 0
    # Stopped as a kubelet stops them: exit 0 on SIGTERM, the final report in the termination log.
    assert codes == {n: 0 for n in containers}, codes
    learner = containers[f"{resolved.metadata.name}-learner-0-0"]
    final = json.loads(learner.termination.read_text())
    assert final["final"] and final["extra"]["version"] >= acc.policy_version() > 0, final
    # Its checkpoint is on the state volume (TIANJI_STATE_DIR), written as uid 10001.
    ckpt = learner.bundle / "volumes" / "state" / "checkpoints" / "0-0" / final["extra"]["checkpoint"]
    assert ckpt.stat().st_uid == WORKER_UID, ckpt
    assert not crun("list").stdout.count(f"tianji-img-{run}"), "containers left behind"
