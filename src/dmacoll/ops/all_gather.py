"""All-gather: every rank's input, concatenated in rank order, on every rank."""
from __future__ import annotations

import torch

from .. import validate
from ..errors import InvalidArgument
from ..plan import all_gather_exchange
from .spec import Group, OpSpec, Request, byte_view, exchange_plans, nbytes


class AllGather(OpSpec):
    """``output`` = concatenation of every rank's ``input``; in place when ``input`` is this rank's slice of
    ``output``."""

    name = "all_gather"
    in_place = "input is this rank's chunk of the output"

    def chunks(self, world: int) -> tuple[int, int]:
        return 1, world

    def total_bytes(self, bytes_per_rank: int, world: int) -> int:
        return bytes_per_rank * world

    def bind(self, group: Group, output, input=None) -> Request:
        input = self.check_pair(group, output, input)
        if output.numel() != group.world * input.numel():
            raise InvalidArgument(f"all_gather output has {output.numel()} elements but needs world x input = "
                                  f"{group.world} x {input.numel()} = {group.world * input.numel()}")
        size = nbytes(input)
        in_place = input.data_ptr() == output.data_ptr() + group.rank * size and size > 0
        return Request(output, input, (size, in_place), size, in_place,
                       exchange_plans(lambda: all_gather_exchange(group.world, size, in_place), group.rank))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        return torch.cat([x.reshape(-1) for x in inputs])

    def in_place_views(self, output, input, rank):
        n = input.numel()
        return output, output[rank * n: (rank + 1) * n]

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        out, inp = byte_view(output), byte_view(input)
        # NCCL gathers in place; gloo is not promised to
        if out.device.type == "cpu" and validate.overlap_bytes(out, inp):
            inp = inp.clone()
        dist.all_gather_into_tensor(out, inp, group=group)


ALL_GATHER = AllGather()
