"""The calibration replayed on a committed sweep, as if its platform had no table: the calibration
(``calibration.strategy``, the code GPUs run) requests its points from the sweep, which answers with what it
measured there, and pays for each what the sweep spent on such a point (``fixed_cost_s``, plus the calls). Then
every (op, place, mode, size) of the sweep is answered by the calibrated table's ``select`` among what 'auto' may
choose there (``options.candidates``, as far as the sweep measured it) and scored against a noise-tolerant truth.

* **truth**: each candidate's median over its size and the two neighbouring sizes (below 1 MB a single point is
  partly luck); **regret** of a pick: its truth over the best candidate's truth at that size;
* **floor**: the sweep's own per-point best (the in-sample pick a table derived from that very sweep makes), scored
  the same way: where even it misses a target, the sweep's noise is larger than the target and cannot resolve it;
* **fallback**: ``options.fallback`` (eager calls prerecorded); **fallback before**: without prerecording.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dmacoll.lab_api import calibration_strategy as strategy, options, tuning
from . import load

BUDGET_S = 20.0
TARGETS = {"median": 1.02, "max below 1 MB": 1.30, "max from 1 MB": 1.10, "vs fallback": 1.05}
PICKS = ("calibrated", "fallback", "fallback before", "floor")
MB = 1 << 20


@dataclass
class Sweep:
    """A platform's committed operator sweeps, as the calibration sees them."""

    paths: list[str]
    world: int
    times: dict[strategy.Point, float]   # per candidate point: the sweep's time (us per call)
    space: dict[tuple, list[tuning.Choice]]  # per (op, place, mode): the candidates 'auto' may choose it measured
    sizes: list[int]
    fixed_s: float                        # per point: what the sweep spent besides the calls


def sweep(paths: list[str]) -> Sweep:
    df = load.read("operator", paths)
    dma = df[(df["impl"] == "dma") & df["ok"] & (df["handshake"] == "full")]
    times: dict[strategy.Point, float] = {}
    for r in dma.itertuples():
        choice = tuning.Choice(r.variant, r.direction, r.signal, r.wait, bool(r.prerecord), r.submit)
        times[strategy.Point(r.op, r.place, r.mode, choice, int(r.bytes_per_rank))] = float(r.time_us)
    space: dict[tuple, list[tuning.Choice]] = {}
    for key in sorted({p.key for p in times}):
        allowed = set(options.choices(options.candidates(options.EngineCapabilities("cuda"), eager=key[2] == "eager")))
        space[key] = sorted({p.choice for p in times if p.key == key} & allowed)
    return Sweep(paths, int(dma["world"].iloc[0]), times, space, sorted({p.size for p in times}), fixed_cost_s(paths))


def fixed_cost_s(paths: list[str]) -> float:
    """Seconds per point a sweep spent besides its timed calls: its runs' wall time (the last progress line of each
    run.log) less warm-up, timed and checking calls at their measured times, over its points."""
    wall = points = calls_s = 0.0
    for path in paths:
        log = (Path(path).parent / "run.log").read_text()
        last = re.findall(r"^\[\s*(\d+)/\s*\d+\s+(\d+)s\]", log, re.M)[-1]
        points, wall = points + int(last[0]), wall + int(last[1])
        cfg = load.provenance(path)["config"]
        df = load.read("operator", [path])
        per_point = cfg["warmup"] + cfg["calls"] * cfg["repeats"] + 1 + (df["mode"] == "graph") * cfg["calls"]
        calls_s += float((df["time_us"].fillna(0) * per_point).sum()) * 1e-6
    return (wall - calls_s) / points


def calibrate(s: Sweep, budget_s: float = BUDGET_S) -> tuple[strategy.Strategy, float]:
    """The calibration on ``s``'s points; its estimated seconds."""
    timing, spent = strategy.Timing(), [0.0]

    def measure(points: list[strategy.Point]) -> dict[strategy.Point, float]:
        got = {p: s.times[p] for p in points}
        spent[0] += sum(s.fixed_s + timing.calls_per_point(p.mode) * t * 1e-6 for p, t in got.items())
        return got

    plan = strategy.Strategy(s.space, s.sizes)
    strategy.run(plan, measure, lambda: spent[0], budget_s, timing)
    return plan, spent[0]


