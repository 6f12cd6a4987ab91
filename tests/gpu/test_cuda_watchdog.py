"""The cuda backend's watchdog on one GPU: a stream memop wait nobody satisfies is released in time.

(The two-GPU version, a peer that never joins a collective, is in test_cuda_backend.py.)
"""
from __future__ import annotations

import time

import pytest
import torch

from dmacoll.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _stuck_wait(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from dmacoll import DmaCollTimeoutError
    from dmacoll.backends.cuda import CudaEngine
    from dmacoll.executor import MemOp

    eng = CudaEngine(dist.group.WORLD, nbytes=1 << 20, flag_words=64, timeout_s=1.0)
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
