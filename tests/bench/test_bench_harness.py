"""bench/harness.py: the stamp every result carries, metrics records read back, the rates between
two of them, and one `tianji run` whose refusal comes back to the caller."""
import json
import os
import re

from bench import harness


def test_the_stamp_names_the_module_to_run_and_the_machine():
    s = harness.stamp("converge", ["--algos", "ppo", "--seeds", "1"])
    assert s["command"] == "python -m bench.converge --algos ppo --seeds 1"
    note = harness.stamp("atari_peers", ["--note", "3e04db4: it's (quoted)"])["command"]
    assert note == """python -m bench.atari_peers --note '3e04db4: it'"'"'s (quoted)'"""  # pastes back whole
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", s["date"])
    assert s["machine"].startswith(f"{os.cpu_count()} cores, ")
    assert harness.host(pyzmq="27")["cpus"] == os.cpu_count() and harness.host(pyzmq="27")["pyzmq"] == "27"


def test_records_leave_out_a_line_cut_short_and_rates_count_buffers_and_learners(tmp_path):
    def rec(t, frames, received, consumed):
        return {"t": t, "env_frames": frames,
                "processes": {"actor-0-0": {"sent": 1}, "buffer-0-0": {"received": received},
                              "learner-0-0": {"consumed": consumed}, "learner-1-0": {"consumed": consumed}}}

    lines = [json.dumps(rec(1.0, 100, 80, 0)), json.dumps(rec(3.0, 500, 400, 1000)), '{"t": 4.0, "env_fr']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    a, b = harness.read_records(tmp_path)
    assert harness.role_totals(b) == {"produced": 500, "received": 400, "consumed": 2000}
    # over 2 s: 400 frames produced, 320 samples received, 2 learners x 1000 consumed
    assert harness.rates_between(a, b) == {"produced_fps": 200.0, "received_fps": 160.0, "consumed_sps": 1000.0}


def test_a_refused_job_comes_back_with_the_launchers_message(tmp_path):
    missing = tmp_path / "no-such-job.yaml"
    plain = harness.run_job(missing, ["spec.stop.seconds=1"], tmp_path / "a", timeout=120)
    pids = []
    watched = harness.run_job(missing, ["spec.stop.seconds=1"], tmp_path / "b", timeout=120,
                              watch=lambda pid, t: pids.append(pid))
    for run in (plain, watched):
        assert run.returncode == 2 and "no such file" in run.stderr
        assert not (run.run_dir / "summary.json").exists()
    assert pids and len(set(pids)) == 1  # the launcher, seen while it ran
