"""End to end on a real cluster: install the chart, run examples/cartpole-ppo.yaml, see it succeed.

    make e2e          # = pytest tests/e2e --e2e

Cluster: the current kubeconfig context (KUBECONFIG honoured). If none answers and `kind`
is installed with a Docker engine, a kind cluster is created (and deleted afterwards),
and the two images are loaded into it from the local Docker engine (`make images`).

Chart: with a `helm` binary, `helm upgrade --install --wait`; without one, the chart is
rendered with helm-python-sdk and server-side applied with the kubernetes client (CRDs
first, as helm does). Monitoring objects stay off (values defaults).

Environment:
    TIANJI_OPERATOR_IMAGE   operator image            (default tianji-operator:0.1.0)
    TIANJI_WORKER_IMAGE     worker image, spec.image  (default tianji-worker:0.1.0)
    TIANJI_E2E_TIMEOUT      seconds for the job to reach Succeeded (default 900)
    TIANJI_E2E_NAMESPACE    namespace of the job      (default tianji-e2e)
    TIANJI_E2E_OPERATOR_NAMESPACE   release namespace (default tianji-system)
    TIANJI_E2E_KIND_CLUSTER name of a kind cluster to create (default tianji-e2e)
    TIANJI_E2E_KEEP=1       leave the job, release and kind cluster in place
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tianji-operator"
EXAMPLE = ROOT / "examples" / "cartpole-ppo.yaml"

GROUP, VERSION, PLURAL = "tianji.dev", "v1alpha1", "tianjijobs"
RELEASE = os.environ.get("TIANJI_E2E_RELEASE", "tianji-e2e")
OPERATOR_NS = os.environ.get("TIANJI_E2E_OPERATOR_NAMESPACE", "tianji-system")
JOB_NS = os.environ.get("TIANJI_E2E_NAMESPACE", "tianji-e2e")
OPERATOR_IMAGE = os.environ.get("TIANJI_OPERATOR_IMAGE", "tianji-operator:0.1.0")
WORKER_IMAGE = os.environ.get("TIANJI_WORKER_IMAGE", "tianji-worker:0.1.0")
JOB_TIMEOUT = float(os.environ.get("TIANJI_E2E_TIMEOUT", "900"))
KIND_CLUSTER = os.environ.get("TIANJI_E2E_KIND_CLUSTER", "tianji-e2e")
KEEP = os.environ.get("TIANJI_E2E_KEEP") == "1"
FIELD_MANAGER = "tianji-e2e"


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def split_image(ref: str) -> tuple[str, str]:
    """registry:5000/name:tag → (registry:5000/name, tag); no tag → latest."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


def run(cmd: list[str], env: Optional[dict] = None, timeout: float = 600, check: bool = True
        ) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res


# ----------------------------------------------------------------- the cluster
@dataclass
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    kubeconfig: Optional[str]  # None: the default kubeconfig / in-cluster
    description: str
    kind_name: Optional[str] = None  # set when this test created a kind cluster
    cleanups: list = field(default_factory=list)

    def env(self) -> dict:
        env = dict(os.environ)
        if self.kubeconfig:
            env["KUBECONFIG"] = self.kubeconfig
        return env


def _reachable(kubernetes: Any, kubeconfig: Optional[str]) -> tuple[Optional[Any], str]:
    """(ApiClient, description) when the cluster answers, else (None, why not)."""
    from kubernetes import client, config

    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config()
            where = "in-cluster service account"
        else:
            config.load_kube_config(config_file=kubeconfig)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            where = f"kubeconfig context {active['name']!r}"
    except Exception as e:  # no kubeconfig, no current context, bad file
        return None, f"no usable kubeconfig ({type(e).__name__}: {str(e)[:200]})"
    api = client.ApiClient()
    try:
        v = client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as e:
        return None, f"{where} does not answer ({type(e).__name__}: {str(e)[:200]})"
    return api, f"{where}, Kubernetes {v.git_version}"


