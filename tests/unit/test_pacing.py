"""Actor pacing feedback (runtime/pacing.py) and the wire checks on what carries it (runtime/validate.py)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from tianji.control.spec import parse_job
from tianji.runtime.pacing import MAX_HEADROOM, MIN_HEADROOM, HeadroomController, lag_target, startup_frames
from tianji.runtime.validate import check_feedback, check_frames, check_headroom
from tianji.runtime.wire import WireError


def simulate(capacity: float, periods: int, h0: float = 1.2) -> tuple[float, float]:
    """A learner that takes `capacity` samples a period; production beyond it is dropped.
    Returns (drop fraction, learner idle fraction) over the last half of the run."""
    c = HeadroomController(h0)
    drops = received = idle = 0.0
    for t in range(periods):
        produced = capacity * c.headroom
        dropped = max(0.0, produced - capacity)
        u = max(0.0, 1 - produced / capacity)
        if t >= periods // 2:
            drops, received, idle = drops + dropped, received + produced, idle + u
        c.update(int(produced), int(dropped), u)
    return drops / received, idle / (periods - periods // 2)


def test_waste_is_cut_below_the_target_without_starving_the_learner():
    d, idle = simulate(1000.0, 200, h0=2.0)
    assert d < 0.05
    assert idle < 0.2


def test_a_starved_learner_speeds_actors_up_and_waste_slows_them_down():
    c = HeadroomController(1.2)
    assert c.update(1000, 0, idle_fraction=0.5) > 1.2
    h = c.headroom
    assert c.update(1000, 300, idle_fraction=0.0) < h
    for _ in range(100):
        c.update(1000, 1000, 0.0)
    assert c.headroom == MIN_HEADROOM
    for _ in range(100):
        c.update(1000, 0, 1.0)
    assert c.headroom == MAX_HEADROOM


def test_startup_budget_is_what_the_learner_can_use_when_it_starts():
    ppo = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                     "spec": {"algorithm": {"name": "ppo", "batchSize": 256},
                              "env": {"numEnvs": 4, "fragmentLength": 32},
                              "staleness": {"maxPolicyLag": 3, "creditWindow": 1}}}).spec
    assert startup_frames(ppo, 2) == (1 + 1) * 256 // 2  # consumed at lag 0 and 1 (creditWindow 1)
    dqn = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                     "spec": {"algorithm": {"name": "dqn", "learningStarts": 1000, "batchSize": 64,
                                            "stepsPerBatch": 16}, "env": {"numEnvs": 4, "fragmentLength": 16},
                              "staleness": {"replayRatio": 8}}}).spec
    assert startup_frames(dqn, 2) == int((1000 + (1024 + 64 * 8) / 8) // 2)


def _queue(capacity: float, periods: int, lag_target_: float = None, h0: float = 1.2, max_lag: int = 4,
           busy: float = 0.8):
    """An on-policy learner whose updates run at `capacity` samples per busy second (what it
    advertises) but that is busy `busy` of the time (receiving, publishing: not idle, not
    training), one version a period: production beyond what it takes queues (FIFO) and is consumed
    later, at one more version of lag per period queued; what reaches max_lag is dropped. Returns
    (mean consumed lag, drop fraction, idle fraction) over the last half of the run."""
    c = HeadroomController(h0, lag_target=lag_target_)
    queue = 0.0  # samples waiting beyond the batch in flight
    lags, drops, received, idle = [], 0.0, 0.0, 0.0
    for t in range(periods):
        produced = capacity * c.headroom
        queue += produced
        take = min(busy * capacity, queue)
        lag = 1 + (queue - take) / (busy * capacity)  # overlap's one version, plus the periods of queue
        queue -= take
        dropped = max(0.0, queue - (max_lag - 1) * busy * capacity)
        queue -= dropped
        u = 1 - take / (busy * capacity)
        if t >= periods // 2:
            lags.append(lag)
            drops, received, idle = drops + dropped, received + produced, idle + u
        c.update(int(produced), int(dropped), u, lag=lag if take else None)
    return sum(lags) / len(lags), drops / received, idle / (periods - periods // 2)


def test_the_lag_rule_keeps_the_queue_at_what_the_next_update_takes():
    lag, d, idle = _queue(4096.0, 400, lag_target_=1.0, h0=3.0)  # from heavy overproduction
    assert lag < 1.0 + 0.25 + 0.1 and d < 0.01 and idle < 0.2


def test_a_standing_queue_slows_production_before_anything_is_dropped():
    """Consumed at lag 2 where overlapping makes 1, nothing dropped, the learner never idle: drops alone
    see nothing wrong; the lag rule slows down, harder the deeper the queue, and not at the target."""
    drops_only, with_lag = HeadroomController(1.2), HeadroomController(1.2, lag_target=1.0)
    assert drops_only.update(4096, 0, 0.0, lag=2.0) == 1.2
    assert with_lag.update(4096, 0, 0.0, lag=2.0) == pytest.approx(1.2 * 0.5)
    assert HeadroomController(1.2, lag_target=1.0).update(4096, 0, 0.0, lag=1.5) == pytest.approx(1.2 * 0.75)
    assert HeadroomController(1.2, lag_target=1.0).update(4096, 0, 0.0, lag=1.2) == 1.2  # within the slack
    assert HeadroomController(1.2, lag_target=1.0).update(4096, 0, 0.5, lag=None) > 1.2  # idle, nothing consumed


def test_a_waiting_learner_is_fed_faster_however_late_its_samples_are():
    """Lag with the learner idle half the time is the fragments' duration, not a queue: production
    speeds up (the idle rule) instead of slowing down for it; drops still slow it down."""
    c = HeadroomController(1.2, lag_target=1.0)
    assert c.update(4096, 0, 0.5, lag=2.8) == pytest.approx(1.2 * 1.25)
    assert HeadroomController(1.2, lag_target=1.0).update(4096, 1024, 0.5, lag=2.8) < 1.2  # 25 % dropped


def test_lag_target_is_what_overlapping_makes():
    def spec(**st):
        return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                          "spec": {"algorithm": {"name": "ppo", "batchSize": 256},
                                   "env": {"numEnvs": 4, "fragmentLength": 32}, "staleness": st}}).spec
    assert lag_target(spec()) == 1.0
    assert lag_target(spec(creditWindow=2, publishEvery=2)) == 4.0
    dqn = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                     "spec": {"algorithm": {"name": "dqn"}}}).spec
    assert lag_target(dqn) is None


@pytest.mark.parametrize("meta", [
    {"buffer": 0, "received": -1}, {"buffer": 0, "dropped": 2.5}, {"buffer": 0, "fragments": True},
    {"buffer": 0, "received": 1 << 41}, {"buffer": 0, "evil": 1}, {"buffer": 0, "dropped": float("nan")},
])
def test_hostile_batch_feedback_is_rejected(meta):
    with pytest.raises(WireError):
        check_feedback(meta)


def test_honest_batch_feedback_passes():
    check_feedback({"buffer": 0, "received": 1024, "dropped": 2048, "fragments": 8})  # old fragments aged out
    check_feedback({"buffer": 1})


@pytest.mark.parametrize("h", [float("nan"), float("inf"), -1.0, 0.0, 11.0, True, "2"])
def test_hostile_headroom_is_rejected(h):
    with pytest.raises(WireError):
        check_headroom(h)


@pytest.mark.parametrize("f", [-1, 1.5, 1 << 60, True, "9", float("inf")])
def test_hostile_global_frames_are_rejected(f):
    with pytest.raises(WireError):
        check_frames(f)


def test_honest_pacing_values_pass():
    assert check_headroom(1.2) == 1.2 and check_headroom(None) is None
    assert check_frames(123_456) == 123_456 and check_frames(None) is None


def test_the_credit_window_defaults_to_one_batch_for_ppo_and_two_for_dqn():
    """A second PPO batch queued behind the one in training is consumed a version later: with a peer's
    4096-sample batches that doubled the mean lag (docs/ablation.md). DQN's batches are replay draws."""
    def spec(algo, **staleness):
        return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "w"},
                          "spec": {"algorithm": {"name": algo}, "staleness": staleness}}).spec

    assert spec("ppo").credit_window == 1 and spec("dqn").credit_window == 2
    assert spec("ppo", creditWindow=3).credit_window == 3 and spec("dqn", creditWindow=1).credit_window == 1
    # what the actors may produce before the learner's first update follows it
    assert startup_frames(spec("ppo", creditWindow=3), 1) - startup_frames(spec("ppo"), 1) == 2 * 256


