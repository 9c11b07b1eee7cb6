"""docs/benchmarks.md's generated blocks say what the benchmark JSON in docs/results/ says
(bench/render_docs.py)."""
import json
import re

from bench import render_docs
from bench.harness import RESULTS

DOC = render_docs.DOC


def test_the_doc_in_the_repo_matches_its_json(capsys):
    assert render_docs.main(["--check"]) == 0, capsys.readouterr().out


def test_every_registered_file_records_its_command_date_and_machine():
    for name, (_, files) in render_docs.BLOCKS.items():
        for f in files:
            d = render_docs.load(f)
            assert all(d.get(k) for k in ("command", "date", "machine")), f"{name}: {f}"


def _block(text: str, name: str) -> str:
    return re.search(rf"<!-- report:{name} -->.*?<!-- /report:{name} -->", text, re.S).group(0)


def test_an_edited_number_in_a_block_is_caught_and_rewritten(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    text = DOC.read_text()
    pong = _block(text, "pong")
    frames = json.loads((RESULTS / "pong.json").read_text())["env_frames"]
    shown, edited = f"{frames:,}", f"{frames + 1:,}"
    assert shown in pong  # docs/results/pong.json's env_frames
    prose_edit = "the 100-episode mean return of the exploring policy"
    assert prose_edit in text
    doc.write_text(text.replace(pong, pong.replace(shown, edited))
                   .replace(prose_edit, prose_edit + " (edited)"))

    assert render_docs.main(["--check", "--doc", str(doc)]) == 1
    out = capsys.readouterr().out
    assert "report:pong" in out and "report:scaling" not in out

    assert render_docs.main(["--doc", str(doc)]) == 0  # rewrites the block, keeps the prose
    assert render_docs.main(["--check", "--doc", str(doc)]) == 0
    rewritten = doc.read_text()
    assert _block(rewritten, "pong") == pong and prose_edit + " (edited)" in rewritten


def test_a_removed_block_is_named(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    text = DOC.read_text()
    doc.write_text(text.replace(_block(text, "groupsync"), ""))
    assert render_docs.main(["--check", "--doc", str(doc)]) == 1
    assert "report:groupsync is missing" in capsys.readouterr().out


def _pong_run(system: str, machine: str, end: float) -> dict:
    return {"system": system, "machine": machine, "day": "2026-12-02", "started": "03:51 UTC", "round": 1,
            "curve": [], "return_at_minutes": {"10": -20.0, "20": -15.0, "60": end}, "seconds_to_goal": None,
            "frames": 1000, "frames_per_second": 300, "steady_frames_per_second": 310, "load1_before": 0.5}


def test_pong_runs_from_two_machines_each_name_theirs():
    amd, intel = "2 cores, AMD EPYC", "2 cores, Intel Xeon"
    d = {"path": "docs/results/x.json", "command": "c", "date": "2026-12-02 04:51 UTC", "machine": f"{amd}; {intel}",
         "minutes": 60, "rounds": 1, "goal_return": -10,
         "runs": [_pong_run("tianji", amd, 19.0), _pong_run("sb3", intel, -12.0)]}
    table = [line for line in render_docs.render_atari_peers([d]) if line.startswith("| ")]
    assert table[0].endswith("| started | machine |")
    assert table[-1].endswith(f"| 2026-12-02 03:51 UTC | {intel} |")
    hour = render_docs.pong_hour(d)  # the headline: a peer from another machine than TianJi's says so
    assert hour.endswith(f"SB3 -12.0 (not reached, 300 steps/s, on {intel})")
    d["runs"][1]["machine"] = amd
    assert render_docs.pong_hour(d).endswith("SB3 -12.0 (not reached, 300 steps/s)")
