"""'auto' takes the data path a calibration measured fastest (issue 49): the path search on synthetic paths, the
table's path rows, and ``choose_path`` reading them (the measured constants where a table has none)."""
from __future__ import annotations

import math
import random

import pytest

from dmacoll import options, tuning
from dmacoll.calibration import paths, strategy
from dmacoll.options import EngineCapabilities, Options, choose_path

CUDA = EngineCapabilities("cuda")
SIZES = strategy.grid(256 << 20)
KEY = ("all_reduce", "graph")


def _synthetic(seed: int, sm_max: int = 4 << 20):
    """Three paths whose time is a latency plus size over a bandwidth, drawn so that they cross: sm lowest latency
    (refusing above ``sm_max``), nccl in between, dma the highest latency and bandwidth."""
    rng = random.Random(seed)
    model = {"sm": (rng.uniform(3, 8), rng.uniform(20, 120)), "nccl": (rng.uniform(9, 16), rng.uniform(150, 300)),
             "dma": (rng.uniform(18, 40), rng.uniform(320, 600))}

    def time(p: paths.PathPoint) -> float:
        if p.path == "sm" and p.size > sm_max:
            return math.inf
        a, b = model[p.path]
        return a + p.size / b / 1e3
    return time


def _run(time, budget_s: float = 1e9, per_point_s: float = 0.01):
    spent = [0.0]

    def measure(points):
        spent[0] += per_point_s * len(points)
        return {p: time(p) for p in points}

    search = paths.PathSearch({KEY: ["dma", "sm", "nccl"]}, SIZES)
    return paths.run(search, measure, lambda: spent[0], budget_s)


def test_the_search_finds_the_fastest_path_at_every_size_with_far_fewer_points(seed):
    time = _synthetic(seed)
    search = _run(time)
    table = tuning.TuningTable({}, [], search.entries())
    for s in SIZES:
        truth = min(("dma", "sm", "nccl"), key=lambda path: time(paths.PathPoint(*KEY, path, s)))
        assert table.fastest_path(*KEY[:1], s, KEY[1], options.PATHS) == truth, (seed, s)
    assert len(search.measured) < 3 * len(SIZES) * 0.75, (seed, len(search.measured))


def test_a_path_that_refuses_a_size_is_never_chosen_there(seed):
    search = _run(_synthetic(seed, sm_max=16 << 10))
    table = tuning.TuningTable({}, [], search.entries())
    assert all(e.path != "sm" or e.bytes_per_rank <= 16 << 10 for e in table.paths)  # refusals are not rows
    assert all(table.fastest_path("all_reduce", s, "graph", options.PATHS) != "sm" for s in SIZES if s > 16 << 10)


def test_the_budget_stops_the_refinement_after_the_first_round(seed):
    search = _run(_synthetic(seed), budget_s=0.0)
    assert set(search.measured) == set(search.first())


def test_a_search_needs_two_paths_and_sizes():
    with pytest.raises(ValueError):
        paths.PathSearch({KEY: ["dma"]}, SIZES)
    with pytest.raises(ValueError):
        paths.PathSearch({KEY: ["dma", "nccl"]}, [])


def _table(rows) -> tuning.TuningTable:
    return tuning.TuningTable({"world": 4}, [], [tuning.PathEntry("all_reduce", mode, size, path, t)
                                                 for mode, size, path, t in rows])


