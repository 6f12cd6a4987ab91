"""Correctness cases: fresh random data, poisoned outputs, exact comparison.

Every rank derives every rank's input from the case seed, so each rank can
build the expected output itself (the CPU reference); on GPUs the reference
can also be NCCL run on the same inputs. Comparison is bit-exact on bytes:
collectives move data, they do not compute.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

import torch

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
OPS = ("all_gather", "all_to_all", "all_to_all_v")
POISON = 0xA5


@dataclass(frozen=True)
class Case:
    op: str
    variant: str
    direction: str
    dtype: str
    count: int          # elements per chunk (per peer for all_to_all)
    buffers: str        # "sym" (Communicator.empty) or "private"
    in_place: bool = False
    sync: str = "reset"
    seed: int = 0

    def label(self) -> str:
        place = "/in-place" if self.in_place else ""
        return (f"{self.op} {self.variant}/{self.direction}/{self.sync} {self.dtype} x{self.count} "
                f"{self.buffers}{place}")


def random_tensor(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (numel,), generator=gen, dtype=torch.int64).to(dtype)


def send_counts(case: Case, world: int) -> list[list[int]]:
    """The split matrix for a case; equal splits except for all_to_all_v (zeros included)."""
    if case.op != "all_to_all_v":
        return [[case.count] * world for _ in range(world)]
    rng = random.Random(case.seed)
    return [[rng.choice((0, 1, case.count, 2 * case.count + 1)) for _ in range(world)] for _ in range(world)]


def rank_input(case: Case, rank: int, world: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(case.seed * 1009 + rank)
    numel = case.count if case.op == "all_gather" else sum(send_counts(case, world)[rank])
    return random_tensor(numel, DTYPES[case.dtype], gen)


def expected_output(case: Case, rank: int, world: int) -> torch.Tensor:
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
    out = []
    for i, (op, v, d, dt, n, b, s) in enumerate(itertools.product(ops, variants, directions, dtypes, counts,
                                                                  buffers, syncs)):
        out.append(Case(op, v, d, dt, n, b, False, s, seed + i))
        if op == "all_gather":
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
        if case.in_place:
            inp = out[self.comm.rank * in_numel: (self.comm.rank + 1) * in_numel]
        return out, inp


def call(comm, case: Case, out: torch.Tensor, inp: torch.Tensor, counts: Optional[list[list[int]]] = None):
    opts = dict(variant=case.variant, direction=case.direction, sync=case.sync)
    if case.op == "all_gather":
        return comm.all_gather(out, inp, **opts)
    if case.op == "all_to_all":
        return comm.all_to_all(out, inp, **opts)
    return comm.all_to_all_v(out, inp, counts, **opts)


def nccl_reference(case: Case, inp: torch.Tensor, out_numel: int, counts: list[list[int]], rank: int) -> torch.Tensor:
    """The same collective through torch.distributed (NCCL on GPUs), on the bytes."""
    import torch.distributed as dist

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
    out.view(torch.uint8).fill_(POISON) if out.numel() else None
    inp.copy_(host_in.to(inp.device))
    sent = inp.clone()  # in place, the input is overwritten by the collective
    call(comm, case, out, inp, counts)
    error = _compare(out.cpu(), expect, "CPU reference")
    if error is None and nccl:
        error = _compare(out.cpu(), nccl_reference(case, sent, expect.numel(), counts, rank).cpu(), "NCCL")
    return error


def _compare(got: torch.Tensor, expect: torch.Tensor, what: str) -> Optional[str]:
    got, expect = got.reshape(-1).view(torch.uint8), expect.reshape(-1).view(torch.uint8)
    if torch.equal(got, expect):
        return None
    bad = (got != expect).nonzero()
    return f"{bad.numel()} of {expect.numel()} bytes differ from the {what}, first at byte {int(bad[0])}"


def run_cases(comm, all_cases: list[Case], nccl: bool = False) -> list[dict]:
    if not all_cases:
        return []
    world = comm.world
    max_bytes = max(max(expected_output(c, r, world).numel(), rank_input(c, r, world).numel())
                    * DTYPES[c.dtype].itemsize for c in all_cases for r in range(world))
    bufs = Buffers(comm, max_bytes)
    results = []
    for case in all_cases:
        error = run_case(comm, bufs, case, nccl)
        results.append({**asdict(case), "rank": comm.rank, "ok": error is None, "error": error or ""})
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)
    return results
