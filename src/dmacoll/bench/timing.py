"""Device timing with CUDA events: graph-replayed and eager, median of repeats."""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def summarize(samples_us: list[float]) -> dict[str, float]:
    """Median with 10th/90th percentiles (nearest rank) of per-call times."""
    s = sorted(samples_us)
    pick = lambda q: s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]  # noqa: E731
    return {"time_us": statistics.median(s), "time_us_p10": pick(0.1), "time_us_p90": pick(0.9)}


def _elapsed_us(run: Callable[[], None], calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_eager(fn: Callable[[], None], calls: int, repeats: int, warmup: int, barrier: Callable[[], None]) -> list[float]:
    """Per-call microseconds of ``calls`` back-to-back calls, ``repeats`` times."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        barrier()
        samples.append(_elapsed_us(lambda: [fn() for _ in range(calls)], calls))
    return samples


def capture(fn: Callable[[], None], calls: int, warmup: int) -> torch.cuda.CUDAGraph:
    """A graph of ``calls`` calls of ``fn`` (warmed up eagerly first, as NCCL needs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, calls: int, repeats: int, barrier: Callable[[], None]) -> list[float]:
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        barrier()
        samples.append(_elapsed_us(graph.replay, calls))
    return samples
