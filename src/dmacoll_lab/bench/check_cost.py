"""`dmacoll check-cost`: what the cross-rank check of each call (``Communicator.check_calls``,
``dmacoll.consistency``) adds to a call.

The same eager calls (symmetric buffers, every option 'auto') are timed back to back with the check off and on,
the two interleaved per repeat so that a machine's drift hits both alike; after timing each is checked against
the reference (``harness.Bound``). Only eager calls: a graph replay runs no Python, so the check (made while
capturing) costs a replay nothing. One rank per GPU; without a GPU the host emulator (times by the host clock).
"""
from __future__ import annotations

from typing import Optional

from dmacoll.lab_api import ops
from . import harness

CHECK_COST_COLUMNS = ["op", "bytes_per_rank", "world", "device", "check_calls", "calls", "repeats", "time_us",
                      "time_us_p10", "time_us_p90", "ok"]


def run_check_cost(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    """One rank: every op and size of ``cfg``, the check off and on; rank 0 returns the rows."""
    rk = harness.Rank(rank, world, pool_bytes=max(cfg["sizes"]), dtype=cfg["dtype"])
    rows = []
    for i, op in enumerate(cfg["ops"]):
        spec = ops.get(op)
        for size in cfg["sizes"]:
            bound = harness.Bound(rk, spec, size, seed=cfg["seed"] + i, caller=harness.dma_caller(rk.comm, spec),
                                  symmetric=True)
            samples: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(cfg["repeats"]):
                for on in samples:
                    rk.comm.check_calls = on  # on every rank alike
                    samples[on] += rk.bench(bound.run, cfg["calls"], 1, warmup=1).samples
            for on, times in samples.items():
                rk.comm.check_calls = on
                ok = all(rk.gather(bound.check(bound.run)))
                rows.append({"op": op, "bytes_per_rank": size, "world": world, "device": rk.device.type,
                             "check_calls": on, "calls": cfg["calls"], "repeats": cfg["repeats"],
                             **harness.summarize(rk.slowest(times)), "ok": ok})
    return rk.finish(rows if rank == 0 else [])  # the rows are every rank's (slowest, all right) already
