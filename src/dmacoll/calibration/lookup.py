"""Which tuning table a new ``Communicator`` takes, decided once on rank 0 and shared with every rank (ranks that
chose differently would plan different protocols and deadlock):

1. the table given (``tuning_table=`` or $DMACOLL_TUNING), on every rank as given;
2. else the shipped table of this platform (GPU, world, topology);
3. else, where calibration is on, the table calibrated for exactly this platform (driver and dmacoll code
   included) in the user's cache, or one to calibrate (``Calibration``): the constructor never measures; the
   communicator's first collective call outside a graph capture and a prelaunch block does, or
   ``Communicator.calibrate()`` ahead of it (a one-line notice, progress, then cached);
4. else none: 'auto' takes ``options.fallback``.

A calibration measures the copy engines' candidates (``strategy``) and, where the platform runs more than one data
path (the sm path, NCCL), each path's time per size (``paths``: 'auto' then takes the fastest measured path, not the
constants measured on H200, ``options.choose_path``). It times them on a communicator of its own, which the
calibrating communicator makes (``calibrate``'s ``measuring`` argument): this module never builds one.

$DMACOLL_CALIBRATE: ``auto`` (the default: calibrate on GPUs, not on the host emulator nor where ranks share a GPU,
whose timings say nothing about a GPU of one's own: time-sliced processes, a context switch per copied flag), ``1``
(on every backend), ``0`` (never, and no calibrated table: shipped tables or the fallback),
``force`` (calibrate now even where a shipped or cached table fits, and cache the result).
$DMACOLL_CALIBRATE_BUDGET_S bounds its time (default 20 s); ``dmacoll tune --quick`` calibrates ahead of time.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Callable, NamedTuple, Optional

import torch.distributed as dist

from .. import ops, options, tuning
from ..errors import DmaCollError, InvalidArgument
from . import cache, paths, platform, strategy

log = logging.getLogger("dmacoll")
SETTINGS = ("auto", "0", "1", "force")
DEFAULT_BUDGET_S = 20.0
WAITS = {"memop"}  # spin / fold take an SM while they wait and can queue behind a GEMM: not chosen unmeasured
OPS = ("all_gather", "all_to_all")  # what the shipped tables hold (all_to_all_v takes all_to_all's rows)
GPU_MAX_BYTES = 256 << 20
HOST_MAX_BYTES = 4 << 10  # the emulator only exercises the mechanics: small sizes, few calls
HOST_TIMING = strategy.Timing(warmup=1, calls=2, repeats=3)
PROGRESS_EVERY_S = 2.0
# where the platform runs more than one data path, the share of the budget left for measuring them (``paths``)
# after the copy engines' candidates
PATH_SHARE = 0.4
UNTIMED = ("host", "shared-device")  # topologies whose timings say nothing of a GPU's: 'auto' does not calibrate
_active = False  # a calibration is running in this process: its own communicator takes no table


def setting() -> str:
    value = os.environ.get("DMACOLL_CALIBRATE", "auto").strip().lower() or "auto"
    if value not in SETTINGS:
        raise InvalidArgument(f"DMACOLL_CALIBRATE={value!r} is not one of {SETTINGS}")
    return value


def budget_s() -> float:
    text = os.environ.get("DMACOLL_CALIBRATE_BUDGET_S", str(DEFAULT_BUDGET_S))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InvalidArgument(f"DMACOLL_CALIBRATE_BUDGET_S must be a number of seconds > 0, got {text!r}")
    return value


class Calibration(NamedTuple):
    """A calibration to run (``calibrate``): the platform's facts, the budget and the $DMACOLL_CALIBRATE setting."""

    facts: list
    budget: float
    mode: str


