"""What the planner's cost model needs beyond per-core rates (tianji.control.planner.costmodel):

(e) the learner thread curve: the real learner `update` at 1, 2, 4, … torch threads
    (up to the machine's cores), wall clock, measured side by side in this process, as
    ratios to one thread;
(f) parameter bytes per publish: the learner's real `encode_params` message;
(g) gradient all-reduce time at 2..N ranks: N local processes, gloo over loopback, the
    runtime's GradientAverager on a flat tensor of the model's parameter count.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from typing import Optional

import numpy as np


def thread_counts(max_threads: Optional[int] = None) -> list[int]:
    """1, 2, 4, … up to the cores this process may use (and max_threads)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    top = min(cores, max_threads or cores)
    out, t = [], 1
    while t <= top:
        out.append(t)
        t *= 2
    if out[-1] != top:
        out.append(top)
    return out


def measure_thread_curve(job, seconds: float, info, threads: Optional[list[int]] = None) -> dict:
    """Learner samples/s (wall) at each thread count, and the ratio to one thread.
    Rounds alternate thread counts so that a change in background load hits all alike."""
    import torch

    from tianji.algos.models import build_model
    from tianji.runtime.profiling.inputs import learner_class, synthetic_batch

    s = job.spec
    threads = threads or thread_counts()
    model = build_model(s.algorithm, s.model, info, s.env.seed, s.env.imports)
    learner = learner_class(s.algorithm.name)(model, s.algorithm, 0)
    batch = synthetic_batch(job, s.algorithm.batch_size, info.obs_shape, info.obs_dtype, info.n_actions,
                            np.random.default_rng(2))
    before = torch.get_num_threads()
    samples = {t: 0 for t in threads}
    wall = {t: 0.0 for t in threads}
    try:
        learner.update(batch)  # warm-up
        rounds = 3
        for _ in range(rounds):
            for t in threads:
                torch.set_num_threads(t)
                t0 = time.perf_counter()
                while True:
                    samples[t] += int(learner.update(batch)["samples"])
                    if time.perf_counter() - t0 >= seconds / (rounds * len(threads)):
                        break
                wall[t] += time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    sps = {t: samples[t] / max(wall[t], 1e-9) for t in threads}
    # String keys: the profile is plain JSON (Profile.from_json turns them back into ints).
    return {"threads": threads, "sps_wall": {str(t): v for t, v in sps.items()},
            "scaling": {str(t): sps[t] / sps[threads[0]] for t in threads}}


def param_bytes(job, info) -> int:
    """Bytes of one parameter publish as the learner sends it."""
    from tianji.algos.models import build_model, state_arrays
    from tianji.runtime.wire import encode

    model = build_model(job.spec.algorithm, job.spec.model, info, job.spec.env.seed, job.spec.env.imports)
    frames = encode("params", job.name, "learner-0-0", 0, 0, state_arrays(model), {"version": 0})
    return sum(len(f) for f in frames)


def _allreduce_rank(rank: int, world: int, port: int, numel: int, iters: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        flat = torch.zeros(numel)
        for _ in range(3):
            dist.all_reduce(flat)
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out.put(float(np.median(times)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_allreduce(numel: int, ranks: list[int], iters: int = 50, timeout: float = 60.0) -> dict:
    """Median seconds of one all-reduce of `numel` float32 at each rank count (gloo, loopback)."""
    ctx = mp.get_context("spawn")
    out: dict[int, float] = {}
    for w in ranks:
        q = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_allreduce_rank, args=(r, w, port, numel, iters, q), daemon=True)
                 for r in range(w)]
        for p in procs:
            p.start()
        try:
            out[w] = q.get(timeout=timeout)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return out


def measure_ipc_bandwidth(nbytes: int, seconds: float = 0.5) -> float:
    """Bytes/s of `nbytes` messages PUSH → ipc → PULL in this process (the loopback link)."""
    from tianji.runtime.profiling.inputs import ipc_pair

    with ipc_pair("tianji-bw-") as (push, pull):
        payload = np.zeros(max(1, nbytes), dtype=np.uint8)
        push.send(payload, copy=False)
        pull.recv(copy=False)
        t0, sent = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            push.send(payload, copy=False)
            pull.recv(copy=False)
            sent += payload.nbytes
        return sent / (time.perf_counter() - t0)


def measure_scaling(job, seconds: float, info, max_ranks: Optional[int] = None) -> dict:
    """(e), (f), (g) together; keys Profile.from_json reads plus detail."""
    from tianji.algos.models import build_model

    curve = measure_thread_curve(job, seconds, info)
    pbytes = param_bytes(job, info)
    model = build_model(job.spec.algorithm, job.spec.model, info, job.spec.env.seed, job.spec.env.imports)
    numel = sum(p.numel() for p in model.parameters())
    cores = thread_counts()[-1]
    ranks = list(range(2, max(2, min(max_ranks or cores, 4)) + 1))
    ar = measure_allreduce(numel, ranks)
    return {"learner_thread_scaling": curve["scaling"], "param_bytes": float(pbytes),
            "allreduce_seconds": {str(w): v for w, v in ar.items()},
            "ipc_bytes_per_second": measure_ipc_bandwidth(max(pbytes, 1 << 20)),
            "thread_curve": curve, "parameters": numel,
            "allreduce_note": f"gloo over loopback, {numel} float32, median of 50, ranks {ranks} on {cores} cores"}
