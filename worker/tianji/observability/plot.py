"""`tianji plot RUN_DIR`: return vs time and vs frames, episode length vs frames, throughput by role,
and PPO's clip fraction and approx-KL against policy lag, from metrics.jsonl."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def plot_run(run_dir: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not recs:
        raise ValueError(f"{run_dir}/metrics.jsonl has no records")
    t = [r["t"] for r in recs]
    ret = [r["mean_return"] if r["mean_return"] is not None else float("nan") for r in recs]
    frames = [r["env_frames"] for r in recs]
    length = [r.get("mean_episode_length") if r.get("mean_episode_length") is not None else float("nan")
              for r in recs]
    fig, ax = plt.subplots(1, 5, figsize=(25, 4))
    _curve(ax[0], t, ret, label="training: mean of the last 100 episodes")
    ev = [(r["t"], r["eval_return"]) for r in recs if r.get("eval_return") is not None]
    if ev:  # spec.evaluation: the last evaluation's mean (greedy policy), a step per evaluation
        ax[0].step(*zip(*ev), where="post", label="evaluation (greedy policy)",
                   marker="o" if len(ev) <= MARKERS_UP_TO else None, markersize=4)
        ax[0].legend(fontsize=8)
    ax[0].set(xlabel="seconds", ylabel="mean return", title="return vs time")
    _curve(ax[1], frames, ret)
    ax[1].set(xlabel="env frames", ylabel="mean return (last 100)", title="return vs frames")
    _curve(ax[2], frames, length)  # for a sparse reward, what shows the learning
    ax[2].set(xlabel="env frames", ylabel="mean episode length (last 100), steps", title="episode length vs frames")
    for key, label in (("produced_fps", "actors: produced frames/s"), ("received_fps", "buffers: received samples/s"),
                       ("consumed_sps", "learners: consumed samples/s")):
        _curve(ax[3], t, [r[key] for r in recs], label=label)
    ax[3].set(xlabel="seconds", ylabel="per second", title="throughput by role")
    ax[3].legend(fontsize=8)
    _stats_vs_lag(ax[4], recs)
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(str(run_dir.name))
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


MARKERS_UP_TO = 60  # points: a short run's curve is drawn with a marker on each record


def _curve(ax, xs: list, ys: list, **kw) -> None:
    """A line, with markers where a line alone would not show a point: on every point of a short
    run, and on a point whose neighbours are missing (NaN), which a line draws as nothing."""
    finite = [y == y for y in ys]
    if sum(finite) <= MARKERS_UP_TO:
        ax.plot(xs, ys, marker="o", markersize=4, **kw)
        return
    line = ax.plot(xs, ys, **kw)[0]
    alone = [i for i, ok in enumerate(finite) if ok and not (i > 0 and finite[i - 1])
             and not (i + 1 < len(ys) and finite[i + 1])]
    if alone:
        ax.plot([xs[i] for i in alone], [ys[i] for i in alone], linestyle="none", marker="o", markersize=4,
                color=line.get_color())


def interval_lags(recs: list[dict]) -> list[float]:
    """Mean policy lag of the samples consumed between consecutive records, from the cumulative
    per-sample histogram (`lag_hist`; a bucket counts as its upper bound, exact for lags <= 4)."""
    out, prev = [], None
    for r in recs:
        h = r.get("lag_hist") or {}
        d = {k: n - (prev or {}).get(k, 0) for k, n in h.items()}
        n = sum(d.values())
        finite = {k: v for k, v in d.items() if k != "inf"}
        out.append(sum(float(k) * v for k, v in finite.items()) / n if n and n == sum(finite.values())
                   else float("nan"))
        prev = h or prev
    return out


def _stats_vs_lag(ax, recs: list[dict]) -> None:
    lag = interval_lags(recs)
    for key, label, marker in (("clip_fraction", "clip fraction", "o"), ("approx_kl", "approx-KL", "x")):
        ys = [(r.get("learner") or {}).get(key, float("nan")) for r in recs]
        ax.scatter(lag, ys, s=10, marker=marker, label=label, alpha=0.6)
    ax.set(xlabel="mean policy lag of the interval's samples (versions)", ylabel="latest PPO update",
           title="clip fraction / approx-KL vs policy lag")
    ax.legend(fontsize=8)


def plot_command(a: argparse.Namespace) -> int:
    run_dir = Path(a.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        print(f"tianji plot: {run_dir}/metrics.jsonl not found", file=sys.stderr)
        return 2
    try:
        out = plot_run(run_dir, Path(a.out) if a.out else run_dir / "plot.png")
    except ValueError as e:
        print(f"tianji plot: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0