def _docker_ok() -> bool:
    return bool(shutil.which("docker")) and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _kind_cluster(kubernetes: Any, why_not: str) -> Cluster:
    if not shutil.which("kind"):
        pytest.skip(f"no Kubernetes cluster reachable: {why_not}; kind is not installed either. "
                    "`make e2e` needs a cluster in the current kubeconfig, or kind and a Docker engine.")
    if not _docker_ok():
        pytest.skip(f"no Kubernetes cluster reachable: {why_not}; kind is installed but no Docker engine "
                    "answers (docker info), so it cannot create one.")
    kubeconfig = os.path.join(tempfile.mkdtemp(prefix="tianji-e2e-"), "kubeconfig")
    existing = run(["kind", "get", "clusters"], check=False).stdout.split()
    created = KIND_CLUSTER not in existing
    if created:
        run(["kind", "create", "cluster", "--name", KIND_CLUSTER, "--wait", "180s"], timeout=600)
    run(["kind", "export", "kubeconfig", "--name", KIND_CLUSTER, "--kubeconfig", kubeconfig])
    api, desc = _reachable(kubernetes, kubeconfig)
    if api is None:
        pytest.fail(f"kind cluster {KIND_CLUSTER} was created but does not answer: {desc}")
    for image in (OPERATOR_IMAGE, WORKER_IMAGE):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            pytest.fail(f"image {image} is not in the local Docker engine: build it first "
                        f"(docker build -f images/... -t {image} .; see images/README.md), "
                        "or set TIANJI_OPERATOR_IMAGE / TIANJI_WORKER_IMAGE")
        run(["kind", "load", "docker-image", image, "--name", KIND_CLUSTER], timeout=900)
    return Cluster(api=api, kubeconfig=kubeconfig, description=f"kind cluster {KIND_CLUSTER} ({desc})",
                   kind_name=KIND_CLUSTER if created else None)


@pytest.fixture(scope="module")
def cluster():
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is needed: "
                                                          "pip install -e '.[operator]'")
    api, desc = _reachable(kubernetes, None)
    c = Cluster(api=api, kubeconfig=None, description=desc) if api is not None else _kind_cluster(kubernetes, desc)
    log(f"cluster: {c.description}")
    yield c
    for fn in reversed(c.cleanups):
        try:
            fn()
        except Exception as e:  # cleanup is best effort; the test result stands
            log(f"cleanup failed: {type(e).__name__}: {e}")
    if c.kind_name and not KEEP:
        run(["kind", "delete", "cluster", "--name", c.kind_name], check=False, timeout=300)


# ----------------------------------------------------------------- applying manifests
def _dynamic(c: Cluster) -> Any:
    from kubernetes.dynamic import DynamicClient

    return DynamicClient(c.api)


def apply(c: Cluster, doc: dict, namespace: Optional[str] = None) -> None:
    """Server-side apply (kubectl apply --server-side), whatever the kind."""
    dyn = _dynamic(c)
    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    ns = (doc["metadata"].get("namespace") or namespace) if res.namespaced else None
    if ns:
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
    dyn.server_side_apply(res, body=doc, name=doc["metadata"]["name"], namespace=ns,
                          field_manager=FIELD_MANAGER, force_conflicts=True)


def delete(c: Cluster, doc: dict, namespace: Optional[str] = None) -> None:
    from kubernetes.dynamic.exceptions import NotFoundError

    dyn = _dynamic(c)
    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    try:
        dyn.delete(res, name=doc["metadata"]["name"],
                   namespace=(doc["metadata"].get("namespace") or namespace) if res.namespaced else None)
    except NotFoundError:
        pass


def ensure_namespace(c: Cluster, name: str) -> None:
    apply(c, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def wait_for(what: str, fn, timeout: float, interval: float = 3.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = fn()
        except Exception as e:  # discovery caches, objects not there yet
            got, last = None, e
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (f" (last error: {last})" if last else ""))


def _crd_established(c: Cluster, name: str) -> bool:
    from kubernetes import client

    crd = client.ApiextensionsV1Api(c.api).read_custom_resource_definition(name)
    return any(cond.type == "Established" and cond.status == "True" for cond in (crd.status.conditions or []))


def _operator_values() -> dict:
    repo, tag = split_image(OPERATOR_IMAGE)
    return {"image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"}}


