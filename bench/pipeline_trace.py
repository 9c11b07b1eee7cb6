"""Where a relaxed PPO job's version cycle spends its time, from an event trace (runtime/trace.py).

    python -m bench.pipeline_trace DIR [--skip SECONDS] [--out FILE]   # DIR: a TIANJI_TRACE folder

A run with TIANJI_TRACE=DIR leaves one JSON-lines file per role. This joins them, from `--skip`
seconds after the first update on (start-up is not the steady state), into:

- the learner: updates per second, the mean update, its busy fraction, and what each gap between
  two updates waited on: a batch not there yet (`starved_s`) or the learner's own work between
  updates (`host_s`: receiving and decoding the batch, publishing);
- the actors: how long a publish takes to reach them (`publish_to_actor_s`), how long after a
  version arrives a fragment first acts with it (`arrival_to_acting_s`: an ONNX Runtime session
  being built), the share of fragments that act with an older version than the actor holds, and
  the time one fragment takes and its frames;
- the buffer and the learner's queue: how long a batch takes from the buffer to the learner;
- the lag each update consumed at.

It prints (or writes) one JSON object; bench/device/run.py keeps one per arm it traces.
"""
from __future__ import annotations

import argparse
import json
from bisect import bisect_right
from pathlib import Path
from statistics import mean, median
from typing import Optional


def read_trace(directory: Path) -> dict[str, list[dict]]:
    """sender -> its events in time order."""
    out = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a line cut by a kill
                continue
        out[path.stem] = sorted(events, key=lambda e: e["t"])
    return out


def _q(xs: list[float]) -> Optional[dict]:
    if not xs:
        return None
    s = sorted(xs)
    return {"median": round(median(s), 4), "p90": round(s[int(0.9 * (len(s) - 1))], 4), "n": len(s)}


def _learner(events: list[dict], since: float) -> dict:
    updates = [e for e in events if e["ev"] == "update" and e["t"] - e["dt"] >= since]
    batches = [e["t"] for e in events if e["ev"] == "batch_in"]  # in time order (read_trace)
    if len(updates) < 2:
        return {"updates": len(updates)}
    span = updates[-1]["t"] - (updates[0]["t"] - updates[0]["dt"])
    starved, host = [], []
    for prev, cur in zip(updates, updates[1:]):
        start = cur["t"] - cur["dt"]
        # the batch this update trained on: the last one in before it started, at most
        i = bisect_right(batches, start)
        arrived = batches[i - 1] if i else prev["t"]
        starved.append(max(0.0, arrived - prev["t"]))
        host.append(max(0.0, start - max(prev["t"], arrived)))
    return {"updates": len(updates), "seconds": round(span, 2), "updates_per_s": round(len(updates) / span, 3),
            "update_s": round(mean(u["dt"] for u in updates), 4),
            "busy_fraction": round(sum(u["dt"] for u in updates) / span, 3),
            "starved_s": round(mean(starved), 4), "host_s": round(mean(host), 4),
            "lag_mean": round(mean(u["lag"] for u in updates), 3)}


def _actors(trace: dict[str, list[dict]], publishes: dict[int, float], since: float) -> dict:
    to_actor, to_acting, frag_s, frag_n = [], [], [], []
    fragments = behind = 0
    for sender, events in trace.items():
        if not sender.startswith("actor-"):
            continue
        arrived: dict[int, float] = {}
        first_acting: dict[int, float] = {}
        for e in events:
            if e["ev"] == "params" and e["v"] not in arrived:
                arrived[e["v"]] = e["t"]
                if e["t"] >= since and e["v"] in publishes:
                    to_actor.append(e["t"] - publishes[e["v"]])
            elif e["ev"] == "fragment":
                first_acting.setdefault(e["v"], e["t0"])
                if e["t0"] >= since:
                    fragments += 1
                    behind += e["v"] < e["held"]
                    frag_s.append(e["t"] - e["t0"])
                    frag_n.append(e.get("n", 0))
        to_acting += [first_acting[v] - t for v, t in arrived.items() if v in first_acting and t >= since]
    return {"publish_to_actor_s": _q(to_actor), "arrival_to_acting_s": _q(to_acting),
            "fragment_s": _q(frag_s), "fragment_frames": median(frag_n) if frag_n else None, "fragments": fragments,
            "acting_behind_held": round(behind / fragments, 3) if fragments else None}


def _transfer(trace: dict[str, list[dict]], since: float) -> Optional[dict]:
    """Buffer's batch_out to the learner's batch_in, paired in order per buffer (one learner)."""
    learners = [s for s in trace if s.startswith("learner-")]
    buffers = [s for s in trace if s.startswith("buffer-")]
    if len(learners) != 1 or len(buffers) != 1:
        return None
    outs = [e["t"] for e in trace[buffers[0]] if e["ev"] == "batch_out"]
    ins = [e["t"] for e in trace[learners[0]] if e["ev"] == "batch_in"]
    return _q([i - o for o, i in zip(outs, ins) if o >= since and i >= o])


def analyse(directory: Path, skip: float = 3.0) -> dict:
    trace = read_trace(directory)
    learners = [s for s in trace if s.startswith("learner-")]
    if not learners:
        return {"error": f"no learner trace in {directory}"}
    lev = trace[learners[0]]
    first = next((e["t"] for e in lev if e["ev"] == "update"), None)
    if first is None:
        return {"error": "the learner never updated"}
    since = first + skip
    publishes: dict[int, float] = {}
    for e in lev:
        if e["ev"] == "publish":
            publishes.setdefault(e["v"], e["t"])
    return {"skip_s": skip, "roles": sorted(trace), "learner": _learner(lev, since),
            "actors": _actors(trace, publishes, since), "buffer_to_learner_s": _transfer(trace, since)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the TIANJI_TRACE folder of a run")
    ap.add_argument("--skip", type=float, default=3.0, help="seconds after the first update not counted")
    ap.add_argument("--out", help="write the JSON here too")
    a = ap.parse_args(argv)
    doc = analyse(Path(a.dir), a.skip)
    text = json.dumps(doc, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
