"""Where dmacoll keeps files between processes: $DMACOLL_CACHE, else $XDG_CACHE_HOME/dmacoll, else ~/.cache/dmacoll.
It holds the calibrated tables, the native submission library built on first use and the compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path


def directory() -> Path:
    if os.environ.get("DMACOLL_CACHE"):
        return Path(os.environ["DMACOLL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dmacoll"
