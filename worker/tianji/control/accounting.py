"""Job-wide numbers from role reports: totals, windowed rates, episodes, lag.

Reports carry each process's cumulative counters. A restarted process starts
its counters from zero under a new pid, so the last snapshot of every
retired incarnation is folded into `retired` and totals stay monotonic.
"""
from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

RATE_WINDOW_S = 5.0


def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0.0) + float(v)


@dataclass
class ProcState:
    pid: int
    role: str
    snapshot: dict
    extra: dict
    last_seen: float


@dataclass
class Aggregate:
    started: float = field(default_factory=time.monotonic)
    procs: dict[tuple, ProcState] = field(default_factory=dict)
    retired: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    retired_reasons: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    retired_lag: list = field(default_factory=list)
    episodes: deque = field(default_factory=lambda: deque(maxlen=100))
    episodes_total: int = 0
    history: deque = field(default_factory=lambda: deque(maxlen=256))
    target_reached_at: Optional[float] = None

    def elapsed(self, now: Optional[float] = None) -> float:
        return (now or time.monotonic()) - self.started

    # -------------------------------------------------------------- intake
    def take(self, meta: dict[str, Any], now: Optional[float] = None) -> tuple:
        now = now or time.monotonic()
        key = (meta["role"], int(meta["group"]), int(meta["index"]))
        snap = meta.get("metrics") or {}
        old = self.procs.get(key)
        if old is not None and old.pid != meta["pid"]:
            self._retire(old)
        extra = {k: v for k, v in meta.items() if k not in ("metrics", "episodes")}
        self.procs[key] = ProcState(int(meta["pid"]), key[0], snap, extra, now)
        eps = meta.get("episodes") or []
        self.episodes.extend(float(e) for e in eps)
        self.episodes_total += len(eps)
        return key

    def _retire(self, p: ProcState) -> None:
        _add(self.retired[p.role], p.snapshot.get("counts", {}))
        for name, by_reason in p.snapshot.get("reasons", {}).items():
            for r, v in by_reason.items():
                self.retired_reasons[name][r] = self.retired_reasons[name].get(r, 0.0) + v
        if p.snapshot.get("lag", {}).get("count"):
            self.retired_lag.append(p.snapshot["lag"])

    # -------------------------------------------------------------- views
    def role_totals(self, role: str) -> dict[str, float]:
        out = dict(self.retired.get(role, {}))
        for p in self.procs.values():
            if p.role == role:
                _add(out, p.snapshot.get("counts", {}))
        return out

    def reasons(self, name: str) -> dict[str, float]:
        out = dict(self.retired_reasons.get(name, {}))
        for p in self.procs.values():
            for r, v in p.snapshot.get("reasons", {}).get(name, {}).items():
                out[r] = out.get(r, 0.0) + v
        return out

    def totals(self) -> dict[str, float]:
        a, b, l = self.role_totals("actor"), self.role_totals("buffer"), self.role_totals("learner")
        return {
            "env_frames": a.get("env_frames_total", 0.0),
            "received": b.get("samples_received_total", 0.0),
            "consumed": l.get("samples_consumed_total", 0.0),
            "train_steps": l.get("train_steps_total", 0.0),
            "bytes_sent": sum(self.role_totals(r).get("bytes_sent_total", 0.0) for r in ("actor", "buffer", "learner")),
        }

    def rejected(self) -> int:
        return int(sum(self.reasons("messages_rejected_total").values()))

    def mean_return(self) -> Optional[float]:
        return float(np.mean(self.episodes)) if self.episodes else None

    def policy_version(self) -> int:
        v = [int(p.extra.get("version", 0) or 0) for p in self.procs.values() if p.role == "learner"]
        return max(v) if v else 0

    def lag(self) -> dict[str, Optional[float]]:
        parts = list(self.retired_lag) + [p.snapshot.get("lag", {}) for p in self.procs.values() if p.role == "learner"]
        parts = [x for x in parts if x.get("count")]
        if not parts:
            return {"min": None, "mean": None, "max": None}
        return {"min": float(min(x["min"] for x in parts)),
                "mean": float(sum(x["sum"] for x in parts) / sum(x["count"] for x in parts)),
                "max": float(max(x["max"] for x in parts))}

    def sample(self, now: Optional[float] = None) -> None:
        """Remember totals at `now` for windowed rates."""
        now = now or time.monotonic()
        self.history.append((now, self.totals()))

    def rates(self, window: float = RATE_WINDOW_S) -> dict[str, float]:
        if len(self.history) < 2:
            return {"produced_fps": 0.0, "received_fps": 0.0, "consumed_sps": 0.0, "train_steps_per_s": 0.0}
        t1, last = self.history[-1]
        t0, first = self.history[0]
        for t, tot in self.history:
            if t1 - t <= window:
                t0, first = t, tot
                break
        dt = max(t1 - t0, 1e-9)
        d = lambda k: max(0.0, last[k] - first[k]) / dt  # noqa: E731
        return {"produced_fps": d("env_frames"), "received_fps": d("received"), "consumed_sps": d("consumed"),
                "train_steps_per_s": d("train_steps")}

    def role_rates(self) -> dict[str, dict[str, float]]:
        """Per-process view for metrics.jsonl (latest cumulative counters and gauges)."""
        out = {}
        for (role, g, i), p in sorted(self.procs.items()):
            c = p.snapshot.get("counts", {})
            out[f"{role}-{g}-{i}"] = {
                "frames": c.get("env_frames_total", 0.0), "sent": c.get("samples_sent_total", 0.0),
                "received": c.get("samples_received_total", 0.0), "consumed": c.get("samples_consumed_total", 0.0),
                "bytes_sent": c.get("bytes_sent_total", 0.0),
                "queue_depth": p.snapshot.get("gauges", {}).get("queue_depth", 0.0),
                "version": p.extra.get("version"), "pace_fps": p.extra.get("pace_fps"),
                "capacity_sps": p.extra.get("capacity_sps"),
            }
        return out
