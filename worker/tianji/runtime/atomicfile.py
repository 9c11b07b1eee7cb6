"""Write a file so that readers see the old one or the whole new one, never half of it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


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
