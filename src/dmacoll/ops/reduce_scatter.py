"""Reduce-scatter (sum): rank r's output is the sum over ranks of chunk r of their input."""
from __future__ import annotations

import torch

from ..errors import InvalidArgument
from ..plan import reduce_scatter_plans
from .spec import Group, OpSpec, Request, dtype_name, nbytes, scratch_plans


class ReduceScatter(OpSpec):
    """``output`` (n elements) = the elementwise sum over ranks of chunk ``rank`` of their ``input`` (world x n
    elements), like ``torch.distributed.reduce_scatter_tensor`` with SUM.

    The peers' chunks move on copy engines into a staging block of this rank (one slot per peer); after the
    DONE waits a small kernel on the caller's stream adds them to the own chunk, read in place. ``output`` may
    be (part of) ``input``. Dtypes: float32, float64, float16, bfloat16 (summed in float32, rounded once),
    int32, int64. Staging: world x n elements (plus the input for pull from a private input)."""

    name = "reduce_scatter"
    reduces = True
    in_place = "output is this rank's chunk of the input"

    def chunks(self, world: int) -> tuple[int, int]:
        return world, 1

    def bind(self, group: Group, output, input=None) -> Request:
        input = self.check_pair(group, output, input)
        if input.numel() != group.world * output.numel():
            raise InvalidArgument(f"reduce_scatter input has {input.numel()} elements but needs world x output = "
                                  f"{group.world} x {output.numel()} = {group.world * output.numel()}")
        size, dtype, world, rank = nbytes(output), dtype_name(output.dtype), group.world, group.rank
        in_place = output.data_ptr() == input.data_ptr() + rank * size and size > 0
        return Request(output, input, (size, dtype), nbytes(input), in_place, scratch_plans(
            lambda v, d, layout, engines: reduce_scatter_plans(world, size, rank, dtype, v, d, layout, engines)))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        return torch.stack([x.reshape(-1).chunk(len(inputs))[rank] for x in inputs]).sum(0)

    def in_place_views(self, output, input, rank):
        n = output.numel()
        return input[rank * n: (rank + 1) * n], input

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        dist.reduce_scatter_tensor(output, input, group=group)


REDUCE_SCATTER = ReduceScatter()
