"""The dashboard asked of a Prometheus as Grafana would (tianji.observability.grafana,
.dashboard), the checker that names a panel selecting nothing, and `tianji dashboard`'s PNG,
against a tiny fake HTTP Prometheus (tests/fake_prometheus.py). The live proof on a real
Prometheus and a real job: tests/cluster/test_real_dashboard.py."""
from __future__ import annotations

import copy
import json

import pytest

from fake_prometheus import FakePrometheus
from tianji.observability import dashboard as dboard
from tianji.observability import grafana
from tianji.observability import metrics as tianji_metrics

JOB, NS = "cartpole-ppo", "team-a"
ROLES = ("actor", "buffer", "learner")
CHOSEN = {"namespace": NS, "job": JOB, "group": "All"}


def live_series(extra: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """What a healthy PPO job exports: every worker series but DQN's, the evaluator's and the
    event counters (nothing rejected or dropped), and the operator's per-job gauges."""
    skip = {m for m, cond in dboard.ONLY_WHEN.items() if cond != "ppo"} - set(extra)
    out = []
    for name in sorted(tianji_metrics.metric_names()):
        if not any(name.startswith(s) for s in skip):
            out += [(name, {"namespace": NS, "job": JOB, "group": "0", "role": r}) for r in ROLES]
    for name in ("tianji_job_actors_desired", "tianji_job_actors_ready"):
        out.append((name, {"namespace": NS, "job": JOB, "group": "0"}))
    for name in ("tianji_job_container_restarts", "tianji_job_pods_recreated"):
        out += [(name, {"namespace": NS, "job": JOB, "role": r}) for r in ROLES]
    return out


@pytest.fixture
def prom():
    fake = FakePrometheus(live_series())
    yield fake
    fake.close()


def run(fake: FakePrometheus, dash: dict, facts=("ppo",)) -> list[str]:
    results = dboard.query(dboard.Prometheus(fake.url), dash, CHOSEN, range_s=600, scrape_s=15, end=1_000_000.0)
    return dboard.check(results, facts)


def test_grafana_substitution():
    assert grafana.parse_duration("1m30s") == 90 and grafana.parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        grafana.parse_duration("10 minutes")
    # 10 min over a 640-pixel panel: 0.94 s rounds to 1 s, below the 15 s scrape interval
    step = grafana.interval(600, grafana.max_points(8), 15)
    assert step == 15 and grafana.rate_interval(step, 15) == 60
    assert grafana.interval(6 * 3600, 640, 15) == 30  # 33.75 s rounds to 30 s
    assert grafana.rate_interval(30, 15) == 60 and grafana.rate_interval(120, 15) == 135
    assert [grafana.format_duration(x) for x in (60, 135, 4, 0.5)] == ["1m", "135s", "4s", "500ms"]
    dash = dboard.load()
    values = grafana.variable_values(dash["templating"]["list"], {"namespace": NS, "job": JOB, "group": ["0", "1"]})
    assert values == {"namespace": NS, "job": JOB, "group": "(0|1)"}
    assert grafana.variable_values(dash["templating"]["list"], CHOSEN)["group"] == ".*"  # the variable's allValue
    got = grafana.substitute('rate(x{job="$job", group=~"${group}"}[$__rate_interval])', values, 15, 60, 600)
    assert got == 'rate(x{job="cartpole-ppo", group=~"(0|1)"}[1m])'
    with pytest.raises(ValueError, match="job"):
        grafana.variable_values(dash["templating"]["list"], {"namespace": NS})  # job has no All
    with pytest.raises(ValueError, match=r"\$nope"):
        grafana.substitute("x{a=\"$nope\"}", values, 15, 60, 600)


def test_a_healthy_job_passes_the_check_and_every_query_is_substituted(prom):
    assert run(prom, dboard.load()) == []
    assert prom.asked and all("$" not in q["query"] for q in prom.asked)
    assert {q["step"] for q in prom.asked} == {"15s"} and all("[1m]" in q["query"] for q in prom.asked
                                                              if "rate(" in q["query"])


@pytest.mark.parametrize("title, old, new", [
    ("Frames/s", 'role=\\"actor\\"', 'role=\\"actors\\"'),
    ("Actors desired vs ready by group", 'tianji_job_actors_ready{namespace=~\\"$namespace\\", job=\\"$job\\"',
     'tianji_job_actors_ready{namespace=~\\"$namespace\\", job=\\"$job-actor\\"'),
])
def test_a_broken_label_value_is_reported_by_its_panel(prom, title, old, new):
    dash = dboard.load()
    (panel,) = [p for p in dboard.panels(dash) if p["title"] == title]
    text = json.dumps(panel)
    assert old in text
    broken = copy.deepcopy(dash)
    broken["panels"] = [json.loads(text.replace(old, new)) if p is panel else p for p in dash["panels"]]
    problems = run(prom, broken)
    assert problems and all(p.startswith(f"panel {title!r}") for p in problems), problems
    assert "selects nothing" in problems[0]


def test_series_the_job_cannot_export_are_reported():
    fake = FakePrometheus(live_series(extra=("tianji_learner_dqn_loss",)))  # a PPO job showing a DQN loss
    try:
        problems = run(fake, dboard.load())
    finally:
        fake.close()
    assert len(problems) == 1 and problems[0].startswith("panel 'Losses by group'") and "cannot export" in problems[0]


def test_a_dqn_job_must_show_the_dqn_panels(prom):
    problems = run(prom, dboard.load(), facts=("dqn",))
    assert any(p.startswith("panel 'DQN mean Q'") and "selects nothing" in p for p in problems), problems
    assert any("cannot export" in p and "ppo" in p for p in problems), problems  # PPO stats on a DQN job


def test_variables_offer_what_prometheus_has(prom):
    opts = dboard.variable_options(dboard.Prometheus(prom.url), dboard.load(), CHOSEN)
    assert opts == {"namespace": [NS], "job": [JOB], "group": ["0"]}


def test_tianji_dashboard_renders_the_panels_on_their_grid(prom, tmp_path, capsys):
    from matplotlib.image import imread

    from tianji.cli import main
    from tianji.observability.dashboard_render import PX_PER_COL, PX_PER_ROW, human, legend

    out = tmp_path / "dash.png"
    assert main(["dashboard", "--prometheus", prom.url, "--job", JOB, "--namespace", NS, "--png", str(out),
                 "--range", "10m"]) == 0
    said = capsys.readouterr().out
    assert said.strip() == f"wrote {out}: 26 panels; no data in 1: DQN mean Q", said  # 31 less 5 rows
    dash = dboard.load()
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dboard.panels(dash)) + 2
    assert imread(out).shape[:2] == (rows * PX_PER_ROW, 24 * PX_PER_COL)
    # Every panel asked once per target, over the 10 minutes asked for, at Grafana's step.
    targets = sum(len(p.get("targets", [])) for p in dboard.panels(dash))
    assert len(prom.asked) == targets
    assert all(float(q["end"]) - float(q["start"]) == pytest.approx(600, abs=1) for q in prom.asked)
    assert legend("{{role}} group {{group}}", dboard.Series({"role": "learner", "group": "0"}, [], [])) == \
        "learner group 0"
    assert human(2.5 * 1024 * 1024, "Bps") == "2.5 MB/s" and human(1500, "short") == "1.5 K"


def test_tianji_dashboard_says_what_is_wrong(tmp_path, capsys):
    from tianji.cli import main

    png = str(tmp_path / "x.png")
    assert main(["dashboard", "--prometheus", "http://127.0.0.1:9", "--job", JOB, "--png", png]) == 1
    assert "tianji dashboard:" in capsys.readouterr().err
    assert main(["dashboard", "--prometheus", "http://127.0.0.1:9", "--job", JOB, "--png", png,
                 "--range", "ten"]) == 1
    assert "not a duration" in capsys.readouterr().err
    assert main(["dashboard", "--prometheus", "file:///etc/passwd", "--job", JOB, "--png", png]) == 1
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("bad", [{"metric": {}, "values": [[1, ["x"]]]}, {"metric": {}, "values": [[1]]},
                                 {"metric": [], "values": []}, "series"])
def test_malformed_answers_are_refused(bad):
    with pytest.raises(ValueError, match="malformed"):
        dboard._series(bad)
