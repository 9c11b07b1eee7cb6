"""`tianji run --resume RUN_DIR`: where the earlier launches of a run left off.

A resumed run keeps counting (frames, episodes, the last 100 returns, lag) where the previous
launch stopped, its clock continues theirs, and it says so when a learner has no usable
checkpoint to start from.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from tianji.control.contracts.accounting import Accounting
from tianji.local.runfiles import last_record

RESUMED_KEYS = ("env_frames", "episodes", "policy_version", "exit_reason", "wall_seconds")


def previous_counts(run_dir: Path) -> tuple[Accounting, Optional[dict], float]:
    """The accounting restored whole (accounting.json), what the previous launch ended with
    (summary.json's numbers, else its last metrics record), and the clock offset."""
    acc, resumed_from, t_offset = Accounting(), None, 0.0
    state, prev = run_dir / "accounting.json", run_dir / "summary.json"
    if state.exists():
        acc = Accounting(json.loads(state.read_text()))
    if prev.exists():
        s = json.loads(prev.read_text())
        resumed_from = {k: s.get(k) for k in RESUMED_KEYS}
    last = last_record(run_dir / "metrics.jsonl")
    if last is not None:  # covers a launcher that was SIGKILLed before writing its summary
        t_offset = float(last.get("t", 0.0))
        resumed_from = resumed_from or {}
        resumed_from.setdefault("policy_version", last.get("policy_version"))
        resumed_from.setdefault("env_frames", last.get("env_frames"))
    elif resumed_from and resumed_from.get("wall_seconds"):
        t_offset = float(resumed_from["wall_seconds"])
    return acc, resumed_from, t_offset


def missing_checkpoints(job, run_dir: Path) -> list[str]:
    """One warning per learner that will start from scratch, also printed on the console."""
    from tianji.runtime import checkpoint  # torch: only when resuming

    out = []
    t = job.spec.topology
    for g in range(t.groups):
        for i in range(t.learners):
            if checkpoint.load_latest(checkpoint.checkpoint_dir(run_dir, g, i)) is None:
                msg = f"learner-{g}-{i}: no usable checkpoint, starting from scratch"
                out.append(msg)
                print(f"tianji: {msg}", file=sys.stderr)
    return out
