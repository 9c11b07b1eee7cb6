"""bench/cpulimits.py: a run under each TIANJI_CPU_LIMITS records the bound it ran under."""
import pytest

from bench import cpulimits
from bench.harness import ROOT
from tianji.local import cpulimits as limits


@pytest.mark.slow
def test_a_clean_run_records_its_cpu_bound(tmp_path):
    got = cpulimits.one(ROOT / "examples" / "cartpole-ppo.yaml", "quota", 15, tmp_path / "run")
    assert got["exit_code"] is not None and got["consumed_sps"] > 0, got
    can, why = limits.decide("probe", {"TIANJI_CPU_LIMITS": "quota"})
    if can is None:  # not root, or no writable cpu controller: the summary says why
        assert got["cpu_limits"] == {"off": why}, got
    else:
        assert got["cpu_limits"]["mode"] == "quota" and set(got["cpu_limits"]["cores"]) == {
            "actor-0-0", "actor-0-1", "buffer-0-0", "learner-0-0"}, got
        assert got["cpu_limits"]["cores"]["buffer-0-0"] == 0.25, got
