"""The timing loop every measurement shares (the benchmarks' harness, the probes, the calibration, the e2e runner)
and its primitives: CUDA events on a GPU, the host clock on the CPU emulator, capturing calls into a CUDA graph.

``bench_time`` is nccl-tests' ``BenchTime``: warm up, time ``repeats`` batches of ``calls`` back-to-back calls
(a captured graph's replays, or calls issued from Python), then, given a check, run the call once more the timed
way and check its output. ``interleave`` times several prepared calls in turns, for ratios between them that a
drift of the machine does not bias."""
from __future__ import annotations

import contextlib
import time
from typing import Callable, NamedTuple, Optional, Protocol

import torch

from .errors import InvalidArgument
from .graphs import graph_capture

MODES = ("eager", "graph")


def on_gpu(device: Optional[torch.device] = None) -> bool:
    """Whether work for ``device`` (default: this process's) runs on a GPU, so CUDA events time it."""
    return device.type == "cuda" if device is not None else torch.cuda.is_available()


def on_stream(stream):
    """``torch.cuda.stream(stream)``, or nothing where ``stream`` is None (the current stream; the host)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def elapsed_us(run: Callable[[], None], calls: int = 1, device: Optional[torch.device] = None,
               stream=None) -> float:
    """Per-call microseconds of ``run`` (``calls`` calls) on ``stream`` (default: the current one): CUDA events
    on a GPU, else the host clock."""
    if not on_gpu(device):
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e6 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with on_stream(stream):
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
    with graph_capture(graph, stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


class Check(Protocol):
    """What ``bench_time`` checks after timing (the benchmarks' ``Bound``)."""

    #: a call changes its own input (an in-place sum): a graph of several calls would sum again
    sums_in_place: bool

    def check(self, rerun: Callable[[], None]) -> bool:
        """Poison the output, restore the input, ``rerun`` (one call), compare with the reference."""


class Timed(NamedTuple):
    samples: list[float]  # per-call microseconds, one per repeat
    correct: Optional[bool]  # the check after timing; None where none was asked


def bench_time(call: Callable[[], object], calls: int = 1, repeats: int = 1, *, mode: str = "eager",
               warmup: int = 1, stream=None, device: Optional[torch.device] = None,
               start: Optional[Callable[[], None]] = None, each: Optional[Callable[[], None]] = None,
               check: Optional[Check] = None) -> Timed:
    """Time ``call``: ``warmup`` calls, then ``repeats`` samples of ``calls`` back-to-back calls (graph: captured
    once after the warm-up, replayed; eager: issued from Python, host cost included), all on ``stream``
    (default: the current one; graph capture: a side stream). ``start`` runs once before the samples, ``each``
    before every sample (e.g. the ranks' barrier). Given ``check``, ``check.check(rerun)`` after timing, where
    ``rerun`` makes the call once more the timed way (``check_after``)."""
    if repeats < 1:
        raise InvalidArgument(f"repeats {repeats} must be >= 1")
    run, graph = prepare(call, calls, mode=mode, warmup=warmup, stream=stream, device=device)
    synchronize(device)
    if start is not None:
        start()
    samples = interleave({"call": run}, calls, repeats, device=device, stream=stream, each=each)["call"]
    return Timed(samples, None if check is None else check_after(check, call, calls, graph, stream))


def prepare(call: Callable[[], object], calls: int = 1, *, mode: str = "eager", warmup: int = 1, stream=None,
            device: Optional[torch.device] = None) -> tuple[Callable[[], None], Optional[torch.cuda.CUDAGraph]]:
    """What one sample of ``bench_time`` runs, ready: (a function making ``calls`` calls, the graph it replays or
    None), after ``warmup`` calls (graph: captured after them and replayed once, which uploads it)."""
    if mode not in MODES:
        raise InvalidArgument(f"mode {mode!r}: one of {MODES}")
    if calls < 1 or warmup < 0:
        raise InvalidArgument(f"calls {calls} must be >= 1, warmup {warmup} >= 0")
    if mode == "graph" and not on_gpu(device):
        raise InvalidArgument("mode 'graph' needs a GPU (CUDA graphs); the host emulator runs eager calls only")
    if mode == "graph":
        graph = capture(call, calls, stream, warmup)
        with on_stream(stream):
            graph.replay()  # the first replay uploads the graph
        return graph.replay, graph
    with on_stream(stream):
        for _ in range(warmup):
            call()
    return (lambda: [call() for _ in range(calls)]), None


def interleave(runs: dict[str, Callable[[], None]], calls: int = 1, repeats: int = 1, *,
               device: Optional[torch.device] = None, stream=None, each: Optional[Callable[[], None]] = None,
               before: Optional[dict[str, Callable[[], None]]] = None) -> dict[str, list[float]]:
    """Per-call microseconds of each of ``runs`` (``prepare``'s functions, ``calls`` calls each), ``repeats``
    samples each, taken in turns: sample i times every run once, starting at the i-th (rotating), so a drift of
    the machine (clocks, heat, a neighbour) falls on every run alike and none always follows the same one.
    ``each`` runs before every sample (the ranks' barrier), ``before[name]`` before each of that run's samples."""
    if repeats < 1:
        raise InvalidArgument(f"repeats {repeats} must be >= 1")
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    if not names:
        return samples  # nothing ready (every implementation refused): no turns to take
    synchronize(device)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            if before is not None and name in before:
                before[name]()
            if each is not None:
                each()
            samples[name].append(elapsed_us(runs[name], calls, device, stream))
    return samples


def check_after(check: Check, call: Callable[[], object], calls: int = 1,
                graph: Optional[torch.cuda.CUDAGraph] = None, stream=None) -> bool:
    """``bench_time``'s check, also for loops that time otherwise (C3's released parts, power's energy):
    ``check.check(rerun)``, where ``rerun`` makes the call once more on ``stream`` the way it was timed:
    ``call`` (eager), ``graph`` (of ``calls`` calls) replayed, or a graph of one call where ``calls`` repeated
    calls would give another result (``check.sums_in_place``)."""
    if graph is not None and check.sums_in_place and calls > 1:
        graph = capture(call, 1, stream, warmup=0)
    once = graph.replay if graph is not None else call

    def rerun() -> None:
        with on_stream(stream):
            once()

    return check.check(rerun)
