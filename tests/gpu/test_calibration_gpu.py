"""Calibration end to end on GPUs (issue 34, item 5): a Communicator() on a platform without a table measures at
its first call (the constructor never does: issue 51), caches and reuses a table, every rank takes the same one, and
it drives the calls: their copy-engine options and, where each rank has a GPU, their data path (issue 49: the
calibration measures the paths). Mechanics, not performance.

Worlds larger than the visible GPUs put several ranks on one GPU (the IPC heap: their timings are not performance
figures, only the mechanics are checked). Run with ``-s`` to see the notice, progress and the table's points and
seconds.
"""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BUDGET_S = 20.0


def _communicator(lines: list[str]):
    """A Communicator() and its first call (an all-gather of 4 KB), with the dmacoll log lines they wrote."""
    from dmacoll import Communicator

    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("dmacoll").addHandler(handler)
    try:
        comm = Communicator(timeout_s=60)
        assert lines == [], lines  # the constructor never measures
        x = comm.empty(2048, dtype=torch.bfloat16)
        comm.all_gather(comm.empty(2048 * comm.world, dtype=torch.bfloat16), x)
        torch.cuda.synchronize()
        return comm
    finally:
        logging.getLogger("dmacoll").removeHandler(handler)


def _calibrate(rank: int, world: int, cache_dir: str) -> dict:
    import time

    from dmacoll import options, tuning

    os.environ.update(XDG_CACHE_HOME=cache_dir, DMACOLL_CALIBRATE="1", DMACOLL_CALIBRATE_BUDGET_S=str(BUDGET_S))
    tuning.shipped_tables = lambda: []  # as on a platform dmacoll ships no table for
    out: dict = {"lines": []}
    started = time.monotonic()
    comm = _communicator(out["lines"])
    out["first_s"] = time.monotonic() - started
    out["table"] = comm.tuning.to_json() if comm.tuning else None
    out["calls"] = []
    for op, nbytes in (("all_gather", 4096), ("all_gather", 8 << 20), ("all_to_all", 65536)):
        x = comm.empty(nbytes // 2, dtype=torch.bfloat16)
        x.copy_(torch.arange(nbytes // 2, device=x.device).to(torch.bfloat16) + rank)
        y = comm.empty(nbytes // 2 * (world if op == "all_gather" else 1), dtype=torch.bfloat16)
        for mode in ("eager", "graph"):
            y.fill_(-1)
            if mode == "graph":
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.graph(graph, stream=side):
                    getattr(comm, op)(y, x)
                graph.replay()
            else:
                getattr(comm, op)(y, x)
            torch.cuda.synchronize()
            ran = tuple(getattr(comm.last_options, name) for name in tuning.Choice._fields)
            allowed = options.allowed(comm.options, comm.capabilities, mode == "graph")
            table = comm.tuning.select(op, nbytes, mode, False, allowed) if comm.tuning else None
            # where the table measured the paths (ranks with a GPU each), the fastest it measured at this size
            path = comm.tuning.fastest_path(op, nbytes, mode, options.PATHS, "nccl", options.PATH_MARGIN) \
                if comm.tuning else None
            out["calls"].append((op, nbytes, mode, ran, tuple(table or ()), bool((y != -1).all()),
                                 comm.last_options.path, path or comm.last_options.path))
    comm.close()
    started, again = time.monotonic(), []
    comm = _communicator(again)
    out["second_s"], out["again_lines"] = time.monotonic() - started, again
    out["again"] = comm.tuning.to_json() if comm.tuning else None
    comm.close()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_calibration_end_to_end(world, tmp_path):
    ranks = run_ranks(_calibrate, world, str(tmp_path), device="cuda", timeout_s=300)
    first = ranks[0]
    meta = json.loads(first["table"])
    print(f"\nworld {world}:", *first["lines"], sep="\n  ")
    print(f"  table: {meta['world']} x {meta['gpu']} ({meta['topology']}, driver {meta['driver']}), "
          f"{meta['calibration']['points']} points in {meta['calibration']['seconds']} s; "
          f"Communicator() and a call took "
          f"{first['first_s']:.1f} s calibrating, {first['second_s']:.1f} s reusing")
    for call in first["calls"]:
        print("  ", *call)
    assert all(r["table"] == first["table"] for r in ranks)  # the same table on every rank
    assert sum("measuring the 'auto' defaults" in line for line in first["lines"]) == 1
    assert any("calibrating:" in line for line in first["lines"])
    assert meta["source"] == "calibration" and meta["world"] == world
    assert all(r["again"] == first["table"] and not r["again_lines"] for r in ranks)  # reused, silently
    assert len(list((tmp_path / "dmacoll").glob("tuning-*.json"))) == 1
    for r in ranks:  # the table drives the calls: every rank ran what it gives, and the outputs were written
        assert [c[3] for c in r["calls"]] == [c[3] for c in first["calls"]]
        for op, nbytes, mode, ran, table, filled, path, measured in r["calls"]:
            assert ran == table and filled and path == measured, (op, nbytes, mode, path, measured)
    # the paths measured where each rank has a GPU of its own (the sm path and NCCL beside the copy engines)
    assert bool(meta.get("paths")) == (meta["topology"] != "shared-device")
    if meta["topology"] != "shared-device":  # ranks time-slicing one GPU: 170 s at world 4 on one H100, so the
        # budget is checked only where each rank has a GPU (calibration under DMACOLL_CALIBRATE=auto skips shared GPUs)
        assert meta["calibration"]["seconds"] <= 2 * BUDGET_S  # bounded (the anchors are measured whatever the budget)
