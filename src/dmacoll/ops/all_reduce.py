"""All-reduce (sum): every rank gets the elementwise sum of every rank's tensor."""
from __future__ import annotations

import torch

from ..errors import InvalidArgument
from ..plan import all_reduce_one_shot_plans, all_reduce_plans, chunk_elements, one_shot_all_reduce
from .spec import Group, OpSpec, Request, dtype_name, scratch_plans


class AllReduce(OpSpec):
    """Elementwise sum over ranks. In place by default (``tensor`` holds this rank's values and receives the
    sum, like ``torch.distributed.all_reduce``); with ``input``, ``tensor`` is the output.

    Small (``plan.one_shot_all_reduce``: up to 512 KiB, at two ranks 2 MiB): one exchange of whole tensors, then
    a local sum (fewest handshakes). Larger: a reduce-scatter then an all-gather of the summed chunks, two
    exchanges run back to back (least traffic). Chunks are ``torch.tensor_split(tensor.view(-1), world)``'s:
    uneven when the size is not divisible by the world (the first ``numel % world`` ranks sum one element more),
    no padding. Dtypes as for ``reduce_scatter``. Staging: about the tensor's size (plus the input for pull from
    a private input, plus a chunk for a private output; twice the tensor for the one exchange)."""

    name = "all_reduce"
    reduces = True
    in_place = "one tensor is input and output"
    params = ("tensor", "input=None")

    def chunks(self, world: int) -> tuple[int, int]:
        return 1, 1

    def bus_factor(self, world: int) -> float:
        return 2 * (world - 1) / world

    def bind(self, group: Group, output, input=None) -> Request:
        input = self.check_pair(group, output, output if input is None else input)
        if output.numel() != input.numel():
            raise InvalidArgument(f"all_reduce output has {output.numel()} elements but input has "
                                  f"{input.numel()}; pass tensors of the same size, or one tensor to reduce in place")
        world, rank, size, dtype = group.world, group.rank, input.element_size(), dtype_name(input.dtype)
        chunks = tuple(n * size for n in chunk_elements(input.numel(), world))
        total = sum(chunks)
        in_place = input.data_ptr() == output.data_ptr() and input.numel() > 0

        def build(v, d, layout, engines):
            if one_shot_all_reduce(total, world):
                return all_reduce_one_shot_plans(total, world, rank, dtype, v, d, layout, engines)
            return all_reduce_plans(chunks, rank, dtype, v, d, layout, engines)
        return Request(output, input, (total, dtype), total, in_place, scratch_plans(build))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        return torch.stack([x.reshape(-1) for x in inputs]).sum(0)

    def in_place_views(self, output, input, rank):
        return output, output

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        if output.data_ptr() != input.data_ptr():
            output.copy_(input)
        dist.all_reduce(output, group=group)


ALL_REDUCE = AllReduce()
