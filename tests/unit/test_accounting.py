"""tianji.control.contracts.accounting without sockets: the counting both engines share."""
from __future__ import annotations

import json
import math

import pytest

from kube.fakes import worker_report
from tianji.control.contracts.accounting import Accounting, StopRule, status_numbers
from tianji.control.contracts.rolereport import WINDOW, ReportError, compact_json, parse_report
from tianji.control.spec import StopConfig


def rep(role="actor", index=0, *, inc="a", started=1.0, seq=1, episodes=(), episodes_total=None, **counts):
    d = worker_report("j", role, 0, index, seq=seq, incarnation=inc, episodes=list(episodes),
                      episodes_total=episodes_total, **counts)
    d["started"] = started
    return parse_report(d, "j")


def test_totals_survive_a_restart_and_never_go_backwards():
    acc = Accounting()
    acc.take(rep(inc="a", seq=1, env_frames_total=100))
    acc.take(rep(inc="a", seq=2, env_frames_total=300))
    acc.take(rep(inc="b", started=2.0, seq=1, env_frames_total=10))  # restarted: counts from zero
    assert acc.totals()["env_frames"] == 310
    acc.take(rep(inc="b", started=2.0, seq=2, env_frames_total=50))
    assert acc.totals()["env_frames"] == 350


def test_a_late_final_report_of_a_replaced_process_adds_only_its_tail():
    """The previous container's termination message, read after its successor's /report."""
    acc = Accounting()
    acc.take(rep(inc="a", seq=1, env_frames_total=100, episodes=[1.0]))
    acc.take(rep(inc="b", started=2.0, seq=1, env_frames_total=10))
    acc.take(rep(inc="a", seq=9, env_frames_total=130, episodes=[1.0, 2.0]))  # a's final report
    assert acc.totals()["env_frames"] == 140 and acc.episodes_total == 2
    assert acc.procs[("actor", 0, 0)].incarnation == "b"  # the newer process stays current
    for _ in range(3):  # read again and again (the message stays in lastState): counted once
        acc.take(rep(inc="a", seq=9, env_frames_total=130, episodes=[1.0, 2.0]))
    assert acc.totals()["env_frames"] == 140 and acc.episodes_total == 2


def test_an_older_process_first_seen_after_its_successor_is_counted_as_retired():
    acc = Accounting()
    acc.take(rep(inc="new", started=5.0, seq=3, env_frames_total=20))
    acc.take(rep(inc="old", started=1.0, seq=7, env_frames_total=500))
    assert acc.totals()["env_frames"] == 520 and acc.procs[("actor", 0, 0)].incarnation == "new"
    acc.take(rep(inc="new", started=5.0, seq=4, env_frames_total=30))
    assert acc.totals()["env_frames"] == 530


def test_stale_and_backwards_reports():
    acc = Accounting()
    acc.take(rep(seq=5, env_frames_total=100))
    assert acc.take(rep(seq=4, env_frames_total=90)) is False  # older: ignored
    with pytest.raises(ReportError, match="backwards"):
        acc.take(rep(seq=6, env_frames_total=50))
    assert acc.totals()["env_frames"] == 100


def test_mean_return_is_the_last_100_finished_episodes_by_finish_time():
    acc = Accounting()
    r0 = worker_report("j", "actor", 0, 0, episodes=[0.0] * 150)  # 150 episodes, only 100 carried
    acc.take(parse_report(r0, "j"))
    assert acc.episodes_total == 150 and len(acc.window) == WINDOW and acc.mean_return() == 0.0
    r1 = worker_report("j", "actor", 0, 1, episodes=[10.0] * 40)
    r1["recent"] = [[t + 100.0, r] for t, r in r1["recent"]]  # finished later than actor 0's
    acc.take(parse_report(r1, "j"))
    assert acc.mean_return() == pytest.approx((60 * 0.0 + 40 * 10.0) / 100)
    # Episodes that finished before all of the last 100 do not enter the window.
    r2 = worker_report("j", "actor", 0, 2, episodes=[1000.0] * 5)
    r2["recent"] = [[1.0, r] for _, r in r2["recent"]]
    acc.take(parse_report(r2, "j"))
    assert acc.episodes_total == 195 and acc.mean_return() == pytest.approx(4.0)


