"""The local step of the reduce collectives, shared by the backends that compute with torch."""
from __future__ import annotations

from typing import Optional

import torch


def sum_slots(block: torch.Tensor, out: torch.Tensor, count: int, dtype: str,
              own: Optional[torch.Tensor] = None) -> None:
    """``out`` = elementwise sum of the ``count`` equal slots of ``block`` plus ``own`` (all byte views;
    ``out`` may alias ``own``), as ``dtype``.

    float16/bfloat16 accumulate in float32 and round once. On a GPU these are one or two kernels on
    the current stream with no host sync (the float32 partial comes from the caching allocator), so
    graph capture works."""
    kind = getattr(torch, dtype)
    slots, out = block.view(kind).view(count, -1), out.view(kind)
    if own is None:
        torch.sum(slots, dim=0, dtype=kind, out=out)
    elif count == 1:  # elementwise add computes half types in float32 and rounds once
        torch.add(slots[0], own.view(kind), out=out)
    else:
        wide = torch.float32 if kind in (torch.float16, torch.bfloat16) else kind
        torch.add(torch.sum(slots, dim=0, dtype=wide), own.view(kind), out=out)


def local_bytes(heap: torch.Tensor, rank: int, ref, nbytes: int, bases) -> torch.Tensor:
    """Bytes of this rank's memory as a tensor: the symmetric heap, or the caller's input/output."""
    if ref.space == "sym":
        assert ref.rank == rank, f"a reduction reads and writes local memory only, not {ref}"
        base = heap
    else:
        base = bases["tensors"][ref.space].view(-1).view(torch.uint8)
    return base[ref.offset: ref.offset + nbytes]


def reduce_step(queue, step, heap: torch.Tensor, rank: int, bases) -> None:
    """A plan's Reduce as torch kernels on ``queue``: after what is queued there, no host sync, capturable."""
    with torch.cuda.stream(queue):
        sum_slots(*reduce_operands(lambda ref, n: local_bytes(heap, rank, ref, n, bases), step))


def reduce_operands(view, step) -> tuple:
    """``sum_slots``'s arguments for a plan's Reduce; ``view(ref, nbytes)`` gives local bytes."""
    own = view(step.own, step.nbytes) if step.own is not None else None
    return view(step.src, step.count * step.nbytes), view(step.dst, step.nbytes), step.count, step.dtype, own
