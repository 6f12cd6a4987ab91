"""nccl-tests-style operator sweep: every implementation, sizes, graph and eager modes.

One process per GPU. For each (size, op) every rank draws fresh random inputs
from a shared seed, so each rank knows every rank's input and hence the exact
expected output. Each point is timed with CUDA events (median of repeats of
``calls`` back-to-back calls, graph-replayed or eager), then its output is
poisoned, the collective runs once more (the graph replays once) and the
result is compared byte for byte. A rank's time is the median over repeats;
the reported time is the slowest rank's, since a collective is done only when
every rank is.

Sizes follow nccl-tests: ``bytes_per_rank`` is one rank's input (all-gather)
or send buffer (all-to-all); ``total_bytes`` is what nccl-tests calls size
(the all-gather output, the all-to-all send buffer), algbw = total_bytes /
time and busbw = algbw x (n-1)/n for both. ``peer_copy`` is one copy of one
chunk to one peer (a floor for one link pair, and at n = 2 for the whole
collective): its algbw and busbw are that chunk / time.
"""
from __future__ import annotations

import itertools
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..verify.check import POISON
from . import provenance, timing
from .bandwidth import bandwidths

OPS = ("all_gather", "all_to_all")
IMPLS = ("nccl", "dma", "symm_mem_lc", "nccl_ce", "peer_copy")
COLUMNS = ["op", "impl", "variant", "direction", "place", "signal", "prerecord", "submit", "handshake", "world",
           "bytes_per_rank",
           "total_bytes", "dtype", "mode",
           "time_us", "time_us_p10", "time_us_p90", "algbw_GBps", "busbw_GBps", "correct", "status", "error",
           "calls", "repeats"]


@dataclass
class SweepConfig:
    ops: tuple[str, ...] = OPS
    impls: tuple[str, ...] = ("nccl", "dma", "symm_mem_lc", "peer_copy")
    variants: tuple[str, ...] = ("pcpy", "b2b")
    directions: tuple[str, ...] = ("push", "pull")
    places: tuple[str, ...] = ("out", "in")
    signals: tuple[str, ...] = ("memop",)
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


def points(cfg: SweepConfig, op: str, world: int) -> list[Point]:
    out = []
    for impl in cfg.impls:
        if impl == "dma":
            out += [Point(op, "dma", v, d, p, sig, pre, sub, h) for v in cfg.variants for d in cfg.directions
                    for p in cfg.places for sig in cfg.signals for pre in cfg.prerecord for sub in cfg.submit
                    for h in cfg.handshakes
                    if (p == "out" or op == "all_gather") and not (pre and sub == "native")
                    and not (sig == "kernel" and sub == "native")  # native issues driver calls only
                    and not (h == "lean" and (d != "push" or pre))]  # lean: push, and never prerecorded
        elif impl == "symm_mem_lc" and op != "all_gather":
            continue  # torch's low-contention op exists for all-gather only
        else:
            out.append(Point(op, impl))
    return out


class Inputs:
    """Every rank's input for one (op, size), drawn from a seed on the device."""

    def __init__(self, op: str, nbytes: int, dtype: torch.dtype, world: int, seed: int, device: torch.device):
        numel = nbytes // torch.empty((), dtype=dtype).element_size()
        self.inputs = []
        for r in range(world):
            gen = torch.Generator(device=device).manual_seed(seed * 7919 + r)
            self.inputs.append(torch.randn(numel, generator=gen, device=device, dtype=torch.float32).to(dtype))
        self.op, self.world = op, world

    def expected(self, rank: int) -> torch.Tensor:
        if self.op == "all_gather":
            return torch.cat(self.inputs)
        return torch.cat([x.chunk(self.world)[rank] for x in self.inputs])


