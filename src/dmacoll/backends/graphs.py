"""prerecord=True, shared by the engines that run on torch.cuda streams (CUDA, and HIP on ROCm builds)."""
from __future__ import annotations

from typing import Callable

import torch


def replay_recorded(engine, key: tuple, work: Callable[[], None], label: str, sync: str) -> None:
    """Replay the graph ``engine`` recorded for ``key`` (recording it on first use, on a side stream
    that waits for the current one) on the current stream, then bracket the call as usual."""
    graph = engine._graphs.get(key)
    if graph is None:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(engine.device)
        side.wait_stream(torch.cuda.current_stream(engine.device))
        with torch.cuda.graph(graph, stream=side):
            work()
        engine._graphs[key] = graph
    graph.replay()
    engine.main_queue = torch.cuda.current_stream(engine.device)
    engine.end_call(label, sync, 1)
