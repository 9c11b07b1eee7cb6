"""An actor's policy forward in ONNX Runtime, and the choice between it and torch (spec.actor.inference).

ONNX Runtime runs the Pong policy 1.31-1.73x faster than torch on one CPU thread at an actor's
batch sizes (bench/actor_runtime.py, docs/results/actor-runtime.json). Here:

* `export` traces what an actor runs per step (PPO: `logits`, DQN: the Q-values) once, from a
  copy whose every floating tensor is shifted: the exporter merges initializers of equal value
  (every zero bias at initialisation), and each tensor of the state must keep its own name so a
  new version's weights can replace it.
* TianJi's own Nature CNN models export from their first convolution on; their pixel scaling or
  per-pixel normaliser runs in numpy ahead of the session (onnxinput.py: 2-5 µs per Pong frame less
  than ONNX Runtime's element-wise kernels over the batch).
* `OrtPolicy` acts with one session per policy version. A new version's session is built from a
  snapshot of the weights (the same graph with its initializers rewritten) on a background thread
  and swapped in when a fragment starts, so that a fragment acts with one version throughout
  (`refresh()` returns that version). On-policy actors (PPO, and the strict loop) wait for the
  build at the fragment's start (`wait_swaps`: milliseconds once the env loop lets go of the
  interpreter); a DQN actor does not, and acts with the newest session built until the next is.
  Weights cannot be updated inside a built session, nor replaced by SessionOptions.add_initializer:
  ORT's graph optimizer folds and pre-packs weights from the model's own initializers when it
  builds a session (built that way, a Pong session's logits were off by 2.2 after new weights, and
  the observation normaliser's sqrt(var) kept the old variance).
* `PolicyRuntime` makes the choice. torch: the model (or its bfloat16 copy). onnx: ONNX Runtime,
  or an error naming what is missing. auto: ONNX Runtime where it is importable, its export
  reproduces the model's outputs (within AGREE_TOL) and a micro-benchmark of both at the actor's
  batch size (CPU time of the calling thread, interleaved rounds) finds it at least MIN_SPEEDUP
  faster, with the time it saves over a version's forwards above the session build each version
  costs (`onnx_pays`); torch otherwise. With `background` (an actor) auto decides on a thread while the env
  loop acts with torch, so start-up waits for neither the export nor the benchmark. Before any of
  that, auto times torch's forward alone: one under TORCH_FAST_US stays on torch without importing
  ONNX Runtime (`torch_is_fast`).

Every session runs one intra-op and one inter-op thread, as torch.set_num_threads(1) in every
process: an actor's share of the cores is what its process gets, not a thread pool of its own.
"""
from __future__ import annotations

import copy
import io
import logging
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from tianji.algos.models import Int8Policy, actor_policy, auto_precision
from tianji.runtime.onnxinput import MEAN, STD, InputStage, lift

log = logging.getLogger("tianji")
# The TorchScript exporter (the one that needs no onnxscript; torch is pinned) says it is legacy on every
# export: said once per actor per start, it is noise in every log.
warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export",
                        category=DeprecationWarning)
warnings.filterwarnings("ignore", message="The feature will be removed", category=DeprecationWarning,
                        module=r"torch\.onnx")

INSTALL_HINT = "pip install 'tianji[onnx]'"
AGREE_TOL = 1e-5  # |ORT - torch| <= AGREE_TOL * (1 + |torch|); float32 rounding measured ~1e-8 (Pong logits)
MIN_SPEEDUP = 1.05  # auto: ORT must be this much faster; a tie stays on torch (no swap lag, no thread)
BENCH_ROUNDS, BENCH_CALLS = 3, 8  # auto's micro-benchmark: best of interleaved rounds of this many forwards
# auto: a torch forward under this (CPU µs at the actor's batch) stays on torch, ONNX Runtime never imported.
# Importing it costs an actor 0.66 s of CPU with its interpreter held (AMD EPYC), which stalled both
# CartPole actors' env loops for 0.8-1.0 s at the start of a 10 s run, and the most it could save is
# the whole forward: CartPole PPO's MLP takes 33 µs in torch (Pong's CNN: 2,300 µs at 8 envs).
# Side by side (docs/benchmarks.md), CartPole PPO's median time to 475: 9.9 s on torch, 11.0 s on auto
# (seeds 21-25); 10.7 s against 11.4 s with ONNX Runtime forced (seeds 26-30), within the frames' spread.
TORCH_FAST_US = 100.0
INPUT, OUTPUT = "obs", "out"


