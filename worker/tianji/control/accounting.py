"""Job-wide accounting, shared by both engines: what is counted, how, and when a job stops.

    metric table   every series a role exports (COUNTERS, GAUGES, HISTOGRAMS) and which
                   role's counter makes each job total (TOTALS)
    report         the snapshot a role process produces: cumulative counters of this
                   incarnation, its last 100 finished episodes, gauges. `tianji run` gets it
                   pushed over ipc; the operator reads it from the pod's /report and, for
                   the counts made after the last read, from the pod's termination message
    Accounting     reports in, job numbers out (`view()`): summary.json and the
                   TianJiJob status are both `view()`, so they agree
    StopRule       spec.stop evaluated on the accounting

Counting rules (the same for processes and pods):
* totals never go backwards: an incarnation (process start; id `incarnation`) is
  replaced by a new one under the same (role, group, index) → the old one's last
  snapshot is folded into `retired`; an incarnation's counters only grow (a report
  older than the one held, by its `seq`, is ignored);
* mean return = mean of the last 100 *finished* episodes of the job, ordered by
  finish time; the target needs 100 episodes;
* rates: `throughput` = totals / elapsed (as summary.json always had), `rates` =
  over the last RATE_WINDOW_S (the live view and the autoscaler).

Torch-free and numpy-free: the operator image imports it.
"""
from __future__ import annotations

import bisect
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
    "samples_dropped_total": "Samples dropped, by reason (stale, overflow, hwm)",
    "train_steps_total": "Learner gradient steps",
    "bytes_sent_total": "Payload bytes sent on data sockets",
    "bytes_received_total": "Payload bytes received on data sockets",
    "messages_rejected_total": "Received messages that failed validation, by reason",
    "episodes_total": "Episodes finished by actors",
}
GAUGES = {
    "policy_version": "Policy version this role holds",
    "episode_return_mean": "Mean return of the last 100 episodes this actor finished",
    "queue_depth": "Samples queued in this role",
    "replay_ratio": "Samples consumed / samples inserted",
    "learner_capacity_sps": "Learner consumption capacity (samples per busy second)",
}
HISTOGRAMS = {
    "policy_lag": ("Mean policy lag (learner version - behaviour version) of each consumed batch",
                   (0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 1024)),
}
REASON_LABELED = frozenset({"samples_dropped_total", "messages_rejected_total"})
ROLES = ("actor", "buffer", "learner")
# job total -> (role whose counter it is, counter); bytes_sent sums every role.
TOTALS = {
    "env_frames": ("actor", "env_frames_total"),
    "received": ("buffer", "samples_received_total"),
    "consumed": ("learner", "samples_consumed_total"),
    "train_steps": ("learner", "train_steps_total"),
}
RATE_KEYS = {"env_frames": "produced_fps", "received": "received_fps", "consumed": "consumed_sps",
             "train_steps": "train_steps_per_s"}

WINDOW = 100  # episodes in the mean return
RATE_WINDOW_S = 5.0
REPORT_VERSION = 1
MAX_COUNT = 2.0 ** 62  # larger counters are hostile or broken, not real
MAX_EPISODES_PER_REPORT = WINDOW
MAX_GONE = 1024  # replaced incarnations remembered (to recognise their late reports)


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
    recent: list[tuple[float, float]]  # (finish time, return) of the last <= 100 episodes, oldest first
    extra: dict[str, Any] = field(default_factory=dict)  # version, pace_fps, capacity_sps, checkpoint

    @property
    def key(self) -> tuple[str, int, int]:
        return self.role, self.group, self.index

    @property
    def name(self) -> str:
        return f"{self.role}-{self.group}-{self.index}"


