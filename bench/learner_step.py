"""An Atari PPO learner's ceiling on this CPU: samples per second through the real update
(`PPOLearner.update`: the value pass over the batch, then epochs x minibatches of Nature-CNN steps).
Prints one JSON object.

    python -m bench.learner_step [--job examples/pong-ppo.yaml] [--threads 1,2] [--set K=V] [--reps 3]

Per torch thread count, the update's samples/s with the Nature CNN's input in the default layout
and in channels-last (the learner's default on a CPU, `NatureCNN.channels_last_training`), both
layouts alternating on the same batch, and the ratio. `bound_sps` is the learner's ceiling:
a job consumes at most this many samples/s per learner process, whatever its actors produce.
"""
from __future__ import annotations

import argparse
import os
import time

from bench.harness import ROOT, emit, loadavg, stamp

PRESET_CPU = ["spec.algorithm.batchSize=512", "spec.algorithm.minibatchSize=128", "spec.algorithm.epochs=2"]


def batch(job, info, rng):
    import numpy as np

    T, N = job.spec.env.fragment_length, job.spec.algorithm.batch_size // job.spec.env.fragment_length
    shape = (T, N, *info.obs_shape)
    return {"obs": rng.integers(0, 256, shape, dtype=np.uint8),
            "actions": rng.integers(0, info.n_actions, (T, N)).astype(np.int64),
            "logp": np.full((T, N), -np.log(info.n_actions), np.float32),
            "rewards": rng.choice([-1.0, 0.0, 1.0], (T, N), p=[0.01, 0.98, 0.01]).astype(np.float32),
            "dones": np.zeros((T, N), bool), "terminated": np.zeros((T, N), bool), "valid": np.ones((T, N), bool),
            "last_obs": rng.integers(0, 256, (N, *info.obs_shape), dtype=np.uint8),
            "versions": np.zeros(N, np.int64)}


def measure(job, threads: int, reps: int) -> dict:
    import numpy as np
    import torch

    from tianji.algos.models import NatureCNN, build_model
    from tianji.algos.ppo import PPOLearner
    from tianji.envs import EnvInfo

    torch.set_num_threads(threads)
    info = EnvInfo((job.spec.env.frame_stack, 84, 84), "uint8", 6)
    learner = PPOLearner(build_model(job.spec.algorithm, job.spec.model, info, 0), job.spec.algorithm, 0)
    b = batch(job, info, np.random.default_rng(0))
    times: dict[str, list[float]] = {"default": [], "channels_last": []}
    learner.update(b)  # warm-up: oneDNN's kernels are chosen on the first calls
    try:
        for _ in range(reps):
            for layout in times:  # alternate, so drift in the machine's load hits both alike
                NatureCNN.channels_last_training = layout == "channels_last"
                t = time.perf_counter()
                learner.update(b)
                times[layout].append(time.perf_counter() - t)
    finally:
        NatureCNN.channels_last_training = True
    n = job.spec.algorithm.batch_size
    sps = {k: round(n / min(v), 1) for k, v in times.items()}  # best of reps: the least disturbed
    return {"threads": threads, "samples_per_s": sps, "speedup": round(sps["channels_last"] / sps["default"], 3),
            "bound_sps": sps["channels_last"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "examples" / "pong-ppo.yaml"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                    help="overrides (default: bench.pong's CPU preset, 2 epochs of 4 minibatches of 128)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/learner-step.json: bench.render_docs "
                                  "renders it)")
    args = ap.parse_args()
    from tianji.control.spec import load_job

    sets = PRESET_CPU if args.set is None else args.set
    job = load_job(args.job, sets)
    a = job.spec.algorithm
    out = {"bench": "learner_step", **stamp("learner_step"), "job": os.path.relpath(args.job, ROOT),
           "sets": sets,
           "update": {"batch": a.batch_size, "minibatch": a.minibatch_size, "epochs": a.epochs},
           "points": [measure(job, int(t), args.reps) for t in args.threads.split(",")],
           "host": {"loadavg": loadavg()}}
    emit(out, args.out)


if __name__ == "__main__":
    main()
