"""Helpers of the cluster tier's job tests: the job's status and pods through kubectl, and the
worker processes' own final reports (their termination messages: as the API server delivers a
real node's pods, or the files a process-mode node agent keeps)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from cluster_prometheus import prometheus_url
from clusterkit import get, install_operator, wait_for
from helpers import merge_spec
from localcluster import realnode
from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.rolereport import parse_report
from tianji_operator.config import DEFAULT_SCRAPERS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cartpole-ppo.yaml"
JOB = "cartpole-ppo"

# The real cluster's real nodes (conftest.py's `real`) are tainted: only pods that ask land there.
# Its operator asks for every worker pod (realnode.WORKER_DEFAULTS), so a manifest names only its image.
ON_REAL = {"tolerations": [realnode.TOLERATION]}


def install_real_operator(c) -> None:
    """The chart's operator on the real cluster, in its pod on the process-mode node, with the
    values an admin of such a cluster gives: `workerDefaults` put every worker pod on the real
    nodes; `metricsScrapers` admit, besides the chart's default peers, this machine's address on
    the cluster's bridge to the `metrics` port (the tests' Prometheus and readers run here, as a
    Prometheus outside the cluster would); `prometheusAllowList` names that Prometheus."""
    host = {"ipBlock": {"cidr": f"{c.net.gateway}/32"}}
    install_operator(c, prometheus_url(c), (
        "--set-json", f"operator.workerDefaults={json.dumps(realnode.WORKER_DEFAULTS)}",
        "--set-json", f"operator.metricsScrapers={json.dumps([*DEFAULT_SCRAPERS, host])}"))


def example(patch: Optional[dict] = None, name: str = JOB) -> str:
    """examples/cartpole-ppo.yaml as YAML text, with `patch` merged into its spec."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    merge_spec(doc["spec"], patch or {})
    return yaml.safe_dump(doc)


def on_real_nodes(c, patch: Optional[dict] = None, name: str = JOB) -> str:
    """example(patch) whose pods run the checkout's image (pushed to `c`'s registry), which the
    real cluster's operator places on its real nodes (realnode.WORKER_DEFAULTS)."""
    return example({"image": c.checkout_image(), **(patch or {})}, name)


def status(c, ns: str, name: str = JOB) -> dict:
    return (get(c, "tjj", "-n", ns, name) or {}).get("status") or {}


def running(c, ns: str, role: str) -> dict[str, dict]:
    """Name -> pod of the job's `role` pods that run and are not being deleted."""
    return {p["metadata"]["name"]: p for p in pods(c, ns) if p["metadata"]["labels"].get("tianji.dev/role") == role
            and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}


# A job that trains until it is stopped (its time budget is past any test's timeout).
FOREVER = {"stop": {"meanReturn": None, "envFrames": None, "seconds": 600}}


def condition(st: dict, ctype: str) -> Optional[dict]:
    return next((x for x in st.get("conditions") or [] if x["type"] == ctype), None)


def pods(c, ns: str, name: str = JOB) -> list[dict]:
    return (get(c, "pods", "-n", ns, "-l", f"tianji.dev/job={name}") or {}).get("items") or []


def wait_phase(c, ns: str, phases: tuple[str, ...], timeout: float, name: str = JOB) -> dict:
    return wait_for(lambda: (s := status(c, ns, name)).get("phase") in phases and s, timeout,
                    f"job {ns}/{name} phase in {phases}", interval=2.0,
                    on_timeout=lambda: diagnostics(c, ns))


# What a failed job test prints of each worker's /metrics: enough to tell a learner that does not
# learn from actors that do not follow it (versions), and drops and rejects by reason.
DIAGNOSTIC_METRICS = ("tianji_policy_version", "tianji_samples_consumed_total", "tianji_samples_dropped_total",
                      "tianji_messages_rejected_total", "tianji_env_frames_total", "tianji_episodes_total",
                      "tianji_learner_")


def _metrics_port(pod: dict) -> int:
    return next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []
                if p["name"] == "metrics")


def _series(text: str, prefixes: tuple[str, ...]) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefixes)}


def worker_metrics(pod: dict, prefixes: tuple[str, ...] = DIAGNOSTIC_METRICS) -> dict[str, float]:
    """A worker process's own series (name{labels} -> value) from its /metrics on its pod IP."""
    import urllib.request

    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{_metrics_port(pod)}/metrics", timeout=5) as r:
        return _series(r.read().decode(), prefixes)


def _metrics_of_pods(c, ns: str) -> list[str]:
    out = []
    for p in pods(c, ns):
        try:
            series = worker_metrics(p) if p["status"].get("podIP") else {}
        except (OSError, StopIteration, ValueError) as e:
            series = {"unreadable": repr(e)}
        out.append(f"----- metrics of {p['metadata']['name']}\n" +
                   "\n".join(f"{k} {v}" for k, v in sorted(series.items())))
    return out


