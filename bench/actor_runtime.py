"""An Atari actor's inference in torch against ONNX Runtime on the CPU (issue #28: "consider a
faster inference runtime only if it wins in the bench"). Prints one JSON object.

    pip install -e .[onnx]       # onnxruntime and onnx (also in the bench extra): spec.actor.inference
    python -m bench.actor_runtime [--batches 8,16,32] [--reps 5] [--out docs/results/actor-runtime.json]

The policy is the PPO actor's: Nature CNN and the policy head (`ActorCritic.logits`) on uint8
[B, 4, 84, 84] frames, one thread in both runtimes (as an actor). Per batch size: CPU µs per
frame of each (best of `--reps` rounds, the two interleaved), their ratio, and the largest
|Δ logit| between them (float32 both: the same function to rounding). `rebuild_ms`: what a new
policy version costs an actor's ONNX Runtime (runtime/onnxpolicy.build, which actors run off their
env loop: the model's initializers rewritten with the new weights, a session built; wall and CPU
ms). SessionOptions.add_initializer is not a way to swap weights: ORT folds and pre-packs weights
from the model's own initializers, and a Pong session built with it gave logits off by 2.2;
`actor_onnx_us`: the actor's own ONNX Runtime policy (runtime/onnxpolicy.OrtPolicy), whose graph
starts at the first convolution with the frames' preprocessing done in numpy (runtime/onnxinput.py),
timed in the same rounds as the whole graph on uint8 frames (`onnxruntime_us`);
`ratio_if_onnxruntime`: the actor/bare-env ratio docs/results/actor-profile.json's
loop would reach with the faster forward (env step and the rest unchanged).

With --lower-precision, the same batches also time what a lower precision would buy, interleaved
with float32 ONNX Runtime: ONNX Runtime's dynamic int8 quantization (onnxruntime.quantization.
quantize_dynamic, int8 weights, per-channel for convolutions) of every convolution and matrix
product (`int8_all`) or of the matrix products alone (`int8_linear`), and torch's bfloat16 copy
(`bf16_torch`, spec.model.actorPrecision: bfloat16); per variant CPU µs per frame, the largest
|Δ logit| and the mean |Δ log π| against float32 torch on random frames.
"""
from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

from bench.harness import RESULTS, ROOT, emit, loadavg, stamp


def policy(job):
    import torch

    from tianji.algos.models import build_model
    from tianji.envs import EnvInfo

    info = EnvInfo((job.spec.env.frame_stack, 84, 84), "uint8", 6)
    model = build_model(job.spec.algorithm, job.spec.model, info, 0).eval()

    class Logits(torch.nn.Module):  # what an actor runs per step
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m.logits(x)

    return Logits().eval()


def session(onnx_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])


def cpu_us_per_frame(fn, batch: int, n: int = 40) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n / batch * 1e6


def measure(model, sess, actor, batch: int, reps: int) -> dict:
    import numpy as np
    import torch

    x = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8)
    xn = x.numpy()
    with torch.inference_mode():
        ref = model(x).numpy()
        diff = float(np.abs(sess.run(None, {"x": xn})[0] - ref).max())
        actor_diff = float(np.abs(actor.logits(x).numpy() - ref).max())
        t_torch, t_ort, t_actor = [], [], []
        for _ in range(reps):  # interleaved: drift in the machine's load hits all alike
            t_torch.append(cpu_us_per_frame(lambda: model(x), batch))
            t_ort.append(cpu_us_per_frame(lambda: sess.run(None, {"x": xn}), batch))
            t_actor.append(cpu_us_per_frame(lambda: actor.logits(x), batch))
    return {"batch": batch, "torch_us": round(min(t_torch), 1), "onnxruntime_us": round(min(t_ort), 1),
            "actor_onnx_us": round(min(t_actor), 1), "speedup": round(min(t_torch) / min(t_ort), 2),
            "max_abs_logit_diff": diff, "actor_max_abs_logit_diff": actor_diff}


