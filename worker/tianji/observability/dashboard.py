"""The chart's Grafana dashboard (charts/tianji-operator/dashboards/tianji.json) asked of a real
Prometheus: every panel's every expression, substituted as Grafana would (grafana.py), over a
time range; and a check that each returns what it should for a job (`check`).

Used by `tianji dashboard` (the PNG, dashboard_render.py) and by the live dashboard test."""
from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tianji.observability import grafana

# Series a job exports only under a condition. A job fact (the algorithm, spec.evaluation) makes
# the expressions reading them show data, or show none; an event (a rejected message, a dropped
# sample) may or may not have happened.
ONLY_WHEN = {
    **{f"tianji_learner_{s}": "ppo" for s in ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl",
                                              "explained_variance", "importance_weight")},
    "tianji_learner_dqn_loss": "dqn", "tianji_learner_q_mean": "dqn",
    "tianji_eval_return_mean": "evaluation",
    "tianji_messages_rejected_total": "event", "tianji_samples_dropped_total": "event",
}
JOB_FACTS = ("ppo", "dqn", "evaluation")
MAX_SERIES = 10_000  # per query: more is a broken selector, not a dashboard


def default_path() -> Path:
    """The chart's dashboard in this source tree (an editable install or a checkout)."""
    return Path(__file__).resolve().parents[3] / "charts" / "tianji-operator" / "dashboards" / "tianji.json"


def load(path: Optional[Path] = None) -> dict:
    p = Path(path) if path else default_path()
    if not p.is_file():
        raise FileNotFoundError(f"no dashboard at {p}: pass --dashboard charts/tianji-operator/dashboards/tianji.json")
    return json.loads(p.read_text())


@dataclass
class Series:
    labels: dict[str, str]
    t: list[float]
    v: list[float]


@dataclass
class TargetResult:
    ref: str
    legend: str
    expr: str  # as sent, substituted
    series: list[Series] = field(default_factory=list)


@dataclass
class PanelResult:
    panel: dict
    targets: list[TargetResult]

    @property
    def title(self) -> str:
        return self.panel.get("title", "")


def panels(dash: dict) -> list[dict]:
    """Every panel, rows and the panels folded into rows included, in dashboard order."""
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out += p.get("panels", [])
    return out


class Prometheus:
    """The two read calls the dashboard needs, with the answers checked before use."""

    def __init__(self, url: str, timeout: float = 30.0):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url, self.timeout = url.rstrip("/"), timeout

    def _get(self, path: str, params: dict) -> object:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=self.timeout) as r:
            body = json.loads(r.read(64 << 20))
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise ValueError(f"prometheus {path} {params.get('query', '')!r}: {str(body)[:300]}")
        return body["data"]

    def label_values(self, selector: str, label: str) -> list[str]:
        """Grafana's label_values(selector, label): the values of `label` on matching series."""
        data = self._get(f"/api/v1/label/{urllib.parse.quote(label)}/values", {"match[]": selector})
        return [str(x) for x in data] if isinstance(data, list) else []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": grafana.format_duration(step)})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise ValueError(f"prometheus: {expr!r}: not a matrix")
        return [_series(r) for r in data["result"][:MAX_SERIES]]


def _series(r: object) -> Series:
    if not isinstance(r, dict) or not isinstance(r.get("metric"), dict) or not isinstance(r.get("values"), list):
        raise ValueError(f"prometheus: malformed series {str(r)[:200]}")
    labels = {str(k): str(v) for k, v in r["metric"].items()}
    t, v = [], []
    for point in r["values"]:
        if not (isinstance(point, list) and len(point) == 2):
            raise ValueError(f"prometheus: malformed point {point!r}")
        try:
            t.append(float(point[0]))
            v.append(float(point[1]))  # "NaN", "+Inf" parse; anything else raises
        except (TypeError, ValueError):
            raise ValueError(f"prometheus: malformed point {point!r}") from None
    return Series(labels, t, v)


def query(prom: Prometheus, dash: dict, chosen: Mapping[str, grafana.Value], range_s: float, scrape_s: float,
          end: Optional[float] = None) -> list[PanelResult]:
    """Every non-row panel's targets, substituted and asked over [end - range_s, end]."""
    end = time.time() if end is None else end
    values = grafana.variable_values(dash.get("templating", {}).get("list", []), chosen)
    out = []
    for p in panels(dash):
        if p.get("type") == "row":
            continue
        step = grafana.interval(range_s, grafana.max_points(p["gridPos"]["w"]), scrape_s)
        rate = grafana.rate_interval(step, scrape_s)
        results = []
        for t in p.get("targets", []):
            expr = grafana.substitute(t["expr"], values, step, rate, range_s)
            results.append(TargetResult(t.get("refId", ""), t.get("legendFormat", ""), expr,
                                        prom.query_range(expr, end - range_s, end, step)))
        out.append(PanelResult(p, results))
    return out


def variable_options(prom: Prometheus, dash: dict, chosen: Mapping[str, grafana.Value]) -> dict[str, list[str]]:
    """What each label_values() variable offers once the variables before it are chosen."""
    values = grafana.variable_values(dash.get("templating", {}).get("list", []), chosen)
    out = {}
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
        if not m:
            raise ValueError(f"variable {v['name']}: not label_values(selector, label): {q}")
        out[v["name"]] = prom.label_values(grafana.substitute(m.group(1), values, 1, 4, 60), m.group(2))
    return out


def conditions(expr: str) -> set[str]:
    return {cond for metric, cond in ONLY_WHEN.items() if metric in expr}


def check(results: Iterable[PanelResult], facts: Iterable[str]) -> list[str]:
    """Problems, one line each naming the panel: an expression that selects nothing though the
    job exports its series, one that shows what the job cannot export (a DQN loss on a PPO job),
    a series without one finite value, a panel with no data at all."""
    facts = set(facts)
    problems = []
    for pr in results:
        shown = 0
        for t in pr.targets:
            conds = conditions(t.expr)
            must_show = not conds or conds <= facts
            cannot_show = bool(conds & (set(JOB_FACTS) - facts))
            where = f"panel {pr.title!r} {t.ref} ({t.legend})"
            if t.series:
                shown += 1
            if cannot_show and t.series:
                problems.append(f"{where}: shows data the job cannot export ({sorted(conds - facts)}): {t.expr}")
            elif must_show and not cannot_show and not t.series:
                problems.append(f"{where}: selects nothing: {t.expr}")
            for s in t.series:
                if not any(math.isfinite(x) for x in s.v):
                    problems.append(f"{where}: series {s.labels} has no finite value: {t.expr}")
        expected_empty = all(conditions(t.expr) & (set(JOB_FACTS) - facts) for t in pr.targets)
        if not shown and not expected_empty and not any(p.startswith(f"panel {pr.title!r}") for p in problems):
            problems.append(f"panel {pr.title!r}: no data")
    return problems


def last_values(tr: TargetResult) -> list[float]:
    """The newest finite value of each series of a target."""
    return [next((x for x in reversed(s.v) if math.isfinite(x)), math.nan) for s in tr.series]


def find(results: Iterable[PanelResult], title: str) -> PanelResult:
    for pr in results:
        if pr.title == title:
            return pr
    raise KeyError(f"no panel {title!r}")