class OnnxUnavailable(RuntimeError):
    """ONNX Runtime cannot run this policy here (not installed, no export, outputs that disagree)."""


class _Acting(nn.Module):
    """What an actor computes per step: PPO's logits (a Gaussian's mean), DQN's Q-values."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.m, self.kind = model, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m.logits(x) if self.kind == "logits" else self.m(x)


def _import_ort():
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise OnnxUnavailable(f"{e.name or 'onnxruntime'} is not installed ({INSTALL_HINT})") from None
    return onnx, onnxruntime


@dataclass(frozen=True)
class Exported:
    graph: bytes  # the ONNX model
    keys: dict[str, str]  # initializer name -> the model's state_dict key it holds
    in_dtype: np.dtype  # the graph input's dtype
    stage: Optional[InputStage] = None  # the observation preprocessing done in numpy (onnxinput.py)


@dataclass(frozen=True)
class Live:
    """One policy version's session."""

    session: object
    version: int
    log_std: Optional[np.ndarray]  # a Gaussian policy's log-std of the same version
    stats: Optional[tuple[np.ndarray, np.ndarray]] = None  # the input stage's mean and std of the same version


def export(model: nn.Module, kind: str, example: np.ndarray) -> Exported:
    """Trace `model`'s acting function on `example` (any batch size runs later). Raises OnnxUnavailable."""
    onnx, _ = _import_ort()
    lifted, stage = lift(model, example)
    twin = _Acting(lifted, kind).eval()
    traced = example.astype(np.float32) if stage is not None else example
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # distinct values: no two initializers merged (shifted up: variances stay positive)
        for t in twin.state_dict().values():
            if t.is_floating_point():
                t.add_(0.01 + 0.01 * torch.rand(t.shape, generator=gen, dtype=torch.float64).to(t.dtype))
    buf = io.BytesIO()
    try:
        torch.onnx.export(twin, (torch.from_numpy(traced),), buf, input_names=[INPUT], output_names=[OUTPUT],
                          dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}}, dynamo=False,
                          do_constant_folding=False)  # folding would bake weight-derived values into constants
    except Exception as e:  # noqa: BLE001 - any model (a user's included) may not trace
        raise OnnxUnavailable(f"the policy does not export to ONNX: {type(e).__name__}: {e}") from None
    graph = buf.getvalue()
    state = twin.state_dict()
    keys = {}
    for init in onnx.load_from_string(graph).graph.initializer:
        if init.name in state and tuple(init.dims) == tuple(state[init.name].shape):
            keys[init.name] = init.name[len("m."):]
    return Exported(graph, keys, traced.dtype, stage)


def snapshot(model: nn.Module, exported: Exported) -> dict[str, np.ndarray]:
    """Copies of the weights the graph needs: the model is overwritten in place by the next version."""
    state = model.state_dict()
    weights = {name: np.array(state[key].detach().cpu().numpy(), copy=True, order="C")
               for name, key in exported.keys.items()}
    if exported.stage is not None:
        exported.stage.snapshot(state, weights, exported.keys)
    return weights


