"""Timing primitives shared by the benchmarks (``bench.harness``) and the calibration: CUDA events on a GPU, the
host clock on the CPU emulator, and capturing calls into a CUDA graph."""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch


def on_gpu(device: Optional[torch.device] = None) -> bool:
    """Whether work for ``device`` (default: this process's) runs on a GPU, so CUDA events time it."""
    return device.type == "cuda" if device is not None else torch.cuda.is_available()


def elapsed_us(run: Callable[[], None], calls: int = 1, device: Optional[torch.device] = None) -> float:
    """Per-call microseconds of ``run`` (``calls`` calls): CUDA events on a GPU, else the host clock."""
    if not on_gpu(device):
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e6 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def synchronize(device: Optional[torch.device] = None) -> None:
    """Wait for this process's GPU work (nothing to wait for on the host emulator, which runs calls in place)."""
    if on_gpu(device):
        torch.cuda.synchronize()


def capture(fn: Callable[[], None], calls: int = 1, stream=None, warmup: int = 1) -> torch.cuda.CUDAGraph:
    """A graph of ``calls`` calls of ``fn``, captured on ``stream`` (default: a side stream; the priority of the
    stream a kernel is captured on goes into its node), after ``warmup`` eager calls (NCCL wants one)."""
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph
