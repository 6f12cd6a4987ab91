"""Automatic configuration from a measured tuning table: what 'auto' options resolve to.

A table holds, per (op, mode, place, message size) and per measured combination of the options a caller may
leave to the library (``CHOSEN``: signal, wait, prerecord, submit), the fastest (variant, direction) a sweep of
the dma configurations measured (``dmacoll tune``), with its time. ``select`` answers a call: among the
combinations the caller and the backend allow (an option the caller fixed allows its value only; the
resolution leaves out what the engine cannot run), each combination's entry of the smallest measured size at
or above the message (the largest if the message is bigger than any), then the fastest of those. Mode is
``graph`` while a CUDA graph is being captured, else ``eager``; a place without entries takes the out-of-place
ones. The handshake is never chosen: the lean one needs the caller's promise. Tables are JSON with the provenance
of the sweep they come from; the package ships one per measured platform; tables from before the wait, prerecord
and submit columns hold memop-wait, not prerecorded, Python-submitted entries.

A calibrated table also holds, per (op, mode, size), each data path's time (``PathEntry``: ``dma``, ``sm``,
``nccl``, measured with the path forced and the rest left to 'auto'), from which ``fastest_path`` answers which path
'auto' takes; tables without them (the shipped ones) leave that to ``options.choose_path``'s measured constants.

A table is for a ``Platform``: a shipped table stands for its hardware (GPU, world, topology), whatever the driver;
a calibrated one (``dmacoll.calibration``) for exactly the platform it was measured on, driver and dmacoll code
included. What 'auto' may choose on an engine, and how a call's options are resolved from a table, is
``dmacoll.options``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Collection, Mapping, NamedTuple, Optional

DEFAULT_DIRECTORY = "tuning_tables"  # package data: src/dmacoll/tuning_tables/*.json
CHOSEN = ("signal", "wait", "prerecord", "submit")  # besides variant and direction, what 'auto' may choose


class Choice(NamedTuple):
    variant: str
    direction: str
    signal: str
    wait: str
    prerecord: bool
    submit: str


class Platform(NamedTuple):
    """What a tuning table was measured on: the GPU's name, the ranks, how they are connected (``nvlink``,
    ``pcie``, ``shared-device``: several ranks on one GPU, ``host``: the CPU emulator, ``unknown``), the driver
    and dmacoll's code version."""

    gpu: str
    world: int
    topology: str = "unknown"
    driver: str = ""
    dmacoll: str = ""


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
    wait: str = "memop"
    prerecord: bool = False
    submit: str = "python"

    @property
    def combination(self) -> tuple:
        return self.signal, self.wait, self.prerecord, self.submit


@dataclass(frozen=True)
class PathEntry:
    """A data path's time for an (op, mode, size): ``path`` forced, every other option 'auto'."""

    op: str
    mode: str
    bytes_per_rank: int
    path: str
    time_us: float


class TuningTable:
    def __init__(self, meta: dict, entries: list[Entry], paths: Optional[list[PathEntry]] = None):
        self.meta = meta
        self.entries = entries
        self.paths = list(paths or ())
        # (op, mode) -> size -> path -> time
        self._paths: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
        for e in self.paths:
            self._paths.setdefault((e.op, e.mode), {}).setdefault(e.bytes_per_rank, {})[e.path] = e.time_us
        # (op, mode, place) -> combination -> entries by size
        self._by_key: dict[tuple[str, str, str], dict[tuple, list[Entry]]] = {}
        for e in sorted(entries, key=lambda e: e.bytes_per_rank):
            self._by_key.setdefault((e.op, e.mode, e.place), {}).setdefault(e.combination, []).append(e)

    @classmethod
    def load(cls, path: str | Path) -> "TuningTable":
        return cls.from_json(Path(path).read_text())

    @classmethod
    def from_json(cls, text: str) -> "TuningTable":
        data = json.loads(text)
        return cls({k: v for k, v in data.items() if k not in ("entries", "paths")},
                   [Entry(**e) for e in data["entries"]], [PathEntry(**e) for e in data.get("paths", ())])

    def to_json(self) -> str:
        paths = {"paths": [e.__dict__ for e in self.paths]} if self.paths else {}
        return json.dumps({**self.meta, "entries": [e.__dict__ for e in self.entries], **paths}, indent=1) + "\n"

    def matches(self, platform: Platform, exact: bool = False) -> bool:
        """Whether this table stands for ``platform``: the same world, a GPU whose name contains the table's, and
        the same topology where both state one; ``exact`` (a calibrated table): every field equal."""
        m = self.meta
        if exact:
            return all(m.get(name) == value for name, value in platform._asdict().items())
        return (m.get("world") == platform.world and m.get("gpu", "") in platform.gpu
                and platform.topology in (m.get("topology", platform.topology), "unknown"))

    def select(self, op: str, nbytes: int, mode: str, in_place: bool,
               allowed: Optional[Mapping[str, Collection]] = None) -> Optional[Choice]:
        """The fastest measured configuration the call may use (``allowed``: option -> the values it may take,
        every value where an option is missing), or None where the table has none."""
        allowed = allowed or {}
        combos = self._by_key.get((op, mode, "in" if in_place else "out")) or self._by_key.get((op, mode, "out"))
        best: Optional[Entry] = None
        for combination, rows in (combos or {}).items():
            if any(name in allowed and value not in allowed[name] for name, value in zip(CHOSEN, combination)):
                continue
            entry = next((e for e in rows if e.bytes_per_rank >= nbytes), rows[-1])
            if best is None or entry.time_us < best.time_us:
                best = entry
        if best is None:
            return None
        return Choice(best.variant, best.direction, best.signal, best.wait, best.prerecord, best.submit)

    def measured_paths(self, op: str) -> bool:
        """Whether the table holds path times for ``op`` (a calibrated table's ``PathEntry`` rows)."""
        return any(key[0] == op for key in self._paths)

    def fastest_path(self, op: str, nbytes: int, mode: str, allowed: Collection[str], favour: str = "",
                     margin: float = 0.0) -> Optional[str]:
        """Of the ``allowed`` paths, the fastest measured for ``op`` at the smallest measured size at or above
        ``nbytes`` (the largest where the call is bigger), the ``favour``ed one unless another took less than
        ``1 - margin`` of its time; None where the table measured none of them there."""
        by_size = self._paths.get((op, mode))
        if not by_size:
            return None
        size = min((s for s in by_size if s >= nbytes), default=max(by_size))
        times = {path: t for path, t in by_size[size].items() if path in allowed}
        if not times:
            return None
        best = min(times, key=times.get)
        return favour if favour in times and times[best] >= (1 - margin) * times[favour] else best


def shipped_tables() -> list[Path]:
    folder = resources.files("dmacoll") / DEFAULT_DIRECTORY
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json")) if folder.is_dir() else []


def find(platform: Platform, path: Optional[str] = None) -> Optional[TuningTable]:
    """The given table, else the first shipped one measured on this platform, else None."""
    if path:
        return TuningTable.load(path)
    for p in shipped_tables():
        table = TuningTable.load(p)
        if table.matches(platform):
            return table
    return None
