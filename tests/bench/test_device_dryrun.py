"""bench/device/run.sh --dry-run: every step of the GPU device check, briefly, on the CPU, so the
script that runs on a borrowed GPU machine cannot rot between such machines."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = {"run.json", "profile-pong-ppo.json", "profile-pong-dqn.json", "scaling-pong-ppo.json",
         "pong-ppo-planned.json", "pong-sb3.json", "pipeline-pong-ppo.json"}

pytestmark = pytest.mark.slow  # two profiles and two short Pong runs: minutes on 2 busy cores


def _sb3_importable() -> bool:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def test_device_check_dry_run(tmp_path):
    out = tmp_path / "device"
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(ROOT / "bench" / "device" / "run.sh"), "--dry-run", "--out", str(out)],
                       cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=1600)
    assert p.returncode == 0, p.stderr[-3000:]
    work = re.search(r"work (\S+),", p.stderr)
    assert work and not Path(work.group(1)).exists()  # its runs' folders go when it ends
    names = {x.name for x in out.iterdir()}
    assert names == FILES and all(x.is_file() for x in out.iterdir())  # the device tool returns 8 plain files
    docs = {n: json.loads((out / n).read_text()) for n in names}
    for n, d in docs.items():  # every result says where, when and how it was made
        assert d["dry_run"] is True and d["command"].startswith("bench/device/run.sh --dry-run"), n
        assert d["machine"]["cores"] == os.cpu_count() and d["date"], n
        assert "driver" in d["machine"] and "gpu" in d["machine"], n
    run = docs["run.json"]
    assert set(run["steps"]) == {"a", "b", "c", "d", "e"}
    assert all(s["status"] == "ok" for s in run["steps"].values()), run["steps"]
    for algo in ("ppo", "dqn"):  # (a) the real profiler, its planner keys filled in
        prof = docs[f"profile-pong-{algo}.json"]
        assert "error" not in prof, prof.get("log_tail")
        assert prof["algorithm"] == algo and prof["learner_sps_per_core"] > 0 and prof["actor_fps_per_core"] > 0
    scaling = docs["scaling-pong-ppo.json"]  # (b) a real run per actor count, read back from its metrics
    point = scaling["points"][0]
    assert "error" not in point, point.get("log_tail") or point.get("error")
    assert point["actors"] == 1 and point["env_frames"] > 0 and point["rows"]
    assert point["resolved"]["topology"]["actors"] == 1 and point["resolved"]["resources"]["learner"]["gpu"] == 0
    assert [c["actors"] for c in scaling["curve"]] == [1]
    pipeline = docs["pipeline-pong-ppo.json"]  # (e) lock step and pipelined, each run traced
    assert [(p["arm"], p["actors"]) for p in pipeline["points"]] == [("lockstep", 1), ("pipelined", 1)]
    for point in pipeline["points"]:
        assert "error" not in point, point.get("log_tail") or point.get("error")
        assert point["env_frames"] > 0 and point["trace"]["learner"]["updates"] > 0
        assert point["trace"]["actors"]["fragments"] > 0
    planned = docs["pong-ppo-planned.json"]  # (c) the plan for this machine, then a run of it
    assert "error" not in planned["plan"] and planned["plan"]["actors"] >= 1
    assert planned["profile"] == "profile-pong-ppo.json"
    assert "error" not in planned["run"] and planned["run"]["env_frames"] > 0
    sb3 = docs["pong-sb3.json"]  # (d) the peer run, when Stable-Baselines3 is there
    if _sb3_importable():
        assert "error" not in sb3 and sb3["env_frames"] > 0
    else:
        assert "stable-baselines3" in sb3["skipped"]


def test_device_check_cpu_steps_dry_run(tmp_path):
    """(t) and (v), device calls of their own: CartPole traced on the machine's CPUs, and the
    planner's out-of-sample validation there, one short point here (its quiet gate lifted: this
    machine is shared)."""
    out = tmp_path / "device"
    env = {**os.environ, "PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "bench" / "device" / "run.sh"), "--dry-run", "--steps", "tv", "--out", str(out)]
    p = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["steps"]["v"]["status"] == "ok", run["steps"]
    assert run["steps"]["v"]["validation"]["rc"] == 0
    assert run["steps"]["t"]["status"] == "ok", run["steps"]
    (arm,) = json.loads((out / "trace-cartpole-ppo.json").read_text())["points"]  # the example, traced
    assert arm["arm"] == "default" and arm["env_frames"] > 0 and arm["steady"]["consumed_sps"] > 0, arm
    (point,) = json.loads((out / "planner-validation.json").read_text())["points"]  # predicted, then run
    assert point["predicted"]["consumed_sps"] > 0 and point["topology"]["algo"] == "ppo"
    # measured, or (a 20-s run on a loaded 2-core machine) said why not: never a silent gap
    assert point.get("measured", {}).get("consumed_sps", 0) > 0 or point["error"] == "no steady window"


def test_the_two_arm_ab_runs_each_arm_with_its_own_settings(tmp_path):
    """bench/device/ab_trees.py without --base: this tree in both arms, a setting of each arm's own."""
    out = tmp_path / "ab"
    cmd = [sys.executable, "-m", "bench.device.ab_trees", "--dry-run", "--actors", "1", "--rounds", "1",
           "--base-set", "spec.env.fragmentLength=16", "--tree-set", "spec.env.fragmentLength=8", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "worker"), str(ROOT)])}
    p = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((out / "ab-trees-pong-ppo.json").read_text())
    assert doc["base"] == "this tree" and doc["tree_sets"] == ["spec.env.fragmentLength=8"]
    base, tree = doc["points"]
    assert (base["arm"], tree["arm"]) == ("base", "tree")
    for point, length in ((base, 16), (tree, 8)):
        assert "error" not in point, point.get("log_tail") or point.get("error")
        assert point["env_frames"] > 0 and point["arm_sets"] == [f"spec.env.fragmentLength={length}"]
    assert "trace" not in base and tree["trace"]["actors"]["fragments"] > 0  # the tree arm is traced...
    assert tree["trace"]["actors"]["fragment_frames"] == 2 * 8  # ...with its own setting (--dry-run: 2 envs)
