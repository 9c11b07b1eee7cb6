"""summary.json: the accounting's view (the numbers a TianJiJob's status shows) plus what
only a local run has (restarts, run dir, exit reason, warnings). README lists its fields."""
from __future__ import annotations

from typing import Optional

from tianji.control.contracts.accounting import Accounting
from tianji.observability.learnerstats import lag_histogram, learner_stats

DATA_ROLES = ("actor", "buffer", "learner")


def run_summary(job, acc: Accounting, *, reason: str, wall: float, crossing: Optional[dict], restarts: dict,
                run_dir: str, resumed_from: Optional[dict], error: Optional[str], warnings: list[str],
                target: Optional[dict] = None, isolation: Optional[dict] = None) -> dict:
    """`wall` counts the whole run (a resumed run's earlier launches too); `crossing`: a reached
    target's crossing (Accounting.target_crossing: the time, frames and mean of the metrics.jsonl
    record marked `"stop": "target"`); `target`: the checkpoint and policy version behind it
    (docs/security.md); `isolation`: the roles' uids, or why they run as root (local/isolation.py;
    absent when the launcher is not root)."""
    spec, t = job.spec, job.spec.topology
    v = acc.view(wall, spec.evaluation)
    frames = max(v["env_frames"], 1)
    rejected = acc.reasons("messages_rejected_total")
    return {
        "job": job.name, "algorithm": spec.algorithm.name, "env": spec.env.id,
        "dependencies": spec.dependency_mode,  # auto resolved: what ran
        "target_return": float(spec.stop.mean_return) if spec.stop.mean_return is not None else None,
        "reached_target": crossing is not None,
        "seconds_to_target": crossing and crossing["t"],
        "frames_to_target": crossing and crossing["env_frames"],
        "mean_return_at_target": crossing and crossing["mean_return"],
        "target_checkpoint": target and target["checkpoint"],
        "target_policy_version": target and target["policy_version"],
        "wall_seconds": round(wall, 3), "env_frames": v["env_frames"], "episodes": v["episodes"],
        "mean_return": v["mean_return"],  # last 100 episodes (null: none finished)
        "mean_episode_length": v["mean_episode_length"],  # steps, last 100 episodes (null: none finished)
        "throughput": v["throughput"],
        "policy_lag": {k: (x if x is not None else 0.0) for k, x in v["policy_lag"].items()},
        "policy_lag_hist": lag_histogram(acc),
        "learner_stats": learner_stats(acc),
        "processes": {"actors": t.groups * t.actors, "buffers": t.groups * t.buffers,
                      "learners": t.groups * t.learners},
        "bytes_sent": v["bytes_sent"],
        "bytes_sent_per_frame": {r: acc.role_totals(r).get("bytes_sent_total", 0.0) / frames for r in DATA_ROLES},
        "rejected_messages": v["rejected_messages"],
        "rejected_by_reason": {**rejected, **({"launcher_report": acc.rejected} if acc.rejected else {})},
        "exit_reason": reason,
        "restarts": restarts,
        "dropped_samples": v["dropped_samples"],
        "dropped_fraction": v["dropped_fraction"], "replay_ratio": v["replay_ratio"],
        "policy_version": v["policy_version"],
        "evaluation": v["evaluation"],
        "run_dir": run_dir,
        **({"resumed_from": resumed_from} if resumed_from else {}),
        **({"error": error} if error else {}),
        **({"warnings": warnings} if warnings else {}),
        **({"isolation": isolation} if isolation else {}),
    }


def ended_line(job: str, reason: str, wall: float, summary: dict, path) -> str:
    """The console's last line. A run that failed says first which process failed and why (the
    summary's `error`). After a target, the mean that met it comes first: the summary's
    mean_return also counts the episodes that finished while the run stopped, and can be a
    little below the target, which alone would read as a miss."""
    mean, at = summary["mean_return"], summary.get("mean_return_at_target")
    text = "no episode finished" if mean is None else f"mean return {mean:.1f}"
    if reason == "target" and at is not None and mean is not None and f"{at:.1f}" != f"{mean:.1f}":
        text = f"mean return {at:.1f} at the target ({mean:.1f} with the episodes that ended while it stopped)"
    if summary.get("mean_episode_length") is not None:
        text += f", episode length {summary['mean_episode_length']:.1f}"
    counts = f"{int(summary['env_frames'])} frames, {text}"
    if reason == "error" and summary.get("error"):
        return f"tianji: {job} failed after {wall:.1f}s: {summary['error']} ({counts}); summary: {path}"
    return f"tianji: {job} ended ({reason}) after {wall:.1f}s: {counts}; summary: {path}"
