"""Argument checks, run before any device work. Each message says what to change."""
from __future__ import annotations

from typing import Sequence

import torch

from .errors import InvalidArgument


def check_world(world: int) -> None:
    if world < 2:
        raise InvalidArgument(f"dmacoll collectives need a process group of at least 2 ranks, got {world}; "
                              "launch more ranks (e.g. torchrun --nproc-per-node 2)")


def check_tensor(name: str, t: object, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise InvalidArgument(f"{name} is on {t.device} but this communicator runs on {device}; "
                              f"move it with {name}.to({str(device)!r})")
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} is not contiguous (strides {tuple(t.stride())}); pass {name}.contiguous()")
    return t


def check_pair(output: torch.Tensor, input: torch.Tensor, device: torch.device) -> None:
    check_tensor("output", output, device)
    check_tensor("input", input, device)
    if output.dtype != input.dtype:
        raise InvalidArgument(f"output dtype {output.dtype} differs from input dtype {input.dtype}; "
                              "use the same dtype for both")


def check_all_gather(output: torch.Tensor, input: torch.Tensor, world: int, device: torch.device) -> None:
    check_pair(output, input, device)
    if output.numel() != world * input.numel():
        raise InvalidArgument(f"all_gather output has {output.numel()} elements but needs world x input = "
                              f"{world} x {input.numel()} = {world * input.numel()}")


def check_all_to_all(output: torch.Tensor, input: torch.Tensor, world: int, device: torch.device) -> None:
    check_pair(output, input, device)
    if input.numel() % world:
        raise InvalidArgument(f"all_to_all input has {input.numel()} elements, not divisible by the world "
                              f"size {world}; pad it or use all_to_all_v with explicit splits")
    if output.numel() != input.numel():
        raise InvalidArgument(f"all_to_all output has {output.numel()} elements but input has "
                              f"{input.numel()}; equal-split all_to_all needs the same number")


# Summed by torch.sum (CPU or GPU kernel): float16/bfloat16 accumulate in float32 and round once.
REDUCE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def check_reduce_dtype(op: str, dtype: torch.dtype) -> None:
    if dtype not in REDUCE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in REDUCE_DTYPES)
        raise InvalidArgument(f"{op} does not sum {dtype}; supported dtypes: {names}; cast the tensors first "
                              "(e.g. bool/int8/uint8 to torch.int32)")


def check_reduce_scatter(output: torch.Tensor, input: torch.Tensor, world: int, device: torch.device) -> None:
    check_pair(output, input, device)
    check_reduce_dtype("reduce_scatter", input.dtype)
    if input.numel() != world * output.numel():
        raise InvalidArgument(f"reduce_scatter input has {input.numel()} elements but needs world x output = "
                              f"{world} x {output.numel()} = {world * output.numel()}")


def check_all_reduce(output: torch.Tensor, input: torch.Tensor, device: torch.device) -> None:
    check_pair(output, input, device)
    check_reduce_dtype("all_reduce", input.dtype)
    if output.numel() != input.numel():
        raise InvalidArgument(f"all_reduce output has {output.numel()} elements but input has {input.numel()}; "
                              "pass tensors of the same size, or one tensor to reduce in place")


def split_matrix(counts: object, world: int) -> list[list[int]]:
    """Normalise a world x world matrix of element counts (list or tensor)."""
    if isinstance(counts, torch.Tensor):
        counts = counts.tolist()
    try:
        rows = [[int(x) for x in row] for row in counts]  # type: ignore[union-attr]
    except TypeError:
        raise InvalidArgument("send_counts must be a world x world matrix (list of lists or tensor) where "
                              "send_counts[i][j] is the number of elements rank i sends to rank j") from None
    if len(rows) != world or any(len(r) != world for r in rows):
        raise InvalidArgument(f"send_counts must be {world} x {world} (one row per sending rank), got "
                              f"{len(rows)} rows of lengths {[len(r) for r in rows]}")
    if any(x < 0 for r in rows for x in r):
        raise InvalidArgument("send_counts holds a negative count; every entry must be >= 0")
    return rows


def check_all_to_all_v(output: torch.Tensor, input: torch.Tensor, counts: Sequence[Sequence[int]], rank: int,
                       device: torch.device) -> None:
    check_pair(output, input, device)
    sends = sum(counts[rank])
    recvs = sum(row[rank] for row in counts)
    if input.numel() < sends:
        raise InvalidArgument(f"rank {rank} sends {sends} elements (row {rank} of send_counts) but its input has "
                              f"only {input.numel()}")
    if output.numel() < recvs:
        raise InvalidArgument(f"rank {rank} receives {recvs} elements (column {rank} of send_counts) but its "
                              f"output has only {output.numel()}")


def check_capacity(what: str, need: int, have: int, hint: str) -> None:
    if need > have:
        raise InvalidArgument(f"{what} needs {need} bytes but only {have} are available; {hint}")
