"""The checks of tests/test_misuse.py on the cuda backend: the cross-rank check through the process group
(``cpu:gloo,cuda:nccl`` with a GPU per rank, gloo where the ranks share one), eager and while capturing a graph;
overlaps and a closed communicator refused.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_cuda_checks.py``.
"""
from __future__ import annotations

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _outcome(fn):
    from dmacoll import InvalidArgument

    try:
        return "ok", fn()
    except InvalidArgument as e:
        return "refused", str(e)


def _checks(rank: int, world: int) -> dict:
    from dmacoll import Communicator, Options

    comm = Communicator(timeout_s=30, options=Options(check_calls=True))
    dev, n = comm.device, 1024
    x, out = comm.empty(n), comm.empty(n * world)
    x.fill_(rank + 1.0)
    o = {"eager": _outcome(lambda: comm.all_gather(out, x).cpu().tolist())}
    counts = [[1 + i + j for j in range(world)] for i in range(world)]
    v_out = torch.empty(sum(r[rank] for r in counts), device=dev)
    o["a2av"] = _outcome(lambda: comm.all_to_all_v(v_out, torch.full((sum(counts[rank]),), rank + 1.0, device=dev),
                                                   counts).cpu().tolist())
    # capture with the check on: it runs (on the host, through gloo) while capturing; replays move fresh data
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        comm.all_gather(out, x)
    x.fill_(10.0 * (rank + 1))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    o["replay"] = out.cpu().tolist()
    o["sizes"] = _outcome(lambda: comm.all_gather(torch.empty(world * (n if rank else n // 2), device=dev),
                                                  torch.ones(n if rank else n // 2, device=dev)))
    o["a2a_same"] = _outcome(lambda: comm.all_to_all(out, out))
    o["after"] = _outcome(lambda: comm.all_gather(out, x).cpu().tolist())
    comm.close()
    o["closed"] = _outcome(lambda: comm.all_gather(out, x))
    return o


def test_the_checks_on_cuda():
    world, n = 2, 1024
    for rank, o in enumerate(run_ranks(_checks, world, device="cuda", timeout_s=300)):
        assert o["eager"] == ("ok", [p + 1.0 for p in range(world) for _ in range(n)])
        assert o["a2av"] == ("ok", [p + 1.0 for p in range(world) for _ in range(1 + p + rank)])
        assert o["replay"] == [10.0 * (p + 1) for p in range(world) for _ in range(n)]
        status, said = o["sizes"]
        assert status == "refused" and "the ranks disagree" in said and "on rank 0" in said, said
        status, said = o["a2a_same"]
        assert status == "refused" and "all_to_all has no in-place form" in said, said
        assert o["after"] == ("ok", [10.0 * (p + 1) for p in range(world) for _ in range(n)])
        status, said = o["closed"]
        assert status == "refused" and "closed" in said, said
