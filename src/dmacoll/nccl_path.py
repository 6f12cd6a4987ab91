"""The ``nccl`` data path: a call handed to ``torch.distributed`` on the communicator's own process group (NCCL, RCCL
on ROCm). 'auto' takes it where neither of dmacoll's paths was measured faster than NCCL (``options.nccl_auto``), so
the default call is never slower than the baseline; explicit ``path='nccl'`` runs any op there. It uses no copy
engine and no dmacoll flag: NCCL's kernels, on NCCL's stream, ordered after the caller's stream by torch."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist


# torch 2.13 renames the tensor forms (the old names warn on every call, then forward); 2.11 has the old ones only
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def available(group: Optional[dist.ProcessGroup], backend: str) -> bool:
    """Whether ``group`` runs NCCL collectives on this communicator's device tensors."""
    if backend not in ("cuda", "hip") or group is None:
        return False
    try:
        return "nccl" in str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False


def run(op: str, output: torch.Tensor, input: torch.Tensor, matrix: Optional[Sequence[Sequence[int]]],
        group: dist.ProcessGroup, rank: int) -> None:
    """``op`` from ``input`` into ``output`` (the bound, checked request's tensors) on ``group``; ``matrix``:
    all_to_all_v's bytes from rank i to rank j."""
    if output.dim() != 1 or input.dim() != 1:  # contiguous (checked): splits count elements
        output, input = output.view(-1), input.view(-1)  # (only where needed: a view costs microseconds per call)
    if op == "all_reduce":
        if input.data_ptr() != output.data_ptr():
            output.copy_(input)
        dist.all_reduce(output, group=group)
    elif op == "all_gather":
        _ALL_GATHER(output, input, group=group)
    elif op == "reduce_scatter":
        _REDUCE_SCATTER(output, input, group=group)
    elif op == "all_to_all":
        dist.all_to_all_single(output, input, group=group)
    elif op == "all_to_all_v":
        size = input.element_size()
        if input.data_ptr() < output.data_ptr() + output.numel() * size and \
                output.data_ptr() < input.data_ptr() + input.numel() * size:
            input = input.clone()  # in place: NCCL's sends and receives must not overlap
        received = [row[rank] // size for row in matrix]  # elements from each rank, in rank order
        dist.all_to_all_single(output, input, received, [b // size for b in matrix[rank]], group=group)
    else:
        raise ValueError(f"no nccl path for {op}")
