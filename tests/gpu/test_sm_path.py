"""The sm path (``path='sm'``: one one-shot kernel per call, ``backends/cuda_sm.py``) through ``Communicator`` at worlds
2 and 4: every op and dtype it claims, odd sizes, heap, private and misaligned buffers, in place, graph replays of
fresh data, 'auto' choosing it only where it should, and a peer that never calls named by a timeout instead of a hang.

Sums are checked bit for bit against the inputs added in rank order (float32 for half types, wrapping for integers):
the kernel's arithmetic, the same on every rank. Ranks share a GPU where there are fewer GPUs than ranks (the IPC
heap; there a spinning kernel waits for the other process's time slice: slow, still correct). Correctness only.
"""
from __future__ import annotations

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
WORLDS = (2, 4)
OPS = ("all_gather", "all_to_all", "all_reduce", "reduce_scatter")  # all_to_all_v: its own cases below
SUM_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
GATHER_DTYPES = (*SUM_DTYPES, "int8", "uint8", "bool")


def ranks_share_gpus(world: int) -> bool:
    from dmacoll_lab.verify.launch import gpus_for
    return gpus_for(world) < world


def draw(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if not dtype.is_floating_point:
        low, high = (0, 255) if dtype == torch.uint8 else (-100, 100) if dtype == torch.int8 else (-(1 << 30), 1 << 30)
        return torch.randint(low, high, (numel,), generator=g, dtype=torch.int64).to(dtype)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)