def build(exported: Exported, weights: dict[str, np.ndarray], version: int,
          log_std: Optional[np.ndarray] = None) -> Live:
    """A session of `exported` with `weights` in place of its initializers."""
    onnx, ort = _import_ort()
    model = onnx.load_from_string(exported.graph)
    for init in model.graph.initializer:
        if init.name in weights:
            init.CopyFrom(onnx.numpy_helper.from_array(weights[init.name], init.name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3  # errors only: ORT's warnings go to stderr, not through logging
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    stats = (weights[MEAN], weights[STD]) if MEAN in weights else None
    return Live(session, version, log_std, stats)


def run(live: Live, exported: Exported, obs: np.ndarray, scratch: Optional[dict] = None) -> np.ndarray:
    """The session's output for the observations `obs` (`scratch`: the input stage's buffers, one caller's)."""
    if exported.stage is not None:
        x = exported.stage.apply(obs, live.stats, scratch)
    else:
        x = np.ascontiguousarray(obs, dtype=exported.in_dtype)
    return live.session.run(None, {INPUT: x})[0]


def _log_std(model: nn.Module) -> Optional[np.ndarray]:
    ls = getattr(model, "log_std", None)
    return None if ls is None else ls.detach().cpu().numpy().copy()


def check_agrees(live: Live, exported: Exported, model: nn.Module, kind: str, example: np.ndarray) -> float:
    """The largest |ORT - torch| on `example`; raises OnnxUnavailable beyond AGREE_TOL (relative to
    1 + |torch|): a weight the export baked in as a constant shows up here (it was shifted)."""
    with torch.inference_mode():
        ref = _Acting(model, kind)(torch.from_numpy(example)).numpy()
    got = run(live, exported, example)
    if got.shape != ref.shape:
        raise OnnxUnavailable(f"the exported policy returns shape {list(got.shape)}, torch {list(ref.shape)}")
    err = np.abs(got.astype(np.float64) - ref)
    if not np.all(err <= AGREE_TOL * (1.0 + np.abs(ref))):
        raise OnnxUnavailable(f"the exported policy's outputs differ from torch's by up to {float(err.max()):.3g}")
    return float(err.max())


def cpu_per_call(fns: dict[str, Callable[[], object]], rounds: int = BENCH_ROUNDS,
                 calls: int = BENCH_CALLS) -> dict[str, float]:
    """Best-of-`rounds` CPU seconds per call of each function (this thread's CPU time: a loaded
    machine or another thread of the process does not inflate it), the functions interleaved."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()  # warm-up: first-call allocations
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.thread_time()
            for _ in range(calls):
                fn()
            best[k] = min(best[k], (time.thread_time() - t) / calls)
    return best


class OrtPolicy:
    """The acting policy in ONNX Runtime, the module-like surface ppo.act / dqn.act use
    (`logits`, a call, `continuous`, `log_std`), one version per session (module docstring)."""

    def __init__(self, source: nn.Module, kind: str, exported: Exported, live: Live):
        self.source, self.kind, self.exported, self.live = source, kind, exported, live
        self.continuous = bool(getattr(source, "continuous", False))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tianji-ort")
        self._pending: list[Future] = []  # builds in submission order (one worker: they finish in it)
        self._scratch: dict = {}  # the input stage's float32 buffers, by batch shape (the acting thread's)
        self.swaps = 0

    @classmethod
    def create(cls, source: nn.Module, kind: str, example: np.ndarray, version: int = 0) -> OrtPolicy:
        """Export, build and check against torch, in this thread. Raises OnnxUnavailable."""
        exported = export(source, kind, example)
        live = build(exported, snapshot(source, exported), version, _log_std(source))
        check_agrees(live, exported, source, kind, example)
        return cls(source, kind, exported, live)

    def sync(self, version: int, wait: bool = False) -> None:
        """After new weights were loaded into the source: build their session off this thread.
        A build not started yet is superseded; one under way is kept, so that its session can act
        until the newer one is built (dropping it left an actor acting with versions 5 behind on a
        busy core, whose fragments the learner dropped as stale). `wait`: block until it is live."""
        weights, log_std = snapshot(self.source, self.exported), _log_std(self.source)
        self._pending = [f for f in self._pending if not f.cancel()]
        self._pending.append(self._pool.submit(build, self.exported, weights, version, log_std))
        if wait:
            self.refresh(wait=True)

    def refresh(self, wait: bool = False) -> int:
        """At a fragment's start: swap in the newest built session (`wait`: the newest requested);
        the version that acts now."""
        if wait and self._pending:
            self._pending[-1].result()
        done = [i for i, f in enumerate(self._pending) if f.done()]
        if done:
            newest = self._pending[done[-1]]
            self._pending = self._pending[done[-1] + 1:]
            self.live = newest.result()  # a failed build raises here: the actor stops with its error
            self.swaps += 1
        return self.live.version

    def settle(self, timeout: Optional[float] = None) -> None:
        """Wait for every build requested so far (tests)."""
        for f in list(self._pending):
            f.result(timeout=timeout)

    def _forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(run(self.live, self.exported, obs.numpy(), self._scratch))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self._forward(obs)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return self._forward(obs)

    @property
    def log_std(self) -> torch.Tensor:
        return torch.from_numpy(self.live.log_std)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _select(twin: nn.Module, kind: str, example: np.ndarray, version: int) -> tuple[Exported, Live, dict]:
    """auto's decision, on a private copy of the model (the actor may load new weights meanwhile):
    both forwards timed, and the session build that every new version costs."""
    exported = export(twin, kind, example)
    weights = snapshot(twin, exported)
    live = build(exported, weights, version, _log_std(twin))
    err = check_agrees(live, exported, twin, kind, example)
    x = torch.from_numpy(example)
    acting = _Acting(twin, kind)
    with torch.inference_mode():
        scratch: dict = {}  # as an OrtPolicy acts: the input stage's buffer reused
        t = cpu_per_call({"torch": lambda: acting(x), "onnx": lambda: run(live, exported, example, scratch)})
    b = cpu_per_call({"build": lambda: build(exported, weights, version)}, rounds=2, calls=1)
    return exported, live, {"batch": len(example), "torch_us": round(t["torch"] * 1e6, 1),
                            "onnx_us": round(t["onnx"] * 1e6, 1), "build_us": round(b["build"] * 1e6, 1),
                            "max_abs_diff": err}


def onnx_pays(bench: dict, forwards_per_swap: int) -> bool:
    """auto's rule: ONNX Runtime's forward at least MIN_SPEEDUP faster, and what it saves over the
    forwards one version acts for more than the session build the version costs (a Pong actor saves
    about 1.4 ms x 64 forwards a fragment; a build that took longer would lose time, not win it)."""
    if bench["onnx_us"] * MIN_SPEEDUP > bench["torch_us"]:
        return False
    return forwards_per_swap <= 0 or (bench["torch_us"] - bench["onnx_us"]) * forwards_per_swap >= bench["build_us"]


def torch_is_fast(model: nn.Module, kind: str, example: np.ndarray) -> Optional[float]:
    """torch's CPU µs per forward on `example` where it is under TORCH_FAST_US (else None): a few
    forwards, no ONNX Runtime (what ORT could save is at most this)."""
    acting, x = _Acting(model, kind), torch.from_numpy(example)
    with torch.inference_mode():
        us = cpu_per_call({"torch": lambda: acting(x)}, rounds=2, calls=3)["torch"] * 1e6
    return us if us < TORCH_FAST_US else None


class PolicyRuntime:
    """What a Rollout acts with, per spec.actor.inference (module docstring). `version` is the policy
    version the current fragment acts with; `report` says what was chosen and why."""

    def __init__(self, model: nn.Module, spec, example: np.ndarray, background: bool = False,
                 wait_swaps: bool = False, forwards_per_swap: int = 0):
        """`forwards_per_swap`: forwards a version acts for at least (an actor swaps at most once a
        fragment), for auto's rule (`onnx_pays`); 0: builds are not counted."""
        self.model = model
        self.forwards_per_swap = forwards_per_swap
        self.kind = "logits" if spec.algorithm.name == "ppo" else "q"
        self.wait = wait_swaps  # no fragment with a superseded version: it would be dropped as stale
        self.version = self._latest = 0
        self._deferred = False  # an int8 copy behind the model (loaded)
        self.report: dict = {"requested": spec.actor.inference, "inference": "torch"}
        self._acting_copy(spec, example)
        self._selection: Optional[Future] = None
        self._selector: Optional[ThreadPoolExecutor] = None
        if spec.actor.inference == "torch":
            return
        if self.precision != "float32":
            self.report["reason"] = f"model.actorPrecision {self.precision} runs in torch"
            return
        example = np.array(example, copy=True)  # the env may reuse its observation buffer
        if spec.actor.inference == "onnx":
            try:
                self._use(OrtPolicy.create(model, self.kind, example))
            except OnnxUnavailable as e:
                raise OnnxUnavailable(f"spec.actor.inference: onnx: {e}") from None
            return
        if (fast := torch_is_fast(model, self.kind, example)) is not None:
            self.report.update(torch_us=round(fast, 1), reason=(
                f"torch's forward takes {fast:.0f} us at batch {len(example)}, under {TORCH_FAST_US:g} us: "
                "ONNX Runtime's import and a session per version would cost more than it can save"))
            log.info("actor inference (auto): torch; %s", self.report["reason"])
            return
        twin = copy.deepcopy(model).eval()
        if background:
            self._selector = ThreadPoolExecutor(1, thread_name_prefix="tianji-ort-select")
            self._selection = self._selector.submit(_select, twin, self.kind, example, self._latest)
        else:
            self._decide(lambda: _select(twin, self.kind, example, self._latest))

    def _acting_copy(self, spec, example: np.ndarray) -> None:
        """`policy` and `precision` per spec.model.actorPrecision; auto: models.auto_precision, and
        float32 where the int8 copy's first build (on `example`) refuses."""
        requested = spec.model.actor_precision
        if requested != "auto":
            self.precision, why = requested, "requested"
        elif spec.actor.inference == "onnx":
            self.precision, why = "float32", "actor.inference onnx runs in float32"
        else:
            self.precision, why = auto_precision(spec.algorithm.name, self.model)
        self.policy = actor_policy(self.model, self.precision)
        if requested == "auto" and isinstance(self.policy, Int8Policy):
            with torch.no_grad():
                self.policy(torch.from_numpy(np.array(example, copy=True)))  # builds the kernels, or refuses
            if self.policy.refused:
                self.policy, self.precision, why = self.model, "float32", "the int8 copy's first build refused"
        self.report.update(precision=self.precision, precision_reason=why)
        if requested == "auto":
            log.info("actor precision (auto): %s; %s", self.precision, why)

    @property
    def name(self) -> str:
        return self.report["inference"]

    def _use(self, policy: OrtPolicy) -> None:
        self.policy = policy
        self.report["inference"] = "onnx"
        if policy.live.version != self._latest:  # versions loaded while auto was deciding
            policy.sync(self._latest, wait=self.wait)
        self.version = policy.refresh(wait=self.wait)

    def _decide(self, outcome: Callable[[], tuple[Exported, Live, dict]]) -> None:
        try:
            exported, live, bench = outcome()
        except Exception as e:  # noqa: BLE001 - auto falls back to torch on any failure, saying why
            self.report["reason"] = str(e) if isinstance(e, OnnxUnavailable) else f"{type(e).__name__}: {e}"
            log.info("actor inference (auto): torch; ONNX Runtime unavailable: %s", self.report["reason"])
            return
        self.report.update(bench)
        faster = onnx_pays(bench, self.forwards_per_swap)
        log.info("actor inference (auto): %s; per forward at batch %d: ONNX Runtime %.0f us, torch %.0f us CPU; "
                 "a session build %.0f us per version, %d forwards a version", "onnx" if faster else "torch",
                 bench["batch"], bench["onnx_us"], bench["torch_us"], bench["build_us"], self.forwards_per_swap)
        if faster:
            self._use(OrtPolicy(self.model, self.kind, exported, live))

    def loaded(self, version: int) -> None:
        """New weights are in `model` (the learner's version `version`): the acting copy follows."""
        self._latest = version
        if isinstance(self.policy, OrtPolicy):
            self.policy.sync(version, wait=self.wait)
            return
        if isinstance(self.policy, Int8Policy) and not self.wait:
            self._deferred = True  # begin_fragment syncs when a build is due (Int8Policy.due)
            return
        if self.policy is not self.model:
            self.policy.sync()  # the bf16 / int8 copy
        self.version = version

    def begin_fragment(self) -> int:
        """Adopt auto's decision once made and a newer session once built; the version acting now."""
        if self._selection is not None and self._selection.done():
            selection, self._selection = self._selection, None
            self._selector.shutdown(wait=False)
            self._decide(selection.result)
        if isinstance(self.policy, OrtPolicy):
            self.version = self.policy.refresh(wait=self.wait)
        elif self._deferred and self.policy.due():
            self.policy.sync()
            self.version, self._deferred = self._latest, False
        return self.version

    def close(self) -> None:
        if self._selector is not None:
            self._selector.shutdown(wait=False, cancel_futures=True)
        if isinstance(self.policy, OrtPolicy):
            self.policy.close()
