"""`tianji plot`: a short run's curves show their points; episode length has its own panel (issue 25)."""
from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt


def _records(n: int, returns, lengths) -> list[dict]:
    return [{"t": float(i), "env_frames": 100 * i, "produced_fps": 1.0, "received_fps": 1.0, "consumed_sps": 1.0,
             "mean_return": returns(i), "mean_episode_length": lengths(i)} for i in range(n)]


def _plot(tmp_path, monkeypatch, recs):
    from tianji.observability.plot import plot_run

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    plot_run(tmp_path, tmp_path / "p.png")
    return figs[0]


def test_a_short_run_draws_a_marker_on_each_point(tmp_path, monkeypatch):
    """Three records, the mean return known only in the last: a line alone would draw nothing."""
    fig = _plot(tmp_path, monkeypatch, _records(3, lambda i: 1.0 if i == 2 else None, lambda i: 5.0 + i))
    for ax in fig.axes[:3]:  # return vs time, return vs frames, episode length vs frames
        (line,) = ax.get_lines()
        assert line.get_marker() == "o"
    length = fig.axes[2]
    assert "episode length" in length.get_title() and list(length.get_lines()[0].get_ydata()) == [5.0, 6.0, 7.0]


def test_a_long_run_marks_only_points_a_line_cannot_show(tmp_path, monkeypatch):
    recs = _records(200, lambda i: 7.0 if i == 50 else (float(i) if i > 100 else None), lambda i: None)
    fig = _plot(tmp_path, monkeypatch, recs)
    line, alone = fig.axes[0].get_lines()
    assert line.get_marker() in ("None", "", None)  # 99 points after the lone one: a plain line
    assert list(alone.get_xdata()) == [50.0] and list(alone.get_ydata()) == [7.0] and alone.get_marker() == "o"
    assert all(math.isnan(y) for y in fig.axes[2].get_lines()[0].get_ydata())  # no lengths reported: none drawn
