"""The opt-in data-path trace (runtime/trace.py) and its analysis (bench/pipeline_trace.py)."""
from __future__ import annotations

import json

import pytest

from bench.pipeline_trace import analyse
from tianji.runtime.trace import ENV_TRACE, Trace


def test_the_trace_is_off_unless_a_directory_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_TRACE, raising=False)
    off = Trace("actor-0-0")
    off("fragment", v=1)  # costs nothing, writes nothing
    assert not off.on
    monkeypatch.setenv(ENV_TRACE, str(tmp_path / "t"))
    on = Trace("actor-0-0")
    on("fragment", t0=1.0, v=3, held=4)
    on.close()
    (line,) = (tmp_path / "t" / "actor-0-0.jsonl").read_text().splitlines()
    event = json.loads(line)
    assert event["ev"] == "fragment" and event["v"] == 3 and event["held"] == 4 and event["t"] > 0


def _write(tmp_path, sender: str, events: list[dict]) -> None:
    with open(tmp_path / f"{sender}.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_the_analysis_splits_the_learners_gaps_into_starved_and_host_time(tmp_path):
    """A learner that updates for 0.1 s, then waits 0.3 s for a batch and spends 0.05 s before the
    next update; its actors see each publish 0.02 s late and act with it 0.01 s after that."""
    learner, actor, buffer = [], [], []
    t = 10.0
    for v in range(20):
        learner.append({"t": t + 0.1, "ev": "update", "dt": 0.1, "v": v, "lag": 1.0})
        learner.append({"t": t + 0.1, "ev": "publish", "v": v + 1})
        actor.append({"t": t + 0.12, "ev": "params", "v": v + 1})
        actor.append({"t": t + 0.40, "ev": "fragment", "t0": t + 0.13, "v": v + 1, "held": v + 1, "n": 512})
        buffer.append({"t": t + 0.38, "ev": "batch_out", "vmin": v, "vmax": v, "n": 1024})
        learner.append({"t": t + 0.40, "ev": "batch_in", "vmin": v, "vmax": v, "pending": 1})
        t += 0.45  # update 0.1 + starved 0.3 + host 0.05
    _write(tmp_path, "learner-0-0", learner)
    _write(tmp_path, "actor-0-0", actor)
    _write(tmp_path, "buffer-0-0", buffer)
    out = analyse(tmp_path, skip=0.0)
    lr = out["learner"]
    assert lr["update_s"] == pytest.approx(0.1) and lr["lag_mean"] == pytest.approx(1.0)
    assert lr["starved_s"] == pytest.approx(0.3, abs=1e-6) and lr["host_s"] == pytest.approx(0.05, abs=1e-6)
    assert lr["busy_fraction"] == pytest.approx(0.1 / 0.45, abs=0.01)
    a = out["actors"]
    assert a["publish_to_actor_s"]["median"] == pytest.approx(0.02, abs=1e-6)
    assert a["arrival_to_acting_s"]["median"] == pytest.approx(0.01, abs=1e-6)
    assert a["fragment_s"]["median"] == pytest.approx(0.27, abs=1e-6) and a["acting_behind_held"] == 0
    assert a["fragment_frames"] == 512
    assert out["buffer_to_learner_s"]["median"] == pytest.approx(0.02, abs=1e-6)


def test_the_analysis_says_when_there_is_nothing_to_analyse(tmp_path):
    assert "no learner trace" in analyse(tmp_path)["error"]
    _write(tmp_path, "learner-0-0", [{"t": 1.0, "ev": "publish", "v": 0}])
    assert "never updated" in analyse(tmp_path)["error"]