def test_the_version_quota_sends_one_share_per_version_and_reopens_when_the_next_is_late():
    from tianji.runtime.pacing import VersionQuota

    q = VersionQuota(share=4)
    assert q.open(0.0, 8.0)  # no version held yet: the start-up budget governs, not the quota
    q.new_version(now=10.0)
    for _ in range(4):
        assert q.open(10.5, 8.0)
        q.add()
    assert not q.open(11.0, 8.0)  # this version's share is out: more would be consumed a version late
    assert not q.open(17.9, 8.0)
    q.new_version(now=12.0)  # the next version: a new share
    assert q.open(12.1, 8.0)
    q.add(4)
    assert not q.open(19.9, 8.0)
    # Late (a lost share, a dead peer): one fragment at once, then one per release_s / share = 2 s.
    assert q.open(20.0, 8.0) and q.released == 1
    q.add()
    assert not q.open(21.9, 8.0) and q.open(22.0, 8.0) and q.released == 2
    q.add()
    assert not q.open(23.9, 8.0)
    q.new_version(now=24.0)  # the version came: back to one share
    assert q.open(24.0, 8.0)


def test_quota_share_and_release_follow_the_spec_and_the_learners_advert():
    from tianji.runtime.pacing import RELEASE_MIN_S, RELEASE_UNKNOWN_S, quota_share, release_after

    def spec(**st):
        return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                          "spec": {"algorithm": {"name": "ppo", "batchSize": 4096, "minibatchSize": 64},
                                   "env": {"numEnvs": 8, "fragmentLength": 32}, "staleness": st}}).spec
    assert quota_share(spec(), 2) == 8  # 16 fragments a batch, two actors
    assert quota_share(spec(), 3) == Fraction(16, 3)  # exactly: 5 or 6 each, 16 a version in all
    assert quota_share(spec(publishEvery=2), 2) == 16
    assert quota_share(spec(), 48) == Fraction(1, 3)  # more actors than fragments: one every third version
    assert release_after(4096, 2048.0) == 4.0  # twice the 2 s update the advert implies
    assert release_after(4096, 1e9) == RELEASE_MIN_S and release_after(4096, 0.0) == RELEASE_UNKNOWN_S
    # A fast learner (CartPole: 256 samples at 8,000/s) and an actor whose share takes 60 ms: a
    # version more than 120 ms late is late, whatever pace a slow peer would set.
    assert release_after(256, 8000.0, share_s=0.06) == 0.12
    assert release_after(4096, 2048.0, share_s=0.5) == 4.0  # a slow update still sets it