def close(op: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """``want``: ``expected`` below (integer sums wrap at the dtype's width, as NCCL's do)."""
    if op in ("all_gather", "all_to_all") or not got.dtype.is_floating_point:
        return torch.equal(got, want)
    step = 2.0 ** -7 if got.dtype == torch.bfloat16 else 2.0 ** -20  # NCCL's sums round along its ring
    want = want.double()
    return bool(torch.allclose(got.double(), want, rtol=4 * step, atol=4 * step * want.abs().max().item()))


def expected(op: str, world: int, rank: int, inputs: list[torch.Tensor]) -> torch.Tensor:
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "all_to_all":
        return torch.cat([x.chunk(world)[rank] for x in inputs])
    parts = inputs if op == "all_reduce" else [x.chunk(world)[rank] for x in inputs]
    dtype = parts[0].dtype
    wide = torch.float64 if dtype == torch.float64 else torch.float32 if dtype.is_floating_point else torch.int64
    acc = parts[0].to(wide)
    for x in parts[1:]:
        acc = acc + x.to(wide)
    if not dtype.is_floating_point:  # the kernel wraps at the dtype's width
        bits = 8 * torch.empty((), dtype=dtype).element_size()
        acc = ((acc + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) if bits < 64 else acc
    return acc.to(dtype)


def shapes(op: str, world: int, count: int) -> tuple[int, int]:
    """(input, output) elements of ``op`` with ``count`` elements per rank (per peer for the chunked ops)."""
    return {"all_gather": (count, world * count), "all_to_all": (world * count, world * count),
            "all_reduce": (count, count), "reduce_scatter": (world * count, count)}[op]


def _cases(rank: int, world: int, seed: int) -> list[str]:
    import torch.distributed as dist

    from dmacoll import Communicator

    from dmacoll.backends import cuda_sm

    comm = Communicator(timeout_s=30)
    failures, case = [], 0
    sm = comm.engine.sm
    # all_reduce twice more: two kernels (reduce_scatter, then all_gather in place) from any size, on a grid of up to
    # the GPU's SM count (a 2 MB tensor's parts take more than the default 64 blocks); every op again with LL lines
    # for parts of whole vectors up to LL_MAX_BYTES (the other sizes and the offset buffers: the regular kernels)
    lines = cuda_sm.LL_MAX_BYTES
    for op, two_shot, ll in [(op, None, 0) for op in OPS] + [("all_reduce", 0, 0)] + [(op, None, lines) for op in OPS]:
        forced = two_shot == 0
        sm.configure(cuda_sm.MAX_BLOCKS if forced else cuda_sm.BLOCKS, two_shot, ll)
        for name in (SUM_DTYPES if op in ("all_reduce", "reduce_scatter") else GATHER_DTYPES):
            dtype = getattr(torch, name)
            size = torch.empty((), dtype=dtype).element_size()
            label = f"{name} two-shot" if forced else f"{name} LL" if ll else name
            for count in (1, 17, 64, 1024, 4099, 32768, 1 << 19):
                if count * size > (2 << 20 if forced else 256 << 10):
                    continue
                n_in, n_out = shapes(op, world, count)
                for buffers in ("heap", "private", "offset"):  # offset: addresses one element past a vector
                    case += 1
                    make = (lambda n: comm.empty(n, dtype=dtype)) if buffers == "heap" else \
                        (lambda n: torch.empty(n, dtype=dtype, device=comm.device)) if buffers == "private" else \
                        (lambda n: torch.empty(n + 1, dtype=dtype, device=comm.device)[1:])
                    x, y = make(n_in), make(n_out)
                    inputs = [draw(n_in, dtype, seed + 1000 * case + r) for r in range(world)]
                    x.copy_(inputs[rank].to(comm.device))
                    y.fill_(1 if dtype == torch.bool else 77)  # poison
                    comm.collective(op, y, x, path="sm")
                    torch.cuda.synchronize()
                    want = expected(op, world, rank, inputs)
                    if comm.last_options.path != "sm" or not torch.equal(y.cpu().view(torch.uint8),
                                                                          want.view(torch.uint8)):
                        failures.append(f"{op} {label} count {count} {buffers} (seed {seed}, case {case})")
                    if op == "all_reduce":  # in place
                        x.copy_(inputs[rank].to(comm.device))
                        comm.all_reduce(x, x, path="sm")
                        torch.cuda.synchronize()
                        if not torch.equal(x.cpu().view(torch.uint8), want.view(torch.uint8)):
                            failures.append(f"{op} in place {label} count {count} {buffers} (seed {seed})")
                    if op == "all_gather" and buffers == "heap":  # in place: our chunk already in the output
                        y.fill_(1 if dtype == torch.bool else 77)
                        y[rank * count:(rank + 1) * count].copy_(inputs[rank].to(comm.device))
                        comm.all_gather(y, y[rank * count:(rank + 1) * count], path="sm")
                        torch.cuda.synchronize()
                        if not torch.equal(y.cpu().view(torch.uint8), want.view(torch.uint8)):
                            failures.append(f"{op} in place {name} count {count} (seed {seed})")
                    dist.barrier()
    import random

    rng = random.Random(seed)
    for name in ("int8", "bfloat16", "int64"):  # all_to_all_v: seeded splits, empty and odd ones, and a large one
        dtype = getattr(torch, name)
        for trial in range(6):
            case += 1
            counts = [[rng.choice((0, 1, 17, 4099, 65536 if trial == 5 else 3)) for _ in range(world)]
                      for _ in range(world)]
            inputs = [draw(sum(counts[r]), dtype, seed + 1000 * case + r) for r in range(world)]
            # empty() is collective: every rank allocates the largest row and column
            x = comm.empty(max(1, max(map(sum, counts))), dtype=dtype)
            y = comm.empty(max(1, max(map(sum, zip(*counts)))), dtype=dtype)
            x[: sum(counts[rank])].copy_(inputs[rank].to(comm.device))
            y.fill_(77)
            comm.all_to_all_v(y, x, counts, path="sm")
            torch.cuda.synchronize()
            want = torch.cat([inputs[q][sum(counts[q][:rank]): sum(counts[q][:rank]) + counts[q][rank]]
                              for q in range(world)])
            got = y[: want.numel()].cpu()
            if comm.last_options.path != "sm" or not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                failures.append(f"all_to_all_v {name} counts {counts} (seed {seed}, case {case})")
            dist.barrier()
    # every rank takes the same kernel whatever its own buffers and parts (else one waits for LL lines, the other
    # for flags: the hang of 2026-11-28): rank 0's buffers one element past a vector, the others' on vectors, calls
    # of LL size; all_to_all_v where rank 0 sends and receives nothing and the others 17 bytes
    sm.configure(cuda_sm.BLOCKS, None, lines)
    for op in OPS:
        for name in ("bfloat16",) + (("int8",) if op in ("all_gather", "all_to_all") else ()):
            dtype, count, shift = getattr(torch, name), 1024, int(rank == 0)
            case += 1
            n_in, n_out = shapes(op, world, count)
            x = torch.empty(n_in + 1, dtype=dtype, device=comm.device)[shift:][:n_in]
            y = torch.empty(n_out + 1, dtype=dtype, device=comm.device)[shift:][:n_out]
            inputs = [draw(n_in, dtype, seed + 1000 * case + r) for r in range(world)]
            x.copy_(inputs[rank].to(comm.device))
            y.fill_(77)
            comm.collective(op, y, x, path="sm")
            torch.cuda.synchronize()
            if not torch.equal(y.cpu().view(torch.uint8), expected(op, world, rank, inputs).view(torch.uint8)):
                failures.append(f"{op} {name} mixed alignment (seed {seed}, case {case})")
            dist.barrier()
    counts = [[0] * world] + [[0] + [17] * (world - 1) for _ in range(world - 1)]
    case += 1
    inputs = [draw(sum(counts[r]), torch.int8, seed + 1000 * case + r) for r in range(world)]
    x, y = comm.empty(17 * world, dtype=torch.int8), comm.empty(17 * world, dtype=torch.int8)
    x[: sum(counts[rank])].copy_(inputs[rank].to(comm.device))
    comm.all_to_all_v(y, x, counts, path="sm")
    torch.cuda.synchronize()
    want = torch.cat([inputs[q][sum(counts[q][:rank]): sum(counts[q][:rank]) + counts[q][rank]] for q in range(world)])
    if not torch.equal(y[: want.numel()].cpu(), want):
        failures.append(f"all_to_all_v int8 counts {counts}: rank 0 silent (seed {seed}, case {case})")
    comm.close()
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_sm_path_matches_the_reference(world, seed):
    results = run_ranks(_cases, world, seed, device="cuda", timeout_s=300)
    bad = [f for rank in results for f in rank]
    assert not bad, bad[:8]


def _graph_and_auto(rank: int, world: int, seed: int) -> dict:
    import torch.distributed as dist

    from dmacoll import Communicator
    from dmacoll.backends import cuda_sm

    comm = Communicator(timeout_s=30, staging_bytes=32 << 20)  # a 32 MB all_reduce on the copy engines
    out = {"failures": []}
    n = world * 4099
    x, y = comm.empty(n, dtype=torch.bfloat16), comm.empty(n, dtype=torch.bfloat16)
    lines = cuda_sm.LL_MAX_BYTES
    for op, two_shot, ll in (("all_reduce", None, 0), ("all_reduce", 0, 0), ("all_to_all", None, 0),
                             ("all_reduce", None, lines), ("all_to_all", None, lines)):
        comm.engine.sm.configure(comm.engine.sm.blocks, two_shot, ll)  # two_shot 0: two kernels; ll: LL lines
        m = world * 4096 if ll else n  # LL: whole vectors
        xs, ys = x[:m], y[:m]
        xs.copy_(draw(m, torch.bfloat16, seed).to(comm.device))
        comm.collective(op, ys, xs, path="sm")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(3):  # three calls: the epochs advance inside the graph
                comm.collective(op, ys, xs, path="sm")
        for replay in range(5):  # fresh data every replay
            inputs = [draw(m, torch.bfloat16, seed + 10 * replay + r) for r in range(world)]
            xs.copy_(inputs[rank].to(comm.device))
            ys.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            if not torch.equal(ys.cpu().view(torch.int16), expected(op, world, rank, inputs).view(torch.int16)):
                out["failures"].append(f"{op} (two-shot from {two_shot}, LL {ll}) graph replay {replay} (seed {seed})")
            dist.barrier()

    comm.engine.sm.configure(cuda_sm.BLOCKS, cuda_sm.default_two_shot_bytes(world, comm.engine.sm.slot_bytes),
                             cuda_sm.ll_bytes(world))
    small, large = comm.empty(512, dtype=torch.bfloat16), comm.empty(16 << 20, dtype=torch.bfloat16)  # 1 KB, 32 MB
    comm.all_reduce(small, small)
    out["small"] = comm.last_options.path
    comm.all_reduce(large, large)
    out["large"] = comm.last_options.path
    comm.all_reduce(large[: 2 << 20], large[: 2 << 20])  # 4 MB: two shots of 1 MB at world >= 3, one at world 2
    out["mid"] = comm.last_options.path
    comm.all_reduce(large[: 8 << 20], large[: 8 << 20])  # 16 MB: two shots of 4 MB at world 4, of 8 MB at world 2
    out["two_shot"] = comm.last_options.path
    comm.all_reduce(small, small, variant="b2b")
    out["named_variant"] = comm.last_options.path
    torch.cuda.synchronize()
    comm.close()
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_sm_path_replays_in_graphs_and_auto_takes_it_where_it_should(world, seed):
    results = run_ranks(_graph_and_auto, world, seed, device="cuda", timeout_s=200)
    assert not [f for r in results for f in r["failures"]]
    shared = ranks_share_gpus(world)  # 'auto' keeps the copy engines there
    sm, nccl = ("dma", "dma") if shared else ("sm", "nccl")  # no NCCL where ranks share a GPU
    for r in results:
        assert (r["small"], r["mid"], r["two_shot"], r["large"], r["named_variant"]) == (sm, sm, sm, nccl, "dma"), r


def _absent(rank: int, world: int, ll: int) -> str:
    import torch.distributed as dist

    from dmacoll import Communicator
    from dmacoll.errors import DmaCollTimeoutError

    comm = Communicator(timeout_s=2)
    comm.engine.sm.configure(comm.engine.sm.blocks, comm.engine.sm.two_shot_bytes, ll)  # ll: LL lines wait
    x = comm.empty(1024, dtype=torch.float32)
    message = ""
    if rank != world - 1:  # the last rank never calls
        comm.all_reduce(x, x, path="sm")
        torch.cuda.synchronize()  # the kernel gives up after timeout_s: it ends
        try:
            comm.all_reduce(x, x, path="sm")
        except DmaCollTimeoutError as e:
            message = str(e)
    dist.barrier()
    return message


@pytest.mark.parametrize("ll", [0, 64 << 10])
@pytest.mark.parametrize("world", WORLDS)
def test_a_peer_that_never_calls_is_named_by_a_timeout(world, ll):
    messages = run_ranks(_absent, world, ll, device="cuda", timeout_s=120)
    for rank, message in enumerate(messages[:-1]):
        assert f"for rank(s) {world - 1} to deliver" in message, (rank, message)


def _eager_repeats(rank: int, world: int, seed: int) -> dict:
    """Repeated eager calls take the fast path (``Communicator._repeats``): results stay right on fresh data,
    with other tensors of the same shape, in place; a call whose tensors differ in anything its checks read is
    checked again."""
    import torch.distributed as dist

    from dmacoll import Communicator
    from dmacoll.errors import InvalidArgument

    comm = Communicator(timeout_s=30)
    failures: list[str] = []
    paths: set[str] = set()
    n = world * 1031
    heap = [comm.empty(n, dtype=torch.bfloat16) for _ in range(2)]
    private = [torch.empty(n, dtype=torch.bfloat16, device=comm.device) for _ in range(2)]
    for op in ("all_reduce", "all_to_all"):
        for name, (x, y) in (("heap", heap), ("private", private), ("heap again", heap)):
            for call in range(3):
                inputs = [draw(n, torch.bfloat16, seed + 100 * call + r) for r in range(world)]
                x.copy_(inputs[rank].to(comm.device))
                y.fill_(float("nan"))
                comm.collective(op, y, x)
                paths.add(comm.last_options.path)
                if not torch.equal(y.cpu().view(torch.int16), expected(op, world, rank, inputs).view(torch.int16)):
                    failures.append(f"{op} {name} call {call} (seed {seed})")
                dist.barrier()
    inputs = [draw(n, torch.bfloat16, seed + 7 + r) for r in range(world)]
    for call in range(2):  # in place, input omitted
        heap[0].copy_(inputs[rank].to(comm.device))
        comm.all_reduce(heap[0])
        want = expected("all_reduce", world, rank, inputs)
        if not torch.equal(heap[0].cpu().view(torch.int16), want.view(torch.int16)):
            failures.append(f"in-place all_reduce call {call} (seed {seed})")
        dist.barrier()
    before = len(comm._repeats)
    named = ("sm", "nccl") if torch.cuda.device_count() >= world else ("sm",)  # NCCL refuses two ranks on one GPU
    for path in named:  # a call naming its path: the option is part of the key, so it is cached beside 'auto'
        for call in range(3):
            inputs = [draw(n, torch.bfloat16, seed + 11 + 100 * call + r) for r in range(world)]
            heap[0].copy_(inputs[rank].to(comm.device))
            heap[1].fill_(float("nan"))
            comm.all_reduce(heap[1], heap[0], path=path)
            want = expected("all_reduce", world, rank, inputs)
            got = heap[1].cpu()  # NCCL adds along its ring: within rounding; the sm path in rank order: exactly
            right = close("all_reduce", got, want) if path == "nccl" else torch.equal(got.view(torch.int16),
                                                                                      want.view(torch.int16))
            if comm.last_options.path != path or not right:
                failures.append(f"all_reduce path={path} call {call} ran {comm.last_options.path} (seed {seed})")
            dist.barrier()
    out = {"failures": failures, "paths": paths, "repeats": len(comm._repeats), "named": len(comm._repeats) - before,
           "paths_named": len(named)}
    strided = heap[0][::2]  # the same address as a cached in-place call's tensor, other shape and stride
    try:
        comm.all_reduce(strided)
        out["strided"] = "accepted"
    except InvalidArgument as e:
        out["strided"] = str(e)
    torch.cuda.synchronize()
    comm.close()
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_repeated_eager_calls_take_the_fast_path_and_stay_correct(world, seed):
    results = run_ranks(_eager_repeats, world, seed, device="cuda", timeout_s=200)
    shared = ranks_share_gpus(world)  # 'auto' keeps the copy engines there
    for r in results:
        assert not r["failures"], r["failures"]
        assert "not contiguous" in r["strided"], r
        assert r["named"] == r["paths_named"], r  # one new entry per named path, reused by its repeats
        if not shared:
            assert r["paths"] == {"sm"} and r["repeats"] >= 5, r  # heap and private pairs of both ops, in place