class Runner:
    """Buffers and call closures for one rank."""

    def __init__(self, cfg: SweepConfig, comm, world: int, rank: int):
        self.cfg, self.comm, self.world, self.rank = cfg, comm, world, rank
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = getattr(torch, cfg.dtype)
        big = cfg.max_bytes
        if comm is not None:  # only dma and peer_copy use dmacoll's symmetric heap
            self.sym_in = comm.empty(big, dtype=torch.uint8)
            self.sym_out = comm.empty(world * big, dtype=torch.uint8)
            # handshake='lean' alternates between two outputs
            self.sym_out2 = comm.empty(world * big, dtype=torch.uint8) if "lean" in cfg.handshakes else None
        self.priv_in = torch.empty(big, dtype=torch.uint8, device=self.device)
        self.priv_out = torch.empty(world * big, dtype=torch.uint8, device=self.device)
        self.cpu_group = dist.new_group(backend="gloo")
        self._baselines = None

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    def buffers(self, pt: Point, nbytes: int, second: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, input) of a point; ``second``: the other output of a lean point (same input)."""
        out_bytes = nbytes * self.world if pt.op == "all_gather" else nbytes
        sym = pt.impl in ("dma", "peer_copy")
        out = (self.sym_out2 if second else self.sym_out if sym else self.priv_out)[:out_bytes].view(self.dtype)
        if pt.place == "in":
            n = nbytes // out.element_size()
            return out, out[self.rank * n: (self.rank + 1) * n]
        return out, (self.sym_in if sym else self.priv_in)[:nbytes].view(self.dtype)

    def baselines(self):
        if self._baselines is None:
            from . import baselines

            self._baselines = baselines.Baselines(self.comm, max_bytes=self.cfg.max_bytes)
        return self._baselines

    def call(self, pt: Point, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], Optional[torch.Tensor]]:
        """A call of the point on its (output, input) pairs: lean points alternate between two, the
        first call with the full handshake (the call before it may have written the same output)."""
        out, inp = pairs[0]
        if pt.impl != "dma":
            return self.baselines().call(pt.impl, pt.op, out, inp)
        method = self.comm.all_gather if pt.op == "all_gather" else self.comm.all_to_all
        opts = dict(variant=pt.variant, direction=pt.direction, signal=pt.signal, prerecord=pt.prerecord,
                    **({"submit": "native"} if pt.submit == "native" else {}))
        if pt.handshake == "full":
            return lambda: method(out, inp, **opts)
        calls = itertools.count()

        def lean() -> torch.Tensor:
            k = next(calls)
            return method(*pairs[k % 2], handshake="lean" if k else "full", **opts)
        return lean


def _verify(pt: Point, result: torch.Tensor, expected: torch.Tensor, world: int, rank: int) -> bool:
    if pt.impl == "peer_copy":  # the floor moves one chunk to one peer: check the chunk we received
        peer = (rank - 1) % world
        n = expected.numel() // world
        return torch.equal(result[peer * n:(peer + 1) * n].view(torch.uint8),
                           expected[peer * n:(peer + 1) * n].view(torch.uint8))
    return torch.equal(result.view(torch.uint8), expected.view(torch.uint8))


def gpu_runner(rank: int, world: int, max_bytes: int, dtype: str = "bfloat16", timeout_s: float = 120) -> Runner:
    """A rank's communicator (heap for inputs and outputs up to ``max_bytes`` per rank) and buffers, on a
    non-default stream: NCCL's copy-engine path rejects the legacy stream, and applications use their own."""
    from ..communicator import Communicator

    torch.cuda.set_stream(torch.cuda.Stream())
    comm = Communicator(heap_bytes=max_bytes * (world + 1) + (1 << 20), staging_bytes=1 << 20, timeout_s=timeout_s)
    return Runner(SweepConfig(max_bytes=max_bytes, dtype=dtype), comm, world, rank)


def gather_rows(runner: Runner, rows: list[dict]) -> Optional[list[dict]]:
    """Every rank's rows on rank 0 (None elsewhere); closes the communicator."""
    gathered: list = [None] * runner.world
    dist.all_gather_object(gathered, rows, group=runner.cpu_group)
    runner.comm.close()
    return [r for per_rank in gathered for r in per_rank] if runner.rank == 0 else None


def point_fields(pt: Point) -> dict:
    return {"op": pt.op, "impl": pt.impl, "variant": pt.variant, "direction": pt.direction, "place": pt.place}


class BoundPoint:
    """One implementation bound to its buffers and this rank's input: run it, check its output."""

    def __init__(self, runner: Runner, pt: Point, nbytes: int, data: Inputs):
        self.runner, self.pt, self.data = runner, pt, data
        self.pairs = [runner.buffers(pt, nbytes, second) for second in (False, True)[:1 + (pt.handshake == "lean")]]
        self.out, self.inp = self.pairs[0]
        self.mine = data.inputs[runner.rank]
        for _, inp in self.pairs:
            inp.copy_(self.mine)
        self.fn = runner.call(pt, self.pairs)
        self.result: Optional[torch.Tensor] = None

    def run_once(self) -> None:
        r = self.fn()
        self.result = r if isinstance(r, torch.Tensor) else self.out  # some baselines allocate their output

    def check(self, rerun: Callable[[], None]) -> bool:
        """Poison the outputs, run once more (``rerun``: a call or a graph replay), compare byte for byte."""
        outs = [out for out, _ in self.pairs] + [self.result]
        for t in {id(t): t for t in outs}.values():
            if t is not None:
                t.view(torch.uint8).fill_(POISON)
        for _, inp in self.pairs:
            inp.copy_(self.mine)  # in place: the input sits inside the poisoned output
        torch.cuda.synchronize()
        self.runner.barrier()
        rerun()
        torch.cuda.synchronize()
        self.runner.barrier()  # peers' copies into us are complete
        return _verify(self.pt, self.result, self.data.expected(self.runner.rank), self.runner.world,
                       self.runner.rank)


