"""The Grafana dashboard (dashboards/tianji.json in the chart): a valid dashboard whose every
PromQL expression reads a metric TianJi exports, with labels it has: the workers'
(`tianji.observability.metrics`) or the operator's per-job gauges (tianji_job_*, which stand in
for kube-state-metrics: tianji_operator.metrics). Whether each expression selects data on a live
job: tests/cluster/test_real_dashboard.py."""
from __future__ import annotations

import json
import re

from chart_support import DASHBOARD
from tianji.observability import metrics as tianji_metrics
from tianji_operator.metrics import JOB_LABELS, OperatorMetrics


def operator_job_metrics() -> dict[str, set[str]]:
    """The operator's per-job gauges: name -> label names."""
    m = OperatorMetrics()
    m.job_status("ns", "j", {"groups": [{"group": 0, "actors": {"desired": 1, "ready": 1}}],
                             "restartsByRole": {"actor": {"containers": 0, "pods": 0}}})
    out: dict[str, set[str]] = {}
    for fam in m.registry.collect():
        for smp in fam.samples:
            if smp.name.startswith("tianji_job_"):
                out.setdefault(smp.name, set()).update(smp.labels)
    return out


OPERATOR_METRICS = operator_job_metrics()
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}
RANGE_FUNCS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes"}
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
TIANJI_LABELS = set(tianji_metrics.LABELS) | {"reason", "le", "namespace", "pod", "instance"}


def _blank_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in a PromQL expression."""
    s = _blank_strings(expr)
    s = re.sub(r"\[[^\]]*\]", "", s)  # range/subquery durations (may hold $__rate_interval)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*(\([^)]*\))?", " ", s)
    out = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", s):
        name, matchers = m.group(1), m.group(2)
        if s[m.end():].lstrip().startswith("(") and not matchers:
            continue  # a function or an aggregation
        if name.lower() in PROMQL_WORDS or s[max(0, m.start() - 1)] == "$":
            continue
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        out.append((name, labels))
    return out


def test_promql_selector_parser():
    got = promql_selectors('histogram_quantile(0.9, sum by (le) (rate(tianji_policy_lag_bucket{job="$job", '
                           'group=~"a|b"}[$__rate_interval]))) / on (group) group_left max(kube_x) and up')
    assert got == [("tianji_policy_lag_bucket", {"job", "group"}), ("kube_x", set()), ("up", set())]


def _dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and variable query."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)\s*", q)
            assert m, f"variable {v['name']}: expected label_values(<selector>, <label>), got {q}"
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def test_dashboard_json_is_a_grafana_dashboard_with_variables():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "job", "group"} <= set(variables)
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert variables["job"]["type"] == "query" and variables["group"]["type"] == "query"
    assert variables["group"]["multi"] and variables["group"]["includeAll"] and variables["group"]["allValue"] == ".*"
    ids, grid = set(), []
    for p in dash["panels"]:
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        grid.append(g)
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
            assert '$job' in t["expr"], f"panel {p['title']!r} does not filter by the job variable"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_metric_is_exported():
    dash = json.loads(DASHBOARD.read_text())
    exported = tianji_metrics.metric_names()
    used: set[str] = set()
    problems = []
    for where, expr in _dashboard_exprs(dash):
        bare = _blank_strings(expr)
        for o, c in ("()", "{}", "[]"):
            depth = 0
            for ch in bare:
                depth += (ch == o) - (ch == c)
                assert depth >= 0, f"{where}: unbalanced {o}{c} in {expr}"
            assert depth == 0, f"{where}: unbalanced {o}{c} in {expr}"
        sels = promql_selectors(expr)
        assert sels, f"{where}: no metric in {expr}"
        for name, labels in sels:
            used.add(name)
            if name in OPERATOR_METRICS:
                if labels - OPERATOR_METRICS[name]:
                    problems.append(f"{where}: {name} has no label(s) {sorted(labels - OPERATOR_METRICS[name])}")
            elif name.startswith(tianji_metrics.PREFIX):
                if name not in exported:
                    problems.append(f"{where}: {name} is not exported by tianji.observability.metrics")
                if labels - TIANJI_LABELS:
                    problems.append(f"{where}: {name} has no label(s) {sorted(labels - TIANJI_LABELS)}")
                base = name.removeprefix(tianji_metrics.PREFIX)
                if "reason" in labels and base not in tianji_metrics.REASON_LABELED:
                    problems.append(f"{where}: {name} has no reason label")
            else:
                problems.append(f"{where}: {name} is not a TianJi metric (the dashboard needs no other exporter)")
        for fn, metric in re.findall(r"\b(\w+)\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*\{", _blank_strings(expr)):
            if fn in RANGE_FUNCS and not metric.endswith(COUNTER_SUFFIXES):
                problems.append(f"{where}: {fn}() over {metric}, which is not a counter")
    assert not problems, "\n".join(problems)
    # What the dashboard promises to show.
    p = tianji_metrics.PREFIX
    must = {p + "env_frames_total", p + "samples_received_total", p + "samples_consumed_total",
            p + "policy_lag_bucket", p + "policy_version", p + "replay_ratio", p + "episode_return_mean",
            p + "messages_rejected_total", p + "samples_dropped_total"} | set(OPERATOR_METRICS)
    assert must <= used, sorted(must - used)


def test_operator_job_gauges_carry_the_labels_the_dashboard_filters_on():
    assert set(OPERATOR_METRICS) == {"tianji_job_actors_desired", "tianji_job_actors_ready",
                                     "tianji_job_container_restarts", "tianji_job_pods_recreated"}
    for name, labels in OPERATOR_METRICS.items():
        assert set(JOB_LABELS) <= labels, name  # namespace/job: the TianJiJob's, like the workers' series
