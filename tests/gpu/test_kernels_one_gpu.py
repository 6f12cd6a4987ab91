"""dmacoll's own kernels on one GPU (``backends/cuda_kernels.py``): the spin wait holds its stream until a flag
is written from elsewhere and re-arms it; the fold kernel sums every dtype exactly as the torch path does, slot
by slot as each flag arrives, in a graph too. Driven through a world-of-one engine (its flag words stand in for
the peers')."""
from __future__ import annotations

import time

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _engine():
    import torch.distributed as dist

    from dmacoll.backends.cuda import CudaEngine
    from dmacoll.executor import flag_words

    return CudaEngine(dist.group.WORLD, nbytes=64 << 20, flag_words=flag_words(1), timeout_s=30.0)


def _write_later(eng, stream, index: int, value: int, delay_ms: float) -> None:
    from dmacoll.executor import MemOp

    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(delay_ms * 1.5e6))  # ~delay_ms at 1.5 GHz: the waiter starts first
    eng.memops(stream, (MemOp(False, 0, index, value),))


def _spin(rank: int, world: int) -> dict:
    eng = _engine()
    waiter, writer = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    # every kernel this test launches is loaded before the spin runs: with lazy loading, a first launch while a
    # kernel spins can wait for an idle GPU, which never comes (as with a pending prelaunch gate)
    x.fill_(0), torch.cuda._sleep(1), x.item()
    eng.kernels().spin(waiter.cuda_stream, eng.ptrs[0], [1, 2], 1, False)
    with torch.cuda.stream(waiter):
        x.fill_(7)
    time.sleep(0.2)
    info = {"done_before_any_flag": waiter.query()}
    _write_later(eng, writer, 1, 1, 1)
    writer.synchronize()
    time.sleep(0.05)
    info["done_after_one_flag"] = waiter.query()
    _write_later(eng, writer, 2, 1, 1)
    waiter.synchronize()
    info["x"], info["words"] = x.item(), eng.flag_view[1:3].tolist()
    eng.close()
    return info


def test_a_spin_wait_holds_its_stream_until_every_flag_and_rearms_them():
    info = run_ranks(_spin, 1, device="cuda", timeout_s=120)[0]
    assert info == {"done_before_any_flag": False, "done_after_one_flag": False, "x": 7, "words": [0, 0]}


def _fold(rank: int, world: int, seed: int) -> list:
    from dmacoll.backends import cuda_kernels
    from dmacoll.backends.reduce import sum_slots
    from dmacoll.executor import Folded, MemOp
    from dmacoll.plan import Reduce, Ref

    eng = _engine()
    eng.load_kernels()
    writer = torch.cuda.Stream()
    rows = []
    base = 4096  # past the flag words: [slots | own | out] in the heap
    gen = torch.Generator("cuda").manual_seed(seed)
    for dtype in cuda_kernels.FOLD_TYPES:
        kind = getattr(torch, dtype)
        for numel, count in ((1, 1), (1000, 3), (300001, 3)):  # one block; one block, 3 slots; many blocks
            size = numel * torch.empty((), dtype=kind).element_size()
            if kind.is_floating_point:
                data = torch.randn((count + 1) * numel, generator=gen, device="cuda").to(kind)
            else:
                data = torch.randint(-(1 << 30), 1 << 30, ((count + 1) * numel,), generator=gen,
                                     device="cuda").to(kind)
            raw = data.view(torch.uint8)
            eng.heap[base: base + raw.numel()] = raw
            slots, own = base, base + count * size
            out = own + size
            eng.heap[out: out + size] = 0xFF  # poisoned
            want = torch.empty(size, dtype=torch.uint8, device="cuda")
            sum_slots(eng.heap[slots: own], want, count, dtype, eng.heap[own: out])
            waits = tuple(MemOp(True, 0, k, 1, via="spin") for k in range(count))
            step = Folded(Reduce(Ref("sym", 0, slots), Ref("sym", 0, out), size, count, dtype, Ref("sym", 0, own),
                                 tuple(range(count))), waits)
            for k in reversed(range(count)):  # the last slot's flag first: the kernel must wait for slot 0's
                _write_later(eng, writer, k, 1, 1)
            eng.folded_reduce(eng.main_queue, step, {})
            torch.cuda.synchronize()
            rows.append({"dtype": dtype, "numel": numel, "exact": bool(torch.equal(eng.heap[out: out + size], want)),
                         "rearmed": eng.flag_view[:count].tolist() == [0] * count})
    eng.close()
    return rows


def test_the_fold_kernel_sums_like_the_torch_path_and_rearms_its_flags(seed):
    rows = run_ranks(_fold, 1, seed, device="cuda", timeout_s=300)[0]
    assert rows and all(r["exact"] and r["rearmed"] for r in rows), \
        f"seed {seed}: {[r for r in rows if not r['exact'] or not r['rearmed']]}"


def _fold_in_a_graph(rank: int, world: int) -> list:
    from dmacoll.executor import Folded, MemOp
    from dmacoll.plan import Reduce, Ref

    eng = _engine()
    eng.load_kernels()
    n, base = 4096, 4096
    eng.heap[base: base + 3 * 4 * n] = torch.arange(3 * n, dtype=torch.float32, device="cuda").view(torch.uint8)
    step = Folded(Reduce(Ref("sym", 0, base), Ref("sym", 0, base + 3 * 4 * n), 4 * n, 2, "float32",
                         Ref("sym", 0, base + 2 * 4 * n), (0, 1)), tuple(MemOp(True, 0, k, 1, via="spin")
                                                                        for k in range(2)))
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=side):
        eng.main_queue = side
        eng.folded_reduce(side, step, {})
    writer, sums = torch.cuda.Stream(), []
    for _ in range(3):
        out = eng.heap[base + 3 * 4 * n: base + 4 * 4 * n].view(torch.float32)
        out.fill_(-1)
        torch.cuda.synchronize()
        for k in range(2):
            _write_later(eng, writer, k, 1, 0.5)
        graph.replay()
        torch.cuda.synchronize()
        sums.append(float(out.double().sum()))
    eng.close()
    return sums


def test_a_captured_fold_replays_with_fresh_flags_each_time():
    sums = run_ranks(_fold_in_a_graph, 1, device="cuda", timeout_s=120)[0]
    n = 4096
    want = float(sum(range(3 * n)))  # slot 0 + slot 1 + own = every element once
    assert sums == [want] * 3
