"""Where an Atari actor's CPU goes, per agent step. Prints one JSON object.

    python -m bench.actor_profile [--job examples/pong-dqn.yaml] [--num-envs 8,16,32] [--steps 200] [--set K=V]
                                  [--inference torch,onnx,torch:bfloat16,torch:int8]

Per num_envs, CPU µs (time.process_time: every thread of this process, ALE's included) per
agent step of one actor's loop (runtime/rollout.py, one torch thread, one ALE thread):
  env_step   the preprocessed vector env alone, random actions;
  policy     Rollout.act (forward + action selection) at the job's actorPrecision, and the
             float32 / bfloat16 forward alone (`forward_fp32`, `forward_bf16`; `forward_bf16_module`:
             the bf16 copy through nn.Conv2d / nn.Linear, without oneDNN's fused kernels);
  writes     the fragment writes of one step (obs copy + the small arrays);
  policy_sync  what a new version costs a bf16 / int8 copy (sync, and the int8 kernels' build), µs;
  loop       whole fragments; `other` = loop - env_step - policy - writes.
  side_by_side  env_step and loop again, timed in alternation (a fragment's worth of env steps, then
             a fragment, as many rounds as the loop's fragments): `ratio_side_by_side` is the
             ratio with both sides under the same drift of a shared machine's speed.
Per num_envs, once per `--inference` runtime (spec.actor.inference; default torch, and onnx where
ONNX Runtime is installed; `RUNTIME:PRECISION` also sets spec.model.actorPrecision, as
`torch:bfloat16`), in turn: `points` are the first runtime's, `by_inference` all of them
(`policy_us` and `forward_runtime_us` are the runtime's own) and `ratio_by_inference` their
actor/bare-env ratios side by side, each against the mean of the runs' env-step times (the env is
the same whatever the runtime; on a loaded machine two 200-step samples of it differed by 30 %).
Also the Nature CNN's FLOPs per frame, the GFLOP/s its float32 forward reaches and this core's
float32 / bfloat16 matmul GFLOP/s (1024^3), i.e. the physical bound on inference, and
`ratio_bound_fp32` = env_step / (env_step + FLOPs / fp32 matmul peak): the best actor/env ratio
float32 inference allows on this CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from bench.harness import ROOT, emit, loadavg, stamp

os.environ.setdefault("OMP_NUM_THREADS", "1")


def nature_cnn_flops(c: int = 4, n_actions: int = 6) -> int:
    macs = (20 * 20 * 32 * c * 8 * 8 + 9 * 9 * 64 * 32 * 4 * 4 + 7 * 7 * 64 * 64 * 3 * 3
            + 64 * 7 * 7 * 512 + 512 * n_actions)
    return 2 * macs


def matmul_gflops(dtype, n: int = 1024, reps: int = 20) -> float:
    import torch

    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t0 = time.process_time()
    for _ in range(reps):
        a @ b
    return 2 * n ** 3 * reps / (time.process_time() - t0) / 1e9


def _module_path(policy):
    """The bf16 copy without oneDNN's fused kernels (algos/onednn.py): nn.Conv2d / nn.Linear."""
    from tianji.algos.models import _Bf16NatureCNN

    for m in policy.modules():
        if isinstance(m, _Bf16NatureCNN):
            m.fused = False
    return policy