@pytest.mark.parametrize("bad, why", [
    ({"counts": {"env_frames_total": float("nan")}}, "env_frames_total"),
    ({"counts": {"env_frames_total": -1}}, "out of range"),
    ({"counts": {"env_frames_total": 2.0 ** 70}}, "out of range"),
    ({"counts": {"env_frames_total": "100"}}, "not a number"),
    ({"recent": [[1.0, float("inf")]]}, "return"),
    ({"recent": [[1.0, 5.0]] * 101}, "at most 100"),
    ({"episodes_total": -3}, "episodes_total"),
    ({"extra": {"version": 2 ** 64 - 1}}, "extra.version"),
    ({"role": ["actor"]}, "role"),
    ({"incarnation": {"x": 1}}, "incarnation"),
    ({"job": "someone-else"}, "not 'j'"),
    ({"v": 99}, "version"),
])
def test_hostile_reports_are_refused(bad, why):
    with pytest.raises(ReportError, match=why):
        parse_report({**worker_report("j", "learner", 0, 0), **bad}, "j")


def test_state_round_trips_exactly():
    acc = Accounting()
    acc.take(rep(inc="a", seq=1, env_frames_total=100, episodes=[3.0, 4.0]))
    acc.take(rep(inc="b", started=2.0, seq=1, env_frames_total=10, episodes=[5.0], episodes_total=1))
    acc.take(rep("learner", inc="l", seq=1, samples_consumed_total=64))
    again = Accounting(json.loads(json.dumps(acc.state())))
    assert again.view(10.0) == acc.view(10.0)
    # The restored copy still recognises the replaced incarnation's late report.
    again.take(rep(inc="a", seq=2, env_frames_total=120, episodes=[3.0, 4.0]))
    assert again.totals()["env_frames"] == 130
    with pytest.raises(ReportError):
        Accounting({"procs": [{"role": "actor"}]})


def test_a_restored_accounting_keeps_each_process_gauges_and_extras():
    """A resumed run (or a restarted operator) shows the learners' statistics, queue depths and
    versions it had before the first new report arrives: gauges are not dropped on restore."""
    from tianji.observability.learnerstats import learner_stats

    acc = Accounting()
    d = worker_report("j", "learner", 0, 0, version=7, samples_consumed_total=64)
    d["gauges"].update({"learner_clip_fraction": 0.125, "queue_depth": 3.0})
    d["extra"].update({"capacity_sps": 900.0, "checkpoint": "ckpt-7.pt"})
    acc.take(parse_report(d, "j"))
    again = Accounting(json.loads(json.dumps(acc.state())))
    assert again.procs == acc.procs
    assert learner_stats(again) == {"clip_fraction": 0.125}
    assert again.processes() == acc.processes() and again.processes()["learner-0-0"]["queue_depth"] == 3.0
    assert again.policy_version() == 7 and again.checkpoint() == "ckpt-7.pt"


def test_a_version_1_state_still_loads():
    v1 = {"v": 1, "episodesTotal": 2, "window": [[1.0, 3.0], [2.0, 4.0]],
          "retired": [{"role": "actor", "group": 0, "counts": {"env_frames_total": 10.0}}],
          "procs": [{"index": 0, "role": "learner", "group": 0, "incarnation": "l", "started": 1.0, "seq": 3,
                     "counts": {"samples_consumed_total": 64.0}, "reasons": {}, "lag": {}, "episodesTotal": 0,
                     "version": 5, "final": False}],
          "gone": [{"role": "actor", "group": 0, "incarnation": "a", "started": 1.0, "seq": 2,
                    "counts": {"env_frames_total": 10.0}, "reasons": {}, "lag": {}, "episodesTotal": 2,
                    "version": 0, "final": True}]}
    acc = Accounting(v1)
    assert acc.policy_version() == 5 and acc.totals()["consumed"] == 64 and acc.totals()["env_frames"] == 10
    assert acc.gone["a"].final and acc.state()["v"] == 2
    assert Accounting(json.loads(json.dumps(acc.state()))).view(5.0) == acc.view(5.0)


