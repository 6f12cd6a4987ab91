"""The cuda engine's stream machinery on one GPU (a world of one rank): the watchdog, prelaunch gates,
prerecorded graphs and forked queues (``backends/watchdog.py``, ``backends/stream_engine.py``). The two-GPU versions, through
collectives, are in test_cuda_backend.py.
"""
from __future__ import annotations

import time

import pytest
import torch

from dmacoll_lab.verify.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _engine(timeout_s: float = 30.0):
    import torch.distributed as dist

    from dmacoll.backends.cuda import CudaEngine
    from dmacoll.executor import flag_words

    return CudaEngine(dist.group.WORLD, nbytes=1 << 20, flag_words=flag_words(1), timeout_s=timeout_s)


def _stuck_wait(rank: int, world: int) -> dict:
    from dmacoll import DmaCollTimeoutError
    from dmacoll.executor import MemOp

    eng = _engine(timeout_s=1.0)
    info: dict = {}
    eng.begin_call("stuck call")
    eng.memops(torch.cuda.current_stream(), [MemOp(wait=True, rank=0, index=5, value=1)])  # never written
    eng.end_call("stuck call", "reset", 1)
    t0 = time.monotonic()
    torch.cuda.synchronize()  # returns once the watchdog wrote the flags
    info["released_after_s"] = time.monotonic() - t0
    info["word"] = int(eng.flag_view[5])
    try:
        eng.begin_call("next call")
    except DmaCollTimeoutError as e:
        info["error"] = str(e)
    eng.close()
    return info


def test_a_wait_nobody_satisfies_is_released_and_reported():
    info = run_ranks(_stuck_wait, 1, device="cuda", timeout_s=120)[0]
    assert 0.9 < info["released_after_s"] < 10.0
    assert info["word"] == 1  # the watchdog satisfied the wait by writing the awaited value
    assert "stuck call did not complete within 1 s" in info["error"]


def _stream_machinery(rank: int, world: int) -> dict:
    eng = _engine()
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    x.fill_(0), x.add_(1), x.zero_(), x.item()  # load the kernels now: a lazy load behind a closed gate deadlocks
    from cuda.bindings import driver

    info: dict = {"driver": driver.cuDriverGetVersion()[1], "refusal": eng.capabilities.memop_refusal,
                  "remote_memop_writes": eng.capabilities.remote_memop_writes}
    eng.gate_open(2)
    x.fill_(7)  # on the gate stream, behind the gate's wait
    eng.gate_close(2)
    time.sleep(0.2)
    info["before_release"] = x.item()  # read on the default stream, which does not wait for the gate
    eng.gate_release(2)
    eng.gate_wait(2)
    info["after_release"] = x.item()
    for _ in range(3):  # recorded on first use, replayed each time
        eng.begin_call("prerecorded")
        eng.replay_recorded(("add",), lambda: x.add_(1), "prerecorded", "reset")
    torch.cuda.synchronize()
    info["after_replays"] = x.item()
    info["graphs"] = len(eng._graphs)
    y = torch.zeros(3, dtype=torch.int32, device="cuda")

    def task(i: int):
        def run(stream) -> None:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(2_000_000)  # about a millisecond: the join must wait for it
                y[i].fill_(i + 1)
        return run

    eng.begin_call("parallel")
    eng.parallel([task(0), task(1), task(2)])  # the main queue and two side streams, joined back
    info["parallel"] = y.tolist()  # read on the main queue
    eng.close()
    return info


def test_gates_prerecorded_replays_and_forked_queues():
    from dmacoll.backends.cuda import REMOTE_MEMOP_WRITES_UP_TO

    info = run_ranks(_stream_machinery, 1, device="cuda", timeout_s=120)[0]
    driver, refusal = info.pop("driver"), info.pop("refusal")
    print(f"driver {driver}: remote memop writes {'refused: ' + refusal if refusal else 'accepted'}")
    # the self-test's verdict is the flag, and a driver the table says takes the writes passes it
    assert info.pop("remote_memop_writes") == (refusal == "")
    assert (refusal == "") == (driver <= REMOTE_MEMOP_WRITES_UP_TO), refusal
    assert info == {"before_release": 0, "after_release": 7, "after_replays": 10, "graphs": 1,
                    "parallel": [1, 2, 3]}


def test_sm_carveout_applies_inside_and_restores_outside(seed):
    from dmacoll_lab.bench.green import SmCarveout

    before = (torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental())
    a = torch.randn(512, 512, generator=torch.Generator("cuda").manual_seed(seed), device="cuda",
                    dtype=torch.bfloat16)
    seen = []

    def gemm():
        seen.append((torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental()))
        return a @ a

    carved = SmCarveout(8).wrap(gemm)()
    assert seen == [(torch._C._BlasBackend.Cublaslt, 8)]
    assert (torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental()) == before
    # the same product, whichever library computed it
    torch.testing.assert_close(carved, a @ a, msg=lambda m: f"seed {seed}: {m}")


def _warm(rank: int, world: int) -> dict:
    from dmacoll import Communicator
    from dmacoll.backends import cuda_kernels, cuda_sm

    comm = Communicator(timeout_s=30)
    before = (len(cuda_kernels._LOADED), len(cuda_sm._LOADED))
    t0 = time.monotonic()
    comm.warm_up()
    took = time.monotonic() - t0
    after = (len(cuda_kernels._LOADED), len(cuda_sm._LOADED))
    t0 = time.monotonic()
    comm.warm_up()  # the second time: nothing left to do
    again = time.monotonic() - t0
    comm.close()
    return {"before": before, "after": after, "took_s": took, "again_s": again}


def test_warm_up_compiles_both_kernel_modules_once():
    r = run_ranks(_warm, 2, device="cuda", timeout_s=120)[0]  # a Communicator needs 2 ranks (may share a GPU)
    print(r)  # the compile time, for the log
    assert r["before"] == (0, 0) and r["after"] == (1, 1), r
    assert r["again_s"] < 0.01, r


def _warm_without_nvrtc(rank: int, world: int) -> dict:
    from dmacoll.backends import cubins

    def refuse(*args, **kwargs):
        raise AssertionError("NVRTC was asked to compile although the cache holds the cubin")

    cubins._compile = refuse  # this process may only load what the one before it cached
    return _warm(rank, world)


def test_a_second_process_loads_both_kernel_modules_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path))  # the ranks' processes inherit it
    first = run_ranks(_warm, 2, device="cuda", timeout_s=120)[0]
    cached = sorted(p.name for p in (tmp_path / "kernels").glob("*.cubin"))
    second = run_ranks(_warm_without_nvrtc, 2, device="cuda", timeout_s=120)[0]
    print({"first": first, "second": second, "cached": cached})  # load against compile time, for the log
    assert [name.split("-")[0] for name in cached] == ["dmacoll_kernels", "dmacoll_sm"], cached
    assert second["after"] == (1, 1), second
