"""Correctness cases: fresh random data, poisoned outputs, exact comparison.

Every rank derives every rank's input from the case seed, so each rank can
build the expected output itself (the CPU reference); on GPUs the reference
can also be NCCL run on the same inputs. Comparison is bit-exact on bytes for
the collectives that only move data, and for integer sums. Floating-point sums
(reduce_scatter, all_reduce) depend on the summation order, so they are
compared with the exact sum (float64) within ``(world + 1) x eps x sum |x_i|``
per element: over twice the worst-case error of adding ``world`` values one
after the other and rounding each time (NCCL's ring does that; dmacoll's torch.sum
adds in float32 and rounds once). Unwritten outputs cannot pass: float outputs
are poisoned with NaN.
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import asdict, dataclass, replace
from typing import Iterable, Optional

import torch

from ..validate import REDUCE_DTYPES

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
OPS = ("all_gather", "all_to_all", "all_to_all_v", "reduce_scatter", "all_reduce")
REDUCE_OPS = ("reduce_scatter", "all_reduce")
IN_PLACE_OPS = ("all_gather", "reduce_scatter", "all_reduce")
POISON = 0xA5
INT_SUM_RANGE = 1 << 20  # integer inputs of sums lie in [-range, range): no overflow at any world size


@dataclass(frozen=True)
class Case:
    op: str
    variant: str
    direction: str
    dtype: str
    count: int          # elements per chunk (per peer for all_to_all; all_reduce: of the whole tensor)
    buffers: str        # "sym" (Communicator.empty) or "private"
    in_place: bool = False
    sync: str = "reset"
    seed: int = 0
    handshake: str = "full"

    def label(self) -> str:
        place = "/in-place" if self.in_place else ""
        return (f"{self.op} {self.variant}/{self.direction}/{self.sync}/{self.handshake} {self.dtype} x{self.count} "
                f"{self.buffers}{place}")


def random_tensor(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (numel,), generator=gen, dtype=torch.int64).to(dtype)


def reduces(case: Case) -> bool:
    return case.op in REDUCE_OPS


def send_counts(case: Case, world: int) -> list[list[int]]:
    """The split matrix for a case; equal splits except for all_to_all_v (zeros included)."""
    if case.op != "all_to_all_v":
        return [[case.count] * world for _ in range(world)]
    rng = random.Random(case.seed)
    return [[rng.choice((0, 1, case.count, 2 * case.count + 1)) for _ in range(world)] for _ in range(world)]


def numels(case: Case, rank: int, world: int) -> tuple[int, int]:
    """Elements of rank's input and output."""
    if case.op == "all_gather":
        return case.count, world * case.count
    if case.op == "reduce_scatter":
        return world * case.count, case.count
    if case.op == "all_reduce":
        return case.count, case.count
    counts = send_counts(case, world)
    return sum(counts[rank]), sum(row[rank] for row in counts)


