"""An opt-in event trace of the data path, for finding where a policy version's cycle goes.

With `TIANJI_TRACE=<dir>` in its environment, each role process appends one JSON line per event
to `<dir>/<sender>.jsonl`: the learner's batches, updates and publishes, the actors' parameter
arrivals and fragments, the buffers' fragments in and batches out. Times are `time.monotonic()`,
one clock for every process of a machine. `bench/pipeline_trace.py` joins the files into the
cycle of each version: publish, arrival at the actors, the session that acts with it, the batch
that carries it and the update that consumes it.

Off (the default) it costs one attribute test per event. It is a measuring tool for a run you own:
an actor runs user env code, so nothing reads these files back into a job.
"""
from __future__ import annotations

import json
import os
import time
from typing import IO, Optional

ENV_TRACE = "TIANJI_TRACE"


class Trace:
    def __init__(self, sender: str, directory: Optional[str] = None):
        directory = directory if directory is not None else os.environ.get(ENV_TRACE)
        self._f: Optional[IO[str]] = None
        if directory:
            os.makedirs(directory, exist_ok=True)
            self._f = open(os.path.join(directory, f"{sender}.jsonl"), "a", buffering=1 << 16)

    @property
    def on(self) -> bool:
        return self._f is not None

    def __call__(self, event: str, t: Optional[float] = None, **fields) -> None:
        if self._f is not None:
            fields["t"] = round(time.monotonic() if t is None else t, 6)
            fields["ev"] = event
            self._f.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
