"""Write a file so that readers see the old one or the whole new one, never half of it."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(final: Path, tmp: Path, dump: Callable[[BinaryIO], None]) -> Path:
    """`dump` into `tmp` (same directory as `final`), fsync, then rename over `final`."""
    try:
        with open(tmp, "wb") as f:
            dump(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:  # a full disk, a signal: never leave half a file behind
        tmp.unlink(missing_ok=True)
        raise
    return final


def atomic_write_json(path: str | os.PathLike, doc: object) -> Path:
    """`doc` as indented JSON at `path`, through atomic_write (temp file beside it)."""
    final = Path(path)
    return atomic_write(final, final.with_name(final.name + ".tmp"),
                        lambda f: f.write((json.dumps(doc, indent=2) + "\n").encode()))