def _install_with_helm(c: Cluster) -> None:
    repo, tag = split_image(OPERATOR_IMAGE)
    run(["helm", "upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
         "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--wait", "--timeout", "5m"],
        env=c.env(), timeout=420)
    if not KEEP:
        c.cleanups.append(lambda: run(["helm", "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait"],
                                      env=c.env(), check=False, timeout=300))


def _install_rendered(c: Cluster) -> None:
    helm_python = pytest.importorskip("helm_python", reason="neither a helm binary nor helm-python-sdk")
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                apply(c, crd)
                wait_for(f"CRD {crd['metadata']['name']} Established",
                         lambda name=crd["metadata"]["name"]: _crd_established(c, name), 60)
    ensure_namespace(c, OPERATOR_NS)
    rendered = helm_python.Chart.load(str(CHART)).render(_operator_values(), name=RELEASE, namespace=OPERATOR_NS,
                                                         is_install=True)
    docs = [d for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]
    order = {"ServiceAccount": 0, "ClusterRole": 1, "Role": 1, "ClusterRoleBinding": 2, "RoleBinding": 2,
             "ConfigMap": 3, "Service": 4, "Deployment": 5}
    docs.sort(key=lambda d: order.get(d["kind"], 9))
    for d in docs:
        log(f"apply {d['kind']}/{d['metadata']['name']}")
        apply(c, d, OPERATOR_NS)
    if not KEEP:
        # Like `helm uninstall`: the release's objects go, the CRD (chart crds/) stays.
        c.cleanups.append(lambda: [delete(c, d, OPERATOR_NS) for d in reversed(docs)])


def _operator_deployment(c: Cluster) -> Any:
    from kubernetes import client

    apps = client.AppsV1Api(c.api)
    deps = apps.list_namespaced_deployment(OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE},"
                                                                       "app.kubernetes.io/name=tianji-operator")
    return deps.items[0] if deps.items else None


def _operator_logs(c: Cluster, tail: int = 80) -> str:
    from kubernetes import client

    core = client.CoreV1Api(c.api)
    out = []
    for pod in core.list_namespaced_pod(OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}").items:
        try:
            out.append(f"--- {pod.metadata.name} ({pod.status.phase})\n"
                       + core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NS, tail_lines=tail))
        except Exception as e:
            out.append(f"--- {pod.metadata.name}: no logs ({e})")
    return "\n".join(out)


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Cluster:
    if shutil.which("helm"):
        log("installing the chart with helm")
        _install_with_helm(cluster)
    else:
        log("no helm binary: rendering the chart with helm-python-sdk and applying it server-side")
        _install_rendered(cluster)

    def available() -> bool:
        d = _operator_deployment(cluster)
        return bool(d and (d.status.available_replicas or 0) >= 1)

    try:
        wait_for("the operator Deployment to be available", available, 300)
    except TimeoutError as e:
        pytest.fail(f"{e}\n{_operator_logs(cluster)}")
    log(f"operator {OPERATOR_IMAGE} is available in {OPERATOR_NS}")
    return cluster


# ----------------------------------------------------------------- the job
def _job_manifest() -> dict:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["namespace"] = JOB_NS
    job["spec"]["image"] = WORKER_IMAGE
    return job


def _get_job(c: Cluster, name: str) -> Optional[dict]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CustomObjectsApi(c.api).get_namespaced_custom_object(GROUP, VERSION, JOB_NS, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _delete_job(c: Cluster, name: str, wait: float = 180) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CustomObjectsApi(c.api).delete_namespaced_custom_object(
            GROUP, VERSION, JOB_NS, PLURAL, name, propagation_policy="Foreground")
    except ApiException as e:
        if e.status != 404:
            raise
    # The operator's finalizer must be released for the object to go.
    wait_for(f"TianJiJob {name} to be deleted (finalizer released)", lambda: _get_job(c, name) is None, wait)


def _diagnostics(c: Cluster, name: str) -> str:
    from kubernetes import client

    core = client.CoreV1Api(c.api)
    lines = ["pods:"]
    for p in core.list_namespaced_pod(JOB_NS, label_selector=f"tianji.dev/job={name}").items:
        waiting = [s.state.waiting.reason for s in (p.status.container_statuses or []) if s.state.waiting]
        restarts = sum(s.restart_count for s in (p.status.container_statuses or []))
        lines.append(f"  {p.metadata.name}: {p.status.phase} restarts={restarts} {' '.join(waiting)}")
    lines.append("events:")
    for e in core.list_namespaced_event(JOB_NS).items[-40:]:
        lines.append(f"  {e.involved_object.kind}/{e.involved_object.name} {e.type} {e.reason}: {e.message}")
    lines.append("operator logs:")
    lines.append(_operator_logs(c))
    return "\n".join(lines)


BAD_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
               "CreateContainerError"}


