"""Automatic variant selection from a measured tuning table.

A table maps (op, mode, place, signal, message size) to the fastest (variant,
direction) measured by a sweep of the dma variants (``dmacoll tune``): the signal
mode stays the caller's choice (only ``kernel`` uses an SM, and a spinning flag
kernel can wait behind a GEMM that fills the GPU), 'auto' picks the rest for it. ``select`` picks the
entry of the smallest measured size at or above the message (the largest if the
message is bigger than any), for the call's mode (``graph`` while a CUDA graph
is being captured, else ``eager``). Tables are JSON with the provenance of the
sweep they come from; the package ships one per measured platform.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

DEFAULT_DIRECTORY = "tuning_tables"  # package data: src/dmacoll/tuning_tables/*.json
FALLBACK = ("pcpy", "push")


@dataclass(frozen=True)
class Entry:
    op: str
    mode: str
    place: str
    bytes_per_rank: int
    variant: str
    direction: str
    time_us: float
    signal: str = "memop"  # tables from before signal modes were measured hold memop entries only


class TuningTable:
    def __init__(self, meta: dict, entries: list[Entry]):
        self.meta = meta
        self.entries = entries
        self._by_key: dict[tuple[str, str, str, str], list[Entry]] = {}
        for e in sorted(entries, key=lambda e: e.bytes_per_rank):
            self._by_key.setdefault((e.op, e.mode, e.place, e.signal), []).append(e)

    @classmethod
    def load(cls, path: str | Path) -> "TuningTable":
        data = json.loads(Path(path).read_text())
        return cls({k: v for k, v in data.items() if k != "entries"}, [Entry(**e) for e in data["entries"]])

    def to_json(self) -> str:
        return json.dumps({**self.meta, "entries": [e.__dict__ for e in self.entries]}, indent=1) + "\n"

    def matches(self, world: int, device_name: str) -> bool:
        return self.meta.get("world") == world and self.meta.get("gpu", "") in device_name

    def select(self, op: str, nbytes: int, mode: str, in_place: bool, signal: str = "memop") -> tuple[str, str]:
        place = "in" if in_place else "out"
        rows = next((self._by_key[k] for k in ((op, mode, place, signal), (op, mode, "out", signal),
                                                (op, mode, place, "memop"), (op, mode, "out", "memop"))
                     if k in self._by_key), None)
        if not rows:
            return FALLBACK
        for e in rows:
            if e.bytes_per_rank >= nbytes:
                return e.variant, e.direction
        return rows[-1].variant, rows[-1].direction


def shipped_tables() -> list[Path]:
    folder = resources.files("dmacoll") / DEFAULT_DIRECTORY
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json")) if folder.is_dir() else []


def find(world: int, device_name: str, path: Optional[str] = None) -> Optional[TuningTable]:
    """The given table, else the first shipped one measured on this platform, else None."""
    if path:
        return TuningTable.load(path)
    for p in shipped_tables():
        table = TuningTable.load(p)
        if table.matches(world, device_name):
            return table
    return None
