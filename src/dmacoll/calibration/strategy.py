"""What a calibration measures and what it picks: pure, so the same code runs on GPUs (``measure``) and replays a
committed sweep (``analysis.calibration_replay``).

1. Every candidate at the anchor sizes (1 KB, 64 KB, 4 MB, 256 MB: those up to the largest size, and that size).
2. Per size of the grid (powers of two), each candidate's time estimated by log-log interpolation between its
   anchors, and the ``top`` best estimates measured there (fewer where the budget would not hold).
3. A candidate's value at a size: the median of its measurements at that size and its two neighbours (below
   1 MB one point is partly luck: two identical sweeps differ by a median 4% and up to 37% there; where the time
   grows with the size, the middle one), its measurement where it lacks a neighbour, its estimate where it was
   not measured. While the best candidate at a size lacks a measurement there or at a neighbouring size, it is
   measured there too.
4. The table: per (op, place, mode, size) and combination of the options 'auto' chooses, the best variant and
   direction by value, the value as its ``time_us`` (so ``TuningTable.select`` picks what step 3 found best).

The budget: after step 1, a point's fixed cost (what is not the calls themselves) is known; step 2 measures the
largest ``top`` whose estimated cost still fits, step 3 stops when the next round would not.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from ..tuning import CHOSEN, Choice, Entry

ANCHORS = (1 << 10, 64 << 10, 4 << 20, 256 << 20)
MIN_BYTES = 1 << 10
TOP = 3  # candidates measured per size after the anchors

Key = tuple  # (op, place, mode)


class Point(NamedTuple):
    op: str
    place: str
    mode: str
    choice: Choice
    size: int

    @property
    def key(self) -> Key:
        return self.op, self.place, self.mode

    def call_options(self) -> dict:
        """The keywords of the timed call: every option fixed to the candidate's."""
        return self.choice._asdict()


@dataclass(frozen=True)
class Timing:
    """How one point is timed: ``warmup`` calls, then ``repeats`` samples of ``calls`` back-to-back calls (a graph
    of ``calls`` calls replayed, in graph mode), the median sample per rank, the slowest rank's."""

    warmup: int = 2
    calls: int = 4
    repeats: int = 5

    def calls_per_point(self, mode: str) -> int:
        """Calls a point runs (graph mode: the replay that uploads the graph too)."""
        return self.warmup + self.calls * self.repeats + (self.calls if mode == "graph" else 0)


