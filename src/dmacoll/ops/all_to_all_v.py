"""All-to-all with a split matrix: ``send_counts[i][j]`` elements from rank i to rank j."""
from __future__ import annotations

import random
from typing import Optional

import torch

from .. import validate
from ..errors import InvalidArgument
from ..plan import all_to_all_exchange
from .spec import Counts, Group, OpSpec, Request, byte_view, exchange_plans


class AllToAllV(OpSpec):
    """``send_counts[i][j]``: elements rank i sends to rank j (the same matrix on every rank). Rank r's input
    holds its chunks for ranks 0..n-1 in order; its output the chunks from ranks 0..n-1 in order."""

    name = "all_to_all_v"
    params = ("output", "input", "send_counts")

    tuning_op = "all_to_all"  # its variants behave as the equal-split all-to-all's

    def chunks(self, world: int) -> tuple[int, int]:
        return world, world  # the nominal sizes: a benchmark's bytes per rank

    def numels(self, chunk: int, world: int, rank: int, counts: Counts = None) -> tuple[int, int]:
        counts = self.counts(chunk, world) if counts is None else counts
        return sum(counts[rank]), sum(row[rank] for row in counts)

    def result_numel(self, world: int, rank: int, input: torch.Tensor, send_counts=None) -> tuple[int, int]:
        if send_counts is None:
            raise InvalidArgument("all_to_all_v needs send_counts: result('all_to_all_v', input, send_counts)")
        columns = [sum(col) for col in zip(*validate.split_matrix(send_counts, world))]
        return columns[rank], max(columns)  # every rank reserves the largest column

    def counts(self, chunk: int, world: int, seed: Optional[int] = None) -> Counts:
        """With a seed, random splits with empty and odd ones (correctness); without, a fixed skew whose rows
        send about ``world x chunk`` elements, from 2/(world+1) to 2 world/(world+1) chunks per peer (benchmarks)."""
        if seed is not None:
            rng = random.Random(seed)
            return [[rng.choice((0, 1, chunk, 2 * chunk + 1)) for _ in range(world)] for _ in range(world)]
        return [[chunk * 2 * (1 + (i + j) % world) // (world + 1) for j in range(world)] for i in range(world)]

    def bind(self, group: Group, output, input=None, send_counts=None) -> Request:
        input = self.check_pair(group, output, input)
        if send_counts is None:
            raise InvalidArgument("all_to_all_v needs send_counts: all_to_all_v(output, input, send_counts)")
        counts = validate.split_matrix(send_counts, group.world)
        rank = group.rank
        sends, recvs = sum(counts[rank]), sum(row[rank] for row in counts)
        if input.numel() < sends:
            raise InvalidArgument(f"rank {rank} sends {sends} elements (row {rank} of send_counts) but its input "
                                  f"has only {input.numel()}")
        if output.numel() < recvs:
            raise InvalidArgument(f"rank {rank} receives {recvs} elements (column {rank} of send_counts) but its "
                                  f"output has only {output.numel()}")
        size = input.element_size()
        matrix = tuple(tuple(c * size for c in row) for row in counts)
        # the tuning table is looked up by the largest row, the same on every rank (each rank's own row or buffer
        # would let ranks pick different variants, whose plans do not meet)
        return Request(output, input, (matrix,), max(map(sum, matrix)), False,
                       exchange_plans(lambda: all_to_all_exchange([list(row) for row in matrix]), rank))

    def reference(self, inputs, rank, counts=None) -> torch.Tensor:
        chunks = []
        for p, x in enumerate(inputs):
            start = sum(counts[p][:rank])
            chunks.append(x.reshape(-1)[start: start + counts[p][rank]])
        return torch.cat(chunks)

    def torch_call(self, output, input, group=None, counts=None) -> None:
        import torch.distributed as dist

        rank, size = dist.get_rank(group), input.element_size()
        send = [c * size for c in counts[rank]]
        recv = [row[rank] * size for row in counts]
        dist.all_to_all_single(byte_view(output)[: sum(recv)], byte_view(input)[: sum(send)], recv, send,
                               group=group)


ALL_TO_ALL_V = AllToAllV()
