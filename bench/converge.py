"""Time to solve CartPole: TianJi (`tianji run`) vs a single-process Stable-Baselines3 baseline.

Runs, side by side in one invocation, for each algorithm and seed:
  * TianJi on examples/cartpole-{ppo,dqn}.yaml (with --stop-at-target, stopping at mean-100 >= 475);
  * SB3 with rl-zoo's CartPole hyperparameters, in its own process, one torch thread (--sb3-threads);
  * PPO: SB3 again at the example's own settings (`sb3_tianji_settings`: its 10 epochs, batch, envs and
    lr annealed over 400k frames, where rl-zoo runs 20 epochs and anneals lr and clip over 100k);
  * with --spawn, TianJi again with each worker spawned afresh (no pre-imported template).
Both clocks start when the process is launched (imports and start-up included)
and read the first time the mean of the last 100 finished episodes reaches 300
and 475; `pairs` gives, per seed, TianJi's time to 475 over each baseline's on the same seed (the
runs of one seed go back to back) and the median of those ratios. TianJi's crossings are read
from metrics.jsonl (1 s records; with --stop-at-target the 475-crossing from summary.json).
Unless --stop-at-target, every run goes on to the budget (SB3: to rl-zoo's n_timesteps or the
budget) and reports, per target, its stability after the first crossing: the minimum and final
mean-100 and held_fraction, the share of the remaining time at or above it.
Prints one JSON object.

    python -m bench.converge [--algos ppo,dqn] [--seeds 1,2,3] [--budget-s 300]
    python -m bench.converge --topology auto     # TianJi with `topology: auto` vs the hand-picked one
    python -m bench.converge --algos ppo --spawn # start-up: forked from the template vs spawned
    python -m bench.converge --algos ppo --quota-depth 3 --no-baseline --stop-at-target  # actors a share deeper
    python -m bench.converge --algos ppo --seeds 1,2,3,4,5 --stop-at-target --out docs/results/converge-ppo.json

SB3 runs in its own pinned environment when `make peers` made one (bench/peers/.venv-sb3), else in
this interpreter if it has SB3 (`pip install -e .[bench]`); without either the baseline is reported
as unavailable.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, launch_offset, run_job, stamp

THRESHOLDS = (300.0, 475.0)

SB3_SCRIPT = r'''
import json, sys, time, collections
t_launch = float(sys.argv[3])
import numpy as np, torch
torch.set_num_threads(%(threads)d)
import gymnasium as gym
from stable_baselines3 import PPO, DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
algo, seed = sys.argv[1], int(sys.argv[2])
thresholds = %(thresholds)r
budget_s, stop_at_target = float(sys.argv[4]), sys.argv[5] == "1"
class Watch(BaseCallback):
    def __init__(self):
        super().__init__(); self.rets = collections.deque(maxlen=100); self.hit = {}; self.curve = []
    def _on_step(self):
        now = time.time() - t_launch
        for info in self.locals.get("infos", []):
            if "episode" in info:
                self.rets.append(info["episode"]["r"])
                if len(self.rets) == 100:  # the monitor curve: mean-100 after every finished episode
                    self.curve.append((round(now, 3), float(np.mean(self.rets)), self.num_timesteps))
        if len(self.rets) == 100:
            m = float(np.mean(self.rets))
            for th in thresholds:
                if m >= th and th not in self.hit:
                    self.hit[th] = now
        if now >= budget_s:
            return False
        return len(self.hit) < len(thresholds) or not stop_at_target
lin = lambda v: (lambda p: p * v)
settings = json.loads(sys.argv[6])
if algo == "ppo" and settings:  # TianJi's example settings (tianji_settings()): its epochs, batch, lr schedule
    steps = 100_000
    anneal = settings.pop("lr_anneal_frames")  # TianJi anneals to 0 over these frames; SB3's p runs 1 -> 0 over steps
    lr0 = settings.pop("learning_rate")
    lr = (lambda p: lr0 * max(0.0, 1.0 - (1.0 - p) * steps / anneal)) if anneal else lr0
    env = make_vec_env("CartPole-v1", n_envs=settings.pop("n_envs"), seed=seed)
    model = PPO("MlpPolicy", env, learning_rate=lr, seed=seed, verbose=0, device="cpu", **settings)
elif algo == "ppo":
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, verbose=0, device="cpu")
    steps = 100_000  # rl-zoo n_timesteps: the linear schedules span exactly this
else:
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                seed=seed, verbose=0, device="cpu")
    steps = 50_000  # rl-zoo n_timesteps
w = Watch()
model.learn(total_timesteps=steps, callback=w)
print(json.dumps({"hit": {str(k): v for k, v in w.hit.items()}, "curve": w.curve, "end_s": time.time() - t_launch}))
'''


def stability(curve: list[tuple], end_s: float | None = None) -> dict:
    """Per target, from a (seconds, mean-100[, env frames]) curve: after the first crossing, the minimum and the
    final mean-100 and `held_fraction`, the share of the remaining time (to end_s, else the last point) that
    mean-100 stayed >= the target (each point holds until the next); with frames, those at the crossing."""
    out = {}
    for th in THRESHOLDS:
        i = next((k for k, p in enumerate(curve) if p[1] >= th), None)
        if i is None:
            out[str(th)] = None
            continue
        rest = curve[i:]
        end = max(end_s if end_s is not None else rest[-1][0], rest[-1][0])
        span = end - rest[0][0]
        held = sum(min(q[0], end) - p[0] for p, q in zip(rest, [*rest[1:], (end,)]) if p[1] >= th)
        out[str(th)] = {"after_s": round(rest[0][0], 2), "min": round(min(p[1] for p in rest), 1),
                        "final": round(rest[-1][1], 1), "held_fraction": round(held / span, 3) if span > 0 else 1.0}
        if len(rest[0]) > 2:
            out[str(th)]["frames_at"] = int(rest[0][2])
    return out


def tianji_run(algo: str, seed: int, budget_s: float, overrides: list[str], env: dict | None = None,
               stop_at_target: bool = False) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"conv-{algo}-"))
    job = ROOT / "examples" / f"cartpole-{algo}.yaml"
    # Without --stop-at-target the run goes on for the whole budget (475 is unreachable as a stop:
    # mean-100 tops out at 500 only if every episode is perfect, so stop at 501), so that stability is seen.
    stop = "475" if stop_at_target else "501"
    sets = [f"spec.env.seed={seed}", f"spec.stop.meanReturn={stop}", "spec.stop.envFrames=100000000",
            f"spec.stop.seconds={budget_s}", *overrides]
    t_launch = time.time()
    done = run_job(job, sets, run, timeout=budget_s + 120, env=env)
    s = done.summary()
    pre = launch_offset(run, t_launch)  # onto the same launch-to-target clock as SB3's
    hit, curve, q = {}, [], []
    for r in done.records():
        if (r.get("learner") or {}).get("q_mean") is not None:
            q.append(r["learner"]["q_mean"])
        if r["mean_return"] is None or r["episodes"] < 100:
            continue
        curve.append((r["t"] + pre, r["mean_return"], r["env_frames"]))
        for th in THRESHOLDS:
            if r["mean_return"] >= th:
                hit.setdefault(str(th), r["t"])
    if s["seconds_to_target"] is not None and stop_at_target:  # exact, where the run stopped on it
        hit["475.0"] = s["seconds_to_target"]
        hit.setdefault("300.0", s["seconds_to_target"])
    hit = {k: round(v + pre, 3) for k, v in hit.items()}
    out = {"seconds": hit, "launcher_start_s": round(pre, 3), "env_frames": s["env_frames"],
           "policy_lag_mean": s["policy_lag"]["mean"], "consumed_sps": round(s["throughput"]["consumed_sps"]),
           "exit_reason": s["exit_reason"], "run_dir": str(run),
           "check_s": (s.get("target_evaluation") or {}).get("seconds"),  # the trigger to the saved policy's verdict
           "stability": stability(curve, curve[-1][0] if curve else None)}
    if q:
        out["q_mean_max"], out["q_mean_final"] = round(max(q), 2), round(q[-1], 2)
    return out


def tianji_settings(algo: str) -> dict:
    """SB3's PPO arguments for the example's own settings: the same envs in all, rollout length, batch,
    epochs, minibatch, discounting, clip and lr schedule (rl-zoo's: 20 epochs, lr and clip annealed
    over 100k steps; the example's: its own epochs and minibatch, lr annealed over its lrAnnealFrames,
    clip fixed)."""
    from tianji.control.spec import load_job

    job = load_job(ROOT / "examples" / f"cartpole-{algo}.yaml")
    a, e, t = job.spec.algorithm, job.spec.env, job.spec.topology
    return {"n_envs": e.num_envs * t.actors, "n_steps": e.fragment_length, "batch_size": a.minibatch_size,
            "n_epochs": a.epochs, "gamma": a.gamma, "gae_lambda": a.gae_lambda, "clip_range": a.clip_coef,
            "ent_coef": a.ent_coef, "vf_coef": a.vf_coef, "max_grad_norm": a.max_grad_norm,
            "learning_rate": a.lr, "lr_anneal_frames": a.lr_anneal_frames}


SB3_VENV_PYTHON = ROOT / "bench" / "peers" / ".venv-sb3" / "bin" / "python"


def sb3_python() -> str | None:
    """The interpreter SB3 runs in: the peers' pinned environment (`make peers`), else this one if it has
    SB3; None where neither does."""
    if (SB3_VENV_PYTHON.parent.parent / ".installed").exists():
        return str(SB3_VENV_PYTHON)
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def sb3_run(algo: str, seed: int, budget_s: float, threads: int, stop_at_target: bool = False,
            settings: dict | None = None) -> dict:
    python = sb3_python()
    if python is None:
        return {"unavailable": "no SB3: `make peers` (or pip install stable-baselines3)"}
    script = SB3_SCRIPT % {"threads": threads, "thresholds": THRESHOLDS}
    t = time.time()
    try:  # the script stops itself at the budget; the timeout is a backstop
        p = subprocess.run([python, "-c", script, algo, str(seed), repr(t), repr(budget_s),
                            "1" if stop_at_target else "0", json.dumps(settings or {})],
                           capture_output=True, text=True, timeout=budget_s + 60)
    except subprocess.TimeoutExpired:
        return {"seconds": {}, "timeout": budget_s}
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    # SB3 runs rl-zoo's n_timesteps (its schedules span exactly those), so its curve may end before the budget.
    return {"seconds": r["hit"], "end_s": round(r["end_s"], 2),
            "stability": stability([tuple(c) for c in r["curve"]], r["end_s"])}


def med(runs: list[dict], th: str) -> float | None:
    v = [r["seconds"][th] for r in runs if th in r.get("seconds", {})]
    return round(statistics.median(v), 2) if v else None


def held(runs: list[dict], th: str) -> dict | None:
    """Median held_fraction and the worst minimum after the first crossing of th, over the runs that crossed."""
    st = [r["stability"][th] for r in runs if (r.get("stability") or {}).get(th)]
    if not st:
        return None
    return {"held_fraction_median": round(statistics.median(x["held_fraction"] for x in st), 3),
            "min_worst": min(x["min"] for x in st), "final_median": round(statistics.median(x["final"] for x in st), 1)}


def pair_ratios(res: dict, seeds: list[int]) -> dict:
    """Per seed, TianJi's launch-to-475 time over each baseline's on the same seed (run back to back,
    so the machine's load hits both alike), and the median of those ratios: below 1, TianJi is faster.
    A pair where either side missed 475 is left out of the median and listed as None."""
    th, out = str(THRESHOLDS[-1]), {}
    for tj in (k for k in res if k.startswith("tianji_")):
        for base in ("sb3", "sb3_tianji_settings"):
            if base not in res:
                continue
            per = [round(t["seconds"][th] / b["seconds"][th], 3) if th in t.get("seconds", {})
                   and th in b.get("seconds", {}) else None for t, b in zip(res[tj], res[base])]
            done = [r for r in per if r is not None]
            out[f"{tj}_over_{base}"] = {"seeds": seeds, "ratios": per,
                                        "median": round(statistics.median(done), 3) if done else None}
    return out


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=spec.a=1,spec.b=2` -> (NAME, ["spec.a=1", "spec.b=2"]); ("", []) when malformed."""
    name, _, rest = text.partition("=")
    sets = [x.strip() for x in rest.split(",") if x.strip()]
    if not name.isidentifier() or not sets or not all(x.startswith("spec.") and "=" in x for x in sets):
        return "", []
    return name, sets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="ppo,dqn")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--topology", choices=["hand", "auto", "both"], default="hand",
                    help="TianJi topology: the example's hand-picked one, the planner's (`auto`), or both")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--sb3-threads", type=int, default=1, help="torch threads of the SB3 process (issue: one)")
    ap.add_argument("--stop-at-target", action="store_true",
                    help="stop each run at mean-100 >= 475 (faster; no stability after 475)")
    ap.add_argument("--spawn", action="store_true",
                    help="also run TianJi with every worker spawned afresh (TIANJI_ZYGOTE=0): start-up before/after")
    ap.add_argument("--quota-depth", type=int, default=None, metavar="N",
                    help="also run TianJi with actors N shares of a batch ahead (TIANJI_BENCH_QUOTA_DEPTH; "
                         "default creditWindow + 1)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH=V[,PATH=V...]",
                    help="also run TianJi with these spec overrides, interleaved per seed (repeatable), e.g. "
                         "lr2=spec.algorithm.lr=2e-3")
    ap.add_argument("--no-sb3-tianji-settings", action="store_true",
                    help="PPO: leave out SB3 run at the example's epochs/batch/lr (rl-zoo's settings only)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/converge-ppo.json: bench.render_docs "
                                  "renders it)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    out = {"bench": "converge", **stamp("converge"),
           "sb3_settings": {"sb3": "rl-zoo's CartPole settings",
                            "sb3_tianji_settings": "the example's settings (tianji_settings())"},
           "machine_cores": os.cpu_count(), "sb3_threads": a.sb3_threads, "thresholds": THRESHOLDS, "results": {},
           "loadavg_start": list(os.getloadavg())}
    variants = {"hand": ([], None), "auto": (["spec.topology=auto"], None), "spawn": ([], {"TIANJI_ZYGOTE": "0"})}
    chosen = ["hand", "auto"] if a.topology == "both" else [a.topology]
    if a.spawn:
        chosen.append("spawn")
    if a.quota_depth is not None:
        variants[f"depth{a.quota_depth}"] = ([], {"TIANJI_BENCH_QUOTA_DEPTH": str(a.quota_depth)})
        chosen.append(f"depth{a.quota_depth}")
    for v in a.variant:
        name, sets = parse_variant(v)
        if not name or name in variants:
            ap.error(f"--variant {v!r}: NAME=spec.path=value[,spec.path=value...] with a new NAME")
        variants[name] = (sets, None)
        chosen.append(name)
        out.setdefault("variants", {})[f"tianji_{name}"] = sets
    for algo in a.algos.split(","):
        res: dict = {}
        for seed in seeds:  # interleave systems per seed: shared-machine noise hits both alike
            for v in chosen:
                res.setdefault(f"tianji_{v}", []).append(tianji_run(algo, seed, a.budget_s, *variants[v],
                                                                    stop_at_target=a.stop_at_target))
            if not a.no_baseline:
                res.setdefault("sb3", []).append(sb3_run(algo, seed, a.budget_s, a.sb3_threads, a.stop_at_target))
                if algo == "ppo" and not a.no_sb3_tianji_settings:
                    res.setdefault("sb3_tianji_settings", []).append(sb3_run(
                        algo, seed, a.budget_s, a.sb3_threads, a.stop_at_target, tianji_settings(algo)))
        summary = {k: {str(th): med(v, str(th)) for th in THRESHOLDS} | {
            "solved": sum(1 for r in v if str(THRESHOLDS[-1]) in r.get("seconds", {})), "runs": len(v),
            "stability": {str(th): held(v, str(th)) for th in THRESHOLDS}}
            for k, v in res.items()}
        for base in ("sb3", "sb3_tianji_settings"):
            for v in chosen if base in summary else ():
                t, b = summary[f"tianji_{v}"][str(THRESHOLDS[-1])], summary[base][str(THRESHOLDS[-1])]
                summary[f"speedup_475_{v}_vs_{base}"] = round(b / t, 2) if t and b else None
        out["results"][algo] = {"median_seconds": summary, "pairs": pair_ratios(res, seeds), "runs": res}
        print(json.dumps(out["results"][algo]["median_seconds"]), file=sys.stderr)
    out["loadavg_end"] = list(os.getloadavg())
    emit(out, a.out)


if __name__ == "__main__":
    main()
