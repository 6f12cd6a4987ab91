"""The nccl path (``path='nccl'``: the call handed to torch.distributed on the communicator's group, ``nccl_path.py``)
at worlds 2 and 4, a GPU per rank: every op on fresh random data into poisoned outputs, in place where the op has
that form, eager and graph-replayed, and 'auto' taking it above the sm path where the copy engines were not measured
faster (``options.nccl_auto``). NCCL adds along its own order, so float sums are checked within rounding against
test_sm_path's reference; moves and integer sums (wrapping at the dtype's width) exactly."""
from __future__ import annotations

import pytest
import torch

from dmacoll.options import DMA_AUTO_MIN_BYTES

from dmacoll_lab.verify.launch import run_ranks

from test_sm_path import WORLDS, close, draw, expected, ranks_share_gpus, shapes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
OPS = ("all_gather", "all_to_all", "all_reduce", "reduce_scatter")
DTYPES = ("bfloat16", "float32", "int32")


def _calls(rank: int, world: int, seed: int) -> dict:
    import torch.distributed as dist

    from dmacoll import Communicator

    comm = Communicator(timeout_s=30)
    failures, paths = [], set()

    def check(label: str, op: str, y: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        torch.cuda.synchronize()
        if not close(op, y.cpu(), expected(op, world, rank, inputs)):
            failures.append(f"{label} (seed {seed})")
        dist.barrier()

    for op in OPS:
        for name in DTYPES:
            dtype = getattr(torch, name)
            for count in (1, 4099):  # per rank or per peer: one element, an odd count
                n_in, n_out = shapes(op, world, count)
                x, y = comm.empty(n_in, dtype=dtype), torch.empty(n_out, dtype=dtype, device=comm.device)
                inputs = [draw(n_in, dtype, seed + r + count) for r in range(world)]
                x.copy_(inputs[rank].to(comm.device))
                y.fill_(-7)
                comm.collective(op, y, x, path="nccl")
                paths.add(comm.last_options.path)
                check(f"{op} {name} {count} eager", op, y, inputs)
    # in place: all_reduce (input omitted), all_gather into its own chunk, reduce_scatter from its own chunk
    n = world * 1031
    inputs = [draw(n, torch.bfloat16, seed + 50 + r) for r in range(world)]
    t = comm.empty(n, dtype=torch.bfloat16)
    t.copy_(inputs[rank].to(comm.device))
    comm.all_reduce(t, path="nccl")
    check("all_reduce in place", "all_reduce", t, inputs)
    chunks = [draw(1031, torch.bfloat16, seed + 60 + r) for r in range(world)]
    t.fill_(-7)
    mine = t[rank * 1031:(rank + 1) * 1031]
    mine.copy_(chunks[rank].to(comm.device))
    comm.all_gather(t, mine, path="nccl")
    check("all_gather in place", "all_gather", t, chunks)
    t.copy_(inputs[rank].to(comm.device))
    mine = t[rank * 1031:(rank + 1) * 1031]
    comm.reduce_scatter(mine, t, path="nccl")
    check("reduce_scatter in place", "reduce_scatter", mine, inputs)
    # all_to_all_v: seeded uneven counts (an empty one too), in elements
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 700, (world, world), generator=g).tolist()
    counts[0][world - 1] = 0
    sent = [draw(sum(counts[r]), torch.bfloat16, seed + 70 + r) for r in range(world)]
    # the heap holds the same shapes on every rank: the longest row, each rank sending a view of its own length
    x = comm.empty(max(sum(row) for row in counts), dtype=torch.bfloat16)[:sum(counts[rank])]
    x.copy_(sent[rank].to(comm.device))
    y = torch.full((sum(row[rank] for row in counts),), -7, dtype=torch.bfloat16, device=comm.device)
    comm.all_to_all_v(y, x, counts, path="nccl")
    torch.cuda.synchronize()
    want = torch.cat([sent[r][sum(counts[r][:rank]): sum(counts[r][:rank + 1])] for r in range(world)])
    if not torch.equal(y.cpu(), want):
        failures.append(f"all_to_all_v {counts} (seed {seed})")
    dist.barrier()
    # graph-replayed: three calls per graph, fresh data every replay
    for op in ("all_reduce", "all_gather"):
        n_in, n_out = shapes(op, world, 4099)
        x, y = comm.empty(n_in, dtype=torch.bfloat16), comm.empty(n_out, dtype=torch.bfloat16)
        comm.collective(op, y, x, path="nccl")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(3):
                comm.collective(op, y, x, path="nccl")
        for replay in range(3):
            inputs = [draw(n_in, torch.bfloat16, seed + 90 + 10 * replay + r) for r in range(world)]
            x.copy_(inputs[rank].to(comm.device))
            y.fill_(-7)
            graph.replay()
            check(f"{op} graph replay {replay}", op, y, inputs)
    # 'auto': a sum above the sm path goes to NCCL (at world 4 the copy engines lose at 96 MB; at world 2 they win
    # there but their chunks need more than the 16 MB staging area), a small one to the sm path
    big = torch.zeros(48 << 20, dtype=torch.bfloat16, device=comm.device)  # 96 MB: above the sm path at worlds 2, 4
    comm.all_reduce(big)
    auto = {"large all_reduce": comm.last_options.path}
    comm.all_reduce(big[:512])
    auto["small all_reduce"] = comm.last_options.path
    torch.cuda.synchronize()
    comm.close()
    # the same sum at the size from which the copy engines beat NCCL: with a staging area that holds its chunks
    # 'auto' takes the copy engines (above: 16 MB of staging, too small, so NCCL)
    n = DMA_AUTO_MIN_BYTES[world, "all_reduce"] // 2
    staged = Communicator(timeout_s=30, staging_bytes=3 * world * n * 2)
    t = torch.full((n,), rank + 1, dtype=torch.bfloat16, device=staged.device)
    staged.all_reduce(t)
    auto["staged large all_reduce"] = staged.last_options.path
    torch.cuda.synchronize()
    if not bool((t == world * (world + 1) // 2).all()):
        failures.append(f"staged all_reduce of {n} elements (seed {seed})")
    staged.close()
    return {"failures": failures, "paths": paths, "auto": auto}


@pytest.mark.parametrize("world", WORLDS)
def test_nccl_path_matches_the_reference_and_auto_takes_it_above_the_sm_path(world, seed):
    if ranks_share_gpus(world):
        pytest.skip(f"{world} ranks need a GPU each: NCCL refuses ranks that share one")
    results = run_ranks(_calls, world, seed, device="cuda", timeout_s=300)
    for r in results:
        assert not r["failures"], r["failures"]
        assert r["paths"] == {"nccl"}, r
        assert r["auto"] == {"large all_reduce": "nccl", "small all_reduce": "sm", "staged large all_reduce": "dma"}, r