def measure(runner: Runner, pt: Point, nbytes: int, mode: str, data: Inputs) -> dict:
    cfg = runner.cfg
    bp = BoundPoint(runner, pt, nbytes, data)
    if mode == "graph":
        graph = timing.capture(bp.run_once, cfg.calls, cfg.warmup)
        samples = timing.time_graph(graph, cfg.calls, cfg.repeats, runner.barrier)
        return {"samples": samples, "correct": bp.check(graph.replay)}
    samples = timing.time_eager(bp.run_once, cfg.calls, cfg.repeats, cfg.warmup, runner.barrier)
    return {"samples": samples, "correct": bp.check(bp.run_once)}


def run_sweep(rank: int, world: int, cfg: SweepConfig) -> Optional[list[dict]]:
    from ..communicator import Communicator

    # Every implementation runs on one non-default stream: NCCL's copy-engine path rejects the
    # legacy default stream (cudaMemcpyBatchAsync does), and it is what applications use anyway.
    torch.cuda.set_stream(torch.cuda.Stream())
    heap = cfg.max_bytes * (world + 1 + world * ("lean" in cfg.handshakes)) + (1 << 20)
    # NCCL's copy-engine path switches torch's symmetric-memory backend globally: run it alone
    uses_heap = {"dma", "peer_copy"} & set(cfg.impls)
    comm = Communicator(heap_bytes=heap, staging_bytes=1 << 20, timeout_s=60) if uses_heap else None
    runner = Runner(cfg, comm, world, rank)
    rows: list[dict] = []
    plan = [(nbytes, op, pt, mode) for nbytes in cfg.sizes() for op in cfg.ops
            for pt in points(cfg, op, world) for mode in cfg.modes
            # inside a graph there is nothing to prerecord, and replays do not submit anything
            if not ((pt.prerecord or pt.submit == "native") and mode == "graph")]
    started = time.monotonic()
    data = None
    for i, (nbytes, op, pt, mode) in enumerate(plan, 1):
        if data is None or (data.op, data.inputs[0].numel() * data.inputs[0].element_size()) != (op, nbytes):
            data = Inputs(op, nbytes, runner.dtype, world, cfg.seed * 1000 + i, runner.device)
        try:
            res = measure(runner, pt, nbytes, mode, data)
            local = {"status": "ok", "error": "", **timing.summarize(res["samples"]), "correct": res["correct"]}
        except Exception as e:  # noqa: BLE001 - a failing implementation is a result, not a crash
            local = {"status": "failed", "error": f"{type(e).__name__}: {e}".replace("\n", " ")[:500],
                     "time_us": float("nan"), "time_us_p10": float("nan"), "time_us_p90": float("nan"),
                     "correct": False}
            if rank == 0:
                traceback.print_exc()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, local, group=runner.cpu_group)
        row = merge(gathered, cfg, pt, nbytes, mode, world)
        rows.append(row)
        if rank == 0:
            print(f"[{i:4d}/{len(plan)} {time.monotonic() - started:6.0f}s] {op:10s} {pt.impl:11s} "
                  f"{pt.variant:5s} {pt.direction:4s} {pt.place:3s} {pt.signal:5s} {'pre' if pt.prerecord else 'nat' if pt.submit == 'native' else '   '} {pt.handshake:4s} "
                  f"{nbytes:>10d} B {mode:5s} "
                  f"{row['time_us']:10.2f} us  {row['status']}{'' if row['correct'] else ' WRONG'}", flush=True)
    if comm is not None:
        comm.close()
    if rank == 0:
        write_results(rows, cfg)
        return rows
    return None


def merge(per_rank: list[dict], cfg: SweepConfig, pt: Point, nbytes: int, mode: str, world: int) -> dict:
    failed = [r for r in per_rank if r["status"] != "ok"]
    total = bandwidths(pt.op, pt.impl, nbytes, world, 1.0)[0]
    row = {"op": pt.op, "impl": pt.impl, "variant": pt.variant, "direction": pt.direction, "place": pt.place,
           "signal": pt.signal, "prerecord": pt.prerecord, "submit": pt.submit, "handshake": pt.handshake,
           "world": world, "bytes_per_rank": nbytes, "total_bytes": total, "dtype": cfg.dtype, "mode": mode,
           "calls": cfg.calls, "repeats": cfg.repeats}
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
    return provenance.write_table(Path(cfg.out), rows, COLUMNS, dict(cfg.__dict__))