def test_fastest_path_reads_the_smallest_measured_size_at_or_above_the_call():
    table = _table([("graph", 1024, "sm", 5.0), ("graph", 1024, "nccl", 10.0), ("graph", 1024, "dma", 20.0),
                    ("graph", 1 << 20, "sm", 50.0), ("graph", 1 << 20, "nccl", 30.0), ("graph", 1 << 20, "dma", 29.5)])
    assert table.fastest_path("all_reduce", 512, "graph", options.PATHS) == "sm"
    assert table.fastest_path("all_reduce", 1025, "graph", options.PATHS) == "dma"
    assert table.fastest_path("all_reduce", 1 << 30, "graph", options.PATHS) == "dma"  # beyond: the largest size
    # NCCL favoured unless another path took less than 1 - margin of its time
    assert table.fastest_path("all_reduce", 1 << 20, "graph", options.PATHS, "nccl", 0.03) == "nccl"
    assert table.fastest_path("all_reduce", 1024, "graph", options.PATHS, "nccl", 0.03) == "sm"
    assert table.fastest_path("all_reduce", 1024, "graph", ("dma", "nccl")) == "nccl"  # only what the call may take
    assert table.fastest_path("all_reduce", 1024, "graph", ()) is None
    assert table.fastest_path("all_reduce", 1024, "eager", options.PATHS) is None  # not measured eager
    assert table.fastest_path("all_gather", 1024, "graph", options.PATHS) is None
    assert table.measured_paths("all_reduce") and not table.measured_paths("all_gather")


def test_path_rows_survive_json_and_tables_without_them_load_as_before():
    table = _table([("eager", 4096, "nccl", 11.0), ("eager", 4096, "sm", 6.5)])
    again = tuning.TuningTable.from_json(table.to_json())
    assert again.paths == table.paths and again.meta == table.meta
    plain = tuning.TuningTable({"world": 2}, [])
    assert "paths" not in plain.to_json() and not tuning.TuningTable.from_json(plain.to_json()).paths
    for shipped in tuning.shipped_tables():  # measured before paths were: 'auto' keeps the constants there
        assert not tuning.TuningTable.load(shipped).paths, shipped


def test_choose_path_takes_the_measured_path_and_keeps_the_constants_without_one():
    table = _table([("graph", 1024, "sm", 9.0), ("graph", 1024, "nccl", 8.0), ("graph", 1024, "dma", 20.0),
                    ("graph", 64 << 20, "nccl", 900.0), ("graph", 64 << 20, "dma", 700.0)])

    def path(nbytes, sm_bytes=None, nccl=True, staged=True, eager=False, table=table, op="all_reduce", **opts):
        return choose_path(Options(**opts), CUDA, op, sm_bytes, 4, False, nbytes, nccl, staged, eager, table)

    assert path(1024, sm_bytes=256) == "nccl"  # the constants would take sm here: measured slower
    assert path(1024, sm_bytes=256, table=None) == "sm"
    assert path(64 << 20) == "dma"  # the constants would take NCCL below 128 MB at world 4
    assert path(64 << 20, table=None) == "nccl"
    assert path(64 << 20, staged=False) == "nccl"  # the copy engines' sum would not fit the staging area
    assert path(64 << 20, nccl=False) == "dma"
    assert path(1024, sm_bytes=256, nccl=False) == "sm"
    assert path(1024, sm_bytes=256, eager=True) == "sm"  # eager not measured: the constants
    assert path(1024, sm_bytes=256, op="all_to_all_v") == "sm"  # not a path-measured op: the constants
    assert path(1024, sm_bytes=256, path="dma") == "dma" and path(64 << 20, variant="b2b") == "dma"
    assert choose_path(Options(), CUDA, "all_reduce", 256, 4, True, 1024, True, True, False, table) == "dma"  # gated


def test_the_host_calibration_measures_no_paths():
    """The emulator runs the copy engines only (no sm path, no NCCL): nothing to compare."""
    from dmacoll.calibration import lookup

    class Stub:
        capabilities = EngineCapabilities("host", graphs=False, native_submit=False, sm_path=False)
        _nccl = False

    assert lookup._path_space(Stub(), tuning.Platform("cpu", 2, "host")) == {}
    Stub.capabilities, Stub._nccl = CUDA, True
    space = lookup._path_space(Stub(), tuning.Platform("H200", 4, "nvlink"))
    assert set(space) == {(op, mode) for op in options.NCCL_AUTO_OPS for mode in ("graph", "eager")}
    assert all(v == ["dma", "sm", "nccl"] for v in space.values())
    assert lookup._path_space(Stub(), tuning.Platform("H200", 4, "shared-device")) == {}


