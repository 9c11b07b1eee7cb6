"""bench/pong.py: the goal milestones read from a run's 1 s records (issue #28's -10 in 20 min, +18 in 60)."""
from bench import pong


def rows(*points):
    return [{"t": t, "episodes": e, "mean_return": m} for t, e, m in points]


def test_a_goal_counts_from_ten_episodes_and_its_first_crossing():
    r = rows((10.0, 3, -5.0), (20.0, 12, -11.0), (30.0, 15, -9.5), (40.0, 20, -12.0), (50.0, 30, 18.0))
    assert pong.first_at(r, -10.0) == 30.0  # the 3-episode mean at 10 s does not count
    assert pong.first_at(r, 18.0) == 50.0
    assert pong.first_at(r, 19.0) is None


def test_the_return_at_a_time_is_the_last_record_by_then():
    r = rows((10.0, 3, -20.0), (70.0, 12, -15.0), (130.0, 15, -9.0))
    assert pong.return_at(r, 60) == -20.0
    assert pong.return_at(r, 120) == -15.0
    assert pong.return_at(r, 5) is None
