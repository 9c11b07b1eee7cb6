"""`tianji run --metrics-port`: every role's series on one local endpoint, named and labelled as a
pod's own /metrics, and counting what the run's accounting counts."""
from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import EXAMPLES, free_port, wait_for

PPO = str(EXAMPLES / "cartpole-ppo.yaml")


def _scrape(port: int) -> dict[tuple[str, str, str], float]:
    """(sample name, role, index) -> value, for group 0."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("job") == "cartpole-ppo" and s.labels.get("group") == "0" and "reason" not in s.labels:
                out[(s.name, s.labels["role"], s.labels["index"])] = s.value
    return out


def test_local_run_serves_every_roles_metrics(running_tianji):
    port = free_port()
    run = running_tianji(PPO, "--metrics-port", str(port), "--set", "spec.stop.meanReturn=100000",
                         "--set", "spec.stop.seconds=60")
    run.wait_for_frames(5000)
    got = wait_for(lambda: (lambda m: m if m.get(("tianji_samples_consumed_total", "learner", "0")) else None)(
        _scrape(port)), 60, "the learner's consumed samples on /metrics")
    # Every role process is there, with its own labels, as on a cluster.
    assert {("tianji_env_frames_total", "actor", i) in got for i in ("0", "1")} == {True}
    assert ("tianji_samples_received_total", "buffer", "0") in got and ("tianji_policy_version", "learner", "0") in got
    assert run.interrupt() == 130
    # summary.json is the accounting's count, which the endpoint served; the port closes with the run.
    state = json.loads((run.run_dir / "accounting.json").read_text())
    frames = sum(p["counts"].get("env_frames_total", 0) for p in state["procs"])
    assert run.summary()["env_frames"] == frames > 5000
    with pytest.raises(OSError):
        _scrape(port)
