"""The replay buffer's sample-to-insert limiter (control/contracts/ratelimit.py), driven without sockets."""
from __future__ import annotations

import random

import pytest

from tianji.control.contracts.ratelimit import SampleToInsertRatio


def test_no_sample_before_min_size_and_every_insert_taken():
    lim = SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=200, sample_size=64, insert_size=10)
    for _ in range(9):
        assert lim.insert(10)
        assert not lim.can_sample(64)
    assert lim.insert(10) and lim.sampling
    assert lim.sample(64)


def test_learner_stall_banks_a_bounded_allowance():
    """Actors keep inserting while the learner is away: the inserts beyond the error buffer are
    refused, so the learner cannot come back to a burst of updates on old data."""
    lim = SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=1536, sample_size=1024, insert_size=64)
    lim.insert(100)
    refused = sum(not lim.insert(64) for _ in range(1000))
    assert refused > 990
    burst = 0
    while lim.sample(1024):
        burst += 1
    # diff starts within the error buffer of the offset and may fall to offset - error_buffer
    assert burst * 1024 <= 2 * 1536 + 64 * 8


def test_realised_ratio_stays_in_band_whoever_is_faster():
    for insert_weight in (0.1, 0.5, 0.9):  # learner-bound, balanced, actor-bound
        rnd = random.Random(1)
        lim = SampleToInsertRatio.for_replay(8.0, learning_starts=1000, batch=1024, fragment=64)
        for _ in range(200_000):
            if rnd.random() < insert_weight:
                lim.insert(rnd.randint(1, 64))
            else:
                lim.sample(1024)
        after = lim.inserts - lim.min_size_to_sample
        assert after > 0
        band = lim.error_buffer / after
        assert abs(lim.realised_ratio() - 8.0) <= band + 1e-9, (insert_weight, lim.realised_ratio())
        assert lim.lo <= lim.diff <= lim.hi


def test_settings_that_could_deadlock_are_refused():
    with pytest.raises(ValueError, match="neither a sample nor an insert"):
        SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=100, sample_size=1024, insert_size=64)
    # the smallest error buffer that cannot deadlock: (1024 + 64 * 8) / 2
    SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=768, sample_size=1024, insert_size=64)
    for bad in ({"samples_per_insert": 0.0}, {"min_size_to_sample": 0}, {"sample_size": 0}):
        kw = dict(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=10, sample_size=1, insert_size=1)
        kw.update(bad)
        with pytest.raises(ValueError):
            SampleToInsertRatio(**kw)


def test_smallest_allowed_error_buffer_never_gets_stuck():
    """At the deadlock-free minimum, from any reachable state, a sample or a full insert fits."""
    lim = SampleToInsertRatio(8.0, min_size_to_sample=100, error_buffer=768, sample_size=1024, insert_size=64)
    rnd = random.Random(3)
    lim.insert(100)
    for _ in range(50_000):
        assert lim.can_sample(1024) or lim.can_insert(64)
        if not lim.sample(1024):
            lim.insert(rnd.randint(1, 64))


def test_spec_refuses_a_deadlocking_error_buffer():
    from tianji.control.spec import SpecError, parse_job

    doc = {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
           "spec": {"algorithm": {"name": "dqn", "batchSize": 64, "stepsPerBatch": 16},
                    "staleness": {"replayRatio": 8, "replayErrorBuffer": 100}}}
    with pytest.raises(SpecError, match="replayErrorBuffer"):
        parse_job(doc)
    doc["spec"]["staleness"]["replayErrorBuffer"] = 4096
    job = parse_job(doc)
    assert job.spec.replay_limiter().error_buffer == 4096
    doc["spec"]["algorithm"] = {"name": "ppo"}
    with pytest.raises(SpecError, match="off-policy"):
        parse_job(doc)
