"""The nccl path's dispatch (``dmacoll.nccl_path.run``) on gloo, CPU ranks at worlds 2-4: each op's call into the
process group's own methods (never through torch.distributed's functions), or into those functions where a torch
lacks a method (the tensor forms torch has, flat views only where a tensor is not flat, all_reduce's copy
out of place, all_to_all_v's splits from the matrix, its input cloned in place) against references built from
every rank's input. The same code runs on NCCL groups on GPUs (tests/gpu/test_nccl_path.py); what differs there is
NCCL, not this dispatch."""
from __future__ import annotations

import random

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks


def _inputs(seed: int, world: int, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-1000, 1000, (numel,), generator=g).to(dtype) for _ in range(world)]


def _cases(rank: int, world: int, seed: int, direct: bool) -> list[str]:
    import torch.distributed as dist

    from dmacoll import nccl_path

    nccl_path._DIRECT = direct
    if direct:  # the functions' per-call Python is what the direct calls skip: reaching one is a failure
        def refuse(*args, **kwargs):
            raise AssertionError("a direct call went through a torch.distributed function")
        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single",
                     "reduce_scatter_single", "all_to_all_single"):
            if hasattr(dist, name):
                setattr(dist, name, refuse)
    rng = random.Random(seed)
    group, failures = dist.group.WORLD, []
    for dtype in (torch.float32, torch.int64):
        for count in (1, 17, 4099):  # per rank, per peer for the chunked ops
            for shape in ("flat", "2d"):
                xs = _inputs(seed + count, world, world * count, dtype)
                mine = xs[rank].clone()
                cases = {
                    "all_gather": (mine[:count], torch.cat([x[:count] for x in xs])),
                    "reduce_scatter": (mine, sum(x.chunk(world)[rank] for x in xs)),
                    "all_to_all": (mine, torch.cat([x.chunk(world)[rank] for x in xs])),
                    "all_reduce": (mine, sum(xs)),
                }
                for op, (x, want) in cases.items():
                    y = torch.full_like(want, 77)  # poison
                    if shape == "2d":
                        x, y = x.view(1, -1), y.view(1, -1)  # not flat: the dispatch flattens them
                    nccl_path.run(op, y, x, None, group, rank)
                    if not torch.equal(y.reshape(-1), want):
                        failures.append(f"{op} {dtype} count {count} {shape} (seed {seed})")
                z = mine.clone()  # all_reduce in place
                nccl_path.run("all_reduce", z, z, None, group, rank)
                if not torch.equal(z, sum(xs)):
                    failures.append(f"all_reduce in place {dtype} count {count} (seed {seed})")
    size = torch.empty((), dtype=torch.int64).element_size()
    for trial in range(4):  # all_to_all_v: seeded uneven splits in bytes, empty rows included; in place too
        counts = [[rng.choice((0, 1, 5, 33)) for _ in range(world)] for _ in range(world)]
        matrix = tuple(tuple(c * size for c in row) for row in counts)
        xs = _inputs(seed + 100 + trial, world, max(1, max(map(sum, counts))), torch.int64)
        want = torch.cat([xs[q][sum(counts[q][:rank]): sum(counts[q][:rank]) + counts[q][rank]] for q in range(world)])
        x = xs[rank][: sum(counts[rank])].clone()
        y = torch.full((sum(row[rank] for row in counts),), 77, dtype=torch.int64)
        nccl_path.run("all_to_all_v", y, x, matrix, group, rank)
        if not torch.equal(y, want):
            failures.append(f"all_to_all_v counts {counts} (seed {seed})")
        both = torch.full((max(x.numel(), y.numel()),), 77, dtype=torch.int64)  # in place: one buffer
        both[: x.numel()] = x
        nccl_path.run("all_to_all_v", both[: y.numel()], both[: x.numel()], matrix, group, rank)
        if not torch.equal(both[: y.numel()], want):
            failures.append(f"all_to_all_v in place counts {counts} (seed {seed})")
    with pytest.raises(ValueError, match="no nccl path for broadcast"):
        nccl_path.run("broadcast", y, x, None, group, rank)
    return failures


@pytest.mark.parametrize("direct", [True, False], ids=["process_group", "functions"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_each_op_reaches_torch_distributed_as_its_reference_says(world, direct, seed):
    from dmacoll import nccl_path

    if direct and not nccl_path._DIRECT:
        pytest.skip("this torch's process groups lack a method the direct calls use")
    for failures in run_ranks(_cases, world, seed, direct, timeout_s=240):
        assert failures == [], failures