@pytest.mark.parametrize("machine", ["h200x2", "h200x4"])
def test_replayed_on_the_committed_runs_the_path_calibration_is_never_slower_than_nccl(machine):
    """Each run of the current defaults calibrates, the others score (``analysis.path_replay``): the picked path is
    never more than the margin slower than NCCL, and within 3% of the constants' median."""
    from pathlib import Path

    from dmacoll_lab.analysis import load, machines, path_replay

    runs = [str(p) for p in machines.default_call_runs(Path(__file__).resolve().parents[1] / "results" / machine)]
    summary = path_replay.summary(load.read("probe", runs)).set_index("mode")
    # eager too where the runs' forced rows took the eager fast path (docs/results.md: not the 2-GPU runs)
    for mode in ("graph", "eager") if machine == "h200x4" else ("graph",):
        at = summary.loc[mode]
        assert at["points"] > 100 and at["calibrated: > 1.03"] == 0, (mode, at.to_dict())
        assert at["calibrated: median"] <= at["constants: median"] + 0.03, (mode, at.to_dict())


def _paths_on_the_host(rank: int, world: int, cache_dir: str) -> dict:
    """A calibration on the emulator told to compare the copy engines with the sm path, which the emulator refuses:
    every rank times the path points through its communicator, the refusals are no candidates, and the calls follow
    the table's paths."""
    import os

    import torch

    from dmacoll import Communicator
    from dmacoll.calibration import lookup

    os.environ.update(XDG_CACHE_HOME=cache_dir, DMACOLL_CALIBRATE="1")
    lookup._path_space = lambda comm, key: {(op, "eager"): ["dma", "sm"] for op in ("all_gather", "all_reduce")}
    comm = Communicator(backend="host", timeout_s=60)
    x = torch.arange(8, dtype=torch.float32) + 10 * rank
    y = torch.full((8 * world,), -1.0)
    comm.all_gather(y, x)  # calibrates first
    gathered = y.tolist() == [float(i + 10 * r) for r in range(world) for i in range(8)]
    z = x.clone()
    comm.all_reduce(z)
    summed = z.tolist() == [float(world * i + 10 * sum(range(world))) for i in range(8)]
    out = {"table": comm.tuning.to_json(), "path": comm.last_options.path, "right": gathered and summed}
    comm.close()
    return out


def test_the_calibration_times_the_paths_through_the_communicator_on_every_rank(tmp_path):
    import json

    from dmacoll_lab.verify.launch import run_ranks

    ranks = run_ranks(_paths_on_the_host, 2, str(tmp_path), timeout_s=600)
    table = json.loads(ranks[0]["table"])
    assert all(r["table"] == ranks[0]["table"] for r in ranks)  # the same on every rank
    rows = table["paths"]
    assert rows and {r["path"] for r in rows} == {"dma"}  # the emulator refuses the sm path: no rows, no error
    assert {(r["op"], r["mode"]) for r in rows} == {("all_gather", "eager"), ("all_reduce", "eager")}
    assert table["calibration"]["path_points"] == 2 * len(rows)  # each dma point beside a refused sm point
    assert all(r["path"] == "dma" and r["right"] for r in ranks)


def test_tune_quick_says_where_auto_sends_each_op():
    from dmacoll_lab.cli.bench import path_summary

    table = _table([("graph", 1 << 10, "sm", 5.0), ("graph", 1 << 10, "nccl", 10.0), ("graph", 1 << 10, "dma", 30.0),
                    ("graph", 4 << 10, "sm", 6.0), ("graph", 4 << 10, "nccl", 10.0), ("graph", 4 << 10, "dma", 30.0),
                    ("graph", 16 << 10, "nccl", 12.0), ("graph", 16 << 10, "dma", 11.9),  # within the margin
                    ("graph", 64 << 10, "nccl", 20.0), ("graph", 64 << 10, "dma", 15.0)])
    assert path_summary(table.to_json()) == ["auto, all_reduce graph: sm 1 KB-4 KB, nccl 16 KB, dma 64 KB"]
    assert path_summary(tuning.TuningTable({}, []).to_json()) == []