def table_for(comm, path: Optional[str] = None) -> tuple[Optional[tuning.TuningTable], Optional[Calibration]]:
    """(the table ``comm`` takes now, the calibration it is to run before its first call where there is none to take
    and calibration is on: module docstring); measures nothing; collective unless a table is given."""
    path = path or os.environ.get("DMACOLL_TUNING")
    if path:
        return tuning.TuningTable.load(path), None
    if _active:  # the measuring communicator of a calibration: the fallback, nothing more to calibrate
        return None, None
    mode, budget = setting(), budget_s()  # a bad value fails on every rank alike, before any collective
    facts = platform.gather(comm.group, comm.device)
    key = platform.key(facts, comm.backend)
    decision = None
    if comm.rank == 0:
        decision = _decide(key, mode, calibrates(mode, key))
    decision = _from_rank0(comm, decision)
    if decision[0] != "calibrate":
        return (None if decision[1] is None else _table(decision[1])), None
    return None, Calibration(facts, budget, mode)


def forced(comm, budget: Optional[float] = None) -> Calibration:
    """A calibration of ``comm``'s platform whatever table it has, within ``budget`` seconds (None: ``budget_s()``)
    (``Communicator.calibrate()``; collective once the budget is checked)."""
    if budget is None:
        budget = budget_s()
    elif isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise InvalidArgument(f"calibrate(budget_s={budget!r}): the budget is a number of seconds > 0 (None: "
                              "$DMACOLL_CALIBRATE_BUDGET_S, else 20)")
    return Calibration(platform.gather(comm.group, comm.device), float(budget), "force")


def calibrates(mode: str, key: tuning.Platform) -> bool:
    """Whether a platform without a table calibrates under $DMACOLL_CALIBRATE=``mode``."""
    return mode in ("1", "force") or (mode == "auto" and key.topology not in UNTIMED)


def _decide(key: tuning.Platform, mode: str, calibrate: bool) -> tuple[str, Optional[str]]:
    """Rank 0's choice: ("table", its JSON), ("calibrate", None) or ("none", None)."""
    shipped = tuning.find(key) if mode != "force" else None
    if shipped is not None or not calibrate:
        return ("table", shipped.to_json()) if shipped else ("none", None)
    cached = cache.load(key._replace(dmacoll=platform.code_version())) if mode != "force" else None
    return ("table", cached.to_json()) if cached else ("calibrate", None)


def calibrate(comm, calibration: Calibration, measuring: Callable[[int], object]) -> Optional[tuning.TuningTable]:
    """Calibrate ``comm``'s platform on every rank, timing candidates on ``measuring(heap_bytes)`` (a communicator
    of the same group that ``comm`` makes, closed afterwards); rank 0 caches the table and shares it. A failure
    leaves the fallback (None)."""
    global _active
    facts, budget, mode = calibration
    key = platform.key(facts, comm.backend, platform.code_version())
    host = comm.backend == "host"
    max_bytes = HOST_MAX_BYTES if host else _gpu_max_bytes(facts)
    settings = HOST_TIMING if host else strategy.Timing()
    if comm.rank == 0:
        why = "asked to (DMACOLL_CALIBRATE=force, calibrate(), tune --quick)" if mode == "force" else "no tuning table"
        log.warning("dmacoll: %s for %d x %s (%s%s): measuring the 'auto' defaults once, within about %.0f s "
                    "(cached in %s); DMACOLL_CALIBRATE=0 skips this, `dmacoll tune --quick` does it ahead of time", why,
                    key.world, key.gpu, key.topology, f", driver {key.driver}" if key.driver else "", budget,
                    cache.path(key))
    _active = True
    bench = None
    try:
        from .measure import Bench

        bench = Bench(measuring(Bench.heap_bytes(comm.world, max_bytes)), max_bytes, settings,
                      _progress() if comm.rank == 0 else None)
        plan = strategy.Strategy(_space(comm, bench), strategy.grid(max_bytes))
        path_space = _path_space(bench.comm, key)
        strategy.run(plan, bench.measure, bench.spent, budget * (1 - PATH_SHARE) if path_space else budget, settings)
        search = None
        if path_space:  # the paths' dma calls take what the candidates just found
            bench.comm._use_table(tuning.TuningTable({}, plan.entries()))
            search = paths.run(paths.PathSearch(path_space, strategy.grid(max_bytes)), bench.measure, bench.spent,
                               budget)
        table = None
        if comm.rank == 0:
            table = tuning.TuningTable(_meta(key, plan, search, bench, budget, max_bytes, settings, mode),
                                       plan.entries(), search.entries() if search else None)
            try:
                where = f"cached in {cache.store(table, key)}"
            except OSError as e:  # a read-only home: this process still uses the table
                where = f"not cached ({e})"
            path_points = table.meta["calibration"]["path_points"]
            log.warning("dmacoll: calibrated in %.1f s (%d points, %d of them paths); %s", bench.spent(),
                        len(plan.measured) + path_points, path_points, where)
        shared = _from_rank0(comm, table.to_json() if table else None)
        return _table(shared)
    except DmaCollError as e:
        if comm.rank == 0:
            log.warning("dmacoll: calibration failed, 'auto' takes the fallback: %s", e)
        return None
    finally:
        _active = False
        if bench is not None:
            bench.close()


