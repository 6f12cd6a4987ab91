"""Argument checks shared by every collective, run before any device work (each op's own rules are in its
spec, ``dmacoll.ops``). Each message says what to change."""
from __future__ import annotations

import operator

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


def overlap_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """Bytes two (contiguous) tensors share, by address range: two views of one storage overlap only where their
    bytes do (the symmetric heap is one storage, and two ``Communicator.empty`` tensors share none)."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return max(0, min(a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()) - max(a0, b0))


def check_overlap(op: str, output: torch.Tensor, input: torch.Tensor, in_place: bool, form: str) -> None:
    """Refuse an input that overlaps the output unless the call is the op's in-place form (``form``, '' if it has
    none): a peer would write what this rank is still sending, or read what it already overwrote."""
    shared = 0 if in_place else overlap_bytes(output, input)
    if shared:
        rule = f"its in-place form is: {form}" if form else f"{op} has no in-place form"
        raise InvalidArgument(f"{op}: the input and the output overlap ({shared} bytes in common) and {rule}; "
                              "pass tensors that do not overlap")


def _count(x: object) -> int:
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        raise InvalidArgument(f"send_counts holds {x!r}, a bool; every entry must be a whole number of elements")
    try:
        return operator.index(x)  # int, numpy / torch integers; not 1.5, nor 2.0
    except TypeError:
        raise InvalidArgument(f"send_counts holds {x!r}, not a whole number; every entry must be an integer "
                              "count of elements (an int, or an integer tensor)") from None


def split_matrix(counts: object, world: int) -> list[list[int]]:
    """Normalise a world x world matrix of element counts (list or tensor): integers >= 0."""
    if isinstance(counts, torch.Tensor):
        counts = counts.tolist()
    try:
        rows = [list(row) for row in counts]  # type: ignore[union-attr]
    except TypeError:
        raise InvalidArgument("send_counts must be a world x world matrix (list of lists or tensor) where "
                              "send_counts[i][j] is the number of elements rank i sends to rank j") from None
    if len(rows) != world or any(len(r) != world for r in rows):
        raise InvalidArgument(f"send_counts must be {world} x {world} (one row per sending rank), got "
                              f"{len(rows)} rows of lengths {[len(r) for r in rows]}")
    rows = [[_count(x) for x in row] for row in rows]
    if any(x < 0 for r in rows for x in r):
        raise InvalidArgument("send_counts holds a negative count; every entry must be >= 0")
    return rows


def check_capacity(what: str, need: int, have: int, hint: str) -> None:
    if need > have:
        raise InvalidArgument(f"{what} needs {need} bytes but only {have} are available; {hint}")