def grid(max_bytes: int, min_bytes: int = MIN_BYTES) -> list[int]:
    """The sizes a calibrated table holds: powers of two from ``min_bytes`` to ``max_bytes``."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


class Strategy:
    """The state of one calibration over ``space`` (per (op, place, mode), the choices to compare) and ``sizes``."""

    def __init__(self, space: Mapping[Key, Sequence[Choice]], sizes: Sequence[int], top: int = TOP):
        if not sizes or any(not c for c in space.values()):
            raise ValueError("a calibration needs sizes and at least one choice per (op, place, mode)")
        self.space = {key: list(choices) for key, choices in space.items()}
        self.sizes = sorted(sizes)
        self.anchors = sorted({s for s in ANCHORS if self.sizes[0] <= s <= self.sizes[-1]} | {self.sizes[-1]})
        self.top = top
        self.measured: dict[Point, float] = {}

    def points(self, key: Key, sizes: Iterable[int]) -> list[Point]:
        return [Point(*key, c, s) for s in sizes for c in self.space[key]]

    # -- what to measure -------------------------------------------------------------------------------------
    def first(self) -> list[Point]:
        """Every candidate at every anchor."""
        return [p for key in self.space for p in self.points(key, self.anchors)]

    def refine(self, top: int) -> list[Point]:
        """Per (op, place, mode) and size, the ``top`` candidates of lowest estimate not measured there yet."""
        out = []
        for key, choices in self.space.items():
            for s in self.sizes:
                ranked = sorted(choices, key=lambda c: self.estimate(key, c, s))[:top]
                out += [p for p in (Point(*key, c, s) for c in ranked) if p not in self.measured]
        return out

    def unsettled(self) -> list[Point]:
        """Per (op, place, mode) and size, the best candidate's points still missing there and at the neighbouring
        sizes (a value from a single point may be luck)."""
        out: dict[Point, None] = {}
        for key in self.space:
            for s in self.sizes:
                best = self.pick(key, s)
                near = [n for n in (s // 2, s, s * 2) if self.sizes[0] <= n <= self.sizes[-1]]
                out.update((p, None) for p in (Point(*key, best, n) for n in near) if p not in self.measured)
        return list(out)

    def record(self, results: Mapping[Point, float]) -> None:
        self.measured.update({p: max(float(t), 1e-3) for p, t in results.items()})

    # -- what was learnt -------------------------------------------------------------------------------------
    def estimate(self, key: Key, choice: Choice, size: int) -> float:
        """Log-log interpolation between the candidate's anchors (the nearest anchor's time beyond them)."""
        xs = [(math.log2(a), math.log(self.measured[Point(*key, choice, a)])) for a in self.anchors]
        x = math.log2(size)
        if x <= xs[0][0]:
            return math.exp(xs[0][1])
        for (x0, y0), (x1, y1) in zip(xs, xs[1:]):
            if x <= x1:
                return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
        return math.exp(xs[-1][1])

    def value(self, key: Key, choice: Choice, size: int) -> float:
        """The median of the candidate's measurements at ``size`` and both neighbours where it has all three (of a
        time that grows with the size, the middle one: only noise moves it), else its measurement at ``size``, else
        its estimate."""
        near = [self.measured.get(Point(*key, choice, s)) for s in (size // 2, size, size * 2)]
        if near[1] is None:
            return self.estimate(key, choice, size)
        return near[1] if None in near else statistics.median(near)

    def pick(self, key: Key, size: int) -> Choice:
        return min(self.space[key], key=lambda c: self.value(key, c, size))

    def entries(self) -> list[Entry]:
        """The table (module docstring, step 4)."""
        out = []
        for (op, place, mode), choices in self.space.items():
            for s in self.sizes:
                best: dict[tuple, tuple[float, Choice]] = {}
                for c in choices:
                    combination, v = tuple(getattr(c, name) for name in CHOSEN), self.value((op, place, mode), c, s)
                    if combination not in best or v < best[combination][0]:
                        best[combination] = (v, c)
                out += [Entry(op, mode, place, s, c.variant, c.direction, round(v, 4), c.signal, c.wait, c.prerecord,
                              c.submit) for v, c in best.values()]
        return out


def run(strategy: Strategy, measure: Callable[[list[Point]], Mapping[Point, float]], spent: Callable[[], float],
        budget_s: float, timing: Timing) -> Strategy:
    """Steps 1-3 within ``budget_s`` seconds: ``measure`` times points (microseconds per call, the same on every
    rank), ``spent`` says the seconds used so far (the clock, or a replay's cost model)."""
    first = strategy.first()
    strategy.record(measure(first))
    calls_s = sum(timing.calls_per_point(p.mode) * strategy.measured[p] for p in first) * 1e-6
    fixed_s = max(0.0, spent() - calls_s) / len(first)  # per point: what is not the calls

    def cost(points: list[Point]) -> float:
        return sum(fixed_s + timing.calls_per_point(p.mode) * strategy.estimate(p.key, p.choice, p.size) * 1e-6
                   for p in points)

    for k in range(strategy.top, 0, -1):
        points = strategy.refine(k)
        if spent() + cost(points) <= budget_s:
            strategy.record(measure(points))
            break
    while True:
        points = strategy.unsettled()
        if not points or spent() + cost(points) > budget_s:
            return strategy
        strategy.record(measure(points))
