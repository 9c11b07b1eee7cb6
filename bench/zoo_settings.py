"""A peer's settings, honoured: TianJi on a job that copies rl-baselines3-zoo's PPO settings for a
task against Stable-Baselines3 running rl-zoo's own entry, seed by seed, back to back.

Both clocks start at the process's launch; each run stops at the first mean of the last 100 episodes
at or above the target (TianJi: the launcher's crossing, confirmed by the saved policy's evaluation;
SB3: its Monitor's episodes). `pairs` gives, per seed, TianJi's frames and seconds to the target over
SB3's, and their medians: the issue's bar is frames <= SB3's. `--variant` runs the job again with
`--set`s (e.g. `frag256=spec.env.fragmentLength=256`), in the same pairs. Prints one JSON object.

    python -m bench.zoo_settings                                   # bench/jobs/acrobot-ppo-rlzoo.yaml, seeds 1,2
    python -m bench.zoo_settings --seeds 1,2,3 --variant frag32=spec.env.fragmentLength=32 --out /tmp/zoo.json

SB3 runs in `make peers`'s pinned environment (bench/peers/.venv-sb3), else in this interpreter if it
has SB3; without either the baseline is reported as unavailable.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.converge import parse_variant, sb3_python
from bench.harness import ROOT, emit, launch_offset, run_job, stamp

JOB = ROOT / "bench" / "jobs" / "acrobot-ppo-rlzoo.yaml"

# rl-baselines3-zoo hyperparams/ppo.yml, per env id: what SB3 runs (its PPO defaults for the rest).
ZOO = {"Acrobot-v1": {"n_envs": 16, "n_timesteps": 1_000_000, "normalize": True,
                      "ppo": {"n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0}}}

SB3_SCRIPT = r'''
import collections, json, sys, time
t_launch = float(sys.argv[2])
import numpy as np, torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
a = json.loads(sys.argv[1])
class Watch(BaseCallback):
    def __init__(self):
        super().__init__(); self.rets = collections.deque(maxlen=100); self.hit = None
    def _on_step(self):
        for info in self.locals.get("infos", []):
            if "episode" in info:  # the Monitor under VecNormalize: raw returns
                self.rets.append(info["episode"]["r"])
        if self.hit is None and len(self.rets) == 100 and float(np.mean(self.rets)) >= a["target"]:
            self.hit = {"seconds": time.time() - t_launch, "frames": self.num_timesteps,
                        "mean_return": float(np.mean(self.rets))}
        return self.hit is None and time.time() - t_launch < a["budget_s"]
env = make_vec_env(a["env_id"], n_envs=a["n_envs"], seed=a["seed"])
if a["normalize"]:
    env = VecNormalize(env)
model = PPO("MlpPolicy", env, seed=a["seed"], verbose=0, device="cpu", **a["ppo"])
w = Watch()
model.learn(total_timesteps=a["n_timesteps"], callback=w)
print(json.dumps({"hit": w.hit, "frames": model.num_timesteps, "end_s": time.time() - t_launch}))
'''


def tianji_run(job: Path, seed: int, target: float, budget_s: float, sets: list[str]) -> dict:
    run = Path(tempfile.mkdtemp(prefix="zoo-"))
    t_launch = time.time()
    done = run_job(job, [f"spec.env.seed={seed}", f"spec.stop.meanReturn={target}", f"spec.stop.seconds={budget_s}",
                         *sets], run, timeout=budget_s + 180)
    s = done.summary()
    pre = launch_offset(run, t_launch)
    reached = bool(s["reached_target"])
    return {"reached": reached, "frames": s["frames_to_target"] if reached else None,
            "seconds": round(s["seconds_to_target"] + pre, 2) if reached else None,
            "dependencies": s.get("dependencies"), "env_frames": s["env_frames"],
            "dropped_stale": s["dropped_samples"].get("stale", 0),
            "policy_lag_mean": s["policy_lag"]["mean"], "exit_reason": s["exit_reason"], "run_dir": str(run)}


def sb3_run(env_id: str, seed: int, target: float, budget_s: float) -> dict:
    python = sb3_python()
    if python is None:
        return {"unavailable": "no SB3: `make peers` (or pip install stable-baselines3)"}
    zoo = ZOO[env_id]
    args = {"env_id": env_id, "seed": seed, "target": target, "budget_s": budget_s, **zoo}
    t = time.time()
    try:
        p = subprocess.run([python, "-c", SB3_SCRIPT, json.dumps(args), repr(t)], capture_output=True, text=True,
                           timeout=budget_s + 120)
    except subprocess.TimeoutExpired:
        return {"reached": False, "timeout": budget_s}
    if p.returncode != 0:
        return {"error": p.stderr[-800:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    hit = r["hit"] or {}
    rollout = zoo["n_envs"] * zoo["ppo"]["n_steps"]
    return {"reached": bool(hit), "frames": hit.get("frames"),
            "frames_rollout_end": -(-hit["frames"] // rollout) * rollout if hit else None,
            "seconds": round(hit["seconds"], 2) if hit else None, "env_frames": r["frames"]}


# (name, TianJi's field, SB3's field). TianJi sees a crossing when a batch's fragments arrive, SB3 at
# the step: `frames_rollout_end` is SB3's count at the end of the rollout it crossed in, the frames
# its policy of that moment had been given at TianJi's resolution.
RATIOS = (("frames", "frames", "frames"), ("frames_rollout_end", "frames", "frames_rollout_end"),
          ("seconds", "seconds", "seconds"))


def pairs(runs: list[dict], seeds: list[int]) -> dict:
    """Per seed, each TianJi arm's frames and seconds to the target over SB3's, and the median and
    geometric mean of the seeds where both reached it (None where either did not)."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in runs if r["arm"] != "sb3"):
        for what, mine, theirs in RATIOS:
            per = []
            for seed in seeds:
                t, b = by.get((arm, seed), {}), by.get(("sb3", seed), {})
                per.append(round(t[mine] / b[theirs], 3) if t.get(mine) and b.get(theirs) else None)
            done = [x for x in per if x is not None]
            out[f"{arm}_over_sb3_{what}"] = {
                "seeds": seeds, "ratios": per, "median": round(statistics.median(done), 3) if done else None,
                "geomean": round(math.exp(statistics.fmean(map(math.log, done))), 3) if done else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default=str(JOB))
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--target", type=float, default=-100.0, help="mean-100 return that ends each run")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH=V[,PATH=V...]",
                    help="TianJi again with these --sets, e.g. frag256=spec.env.fragmentLength=256")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    from tianji.control.spec import load_job

    job = Path(a.job).resolve()
    env_id = load_job(job).spec.env.id
    if env_id not in ZOO:
        ap.error(f"{job}: no rl-zoo entry kept here for {env_id} (known: {', '.join(ZOO)})")
    variants = dict(parse_variant(v) for v in a.variant)
    if "" in variants:
        ap.error("--variant NAME=spec.path=value[,spec.path=value...]")
    seeds = [int(s) for s in a.seeds.split(",")]
    arms = {"tianji": [], **{f"tianji_{k}": sets for k, sets in variants.items()}}
    runs: list[dict] = []
    for seed in seeds:  # one seed's runs back to back: the machine's load hits the pair alike
        for arm, sets in [*arms.items(), ("sb3", None)]:
            load = round(os.getloadavg()[0], 2)
            r = (sb3_run(env_id, seed, a.target, a.budget_s) if sets is None
                 else tianji_run(job, seed, a.target, a.budget_s, sets))
            runs.append({"arm": arm, "seed": seed, "load1_before": load, **r})
            print(f"zoo settings: {arm}, seed {seed}: {r.get('frames')} frames, {r.get('seconds')} s",
                  file=sys.stderr)
    shown = job.relative_to(ROOT) if job.is_relative_to(ROOT) else job
    doc = {"bench": "zoo_settings", **stamp("zoo_settings", argv), "job": str(shown),
           "env": env_id, "target": a.target, "budget_s": a.budget_s, "zoo": ZOO[env_id], "variants": variants,
           "runs": runs, "pairs": pairs(runs, seeds)}
    emit(doc, a.out)
    return 0 if any(r.get("reached") for r in runs if r["arm"] != "sb3") else 1


if __name__ == "__main__":
    raise SystemExit(main())
