"""The host-side work around one Pong PPO learner update, on this CPU: what a GPU learner's
process does per batch besides the update the profiler times (`learner_sps_per_gpu`).

    python -m bench.learner_host [--job examples/pong-ppo.yaml] [--reps 20] [--out FILE]

Per batch of `batchSize` samples (Pong: 1024 of 4x84x84 uint8, two 512-sample fragments of
8 envs x 64 steps), each piece timed alone on synthetic data with the job's shapes, median of
`--reps` (one torch thread, as the learner runs):

- buffer (its own process): decode and validate the two frame-compressed fragments
  (`check_fragment` rebuilds the stacks), assemble them into the batch (`RolloutQueue.pop_batch`);
- learner, outside the update: the batch over a PUSH/PULL ipc pair (encode, send, receive,
  `wire.decode`), `check_batch` + `check_feedback`, and publishing the parameters
  (`state_arrays`, encode, send: once per update with publishEvery 1);
- learner, inside `PPOLearner.update` (so inside the profiler's figure too): the dtype conversions
  and the copy into the staging buffer (`BatchStager.pack`; pageable here, page-locked on CUDA:
  the same memcpy), and GAE over [T, N] on CPU tensors (on a GPU it is T steps of small kernels).

`gpu` repeats the GPU learner's seconds per update from docs/device/profile-pong-ppo.json, and
`learner_bound_sps` what one learner could consume if its host work outside the update ran on
this CPU, serially with the update: batch / (update + that work); `buffer_bound_sps` the same for
the buffer's work. `plan` is what `tianji plan JOB --cpus 16 --gpus 1` predicts for that machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from bench.harness import ROOT, emit, host, stamp

GPU_PROFILE = "docs/device/profile-pong-ppo.json"
JOB_ID = "pong-ppo"


def timed(fn: Callable[[], object], reps: int) -> dict:
    """Median and best of `reps` calls of `fn`, in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_ms": round(1e3 * statistics.median(times), 3), "best_ms": round(1e3 * min(times), 3)}


def stacked_fragment(job, info, rng, sender_seed: int) -> dict:
    """A fragment whose observations are real frame stacks (obs[t][:-1] == obs[t-1][1:] except at
    the ~1% episode ends), so the actor's frame compression and the buffer's expansion do the work
    they do on Pong; the other arrays from the profiler's `synthetic_fragment`."""
    import numpy as np

    from tianji.runtime.profiling.inputs import synthetic_fragment

    frag = synthetic_fragment(job, info.obs_shape, info.obs_dtype, info.n_actions, rng)
    T, N = frag["dones"].shape
    S, H, W = info.obs_shape
    seq = np.random.default_rng(sender_seed).integers(0, 256, (N, T + S, H, W), dtype=np.uint8)
    windows = np.lib.stride_tricks.sliding_window_view(seq, S, axis=1)  # [N, T+1, H, W, S]
    stacks = np.ascontiguousarray(windows.transpose(1, 0, 4, 2, 3))  # [T+1, N, S, H, W]
    frag["obs"], frag["last_obs"] = stacks[:T], stacks[T]
    return frag


