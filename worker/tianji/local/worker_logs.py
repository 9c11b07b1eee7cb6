"""What the launcher tells the user when a worker dies: the exception that ended it.

A worker logs its traceback to its own file (logs/<role>-<g>-<i>.log) before it exits
(tianji.runtime.worker); the launcher's one-line restart notice quotes the traceback's
last line so that a fault in user code (an env that raises in step) is seen without
opening the file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

TAIL_BYTES = 64 * 1024
MAX_LINE = 300


def last_exception(log: Path, since: int = 0) -> Optional[str]:
    """The exception line of the newest traceback in the log's tail after byte `since` (where this
    incarnation began writing: the file is shared by all of a worker's restarts), or None."""
    try:
        with open(log, "rb") as f:
            f.seek(max(since, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    start = tail.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    for line in tail[start:].splitlines()[1:]:
        if line.strip() and not line.startswith((" ", "\t")):  # frames are indented; the exception is not
            return line.strip()[:MAX_LINE]
    return None
