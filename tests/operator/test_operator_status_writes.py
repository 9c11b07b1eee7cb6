"""Status writes never use a stale copy: `update_status` computes from a fresh read, and after a
conflict reads and computes again, so a write made meanwhile by another handler survives."""
from __future__ import annotations

import copy

import pytest

from tianji_operator import status as st
from tianji_operator.context import StatusConflict, update_status


class RacingKube:
    """A job store whose status changes (by `other_write`) between the first read and its patch,
    as when a timer and a handler write at once; patches test the resourceVersion like the apiserver."""

    def __init__(self, status: dict, other_write: dict | None = None, conflicts: int = 1):
        self.obj = {"metadata": {"name": "cp", "namespace": "ns", "resourceVersion": "1"}, "status": status}
        self.other_write, self.conflicts, self.reads, self.patches = other_write, conflicts, 0, []

    async def get(self, kind, ns, name):
        self.reads += 1
        got = copy.deepcopy(self.obj)
        if self.other_write is not None and self.conflicts > 0:  # lands right after this read
            self.conflicts -= 1
            self.obj["status"].update(self.other_write)
            self.obj["metadata"]["resourceVersion"] = str(int(self.obj["metadata"]["resourceVersion"]) + 1)
        return got

    async def patch_status(self, kind, ns, name, rv, fields, has_status=True):
        if rv != self.obj["metadata"]["resourceVersion"]:
            return False
        self.patches.append(fields)
        self.obj["status"].update(fields)
        return True


class Op:
    def __init__(self, kube):
        self.kube = kube


def _add_ready(fresh: dict) -> dict:
    cur = fresh.get("status") or {}
    return {"conditions": st.set_conditions(cur.get("conditions"), st.condition("Ready", True, "AllPodsReady",
                                                                                 now=1.0))}


async def test_a_concurrent_condition_survives():
    rescaled = st.condition("Rescaled", True, "ScaledUp", "2 -> 6", now=1.0)
    kube = RacingKube({"phase": "Running", "conditions": []}, other_write={"conditions": [rescaled]})
    await update_status(Op(kube), "ns", "cp", _add_ready)
    assert kube.reads == 2 and len(kube.patches) == 1  # the first computation was discarded
    assert {c["type"] for c in kube.obj["status"]["conditions"]} == {"Ready", "Rescaled"}


async def test_compute_sees_the_fresh_phase():
    """A job that ended meanwhile: the computation sees it (and writes nothing)."""
    kube = RacingKube({"phase": "Running"}, other_write={"phase": "Succeeded"})
    await update_status(Op(kube), "ns", "cp",
                        lambda fresh: None if fresh["status"]["phase"] == "Succeeded" else {"phase": "Running"})
    assert kube.obj["status"]["phase"] == "Succeeded" and kube.patches == []


async def test_endless_conflicts_give_up_loudly():
    kube = RacingKube({"phase": "Running"}, other_write={"x": 1}, conflicts=99)
    with pytest.raises(StatusConflict):
        await update_status(Op(kube), "ns", "cp", _add_ready, attempts=3)
    assert kube.reads == 3 and kube.patches == []
