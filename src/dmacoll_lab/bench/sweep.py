"""nccl-tests-style operator sweep: every implementation, sizes, graph and eager modes, every collective.

One process per GPU (``harness.Rank``). For each (size, op) every rank draws fresh seeded inputs
(``harness.Bound``), so each rank knows every rank's input and hence the exact expected output. Each point is
timed with CUDA events (median of repeats of ``calls`` back-to-back calls, graph-replayed or eager), then its
output is poisoned, the collective runs once more (the graph replays once) and the result is compared with the
op spec's reference. A rank's time is the median over repeats; the reported time is the slowest rank's, since
a collective is done only when every rank is.

Sizes follow nccl-tests (``ops.OpSpec``): ``bytes_per_rank`` is one rank's input; ``total_bytes`` is what
nccl-tests calls size (the all-gather output, the others' input), algbw = total_bytes / time and busbw = algbw x
the op's bus factor ((n-1)/n; all-reduce 2(n-1)/n). ``peer_copy`` is one copy of what a rank sends one peer (a
floor for one link pair, and at n = 2 for the whole collective): its algbw and busbw are that copy / time.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from dmacoll.lab_api import ops, tuning
from ..verify.reference import compare_bytes, poison
from . import harness
from .bandwidth import bandwidths
from .baselines import Baselines, peer_chunk

# dma_default: a call with no options on a Communicator() with none (what a user gets); dma: each configuration
IMPLS = ("nccl", "dma_default", "dma", "symm_mem_lc", "nccl_ce", "peer_copy")
DEFAULT_IMPLS = ("nccl", "dma_default", "dma", "symm_mem_lc", "peer_copy")  # nccl_ce runs in a sweep of its own
CUDA_IMPLS = ("symm_mem_lc", "nccl_ce")  # torch's symmetric memory and NCCL's copy-engine path: GPUs only
HEAP_IMPLS = ("dma_default", "dma", "peer_copy")  # on dmacoll's symmetric heap
COLUMNS = ["op", "impl", "variant", "direction", "place", "signal", "wait", "prerecord", "submit", "handshake", "path",
           "world",
           "bytes_per_rank",
           "total_bytes", "dtype", "mode",
           "time_us", "time_us_p10", "time_us_p90", "algbw_GBps", "busbw_GBps", "correct", "status", "error",
           "calls", "repeats"]


@dataclass
class SweepConfig:
    ops: tuple[str, ...] = ("all_gather", "all_to_all")
    impls: tuple[str, ...] = DEFAULT_IMPLS
    variants: tuple[str, ...] = ("pcpy", "b2b")
    directions: tuple[str, ...] = ("push", "pull")
    places: tuple[str, ...] = ("out", "in")
    signals: tuple[str, ...] = ("memop",)
    waits: tuple[str, ...] = ("memop",)  # spin / fold: kernels poll the flags (cuda)
    prerecord: tuple[bool, ...] = (False,)  # True: eager calls replay a graph recorded on first use
    submit: tuple[str, ...] = ("python",)  # native: driver commands issued by the C library (eager only)
    handshakes: tuple[str, ...] = ("full",)  # lean (push only): calls alternate between two outputs
    min_bytes: int = 1 << 10
    max_bytes: int = 256 << 20
    modes: tuple[str, ...] = ("graph", "eager")
    dtype: str = "bfloat16"
    calls: int = 10
    repeats: int = 5
    warmup: int = 3
    seed: int = 0
    out: str = "results/sweep.csv"

    @classmethod
    def from_args(cls, args, **overrides) -> "SweepConfig":
        """The configuration from parsed arguments (``dmacoll sweep``'s / ``tune``'s namespace, or a dict): each
        field from the argument of its name (``overrides`` win), other arguments ignored; the conversions are here:
        lists become tuples, ``--prerecord``'s no/yes become booleans. A field without an argument is an error (a
        new field must get its option, not fall back to a default silently)."""
        given = {**(args if isinstance(args, dict) else vars(args)), **overrides}
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"SweepConfig.from_args: no argument for {missing}")
        values = {n: tuple(given[n]) if isinstance(given[n], list) else given[n] for n in names}
        values["impls"] = values["impls"] or DEFAULT_IMPLS  # None: the command's default
        values["modes"] = values["modes"] or ("graph", "eager")
        values["prerecord"] = tuple(p in (True, "yes") for p in values["prerecord"])
        return cls(**values)

    def sizes(self) -> list[int]:
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(s)
            s *= 2
        return out


@dataclass
class Point:
    op: str
    impl: str
    variant: str = ""
    direction: str = ""
    place: str = "out"
    signal: str = ""
    prerecord: bool = False
    submit: str = "python"
    handshake: str = "full"
    wait: str = ""


def points(cfg: SweepConfig, op: str, world: int) -> list[Point]:
    spec = ops.get(op)
    out = []
    for impl in cfg.impls:
        if impl == "dma":
            out += [Point(op, "dma", v, d, p, sig, pre, sub, h, w) for v in cfg.variants for d in cfg.directions
                    for p in cfg.places for sig in cfg.signals for pre in cfg.prerecord for sub in cfg.submit
                    for h in cfg.handshakes for w in cfg.waits
                    if (p == "out" or spec.in_place) and not (pre and sub == "native")
                    and not ("kernel" in (sig, w) and sub == "native")  # native issues driver calls only
                    and not (w != "memop" and sub == "native")  # native: driver calls only
                    and not (w == "fold" and not spec.reduces)  # fold = spin where there is no sum
                    and not (h == "lean" and (d != "push" or pre or spec.reduces))]  # lean: push exchanges
        elif impl == "symm_mem_lc" and op != "all_gather":
            continue  # torch's low-contention op exists for all-gather only
        else:
            out.append(Point(op, impl))
    return out


def point_fields(pt: Point) -> dict:
    return {"op": pt.op, "impl": pt.impl, "variant": pt.variant, "direction": pt.direction, "place": pt.place}


def dma_options(pt: Point) -> dict:
    return dict(path="dma", variant=pt.variant, direction=pt.direction, signal=pt.signal, prerecord=pt.prerecord,
                **({"submit": "native"} if pt.submit == "native" else {}),
                **({"wait": pt.wait} if pt.wait not in ("", "memop") else {}))


class Bound:
    """The point on its buffers: one ``harness.Bound``, or two for a lean point, whose calls alternate between
    their outputs, the first call with the full handshake (the call before it may have written the output)."""

    def __init__(self, rk: harness.Rank, baselines: Baselines, pt: Point, nbytes: int, seed: int):
        self.pt, spec = pt, ops.get(pt.op)
        if pt.impl == "dma_default":
            self.bounds = [harness.Bound(rk, spec, nbytes, seed, harness.dma_caller(rk.comm, spec), symmetric=True)]
        elif pt.impl != "dma":
            self.bounds = [harness.Bound(rk, spec, nbytes, seed, baselines.caller(pt.impl, spec),
                                         symmetric=pt.impl == "peer_copy")]
        else:
            caller = harness.dma_caller(rk.comm, spec, **dma_options(pt))
            self.bounds = [harness.Bound(rk, spec, nbytes, seed, caller, symmetric=True, in_place=pt.place == "in",
                                         output_index=i) for i in range(1 + (pt.handshake == "lean"))]
        self.calls = itertools.count()
        self.last = self.bounds[0]  # the bound the last call wrote (for a graph: the last captured call's)
        self.sums_in_place = self.bounds[0].sums_in_place  # see harness.Bound
        self.options = dma_options(pt)
    def run(self) -> None:
        if len(self.bounds) == 1:
            return self.bounds[0].run()
        k = next(self.calls)
        self.last = b = self.bounds[k % 2]
        extra = () if b.counts is None else (b.counts,)
        b.rk.comm.collective(b.spec.name, b.out, b.inp, *extra, handshake="lean" if k else "full", **self.options)

    def check(self, rerun: Callable[[], None]) -> bool:
        """The output the last call wrote, after one more call (or replay); a peer copy fills only the chunk from
        one peer."""
        if self.pt.impl != "peer_copy":
            harness.checked_run(self.bounds[0].rk, lambda: [b.prepare() for b in self.bounds], rerun)
            return self.last.right()
        return check_peer_copy(self.bounds[0], rerun)


def check_peer_copy(first: harness.Bound, rerun: Callable[[], None]) -> bool:
    rk = first.rk
    chunk = first.spec.peer_bytes(first.inp.numel() * first.inp.element_size(), rk.world)
    start, end = peer_chunk(rk.rank, rk.world, chunk)
    landing = rk.sym_out[start:end]
    harness.checked_run(rk, lambda: poison(first.spec, landing), rerun)
    sender = (rk.rank - 1) % rk.world
    return compare_bytes(landing, first.inputs[sender].view(torch.uint8)[:chunk], "sender's input") is None


def measure(rk: harness.Rank, cfg: SweepConfig, baselines: Baselines, pt: Point, nbytes: int, mode: str,
            seed: int) -> dict:
    b = Bound(rk, baselines, pt, nbytes, seed)
    timed = rk.bench(b.run, cfg.calls, cfg.repeats, mode, cfg.warmup, check=b)
    # what a call with no options ran: every option 'auto' chose
    last = rk.comm.last_options
    chosen = {name: getattr(last, name) for name in (*tuning.Choice._fields, "path")} \
        if pt.impl == "dma_default" else {}
    return {"samples": timed.samples, "correct": timed.correct, "chosen": chosen}


def run_sweep(rank: int, world: int, cfg: SweepConfig) -> Optional[list[dict]]:
    # NCCL's copy-engine path switches torch's symmetric-memory backend globally: the CLI runs it alone
    uses_heap = bool(set(HEAP_IMPLS) & set(cfg.impls))
    lean = any(h == "lean" for h in cfg.handshakes)
    reduces = any(ops.get(op).reduces for op in cfg.ops)  # their calls need staging as large as their inputs
    rk = harness.Rank(rank, world, pool_bytes=cfg.max_bytes, extra_outputs=int(lean), dtype=cfg.dtype,
                      staging_bytes=0 if reduces else 1 << 20, communicator=uses_heap)
    baselines = Baselines(rk, cfg.max_bytes)
    plan = [(nbytes, op, pt, mode) for nbytes in cfg.sizes() for op in cfg.ops
            for pt in points(cfg, op, world) for mode in cfg.modes
            # inside a graph there is nothing to prerecord, and replays do not submit anything
            if not ((pt.prerecord or pt.submit == "native") and mode == "graph")]
    rows: list[dict] = []
    seeds: dict[tuple, int] = {}
    started = time.monotonic()
    for i, (nbytes, op, pt, mode) in enumerate(plan, 1):
        try:
            # one set of inputs per (size, op), shared by its implementations (harness.Rank.inputs keeps it)
            res = measure(rk, cfg, baselines, pt, nbytes, mode, cfg.seed * 1000 + seeds.setdefault((nbytes, op),
                                                                                               len(seeds)))
            local = {"status": "ok", "error": "", **harness.summarize(res["samples"]), "correct": res["correct"],
                     "chosen": res["chosen"]}
        except Exception as e:  # noqa: BLE001 - a failing implementation is a result, not a crash
            local = {"status": "failed", "error": f"{type(e).__name__}: {e}".replace("\n", " ")[:500],
                     "time_us": float("nan"), "time_us_p10": float("nan"), "time_us_p90": float("nan"),
                     "correct": False}
            if rank == 0:  # one line (the row keeps the error); the traceback with DMACOLL_DEBUG=1
                print(f"  {op} {pt.impl} {nbytes} B {mode}: {local['error']}", flush=True)
                if os.environ.get("DMACOLL_DEBUG") == "1":
                    traceback.print_exc()
        row = merge(rk.gather(local), cfg, pt, nbytes, mode, world)
        rows.append(row)
        if rank == 0:
            flavour = "pre" if pt.prerecord else "nat" if pt.submit == "native" else ""
            print(f"[{i:4d}/{len(plan)} {time.monotonic() - started:6.0f}s] {op:14s} {pt.impl:11s} "
                  f"{pt.variant:5s} {pt.direction:4s} {pt.place:3s} {pt.signal:6s} {pt.wait:5s} {flavour:3s} {pt.handshake:4s} "
                  f"{nbytes:>10d} B {mode:5s} "
                  f"{row['time_us']:10.2f} us  {status_text(row)}", flush=True)
    rk.close()
    if rank == 0:
        write_results(rows, cfg)
        return rows
    return None


def status_text(row: dict) -> str:
    """A point's status as the progress line says it: 'ok', 'ok WRONG' (it ran, and a result was wrong) or
    'failed' (it could not run; its error is in the row and was said above)."""
    return f"{row['status']}{' WRONG' if row['status'] == 'ok' and not row['correct'] else ''}"


def merge(per_rank: list[dict], cfg: SweepConfig, pt: Point, nbytes: int, mode: str, world: int) -> dict:
    failed = [r for r in per_rank if r["status"] != "ok"]
    total = bandwidths(pt.op, pt.impl, nbytes, world, 1.0)[0]
    row = {"op": pt.op, "impl": pt.impl, "variant": pt.variant, "direction": pt.direction, "place": pt.place,
           "signal": pt.signal, "wait": pt.wait, "prerecord": pt.prerecord, "submit": pt.submit,
           "handshake": pt.handshake, "path": "dma" if pt.impl == "dma" else "",
           "world": world, "bytes_per_rank": nbytes, "total_bytes": total, "dtype": cfg.dtype, "mode": mode,
           "calls": cfg.calls, "repeats": cfg.repeats, **per_rank[0].get("chosen", {})}
    if failed:
        return {**row, **{k: float("nan") for k in ("time_us", "time_us_p10", "time_us_p90", "algbw_GBps",
                                                   "busbw_GBps")},
                "correct": False, "status": "failed", "error": failed[0]["error"]}
    slowest = max(per_rank, key=lambda r: r["time_us"])
    _, algbw, busbw = bandwidths(pt.op, pt.impl, nbytes, world, slowest["time_us"])
    return {**row, "time_us": slowest["time_us"], "time_us_p10": slowest["time_us_p10"],
            "time_us_p90": slowest["time_us_p90"], "algbw_GBps": algbw, "busbw_GBps": busbw,
            "correct": all(r["correct"] for r in per_rank), "status": "ok", "error": ""}


def write_results(rows: list[dict], cfg: SweepConfig) -> Path:
    return harness.write(cfg.out, rows, COLUMNS, dict(cfg.__dict__))
