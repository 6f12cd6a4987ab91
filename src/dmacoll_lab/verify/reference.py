"""The one reference every check uses: seeded inputs, the exact expected output, and the comparison.

Every rank derives every rank's input from a seed, so each rank can compute its own expected output (the op
spec's ``reference``) without communicating. Collectives that only move data are compared byte for byte, and
so are integer sums. Floating-point sums depend on the summation order, so they are compared with the exact
sum (float64) within ``(world + 1) x eps x sum |x_i|`` per element: over twice the worst-case error of adding
``world`` values one after the other and rounding each time (NCCL's ring does that; dmacoll's torch.sum adds in
float32 and rounds once). Benchmarks draw small integers for sums instead (``exact_sums``), whose sums are exact
in any order and dtype, so their outputs compare byte for byte too. Unwritten outputs cannot pass: outputs are
poisoned first (float sums with NaN, everything else with the byte 0xA5).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from dmacoll.lab_api import Counts, OpSpec

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
POISON = 0xA5
INT_SUM_RANGE = 1 << 20  # integer inputs of sums lie in [-range, range]: no overflow at any world size
EXACT_SUM_RANGE = 4      # exact_sums: float inputs in [-4, 4], so any sum of up to 32 ranks is exact in bf16


def draw(spec: OpSpec, numel: int, dtype: torch.dtype, seed: int, device="cpu", exact_sums: bool = False):
    """One rank's input: random data of ``dtype`` (every bit pattern matters for data movement); for sums,
    integers small enough not to overflow, or (``exact_sums``) floats that sum exactly in any order."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if spec.reduces and (exact_sums or not dtype.is_floating_point):
        bound = EXACT_SUM_RANGE if dtype.is_floating_point else INT_SUM_RANGE
        return torch.randint(-bound, bound + 1, (numel,), generator=gen, device=device).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=gen, dtype=torch.float32, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen, device=device).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (numel,), generator=gen,
                         dtype=torch.int64, device=device).to(dtype)


def expected(spec: OpSpec, inputs: Sequence[torch.Tensor], rank: int, counts: Counts = None
             ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``rank``'s exact output and, for sums, the sum of the magnitudes (float64 / int64); else None."""
    if not spec.reduces:
        return spec.reference(inputs, rank, counts), None
    wide = [x.to(torch.float64 if x.dtype.is_floating_point else torch.int64) for x in inputs]
    return spec.reference(wide, rank, counts), spec.reference([x.abs() for x in wide], rank, counts)


def fuzzy(spec: OpSpec, dtype: torch.dtype) -> bool:
    """Whether outputs are compared within a tolerance (float sums) rather than byte for byte."""
    return spec.reduces and dtype.is_floating_point


def poison(spec: OpSpec, *outputs: torch.Tensor) -> None:
    for t in outputs:
        if t.numel() == 0:
            continue
        if fuzzy(spec, t.dtype):
            t.fill_(float("nan"))
        else:
            t.view(torch.uint8).fill_(POISON)


def mismatch(spec: OpSpec, got: torch.Tensor, inputs: Sequence[torch.Tensor], rank: int, counts: Counts = None,
             what: str = "reference", exact_sums: bool = False) -> Optional[str]:
    """None if ``got`` is ``rank``'s right output, else what is wrong. ``exact_sums``: the inputs came from
    ``draw(..., exact_sums=True)``, so a sum is exact in the inputs' own dtype and compared byte for byte."""
    if exact_sums or not fuzzy(spec, got.dtype):
        want = spec.reference(inputs, rank, counts) if exact_sums or not spec.reduces else \
            expected(spec, inputs, rank, counts)[0]
        return compare_bytes(got, want.to(got.dtype), what)
    want, magnitude = expected(spec, inputs, rank, counts)
    return compare_sum(got, want, magnitude, len(inputs), what)


def compare_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> Optional[str]:
    got, want = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8).to(got.device)
    if torch.equal(got, want):
        return None
    bad = (got != want).nonzero()
    return f"{bad.numel()} of {want.numel()} bytes differ from the {what}, first at byte {int(bad[0])}"


def compare_sum(got: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, world: int, what: str,
                slack: float = 1) -> Optional[str]:
    """Per element: |got - exact| <= slack x (world + 1) x eps x sum |x_i| (NaN, e.g. poison, fails)."""
    info = torch.finfo(got.dtype)
    exact, magnitude = exact.to(got.device), magnitude.to(got.device)
    tol = slack * ((world + 1) * info.eps * magnitude + info.tiny)
    err = (got.reshape(-1).to(torch.float64) - exact.reshape(-1)).abs()
    bad = (~(err <= tol.reshape(-1))).nonzero()
    if bad.numel() == 0:
        return None
    i = int(bad[0])
    return (f"{bad.numel()} of {exact.numel()} elements differ from the {what} by more than "
            f"{slack:g} x (world + 1) x eps x sum |x_i|, first at element {i}: {float(got.reshape(-1)[i])!r} "
            f"vs {float(exact.reshape(-1)[i])!r}")
