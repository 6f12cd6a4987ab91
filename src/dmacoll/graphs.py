"""CUDA graph capture with the garbage collector held off.

A collection during a capture may destroy an unreachable CUDA graph (an old graph in a reference cycle), which CUDA
refuses while a stream captures in the default (global) mode; that rank's capture then goes wrong while its peers'
do not, and the ranks fall out of step. Seen on four ranks sharing one H100: two ranks warned "operation not
permitted when stream is capturing (function reset)" about 30 times at once and captured an empty graph, and the
other two waited for them until their timeout (results/h100x4/tests/2026-11-26). Holding the collector off makes
capture independent of when a collection happens to run; with it, no world-4 prerecorded call hung again
(results/h100x4/tests).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Optional

import torch


@contextlib.contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph, stream: Optional[torch.cuda.Stream] = None) -> Iterator[None]:
    """``torch.cuda.graph(graph, stream=stream)`` with no garbage collection inside (restored as it was)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, stream=stream):
            yield
    finally:
        if enabled:
            gc.enable()
