"""`tianji profile JOB.yaml [--seconds N] [--out FILE] [--set K=V]`: measure this machine for the planner.

Everything runs in this process on one thread (torch.set_num_threads(1)), so
each figure is "per core". Rates are taken over process CPU time (all threads
of this process: the ALE worker thread, ZeroMQ's I/O thread), which keeps them
meaningful on a machine shared with other work; wall-clock rates are reported
next to them.

(a) actor production: the actor's own loop body (policy inference with the
    job's model + vectorised env step + writing the fragment arrays), frames/s;
    also the env alone with random actions (the simulation ceiling);
(b) learner consumption: the real PPOLearner / DQNLearner `update` on synthetic
    batches of the job's shapes at the job's batch size and two candidates
    (half and double), samples/s; on a CUDA machine, the same per GPU (wall
    clock, synchronised) with the model on `cuda`, at the precision the job's
    spec.algorithm.precision gives there (auto: bf16 where the GPU supports it),
    recorded with the device's name (`learner_gpu.device_name`, `.precision`);
(c) message cost: one fragment-sized message through the real wire
    (`encode` → PUSH → ipc → PULL → `decode` + the buffer's `check_fragment`),
    seconds per message, sender and receiver in this process;
(d) bytes per sample: encoded fragment bytes / samples in a fragment;
(e-g) learner thread curve, parameter bytes, all-reduce time (profile_scaling.py).

The output is a JSON object that `tianji.control.planner.plan.Profile.from_json` loads
(actor_fps_per_core, learner_sps_per_core, learner_sps_per_gpu,
message_seconds, fragment_samples, bytes_per_sample) plus detail keys.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from tianji.control.spec import PPOConfig, TianJiJob, load_job
from tianji.runtime.atomicfile import atomic_write_json
from tianji.runtime.profiling.inputs import ipc_pair, learner_class, synthetic_batch, synthetic_fragment
from tianji.runtime.rollout import Rollout

WARMUP_MAX_FRACTION = 0.25  # a first (warm-up) learner update longer than this share of the budget is the measurement


class _Clock:
    """Wall and process-CPU time since construction."""

    def __init__(self) -> None:
        self.w0, self.c0 = time.perf_counter(), time.process_time()

    def wall(self) -> float:
        return time.perf_counter() - self.w0

    def cpu(self) -> float:
        return time.process_time() - self.c0


def _rates(work: float, clock: _Clock) -> dict:
    wall, cpu = clock.wall(), clock.cpu()
    return {"per_cpu_second": work / max(cpu, 1e-9), "per_wall_second": work / max(wall, 1e-9),
            "cpu_seconds": cpu, "wall_seconds": wall}


# ----------------------------------------------------------------- (a) actor
class ActorLoop(Rollout):
    """The actor's loop body (rollout.Rollout: policy inference, env step, reward clipping,
    fragment writes) plus timing: exactly what an actor runs, without its sockets."""

    def __init__(self, job: TianJiJob, seed_offset: int = 0):
        super().__init__(job.spec, job.spec.env.seed + seed_offset)

    def run(self, seconds: float) -> dict:
        """Whole fragments for at least `seconds`; frames/s per CPU second and per wall second."""
        clock, frames = _Clock(), 0
        while True:
            self.fragment()
            frames += self.n * self.T
            if clock.wall() >= seconds:
                break
        r = _rates(frames, clock)
        return {"frames": frames, "fps_per_core": r["per_cpu_second"], "fps_wall": r["per_wall_second"],
                "cpu_seconds": r["cpu_seconds"], "wall_seconds": r["wall_seconds"]}

    def run_env_only(self, seconds: float, seed: int = 0) -> dict:
        """The simulation alone with uniformly random actions: the ceiling the actor loop can approach."""
        rng = np.random.default_rng(seed)
        clock, steps = _Clock(), 0
        while True:
            self.env.step(self.env.action_space.sample() if self.info.continuous
                          else rng.integers(0, self.info.n_actions, self.n))
            steps += 1
            if steps % 8 == 0 and clock.wall() >= seconds:
                break
        r = _rates(steps * self.n, clock)
        return {"frames": steps * self.n, "fps_per_core": r["per_cpu_second"], "fps_wall": r["per_wall_second"],
                "cpu_seconds": r["cpu_seconds"], "wall_seconds": r["wall_seconds"]}


def measure_actor(job: TianJiJob, seconds: float, env_seconds: Optional[float] = None) -> dict:
    """Actor loop (inference + env + fragment writes), env-only and inference-only frames/s, per core."""
    import torch

    loop = ActorLoop(job)
    try:
        loop.fragment()  # warm-up: first inference allocates, first env steps page in the ROM / buffers
        main = loop.run(seconds)
        env_s = seconds / 6 if env_seconds is None else env_seconds
        only = loop.run_env_only(env_s)
        clock, calls = _Clock(), 0
        while True:
            loop.act(loop.obs)
            calls += 1
            if calls % 8 == 0 and clock.wall() >= env_s:
                break
        infer = _rates(calls * loop.n, clock)
        info = loop.info
        return {
            "fps_per_core": main["fps_per_core"], "fps_wall": main["fps_wall"],
            "frames": main["frames"], "cpu_seconds": main["cpu_seconds"], "wall_seconds": main["wall_seconds"],
            "env_only_fps_per_core": only["fps_per_core"], "env_only_fps_wall": only["fps_wall"],
            "inference_fps_per_core": infer["per_cpu_second"],
            "num_envs": loop.n, "obs_shape": list(info.obs_shape), "obs_dtype": info.obs_dtype,
            "n_actions": info.n_actions, "env_backend": getattr(loop.env, "backend", type(loop.env).__name__),
            "torch_threads": torch.get_num_threads(),
        }
    finally:
        loop.close()


# ----------------------------------------------------------------- (b) learner
def candidate_batch_sizes(job: TianJiJob) -> list[int]:
    """The job's batch size first, then half and double where the spec allows them."""
    s = job.spec
    a = s.algorithm
    B = a.batch_size
    out = [B]
    if isinstance(a, PPOConfig):
        frag = s.env.num_envs * s.env.fragment_length
        for c in (B // 2, 2 * B):
            if c >= frag and c % frag == 0 and c >= 1:
                out.append(c)
    else:
        for c in (B // 2, 2 * B):
            if 1 <= c <= a.replay_capacity:
                out.append(c)
    return list(dict.fromkeys(out))


def _time_updates(update: Callable[[], dict], budget: float, sync: Callable[[], None] = lambda: None) -> dict:
    """Samples/s of repeated updates within `budget` seconds (first one a warm-up if it is short)."""
    clock = _Clock()
    stats = update()
    sync()
    first_wall, first_cpu, first_n = clock.wall(), clock.cpu(), int(stats["samples"])
    if first_wall >= WARMUP_MAX_FRACTION * budget:
        return {"sps_per_cpu_second": first_n / max(first_cpu, 1e-9), "sps_wall": first_n / max(first_wall, 1e-9),
                "updates": 1, "samples_per_update": first_n, "seconds_per_update": first_wall, "warmup": False}
    clock, samples, updates = _Clock(), 0, 0
    while True:
        samples += int(update()["samples"])
        updates += 1
        if clock.wall() >= budget - first_wall:
            break
    sync()
    r = _rates(samples, clock)
    return {"sps_per_cpu_second": r["per_cpu_second"], "sps_wall": r["per_wall_second"], "updates": updates,
            "samples_per_update": samples / updates, "seconds_per_update": r["wall_seconds"] / updates,
            "warmup": True}


def measure_learner(job: TianJiJob, seconds: float, info=None, device: str = "cpu") -> dict:
    """Learner samples/s at each candidate batch size (job's size: half the budget; others a quarter each)."""
    import torch

    from tianji.algos.models import build_model
    from tianji.envs import probe_env

    s = job.spec
    info = info or probe_env(s.env)
    cls = learner_class(s.algorithm.name)
    rng = np.random.default_rng(0)
    cands = candidate_batch_sizes(job)
    out: dict[str, Any] = {"device": device, "candidates": {}}
    if device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name(torch.device(device))
    est_per_sample: Optional[float] = None
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    for i, B in enumerate(cands):
        budget = seconds / 2 if i == 0 else seconds / (2 * max(1, len(cands) - 1))
        count = B if s.algorithm.name == "ppo" else B * s.algorithm.steps_per_batch
        if est_per_sample is not None and est_per_sample * count > 2 * budget:
            out["candidates"][str(B)] = {"skipped": f"one update would take ~{est_per_sample * count:.1f}s"}
            continue
        cfg = s.algorithm.model_copy(update={"batch_size": B})
        if isinstance(cfg, PPOConfig):
            cfg = cfg.model_copy(update={"minibatch_size": min(cfg.minibatch_size, B)})
        # the learner follows its model
        model = build_model(s.algorithm, s.model, info, s.env.seed, s.env.imports).to(device)
        learner = cls(model, cfg, 0)
        out["precision"] = learner.precision  # spec.algorithm.precision on this device (auto: bf16 on a GPU with it)
        batch = synthetic_batch(job, B, info.obs_shape, info.obs_dtype, info.n_actions, rng, info.act_shape)
        if device != "cpu":  # CUDA context, kernel loading, autotuning: never part of the rate
            learner.update(batch)
            sync()
        res = _time_updates(functools.partial(learner.update, batch), budget, sync)
        res["batch_size"] = B
        out["candidates"][str(B)] = res
        if est_per_sample is None:
            est_per_sample = res["seconds_per_update"] / max(res["samples_per_update"], 1)
    job_b = out["candidates"][str(cands[0])]
    out["sps"] = job_b["sps_per_cpu_second"] if device == "cpu" else job_b["sps_wall"]
    return out


# ----------------------------------------------------------------- (c, d) messages
def measure_message(job: TianJiJob, seconds: float, info=None) -> dict:
    """Per-message cost of one fragment: wire.encode → PUSH/ipc → PULL → wire.decode + check_fragment."""
    from tianji.envs import probe_env
    from tianji.runtime.validate import check_fragment
    from tianji.runtime.wire import decode, encode

    s = job.spec
    info = info or probe_env(s.env)
    rng = np.random.default_rng(1)
    frag = synthetic_fragment(job, info.obs_shape, info.obs_dtype, info.n_actions, rng, act_shape=info.act_shape)
    meta = {"frames": s.env.num_envs * s.env.fragment_length}
    frames = encode("fragment", job.name, "actor-0-0", 0, 0, frag, meta)
    msg_bytes = sum(len(f) for f in frames)
    with ipc_pair("tianji-prof-", hwm=4) as (push, pull):

        def one(seq: int) -> None:
            push.send_multipart(encode("fragment", job.name, "actor-0-0", seq, 0, frag, meta), copy=False)
            got = pull.recv_multipart(copy=False)
            check_fragment(decode(got, job=job.name), s, info)

        for i in range(3):  # warm-up: connection, page faults
            one(i)
        clock, count = _Clock(), 0
        while True:
            one(count)
            count += 1
            if clock.wall() >= seconds:
                break
        r = _rates(count, clock)
    samples = s.env.num_envs * s.env.fragment_length
    return {"seconds_per_cpu": 1.0 / max(r["per_cpu_second"], 1e-12),
            "seconds_wall": 1.0 / max(r["per_wall_second"], 1e-12), "messages": count,
            "message_bytes": msg_bytes, "fragment_samples": samples, "bytes_per_sample": msg_bytes / samples,
            "MBps_cpu": msg_bytes * r["per_cpu_second"] / 1e6, "transport": "ipc"}


# ----------------------------------------------------------------- all together
def measure_profile(job: TianJiJob, seconds: float = 3.0) -> dict:
    """All four measurements; returns a Profile-compatible dict with detail keys."""
    import torch

    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    torch.set_num_threads(1)
    from tianji.envs import probe_env

    t0 = time.perf_counter()
    s = job.spec
    info = probe_env(s.env)
    actor = measure_actor(job, seconds)
    learner = measure_learner(job, seconds, info)
    message = measure_message(job, seconds, info)
    gpu = None
    if torch.cuda.is_available():
        try:
            gpu = measure_learner(job, seconds, info, device="cuda")
        except Exception as e:  # keep the CPU profile, say what failed
            gpu = {"error": f"{type(e).__name__}: {e}"}
    from tianji.runtime.profiling.scaling import measure_scaling

    scaling = measure_scaling(job, seconds, info)
    return {
        **{k: scaling[k] for k in ("learner_thread_scaling", "param_bytes", "allreduce_seconds",
                                   "ipc_bytes_per_second")},
        "scaling": {k: v for k, v in scaling.items() if k not in ("learner_thread_scaling", "allreduce_seconds")},
        "actor_fps_per_core": actor["fps_per_core"],
        "learner_sps_per_core": learner["sps"],
        "learner_sps_per_gpu": gpu["sps"] if gpu and "sps" in gpu else None,
        "learner_gpu_name": gpu.get("device_name") if gpu else None,  # what learner_sps_per_gpu was measured on
        "learner_gpu_precision": gpu.get("precision") if gpu else None,
        "message_seconds": message["seconds_per_cpu"],
        "fragment_samples": message["fragment_samples"],
        "bytes_per_sample": message["bytes_per_sample"],
        "job": job.name, "algorithm": s.algorithm.name, "env": s.env.id,
        "batch_size": s.algorithm.batch_size, "seconds_per_component": seconds,
        "basis": "process CPU time, one torch thread",
        "actor": actor, "learner": learner, "learner_gpu": gpu, "message": message,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "torch": torch.__version__, "cuda": torch.cuda.is_available(),
                 "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "profile_seconds": time.perf_counter() - t0,
    }


def profile_command(args: argparse.Namespace) -> int:
    if not getattr(args, "job", None):
        print("tianji profile: a job manifest is needed (or --link-serve / --link-measure)", file=sys.stderr)
        return 2
    job = load_job(args.job, getattr(args, "set", None) or [])
    seconds = float(getattr(args, "seconds", None) or 3.0)
    if seconds <= 0:
        print("tianji profile: --seconds must be > 0", file=sys.stderr)
        return 2
    result = measure_profile(job, seconds)
    text = json.dumps(result, indent=2)
    out = getattr(args, "out", None)
    if out:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(out) as f:  # keep a link measured into this file earlier (--link-measure)
                old = json.load(f)
            result.update({k: old[k] for k in ("link_bytes_per_second", "link_latency_s", "link") if k in old})
        atomic_write_json(out, result)
        print(f"tianji profile: actor {result['actor_fps_per_core']:,.0f} frames/s/core, learner "
              f"{result['learner_sps_per_core']:,.0f} samples/s/core, "
              f"message {result['message_seconds'] * 1e6:,.0f} µs, "
              f"{result['bytes_per_sample']:,.0f} B/sample; wrote {out}", file=sys.stderr)
    else:
        print(text)
    return 0
