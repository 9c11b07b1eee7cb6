"""A trained Nature CNN policy's int8 acting copy against the float32 network it comes from. Prints one JSON object.

    python -m bench.int8_agreement --checkpoint RUN/checkpoints/ckpt-N.pt [--steps 1500] [--episodes 10]

What spec.model.actorPrecision auto (int8 for a DQN's Nature CNN) changes in what an actor does,
measured on the saved model, out of sample (fresh episodes, not the frames it trained on):
  agreement  the float32 network plays greedily for `--steps` steps on 8 envs; on every frame the
             int8 copy (algos/models.Int8Policy, the actor's) scores the same batch (DQN: Q-values;
             PPO: logits): the share of frames whose argmax differs (`argmax_differs`), and the
             largest |Δscore| against the float32 scores' spread across actions (`dq_over_spread`:
             mean, and 99th percentile);
  returns    `--episodes` evaluation episodes of each (as `tianji eval`: DQN ε 0.05, PPO the
             logits' mode), the same env seeds.
A DQN actor's ε never goes under spec.algorithm.epsilonEnd (0.01 in the Pong example): an argmax
that differs less often than that changes less of what the actor does than its own exploration.
A trained PPO checkpoint stands in for a trained Nature CNN where no trained DQN is at hand.
"""
from __future__ import annotations

import argparse
import time

from bench.harness import emit, loadavg, stamp


def agreement(model, copy, algo: str, env, steps: int, seed: int) -> dict:
    import numpy as np
    import torch

    scores = (lambda m, x: m.logits(x)) if algo == "ppo" else (lambda m, x: m(x))  # noqa: E731
    obs, _ = env.reset(seed=seed)
    differs, rel = 0, []
    with torch.inference_mode():
        for _ in range(steps):
            x = torch.from_numpy(obs)
            q, q8 = scores(model, x), scores(copy, x)
            differs += int((q.argmax(-1) != q8.argmax(-1)).sum())
            spread = (q.amax(-1) - q.amin(-1)).clamp_min(1e-6)
            rel.append(((q8 - q).abs().amax(-1) / spread).numpy())
            obs = env.step(q.argmax(-1).numpy())[0]
    rel = np.concatenate(rel)
    return {"frames": int(rel.size), "argmax_differs": round(differs / rel.size, 5),
            "dq_over_spread_mean": round(float(rel.mean()), 4),
            "dq_over_spread_p99": round(float(np.percentile(rel, 99)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, default=1500, help="agent steps of the agreement walk (x 8 envs)")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    import torch
    import yaml

    from tianji.algos.models import Int8Policy, build_model
    from tianji.control.spec import parse_job
    from tianji.envs import env_info, make_vec_env
    from tianji.runtime import checkpoint
    from tianji.runtime.evaluation import DQN_EVAL_EPSILON, play_episodes

    torch.set_num_threads(1)  # as in an actor
    before = loadavg()
    state = checkpoint.load(a.checkpoint)
    job = parse_job(yaml.safe_load(state["manifest"]), a.checkpoint)
    algo = job.spec.algorithm.name
    env = make_vec_env(job.spec.env, 8)
    info = env_info(env)
    model = build_model(job.spec.algorithm, job.spec.model, info, job.spec.env.seed, job.spec.env.imports)
    model.load_state_dict(state["model"])
    model.eval()
    copy = Int8Policy(model)
    t0 = time.time()
    out = {"bench": "int8_agreement", **stamp("int8_agreement"), "checkpoint": a.checkpoint,
           "policy_version": int(state["policy_version"]),
           "algo": algo, "agreement": agreement(model, copy, algo, env, a.steps, a.seed)}
    out["int8_refused"] = copy.refused
    returns = {}
    for name, policy in (("float32", model), ("int8", copy)):
        eps = DQN_EVAL_EPSILON if algo == "dqn" else 0.0
        quota = play_episodes(policy, env, info, algo, a.episodes, eps, a.seed + 1)
        r = quota.all_returns()
        returns[name] = {"mean": round(float(r.mean()), 2), "std": round(float(r.std()), 2), "episodes": int(r.size)}
    env.close()
    out.update(returns=returns, seconds=round(time.time() - t0, 1), host={"loadavg_before": before})
    emit(out, a.out)


if __name__ == "__main__":
    main()