def truth(s: Sweep) -> dict[tuple, dict[tuning.Choice, float]]:
    """Per (op, place, mode, size): each candidate's median over the size and its neighbours (one at the smallest
    and largest size: every candidate alike, so a size trend cancels in the regrets)."""
    out = {}
    for key, choices in s.space.items():
        for size in s.sizes:
            near = [n for n in (size // 2, size, size * 2) if n in s.sizes]
            out[(*key, size)] = {c: statistics.median(s.times[strategy.Point(*key, c, n)] for n in near)
                                 for c in choices}
    return out


def picks(s: Sweep, plan: strategy.Strategy) -> pd.DataFrame:
    """Per (op, place, mode, size): the regret of each pick (module docstring) and of the pick over the fallback."""
    table = tuning.TuningTable({}, plan.entries())
    best = truth(s)
    rows = []
    for (op, place, mode), choices in s.space.items():
        allowed = {name: {getattr(c, name) for c in choices} for name in tuning.CHOSEN}
        fallback = options.fallback(allowed)
        for size in s.sizes:
            t = best[(op, place, mode, size)]
            here = {"calibrated": table.select(op, size, mode, place == "in", allowed), "fallback": fallback,
                    "fallback before": fallback._replace(prerecord=False),
                    "floor": min(choices, key=lambda c: s.times[strategy.Point(op, place, mode, c, size)])}
            low = min(t.values())
            rows.append({"op": op, "place": place, "mode": mode, "bytes_per_rank": size,
                         **{name: t[c] / low for name, c in here.items()},
                         "calibrated vs fallback": t[here["calibrated"]] / t[fallback],
                         "floor vs fallback": t[here["floor"]] / t[fallback]})
    return pd.DataFrame(rows)


def summary(regrets: pd.DataFrame) -> pd.DataFrame:
    """Per mode and pick: median regret, max below and from 1 MB, worst over the fallback."""
    rows = []
    for mode, part in regrets.groupby("mode", sort=False):
        small, large = part[part["bytes_per_rank"] < MB], part[part["bytes_per_rank"] >= MB]
        for name in PICKS:
            vs = {"calibrated": "calibrated vs fallback", "floor": "floor vs fallback"}.get(name)
            rows.append({"mode": mode, "pick": name, "median": part[name].median(),
                         "max below 1 MB": small[name].max(), "max from 1 MB": large[name].max(),
                         "vs fallback": part[vs].max() if vs else (part[name] / part["fallback"]).max()})
    return pd.DataFrame(rows)


def targets(regrets: pd.DataFrame, seconds: float, budget_s: float = BUDGET_S) -> pd.DataFrame:
    """Each target of issue 34 per mode: the calibration's value, the floor's, whether the data resolves it (the
    floor meets it) and whether the calibration meets it; and the budget."""
    s = summary(regrets).set_index(["mode", "pick"])
    rows = [{"mode": "both", "target": "seconds (estimated)", "limit": budget_s, "calibrated": seconds,
             "floor": float("nan"), "resolvable": True, "met": seconds <= budget_s}]
    for mode in s.index.get_level_values(0).unique():
        for name, limit in TARGETS.items():
            got, floor = s.loc[(mode, "calibrated"), name], s.loc[(mode, "floor"), name]
            rows.append({"mode": mode, "target": name, "limit": limit, "calibrated": got, "floor": floor,
                         "resolvable": floor <= limit, "met": got <= limit})
    return pd.DataFrame(rows)


def replay(paths: list[str], budget_s: float = BUDGET_S) -> tuple[Sweep, strategy.Strategy, float, pd.DataFrame]:
    s = sweep(paths)
    plan, seconds = calibrate(s, budget_s)
    return s, plan, seconds, picks(s, plan)
