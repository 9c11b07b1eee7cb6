"""Job-wide accounting, shared by both engines: what is counted, how, and when a job stops.

    TOTALS         which role's counter makes each job total (the metric table and the
                   report format are tianji.control.contracts.rolereport's)
    Accounting     reports in, job numbers out (`view()`): summary.json and the
                   TianJiJob status are both `view()`, so they agree
    StopRule       spec.stop evaluated on the accounting

Counting rules (the same for processes and pods):
* totals never go backwards: an incarnation (process start; id `incarnation`) is
  replaced by a new one under the same (role, group, index) → the old one's last
  snapshot is folded into `retired`; an incarnation's counters only grow (a report
  older than the one held, by its `seq`, is ignored);
* mean return = mean of the last 100 *finished* episodes of the job, ordered by
  finish time; the target needs 100 episodes and a trained policy (version > 0);
* a learner that starts over (a new incarnation without a checkpoint to resume from)
  starts the episode window over: episodes that finished before it started were
  played by a policy it does not have (`window_since`);
* evaluations (spec.evaluation): the evaluator's report carries its evaluations of this
  incarnation (`extra.eval`: count, the last one, the best mean); the job counts those it has
  not counted yet (a restarted evaluator starts its count again) and keeps the last and best;
* rates: `throughput` = totals / elapsed (as summary.json always had), `rates` =
  over the last RATE_WINDOW_S (the live view and the autoscaler);
* the target's crossing (`target_crossing`): the time, env frames and mean return at the
  moment the mean first met stop.meanReturn, kept once: a resumed run keeps it (it is part of
  `state()`), a learner that starts over voids it with the episode window.

Torch-free and numpy-free: the operator image imports it.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Optional

from tianji.control.contracts.rolereport import (
    REPORT_VERSION,
    ROLES,
    WINDOW,
    Report,
    ReportError,
    parse_report,
    report_doc,
)

# job total -> (role whose counter it is, counter); bytes_sent sums every role.
TOTALS = {
    "env_frames": ("actor", "env_frames_total"),
    "received": ("buffer", "samples_received_total"),
    "consumed": ("learner", "samples_consumed_total"),
    "train_steps": ("learner", "train_steps_total"),
}
RATE_KEYS = {
    "env_frames": "produced_fps",
    "received": "received_fps",
    "consumed": "consumed_sps",
    "train_steps": "train_steps_per_s",
}

RATE_WINDOW_S = 5.0
MAX_GONE = 1024  # replaced incarnations remembered (to recognise their late reports)
STATE_VERSION = 2


# ----------------------------------------------------------------- accounting
def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0.0) + float(v)


def _merge_lag(parts: list[dict]) -> dict[str, Optional[float]]:
    parts = [x for x in parts if x.get("count")]
    if not parts:
        return {"min": None, "mean": None, "max": None}
    return {
        "min": float(min(x["min"] for x in parts)),
        "mean": float(sum(x["sum"] for x in parts) / sum(x["count"] for x in parts)),
        "max": float(max(x["max"] for x in parts)),
    }


def _episode(t: float, r: float, *length: int) -> tuple:
    """(finish time, return[, length]) as the window keeps it."""
    return (float(t), float(r), *(int(n) for n in length[:1]))


class Accounting:
    """Reports in, job numbers out. `state()` / `Accounting(state)` persist it (the operator
    keeps it in the TianJiJob status, so an operator restart loses nothing)."""

    def __init__(self, state: Optional[dict] = None):
        # The newest report held of each process's current incarnation, and of the incarnations
        # replaced (their counts are in `retired`); held without their episodes (counted on intake).
        self.procs: dict[tuple[str, int, int], Report] = {}
        self.gone: dict[str, Report] = {}
        self.retired: dict[tuple[str, int], dict[str, float]] = {}  # (role, group) -> counts
        self.retired_reasons: dict[str, dict[str, float]] = {}
        self.retired_lag: dict[str, Any] = {"count": 0, "sum": 0.0, "min": None, "max": None}
        self.window: list[tuple] = []  # last WINDOW episodes (finish time, return[, length]), by time
        self.window_since = 0.0  # episodes that finished before this (a learner's fresh start) do not count
        self.episodes_total = 0
        self.history: list[tuple[float, dict[str, float], dict[int, dict[str, float]]]] = []
        self.evals = 0  # evaluations counted, whole job
        self.eval_last: Optional[dict] = None  # the newest evaluation (report.eval_summary's `last`)
        self.eval_best: Optional[float] = None
        self._eval_seen: dict[str, int] = {}  # evaluator incarnation -> its evaluations counted
        self.rejected = 0  # reports refused (counted as messages_rejected_total{reason="report"})
        self.target_crossing: Optional[dict[str, float]] = None  # {target, t, env_frames, mean_return}
        if state:
            self._load(state)

    # -------------------------------------------------------------- intake
    def take(self, report: Report) -> bool:
        """Count one report; False if it adds nothing (older than what is held).

        The current incarnation of a (role, group, index) is the one started last. A report of
        an incarnation that is gone (replaced, or first seen after its successor, e.g. the
        previous container's termination message) adds only what it has beyond what was
        counted of it: nothing is counted twice, and the current one stays current."""
        cur = self.procs.get(report.key)
        gone = self.gone.get(report.incarnation)
        if report.role == "evaluator" and "eval" in report.extra:
            self._take_eval(report)
        if cur is not None and cur.incarnation == report.incarnation:
            return self._advance(cur, report, retired=False)
        if gone is not None:
            return self._advance(gone, report, retired=True)
        p = self._proc(report)
        if cur is not None and report.started < cur.started:  # an older process, seen late
            self._retire(report.role, p)
            self._count_episodes(report, report.episodes_total)
            return True
        if cur is not None:
            self._retire(report.role, cur)
        self.procs[report.key] = p
        if report.role == "learner" and not report.extra.get("checkpoint"):
            self.restart_window(report.started)  # a learner from scratch: earlier episodes are not its
        self._count_episodes(report, report.episodes_total)
        return True

    def restart_window(self, since: float) -> None:
        """Count returns again from `since` (wall-clock seconds): a learner started over."""
        if since > self.window_since:
            self.window_since = since
            self.window = [e for e in self.window if e[0] >= since]
            self.target_crossing = None  # made by a policy this learner does not have

    def cross_target(self, target: float, t: float, env_frames: int, mean_return: float) -> tuple[dict, bool]:
        """The crossing of stop.meanReturn `target` at `t` seconds into the run, and whether it is
        this one (True) or one held from before (a resumed run's first launch: it stands)."""
        held = self.target_crossing
        if held is not None and held["target"] == float(target):
            return held, False
        self.target_crossing = {
            "target": float(target),
            "t": round(float(t), 3),
            "env_frames": int(env_frames),
            "mean_return": float(mean_return),
        }
        return self.target_crossing, True

    def _take_eval(self, report: Report) -> None:
        ev = report.extra["eval"]
        new = ev["count"] - self._eval_seen.get(report.incarnation, 0)
        if new <= 0:  # nothing new (an older or repeated report)
            return
        self.evals += new
        self._eval_seen.pop(report.incarnation, None)
        self._eval_seen[report.incarnation] = ev["count"]  # newest last; the oldest are forgotten
        while len(self._eval_seen) > MAX_GONE:
            del self._eval_seen[next(iter(self._eval_seen))]
        if self.eval_last is None or ev["last"]["t"] >= self.eval_last["t"]:  # a replaced one's late report: not last
            self.eval_last = dict(ev["last"])
        self.eval_best = (
            ev["best_return_mean"] if self.eval_best is None else max(self.eval_best, ev["best_return_mean"])
        )

    def evaluation(self, spec: Any = None) -> Optional[dict[str, Any]]:
        """summary.json's `evaluation`: None when spec.evaluation is off; without the spec
        (the operator's status view), what was counted, None before the first evaluation."""
        if spec is not None and spec.interval_seconds is None or spec is None and self.eval_last is None:
            return None
        return {
            "interval_seconds": spec and spec.interval_seconds,
            "episodes_per_eval": spec and spec.episodes,
            "count": self.evals,
            "last": self.eval_last,
            "best_return_mean": self.eval_best,
        }

    @staticmethod
    def _proc(r: Report) -> Report:
        return dataclasses.replace(r, recent=[])

    def _advance(self, held: Report, report: Report, retired: bool) -> bool:
        if report.seq <= held.seq:
            return False
        new_eps = report.episodes_total - held.episodes_total
        if new_eps < 0 or any(report.counts.get(k, 0.0) < v for k, v in held.counts.items()):
            raise ReportError(f"{report.name}: counters went backwards within one incarnation")
        p = self._proc(report)
        if retired:  # add what it counted since its last report to the retired totals
            delta = {k: v - held.counts.get(k, 0.0) for k, v in p.counts.items()}
            _add(self.retired.setdefault((report.role, report.group), {}), delta)
            for name, by in p.reasons.items():
                old = held.reasons.get(name, {})
                _add(self.retired_reasons.setdefault(name, {}), {r: v - old.get(r, 0.0) for r, v in by.items()})
            lag = dict(p.lag)
            lag["count"] -= held.lag.get("count", 0)
            lag["sum"] -= held.lag.get("sum", 0.0)
            if lag.get("hist") and held.lag.get("hist"):
                lag["hist"] = [a - b for a, b in zip(lag["hist"], held.lag["hist"])]
            self.retired_lag = _merge_lag_raw(self.retired_lag, lag)
            self.gone[report.incarnation] = p
        else:
            self.procs[report.key] = p
        self._count_episodes(report, new_eps)
        return True

    def _count_episodes(self, report: Report, new_eps: int) -> None:
        if new_eps <= 0:
            return
        self.episodes_total += new_eps
        for ep in report.recent[-new_eps:] if new_eps < len(report.recent) else report.recent:
            self._add_episode(ep)

    def _add_episode(self, ep: tuple[float, float]) -> None:
        if ep[0] < self.window_since or len(self.window) >= WINDOW and ep[0] < self.window[0][0]:
            return  # before the learner's fresh start, or older than all of the last 100
        bisect.insort(self.window, _episode(*ep))
        del self.window[:-WINDOW]

    def _retire(self, role: str, p: Report) -> None:
        """Fold an incarnation that is gone into the retired totals (and remember it)."""
        _add(self.retired.setdefault((role, p.group), {}), p.counts)
        for name, by in p.reasons.items():
            _add(self.retired_reasons.setdefault(name, {}), by)
        self.retired_lag = _merge_lag_raw(self.retired_lag, p.lag)
        self.gone[p.incarnation] = p
        if len(self.gone) > MAX_GONE:  # forget the oldest: their late reports can no longer arrive
            for inc, _ in sorted(self.gone.items(), key=lambda kv: kv[1].started)[: len(self.gone) - MAX_GONE]:
                del self.gone[inc]

    # -------------------------------------------------------------- views
    def role_totals(self, role: str, group: Optional[int] = None) -> dict[str, float]:
        out: dict[str, float] = {}
        for (r, g), counts in self.retired.items():
            if r == role and (group is None or g == group):
                _add(out, counts)
        for (r, g, _), p in self.procs.items():
            if r == role and (group is None or g == group):
                _add(out, p.counts)
        return out

    def groups(self) -> list[int]:
        return sorted({g for (_, g) in self.retired} | {g for (_, g, _) in self.procs})

    def totals(self, group: Optional[int] = None) -> dict[str, float]:
        out = {name: self.role_totals(role, group).get(counter, 0.0) for name, (role, counter) in TOTALS.items()}
        out["bytes_sent"] = sum(self.role_totals(r, group).get("bytes_sent_total", 0.0) for r in ROLES)
        return out

    def reasons(self, name: str) -> dict[str, float]:
        out = dict(self.retired_reasons.get(name, {}))
        for p in self.procs.values():
            _add(out, p.reasons.get(name, {}))
        return out

    def mean_return(self) -> Optional[float]:
        return sum(e[1] for e in self.window) / len(self.window) if self.window else None

    def mean_episode_length(self) -> Optional[float]:
        """Mean length (steps) of the window's episodes that carry one (an older worker's do not)."""
        lengths = [e[2] for e in self.window if len(e) > 2]
        return sum(lengths) / len(lengths) if lengths else None

    def policy_version(self) -> int:
        v = [int(p.extra.get("version", 0) or 0) for (r, _, _), p in self.procs.items() if r == "learner"]
        return max(v) if v else 0

    def lag(self) -> dict[str, Optional[float]]:
        return _merge_lag([self.retired_lag] + [p.lag for (r, _, _), p in self.procs.items() if r == "learner"])

    def lag_hist(self) -> Optional[list[float]]:
        """Consumed samples per policy-lag bucket (report.LAG_BOUNDS, then beyond), whole job."""
        return merge_hist(
            [self.retired_lag.get("hist")]
            + [p.lag.get("hist") for (r, _, _), p in self.procs.items() if r == "learner"]
        )

    def processes(self) -> dict[str, dict[str, Any]]:
        """Per-process latest counters and gauges (metrics.jsonl's `processes`)."""
        out = {}
        for (role, g, i), p in sorted(self.procs.items()):
            c = p.counts
            out[f"{role}-{g}-{i}"] = {
                "frames": c.get("env_frames_total", 0.0),
                "sent": c.get("samples_sent_total", 0.0),
                "received": c.get("samples_received_total", 0.0),
                "consumed": c.get("samples_consumed_total", 0.0),
                "bytes_sent": c.get("bytes_sent_total", 0.0),
                "queue_depth": p.gauges.get("queue_depth", 0.0),
                "version": p.extra.get("version"),
                "pace_fps": p.extra.get("pace_fps"),
                "capacity_sps": p.extra.get("capacity_sps"),
                **({"epsilon": p.extra["epsilon"]} if "epsilon" in p.extra else {}),
            }
        return out

    def checkpoint(self) -> Optional[str]:
        return next(
            (
                p.extra["checkpoint"]
                for (r, _, _), p in sorted(self.procs.items())
                if r == "learner" and p.extra.get("checkpoint")
            ),
            None,
        )

    # -------------------------------------------------------------- rates
    def sample(self, now: float) -> None:
        """Remember totals at `now` (seconds, any clock) for the windowed `rates()`."""
        self.history.append((now, self.totals(), {g: self.totals(g) for g in self.groups()}))
        while len(self.history) > 2 and now - self.history[1][0] >= RATE_WINDOW_S:
            self.history.pop(0)

    def rates(self, group: Optional[int] = None) -> dict[str, float]:
        if len(self.history) < 2:
            return {v: 0.0 for v in RATE_KEYS.values()}
        (t0, a0, g0), (t1, a1, g1) = self.history[0], self.history[-1]
        first, last = (a0, a1) if group is None else (g0.get(group, {}), g1.get(group, {}))
        dt = max(t1 - t0, 1e-9)
        return {v: max(0.0, last.get(k, 0.0) - first.get(k, 0.0)) / dt for k, v in RATE_KEYS.items()}

    # -------------------------------------------------------------- the shared numbers
    def view(self, elapsed: float, evaluation: Any = None) -> dict[str, Any]:
        """The numbers summary.json and the TianJiJob status both show (snake_case here;
        the status is this, camelCased). `elapsed`: seconds since the job started;
        `evaluation`: the job's spec.evaluation."""
        tot = self.totals()
        w = max(elapsed, 1e-9)
        mean = self.mean_return()
        dropped = self.reasons("samples_dropped_total")
        buf = self.role_totals("buffer")
        inserted = buf.get("samples_inserted_total", 0.0)
        return {
            "env_frames": int(tot["env_frames"]),
            "episodes": int(self.episodes_total),
            "mean_return": None if mean is None else float(mean),
            "mean_episode_length": self.mean_episode_length(),
            "policy_version": self.policy_version(),
            "policy_lag": self.lag(),
            "throughput": {v: tot[k] / w for k, v in RATE_KEYS.items()},
            "rates": self.rates(),
            "bytes_sent": int(tot["bytes_sent"]),
            "dropped_samples": {k: int(v) for k, v in dropped.items()},
            # every sample dropped, for any reason by any role, per env frame stepped
            "dropped_fraction": sum(dropped.values()) / tot["env_frames"] if tot["env_frames"] else None,
            # samples buffers sent to learners per sample they stored (off-policy: since learningStarts)
            "replay_ratio": buf.get("samples_sent_total", 0.0) / inserted if inserted else None,
            "rejected_messages": int(sum(self.reasons("messages_rejected_total").values())) + self.rejected,
            "evaluation": self.evaluation(evaluation),
        }

    # -------------------------------------------------------------- persistence
    def state(self) -> dict:
        """JSON-able; restores counts, episodes, lag and each process's gauges exactly (not the
        rate history). A held report is kept as the report itself (report.report_doc), so that
        restoring it validates it as any report is validated; a replaced incarnation's without
        gauges and extras, which nothing reads (the status must stay small)."""
        return {
            "v": STATE_VERSION,
            "episodesTotal": self.episodes_total,
            "window": [list(e) for e in self.window],
            "windowSince": self.window_since,
            "retired": [{"role": r, "group": g, "counts": c} for (r, g), c in sorted(self.retired.items())],
            "retiredReasons": self.retired_reasons,
            "retiredLag": self.retired_lag,
            "rejected": self.rejected,
            "eval": {
                "count": self.evals,
                "last": self.eval_last,
                "best": self.eval_best,
                "seen": dict(self._eval_seen),
            },
            **({"targetCrossing": dict(self.target_crossing)} if self.target_crossing else {}),
            "procs": [report_doc(p) for _, p in sorted(self.procs.items())],
            "gone": [
                report_doc(dataclasses.replace(p, gauges={}, extra={}))
                for p in sorted(self.gone.values(), key=lambda p: p.started)
            ],
        }

    def _load(self, s: dict) -> None:
        try:
            self.episodes_total = int(s.get("episodesTotal", 0))
            self.window = sorted(_episode(*e) for e in s.get("window", []))[-WINDOW:]
            self.window_since = float(s.get("windowSince", 0.0))
            self.retired = {
                (x["role"], int(x["group"])): {k: float(v) for k, v in x["counts"].items()}
                for x in s.get("retired", [])
            }
            self.retired_reasons = {
                k: {r: float(v) for r, v in by.items()} for k, by in s.get("retiredReasons", {}).items()
            }
            self.retired_lag = dict(s.get("retiredLag") or self.retired_lag)
            self.rejected = int(s.get("rejected", 0))
            ev = s.get("eval") or {}
            self.evals = int(ev.get("count", 0))
            self.eval_last = dict(ev["last"]) if ev.get("last") else None
            self.eval_best = None if ev.get("best") is None else float(ev["best"])
            self._eval_seen = {str(k): int(v) for k, v in (ev.get("seen") or {}).items()}
            crossing = s.get("targetCrossing")
            if crossing is not None:
                self.target_crossing = {
                    "target": float(crossing["target"]),
                    "t": float(crossing["t"]),
                    "env_frames": int(crossing["env_frames"]),
                    "mean_return": float(crossing["mean_return"]),
                }
            held = parse_report if s.get("v") == STATE_VERSION else _from_v1
            for doc in s.get("procs", []):
                p = held(doc)
                self.procs[p.key] = p
            for doc in s.get("gone", []):
                p = held(doc)
                self.gone[p.incarnation] = p
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # ReportError is a ValueError
            raise ReportError(f"accounting state unreadable: {type(e).__name__}: {e}") from None


def _from_v1(p: dict) -> Report:
    """A held process as state version 1 kept it (written before v2: no gauges, the version only)."""
    return parse_report(
        {
            "v": REPORT_VERSION,
            "role": p["role"],
            "group": p["group"],
            "index": p.get("index", 0),
            "incarnation": p["incarnation"],
            "started": p.get("started", 0.0),
            "seq": p["seq"],
            "final": bool(p.get("final")),
            "counts": p["counts"],
            "reasons": p.get("reasons", {}),
            "lag": p.get("lag", {}),
            "episodes_total": p.get("episodesTotal", 0),
            "extra": {"version": int(p.get("version", 0))},
        }
    )


def _merge_lag_raw(a: dict, b: dict) -> dict:
    if not b.get("count"):
        return dict(a)
    if not a.get("count"):
        return {k: b.get(k) for k in ("count", "sum", "min", "max", "hist") if b.get(k) is not None}
    out = {
        "count": a["count"] + b["count"],
        "sum": a["sum"] + b["sum"],
        "min": min(a["min"], b["min"]),
        "max": max(a["max"], b["max"]),
    }
    hist = merge_hist([a.get("hist"), b.get("hist")])
    if hist is not None:
        out["hist"] = hist
    return out


def merge_hist(parts: list) -> Optional[list[float]]:
    """Bucket-wise sum of per-sample lag histograms (report lag["hist"]); None if there is none."""
    parts = [h for h in parts if h]
    return [float(sum(x)) for x in zip(*parts)] if parts else None


# ----------------------------------------------------------------- the status view
STATUS_RATE_KEYS = {
    "produced_fps": "producedFps",
    "received_fps": "receivedFps",
    "consumed_sps": "consumedSps",
    "train_steps_per_s": "trainStepsPerSecond",
}


def status_numbers(view: dict) -> dict:
    """`Accounting.view()` as TianJiJob status fields: the same numbers under the Kubernetes
    API's camelCase names (summary.json env_frames = status.envFrames, and so on)."""
    out = {
        "envFrames": view["env_frames"],
        "episodes": view["episodes"],
        "policyVersion": view["policy_version"],
        "policyLag": {k: round(v, 4) for k, v in view["policy_lag"].items() if v is not None},
        "throughput": {STATUS_RATE_KEYS[k]: round(v, 3) for k, v in view["throughput"].items()},
        "rates": {STATUS_RATE_KEYS[k]: round(v, 3) for k, v in view["rates"].items()},
        "bytesSent": view["bytes_sent"],
        "droppedSamples": dict(view["dropped_samples"]),
        "rejectedMessages": view["rejected_messages"],
    }
    if view["mean_return"] is not None:
        out["meanReturn"] = view["mean_return"]
    if view.get("mean_episode_length") is not None:
        out["meanEpisodeLength"] = round(view["mean_episode_length"], 2)
    ev = view.get("evaluation")
    if ev and ev["last"] is not None:
        out["evalReturn"] = ev["last"]["return_mean"]
    for k, name in (("dropped_fraction", "droppedFraction"), ("replay_ratio", "replayRatio")):
        if view.get(k) is not None:
            out[name] = round(view[k], 4)
    return out


# ----------------------------------------------------------------- the stop rule
class StopRule:
    """spec.stop (plus a caller's own wall-clock cap), checked against the accounting.

    target  mean of the last 100 finished episodes >= stop.meanReturn (needs 100 episodes, and a
            learner past version 0: returns an untrained policy played back nothing)
    frames  env frames >= stop.envFrames
    seconds elapsed >= min(stop.seconds, max_seconds)
    """

    def __init__(self, stop: Any, max_seconds: Optional[float] = None):
        self.stop = stop
        caps = [x for x in (stop.seconds, max_seconds) if x is not None]
        self.seconds = min(caps) if caps else None

    def target_reached(self, acc: Accounting) -> bool:
        mean = acc.mean_return()
        return (
            self.stop.mean_return is not None
            and len(acc.window) >= WINDOW
            and mean is not None
            and mean >= self.stop.mean_return
            and acc.policy_version() > 0
        )

    def check(self, acc: Accounting, elapsed: float) -> Optional[str]:
        """ "target" | "frames" | "seconds", or None to go on."""
        if self.target_reached(acc):
            return "target"
        return self.budget(acc, elapsed)

    def budget(self, acc: Accounting, elapsed: float) -> Optional[str]:
        """ "frames" | "seconds" once a budget is spent, or None. (`tianji run` takes a target only
        from the saved policy's evaluation: local/targetcheck.py.)"""
        if self.stop.env_frames is not None and acc.totals()["env_frames"] >= self.stop.env_frames:
            return "frames"
        if self.seconds is not None and elapsed >= self.seconds:
            return "seconds"
        return None

    def message(self, reason: str, acc: Accounting, elapsed: float) -> str:
        if reason == "target":
            return (
                f"mean return {acc.mean_return():.4g} >= stop.meanReturn {self.stop.mean_return:g} "
                f"(policy version {acc.policy_version()}, checkpoint {acc.checkpoint() or 'none yet'})"
            )
        if reason == "frames":
            return f"{int(acc.totals()['env_frames'])} env frames >= stop.envFrames {self.stop.env_frames}"
        return f"ran {elapsed:.0f} s >= {self.seconds:g} s"