def _space(comm, bench) -> dict:
    """Per (op, place, mode) the choices to compare: ``options.choices`` of what the engine runs (memop waits)."""
    runs = dataclasses.replace(comm.capabilities, native_available=bench.native())
    modes = ("graph", "eager") if runs.graphs else ("eager",)
    space = {}
    for op in OPS:
        places = ("out", "in") if ops.get(op).in_place else ("out",)
        for place in places:
            for mode in modes:
                allowed = options.candidates(runs, mode == "eager")
                space[(op, place, mode)] = options.choices({**allowed, "wait": allowed["wait"] & WAITS})
    return space


def _path_space(comm, key: tuning.Platform) -> dict:
    """Per (op, mode) the data paths to compare where the platform runs more than the copy engines (the sm path,
    NCCL); empty on the emulator, and where ranks share a GPU (their calls all take the copy engines:
    ``options.choose_path``, gated)."""
    runs = ["dma"] + ["sm"] * comm.capabilities.sm_path + ["nccl"] * comm._nccl
    if len(runs) < 2 or key.topology == "shared-device":
        return {}
    modes = ("graph", "eager") if comm.capabilities.graphs else ("eager",)
    return {(op, mode): runs for op in options.NCCL_AUTO_OPS for mode in modes}


def _gpu_max_bytes(facts: list) -> int:
    """The largest size: 256 MB, halved while the heap ((world + 1) x size per rank) would take more than a
    quarter of the free memory of the GPU (shared by the ranks on it)."""
    free = min(f.free_bytes for f in facts) // platform.ranks_per_device(facts)
    size = GPU_MAX_BYTES
    while size > strategy.MIN_BYTES and (len(facts) + 1) * size > free // 4:
        size //= 2
    return size


def _meta(key: tuning.Platform, plan: strategy.Strategy, search: Optional[paths.PathSearch], bench, budget: float,
          max_bytes: int, settings: strategy.Timing, mode: str) -> dict:
    """The provenance a shipped table carries (world, gpu, dtype, source, code, time) and the platform key."""
    return {**key._asdict(), "dtype": "bfloat16", "source": "calibration",
            "source_git_sha": os.environ.get("DMACOLL_GIT_SHA"),
            "source_created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "calibration": {"points": len(plan.measured), "path_points": len(search.measured) if search else 0,
                            "seconds": round(bench.spent(), 2), "budget_s": budget,
                            "sizes": [plan.sizes[0], max_bytes], "anchors": plan.anchors,
                            "timing": settings.__dict__, "setting": mode}}


def _progress():
    """Rank 0's progress lines: every 2 s, and at the end of the first batch (the anchors) if none came yet."""
    last = [None]

    def say(done: int, elapsed: float, batch_end: bool) -> None:
        if (batch_end and last[0] is None) or elapsed - (last[0] or 0.0) >= PROGRESS_EVERY_S:
            last[0] = elapsed
            log.warning("dmacoll: calibrating: %d points measured, %.0f s", done, elapsed)
    return say


def _from_rank0(comm, value):
    """Rank 0's ``value`` on every rank (collective)."""
    out: list = [None] * comm.world
    dist.all_gather_object(out, value if comm.rank == 0 else None, group=comm.group)
    return out[0]


def _table(text: str) -> tuning.TuningTable:
    return tuning.TuningTable.from_json(text)