def test_a_deeper_quota_keeps_one_batch_producing_while_the_next_trains():
    """depth 2: the first version lets two shares out (one batch trains while the next is produced);
    then one share per version, a skipped version brings its share too, never more than two ahead."""
    from tianji.runtime.pacing import VersionQuota, quota_depth

    q = VersionQuota(share=4, depth=2)
    q.new_version(now=0.0)
    q.add(8)
    assert not q.open(0.1, 8.0)  # two shares ahead: the learner trains on one, the other waits
    q.new_version(now=1.0)
    assert q.budget == 4  # one version: one share
    q.add(1)
    q.new_version(now=2.0, advanced=3)  # three versions at once (latest-only subscription)
    assert q.budget == 8  # 3 + 3 shares, capped at the depth
    q.add(8)
    assert not q.open(2.5, 8.0) and q.open(10.0, 8.0) and q.released == 1  # late: released as before
    with pytest.raises(ValueError):
        VersionQuota(share=4, depth=0)
    spec = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                      "spec": {"algorithm": {"name": "ppo"}, "staleness": {"creditWindow": 2}}}).spec
    assert quota_depth(spec) == 3


def test_an_actor_resting_on_a_spent_quota_wakes_on_the_next_version():
    """The quota's rest ends when a new version reopens the quota, not at the end of the poll period
    (resting it out held each version's first fragment back 10-22 ms); a rate rest runs its course."""
    import time as _time

    from tianji.runtime.roles.actor import Actor

    class Sub:
        def __init__(self):
            self.polls = 0

        def poll(self, timeout):
            self.polls += 1
            return self.polls == 2  # the next version comes in on the second poll

    def probe():
        actor.quota_version += 1

    actor = Actor.__new__(Actor)
    actor.stopping, actor.quota_version, actor.sub = False, 5, Sub()
    actor.probe_params, actor.maybe_report = probe, lambda: None
    actor._rest(30.0, until_new_version=True)  # returns at the version, never after 30 s
    assert actor.quota_version == 6 and actor.sub.polls == 2
    actor.sub = Sub()
    t = _time.monotonic()
    actor._rest(0.2)  # a rate rest: the version changes, the rest goes on
    assert _time.monotonic() - t >= 0.2 and actor.quota_version == 7 and actor.sub.polls > 2


