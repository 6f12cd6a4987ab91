"""The ``nccl`` data path: a call handed to the communicator's own process group (NCCL, RCCL on ROCm), as
``torch.distributed``'s functions hand it. 'auto' takes it where neither of dmacoll's paths was measured faster than
NCCL (``options.nccl_auto``), so the default call is never slower than the baseline; explicit ``path='nccl'`` runs
any op there. It uses no copy engine and no dmacoll flag: NCCL's kernels, ordered on the caller's stream by torch."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist


def _blocking(options: type) -> object:
    """One option set for every call of an op: blocking (NCCL runs it on the caller's stream, as torch.distributed's
    own functions ask for ``async_op=False``), the group's timeout, a sum."""
    opts = options()
    if hasattr(opts, "asyncOp"):  # torch < 2.8 has no such field: blocking is its only form there
        opts.asyncOp = False
    return opts


# The process group's own methods, as torch.distributed's functions call them. Those functions add per-call Python
# (argument and group checks, options built anew, a torch-function hook, logging decorators: ~5 us a call on a CPU
# core) that the communicator has done once for these very tensors. Where a torch lacks a method, its function.
_C10D = getattr(torch._C, "_distributed_c10d", None)  # None: a torch built without distributed
_DIRECT = _C10D is not None and all(hasattr(_C10D.ProcessGroup, m) for m in (
    "allreduce", "_allgather_base", "_reduce_scatter_base", "alltoall_base"))
_OPTIONS = {} if not _DIRECT else {
    "all_reduce": _blocking(_C10D.AllreduceOptions), "all_gather": _blocking(_C10D.AllgatherOptions),
    "reduce_scatter": _blocking(_C10D.ReduceScatterOptions), "all_to_all": _blocking(_C10D.AllToAllOptions)}
_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v")
# torch 2.13 renames the functions' tensor forms (the old names warn on every call, then forward); 2.11 has the old
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
    if op not in _OPS:
        raise ValueError(f"no nccl path for {op}")
    splits = None  # all_to_all's: elements received from, sent to each rank ([]: equal)
    if op == "all_reduce" and input.data_ptr() != output.data_ptr():
        output.copy_(input)
    elif op == "all_to_all_v":
        size = input.element_size()
        if input.data_ptr() < output.data_ptr() + output.numel() * size and \
                output.data_ptr() < input.data_ptr() + input.numel() * size:
            input = input.clone()  # in place: NCCL's sends and receives must not overlap
        received = [row[rank] // size for row in matrix]  # elements from each rank, in rank order
        splits = (received, [b // size for b in matrix[rank]])
    elif op == "all_to_all":
        splits = ([], [])
    if not _DIRECT:
        _through_functions(op, output, input, splits, group)
        return
    if op == "all_reduce":
        work = group.allreduce([output], _OPTIONS[op])
    elif op == "all_gather":
        work = group._allgather_base(output, input, _OPTIONS[op])
    elif op == "reduce_scatter":
        work = group._reduce_scatter_base(output, input, _OPTIONS[op])
    else:
        work = group.alltoall_base(output, input, *splits, _OPTIONS["all_to_all"])
    if work is not None:  # a blocking call's wait orders the caller's stream after it (and is a no-op where it ran
        work.wait()       # there); a backend that synchronized in C++ returns none


def _through_functions(op: str, output: torch.Tensor, input: torch.Tensor, splits: Optional[tuple],
                       group: dist.ProcessGroup) -> None:
    """``run`` through torch.distributed's functions (a torch whose process groups lack a method ``run`` calls)."""
    if op == "all_reduce":
        dist.all_reduce(output, group=group)
    elif op == "all_gather":
        _ALL_GATHER(output, input, group=group)
    elif op == "reduce_scatter":
        _REDUCE_SCATTER(output, input, group=group)
    else:
        dist.all_to_all_single(output, input, splits[0] or None, splits[1] or None, group=group)
