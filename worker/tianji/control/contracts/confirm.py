"""The confirming evaluation's contract, shared by both engines: a target is reached only when
the saved policy meets it (docs/security.md).

The local launcher evaluates learner-0-0's checkpoint in a process of its own
(tianji.local.targetcheck); the operator in a pod of its own (`tianji confirm`, which fetches
the checkpoint from the learner's metrics port and checks its digest against the learner's
report). Both play the same episodes: this module says how many, with which seed, epsilon and
step cap, and how the answer is read (JSON, parsed as data, every field checked).

Torch-free: the operator imports it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from tianji.control.contracts.rolereport import WINDOW

CKPT = re.compile(r"^ckpt-(\d{12})\.pt$")  # runtime/checkpoint.py's file names: the policy version
SEED = 2**31 + 7_777_777  # apart from actors' (env.seed + < 1.1e7) and the evaluator's (2^31 + blocks of envs)
# An evaluated episode is cut at this many times the actors' mean episode length (at least
# MIN_STEP_CAP steps): a greedy policy can loop forever where the env has no time limit.
STEP_CAP_FACTOR, MIN_STEP_CAP = 20, 1000
RETRY_S = 10.0  # after a check that did not confirm: the next waits this long, and for a newer policy
CHECKPOINT_WAIT_S = 120.0  # a learner in a long update (Pong on a busy box) takes a while to save
EVAL_TIMEOUT_S = 1800.0


def episodes(spec: Any) -> int:
    """spec.evaluation.episodes when the job has an evaluator (the user's evaluation size), else
    the stop rule's window."""
    ev = spec.evaluation
    return int(ev.episodes) if ev.enabled else WINDOW


def epsilon(spec: Any) -> Optional[float]:
    """DQN's evaluation epsilon when the job sets one (spec.evaluation), else evaluate()'s own."""
    ev = spec.evaluation
    return float(ev.epsilon) if ev.enabled and spec.algorithm.name == "dqn" else None


def step_cap(mean_length: Optional[float]) -> int:
    return max(MIN_STEP_CAP, int(STEP_CAP_FACTOR * (mean_length or 0)))


def checkpoint_version(name: Optional[str]) -> Optional[int]:
    """The policy version a checkpoint file name carries; None for anything that is not one."""
    m = CKPT.match(name or "")
    return int(m.group(1)) if m else None


def parse_result(text: str, exit_code: int = 0) -> dict:
    """An evaluation's answer: the last line of `text`, JSON with finite means and non-negative
    integer counts; ValueError (saying why) otherwise, or when the evaluation failed."""
    try:
        res = json.loads(text.strip().splitlines()[-1])
    except (IndexError, ValueError) as e:
        raise ValueError(f"no JSON result ({e})" if exit_code == 0 else f"exit code {exit_code}") from None
    if not isinstance(res, dict):
        raise ValueError("the result is not a JSON object")
    if exit_code != 0 or "error" in res:
        raise ValueError(str(res.get("error") or f"exit code {exit_code}")[:300])
    for k in ("mean_return", "std_return", "mean_length"):
        v = res.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{k} {v!r}")
    for k in ("episodes", "policy_version"):
        if type(res.get(k)) is not int or res[k] < 0:
            raise ValueError(f"{k} {res.get(k)!r}")
    return res


def confirm_args(url: str, sha256: str, spec: Any, mean_length: Optional[float]) -> list[str]:
    """`tianji confirm`'s arguments for the checkpoint at `url` with digest `sha256`."""
    args = [
        "--url",
        url,
        "--sha256",
        sha256,
        "--episodes",
        str(episodes(spec)),
        "--seed",
        str(SEED),
        "--step-cap",
        str(step_cap(mean_length)),
    ]
    eps = epsilon(spec)
    if eps is not None:
        args += ["--epsilon", str(eps)]
    return args