def setup(job_path: str):
    import numpy as np
    import torch

    from tianji.control.spec import load_job
    from tianji.envs import EnvInfo

    torch.set_num_threads(1)  # the learner's (and the buffer's) one thread, as in the GPU runs
    job = load_job(job_path)
    s = job.spec
    info = EnvInfo((s.env.frame_stack, 84, 84), "uint8", 6)
    rng = np.random.default_rng(0)
    frags = [stacked_fragment(job, info, rng, k) for k in range(s.algorithm.batch_size
                                                                 // (s.env.num_envs * s.env.fragment_length))]
    return job, info, frags


def buffer_pieces(job, info, frags, reps: int) -> tuple[dict, dict]:
    """The buffer's work per batch; returns (timings, the batch it assembles)."""
    import numpy as np

    from tianji.runtime import framestack
    from tianji.runtime.storage import RolloutQueue
    from tianji.runtime.validate import check_fragment
    from tianji.runtime.wire import decode, encode

    s = job.spec
    msgs = []
    for k, f in enumerate(frags):
        arrays = dict(f)
        arrays.update(framestack.compress(arrays.pop("obs")))  # as the actor sends it
        msgs.append(encode("fragment", job.name, f"actor-0-{k}", 1, 0, arrays, {"frames": f["dones"].size}))

    def take() -> list[dict]:
        return [{**check_fragment(decode(m, job=job.name), s, info), "version": 0} for m in msgs]

    taken = take()

    def assemble() -> dict:
        q = RolloutQueue(s.staleness.queue_fragments)
        for f in taken:
            q.put(f)
        return q.pop_batch(len(taken))

    batch = assemble()
    batch["versions"] = np.zeros(batch["last_obs"].shape[0], dtype=np.int64)
    out = {"fragments_decode_validate": timed(take, reps), "assemble_batch": timed(assemble, reps)}
    out["fragment_wire_bytes"] = sum(len(b) for b in msgs[0])
    return out, batch


def learner_outside(job, info, batch: dict, model, reps: int) -> dict:
    """The learner's work per batch outside `update`: batch in, its checks, parameters out."""
    from tianji.algos.models import state_arrays
    from tianji.runtime import wire
    from tianji.runtime.profiling.inputs import ipc_pair
    from tianji.runtime.validate import check_batch, check_feedback

    meta = {"buffer": 0, "received": 1024, "dropped": 0, "fragments": 2}
    out = {}
    with ipc_pair("tianji-lhost-", hwm=4) as (push, pull):
        def transfer():
            wire.send(push, wire.encode("batch", job.name, "buffer-0-0", 1, 0, batch, meta))
            return wire.decode(wire.recv(pull), job=job.name)

        msg = transfer()
        out["batch_send_receive_decode"] = timed(transfer, reps)
        out["validate_batch"] = timed(lambda: (check_batch(msg, job.spec, info), check_feedback(msg.meta)), reps)
        params = state_arrays(model)

        def publish():
            wire.send(push, wire.encode("params", job.name, "learner-0-0", 1, 1, state_arrays(model), {}))

        out["publish_params"] = timed(lambda: (publish(), wire.recv(pull)), reps)  # (drained: hwm 4)
    out["param_bytes"] = sum(a.nbytes for a in params.values())
    return out


def learner_inside(job, batch: dict, model, reps: int) -> dict:
    """Host work inside `PPOLearner.update` before the model runs: staging and GAE."""
    import numpy as np
    import torch

    from tianji.algos import BatchStager
    from tianji.algos.ppo import gae

    c = job.spec.algorithm
    stager = BatchStager(torch.device("cpu"))  # (pageable here: pinning needs CUDA; the copy is the same)
    f32 = np.float32
    dtypes = {"obs": None, "last_obs": None, "rewards": f32, "dones": f32, "terminated": f32, "valid": bool,
              "logp": f32, "actions": np.int64}

    def stage():
        arrays = {k: np.asarray(batch[k], dtype=dt) for k, dt in dtypes.items()}
        return stager.pack(arrays)

    T, N = batch["rewards"].shape
    t = {k: torch.from_numpy(np.asarray(batch[k], dtype=f32)) for k in ("rewards", "dones", "terminated")}
    values, last = torch.randn(T, N), torch.randn(N)
    out = {"stage_pack": timed(stage, reps),
           "gae_cpu": timed(lambda: gae(t["rewards"], values, last, t["dones"], t["terminated"], c.gamma,
                                        c.gae_lambda), reps)}
    out["staged_bytes"] = stage()[1]
    return out


def gpu_reference(batch_size: int) -> dict:
    """The GPU learner's update at this batch size, as `tianji profile` measured it on the device."""
    d = json.loads((ROOT / GPU_PROFILE).read_text())
    cand = d["learner_gpu"]["candidates"][str(batch_size)]
    return {"source": GPU_PROFILE, "date": d.get("date"), "device": d["learner_gpu"]["device_name"],
            "precision": d["learner_gpu"]["precision"], "sps": round(cand["sps_wall"], 1),
            "update_ms": round(1e3 * cand["seconds_per_update"], 2)}


def plan_prediction(job_path: str, cpus: int = 16, gpus: int = 1) -> dict:
    """What `tianji plan` predicts for the GPU machine (16 cores, 1 GPU): it reads the GPU figure
    from docs/device/ and the rest of its profile from its built-in figures."""
    argv = ["plan", os.path.relpath(job_path, ROOT), "--cpus", str(cpus), "--gpus", str(gpus)]
    out = subprocess.run([sys.executable, "-m", "tianji.cli", *argv, "--json"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    p = json.loads(out.stdout)
    keep = ("groups", "actors", "buffers", "learners", "consumed_sps", "produced_fps", "bottleneck",
            "sample_seconds", "train_seconds", "comm_seconds")
    return {"command": " ".join(["tianji", *argv]), **{k: p[k] for k in keep},
            "message_seconds": p["profile"]["message_seconds"], "cpu_assumed": p["profile"]["cpu_assumed"]}


def measure(job_path: str, reps: int) -> dict:
    from tianji.algos.models import build_model

    job, info, frags = setup(job_path)
    s = job.spec
    model = build_model(s.algorithm, s.model, info, 0)
    buf, batch = buffer_pieces(job, info, frags, reps)
    outside = learner_outside(job, info, batch, model, reps)
    inside = learner_inside(job, batch, model, reps)
    ms = {k: v["median_ms"] for part in (buf, outside, inside) for k, v in part.items() if isinstance(v, dict)}
    out_keys = ("batch_send_receive_decode", "validate_batch", "publish_params")
    outside_ms = sum(ms[k] for k in out_keys)
    gpu = gpu_reference(s.algorithm.batch_size)
    B = s.algorithm.batch_size
    biggest = max(out_keys, key=ms.get)
    return {"batch": B, "fragments_per_batch": len(frags), "buffer": buf, "learner_outside_update": outside,
            "learner_inside_update": inside,
            "totals_ms": {"buffer": round(sum(ms[k] for k in ("fragments_decode_validate", "assemble_batch")), 2),
                          "learner_outside_update": round(outside_ms, 2),
                          "learner_inside_update": round(ms["stage_pack"] + ms["gae_cpu"], 2)},
            "biggest_outside_update": biggest, "gpu": gpu,
            "learner_bound_sps": round(B / ((gpu["update_ms"] + outside_ms) / 1e3), 1),
            "buffer_bound_sps": round(B / (sum(ms[k] for k in ("fragments_decode_validate", "assemble_batch")) / 1e3),
                                      1),
            "host_bound": outside_ms > gpu["update_ms"], "plan": plan_prediction(job_path)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "examples" / "pong-ppo.yaml"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="also write the JSON here (docs/results/learner-host.json: bench.render_docs "
                                  "renders it)")
    args = ap.parse_args(argv)
    result = {"bench": "learner_host", **stamp("learner_host", argv), "job": os.path.relpath(args.job, ROOT),
              "reps": args.reps, **measure(args.job, args.reps), "host": host()}
    emit(result, args.out)


if __name__ == "__main__":
    main()
