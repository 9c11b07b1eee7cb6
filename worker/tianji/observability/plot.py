"""`tianji plot RUN_DIR`: return vs time and vs frames, and throughput by role, from metrics.jsonl."""
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
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot(t, ret)
    ax[0].set(xlabel="seconds", ylabel="mean return (last 100)", title="return vs time")
    ax[1].plot(frames, ret)
    ax[1].set(xlabel="env frames", ylabel="mean return (last 100)", title="return vs frames")
    for key, label in (("produced_fps", "actors: produced frames/s"), ("received_fps", "buffers: received samples/s"),
                       ("consumed_sps", "learners: consumed samples/s")):
        ax[2].plot(t, [r[key] for r in recs], label=label)
    ax[2].set(xlabel="seconds", ylabel="per second", title="throughput by role")
    ax[2].legend(fontsize=8)
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(str(run_dir.name))
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


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