def test_a_tampered_state_is_refused_like_a_bad_report():
    acc = Accounting()
    acc.take(rep("learner", inc="l", seq=1, samples_consumed_total=64))
    state = acc.state()
    state["procs"][0]["counts"]["samples_consumed_total"] = float("inf")
    with pytest.raises(ReportError, match="samples_consumed_total"):
        Accounting(state)


def test_the_stop_rule():
    acc = Accounting()
    rule = StopRule(StopConfig(mean_return=475, env_frames=10_000, seconds=60))
    acc.take(parse_report(worker_report("j", "actor", 0, 0, episodes=[500.0] * 99, env_frames_total=100), "j"))
    assert rule.check(acc, 1.0) is None  # 99 episodes: the mean needs 100
    acc.take(parse_report(worker_report("j", "actor", 0, 0, seq=2, episodes=[500.0] * 100,
                                        env_frames_total=200), "j"))
    assert rule.check(acc, 1.0) is None  # no learner has trained: returns of an untrained policy
    acc.take(parse_report(worker_report("j", "learner", 0, 0, version=0), "j"))
    assert rule.check(acc, 1.0) is None  # still version 0
    acc.take(parse_report(worker_report("j", "learner", 0, 0, seq=2, version=3, checkpoint=""), "j"))
    assert rule.check(acc, 1.0) == "target" and "500 >= stop.meanReturn 475" in rule.message("target", acc, 1.0)
    assert "(policy version 3, checkpoint none yet)" in rule.message("target", acc, 1.0)  # the status names them
    assert StopRule(StopConfig(env_frames=150)).check(acc, 0.0) == "frames"
    assert StopRule(StopConfig(seconds=60), max_seconds=5).check(acc, 5.0) == "seconds"


def test_summary_and_status_show_the_same_numbers():
    acc = Accounting()
    acc.take(rep(env_frames_total=1000, episodes=[7.0, 9.0]))
    acc.take(rep("learner", inc="l", samples_consumed_total=640, train_steps_total=10))
    v = acc.view(4.0)
    s = status_numbers(v)
    assert (s["envFrames"], s["episodes"], s["meanReturn"]) == (v["env_frames"], v["episodes"], v["mean_return"])
    assert s["throughput"]["producedFps"] == 250 and s["throughput"]["consumedSps"] == 160


def test_the_final_report_fits_a_termination_message():
    r = worker_report("j", "actor", 0, 0, episodes=[math.pi * 1e5] * 100, env_frames_total=123456789)
    r["recent"] = [[1_800_000_000.123456 + i, x] for i, (_, x) in enumerate(r["recent"])]
    out = compact_json(r, 4096)
    back = parse_report(json.loads(out), "j")
    assert len(out) <= 4096 and back.counts["env_frames_total"] == 123456789 and 0 < len(back.recent) <= 100
    assert back.recent[-1][0] == pytest.approx(r["recent"][-1][0], abs=0.01)  # the newest are kept


def test_scraped_and_terminated_reports_give_the_same_mean_on_a_near_tie():
    """The operator counts scraped reports and then the pods' compact termination messages; the
    workers' own final reports alone must give the same mean-100, to the last digit, even when
    the window's oldest place goes to one of two episodes 0.5 ms apart (rounded alike at the source)."""
    from tianji.control.contracts.rolereport import build_report
    from tianji.observability.metrics import RoleMetrics

    def report(index, seq, eps, final=False):
        return build_report(job="j", role="actor", group=0, index=index, incarnation=f"i{index}", pid=1,
                            started=1.0, seq=seq, time=100.0 + seq, final=final,
                            snapshot=RoleMetrics("j", "actor", 0, index).snapshot(),
                            episodes_total=len(eps), recent=eps, extra={})

    a = [(10.004, 500.0)] + [(20.0 + i, 400.0) for i in range(50)]
    b = [(10.0045, 0.0)] + [(20.5 + i, 400.0) for i in range(49)]  # 101 episodes: one of the two oldest goes
    status = Accounting()
    for r in (report(0, 1, a), report(1, 1, b)):  # scraped: full reports
        status.take(parse_report(r, "j"))
    finals = [parse_report(json.loads(compact_json(report(i, 2, eps, final=True), 4096)), "j")
              for i, eps in ((0, a), (1, b))]
    for f in finals:
        status.take(f)
    workers = Accounting()
    for f in finals:
        workers.take(f)
    assert status.episodes_total == workers.episodes_total == 101
    assert status.mean_return() == workers.mean_return()


