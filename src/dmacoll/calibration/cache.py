"""Calibrated tables in dmacoll's cache directory (``cache_dir``: $DMACOLL_CACHE, else $XDG_CACHE_HOME/dmacoll, else
~/.cache/dmacoll): one file per platform, named after it, taken only where every field of the platform key matches
(``TuningTable.matches``)."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Optional

from .. import cache_dir
from ..tuning import Platform, TuningTable


def path(platform: Platform) -> Path:
    """The file of ``platform``'s table: readable names, and a digest of the whole key (driver, code)."""
    digest = hashlib.sha256(json.dumps(platform._asdict(), sort_keys=True).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9]+", "-", f"{platform.world}x-{platform.gpu}-{platform.topology}").strip("-")
    return cache_dir.directory() / f"tuning-{name}-{digest}.json"


def load(platform: Platform) -> Optional[TuningTable]:
    """The cached table of exactly this platform, or None (none cached, or an unreadable file)."""
    p = path(platform)
    try:
        table = TuningTable.load(p)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return table if table.matches(platform, exact=True) else None


def store(table: TuningTable, platform: Platform) -> Path:
    """Write ``table`` for ``platform`` atomically (a reader never sees half a file)."""
    p = path(platform)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(table.to_json())
    os.replace(tmp, p)
    return p