def diagnostics(c, ns: str) -> str:
    out = [c.kubectl("get", "tjj,pods,statefulsets", "-n", ns, "-o", "wide", check=False).stdout,
           c.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout[-3000:],
           yaml.safe_dump(status(c, ns))[-3000:]]
    out += _metrics_of_pods(c, ns)
    for log in sorted(c.root.glob(f"nodes/*/pods/{ns}_*/logs/*.log")):
        out.append(f"----- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    return "\n".join(out) + "\n" + c.logs(15)


def final_reports(c, ns: str, name: str = JOB) -> tuple[list[dict], list[Path]]:
    """(final reports, termination files without one) of every worker container the job ran, on
    every process-mode node (not the confirm pod's: its termination message is an evaluation, no report; not
    the actors' init containers')."""
    reports, missing = [], []
    for f in sorted(c.root.glob(f"nodes/*/pods/{ns}_{name}-*/termination/worker-*")):
        if f.parent.parent.name.startswith(f"{ns}_{name}-confirm"):
            continue
        rep = _report_of(f.read_text(errors="replace"))
        (reports.append(rep) if rep is not None else missing.append(f))
    return reports, missing


def _report_of(message: str) -> Optional[dict]:
    """A worker's final report from its termination message; None where there is none."""
    try:
        rep = json.loads(message) if message.strip() else None
    except ValueError:
        return None
    return rep if isinstance(rep, dict) else None


class TerminationMessages:
    """Every worker container's termination message, as the API server delivers the job's pods
    while the block runs: a real node's kubelet copies /dev/termination-log into the pod's status,
    and the pod object goes soon after (cleanPodPolicy), so the messages are read as they pass.
    Not the confirm pod's (an evaluation, no report) nor init containers'."""

    def __init__(self, c, ns: str, name: str = JOB):
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(c.kubeconfig)))
        self.ns, self.name = ns, name
        self.seen: dict[tuple[str, str], str] = {}  # (pod uid, container id) -> message
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> TerminationMessages:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)

    def _watch(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        rv = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.api.list_namespaced_pod, self.ns, label_selector=f"tianji.dev/job={self.name}",
                                   timeout_seconds=3, resource_version=rv):
                    self._record(self.api.api_client.sanitize_for_serialization(ev["object"]))
                rv = w.resource_version
            except ApiException as e:
                if e.status != 410:
                    raise
                rv = None  # expired: list again (messages are keyed, so nothing counts twice)

    def _record(self, pod: dict) -> None:
        meta = pod["metadata"]
        if meta["name"].startswith(f"{self.name}-confirm"):
            return
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for st in ((cs.get("state") or {}).get("terminated"), (cs.get("lastState") or {}).get("terminated")):
                if st and cs.get("name") == "worker":
                    key = (meta["uid"], st.get("containerID") or st.get("startedAt") or "")
                    self.seen[key] = st.get("message") or ""

    def reports(self) -> tuple[list[dict], list[tuple[str, str]]]:
        """(the final reports, the terminated worker containers without one)."""
        reports, missing = [], []
        for key, text in sorted(self.seen.items()):
            rep = _report_of(text)
            (reports.append(rep) if rep is not None else missing.append(key))
        return reports, missing


def workers_view(reports: list[dict], name: str = JOB) -> dict[str, Any]:
    """What the workers counted themselves, through the accounting summary.json uses."""
    acc = Accounting()
    for r in reports:
        acc.take(parse_report(r, name))
    return acc.view(1.0)


# ----------------------------------------------------------------- disruptions (test_real_disruption, test_real_nodes)
# Only the target ends these jobs (the example's frame and time budgets could end a job whose
# learner had to start over before it got back to its target). The target is 200, not the
# example's 475: what these jobs test is the disruption and the end the operator confirms from the
# saved policy, and the last stretch from 200 to 475 (often a plateau near 300) costs each job a
# minute or more; the quick start trains the example to 475 on these nodes. Half the example's
# learning rate: a disruption early (training()) must not meet a job that ends before its
# re-created pod has trained. Its decay to 0 over four times the example's 400k frames: with
# no frame budget, a job slowed by a disruption would otherwise train on at a learning rate of 0.
TARGET = 200
TARGET_ONLY = {"stop": {"meanReturn": TARGET, "envFrames": None, "seconds": 900},
               "algorithm": {"lr": 5.0e-4, "lrAnnealFrames": 1_600_000}}


def learner_series(c, ns: str, wanted: tuple[str, ...], old_uid: str = "") -> Optional[dict[str, float]]:
    """The running learner pod's series (name without labels -> value) from its /metrics, or
    None (no such pod yet, still the pod of uid `old_uid`, or not serving)."""
    p = get(c, "pod", "-n", ns, f"{JOB}-learner-0-0")
    if not p or p["metadata"]["uid"] == old_uid or p["status"].get("phase") != "Running":
        return None
    try:
        return {k.split("{")[0]: v for k, v in worker_metrics(p, wanted).items()}
    except (OSError, StopIteration, ValueError):
        return None