def quantized(graph: bytes, ops: list[str]) -> bytes:
    """`graph` with ONNX Runtime's dynamic int8 quantization of the `ops` nodes."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "fp32.onnx", Path(d) / "int8.onnx"
        src.write_bytes(graph)
        quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=ops)
        return dst.read_bytes()


def lower_precision(model, graph: bytes, batches: list[int], reps: int) -> list[dict]:
    """Per batch: float32 ONNX Runtime against int8 ONNX Runtime and torch's bfloat16 copy (module docstring)."""
    import numpy as np
    import torch

    from tianji.algos.models import Bf16Policy

    fp32 = session(graph)
    int8 = {"int8_all": session(quantized(graph, ["Conv", "MatMul", "Gemm"])),
            "int8_linear": session(quantized(graph, ["MatMul", "Gemm"]))}
    bf16 = Bf16Policy(model.m)

    def logp(z):
        z = z.astype(np.float64) - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    def point(batch: int) -> dict:
        x = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(batch))
        xn = x.numpy()
        sessions = {"onnxruntime_fp32": fp32, **int8}
        fns = {**{k: (lambda s=s: s.run(None, {"x": xn})[0]) for k, s in sessions.items()},
               "bf16_torch": lambda: bf16.logits(x).numpy()}
        with torch.inference_mode():
            ref = model(x).numpy()
            got = {k: fn() for k, fn in fns.items()}
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(reps):  # interleaved
                for k, fn in fns.items():
                    times[k].append(cpu_us_per_frame(fn, batch))
        return {"batch": batch, **{k: {"us": round(min(t), 1), "max_abs_logit_diff": float(np.abs(got[k] - ref).max()),
                                       "mean_abs_dlogp": float(np.abs(logp(got[k]) - logp(ref)).mean())}
                                   for k, t in times.items()}}

    return [point(b) for b in batches]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "examples" / "pong-ppo.yaml"))
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="also write the JSON here (docs/results/actor-runtime.json)")
    ap.add_argument("--lower-precision", action="store_true",
                    help="also time int8 ONNX Runtime and torch's bfloat16 copy against float32 ONNX Runtime")
    a = ap.parse_args()
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        print(json.dumps({"bench": "actor_runtime", "unavailable": "pip install -e .[bench] (onnxruntime, onnx)"}))
        return
    import torch

    from tianji.control.spec import load_job

    torch.set_num_threads(1)  # as in an actor
    model = policy(load_job(a.job))
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(8, 4, 84, 84, dtype=torch.uint8),), buf, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                      dynamo=False)
    graph = buf.getvalue()
    sess = session(graph)
    from tianji.runtime.onnxpolicy import OrtPolicy, build, export, snapshot

    actor = OrtPolicy.create(model.m, "logits", torch.zeros(8, 4, 84, 84, dtype=torch.uint8).numpy())
    points = [measure(model, sess, actor, int(b), a.reps) for b in a.batches.split(",")]
    actor.close()

    exported = export(model.m, "logits", torch.zeros(8, 4, 84, 84, dtype=torch.uint8).numpy())
    weights = snapshot(model.m, exported)
    t, c = time.perf_counter(), time.process_time()
    for v in range(10):
        build(exported, weights, v)
    out = {"bench": "actor_runtime", **stamp("actor_runtime"), "job": str(Path(a.job).name),
           "onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "points": points,
           "rebuild_ms": round((time.perf_counter() - t) / 10 * 1e3, 1),
           "rebuild_cpu_ms": round((time.process_time() - c) / 10 * 1e3, 1)}
    if a.lower_precision:
        out["lower_precision"] = lower_precision(model, graph, [int(b) for b in a.batches.split(",")], a.reps)
    profile = RESULTS / "actor-profile.json"
    if profile.is_file():  # the measured actor loop with the forward swapped for ONNX Runtime's
        loops = {p["num_envs"]: p for p in json.loads(profile.read_text())["points"]}
        out["ratio_if_onnxruntime"] = {
            str(p["batch"]): round(lp["env_step_us"] / (lp["loop_us"] - lp["forward_fp32_us"] + p["onnxruntime_us"]), 3)
            for p in points if (lp := loops.get(p["batch"]))}
    out["host"] = {"loadavg": loadavg()}
    emit(out, a.out)


if __name__ == "__main__":
    main()
