"""A whole job in containers on the local cluster: node agents with `--runtime=crun`, the chart
installed with the built operator image, examples/cartpole-ppo.yaml applied with the built worker
image in a Pod Security `restricted` namespace. The job trains to its target, every container
(operator and workers) ran from its image as uid 10001 with no capabilities and no_new_privs, and
the workers, stopped with SIGTERM, left their final reports in their termination files. A pod
whose image is not in storage waits with reason ErrImageNeverPull."""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))  # the cluster tier's helpers

from cluster_jobs import EXAMPLE, JOB, condition, diagnostics, final_reports, pods, status  # noqa: E402
from clusterkit import OPERATOR_NS, RELEASE, free_index, get, helm, install_operator, wait_for  # noqa: E402
from localcluster.cluster import BIN, LocalCluster, missing_programs  # noqa: E402
from localcluster.crunruntime import crun_root  # noqa: E402
from localcluster.ocibundle import crun, proc_status  # noqa: E402
from tianji_operator.children.builders import CONTAINER, WORKER_UID  # noqa: E402

AGENT_ARGS = ("--backoff-base=1", "--backoff-max=10", "--probe-period-cap=1", "--runtime=crun")


@pytest.fixture(scope="module")
def crun_cluster():
    missing = missing_programs()
    if missing:
        pytest.fail(f"missing {', '.join(missing)} in {BIN}: run `make cluster`")
    root = Path(tempfile.mkdtemp(prefix="tianji-cluster-"))
    c = LocalCluster(2, index=free_index(), root=root, agent_args=AGENT_ARGS)
    try:
        c.up()
        yield c
    except BaseException:
        print(c.logs(60))
        raise
    finally:
        c.down()
        shutil.rmtree(root, ignore_errors=True)


def containers(c: LocalCluster) -> dict[str, dict[str, str]]:
    """/proc/PID/status of every running crun container on the cluster's nodes, by container id."""
    out = {}
    for node in c.nodes:
        root = Path(crun_root(node.root))
        for cid in sorted(p.name for p in root.iterdir()) if root.is_dir() else []:
            r = crun("state", cid, check=False, root=str(root))
            pid = json.loads(r.stdout).get("pid") if r.returncode == 0 else None
            try:
                out[cid] = proc_status(pid) if pid else {}
            except FileNotFoundError:  # exited meanwhile
                continue
    return out


def _assert_confined(cid: str, st: dict[str, str]) -> None:
    assert st["Uid"].split() == [str(WORKER_UID)] * 4 and st["Gid"].split() == [str(WORKER_UID)] * 4, (cid, st)
    assert int(st["CapEff"], 16) == 0 and int(st["CapBnd"], 16) == 0 and st["NoNewPrivs"] == "1", (cid, st)


def _image_never_pulled(c: LocalCluster) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "absent", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": "localhost/tianji-absent:none", "command": ["true"]}]}}
    c.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def waiting() -> dict:
        st = (get(c, "pod", "absent", "-n", "default") or {}).get("status") or {}
        state = ((st.get("containerStatuses") or [{}])[0].get("state") or {}).get("waiting") or {}
        return state if state.get("reason") == "ErrImageNeverPull" else {}

    assert "tianji-absent" in wait_for(waiting, 60, "ErrImageNeverPull")["message"]
    c.kubectl("delete", "pod", "absent", "-n", "default", "--wait=false")


@pytest.mark.timeout(1500)
def test_a_job_runs_in_containers_on_the_local_cluster(crun_cluster, worker_image, operator_image):
    c = crun_cluster
    repo, _, tag = operator_image.tag.rpartition(":")
    install_operator(c, None, ("--set", f"image.repository={repo}", "--set", f"image.tag={tag}"))
    seen = containers(c)
    operator = [cid for cid in seen if cid.endswith("-operator-0")]
    assert len(operator) == 1, seen
    _assert_confined(operator[0], seen[operator[0]])

    _image_never_pulled(c)
    ns = "crun-job"
    c.kubectl("create", "namespace", ns)
    c.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["image"] = worker_image.tag
    c.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    workers: dict[str, dict[str, str]] = {}

    def finished():
        workers.update({cid: st for cid, st in containers(c).items() if f"-{CONTAINER}-" in cid and st})
        st = status(c, ns)
        return st.get("phase") in ("Succeeded", "Failed") and st

    st = wait_for(finished, 900, f"job {ns}/{JOB} to finish", interval=2.0, on_timeout=lambda: diagnostics(c, ns))
    assert st["phase"] == "Succeeded" and condition(st, "Succeeded")["reason"] == "StopConditionReached", (
        st, diagnostics(c, ns))
    assert st["meanReturn"] >= 475, st
    # learner, buffer and both actors were seen running, each confined as its securityContext says
    assert len(workers) >= 4, workers
    for cid, proc in workers.items():
        _assert_confined(cid, proc)
    wait_for(lambda: not pods(c, ns), 120, "the job's pods to go (cleanPodPolicy Running)")
    reports, missing = final_reports(c, ns)
    assert len(reports) >= 4 and not missing, (reports, missing)
    helm(c, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout=120s", check=False)