def _stuck_pods(c: Cluster, name: str) -> list[str]:
    """Pods that cannot start at all (image not found, bad config): waiting longer is pointless."""
    from kubernetes import client

    out = []
    for p in client.CoreV1Api(c.api).list_namespaced_pod(JOB_NS, label_selector=f"tianji.dev/job={name}").items:
        for s in p.status.container_statuses or []:
            if s.state.waiting and s.state.waiting.reason in BAD_WAITING:
                out.append(f"{p.metadata.name}: {s.state.waiting.reason}: {s.state.waiting.message or ''}")
    return out


def _summary(status: dict) -> str:
    rates = status.get("rates") or {}
    conds = ", ".join(f"{k['type']}={k['status']}({k.get('reason', '')})" for k in status.get("conditions") or [])
    return (f"phase={status.get('phase')} actors={status.get('actors')} frames={status.get('envFrames')} "
            f"frames/s={rates.get('producedFps')} episodes={status.get('episodes')} "
            f"meanReturn={status.get('meanReturn')} policyVersion={status.get('policyVersion')} [{conds}]")


def test_cartpole_ppo_reaches_succeeded(operator: Cluster, capsys: pytest.CaptureFixture):
    from kubernetes import client

    c = operator
    manifest = _job_manifest()
    name = manifest["metadata"]["name"]
    ensure_namespace(c, JOB_NS)
    if _get_job(c, name) is not None:
        log(f"deleting a TianJiJob {name} left from an earlier run")
        _delete_job(c, name)
    client.CustomObjectsApi(c.api).create_namespaced_custom_object(GROUP, VERSION, JOB_NS, PLURAL, manifest)
    log(f"created TianJiJob {JOB_NS}/{name} (worker image {WORKER_IMAGE}); waiting up to {JOB_TIMEOUT:.0f} s")
    if not KEEP:
        c.cleanups.append(lambda: _delete_job(c, name))

    deadline = time.monotonic() + JOB_TIMEOUT
    last, status, stuck_since = None, {}, None
    with capsys.disabled():
        while time.monotonic() < deadline:
            obj = _get_job(c, name) or {}
            status = obj.get("status") or {}
            line = _summary(status)
            if line != last:
                log(line)
                last = line
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            stuck = _stuck_pods(c, name)
            stuck_since = (stuck_since or time.monotonic()) if stuck else None
            if stuck and time.monotonic() - stuck_since > 180:
                pytest.fail(f"pods of {name} cannot start for 3 minutes (is {WORKER_IMAGE} pullable by the "
                            "nodes? set TIANJI_WORKER_IMAGE):\n  " + "\n  ".join(stuck)
                            + "\n" + _diagnostics(c, name))
            time.sleep(5)
        print("\nfinal status of TianJiJob", f"{JOB_NS}/{name}:\n" + yaml.safe_dump(status, sort_keys=False),
              flush=True)
    phase = status.get("phase")
    if phase != "Succeeded":
        why = "timed out" if phase not in ("Failed",) else "Failed"
        pytest.fail(f"TianJiJob {name} {why} (phase {phase!r}) after {JOB_TIMEOUT:.0f} s\n{_diagnostics(c, name)}")
    # The operator recorded what it planned and what it saw.
    assert status.get("plan"), status
    assert status.get("observedGeneration"), status
    assert any(k["type"] == "Progressing" and k["status"] == "False" for k in status.get("conditions") or [])
    log(f"Succeeded: mean return {status.get('meanReturn')}, policy version {status.get('policyVersion')}")
