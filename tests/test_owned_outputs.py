"""Communicator.result: outputs the communicator owns (two alternating buffers), the lean handshake without a
caller's promise; on the host emulator, one process per rank. The lean pipelines on them, with a late reader at
worlds 2-8: tests/test_host_emulator.py."""
import torch

from dmacoll_lab.verify.launch import run_ranks


def _owned_api(rank, world):
    from dmacoll import Communicator, InvalidArgument

    comm = Communicator(backend="host", timeout_s=30)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 100 * rank
    gathered = comm.result("all_gather", x)
    first = (gathered.shape, gathered.tolist())
    mixed = comm.result("all_to_all", gathered)  # the previous output as the next call's input
    alternate = gathered.data_ptr() != mixed.data_ptr()
    mixed = mixed.tolist()  # read before the next call: then it may be overwritten
    summed = comm.result("all_reduce", torch.ones(5, dtype=torch.int64) * (rank + 1)).tolist()
    scattered = comm.result("reduce_scatter", torch.arange(4 * world, dtype=torch.float64)).tolist()
    counts = [[(i + j) % 3 for j in range(world)] for i in range(world)]
    v = comm.result("all_to_all_v", torch.full((sum(counts[rank]),), float(rank)), counts)
    comm.engine.is_capturing = lambda: True  # a capture may not grow the buffers
    try:
        comm.result("all_gather", torch.zeros(1 << 16))
        refused = ""
    except InvalidArgument as e:
        refused = str(e)
    comm.engine.is_capturing = lambda: False
    comm.reserve_results(4 << 16)  # reserved: a capture needs no growth up to that size
    # the host engine cannot capture: the buffers' own check is what a capture would meet
    reserved = comm._results.take(4 << 16, capturing=True).numel()
    comm.close()
    return first, mixed, alternate, summed, scattered, v.tolist(), refused, reserved


def test_result_shapes_values_and_alternation():
    world = 3
    for rank, (first, mixed, alternate, summed, scattered, v, refused, reserved) in enumerate(
            run_ranks(_owned_api, world)):
        rows = [[float(c + 3 * r + 100 * p) for c in range(3)] for p in range(world) for r in range(2)]
        assert first == (torch.Size([6, 3]), rows)
        assert alternate
        # all_to_all of 6 rows of 3 over 3 ranks: chunk p of every rank's (identical) gathered tensor
        assert mixed == rows[2 * rank: 2 * rank + 2] * world
        assert summed == [sum(range(1, world + 1))] * 5
        assert scattered == [float(world * i) for i in range(4 * rank, 4 * rank + 4)]
        assert v == [float(p) for p in range(world) for _ in range((p + rank) % 3)]
        assert "before capturing" in refused and reserved == 4 << 16
