"""bench/flood.py: its hostile wrapper really floods, from inside actor-0-0 only, with the actor's own
key, and only the flooder loses samples over its share (a short live run)."""
import pytest

from bench import flood


@pytest.mark.slow
def test_the_flooding_actor_loses_only_its_own_samples(tmp_path):
    got = flood.one(tmp_path, "flood", 25, "flood")
    assert got["exit_code"] is not None and got["exit_code"] != 1, got
    over = got["dropped_over_share_by_sender"]
    assert set(over) == {"actor-0-0"} and over["actor-0-0"] > 0, got
    assert got["other_actor_sent_sps"] > 0 and got["rejected_by_reason"].get("sender", 0) == 0, got


def test_a_run_that_missed_its_target_counts_as_slower_than_any():
    assert flood.median_ratio([1.2, 1.5, 3.0]) == 1.5
    assert flood.median_ratio([1.2, None, None]) is None  # two of three missed: the median did too
    assert flood.median_ratio([1.2, 1.4, None]) == 1.4
    assert flood.median_ratio([]) is None
