"""bench/atari_peers.py: each peer's clock read the same way, and a peer that cannot run said so."""
import sys
import time

import pytest

from bench import atari_peers as ap

SF_LOG = """\
[2026-11-27 16:04:01,940][03123] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0.
[2026-11-27 16:04:21,940][03123] Fps is (10 sec: 102.4, 60 sec: 51.2, 300 sec: 51.2). Total num frames: 1024.
[2026-11-27 16:04:21,941][03123] Avg episode reward: [(0, '-21.000')]
[2026-11-27 16:04:31,940][03123] Updated weights for policy 0, policy_version 154 (0.0029)
[2026-11-27 16:04:41,959][03123] Fps is (10 sec: 102.2, 60 sec: 76.8, 300 sec: 76.8). Total num frames: 3072.
[2026-11-27 16:04:41,959][03123] Avg episode reward: [(0, '-9.500')]
"""


def test_sample_factorys_log_gives_frames_and_the_mean_at_each_report():
    launched = time.mktime(time.strptime("2026-11-27 16:04:00", "%Y-%m-%d %H:%M:%S"))
    rows = ap.sf_rows(SF_LOG, launched)
    assert rows == [{"t": 21.0, "frames": 1024, "mean_return": -21.0}, {"t": 41.0, "frames": 3072, "mean_return": -9.5}]


def test_the_summary_reads_the_return_by_each_mark_and_the_goal_from_ten_games():
    rows = [{"t": 30.0, "frames": 3_000, "episodes": 2, "mean_return": -5.0},  # 2 games: not the goal
            {"t": 600.0, "frames": 60_000, "episodes": 40, "mean_return": -15.0},
            {"t": 1100.0, "frames": 120_000, "episodes": 90, "mean_return": -9.0},
            {"t": 1300.0, "frames": 150_000, "episodes": 99, "mean_return": -4.0}]
    s = ap.summarize(rows, 20)
    assert s["return_at_minutes"] == {"10": -15.0, "20": -9.0}
    assert s["seconds_to_goal"] == 1100.0
    assert s["return_last"] == -4.0 and s["frames"] == 150_000
    assert s["frames_per_second"] == pytest.approx(150_000 / 1300, abs=0.1)
    assert s["steady_frames_per_second"] == pytest.approx((150_000 - 120_000) / 200, abs=0.1)


def test_a_mean_of_unknown_games_counts_for_the_goal_only_after_ten_whole_games_of_steps():
    # Sample Factory says no episode count: its early means are of games cut short
    rows = [{"t": 33.0, "frames": 6_000, "mean_return": -9.5},
            {"t": 60.0, "frames": 12_000, "mean_return": -19.0},
            {"t": 1300.0, "frames": 260_000, "mean_return": -9.8}]
    assert ap.summarize(rows, 60)["seconds_to_goal"] == 1300.0
    assert not ap.whole_games({"frames": 10 * ap.MIN_GAME_STEPS - 1}) and ap.whole_games({"frames": 7_570})
    assert ap.whole_games({"frames": 0, "episodes": 10}) and not ap.whole_games({"frames": 10**6, "episodes": 9})


def test_a_peer_that_did_not_install_is_skipped_with_pips_own_words(tmp_path, monkeypatch):
    monkeypatch.setattr(ap, "PEERS", tmp_path)
    monkeypatch.setattr(ap, "ROOT", tmp_path.parent)
    assert "make peers" in ap.not_installed("sb3")
    (tmp_path / ".venv-sb3").mkdir()
    (tmp_path / ".venv-sb3" / "INSTALL-FAILED").write_text("ERROR: No matching distribution found for envpool==0.8.4\n")
    why = ap.not_installed("sb3")
    assert "did not install" in why and "No matching distribution found for envpool" in why
    record = ap.run_one("sb3", 1, tmp_path / "work")
    assert record["skipped"] == why and "curve" not in record


def test_a_run_past_its_deadline_is_interrupted_and_said_to_be(tmp_path):
    script = "import time, signal, sys\nsignal.signal(signal.SIGINT, lambda *_: sys.exit(3))\ntime.sleep(60)\n"
    t0 = time.time()
    rc, stopped = ap.run_until([sys.executable, "-c", script], tmp_path / "log", t0 + 1.0)
    assert stopped and rc == 3 and time.time() - t0 < 30
    rc, stopped = ap.run_until([sys.executable, "-c", "print('done')"], tmp_path / "log", time.time() + 30)
    assert (rc, stopped) == (0, False) and (tmp_path / "log").read_text() == "done\n"


def test_appended_runs_keep_both_commands_and_refuse_another_budget(tmp_path):
    path = tmp_path / "atari-peers.json"
    path.write_text('{"command": "a", "date": "2026-12-01 19:51 UTC", "machine": "2 cores, AMD EPYC", '
                    '"minutes": 20, "runs": [{"system": "sb3"}]}')
    new = {"command": "b", "date": "2026-12-02 03:51 UTC", "machine": "2 cores, Intel Xeon", "minutes": 20,
           "runs": [{"system": "tianji", "day": "2026-12-02", "machine": "2 cores, Intel Xeon"}]}
    doc = ap.appended(path, new)
    assert doc["command"] == "a; b" and [r["system"] for r in doc["runs"]] == ["sb3", "tianji"]
    # each run names where and when it ran: the older run its file's machine, the file both machines
    assert [(r["day"], r["machine"]) for r in doc["runs"]] == [("2026-12-01", "2 cores, AMD EPYC"),
                                                              ("2026-12-02", "2 cores, Intel Xeon")]
    assert doc["machine"] == "2 cores, AMD EPYC; 2 cores, Intel Xeon"
    with pytest.raises(SystemExit, match="20 min each, these 60"):
        ap.appended(path, {"command": "c", "date": "d3", "minutes": 60, "runs": []})


def test_the_kept_curve_has_a_row_every_ten_seconds_and_the_last():
    rows = [{"t": float(t)} for t in range(0, 35)]
    assert [r["t"] for r in ap.thin(rows)] == [0.0, 10.0, 20.0, 30.0, 34.0]
    assert ap.thin([]) == []


def test_each_budget_keeps_its_own_result_file():
    # a --long round must not replace the 20-minute table (nor be refused by --append to it)
    assert ap.result_stem(20.0) == "atari-peers"
    assert ap.result_stem(60.0) == "atari-peers-60min"
    assert ap.result_stem(2.5) == "atari-peers-2.5min"