def build_report(*, job: str, role: str, group: int, index: int, incarnation: str, pid: int, started: float,
                 seq: int, time: float, final: bool, snapshot: dict, episodes_total: int, recent: list,
                 extra: dict) -> dict:
    """The report as a plain dict (msgpack/JSON): what a role process produces."""
    return {"v": REPORT_VERSION, "job": job, "role": role, "group": group, "index": index,
            "incarnation": incarnation, "pid": pid, "started": started, "seq": seq, "time": time, "final": final,
            "counts": snapshot["counts"], "reasons": snapshot["reasons"], "gauges": snapshot["gauges"],
            "lag": snapshot["lag"], "episodes_total": int(episodes_total),
            "recent": [[float(t), float(r)] for t, r in recent[-MAX_EPISODES_PER_REPORT:]], "extra": extra}


def compact_json(report: dict, limit: int) -> bytes:
    """JSON of `report` in at most `limit` bytes (a pod's termination message keeps 4096):
    the oldest recent episodes go first; counters are never dropped."""
    doc = dict(report, recent=[[round(t, 2), float(f"{r:.6g}")] for t, r in report.get("recent", [])])
    while True:
        out = json.dumps(doc, separators=(",", ":")).encode()
        if len(out) <= limit or not doc["recent"]:
            return out
        doc["recent"] = doc["recent"][max(1, (len(out) - limit) // 24):]


def _num(v: Any, what: str, lo: float = 0.0, hi: float = MAX_COUNT) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ReportError(f"{what}: not a number ({type(v).__name__})")
    v = float(v)
    if not math.isfinite(v) or not lo <= v <= hi:
        raise ReportError(f"{what}: {v!r} out of range [{lo:g}, {hi:g}]")
    return v


def _int(v: Any, what: str, lo: int = 0, hi: int = 2 ** 62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ReportError(f"{what}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def _dict(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise ReportError(f"{what}: expected a mapping, got {type(v).__name__}")
    return v


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
    gauges = {k: _num(v, f"gauges.{k}", -MAX_COUNT) for k, v in _dict(d.get("gauges", {}), "gauges").items()
              if k in GAUGES}
    lag_in = _dict(d.get("lag", {}), "lag")
    lag = {"count": _int(lag_in.get("count", 0), "lag.count"), "sum": _num(lag_in.get("sum", 0.0), "lag.sum",
                                                                           -MAX_COUNT)}
    for k in ("min", "max"):
        lag[k] = None if lag_in.get(k) is None else _num(lag_in[k], f"lag.{k}", -MAX_COUNT)
    recent_in = d.get("recent", [])
    if not isinstance(recent_in, list) or len(recent_in) > MAX_EPISODES_PER_REPORT:
        raise ReportError(f"recent: expected a list of at most {MAX_EPISODES_PER_REPORT} episodes")
    recent = []
    for i, e in enumerate(recent_in):
        if not isinstance(e, (list, tuple)) or len(e) != 2:
            raise ReportError(f"recent[{i}]: expected [finish time, return]")
        recent.append((_num(e[0], f"recent[{i}].time", 0.0, 1e11), _num(e[1], f"recent[{i}].return", -1e12, 1e12)))
    extra_in = _dict(d.get("extra", {}), "extra")
    extra: dict[str, Any] = {}
    if extra_in.get("version") is not None:
        extra["version"] = _int(extra_in["version"], "extra.version")
    for k in ("pace_fps", "capacity_sps", "busy_s"):
        if extra_in.get(k) is not None:
            extra[k] = _num(extra_in[k], f"extra.{k}")
    if isinstance(extra_in.get("checkpoint"), str):
        extra["checkpoint"] = extra_in["checkpoint"][:4096]
    return Report(role=role, group=_int(d.get("group"), "group", 0, 1 << 20),
                  index=_int(d.get("index"), "index", 0, 1 << 20), incarnation=inc,
                  pid=_int(d.get("pid", 0), "pid", 0, 1 << 31),
                  started=_num(d.get("started", 0.0), "started", 0.0, 1e11),
                  seq=_int(d.get("seq", 0), "seq"), time=_num(d.get("time", 0.0), "time", 0.0, 1e11),
                  final=bool(d.get("final", False)), counts=counts, reasons=reasons, gauges=gauges, lag=lag,
                  episodes_total=_int(d.get("episodes_total", 0), "episodes_total"), recent=recent, extra=extra)


# ----------------------------------------------------------------- accounting
def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0.0) + float(v)


def _merge_lag(parts: list[dict]) -> dict[str, Optional[float]]:
    parts = [x for x in parts if x.get("count")]
    if not parts:
        return {"min": None, "mean": None, "max": None}
    return {"min": float(min(x["min"] for x in parts)),
            "mean": float(sum(x["sum"] for x in parts) / sum(x["count"] for x in parts)),
            "max": float(max(x["max"] for x in parts))}


@dataclass
class Proc:
    """The newest report of one live (or last seen) incarnation of a role process."""

    incarnation: str
    started: float
    seq: int
    group: int
    counts: dict[str, float]
    reasons: dict[str, dict[str, float]]
    gauges: dict[str, float]
    lag: dict[str, Any]
    episodes_total: int
    extra: dict[str, Any]
    final: bool = False
    role: str = ""


class Accounting:
    """Reports in, job numbers out. `state()` / `Accounting(state)` persist it (the operator
    keeps it in the TianJiJob status, so an operator restart loses nothing)."""

    def __init__(self, state: Optional[dict] = None):
        self.procs: dict[tuple[str, int, int], Proc] = {}  # the current incarnation of each process
        self.gone: dict[str, Proc] = {}  # incarnations replaced (their counts are in `retired`)
        self.retired: dict[tuple[str, int], dict[str, float]] = {}  # (role, group) -> counts
        self.retired_reasons: dict[str, dict[str, float]] = {}
        self.retired_lag: dict[str, Any] = {"count": 0, "sum": 0.0, "min": None, "max": None}
        self.window: list[tuple[float, float]] = []  # last WINDOW episodes (finish time, return), by time
        self.episodes_total = 0
        self.history: list[tuple[float, dict[str, float], dict[int, dict[str, float]]]] = []
        self.rejected = 0  # reports refused (counted as messages_rejected_total{reason="report"})
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
        self._count_episodes(report, report.episodes_total)
        return True

    def _proc(self, r: Report) -> "Proc":
        return Proc(r.incarnation, r.started, r.seq, r.group, dict(r.counts),
                    {k: dict(v) for k, v in r.reasons.items()}, dict(r.gauges), dict(r.lag), r.episodes_total,
                    dict(r.extra), r.final, r.role)

    def _advance(self, held: "Proc", report: Report, retired: bool) -> bool:
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
        if len(self.window) >= WINDOW and ep[0] < self.window[0][0]:
            return  # older than all of the last 100
        bisect.insort(self.window, (float(ep[0]), float(ep[1])))
        del self.window[:-WINDOW]

    def _retire(self, role: str, p: "Proc") -> None:
        """Fold an incarnation that is gone into the retired totals (and remember it)."""
        _add(self.retired.setdefault((role, p.group), {}), p.counts)
        for name, by in p.reasons.items():
            _add(self.retired_reasons.setdefault(name, {}), by)
        self.retired_lag = _merge_lag_raw(self.retired_lag, p.lag)
        self.gone[p.incarnation] = p
        if len(self.gone) > MAX_GONE:  # forget the oldest: their late reports can no longer arrive
            for inc, _ in sorted(self.gone.items(), key=lambda kv: kv[1].started)[:len(self.gone) - MAX_GONE]:
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
        return sum(r for _, r in self.window) / len(self.window) if self.window else None

    def policy_version(self) -> int:
        v = [int(p.extra.get("version", 0) or 0) for (r, _, _), p in self.procs.items() if r == "learner"]
        return max(v) if v else 0

    def lag(self) -> dict[str, Optional[float]]:
        return _merge_lag([self.retired_lag] + [p.lag for (r, _, _), p in self.procs.items() if r == "learner"])

    def processes(self) -> dict[str, dict[str, Any]]:
        """Per-process latest counters and gauges (metrics.jsonl's `processes`)."""
        out = {}
        for (role, g, i), p in sorted(self.procs.items()):
            c = p.counts
            out[f"{role}-{g}-{i}"] = {
                "frames": c.get("env_frames_total", 0.0), "sent": c.get("samples_sent_total", 0.0),
                "received": c.get("samples_received_total", 0.0), "consumed": c.get("samples_consumed_total", 0.0),
                "bytes_sent": c.get("bytes_sent_total", 0.0), "queue_depth": p.gauges.get("queue_depth", 0.0),
                "version": p.extra.get("version"), "pace_fps": p.extra.get("pace_fps"),
                "capacity_sps": p.extra.get("capacity_sps")}
        return out

    def checkpoint(self) -> Optional[str]:
        return next((p.extra["checkpoint"] for (r, _, _), p in sorted(self.procs.items())
                     if r == "learner" and p.extra.get("checkpoint")), None)

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
    def view(self, elapsed: float) -> dict[str, Any]:
        """The numbers summary.json and the TianJiJob status both show (snake_case here;
        the status is this, camelCased). `elapsed`: seconds since the job started."""
        tot = self.totals()
        w = max(elapsed, 1e-9)
        mean = self.mean_return()
        return {
            "env_frames": int(tot["env_frames"]),
            "episodes": int(self.episodes_total),
            "mean_return": None if mean is None else float(mean),
            "policy_version": self.policy_version(),
            "policy_lag": self.lag(),
            "throughput": {v: tot[k] / w for k, v in RATE_KEYS.items()},
            "rates": self.rates(),
            "bytes_sent": int(tot["bytes_sent"]),
            "dropped_samples": {k: int(v) for k, v in self.reasons("samples_dropped_total").items()},
            "rejected_messages": int(sum(self.reasons("messages_rejected_total").values())) + self.rejected,
        }

    # -------------------------------------------------------------- persistence
    def state(self) -> dict:
        """JSON-able; restores counts, episodes and lag exactly (not the rate history)."""
        return {"v": 1, "episodesTotal": self.episodes_total, "window": [list(e) for e in self.window],
                "retired": [{"role": r, "group": g, "counts": c} for (r, g), c in sorted(self.retired.items())],
                "retiredReasons": self.retired_reasons, "retiredLag": self.retired_lag, "rejected": self.rejected,
                "procs": [{"index": i, **_proc_state(p)} for (r, g, i), p in sorted(self.procs.items())],
                "gone": [_proc_state(p) for p in sorted(self.gone.values(), key=lambda p: p.started)]}

    def _load(self, s: dict) -> None:
        try:
            self.episodes_total = int(s.get("episodesTotal", 0))
            self.window = sorted((float(t), float(r)) for t, r in s.get("window", []))[-WINDOW:]
            self.retired = {(x["role"], int(x["group"])): {k: float(v) for k, v in x["counts"].items()}
                            for x in s.get("retired", [])}
            self.retired_reasons = {k: {r: float(v) for r, v in by.items()}
                                    for k, by in s.get("retiredReasons", {}).items()}
            self.retired_lag = dict(s.get("retiredLag") or self.retired_lag)
            self.rejected = int(s.get("rejected", 0))
            for p in s.get("procs", []):
                self.procs[(p["role"], int(p["group"]), int(p["index"]))] = _proc_from_state(p)
            for p in s.get("gone", []):
                self.gone[p["incarnation"]] = _proc_from_state(p)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReportError(f"accounting state unreadable: {type(e).__name__}: {e}") from None


def _proc_state(p: Proc) -> dict:
    return {"role": p.role, "group": p.group, "incarnation": p.incarnation, "started": p.started, "seq": p.seq,
            "counts": p.counts, "reasons": p.reasons, "lag": p.lag, "episodesTotal": p.episodes_total,
            "version": int(p.extra.get("version", 0) or 0), "final": p.final}


def _proc_from_state(p: dict) -> Proc:
    return Proc(p["incarnation"], float(p.get("started", 0.0)), int(p["seq"]), int(p["group"]),
                {k: float(v) for k, v in p["counts"].items()},
                {k: {r: float(v) for r, v in by.items()} for k, by in p.get("reasons", {}).items()}, {},
                dict(p.get("lag", {})), int(p.get("episodesTotal", 0)), {"version": int(p.get("version", 0))},
                bool(p.get("final")), p["role"])


def _merge_lag_raw(a: dict, b: dict) -> dict:
    if not b.get("count"):
        return dict(a)
    if not a.get("count"):
        return {k: b.get(k) for k in ("count", "sum", "min", "max")}
    return {"count": a["count"] + b["count"], "sum": a["sum"] + b["sum"],
            "min": min(a["min"], b["min"]), "max": max(a["max"], b["max"])}


# ----------------------------------------------------------------- the status view
STATUS_RATE_KEYS = {"produced_fps": "producedFps", "received_fps": "receivedFps", "consumed_sps": "consumedSps",
                    "train_steps_per_s": "trainStepsPerSecond"}


def status_numbers(view: dict) -> dict:
    """`Accounting.view()` as TianJiJob status fields: the same numbers under the Kubernetes
    API's camelCase names (summary.json env_frames = status.envFrames, and so on)."""
    out = {
        "envFrames": view["env_frames"], "episodes": view["episodes"], "policyVersion": view["policy_version"],
        "policyLag": {k: round(v, 4) for k, v in view["policy_lag"].items() if v is not None},
        "throughput": {STATUS_RATE_KEYS[k]: round(v, 3) for k, v in view["throughput"].items()},
        "rates": {STATUS_RATE_KEYS[k]: round(v, 3) for k, v in view["rates"].items()},
        "bytesSent": view["bytes_sent"], "droppedSamples": dict(view["dropped_samples"]),
        "rejectedMessages": view["rejected_messages"],
    }
    if view["mean_return"] is not None:
        out["meanReturn"] = view["mean_return"]
    return out


# ----------------------------------------------------------------- the stop rule
class StopRule:
    """spec.stop (plus a caller's own wall-clock cap), checked against the accounting.

    target  mean of the last 100 finished episodes >= stop.meanReturn (needs 100 episodes)
    frames  env frames >= stop.envFrames
    seconds elapsed >= min(stop.seconds, max_seconds)
    """

    def __init__(self, stop: Any, max_seconds: Optional[float] = None):
        self.stop = stop
        caps = [x for x in (stop.seconds, max_seconds) if x is not None]
        self.seconds = min(caps) if caps else None

    def target_reached(self, acc: Accounting) -> bool:
        mean = acc.mean_return()
        return (self.stop.mean_return is not None and len(acc.window) >= WINDOW and mean is not None
                and mean >= self.stop.mean_return)

    def check(self, acc: Accounting, elapsed: float) -> Optional[str]:
        """"target" | "frames" | "seconds", or None to go on."""
        if self.target_reached(acc):
            return "target"
        if self.stop.env_frames is not None and acc.totals()["env_frames"] >= self.stop.env_frames:
            return "frames"
        if self.seconds is not None and elapsed >= self.seconds:
            return "seconds"
        return None

    def message(self, reason: str, acc: Accounting, elapsed: float) -> str:
        if reason == "target":
            return f"mean return {acc.mean_return():.4g} >= stop.meanReturn {self.stop.mean_return:g}"
        if reason == "frames":
            return f"{int(acc.totals()['env_frames'])} env frames >= stop.envFrames {self.stop.env_frames}"
        return f"ran {elapsed:.0f} s >= {self.seconds:g} s"
