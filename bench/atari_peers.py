"""Pong on this machine: TianJi beside Sample Factory, CleanRL on EnvPool and SB3, side by side.

    make peers                                        # the peers' pinned environments, once
    python -m bench.atari_peers                       # 20 min each, one round
    python -m bench.atari_peers --long                # 60 min each
    python -m bench.atari_peers --minutes 2 --systems tianji,cleanrl-envpool   # a check that it runs
    python -m bench.atari_peers --out docs/results    # keep atari-peers.json and .png for the docs
                                                      # (another budget: atari-peers-60min.json, ...)

Each system trains Pong alone on the machine for the same wall-clock budget, counted from its
launch (start-up included: the time to a trained model is what a user waits for). With
--rounds R the order rotates each round (interleaved), so drift in the machine's load is spread
over the systems. Before each run the load average is recorded; a peer that cannot run here
(its environment missing or failing) is recorded with the reason, and the others go on.

The same game everywhere: Pong from the ALE, 4 emulator frames per agent step, 84x84 grey,
4 stacked frames, no sticky actions (TianJi's ALE/Pong-v5 as set by tianji.envs.atari,
PongNoFrameskip-v4 for Sample Factory and SB3, EnvPool's Pong-v5 whose sticky-action default is
0), up to 30 no-ops at reset, clipped rewards for training. Differences: SB3 and Sample Factory
train with episodic life (Pong has no lives, so it changes nothing) and their own frame max-pool.
Frames are agent steps; every return is the mean of the last 100 whole games' unclipped scores,
as each system reports it. Per system: return at 10/20/60 min, first time at -10, frames/s.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, loadavg, machine, stamp
from bench.pong import return_at

PEERS = ROOT / "bench" / "peers"
GOAL = -10.0
SYSTEMS = ("tianji", "sample-factory", "cleanrl-envpool", "sb3")
# Sample Factory's Atari defaults (sf_examples/atari/atari_params.py), scaled from 8 workers of 1 env
# to 2 cores: 2 workers of 4 envs (8 envs, as every system here), double-buffered sampling
# (worker_num_splits 2, its throughput device), asynchronous APPO, CPU learner.
SF_ARGS = ("--env=atari_pong", "--num_workers=2", "--num_envs_per_worker=4", "--worker_num_splits=2",
           "--async_rl=True", "--device=cpu", "--summaries_use_frameskip=False", "--save_every_sec=100000",
           "--experiment_summaries_interval=5", "--train_for_env_steps=10000000")


def venv_python(system: str) -> Path:
    return PEERS / f".venv-{system}" / "bin" / "python"


def peer_command(system: str, seconds: float, out: Path) -> list[str]:
    """The command line of one peer run; its clock is read from `out` afterwards."""
    py = str(venv_python(system))
    if system == "sample-factory":
        return [py, str(PEERS / "sf_pong.py"), *SF_ARGS, f"--train_for_seconds={seconds:g}",
                f"--train_dir={out}", "--experiment=pong"]
    if system == "cleanrl-envpool":
        return [py, str(PEERS / "cleanrl_ppo_envpool.py"), f"--seconds={seconds:g}", f"--log={out / 'clock.jsonl'}"]
    if system == "sb3":
        return [py, str(ROOT / "bench" / "device" / "sb3_pong.py"), f"--seconds={seconds:g}", "--envs=8",
                "--device=cpu", f"--out={out / 'sb3.json'}"]
    if system == "tianji":
        return [sys.executable, "-m", "bench.pong", f"--minutes={seconds / 60:g}", f"--out={out}"]
    raise ValueError(system)


def not_installed(system: str) -> str:
    """Why a peer's environment cannot run it ('' when it can): `make peers` leaves the reason."""
    venv = PEERS / f".venv-{system}"
    if (venv / "INSTALL-FAILED").exists():
        tail = (venv / "INSTALL-FAILED").read_text(errors="replace").strip().splitlines()[-15:]
        return f"bench/peers/requirements/{system}.txt did not install here:\n" + "\n".join(tail)
    if not (venv / ".installed").exists():
        return f"no environment at {venv.relative_to(ROOT)}: run `make peers`"
    return ""


# --- each system's clock, as rows {t (s from launch), frames, mean_return} -------------------

SF_FPS = re.compile(r"Fps is \(.*?\)\. Total num frames: (\d+)")
SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")
SF_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")


def sf_rows(log: str, launched: float) -> list[dict]:
    """Sample Factory prints frames and the 100-game mean reward every few seconds on stderr."""
    rows: list[dict] = []
    frames = 0
    for line in log.splitlines():
        if m := SF_FPS.search(line):
            frames = int(m.group(1))
        elif (m := SF_REWARD.search(line)) and (ts := SF_TIME.search(line)):
            t = time.mktime(time.strptime(ts.group(1), "%Y-%m-%d %H:%M:%S")) - launched
            rows.append({"t": round(t, 1), "frames": frames, "mean_return": float(m.group(1))})
    return rows


