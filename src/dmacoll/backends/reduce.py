"""The local step of the reduce collectives, shared by the backends that compute with torch."""
from __future__ import annotations

import torch


def sum_slots(block: torch.Tensor, out: torch.Tensor, count: int, dtype: str) -> None:
    """``out`` = elementwise sum of the ``count`` equal slots of ``block`` (both byte views), as ``dtype``.

    One ``torch.sum`` over a [count, n] view: float16/bfloat16 accumulate in float32 and round once;
    on a GPU it is one kernel on the current stream with no host sync, so graph capture works."""
    kind = getattr(torch, dtype)
    torch.sum(block.view(kind).view(count, -1), dim=0, dtype=kind, out=out.view(kind))


def local_bytes(heap: torch.Tensor, rank: int, ref, nbytes: int, bases) -> torch.Tensor:
    """Bytes of this rank's memory as a tensor: the symmetric heap, or the caller's input/output."""
    if ref.space == "sym":
        assert ref.rank == rank, f"a reduction reads and writes local memory only, not {ref}"
        base = heap
    else:
        base = bases["tensors"][ref.space].view(-1).view(torch.uint8)
    return base[ref.offset: ref.offset + nbytes]


def reduce_step(queue, step, heap: torch.Tensor, rank: int, bases) -> None:
    """A plan's Reduce as one torch kernel on ``queue``: after what is queued there, no host sync, capturable."""
    with torch.cuda.stream(queue):
        sum_slots(local_bytes(heap, rank, step.src, step.count * step.nbytes, bases),
                  local_bytes(heap, rank, step.dst, step.nbytes, bases), step.count, step.dtype)
