"""Helpers of the emulator pod-harness tests (tests/test_operator_pod_disruptions.py): the
example job as applied, and the end state a succeeded job must show."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml

from helpers import merge_spec

from kube.cluster import PodCluster
from kube.operator_harness import NAMESPACE, eventually

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cartpole-ppo.yaml"
JOB = "cartpole-ppo"


def example_job(spec_patch: Optional[dict] = None) -> dict:
    """examples/cartpole-ppo.yaml as applied: only metadata adapted (plus `spec_patch`, merged)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": JOB, "namespace": NAMESPACE}
    merge_spec(doc["spec"], spec_patch or {})
    return doc


def condition(st: dict, ctype: str) -> Optional[dict]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), None)


def assert_succeeded(st: dict) -> None:
    """phase Succeeded; Progressing False/JobSucceeded; the Succeeded condition True
    (`kubectl wait --for=condition=Succeeded`)."""
    assert st.get("phase") == "Succeeded", st
    prog = condition(st, "Progressing")
    assert prog and (prog["status"], prog["reason"]) == ("False", "JobSucceeded"), prog
    assert st.get("completionTime"), st
    ok = condition(st, "Succeeded")
    assert ok and (ok["status"], ok["reason"]) == ("True", "StopConditionReached"), st.get("conditions")


async def wait_pods_gone(c: PodCluster, timeout: float = 60.0) -> None:
    await eventually(lambda: not c.pods(JOB) and not c.kubelet.running(), timeout=timeout, interval=0.2,
                     what="every pod of the job gone and its process exited")