def jsonl_rows(path: Path, launched: float) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"t": round(r["time"] - launched, 1), "frames": r["frames"], "episodes": r["episodes"],
             "mean_return": r["mean_return"]} for r in rows]


def sb3_rows(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    start = doc["startup_seconds"]  # its clock starts at learn(): the start-up is added back
    return [{"t": round(r["t"] + start, 1), "frames": r["env_frames"], "episodes": r["episodes"],
             "mean_return": r["mean_return"]} for r in doc["curve"]]


def tianji_rows(out: Path) -> list[dict]:
    doc = json.loads((out / "curve.json").read_text())
    return [{"t": r["t"], "frames": r["env_frames"], "episodes": r["episodes"], "mean_return": r["mean_return"]}
            for r in doc["curve"]]


def read_rows(system: str, out: Path, log: str, launched: float) -> list[dict]:
    if system == "sample-factory":
        return sf_rows(log, launched)
    if system == "cleanrl-envpool":
        return jsonl_rows(out / "clock.jsonl", launched)
    if system == "sb3":
        return sb3_rows(out / "sb3.json")
    return tianji_rows(out)


# --- one run, and what is said of it ----------------------------------------------------------

# The shortest whole game of Pong, in agent steps (bench/peers/sf_game_length.py: 757-761 for an
# always-NOOP or always-UP policy, 846-851 random). A system that does not say how many games its
# mean is of (Sample Factory) has a mean of whole games only after 10 games' worth of steps;
# before that its episodes are cut short (its first mean, -13, came 25 s and 4,000 steps in).
MIN_GAME_STEPS = 757
GAMES_FOR_GOAL = 10


def whole_games(row: dict) -> bool:
    """Does this row's mean count at least GAMES_FOR_GOAL whole games (or could it, where the
    system does not say)?"""
    if row.get("episodes") is not None:
        return row["episodes"] >= GAMES_FOR_GOAL
    return row["frames"] >= GAMES_FOR_GOAL * MIN_GAME_STEPS


def summarize(rows: list[dict], minutes: float) -> dict:
    rets = [r for r in rows if r["mean_return"] is not None]
    last = rows[-1] if rows else None
    half = next((r for r in rows if last and r["t"] >= last["t"] / 2), None)
    return {"frames": last["frames"] if last else None,
            "frames_per_second": round(last["frames"] / last["t"], 1) if last and last["t"] > 0 else None,
            # the second half's rate: the loop's own speed, start-up and warm-up left out
            "steady_frames_per_second": round((last["frames"] - half["frames"]) / (last["t"] - half["t"]), 1)
            if last and half and last["t"] > half["t"] else None,
            "return_at_minutes": {str(m): return_at(rets, 60 * m) for m in (10, 20, 60) if m <= minutes},
            "return_last": rets[-1]["mean_return"] if rets else None,
            "seconds_to_goal": next((r["t"] for r in rets if r["mean_return"] >= GOAL and whole_games(r)), None)}


# Sample Factory 2.1.1's --train_for_seconds never fires (runner.total_train_seconds is never
# advanced), so the bench interrupts it at the budget, as a user would with Ctrl-C.
SIGNALLED = {"sample-factory"}


def run_until(cmd: list[str], log: Path, deadline: float) -> tuple[int | None, bool]:
    """Run `cmd` (its own process group, output to `log`) until it exits or the deadline; then
    SIGINT, and SIGKILL 60 s later. (exit status, whether the bench stopped it)."""
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        while p.poll() is None and time.time() < deadline:
            time.sleep(1.0)
        if p.poll() is not None:
            return p.returncode, False
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        return p.returncode, True


def settle(below: float = 1.0, most_s: float = 180.0) -> None:
    """Wait (up to `most_s`) for the 1-minute load to fall below `below`: back to back, the load
    recorded before a run would be the tail of the run before it."""
    end = time.time() + most_s
    while loadavg()[0] >= below and time.time() < end:
        time.sleep(5.0)


def run_one(system: str, minutes: float, work: Path) -> dict:
    out = work / system
    out.mkdir(parents=True, exist_ok=True)
    seconds = 60 * minutes
    if system != "tianji" and (why := not_installed(system)):
        return {"system": system, "skipped": why}
    settle()
    load = loadavg()
    record: dict = {"system": system, "load_before": load, "load1_before": round(load[0], 2),
                    "started": time.strftime("%H:%M UTC", time.gmtime()),
                    "day": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine()}
    cmd = peer_command(system, seconds, out)
    record["command"] = " ".join(cmd)
    launched = time.time()
    rc, stopped = run_until(cmd, out / "output.log", launched + seconds + (0 if system in SIGNALLED else 600))
    log = (out / "output.log").read_text(errors="replace")
    if stopped:
        record["stopped_by_bench"] = "SIGINT at the budget" if system in SIGNALLED else "past its budget"
    record.update(rc=rc, wall_seconds=round(time.time() - launched, 1))
    try:
        rows = read_rows(system, out, log, launched)
    except (OSError, ValueError, KeyError) as e:
        return {**record, "failed": f"{type(e).__name__}: {e}", "output_tail": log[-2000:]}
    if not rows:
        return {**record, "failed": "no clock rows", "output_tail": log[-2000:]}
    return {**record, **summarize(rows, minutes), "curve": rows}


def thin(rows: list[dict], every: float = 10.0) -> list[dict]:
    """One row per `every` seconds (and the last): what the kept JSON needs for its figure."""
    out: list[dict] = []
    for r in rows:
        if not out or r["t"] - out[-1]["t"] >= every:
            out.append(r)
    if rows and out[-1] is not rows[-1]:
        out.append(rows[-1])
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(11, 4))
    for run in doc["runs"]:
        rows = [r for r in run.get("curve", []) if r["mean_return"] is not None]
        if not rows:
            continue
        label = (f"{run['system']} (round {run['round']})" if doc["rounds"] > 1 else run["system"]) + (
            f", {run['note']}" if run.get("note") else "")
        ax_t.plot([r["t"] / 60 for r in rows], [r["mean_return"] for r in rows], label=label)
        ax_f.plot([r["frames"] / 1e6 for r in rows], [r["mean_return"] for r in rows], label=label)
    for ax, xl in ((ax_t, "minutes from launch"), (ax_f, "agent steps (millions)")):
        ax.axhline(GOAL, color="grey", lw=0.5, ls="--")
        ax.set_xlabel(xl)
        ax.set_ylabel("mean return, last 100 games")
    ax_t.legend(fontsize=8)
    fig.suptitle(f"Pong on {doc['machine']}, {doc['minutes']:g} min each")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def result_stem(minutes: float) -> str:
    """The kept files' name for a budget: the 20-minute round is `atari-peers`, another budget has
    its own (`atari-peers-60min`), so that a --long round never replaces the 20-minute table."""
    return "atari-peers" if minutes == 20 else f"atari-peers-{minutes:g}min"


