"""Fair share per sender at a buffer (runtime/fairshare.py): a flooding sender drops only its own data."""
import random

import numpy as np
import pytest

from tianji.runtime.fairshare import ACTIVE_S, WINDOW, AdmissionShare, SenderQueues, share_limit


def frag(tag: float, version: int = 0) -> dict:
    return {"obs": np.full((2, 3, 1), tag, np.float32), "last_obs": np.full((3, 1), tag, np.float32),
            "valid": np.ones((2, 3), bool), "version": version}


def test_a_sender_over_its_share_pushes_out_its_own_oldest_and_batches_take_turns():
    q = SenderQueues(max_fragments=8)
    got = [q.put("flood", frag(1.0 + i), now=0.0) for i in range(20)]
    assert got == [(0, 0)] * 8 + [(6, 0)] * 12  # alone, it had the whole queue; then its own oldest went
    assert len(q) == 8 and q.over_share == {"flood": 12 * 6}
    # a second sender: the queue is full, so the one holding the most (the flooder) gives way
    assert q.put("honest", frag(-1.0), now=1.0) == (0, 6)
    assert len(q.q["flood"]) == 7 and len(q.q["honest"]) == 1
    assert q.put("flood", frag(99.0), now=1.0) == (4 * 6, 0)  # over its share of 4: its own oldest go
    assert len(q.q["flood"]) == 4 and len(q.q["honest"]) == 1 and "honest" not in q.over_share
    b = q.pop_batch(2)
    assert sorted(b["last_obs"][:, 0].tolist()) == [-1.0, -1.0, -1.0, 99.0, 99.0, 99.0]  # one of each, newest
    assert q.pop_batch(4) is None and q.pop_batch(3) is not None and len(q) == 0
    later = SenderQueues(max_fragments=8)
    later.put("a", frag(0.0), now=0.0)
    later.put("b", frag(0.0), now=ACTIVE_S + 1)  # "a" went quiet: "b" is alone again
    assert later.share(ACTIVE_S + 1) == 8


def test_stale_fragments_leave_every_senders_queue():
    q = SenderQueues(max_fragments=8)
    q.put("a", frag(0.0, version=1), now=0.0)
    q.put("b", frag(0.0, version=5), now=0.0)
    assert q.drop_stale(learner_version=5, max_lag=3) == 6 and len(q) == 1 and q.q["b"]


def test_off_policy_shares_apply_only_while_the_insert_budget_is_contested():
    s = AdmissionShare()
    for _ in range(100):  # nothing contested: everything may try the limiter
        assert s.admit("flood", 10, now=0.0)
        s.admitted("flood")
    s.refused(now=1.0)  # the limiter turned one away
    assert s.admit("honest", 10, now=1.0)  # under its share
    s.admitted("honest")
    assert not s.admit("flood", 10, now=1.0) and s.over_share == {"flood": 10}  # holds 63 of the last 64
    assert s.admit("flood", 10, now=1.0 + ACTIVE_S + 1)  # no longer contested
    honest = sum(1 for x in s.recent if x == "honest")
    assert len(s.recent) == WINDOW and honest == 1


@pytest.mark.parametrize("actors", [2, 3, 5, 6, 7])
def test_equal_senders_are_never_over_share_while_contested(actors):
    s = AdmissionShare()
    rng = random.Random(actors)
    order = [f"actor-{i}" for i in range(actors)]
    s.refused(now=0.0)
    for _ in range(40):  # rounds in which every sender sends once, in a random order
        rng.shuffle(order)
        for a in order:
            assert s.admit(a, 64, now=1.0), (a, s.counts)
            s.admitted(a)
    assert not s.over_share and len(s.recent) == WINDOW
    assert share_limit(actors) * actors >= WINDOW  # the shares can hold the window together
