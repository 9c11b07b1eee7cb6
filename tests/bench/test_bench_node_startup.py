"""bench/node_startup.py's arithmetic on recorded runs."""
from __future__ import annotations

import json
from pathlib import Path

from bench.node_startup import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_each_round_pairs_its_own_real_and_process_pods():
    def run(r: int, kind: str, s: float) -> dict:
        return {"round": r, "kind": kind, "seconds_to_ready": s}
    runs = [run(0, "process", 2.0), run(0, "real", 1.0), run(1, "real", 3.0), run(1, "process", 1.0),
            run(2, "real", 9.0)]  # a round with one side only pairs nothing
    out = summarize(runs)
    assert out["real_over_process"] == {"per_round": [0.5, 3.0], "median": 1.75}
    assert out["results"]["real"] == {"median_s": 3.0, "min_s": 1.0, "max_s": 9.0, "pods": 3}


def test_the_recorded_result_is_its_runs_summarized():
    recorded = json.loads((ROOT / "docs" / "results" / "node-startup.json").read_text())
    again = summarize(recorded["runs"])
    assert again["results"] == recorded["results"] and again["real_over_process"] == recorded["real_over_process"]
