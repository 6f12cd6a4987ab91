"""Which data path 'auto' takes, measured: pure, so the same code runs on GPUs (``lookup.calibrate`` with
``measure.Bench``) and replays the committed default-call runs (the lab's ``analysis.path_replay``).

Per (op, mode) of ``options.NCCL_AUTO_OPS`` and each path the platform runs (``dma``, ``sm``, ``nccl``):

1. every path at every other size of the grid (1 KB, 4 KB, 16 KB, ...) and the largest;
2. while the budget holds: between two neighbouring measured sizes whose fastest paths differ, every path at the
   size halfway (in log), until the crossover is found to the grid's resolution.

A path that refuses a size (the sm path above its slots) is no candidate there. The table holds every measured
time (``tuning.PathEntry``); ``TuningTable.fastest_path`` answers a call from the smallest measured size at or above
its own.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple, Sequence

from ..tuning import PathEntry

Key = tuple  # (op, mode)


class PathPoint(NamedTuple):
    op: str
    mode: str
    path: str
    size: int
    place: str = "out"

    def call_options(self) -> dict:
        """The keywords of the timed call: the path forced, every other option left to 'auto'."""
        return {"path": self.path}


class PathSearch:
    """The state of one search over ``space`` (per (op, mode), the paths to compare) and ``sizes`` (the grid)."""

    def __init__(self, space: Mapping[Key, Sequence[str]], sizes: Sequence[int]):
        if not sizes or any(len(paths) < 2 for paths in space.values()):
            raise ValueError("a path search needs sizes and at least two paths per (op, mode)")
        self.space = {key: list(paths) for key, paths in space.items()}
        self.sizes = sorted(sizes)
        self.measured: dict[PathPoint, float] = {}  # math.inf: the path refused the size

    def points(self, key: Key, size: int) -> list[PathPoint]:
        return [PathPoint(*key, path, size) for path in self.space[key]]

    def first(self) -> list[PathPoint]:
        """Every path at every other size and the largest (step 1)."""
        coarse = sorted(set(self.sizes[::2]) | {self.sizes[-1]})
        return [p for key in self.space for s in coarse for p in self.points(key, s)]

    def refine(self) -> list[PathPoint]:
        """Every path at the grid size halfway between two neighbouring measured sizes that disagree (step 2)."""
        out = []
        for key in self.space:
            done = self.done_sizes(key)
            for low, high in zip(done, done[1:]):
                if self.fastest(key, low) == self.fastest(key, high):
                    continue
                between = [s for s in self.sizes if low < s < high]
                if between:
                    out += self.points(key, between[len(between) // 2])
        return out

    def record(self, results: Mapping[PathPoint, float]) -> None:
        self.measured.update({p: max(float(t), 1e-3) for p, t in results.items()})

    def done_sizes(self, key: Key) -> list[int]:
        return sorted({p.size for p in self.measured if (p.op, p.mode) == key})

    def fastest(self, key: Key, size: int) -> str:
        """The fastest path measured at ``size`` ('' where every path refused it)."""
        times = {p.path: t for p in self.points(key, size) if (t := self.measured.get(p, math.inf)) < math.inf}
        return min(times, key=times.get) if times else ""

    def entries(self) -> list[PathEntry]:
        return [PathEntry(p.op, p.mode, p.size, p.path, round(t, 4))
                for p, t in sorted(self.measured.items()) if t < math.inf]


def run(search: PathSearch, measure: Callable[[list[PathPoint]], Mapping[PathPoint, float]],
        spent: Callable[[], float], budget_s: float) -> PathSearch:
    """Steps 1-2, each round only where the budget still holds the previous round's cost per point."""
    start = spent()
    first = search.first()
    search.record(measure(first))
    per_point = (spent() - start) / len(first)
    while True:
        points = search.refine()
        if not points or spent() + per_point * len(points) > budget_s:
            return search
        search.record(measure(points))
