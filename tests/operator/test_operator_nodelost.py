"""Which pods the operator force-deletes off a lost node (operator/tianji_operator/timers/nodelost.py):
only those whose graceful deletion is overdue past their own deadline; the cluster tier
(tests/cluster/test_real_nodes.py) cuts a real node's power."""
from __future__ import annotations

from tianji_operator import status as st
from tianji_operator.timers.nodelost import FORCE_AFTER_S, overdue


def pod(name: str, deletion: float | None) -> dict:
    meta = {"name": name, "uid": name}
    if deletion is not None:
        meta["deletionTimestamp"] = st.iso(deletion)
    return {"metadata": meta, "spec": {"nodeName": "node-2"}}


def test_only_pods_overdue_past_their_deadline_are_released():
    now = 1_800_000_000.0
    pods = [pod("running", None), pod("stopping", now + 25), pod("just-due", now - 5),
            pod("overdue", now - FORCE_AFTER_S - 1)]
    assert [p["metadata"]["name"] for p in overdue(pods, now)] == ["overdue"]
    assert [p["metadata"]["name"] for p in overdue(pods, now + 60)] == ["stopping", "just-due", "overdue"]
