"""The path calibration replayed on the committed default-call runs (issue 49: 'auto' picks the path from a
calibration that measures them). Each run (``machines.DEFAULT_CALL_RUNS``: a small and a large run of one number)
stands in turn for a calibration: ``dmacoll.calibration.paths`` (the code GPUs run) asks it for the paths' times it
would measure (the rows ``path='dma'``, ``path='sm'`` as it runs by default: ``sm_impl``, NCCL), and the table it makes answers
every (op, mode, size) of the *other* runs through ``TuningTable.fastest_path`` with ``options.PATH_MARGIN``, among
the paths that run there. Scored in those other runs: the picked path's time over NCCL's, beside the path the
measured constants took there (the ``default`` rows' path, its forced row's time), so both are scored alike.
Out of sample for the calibration, in sample for the constants (they were set from these runs).
"""
from __future__ import annotations

import math
import re

import pandas as pd

from dmacoll.lab_api import calibration_paths as paths, cuda_sm, options, tuning

# the probe's implementations that time one path forced; an all_reduce's sm path is the probe's one-kernel or
# two-kernel row, whichever the path runs at that size by default (``sm_impl``)
PATH_OF_IMPL = {"dma": "dma", "nccl": "nccl", "sm": "sm", "sm_one_shot": "sm", "sm_two_shot": "sm"}
RUN = re.compile(r"_run(\d+)/")


def sm_impl(op: str, world: int, nbytes: int) -> str:
    """The probe row that times the sm path as it runs by default: for all_reduce one kernel below
    ``cuda_sm.default_two_shot_bytes``, two from there."""
    if op != "all_reduce":
        return "sm"
    two = cuda_sm.default_two_shot_bytes(world, cuda_sm.slot_bytes(world))
    return "sm_two_shot" if nbytes >= two else "sm_one_shot"


def run_of(source: object) -> str:
    """A row's run number (its folder's ``_run<n>``: the small and the large run of one number go together), else its
    source."""
    found = RUN.search(str(source).replace("\\", "/") + "/")
    return found.group(1) if found else str(source)


def run_times(rows: pd.DataFrame) -> dict[str, dict[paths.PathPoint, float]]:
    """Per run number (a small and a large run together), each path's time per (op, mode, size); a row that failed
    its check or did not run is missing (the path does not run there)."""
    out: dict[str, dict[paths.PathPoint, float]] = {}
    for r in rows[rows["impl"].isin(list(PATH_OF_IMPL))].itertuples():
        if str(r.correct) != "True" or pd.isna(r.per_call_us) or (
                r.impl.startswith("sm") and r.impl != sm_impl(r.op, int(r.world), int(r.bytes))):
            continue
        point = paths.PathPoint(r.op, r.mode, PATH_OF_IMPL[r.impl], int(r.bytes))
        out.setdefault(run_of(r.source), {})[point] = float(r.per_call_us)
    return out


def calibrate(times: dict[paths.PathPoint, float]) -> tuning.TuningTable:
    """The table a path calibration makes when ``times`` answer it (no budget: every round it asks for)."""
    keys = sorted({(p.op, p.mode) for p in times})
    sizes = sorted({p.size for p in times})
    search = paths.PathSearch({key: ["dma", "sm", "nccl"] for key in keys}, sizes)
    paths.run(search, lambda points: {p: times.get(p, math.inf) for p in points}, lambda: 0.0, math.inf)
    return tuning.TuningTable({}, [], search.entries())


def scored(rows: pd.DataFrame, margin: float = options.PATH_MARGIN) -> pd.DataFrame:
    """One row per (calibrating run, scored run, op, mode, size): the calibrated pick and the constants' path, each
    one's time over NCCL's in the scored run, and the points the calibration measured."""
    times = run_times(rows)
    constants = {(run_of(r.source), r.op, r.mode, int(r.bytes)): str(r.path)
                 for r in rows[rows["impl"] == "default"].itertuples()}
    out = []
    for k, measured in times.items():
        table = calibrate(measured)
        for j, other in times.items():
            if j == k:
                continue
            at: dict[tuple, dict[str, float]] = {}
            for q, t in other.items():
                at.setdefault((q.op, q.mode, q.size), {})[q.path] = t
            for (op, mode, size), here in sorted(at.items()):
                if "nccl" not in here:
                    continue
                pick = table.fastest_path(op, size, mode, set(here), "nccl", margin) or "nccl"
                constant = constants.get((j, op, mode, size), "")
                out.append({"calibrated on": k, "scored on": j, "op": op, "mode": mode, "bytes": size,
                            "pick": pick, "constants": constant, "pick / NCCL": here[pick] / here["nccl"],
                            "constants / NCCL": here[constant] / here["nccl"] if constant in here else math.nan,
                            "points": len(table.paths)})
    return pd.DataFrame(out)


def summary(rows: pd.DataFrame, margin: float = options.PATH_MARGIN) -> pd.DataFrame:
    """Per mode: the points scored, how often the calibrated pick and the constants agree, and for each the median
    and largest time over NCCL's and the points above 1.00 and 1.03."""
    s = scored(rows, margin)
    out = []
    for mode, at in s.groupby("mode", sort=False):
        row = {"mode": mode, "points": len(at), "same path": f"{(at['pick'] == at['constants']).mean():.0%}"}
        for who, column in (("calibrated", "pick / NCCL"), ("constants", "constants / NCCL")):
            v = at[column].dropna()
            row.update({f"{who}: median": round(float(v.median()), 3), f"{who}: max": round(float(v.max()), 3),
                        f"{who}: > 1.00": int((v > 1.0).sum()), f"{who}: > 1.03": int((v > 1.03).sum())})
        out.append(row)
    return pd.DataFrame(out)