@pytest.mark.parametrize("staleness, room", [({"maxPolicyLag": 3, "creditWindow": 1}, True),
                                              ({"maxPolicyLag": 2, "creditWindow": 1}, True),
                                              ({"maxPolicyLag": 1, "creditWindow": 1}, False),
                                              ({"maxPolicyLag": 2, "creditWindow": 2}, False)])
def test_a_version_ends_a_rate_rest_only_where_the_lag_it_adds_is_admitted(staleness, room):
    """Running the quota ahead at once makes a bottleneck learner consume a version later (Pong: lag
    2.0): where maxPolicyLag is at or below the lag overlapping makes, those samples would be stale."""
    from tianji.runtime.pacing import lag_room

    spec = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                      "spec": {"algorithm": {"name": "ppo"}, "staleness": staleness}}).spec
    assert lag_room(spec) is room


def _due(quotas, versions: int) -> list[int]:
    """Fragments the actors of `quotas` send per version, each sending whatever is due at once."""
    sent = []
    for v in range(versions):
        n = 0
        for q in quotas:
            q.new_version(now=float(v))
            while q.budget >= 1:
                assert q.open(float(v), 1e9)
                q.add()
                n += 1
        sent.append(n)
    return sent


def test_a_fractional_share_spreads_a_batch_over_staggered_peers():
    """6 actors, 2 fragments a batch: one fragment each every third version, two actors a version,
    where whole shares had all six send every version (3x what the learner takes)."""
    from tianji.runtime.pacing import VersionQuota, quota_phase

    share = Fraction(2, 6)
    quotas = [VersionQuota(share, depth=2, phase=quota_phase(share, i)) for i in range(6)]
    sent = _due(quotas, 30)
    assert sent[0] == 4  # the first version: two batches (depth 2), as with whole shares
    assert sent[1:] == [2] * 29  # then exactly a batch a version, from two of the six
    # 3 actors, 16 fragments a batch: 5 or 6 each, 16 in all every version (rounded up: 18)
    share = Fraction(16, 3)
    quotas = [VersionQuota(share, depth=2, phase=quota_phase(share, i)) for i in range(3)]
    assert _due(quotas, 12) == [32] + [16] * 11
    with pytest.raises(ValueError):
        VersionQuota(share, phase=Fraction(1))


def test_a_fractional_share_is_released_at_its_own_pace_when_the_version_is_late():
    """Nothing due this version is not lateness; once the version is late the actor releases one
    fragment, then one per release_s / share."""
    from tianji.runtime.pacing import VersionQuota

    q = VersionQuota(Fraction(1, 3), depth=1)
    q.new_version(now=0.0)  # 1/3 due: nothing yet
    assert not q.open(0.5, 1.0)
    assert q.open(1.0, 1.0) and q.released == 1  # late: one fragment
    q.add()
    assert not q.open(2.9, 1.0) and q.open(3.0, 1.0)  # then one per 3 s (release_s / share)


def test_every_actor_has_a_quota_rank_among_its_learners_actors():
    """Ranks 0, 1, ... per learner in index order, for an actor added beyond spec.topology.actors too."""
    from types import SimpleNamespace

    from tianji.runtime.pacing import quota_rank

    topo = SimpleNamespace(actors=6, buffers=2, learners=2)  # even actors feed learner 0, odd learner 1
    assert [quota_rank(a, topo) for a in range(6)] == [0, 0, 1, 1, 2, 2]
    assert quota_rank(7, topo) == 3  # an autoscaled seventh actor of learner 1
    assert [quota_rank(a, SimpleNamespace(actors=3, buffers=1, learners=1)) for a in range(3)] == [0, 1, 2]