def profile(job_path: str, sets: list, n: int, steps: int, inference: str = "torch") -> dict:
    import numpy as np
    import torch

    from tianji.algos.models import Bf16Policy
    from tianji.control.spec import load_job
    from tianji.runtime.profiling.profiler import ActorLoop

    cpu = time.process_time
    runtime, _, precision = inference.partition(":")
    sets = [*sets, f"spec.env.numEnvs={n}", f"spec.actor.inference={runtime}"]
    loop = ActorLoop(load_job(job_path, sets + ([f"spec.model.actorPrecision={precision}"] if precision else [])))
    try:
        loop.fragment()  # warm-up
        rng = np.random.default_rng(0)
        per = lambda t0, k: (cpu() - t0) / (k * n) * 1e6  # noqa: E731
        t0 = cpu()
        for _ in range(steps):
            loop.env.step(rng.integers(0, loop.info.n_actions, n))
        env_us = per(t0, steps)
        obs = loop.obs
        t0 = cpu()
        for _ in range(steps):
            loop.act(obs)
        act_us = per(t0, steps)
        x = torch.from_numpy(obs)
        fwd = {}
        forward = loop.policy.logits if loop.algo == "ppo" else loop.policy
        for name, m in (("fp32", loop.model), ("bf16", Bf16Policy(loop.model)),
                        ("bf16_module", _module_path(Bf16Policy(loop.model))), ("runtime", forward)):
            with torch.inference_mode():
                m(x)
                t0 = cpu()
                for _ in range(steps):
                    m(x)
            fwd[name] = per(t0, steps)
        buf = loop._new_fragment()
        a, r, d = np.zeros(n, np.int64), np.zeros(n, np.float64), np.zeros(n, bool)
        t0 = cpu()
        for i in range(steps):
            t = i % loop.T
            buf["obs"][t] = obs
            buf["actions"][t] = a
            buf["valid"][t] = ~d
            buf["dones"][t] = d
            buf["terminated"][t] = d
            buf["rewards"][t] = np.sign(r)
        wr_us = per(t0, steps)
        frags = max(2, steps // loop.T)
        t0 = cpu()
        for _ in range(frags):
            loop.fragment()
        loop_us = per(t0, frags * loop.T)
        side = _side_by_side(loop, rng, frags)
        sync_us = _copy_sync_us(loop, obs, act_us)
        return {"num_envs": n, "inference": loop.runtime.name, "actor_precision": loop.runtime.precision,
                "env_step_us": round(env_us, 1),
                "policy_us": round(act_us, 1), "forward_runtime_us": round(fwd["runtime"], 1),
                "forward_fp32_us": round(fwd["fp32"], 1), "forward_bf16_us": round(fwd["bf16"], 1),
                "forward_bf16_module_us": round(fwd["bf16_module"], 1),
                "writes_us": round(wr_us, 1), "loop_us": round(loop_us, 1), "policy_sync_us": sync_us,
                "other_us": round(loop_us - env_us - act_us - wr_us, 1),
                "ratio_per_cpu_second": round(env_us / loop_us, 3), **side,
                "forward_fp32_gflops": round(nature_cnn_flops(loop.info.obs_shape[0], loop.info.n_actions)
                                             / fwd["fp32"] / 1e3, 1)}
    finally:
        loop.close()


def _copy_sync_us(loop, obs, act_us: float, reps: int = 5):
    """CPU µs a new version costs a torch actor's bf16 / int8 copy (its sync and, int8, the kernel
    build at the next forward), best of `reps`; None for the model itself and ONNX Runtime (whose
    session builds run on a thread of their own)."""
    from tianji.algos.models import Bf16Policy, Int8Policy

    policy = loop.policy
    if not isinstance(policy, (Bf16Policy, Int8Policy)):
        return None
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        policy.sync()
        loop.act(obs)
        best = min(best, time.process_time() - t0)
    return round(best * 1e6 - act_us * loop.n, 1)


def _side_by_side(loop, rng, rounds: int) -> dict:
    """The ratio with the env alone and the loop timed in alternation, a fragment's worth of random
    env steps then one fragment, `rounds` times: a shared machine's speed drifts by 20-30 % between
    blocks timed one after the other, and this way both sides see the same drift."""
    cpu, n, T = time.process_time, loop.n, loop.T
    env_s, loop_s, per_round = 0.0, 0.0, []
    for _ in range(rounds):
        t0 = cpu()
        for _ in range(T):
            loop.env.step(rng.integers(0, loop.info.n_actions, n))
        t1 = cpu()
        loop.fragment()
        t2 = cpu()
        env_s, loop_s = env_s + t1 - t0, loop_s + t2 - t1
        per_round.append((t1 - t0) / (t2 - t1))
    per_round.sort()
    return {"side_by_side_rounds": rounds, "side_by_side_env_step_us": round(env_s / (rounds * T * n) * 1e6, 1),
            "side_by_side_loop_us": round(loop_s / (rounds * T * n) * 1e6, 1),
            "ratio_side_by_side": round(env_s / loop_s, 3),
            "ratio_side_by_side_median_round": round(per_round[len(per_round) // 2], 3)}


def _pooled_ratios(by: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per runtime and num_envs: the mean env-step time of all runtimes' runs over this one's loop."""
    env: dict[int, list[float]] = {}
    for ps in by.values():
        for p in ps:
            env.setdefault(p["num_envs"], []).append(p["env_step_us"])
    return {m: {str(p["num_envs"]): round(sum(env[p["num_envs"]]) / len(env[p["num_envs"]]) / p["loop_us"], 3)
                for p in ps} for m, ps in by.items()}


def _onnxruntime() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default=str(ROOT / "examples" / "pong-dqn.yaml"))
    ap.add_argument("--num-envs", default="8,16,32")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--inference", help="runtimes to compare, in turn per num_envs (default: torch, and onnx "
                                        "where onnxruntime is installed)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/actor-profile.json: bench.render_docs "
                                  "renders it)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # as in an actor
    modes = a.inference.split(",") if a.inference else ["torch", *(["onnx"] if _onnxruntime() else [])]
    by = {m: [] for m in modes}
    for n in a.num_envs.split(","):
        for m in modes:
            by[m].append(profile(a.job, a.set, int(n), a.steps, m))
    rows = by[modes[0]]
    flops = nature_cnn_flops()
    peak32, peak16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    env_us = rows[0]["env_step_us"]
    bound_us = flops / peak32 / 1e3
    out = {"bench": "actor_profile", **stamp("actor_profile", argv),
           "job": os.path.relpath(a.job, ROOT), "sets": a.set, "points": rows, "by_inference": by,
           "ratio_by_inference": _pooled_ratios(by),
           "ratio_side_by_side_by_inference": {m: {str(p["num_envs"]): p["ratio_side_by_side"] for p in ps}
                                               for m, ps in by.items()},
           "nature_cnn_mflop_per_frame": round(flops / 1e6, 2),
           "matmul_gflops_fp32": round(peak32, 1), "matmul_gflops_bf16": round(peak16, 1),
           "inference_bound_fp32_us": round(bound_us, 1),
           "ratio_bound_fp32": round(env_us / (env_us + bound_us), 3),
           "torch_threads": torch.get_num_threads(), "host": {"loadavg": loadavg()}}
    emit(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
