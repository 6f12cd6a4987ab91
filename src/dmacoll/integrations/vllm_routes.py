"""Which vLLM collectives dmacoll takes: only where committed measurements say it is faster than vLLM's own path.

The shipped table (``vllm_routes.json``, written by ``dmacoll vllm routes`` from the committed operator
sweeps; a test regenerates it) holds, per measured machine (world size, GPU) and per (op, mode, message size):
the time of what the plugin runs (``Communicator()``'s defaults, the sweep's *default* pick) and of the measured
stand-in for vLLM's path (NCCL: vLLM's ``all_gather`` / ``reduce_scatter`` go to PyNccl). A call is routed when
its size class, the measured sizes around it, is faster on dmacoll at both ends by ``margin`` (the plugin
stages vLLM's tensors, which the sweep did not, and small-size times move between runs). Anything else, an op
the table defers (all-reduce: vLLM's is custom all-reduce / symmetric memory / PyNccl by size, none of them
measured against dmacoll), a world size or GPU without a table, stays on vLLM's path. A collective that no vLLM
call maps to (``SERVED_BY``: all-to-all, any newly registered op) is never routed.

``DMACOLL_VLLM_ROUTE`` picks the policy: ``measured`` (the default, the table), ``moves`` (every eligible
all-gather, no sums: outputs must match vLLM's bit for bit) or ``all`` (every eligible call); the last two
exist for the output checks, not for speed. No vLLM, no pandas; torch only where ``moves`` asks the op registry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Optional

from ..sizes import human

ROUTE_ENV = "DMACOLL_VLLM_ROUTE"
POLICIES = ("measured", "moves", "all")
TABLE_FILE = "vllm_routes.json"  # package data beside this module
# vLLM's device-communicator calls -> the dmacoll collective (``dmacoll.ops``) that serves them
SERVED_BY = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gatherv": "all_gather",
             "reduce_scatter": "reduce_scatter", "reduce_scatterv": "reduce_scatter"}
SERVED = tuple(dict.fromkeys(SERVED_BY.values()))  # the dmacoll collectives some vLLM call reaches


@dataclass(frozen=True)
class Decision:
    route: bool
    size_class: str  # the log-once key's size part: the measured sizes around the message
    reason: str


def policy(environ: Optional[dict] = None) -> str:
    import os

    value = (os.environ if environ is None else environ).get(ROUTE_ENV, "").strip().lower() or "measured"
    if value not in POLICIES:
        raise ValueError(f"{ROUTE_ENV}={value!r}: expected one of {', '.join(POLICIES)}")
    return value


def moves(op: str) -> bool:
    """Whether dmacoll's ``op`` only moves data (bit-exact outputs), as its spec says; the rest sum."""
    from .. import ops

    return not ops.get(op).reduces


def faster(entry: dict, margin: float) -> bool:
    return entry["dmacoll_us"] <= (1.0 - margin) * entry["vllm_us"]


def bracket(sizes: list[int], nbytes: int) -> tuple[tuple[int, ...], str]:
    """The measured sizes around ``nbytes`` (itself if measured, else its neighbours; the end one outside the
    measured range) and the size class they make, e.g. ``2 MB-4 MB``, ``4 MB``, ``above 256 MB``."""
    below = [s for s in sizes if s <= nbytes]
    above = [s for s in sizes if s >= nbytes]
    if below and above:
        ends = tuple(sorted({below[-1], above[0]}))
        return ends, "-".join(human(s) for s in ends)
    return ((above[0],), f"below {human(above[0])}") if above else ((below[-1],), f"above {human(below[-1])}")


class Routes:
    def __init__(self, data: dict):
        self.data = data
        self.margin = float(data["margin"])
        self.deferred: dict[str, str] = data.get("deferred", {})

    @classmethod
    def shipped(cls) -> "Routes":
        return cls(json.loads((resources.files("dmacoll.integrations") / TABLE_FILE).read_text()))

    def table(self, world: int, device_name: str) -> Optional[dict]:
        return next((t for t in self.data["tables"] if t["world"] == world and t["gpu"] and t["gpu"] in device_name),
                    None)

    def decide(self, op: str, nbytes: int, mode: str, world: int, device_name: str,
               how: str = "measured") -> Decision:
        """Whether a call of dmacoll ``op`` (``nbytes`` of input per rank, ``mode`` graph or eager) goes to dmacoll
        under policy ``how``, and why."""
        if op not in SERVED:
            return Decision(False, "any size", f"no vLLM call is served by dmacoll's {op} (vllm_routes.SERVED_BY)")
        if how == "all":
            return Decision(True, "any size", f"{ROUTE_ENV}=all: every eligible call")
        if how == "moves":
            ok = moves(op)
            return Decision(ok, "any size", f"{ROUTE_ENV}=moves: " + ("data movement is routed" if ok
                                                                        else "sums stay on vLLM's path"))
        if op in self.deferred:
            return Decision(False, "any size", self.deferred[op])
        table = self.table(world, device_name)
        if table is None:
            return Decision(False, "any size", f"no measurement at world {world} on {device_name or 'this GPU'}")
        rows = {e["bytes_per_rank"]: e for e in table["entries"] if e["op"] == op and e["mode"] == mode}
        if not rows:
            return Decision(False, "any size", f"no {mode} measurement of {op} at world {world} ({table['machine']})")
        sizes, label = bracket(sorted(rows), nbytes)
        ends = [rows[s] for s in sizes]
        ok = all(faster(e, self.margin) for e in ends)
        times = ", ".join(f"{human(e['bytes_per_rank'])}: dmacoll {e['dmacoll_us']:.1f} us vs {e['vllm_path']} "
                          f"{e['vllm_us']:.1f} us" for e in ends)
        verdict = "dmacoll faster" if ok else "dmacoll not faster"
        return Decision(ok, label, f"{verdict} by {self.margin:.0%} at {times} ({table['machine']}, {mode})")
