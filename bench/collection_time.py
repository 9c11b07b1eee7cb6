"""The paper's Fig. 5: time for a buffer to receive 10,000 samples, run by
`python -m bench.transport --experiment collection` (see there for the options).

(a) against message size (one actor, no simulated env time: communication only);
(b) against actor count at one size, each actor spending `sim` seconds per sample
    before it sends it (slept, not computed: with 2 cores a busy env would measure
    CPU contention, not the transport; the paper's actors each have their own core).

Every point is run over each transport in modes `raw` (pyzmq: one frame, received
zero-copy and dropped: the ceiling) and `wire` (TianJi's encode/send and recv/decode
with validation). `memcpy` is the in-process time to copy the same bytes once into a
preallocated ring, the least any transport that delivers them can cost.

A point streams `m` = min(samples, max(MIN_MESSAGES, budget_bytes / size)) messages
and reports time_to_N = N * (time of the m messages) / m (in (a) the median of
`reps` interleaved runs), with m in the JSON: the
rate is steady (constant size; actors paced on a fixed schedule), so large sizes need
not move 80 GB. One sample per message, as the paper's experiment sends.

Predictions, for each point:
  - `planner_default`: the per-message cost the planner assumes when nothing was
    profiled (control/planner/profile.default_profile: mu = 100 µs + bytes / 0.5 GB/s), with
    sampling time N*sim/k: T = N * max(mu, sim/k). Communication-bound from k* = sim/mu.
  - `measured_link`: the same rule with mu measured in (a) at this size and transport
    (wire mode), i.e. from the measured link numbers, not from the planner.
The measured onset of the communication bottleneck in (b) is the smallest k whose
time exceeds the sampling-only time N*sim/k by more than ONSET_MARGIN.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import zmq

JOB = "bench"
HWM = 64
MIN_MESSAGES = 100
RECV_TIMEOUT_S = 20.0
ONSET_MARGIN = 0.2  # 20 % slower than sampling alone: communication is the bottleneck


def planner_default_mu(size: int) -> float:
    """Per-message seconds the planner assumes unprofiled (plan.default_profile's formula)."""
    return 100e-6 + size / 0.5e9


def _actor(addr: str, mode: str, size: int, count: int, sim: float, go, done, wire_fns) -> None:
    encode, send = wire_fns
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, HWM)
    s.connect(addr)
    arr = np.frombuffer(np.random.bytes(size), dtype=np.uint8)
    go.wait(RECV_TIMEOUT_S)
    t0 = time.perf_counter()
    for i in range(count):
        if sim:
            # a fixed schedule (not sleep(sim) per sample) so that oversleeping does not add up
            wait = t0 + (i + 1) * sim - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        if mode == "raw":
            s.send(arr, copy=False)
        else:
            send(s, encode("fragment", JOB, "actor-0-0", i, 0, {"obs": arr}, {"frames": 1}))
    done.wait(RECV_TIMEOUT_S)  # close after the receiver has everything (see transport._sender)
    s.close(linger=0)
    ctx.term()