def appended(path: Path, new: dict) -> dict:
    """The earlier result at `path` with `new`'s runs after its own: one file, each command kept, each
    run naming its machine and day (a run kept before runs named them takes its file's)."""
    old = json.loads(path.read_text())
    if old["minutes"] != new["minutes"]:
        raise SystemExit(f"--append: {path} ran {old['minutes']:g} min each, these {new['minutes']:g}")
    day = old["date"].split(";")[0][:10]
    runs = [{"day": day, "machine": old["machine"], **r} for r in old["runs"]] + new["runs"]
    machines = list(dict.fromkeys(r["machine"] for r in runs if "machine" in r))
    return {**old, "command": f"{old['command']}; {new['command']}", "date": f"{old['date']}; {new['date']}",
            "machine": "; ".join(machines), "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--long", action="store_true", help="60 minutes each")
    ap.add_argument("--rounds", type=int, default=1, help="runs per system; the order rotates each round")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--out", help="write atari-peers.json and atari-peers.png here (docs/results for the docs; "
                                  "a budget other than 20 min: atari-peers-<M>min.json and .png)")
    ap.add_argument("--work", help="the runs' folders (default: a new temp folder)")
    ap.add_argument("--append", action="store_true",
                    help="add these runs to --out's result of the same budget instead of replacing it")
    ap.add_argument("--note", default="", help="a word on these runs, kept with each (e.g. what changed)")
    a = ap.parse_args(argv)
    systems = [s for s in a.systems.split(",") if s]
    if unknown := [s for s in systems if s not in SYSTEMS]:
        ap.error(f"unknown system(s) {unknown}; known: {', '.join(SYSTEMS)}")
    minutes = 60.0 if a.long else a.minutes
    if not minutes > 0 or a.rounds < 1:
        ap.error("--minutes and --rounds must be positive")
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="atari-peers-"))
    runs = []
    for rnd in range(a.rounds):
        order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
        for system in order:
            print(f"atari peers: round {rnd + 1}, {system}, {minutes:g} min, load {loadavg()[0]:.2f}", file=sys.stderr)
            run = run_one(system, minutes, work / f"round{rnd + 1}")
            runs.append({"round": rnd + 1, **run, **({"note": a.note} if a.note else {})})
    doc = {"bench": "atari_peers", **stamp("atari_peers", argv), "minutes": minutes, "rounds": a.rounds,
           "goal_return": GOAL, "work": str(work), "runs": runs}
    stem = result_stem(minutes)
    if a.append:
        doc = appended(Path(a.out or ap.error("--append needs --out")) / f"{stem}.json", doc)
    brief = {**doc, "runs": [{k: v for k, v in r.items() if k not in ("curve", "output_tail")} for r in runs]}
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        doc["plot"] = brief["plot"] = str(out / f"{stem}.png")
        plot(doc, out / f"{stem}.png")
        kept = {**doc, "runs": [{**r, "curve": thin(r["curve"])} if "curve" in r else r for r in doc["runs"]]}
        (out / f"{stem}.json").write_text(json.dumps(kept, indent=1) + "\n")
    emit(brief)
    return 0 if any("curve" in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
