"""The local step of the reduce collectives, shared by the backends that compute with torch."""
from __future__ import annotations

import torch


def sum_slots(block: torch.Tensor, out: torch.Tensor, count: int, dtype: str) -> None:
    """``out`` = elementwise sum of the ``count`` equal slots of ``block`` (both byte views), as ``dtype``.

    One ``torch.sum`` over a [count, n] view: float16/bfloat16 accumulate in float32 and round once;
    on a GPU it is one kernel on the current stream with no host sync, so graph capture works."""
    kind = getattr(torch, dtype)
    torch.sum(block.view(kind).view(count, -1), dim=0, dtype=kind, out=out.view(kind))