def collect(addr_base: str, mode: str, size: int, messages: int, actors: int, sim: float, wire_fns) -> float:
    """Seconds from the actors' start signal to the `messages`-th message received."""
    encode, send, recv, decode = wire_fns
    ctx = zmq.Context()
    r = ctx.socket(zmq.PULL)
    r.setsockopt(zmq.RCVHWM, HWM)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVTIMEO, int(RECV_TIMEOUT_S * 1000))
    r.bind(addr_base)
    addr = r.getsockopt(zmq.LAST_ENDPOINT).decode()
    mpc = mp.get_context("fork")
    go, done = mpc.Event(), mpc.Event()
    per = math.ceil(messages / actors)
    procs = [mpc.Process(target=_actor, args=(addr, mode, size, per, sim, go, done, (encode, send)))
             for _ in range(actors)]
    for p in procs:
        p.start()
    try:
        time.sleep(0.05 + 0.01 * actors)  # let every actor connect before the clock starts
        got = 0
        t0 = time.perf_counter()
        go.set()
        if mode == "raw":
            while got < messages:
                r.recv(copy=False)
                got += 1
        else:
            while got < messages:
                msg = decode(recv(r), job=JOB)
                if msg.arrays["obs"].nbytes != size:
                    raise RuntimeError("payload size mismatch")
                del msg
                got += 1
        elapsed = time.perf_counter() - t0
    except zmq.Again:
        raise RuntimeError(f"{mode} {size} B x{actors}: nothing received for {RECV_TIMEOUT_S:g}s") from None
    finally:
        go.set()
        done.set()
        for p in procs:
            p.join(timeout=RECV_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        r.close()
        ctx.term()
    return elapsed


def memcpy_seconds(size: int, messages: int, ring: int = 8) -> float:
    """In-process: copy `messages` samples of `size` bytes once each into a ring of `ring` slots."""
    src = np.frombuffer(np.random.bytes(size), dtype=np.uint8)
    dst = np.empty((ring, size), dtype=np.uint8)
    dst[:] = src  # fault the ring in first, as a running buffer has
    t0 = time.perf_counter()
    for i in range(messages):
        dst[i % ring] = src
    return time.perf_counter() - t0


def _messages(samples: int, size: int, budget_bytes: float) -> int:
    return int(min(samples, max(MIN_MESSAGES, budget_bytes // size)))


def _onset(points: list[dict]) -> int | None:
    for p in points:
        if p["seconds"] > (1 + ONSET_MARGIN) * p["sampling_only_seconds"]:
            return p["actors"]
    return None


def run(sizes: list[int], actor_counts: list[int], sims: list[float], size_b: int, transports: list[str],
        samples: int, budget_bytes: float, samples_b: int, wire_fns, reps: int = 3) -> dict:
    tmp = tempfile.mkdtemp(prefix="tianji-collect-")
    bases = {"ipc": f"ipc://{tmp}/c", "tcp": "tcp://127.0.0.1:*"}
    t_start = time.perf_counter()
    by_size = []
    mu_wire: dict[tuple[str, int], float] = {}
    for size in sorted(set(sizes) | {size_b}):
        m = _messages(samples, size, budget_bytes)
        row = {"bytes": size, "messages_timed": m,
               "memcpy_seconds": samples * memcpy_seconds(size, m) / m,
               "planner_default_seconds": samples * planner_default_mu(size)}
        for tr in transports:
            secs: dict[str, list] = {"raw": [], "wire": []}
            for _ in range(reps):  # interleaved, so that load from other work hits both alike
                for mode in ("raw", "wire"):
                    secs[mode].append(collect(bases[tr], mode, size, m, 1, 0.0, wire_fns))
            for mode, xs in secs.items():
                row[f"{tr}_{mode}_seconds"] = samples * statistics.median(xs) / m
            mu_wire[(tr, size)] = row[f"{tr}_wire_seconds"] / samples
            row[f"{tr}_wire_over_raw_time"] = round(row[f"{tr}_wire_seconds"] / row[f"{tr}_raw_seconds"], 3)
        print(f"  (a) {size:>8} B: " + "  ".join(f"{k.replace('_seconds', '')} {v:.3f}s" for k, v in row.items()
                                                 if k.endswith("_seconds")), file=sys.stderr)
        if size in sizes:
            by_size.append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    by_actors = []
    m_b = samples_b
    for sim in sims:
        for tr in transports:
            for mode in ("raw", "wire"):
                points = []
                for k in actor_counts:
                    sec = collect(bases[tr], mode, size_b, m_b, k, sim, wire_fns)
                    sampling = samples * sim / k
                    mu = mu_wire[(tr, size_b)]
                    points.append({"actors": k, "seconds": round(samples * sec / m_b, 3),
                                   "sampling_only_seconds": round(sampling, 3),
                                   "measured_link_seconds": round(samples * max(mu, sim / k), 3),
                                   "planner_default_seconds": round(
                                       samples * max(planner_default_mu(size_b), sim / k), 3)})
                    print(f"  (b) sim {sim:g}s {tr} {mode} x{k}: {points[-1]['seconds']:.2f}s "
                          f"(sampling alone {sampling:.2f}s)", file=sys.stderr)
                mu = mu_wire[(tr, size_b)]
                by_actors.append({
                    "sim_seconds": sim, "transport": tr, "mode": mode, "bytes": size_b, "messages_timed": m_b,
                    "points": points,
                    "measured_onset_actors": _onset(points),
                    "predicted_onset_actors": {
                        "measured_link": round(sim / mu, 2),
                        "planner_default": round(sim / planner_default_mu(size_b), 2)},
                })
    try:
        os.rmdir(tmp)
    except OSError:
        pass
    return {"experiment": "collection", "samples": samples, "budget_bytes_per_point": budget_bytes,
            "reps_a": reps,
            "by_size": by_size, "by_actors": by_actors,
            "onset_rule": f"first actor count whose time exceeds samples*sim/actors by > {ONSET_MARGIN:.0%}",
            "predictions": "planner_default: mu = 100 µs + bytes/0.5 GB/s (control/planner/profile.default_profile, "
                           "used when nothing is profiled); measured_link: mu from (a), wire mode, same "
                           "transport and size; T = samples * max(mu, sim/actors), onset k* = sim/mu",
            "seconds": round(time.perf_counter() - t_start, 1)}


def plot(result: dict, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sims = sorted({b["sim_seconds"] for b in result["by_actors"]})
    fig, ax = plt.subplots(1, 1 + len(sims), figsize=(5.5 * (1 + len(sims)), 4.2))
    ax = np.atleast_1d(ax)
    a = result["by_size"]
    xs = [r["bytes"] / 1024 for r in a]
    n = result["samples"]
    for key in sorted(k for k in a[0] if k.endswith("_seconds")):
        style = "--" if key.startswith(("memcpy", "planner")) else "-"
        ax[0].loglog(xs, [r[key] for r in a], style, marker="o", ms=3, label=key.replace("_seconds", ""))
    ax[0].set(xlabel="message size (KB)", ylabel=f"seconds to receive {n:,} samples",
              title="(a) collection time vs message size (1 actor)")
    for i, sim in enumerate(sims, 1):
        first = True
        for b in (b for b in result["by_actors"] if b["sim_seconds"] == sim):
            ks = [p["actors"] for p in b["points"]]
            ax[i].loglog(ks, [p["seconds"] for p in b["points"]], marker="o", ms=3,
                         label=f"{b['transport']} {b['mode']}")
            if first:
                ax[i].loglog(ks, [p["sampling_only_seconds"] for p in b["points"]], "k:", label="sampling alone")
                ax[i].loglog(ks, [p["planner_default_seconds"] for p in b["points"]], "--", color="gray",
                             label="planner default model")
                first = False
            if b["mode"] == "wire":
                ax[i].loglog(ks, [p["measured_link_seconds"] for p in b["points"]], "--", alpha=0.6,
                             label=f"{b['transport']} measured-link model")
        ax[i].set(xlabel="actors", ylabel=f"seconds to receive {n:,} samples",
                  title=f"(b) {result['by_actors'][0]['bytes'] // 1024} KB samples, sim {sim:g} s/sample")
    for x in ax:
        x.grid(alpha=0.3, which="both")
        x.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
