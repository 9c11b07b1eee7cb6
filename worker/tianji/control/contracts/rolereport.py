"""What a role process reports: the metric table, and the report format both engines count.

    metric table   every series a role exports (COUNTERS, GAUGES, HISTOGRAMS; Prometheus
                   names are `tianji_` + these)
    report         the snapshot a role process produces: cumulative counters of this
                   incarnation (one process start; id `incarnation`, ordered by `started`),
                   its last 100 finished episodes (finish time, return, length), gauges, `seq`.
                   `tianji run` gets it pushed over ipc; the operator reads it from the
                   pod's /report and, for the counts made after the last read, from the
                   pod's termination message (`compact_json` fits its 4096 bytes)

`parse_report` validates values, not only shapes: a report moves the job's numbers and
its stop rule, so a non-finite, negative, huge or foreign one is refused (ReportError).
Torch-free and numpy-free: the operator image imports it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

# ----------------------------------------------------------------- the metric table
COUNTERS = {
    "env_frames_total": "Environment frames stepped by actors",
    "samples_sent_total": "Samples pushed to the next role",
    "samples_received_total": "Samples received from the previous role",
    "samples_consumed_total": "Samples used by learner updates",
    "samples_inserted_total": "Samples a buffer stored for training (off-policy: counted from learningStarts)",
    "samples_dropped_total": "Samples dropped, by reason (stale, overflow, hwm, ratio)",
    "train_steps_total": "Learner gradient steps",
    "bytes_sent_total": "Payload bytes sent on data sockets",
    "bytes_received_total": "Payload bytes received on data sockets",
    "messages_rejected_total": "Received messages that failed validation, by reason",
    "episodes_total": "Episodes finished by actors",
    "group_averages_total": "Cross-group parameter averages a learner applied (topology.groupSync: average)",
    "group_averages_skipped_total": "Cross-group averages skipped because their mean was not finite",
    "eval_episodes_total": "Episodes the evaluator played with the greedy policy (spec.evaluation)",
    "policy_wait_seconds_total": "dependencies: strict: seconds an actor waited for the policy trained on its rollout",
    "strict_resends_total": "dependencies: strict: rollouts an actor sent again because no new policy came "
    "(a rollout lost to a restart)",
}
GAUGES = {
    "policy_version": "Policy version this role holds",
    "episode_return_mean": "Mean return of the last 100 episodes this actor finished",
    "queue_depth": "Samples queued in this role",
    "replay_ratio": "Samples sent to the learner / samples inserted (off-policy: since learningStarts)",
    "epsilon": "DQN exploration rate this actor acts with (from the learner's global frame count)",
    "pace_headroom": "Production / learner capacity the learner asks actors for (adaptive pacing)",
    "learner_capacity_sps": "Learner consumption capacity (samples per busy second)",
    "replay_restored": "Transitions a DQN buffer loaded from its replay snapshot at start (checkpoint.replaySnapshot)",
    "replay_snapshot_seconds": "Time the buffer's latest replay snapshot took: the copy in its loop plus the write "
    "in a thread",
    "eval_return_mean": "Mean return of the evaluator's last evaluation (greedy policy, spec.evaluation)",
}
# What a learner computes on each update (gauges `learner_<name>`: the value of its latest batch).
LEARNER_STATS = {
    "policy_loss": "PPO clipped surrogate loss",
    "value_loss": "PPO value loss (0.5 x squared error to the value targets)",
    "entropy": "PPO policy entropy (nats)",
    "clip_fraction": "PPO fraction of samples whose probability ratio left the clip range",
    "approx_kl": "PPO approximate KL(behaviour || current), (r - 1) - log r",
    "grad_norm": "Gradient norm before clipping",
    "explained_variance": "PPO 1 - Var(target - V) / Var(target) at update start",
    "importance_weight": "PPO mean truncated importance weight rho (V-trace; 1 without correction)",
    "dqn_loss": "DQN Huber TD loss",
    "q_mean": "DQN mean Q(o, a) of the replayed actions",
}
GAUGES.update({"learner_" + k: d for k, d in LEARNER_STATS.items()})
LAG_BOUNDS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 1024)  # policy-lag bucket upper bounds (versions)
HISTOGRAMS = {
    "policy_lag": ("Mean policy lag (learner version - behaviour version) of each consumed batch", LAG_BOUNDS),
}
# Per-sample lag of consumed samples, counted in LAG_BOUNDS buckets (the last one: beyond them) by the
# role and carried in its report's lag["hist"]; exported as a histogram built from those counts.
LAG_SAMPLES_HISTOGRAM = ("learner_policy_lag_samples", "Policy lag of each consumed sample (versions)")
REASON_LABELED = frozenset({"samples_dropped_total", "messages_rejected_total"})
ROLES = ("actor", "buffer", "learner", "evaluator")

WINDOW = 100  # episodes in the mean return (and carried in a report)
REPORT_VERSION = 1
MAX_COUNT = 2.0**62  # larger counters are hostile or broken, not real
MAX_EPISODES_PER_REPORT = WINDOW
MAX_EPISODE_LENGTH = 1 << 40  # steps; beyond this a report is hostile or broken


class ReportError(ValueError):
    """A report that cannot be counted (malformed, non-finite, negative, foreign)."""


# ----------------------------------------------------------------- reports
@dataclass(frozen=True)
class Report:
    role: str
    group: int
    index: int
    incarnation: str
    pid: int
    started: float  # wall-clock start of the process: orders incarnations of one role process
    seq: int
    time: float
    final: bool
    counts: dict[str, float]
    reasons: dict[str, dict[str, float]]
    gauges: dict[str, float]
    lag: dict[str, Any]
    episodes_total: int
    recent: list[tuple]  # (finish time, return[, length]) of the last <= 100 episodes, oldest first
    extra: dict[str, Any] = field(default_factory=dict)  # version, pace_fps, epsilon, capacity_sps, checkpoint

    @property
    def key(self) -> tuple[str, int, int]:
        return self.role, self.group, self.index

    @property
    def name(self) -> str:
        return f"{self.role}-{self.group}-{self.index}"


def build_report(
    *,
    job: str,
    role: str,
    group: int,
    index: int,
    incarnation: str,
    pid: int,
    started: float,
    seq: int,
    time: float,
    final: bool,
    snapshot: dict,
    episodes_total: int,
    recent: list,
    extra: dict,
) -> dict:
    """The report as a plain dict (msgpack/JSON): what a role process produces."""
    return {
        "v": REPORT_VERSION,
        "job": job,
        "role": role,
        "group": group,
        "index": index,
        "incarnation": incarnation,
        "pid": pid,
        "started": started,
        "seq": seq,
        "time": time,
        "final": final,
        "counts": snapshot["counts"],
        "reasons": snapshot["reasons"],
        "gauges": snapshot["gauges"],
        "lag": snapshot["lag"],
        "episodes_total": int(episodes_total),
        "recent": [episode(*e) for e in recent[-MAX_EPISODES_PER_REPORT:]],
        "extra": extra,
    }


def report_doc(r: Report, job: str = "") -> dict:
    """A parsed report as the dict it came from: `parse_report(report_doc(r)) == r` (with `job`)."""
    snapshot = {"counts": r.counts, "reasons": r.reasons, "gauges": r.gauges, "lag": r.lag}
    return build_report(
        job=job,
        role=r.role,
        group=r.group,
        index=r.index,
        incarnation=r.incarnation,
        pid=r.pid,
        started=r.started,
        seq=r.seq,
        time=r.time,
        final=r.final,
        snapshot=snapshot,
        episodes_total=r.episodes_total,
        recent=r.recent,
        extra=r.extra,
    )


def episode(t: float, r: float, length: Optional[int] = None) -> list:
    """One recent episode as every report carries it: finish time to 0.01 s, return to 6
    significant digits, and its length in steps (absent from an older worker's reports).
    Rounded at the source, so that a scraped report and the compact termination message (which
    must be short) carry the same values: the mean-100 window is ordered by these, and two
    copies that differed could order a near-tie differently."""
    out = [round(float(t), 2), float(f"{float(r):.6g}")]
    return out if length is None else [*out, int(length)]


def compact_json(report: dict, limit: int) -> bytes:
    """JSON of `report` in at most `limit` bytes (a pod's termination message keeps 4096): the
    oldest episodes' lengths go first (the mean-100 return needs every episode, the mean length
    is a secondary view of them), then the oldest episodes; counters are never dropped."""
    doc = dict(report, recent=[episode(*e) for e in report.get("recent", [])])
    while True:
        out = json.dumps(doc, separators=(",", ":")).encode()
        if len(out) <= limit or not doc["recent"]:
            return out
        long = [i for i, e in enumerate(doc["recent"]) if len(e) > 2]
        if long:  # a length takes 2 (",1") to 15 bytes: strip a few at a time, the oldest first
            for i in long[: max(1, (len(out) - limit) // 15)]:
                doc["recent"][i] = doc["recent"][i][:2]
            continue
        doc["recent"] = doc["recent"][max(1, (len(out) - limit) // 24) :]


def _num(v: Any, what: str, lo: float = 0.0, hi: float = MAX_COUNT) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ReportError(f"{what}: not a number ({type(v).__name__})")
    v = float(v)
    if not math.isfinite(v) or not lo <= v <= hi:
        raise ReportError(f"{what}: {v!r} out of range [{lo:g}, {hi:g}]")
    return v


def _int(v: Any, what: str, lo: int = 0, hi: int = 2**62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ReportError(f"{what}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def _dict(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise ReportError(f"{what}: expected a mapping, got {type(v).__name__}")
    return v


MAX_SENDERS = 1024  # senders a buffer names in extra.over_share
MAX_RETURN = 1e12  # |return| beyond this is hostile or broken (recent episodes and evaluations)


def eval_summary(
    *,
    count: int,
    return_mean: float,
    return_std: float,
    episodes: int,
    policy_version: int,
    env_frames: int,
    t: float,
    best_return_mean: float,
) -> dict:
    """The evaluator's report extra `eval`: its evaluations this incarnation, the last one's numbers."""
    return {
        "count": count,
        "best_return_mean": best_return_mean,
        "last": {
            "return_mean": return_mean,
            "return_std": return_std,
            "episodes": episodes,
            "policy_version": policy_version,
            "env_frames": env_frames,
            "t": t,
        },
    }


def _eval(v: Any) -> dict:
    d = _dict(v, "extra.eval")
    last = _dict(d.get("last"), "extra.eval.last")
    ret = (-MAX_RETURN, MAX_RETURN)
    return {
        "count": _int(d.get("count"), "extra.eval.count", 1, 1 << 40),
        "best_return_mean": _num(d.get("best_return_mean"), "extra.eval.best_return_mean", *ret),
        "last": {
            "return_mean": _num(last.get("return_mean"), "extra.eval.last.return_mean", *ret),
            "return_std": _num(last.get("return_std"), "extra.eval.last.return_std", 0.0, MAX_RETURN),
            "episodes": _int(last.get("episodes"), "extra.eval.last.episodes", 1, 1 << 20),
            "policy_version": _int(last.get("policy_version"), "extra.eval.last.policy_version"),
            "env_frames": _int(last.get("env_frames"), "extra.eval.last.env_frames"),
            "t": _num(last.get("t"), "extra.eval.last.t", 0.0, 1e11),
        },
    }


def parse_report(doc: Any, job: Optional[str] = None) -> Report:
    """Validate a report's values, not only its shape: it moves the job's numbers and its stop."""
    d = _dict(doc, "report")
    if d.get("v") != REPORT_VERSION:
        raise ReportError(f"report version {d.get('v')!r} (expected {REPORT_VERSION})")
    if job is not None and d.get("job") != job:
        raise ReportError(f"report of job {d.get('job')!r}, not {job!r}")
    role = d.get("role")
    if role not in ROLES:
        raise ReportError(f"role {role!r}")
    inc = d.get("incarnation")
    if not isinstance(inc, str) or not 1 <= len(inc) <= 64:
        raise ReportError("incarnation: expected a short string")
    counts = {}
    for k, v in _dict(d.get("counts"), "counts").items():
        if k in COUNTERS:
            counts[k] = _num(v, f"counts.{k}")
    reasons: dict[str, dict[str, float]] = {}
    for name, by in _dict(d.get("reasons", {}), "reasons").items():
        if name in REASON_LABELED:
            reasons[name] = {str(r)[:64]: _num(x, f"reasons.{name}.{r}") for r, x in _dict(by, name).items()}
    gauges = {
        k: _num(v, f"gauges.{k}", -MAX_COUNT) for k, v in _dict(d.get("gauges", {}), "gauges").items() if k in GAUGES
    }
    lag_in = _dict(d.get("lag", {}), "lag")
    lag: dict[str, Any] = {
        "count": _int(lag_in.get("count", 0), "lag.count"),
        "sum": _num(lag_in.get("sum", 0.0), "lag.sum", -MAX_COUNT),
    }
    for k in ("min", "max"):
        lag[k] = None if lag_in.get(k) is None else _num(lag_in[k], f"lag.{k}", -MAX_COUNT)
    if lag_in.get("hist") is not None:
        hist = lag_in["hist"]
        if not isinstance(hist, list) or len(hist) != len(LAG_BOUNDS) + 1:
            raise ReportError(f"lag.hist: expected {len(LAG_BOUNDS) + 1} bucket counts")
        lag["hist"] = [_num(x, f"lag.hist[{i}]") for i, x in enumerate(hist)]
    recent_in = d.get("recent", [])
    if not isinstance(recent_in, list) or len(recent_in) > MAX_EPISODES_PER_REPORT:
        raise ReportError(f"recent: expected a list of at most {MAX_EPISODES_PER_REPORT} episodes")
    recent = []
    for i, e in enumerate(recent_in):
        if not isinstance(e, (list, tuple)) or len(e) not in (2, 3):
            raise ReportError(f"recent[{i}]: expected [finish time, return, length]")
        ep = (_num(e[0], f"recent[{i}].time", 0.0, 1e11), _num(e[1], f"recent[{i}].return", -MAX_RETURN, MAX_RETURN))
        recent.append(ep if len(e) == 2 else (*ep, _int(e[2], f"recent[{i}].length", 0, MAX_EPISODE_LENGTH)))
    extra_in = _dict(d.get("extra", {}), "extra")
    extra: dict[str, Any] = {}
    if extra_in.get("version") is not None:
        extra["version"] = _int(extra_in["version"], "extra.version")
    for k in ("pace_fps", "epsilon", "capacity_sps", "busy_s"):
        if extra_in.get(k) is not None:
            extra[k] = _num(extra_in[k], f"extra.{k}")
    if extra_in.get("eval") is not None:
        extra["eval"] = _eval(extra_in["eval"])
    if isinstance(extra_in.get("checkpoint"), str):
        extra["checkpoint"] = extra_in["checkpoint"][:4096]
    sha = extra_in.get("checkpoint_sha256")  # of the file `checkpoint` names, as the learner wrote it
    if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha):
        extra["checkpoint_sha256"] = sha
    if extra_in.get("over_share") is not None:  # a buffer's samples dropped over each sender's share
        by = _dict(extra_in["over_share"], "extra.over_share")
        if len(by) > MAX_SENDERS:
            raise ReportError(f"extra.over_share: more than {MAX_SENDERS} senders")
        extra["over_share"] = {str(k)[:64]: _num(v, f"extra.over_share.{str(k)[:64]}") for k, v in by.items()}
    return Report(
        role=role,
        group=_int(d.get("group"), "group", 0, 1 << 20),
        index=_int(d.get("index"), "index", 0, 1 << 20),
        incarnation=inc,
        pid=_int(d.get("pid", 0), "pid", 0, 1 << 31),
        started=_num(d.get("started", 0.0), "started", 0.0, 1e11),
        seq=_int(d.get("seq", 0), "seq"),
        time=_num(d.get("time", 0.0), "time", 0.0, 1e11),
        final=bool(d.get("final", False)),
        counts=counts,
        reasons=reasons,
        gauges=gauges,
        lag=lag,
        episodes_total=_int(d.get("episodes_total", 0), "episodes_total"),
        recent=recent,
        extra=extra,
    )