def test_an_actors_final_report_keeps_its_whole_window_in_a_termination_message():
    """The operator's final count of a pod comes from its 4096-byte termination message: an actor's
    report with every counter it keeps, large values and long float returns still carries its 100
    most recent episodes (the mean-100 of status and of the workers' own reports stay equal)."""
    from tianji.control.contracts.rolereport import build_report
    from tianji.observability.metrics import RoleMetrics

    m = RoleMetrics("halfcheetah-ppo-with-a-forty-char-name-x", "actor", 3, 11)
    for name, v, reason in (("episodes_total", 12345, None), ("env_frames_total", 123456789, None),
                            ("samples_sent_total", 123456789, None), ("bytes_sent_total", 12345678901, None),
                            ("bytes_received_total", 12345678901, None),
                            ("samples_dropped_total", 1234, "env_nonfinite"), ("samples_dropped_total", 1234, "hwm"),
                            ("messages_rejected_total", 3, "decode"), ("messages_rejected_total", 3, "schema")):
        m.inc(name, v, **({"reason": reason} if reason else {}))
    for name, v in (("policy_version", 123456), ("episode_return_mean", -1234.5678), ("epsilon", 0.05)):
        m.set(name, v)
    recent = [(1_763_957_412.123456 + 7.1 * i, -1234.56789 - i, 100_000 + i) for i in range(WINDOW)]  # lengths too
    r = build_report(job="halfcheetah-ppo-with-a-forty-char-name-x", role="actor", group=3, index=11,
                     incarnation="0123456789abcdef", pid=123456, started=1_763_957_000.123, seq=12345,
                     time=1_763_958_000.5, final=True,
                     snapshot=m.snapshot(), episodes_total=12345, recent=recent,
                     extra={"version": 123456, "pace_fps": 1234.5678, "epsilon": 0.05})
    back = parse_report(json.loads(compact_json(r, 4096)), "halfcheetah-ppo-with-a-forty-char-name-x")
    assert [list(e)[:2] for e in back.recent] == [e[:2] for e in r["recent"]] and len(back.recent) == WINDOW
    lengths = [e[2] for e in back.recent if len(e) > 2]  # what room is left carries the newest lengths
    assert 0 < len(lengths) < WINDOW and lengths == [e[2] for e in r["recent"][-len(lengths):]]


def test_episode_lengths_travel_with_the_returns_into_the_view_and_the_state():
    """A report's episodes carry their length (steps); the view's mean_episode_length is the mean
    over the same last-100 window as mean_return, and an older worker's length-less episodes
    (or a state saved before lengths) count for the return only."""
    d = worker_report("j", "actor", 0, 0, seq=1, incarnation="a", episodes=[1.0, 0.0, 1.0])
    d["recent"] = [[1_800_000_000.0 + i, r, n] for i, (r, n) in enumerate([(1.0, 4), (0.0, 300), (1.0, 8)])]
    acc = Accounting()
    acc.take(parse_report(d, "j"))
    v = acc.view(1.0)
    assert v["mean_return"] == pytest.approx(2 / 3) and v["mean_episode_length"] == pytest.approx(104.0)
    assert status_numbers(v)["meanEpisodeLength"] == 104.0
    old = worker_report("j", "actor", 0, 1, seq=1, incarnation="b", episodes=[5.0])  # [time, return] only
    acc.take(parse_report(old, "j"))
    assert acc.view(1.0)["mean_episode_length"] == pytest.approx(104.0) and acc.episodes_total == 4
    back = Accounting(json.loads(json.dumps(acc.state())))
    assert back.view(1.0)["mean_episode_length"] == pytest.approx(104.0) and back.window == acc.window
    for bad in (-1, 1.5, True, 2 ** 41):
        d["recent"][0][2] = bad
        with pytest.raises(ReportError, match=r"recent\[0\].length"):
            parse_report(d, "j")
