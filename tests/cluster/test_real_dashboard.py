"""The chart's Grafana dashboard on live data: during a CartPole job on the local cluster's real
nodes, a real Prometheus scrapes the job's pods as the chart's PodMonitor selects them (through
their enforced NetworkPolicy, which the chart's `metricsScrapers` open to it) and the operator as
its ServiceMonitor does (cluster_prometheus.py); every panel's every expression, substituted as
Grafana would (tianji.observability.grafana), selects what it should, with plausible values.
TIANJI_DASHBOARD_PNG=path also renders the dashboard of this run there (docs/images/dashboard.png)."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from cluster_jobs import JOB, diagnostics, on_real_nodes, status
from clusterkit import wait_for
from tianji.cli import main
from tianji.observability import dashboard as dboard
from tianji.observability.grafana import parse_duration

# Train on while the panels are read: no stop by return or frames, the job's own time cap only.
SPEC = {"stop": {"meanReturn": None, "envFrames": None, "seconds": 420}}
TRAIN_S = 150  # of training in the range read: rate windows and curves with a shape


def newest(prometheus, expr: str) -> float:
    res = prometheus.query(expr)
    return float(res[0]["value"][1]) if res else math.nan


def panel_last(results, title: str) -> float:
    (t, *_) = dboard.find(results, title).targets
    vals = dboard.last_values(t)
    return sum(vals) if vals else math.nan


def finite(series) -> list[float]:
    return [x for s in series for x in s.v if math.isfinite(x)]


@pytest.mark.timeout(900)
def test_every_dashboard_panel_shows_the_live_job(real, real_operator, prometheus, ns, tmp_path, capsys):
    t0 = time.time()
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, SPEC))
    sel = f'job="{JOB}", namespace="{ns}"'
    first = wait_for(lambda: (r := newest(prometheus, f'avg(tianji_episode_return_mean{{{sel}, role="actor"}} and '
                                                      f'tianji_episodes_total{{{sel}, role="actor"}} > 0)')) > 0 and r,
                     240, "a first mean return", interval=2.0, on_timeout=lambda: diagnostics(real, ns))
    # Learning shows: the actors' mean return at least doubles (PPO on CartPole starts near 20).
    wait_for(lambda: newest(prometheus, f'avg(tianji_episode_return_mean{{{sel}, role="actor"}})') >= 2 * first,
             300, f"the mean return to double from {first:.1f}", interval=3.0,
             on_timeout=lambda: diagnostics(real, ns))
    wait_for(lambda: newest(prometheus, f'sum(tianji_job_actors_ready{{{sel}}})') == 2, 60,
             "the operator's actors-ready gauge scraped", on_timeout=lambda: diagnostics(real, ns))
    time.sleep(max(0.0, t0 + TRAIN_S - time.time()))
    assert status(real, ns)["phase"] == "Running"

    dash = dboard.load()
    prom = dboard.Prometheus(prometheus.url)
    chosen = {"namespace": ns, "job": JOB, "group": "All"}
    options = dboard.variable_options(prom, dash, chosen)  # the pickers offer this job, as Grafana lists them
    assert ns in options["namespace"] and JOB in options["job"] and options["group"] == ["0"], options
    end = time.time()
    range_s = end - t0
    results = dboard.query(prom, dash, chosen, range_s=range_s, scrape_s=parse_duration(prometheus.interval), end=end)
    st = status(real, ns)
    problems = dboard.check(results, facts={"ppo"})
    assert not problems, "\n".join(problems)
    assert len(results) == len([p for p in dboard.panels(dash) if p["type"] != "row"])

    # Plausible values, and one meaning with the job's status (kubectl get tjj).
    assert panel_last(results, "Frames/s") > 0 and panel_last(results, "Samples consumed/s") > 0
    assert panel_last(results, "Policy version") >= 1
    ready, desired = panel_last(results, "Actors ready"), panel_last(results, "Actors desired")
    assert ready == desired == 2 and st["actors"] == f"{ready:.0f}/{desired:.0f}", (ready, desired, st["actors"])
    returns = finite(dboard.find(results, "Mean return by group").targets[0].series)
    assert returns and returns[-1] > returns[0] > 0, returns  # rising over the run
    restarts = dboard.find(results, "Container restarts and pods re-created").targets[0]
    assert {s.labels["role"]: s.v[-1] for s in restarts.series} == \
        {r: float(c["containers"]) for r, c in st["restartsByRole"].items()}
    for title in ("Produced: env frames/s by group", "Consumed: samples/s by group"):
        assert max(finite(dboard.find(results, title).targets[0].series)) > 0, title
    lag = finite(dboard.find(results, "Policy lag (versions)").targets[0].series)
    assert lag and all(0 <= x <= 16 for x in lag), lag  # maxPolicyLag 3: the p50 of batch means
    for t in dboard.find(results, "Rejected messages/s by role and reason").targets[1:]:
        assert finite(t.series) and max(finite(t.series)) == 0, t.expr  # nothing rejected, shown as 0

    # `tianji dashboard` draws the same run (TIANJI_DASHBOARD_PNG: keep the picture, for docs/).
    png = Path(os.environ.get("TIANJI_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    rc = main(["dashboard", "--prometheus", prometheus.url, "--job", JOB, "--namespace", ns, "--png", str(png),
               "--range", f"{math.ceil(time.time() - t0)}s", "--scrape-interval", prometheus.interval])
    assert rc == 0 and png.stat().st_size > 50_000
    assert capsys.readouterr().out.strip().endswith("no data in 1: DQN mean Q")  # a PPO job has no DQN Q
