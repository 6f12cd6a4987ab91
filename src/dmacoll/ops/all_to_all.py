"""All-to-all with equal splits: chunk p of a rank's input goes to rank p."""
from __future__ import annotations

import torch

from ..errors import InvalidArgument
from ..plan import all_to_all_exchange
from .spec import Group, OpSpec, Request, byte_view, exchange_plans, nbytes


class AllToAll(OpSpec):
    """Equal split: chunk p of ``input`` goes to rank p, chunk p of ``output`` comes from rank p."""

    name = "all_to_all"

    def chunks(self, world: int) -> tuple[int, int]:
        return world, world

    def bind(self, group: Group, output, input=None) -> Request:
        input = self.check_pair(group, output, input)
        world = group.world
        if input.numel() % world:
            raise InvalidArgument(f"all_to_all input has {input.numel()} elements, not divisible by the world "
                                  f"size {world}; pad it or use all_to_all_v with explicit splits")
        if output.numel() != input.numel():
            raise InvalidArgument(f"all_to_all output has {output.numel()} elements but input has "
                                  f"{input.numel()}; equal-split all_to_all needs the same number")
        chunk = nbytes(input) // world
        return Request(output, input, (chunk,), nbytes(input), False, exchange_plans(
            lambda: all_to_all_exchange([[chunk] * world for _ in range(world)]), group.rank))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        world = len(inputs)
        return torch.cat([x.reshape(-1).chunk(world)[rank] for x in inputs])

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        dist.all_to_all_single(byte_view(output), byte_view(input), group=group)


ALL_TO_ALL = AllToAll()