def rank_input(case: Case, rank: int, world: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(case.seed * 1009 + rank)
    numel, dtype = numels(case, rank, world)[0], DTYPES[case.dtype]
    if reduces(case) and not dtype.is_floating_point:
        return torch.randint(-INT_SUM_RANGE, INT_SUM_RANGE, (numel,), generator=gen, dtype=dtype)
    return random_tensor(numel, dtype, gen)


def exact_sum(case: Case, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank's output of a sum, exactly (float64 or int64), and the sum of the magnitudes."""
    wide = torch.float64 if DTYPES[case.dtype].is_floating_point else torch.int64
    inputs = torch.stack([rank_input(case, r, world).to(wide) for r in range(world)])
    if case.op == "reduce_scatter":
        inputs = inputs[:, rank * case.count: (rank + 1) * case.count]
    return inputs.sum(0), inputs.abs().sum(0)


def expected_output(case: Case, rank: int, world: int) -> torch.Tensor:
    if reduces(case):
        return exact_sum(case, rank, world)[0].to(DTYPES[case.dtype])
    inputs = [rank_input(case, r, world) for r in range(world)]
    if case.op == "all_gather":
        return torch.cat(inputs)
    counts = send_counts(case, world)
    chunks = []
    for p in range(world):
        start = sum(counts[p][:rank])
        chunks.append(inputs[p][start: start + counts[p][rank]])
    return torch.cat(chunks)


def cases(variants: Iterable[str], directions: Iterable[str], dtypes: Iterable[str], counts: Iterable[int],
          ops: Iterable[str] = OPS, buffers: Iterable[str] = ("sym", "private"), seed: int = 0,
          syncs: Iterable[str] = ("reset",)) -> list[Case]:
    """Every combination, in place too where the op has an in-place form; sums skip the dtypes
    that dmacoll does not sum (bool, int8, ...)."""
    out = []
    for i, (op, v, d, dt, n, b, s) in enumerate(itertools.product(ops, variants, directions, dtypes, counts,
                                                                  buffers, syncs)):
        if op in REDUCE_OPS and DTYPES[dt] not in REDUCE_DTYPES:
            continue
        out.append(Case(op, v, d, dt, n, b, False, s, seed + i))
        if op in IN_PLACE_OPS:
            out.append(Case(op, v, d, dt, n, b, True, s, seed + i + 100_000))
    return out


class Buffers:
    """Symmetric scratch for the cases, allocated once (allocation is collective)."""

    def __init__(self, comm, max_bytes: int):
        self.comm = comm
        self.sym_in = comm.empty(max_bytes, dtype=torch.uint8)
        self.sym_out = comm.empty(max_bytes, dtype=torch.uint8)

    def make(self, case: Case, in_numel: int, out_numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = DTYPES[case.dtype]
        size = torch.empty((), dtype=dtype).element_size()
        if case.buffers == "sym":
            out = self.sym_out[: out_numel * size].view(dtype)
            inp = self.sym_in[: in_numel * size].view(dtype)
        else:
            out = torch.empty(out_numel, dtype=dtype, device=self.comm.device)
            inp = torch.empty(in_numel, dtype=dtype, device=self.comm.device)
        rank = self.comm.rank
        if case.in_place and case.op == "all_gather":  # the input is our slot of the output
            inp = out[rank * in_numel: (rank + 1) * in_numel]
        elif case.in_place and case.op == "reduce_scatter":  # the output is our chunk of the input
            out = inp[rank * out_numel: (rank + 1) * out_numel]
        elif case.in_place:  # all_reduce(tensor)
            inp = out
        return out, inp


def call(comm, case: Case, out: torch.Tensor, inp: torch.Tensor, counts: Optional[list[list[int]]] = None):
    opts = dict(variant=case.variant, direction=case.direction, sync=case.sync, handshake=case.handshake)
    if case.op == "all_gather":
        return comm.all_gather(out, inp, **opts)
    if case.op == "all_to_all":
        return comm.all_to_all(out, inp, **opts)
    if case.op == "reduce_scatter":
        return comm.reduce_scatter(out, inp, **opts)
    if case.op == "all_reduce":
        return comm.all_reduce(out, **opts) if case.in_place else comm.all_reduce(out, inp, **opts)
    return comm.all_to_all_v(out, inp, counts, **opts)


def nccl_reference(case: Case, inp: torch.Tensor, out_numel: int, counts: list[list[int]], rank: int) -> torch.Tensor:
    """The same collective through torch.distributed (NCCL on GPUs): bytes, or typed for sums."""
    import torch.distributed as dist

    if case.op == "reduce_scatter":
        out = torch.empty(out_numel, dtype=inp.dtype, device=inp.device)
        dist.reduce_scatter_tensor(out, inp.contiguous())
        return out
    if case.op == "all_reduce":
        out = inp.clone()
        dist.all_reduce(out)
        return out
    src = inp.contiguous().view(torch.uint8)
    out = torch.empty(out_numel * inp.element_size(), dtype=torch.uint8, device=inp.device)
    if case.op == "all_gather":
        dist.all_gather_into_tensor(out, src)
    else:
        size = inp.element_size()
        send = [c * size for c in counts[rank]]
        recv = [row[rank] * size for row in counts]
        dist.all_to_all_single(out, src[: sum(send)], recv, send)
    return out


def run_case(comm, bufs: Buffers, case: Case, nccl: bool = False) -> Optional[str]:
    """Run one case on this rank; None if the output is right, else what is wrong.
    With ``nccl``, NCCL's output on the same input must match too."""
    world, rank = comm.world, comm.rank
    counts = send_counts(case, world)
    host_in = rank_input(case, rank, world)
    expect = expected_output(case, rank, world)
    out, inp = bufs.make(case, host_in.numel(), expect.numel())
    fuzzy = reduces(case) and out.dtype.is_floating_point  # summation order changes the low bits
    if fuzzy:
        out.fill_(float("nan"))
    elif out.numel():
        out.view(torch.uint8).fill_(POISON)
    inp.copy_(host_in.to(inp.device))
    sent = inp.clone()  # in place, the input is overwritten by the collective
    call(comm, case, out, inp, counts)
    if not fuzzy:
        error = _compare(out.cpu(), expect, "CPU reference")
        if error is None and nccl:
            error = _compare(out.cpu(), nccl_reference(case, sent, expect.numel(), counts, rank).cpu(), "NCCL")
        return error
    exact, magnitude = exact_sum(case, rank, world)
    error = _compare_sum(out.cpu(), exact, magnitude, world, "exact (float64) sum")
    if error is None and nccl:  # both are within the tolerance of the exact sum: within twice of each other
        got_nccl = nccl_reference(case, sent, expect.numel(), counts, rank).cpu().to(torch.float64)
        error = _compare_sum(out.cpu(), got_nccl, magnitude, world, "NCCL", slack=2)
    return error


def _compare(got: torch.Tensor, expect: torch.Tensor, what: str) -> Optional[str]:
    got, expect = got.reshape(-1).view(torch.uint8), expect.reshape(-1).view(torch.uint8)
    if torch.equal(got, expect):
        return None
    bad = (got != expect).nonzero()
    return f"{bad.numel()} of {expect.numel()} bytes differ from the {what}, first at byte {int(bad[0])}"


def _compare_sum(got: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, world: int, what: str,
                 slack: float = 1) -> Optional[str]:
    """Per element: |got - exact| <= slack x (world + 1) x eps x sum |x_i| (NaN, e.g. poison, fails)."""
    info = torch.finfo(got.dtype)
    tol = slack * ((world + 1) * info.eps * magnitude + info.tiny)
    err = (got.reshape(-1).to(torch.float64) - exact.reshape(-1)).abs()
    bad = (~(err <= tol.reshape(-1))).nonzero()
    if bad.numel() == 0:
        return None
    i = int(bad[0])
    return (f"{bad.numel()} of {exact.numel()} elements differ from the {what} by more than "
            f"{slack:g} x (world + 1) x eps x sum |x_i|, first at element {i}: {float(got.reshape(-1)[i])!r} "
            f"vs {float(exact.reshape(-1)[i])!r}")


PIPELINE_OPS = ("all_gather", "all_to_all", "all_to_all_v")


def pipeline_buffers(comm, in_bytes: int, out_bytes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two symmetric inputs and two symmetric outputs (bytes) for ``run_pipeline``; allocation is collective."""
    return ([comm.empty(max(1, in_bytes), dtype=torch.uint8) for _ in range(2)],
            [comm.empty(max(1, out_bytes), dtype=torch.uint8) for _ in range(2)])


def pipeline_cases(op: str, variant: str, dtype: str, count: int, calls: int, seed: int) -> list[Case]:
    """The calls of a lean pipeline: the first with the full handshake (whatever came before it may have
    written the same buffer), the others lean."""
    return [Case(op, variant, "push", dtype, count, "alternating", seed=seed + k, handshake="lean" if k else "full")
            for k in range(calls)]


def run_pipeline(comm, op: str, variant: str, dtype: str, count: int, calls: int, seed: int,
                 late_consumer: bool = False, same_output: bool = False, graph: bool = False,
                 buffers: Optional[tuple[list[torch.Tensor], list[torch.Tensor]]] = None
                 ) -> tuple[list[Optional[str]], list[bool]]:
    """``handshake='lean'`` used as promised: ``calls`` back-to-back push calls (``pipeline_cases``) into two
    alternating symmetric outputs (one, with ``same_output``: a broken promise), each output read (copied out)
    right after its call and before the next one; every copy compared with the CPU reference. ``late_consumer``: the last
    rank reads each output ~50 ms late, which exposes a peer writing too early. ``graph`` (cuda): the calls,
    input refills and reads captured once, replayed on fresh inputs. ``buffers``: from ``pipeline_buffers``
    (default: allocated here). Returns an error or None per call, and per call (of the last pass) whether
    it skipped READY with some peer."""
    world, rank = comm.world, comm.rank
    cases = pipeline_cases(op, variant, dtype, count, calls, seed)
    sizes = [numels(c, rank, world) for c in cases]
    n_in, n_out = max(s[0] for s in sizes), max(s[1] for s in sizes)
    torch_dtype = DTYPES[dtype]
    size = torch_dtype.itemsize
    raw_ins, raw_outs = buffers or pipeline_buffers(comm, n_in * size, n_out * size)
    ins = [b[: n_in * size].view(torch_dtype) for b in raw_ins]
    outs = [b[: n_out * size].view(torch_dtype) for b in raw_outs]
    sources = [torch.empty(n, dtype=torch_dtype, device=comm.device) for n, _ in sizes]
    results = [torch.empty(n, dtype=torch_dtype, device=comm.device) for _, n in sizes]
    late = late_consumer and rank == world - 1
    lean: list[bool] = []

    def one_pass() -> None:
        lean.clear()
        for k, case in enumerate(cases):
            slot = 0 if same_output else k % 2
            inp, out = ins[slot][: sizes[k][0]], outs[slot][: sizes[k][1]]
            inp.copy_(sources[k])
            call(comm, case, out, inp, send_counts(case, world))
            lean.append(bool(comm.last_handshake.ready_implied))
            if late:  # a slow reader: the next call must not overwrite what it has not read yet
                torch.cuda._sleep(100_000_000) if comm.device.type == "cuda" else time.sleep(0.05)
            results[k].copy_(out)

    def refill(offset: int) -> None:
        for k, case in enumerate(cases):
            sources[k].copy_(rank_input(replace(case, seed=case.seed + offset), rank, world).to(comm.device))
            results[k].view(torch.uint8).fill_(POISON)

    refill(0)
    if graph:
        one_pass()  # warm-up: plans built, kernels loaded
        torch.cuda.synchronize(comm.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            one_pass()
        offset = 7919 if op != "all_to_all_v" else 0  # a new seed would change all_to_all_v's splits
        refill(offset)
        for out in outs:
            out.view(torch.uint8).fill_(POISON)  # the replay must move the data, whatever the seed
        g.replay()
    else:
        offset = 0
        one_pass()
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    return [_compare(results[k].cpu(), expected_output(replace(c, seed=c.seed + offset), rank, world), "CPU reference")
            for k, c in enumerate(cases)], lean


def run_pipelines(comm, ops: Iterable[str], variants: Iterable[str], dtypes: Iterable[str], counts: Iterable[int],
                  seed: int = 0, calls: int = 6) -> list[dict]:
    """``run_pipeline`` for every exchange op, variant, dtype and count: a result row per call."""
    grid = list(itertools.product([o for o in ops if o in PIPELINE_OPS], variants, dtypes, counts))
    if not grid:
        return []
    # all_to_all_v sends at most 2 x count + 1 elements per peer
    most = max((2 * n + 1) * comm.world * DTYPES[dt].itemsize for _, _, dt, n in grid)
    buffers = pipeline_buffers(comm, most, most)
    rows = []
    for i, (op, v, dt, n) in enumerate(grid):
        errors, _ = run_pipeline(comm, op, v, dt, n, calls, seed + 1000 * i, buffers=buffers)
        for case, error in zip(pipeline_cases(op, v, dt, n, calls, seed + 1000 * i), errors):
            rows.append({**asdict(case), "rank": comm.rank, "ok": error is None, "error": error or ""})
    return rows


def run_cases(comm, all_cases: list[Case], nccl: bool = False, progress: bool = False) -> list[dict]:
    """Every case on this rank; with ``progress``, a line per (op, variant) group with the elapsed time."""
    if not all_cases:
        return []
    world = comm.world
    max_bytes = max(max(numels(c, r, world)) * DTYPES[c.dtype].itemsize for c in all_cases for r in range(world))
    bufs = Buffers(comm, max_bytes)
    results, group, t0 = [], None, time.monotonic()
    for i, case in enumerate(all_cases):
        if progress and (case.op, case.variant) != group:
            group = (case.op, case.variant)
            print(f"  {case.op} {case.variant}: from case {i + 1} of {len(all_cases)}, "
                  f"{time.monotonic() - t0:.0f} s so far", flush=True)
        error = run_case(comm, bufs, case, nccl)
        results.append({**asdict(case), "rank": comm.rank, "ok": error is None, "error": error or ""})
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    return results


def check_rank(rank: int, world: int, args: dict) -> list[dict]:
    from ..communicator import Communicator

    signal = args.get("signal", "memop")
    comm = Communicator(backend=args["backend"], timeout_s=args["timeout_s"], signal=signal,
                        submit=args.get("submit", "python"))
    syncs = [s for s in args["syncs"] if signal == "memop" or s == "reset"]  # copy signals carry a constant 1
    all_cases = cases(args["variants"], args["directions"], args["dtypes"], args["counts"], ops=args["ops"],
                      seed=args["seed"], syncs=syncs)
    try:
        rows = run_cases(comm, all_cases, nccl=args["reference"] == "nccl", progress=rank == 0)
        if "push" in args["directions"] and "reset" in syncs:  # handshake='lean': alternating outputs, one dtype
            if rank == 0:
                print("  handshake=lean pipelines (push, alternating outputs)", flush=True)
            rows += run_pipelines(comm, args["ops"], args["variants"], args["dtypes"][:1], args["counts"],
                                  seed=args["seed"])
        return rows
    finally:
        comm.close()
