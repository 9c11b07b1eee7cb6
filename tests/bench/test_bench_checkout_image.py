"""bench/checkout_image.py's reading of the kubelet's Pulled events, and its recorded result."""
from __future__ import annotations

import json
from pathlib import Path

from bench.checkout_image import pulled

ROOT = Path(__file__).resolve().parents[2]


def test_pulled_events_give_seconds_and_bytes():
    said = ['Successfully pulled image "10.214.0.1:5000/tianji/worker-checkout:4e5c" in 30.874s '
            '(30.874s including waiting). Image size: 5146901729 bytes.',
            'Successfully pulled image "r/x:1" in 812ms (812ms including waiting). Image size: 12 bytes.',
            'Container image "r/x:1" already present on machine']
    assert pulled(said) == [{"seconds": 30.874, "bytes": 5146901729}, {"seconds": 0.812, "bytes": 12}]


def test_the_recorded_result_has_one_pull_per_real_node():
    recorded = json.loads((ROOT / "docs" / "results" / "checkout-image.json").read_text())
    assert len(recorded["pulls"]) == 2 and all(p["bytes"] > 10 ** 9 for p in recorded["pulls"])
    assert recorded["push_again_s"] < recorded["push_fresh_registry_s"]
