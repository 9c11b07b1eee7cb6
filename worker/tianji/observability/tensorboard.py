"""TensorBoard event files for a run, written by the launcher from the records it already makes.

One writer per run, in the launcher's metrics loop (one record a second), from the reports it
collects: no role process writes TensorBoard files, so training pays nothing for them and a run on
Kubernetes or locally has the same numbers. Torch-free: the protos and the event-file writer are
TensorBoard's own. Files go into the run dir itself, so `tensorboard --logdir runs/` shows one run
per run dir; a `--resume`d run adds a file there and TensorBoard joins them by step (env frames).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

from tianji.control.contracts.rolereport import LAG_BOUNDS

RATE_TAGS = {"produced_fps": "throughput/actors_produced_fps", "received_fps": "throughput/buffers_received_sps",
             "consumed_sps": "throughput/learners_consumed_sps", "train_steps_per_s": "throughput/train_steps_per_s"}


def scalars(row: dict) -> dict[str, float]:
    """The scalar series of one metrics.jsonl record, by TensorBoard tag (also W&B's keys)."""
    out: dict[str, float] = {}

    def put(tag: str, v) -> None:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[tag] = float(v)

    put("charts/episode_return_mean", row.get("mean_return"))
    put("charts/episode_length_mean", row.get("mean_episode_length"))
    put("charts/episodes", row.get("episodes"))
    put("charts/env_frames", row.get("env_frames"))
    put("eval/return_mean", row.get("eval_return"))  # the last periodic evaluation (spec.evaluation)
    for k, tag in RATE_TAGS.items():
        put(tag, row.get(k))
    for k, v in (row.get("lag") or {}).items():
        put(f"staleness/policy_lag_{k}", v)
    put("staleness/policy_version", row.get("policy_version"))
    put("staleness/dropped_samples", row.get("dropped"))
    put("staleness/replay_ratio", row.get("replay_ratio"))  # when the buffers report a realised ratio
    for k, v in (row.get("learner") or {}).items():
        put(f"learner/{k}", v)
    return out


class RunBoard:
    """TensorBoard scalars (and the lag histogram) of one run, step = env frames."""

    def __init__(self, run_dir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(run_dir), flush_secs=5)

    def write(self, row: dict, wall: Optional[float] = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

        values = [Summary.Value(tag=t, simple_value=v) for t, v in scalars(row).items()]
        hist = row.get("lag_hist")
        if hist and sum(hist.values()):
            counts = list(hist.values())
            nonempty = [i for i, n in enumerate(counts) if n]
            # Bucket i holds lags in (LAG_BOUNDS[i-1], LAG_BOUNDS[i]]; the last one, beyond them (1e9 stands for inf).
            limits = [float(b) for b in LAG_BOUNDS] + [1e9]
            lo = 0.0 if nonempty[0] == 0 else float(LAG_BOUNDS[nonempty[0] - 1]) + 1
            values.append(Summary.Value(tag="staleness/policy_lag_samples", histo=HistogramProto(
                min=lo, max=limits[nonempty[-1]], num=float(sum(counts)),
                sum=float((row.get("lag") or {}).get("mean") or 0.0) * sum(counts), sum_squares=0.0,
                bucket_limit=limits, bucket=[float(n) for n in counts])))
        if values:
            self.writer.add_event(Event(wall_time=wall or time.time(), step=int(row.get("env_frames") or 0),
                                        summary=Summary(value=values)))

    def close(self) -> None:
        self.writer.close()