def training(c, ns: str, versions: int = 5) -> dict:
    """The job's status once its learner has published `versions` policies, read from the
    learner's own /metrics (the status lags by a report or two, in which a fast run already
    passes TARGET). A disruption here meets a policy near random, so a job cannot end on what
    its old learner trained before a re-created pod trains."""
    wait_for(lambda: (m := learner_series(c, ns, ("tianji_policy_version{",))) and m.get(
        "tianji_policy_version", 0) >= versions, 300, f"the learner to publish {versions} policies",
             interval=0.5, on_timeout=lambda: diagnostics(c, ns))
    return status(c, ns)


def trains_again(c, ns: str, old_uid: str) -> dict:
    """The re-created learner (another uid) runs, consumes batches its buffer sends and publishes
    new versions: the buffer and actors found it again by its DNS name."""
    def progress():
        m = learner_series(c, ns, ("tianji_policy_version{", "tianji_samples_consumed_total{"), old_uid)
        if m and m.get("tianji_policy_version", 0) >= 20 and m.get("tianji_samples_consumed_total", 0) > 0:
            return m
        # a fast run can train from 20 to its target, be confirmed and delete its pods between two
        # polls: then its status must show the re-created learner's versions (the old one was deleted
        # near 5, training()) and the re-creation counted
        st = status(c, ns)
        learner_pods = st.get("restartsByRole", {}).get("learner", {}).get("pods", 0)
        if st.get("phase") == "Succeeded" and st.get("policyVersion", 0) >= 20 and learner_pods >= 1:
            return {"tianji_policy_version": st["policyVersion"], "ended": 1}
        return None

    return wait_for(progress, 300, "the new learner to train 20 versions", interval=2.0,
                    on_timeout=lambda: diagnostics(c, ns))


def assert_never_succeeded_untrained(c, ns: str) -> None:
    st = status(c, ns)
    if st.get("phase") == "Succeeded":
        assert st["meanReturn"] >= TARGET and st.get("policyVersion", 0) > 0, st


def ends_at_a_confirmed_target(c, ns: str) -> dict:
    """Succeeded at its target, not on a budget, confirmed by the saved policy's own evaluation."""
    st = wait_phase(c, ns, ("Succeeded", "Failed"), 480)
    assert st["phase"] == "Succeeded" and st.get("endReason") == "TargetReached", diagnostics(c, ns)
    assert condition(st, "TargetReached")["status"] == "True", st.get("conditions")
    assert st["targetEvaluation"]["mean_return"] >= TARGET, st["targetEvaluation"]  # the saved policy's own
    return st


def worker_pid(ns: str, pod: str) -> int:
    """The pid of pod `pod`'s worker process: a process-mode node's pod or a real node's
    container, both this machine's processes."""
    want = {f"TIANJI_NAMESPACE={ns}".encode(), f"TIANJI_POD_NAME={pod}".encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if b"worker" in cmd and b"--role" in cmd and want <= env:
            return int(proc.name)
    raise AssertionError(f"no worker process of {ns}/{pod}")


LINGER = "tianji.test/linger"  # a finalizer of the test's own: the object outlives its worker


HOW = ["graceful", "lingering", "forced"]


def delete_pod(c, ns: str, pod: str, how: str) -> None:
    """graceful: `kubectl delete`; lingering: the same while a finalizer keeps the terminated
    object 10 s after its worker stopped (nothing can take its name meanwhile); forced:
    `--grace-period=0 --force` (the object goes at once; no last checkpoint, no final report)."""
    if how == "lingering":
        c.kubectl("patch", "pod", pod, "-n", ns, "--type=merge", "-p",
                  json.dumps({"metadata": {"finalizers": [LINGER]}}))
    if how == "forced":
        c.kubectl("delete", "pod", pod, "-n", ns, "--grace-period=0", "--force", "--wait=false")
        return
    c.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    if how == "lingering":
        wait_for(lambda: (p := get(c, "pod", "-n", ns, pod)) and all(
            "terminated" in (cs.get("state") or {}) for cs in p["status"].get("containerStatuses") or [{}]),
                 120, f"{pod}'s worker stopped under the finalizer", interval=1.0,
                 on_timeout=lambda: diagnostics(c, ns))
        time.sleep(10)  # the object lingers: the job goes on and nothing takes its name meanwhile
        still = get(c, "pod", "-n", ns, pod)
        assert still and still["metadata"].get("deletionTimestamp"), still
        assert status(c, ns).get("phase") in ("Running", "Pending"), status(c, ns)
        c.kubectl("patch", "pod", pod, "-n", ns, "--type=json", "-p",
                  '[{"op": "remove", "path": "/metadata/finalizers"}]')
