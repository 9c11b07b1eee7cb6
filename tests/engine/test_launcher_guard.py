"""The launcher's own defences: a restart budget that decays, and reports only from its own workers."""
import time
from types import SimpleNamespace

import zmq

from helpers import EXAMPLES, DeadProc
from tianji.control.contracts.rolereport import build_report, parse_report
from tianji.control.spec import load_job
from tianji.local import launcher as L
from tianji.local import supervisor
from tianji.runtime.wire import encode


def fail_once(lt, c, now, ran_for):
    c.proc, c.restart_at, c.started_at, c.last_report = DeadProc(), None, now - ran_for, now
    c.log = SimpleNamespace(name="log")
    lt._supervise(now)


def test_a_slow_trickle_of_faults_never_exhausts_the_restart_budget(launcher):
    c = launcher.children[0]
    launcher.children = [c]
    now = time.monotonic()
    for i in range(3 * supervisor.MAX_RESTARTS):  # each failure after a healthy interval
        fail_once(launcher, c, now + i * 1000, supervisor.HEALTHY_S + 1)
        assert launcher.error is None, launcher.error
    assert c.restarts == 3 * supervisor.MAX_RESTARTS and c.failures == 1


def test_the_run_ends_at_the_max_restarts_th_failure_in_a_row(launcher):
    """README: "a run ends after 10 failures of one worker in a row": 9 restarts, then the end."""
    c = launcher.children[0]
    launcher.children = [c]
    now = time.monotonic()
    for i in range(supervisor.MAX_RESTARTS - 1):
        fail_once(launcher, c, now + i, 0.1)
        assert launcher.error is None, (i, launcher.error)
    assert c.restarts == supervisor.MAX_RESTARTS - 1 and c.restart_at is not None
    fail_once(launcher, c, now + supervisor.MAX_RESTARTS, 0.1)
    assert launcher.error and f"failed {supervisor.MAX_RESTARTS} times in a row" in launcher.error
    assert c.restarts == supervisor.MAX_RESTARTS - 1 and c.restart_at is None
    assert len(c.exits) == supervisor.MAX_RESTARTS
    assert launcher._exit_reason(now + supervisor.MAX_RESTARTS) == "error"


def test_an_evaluator_that_keeps_failing_is_given_up_and_training_goes_on(tmp_path):
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.evaluation.intervalSeconds=5"])
    lt = L.Launcher(job, tmp_path / "run", progress=False)
    (c,) = [x for x in lt.children if x.role == "evaluator"]
    lt.children = [c]
    now = time.monotonic()
    for i in range(supervisor.MAX_RESTARTS):
        fail_once(lt, c, now + i, 0.1)
    assert lt.error is None and c.restart_at == float("inf") and c.restarts == supervisor.MAX_RESTARTS - 1
    assert lt.warnings == [f"evaluator-0-0 gave up after {supervisor.MAX_RESTARTS} failures"]


def report(job, pid, episodes=100, ret=500.0):
    now = time.time()
    return build_report(job=job, role="actor", group=0, index=0, incarnation="forged", pid=pid, started=now - 1,
                        seq=1, time=now, final=False,
                        snapshot={"counts": {"episodes_total": episodes}, "reasons": {}, "gauges": {}, "lag": {}},
                        episodes_total=episodes, recent=[(now, ret)] * episodes, extra={})


def test_forged_and_malformed_reports_are_counted_rejects(launcher):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    try:
        addr = launcher.report_addr
        pull.bind(addr)
        push.connect(addr)
        name = launcher.job.name
        forged = report(name, pid=1)  # valid for parse_report: refused because pid 1 is not our worker
        parse_report(forged, job=name)
        bad_count = dict(forged, episodes_total="lots")
        for meta in (forged, bad_count, {"job": name, "role": ["x"]}):
            push.send_multipart(encode("report", name, "actor-0-0", 0, 0, None, meta))
        push.send_multipart([b"\x93garbage"])
        deadline = time.monotonic() + 5
        while launcher.acc.rejected < 4 and time.monotonic() < deadline:
            launcher._drain(pull, 0.1)
        assert launcher.acc.rejected == 4
        assert launcher.target_reached_at is None and launcher.acc.view(1.0)["episodes"] == 0
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        ctx.term()
