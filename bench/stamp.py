"""Where a benchmark's JSON comes from: the command that printed it, when, and on what machine.
bench/report.py puts these beside every figure it renders from the JSON."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def stamp(script: str, argv: list[str]) -> dict:
    """`script`: the file under bench/; `argv`: its arguments as given."""
    return {"command": " ".join(["python", f"bench/{script}", *argv]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores, {cpu_name()}"}


def emit(result: dict, out: str | None) -> None:
    """Print the result as JSON and, with `out`, write the same text there (docs/*.json)."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
