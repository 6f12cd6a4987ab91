"""Timing candidates for a calibration, through the path a user's call takes: ``Communicator.collective`` with
every option fixed (a copy-engine candidate) or a path forced (``paths``), on a communicator of its own (a heap for
the largest size, closed afterwards) and a stream of its own. Eager points time back-to-back calls, graph points a
captured graph's replays (``dmacoll.timing``: CUDA events on GPUs, the host clock on the emulator). Each rank takes
the median of its samples; after each batch the ranks exchange them and every rank keeps the slowest rank's (a
collective is done when every rank is), so every rank holds the same numbers and makes the same next request."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .. import ops, timing
from ..errors import DmaCollError, InvalidArgument
from .paths import PathPoint
from .strategy import Point, Timing


class CalibrationFailed(DmaCollError):
    """A candidate failed on some rank: every rank stops calibrating (and takes the fallback)."""


class Bench:
    """A communicator of its own (``comm``: a heap of ``heap_bytes``, no table, closed by ``close``) with buffers for
    every size up to ``max_bytes``, and the timing of points on it."""

    @staticmethod
    def heap_bytes(world: int, max_bytes: int) -> int:
        return (world + 1) * max_bytes + 4096

    def __init__(self, comm, max_bytes: int, settings: Timing,
                 progress: Optional[Callable[[int, float, bool], None]] = None):
        self.group, self.world, self.rank, self.device = comm.group, comm.world, comm.rank, comm.device
        self.settings, self.progress = settings, progress
        self.comm = comm
        self.input = self.comm.empty(max_bytes, dtype=torch.uint8)
        self.output = self.comm.empty(self.world * max_bytes, dtype=torch.uint8)
        self.stream = torch.cuda.Stream(self.device) if timing.on_gpu(self.device) else None
        self.started = time.monotonic()
        self.spent_s = 0.0  # the slowest rank's seconds since the start, as of the last batch (agreed)
        self.done = 0

    def native(self) -> bool:
        """Whether every rank can submit natively (built on first use; ranks must agree on the candidates)."""
        return all(self._gather(self.comm.capabilities.native_submit and self.comm._native_available()))

    def measure(self, points: list) -> dict:
        """Microseconds per call of each point, the slowest rank's median (the same dict on every rank)."""
        local, error = [], ""
        with timing.on_stream(self.stream):
            for p in points:
                try:
                    local.append(self._one(p) if not error else 0.0)
                except Exception as e:  # noqa: BLE001 - said on every rank below
                    error = error or f"{p.op} {p.place} {p.mode} {p.size} B {p.call_options()}: {type(e).__name__}: {e}"
                    local.append(0.0)
                self.done += 1
                if self.progress:
                    self.progress(self.done, time.monotonic() - self.started, False)
        per_rank = self._gather((local, error, time.monotonic() - self.started))
        errors = [e for _, e, _ in per_rank if e]
        if errors:
            raise CalibrationFailed(f"calibration stopped: {errors[0]}")
        self.spent_s = max(s for _, _, s in per_rank)
        if self.progress:
            self.progress(self.done, self.spent_s, True)
        return {p: max(times[i] for times, _, _ in per_rank) for i, p in enumerate(points)}

    def spent(self) -> float:
        return self.spent_s

    def close(self) -> None:
        self.comm.close()

    # -- one point ---------------------------------------------------------------------------------------------
    def _one(self, p: Point | PathPoint) -> float:
        """A point's time; a path that refuses the call (InvalidArgument: the sm path above its slots, on every rank
        alike, before any collective) takes forever there."""
        spec, s = ops.get(p.op), self.settings
        out, inp = self._buffers(spec, p)
        options = p.call_options()
        if isinstance(p, PathPoint):
            try:
                self.comm.collective(p.op, out, inp, **options)
            except InvalidArgument:
                return math.inf
        call = lambda: self.comm.collective(p.op, out, inp, **options)  # noqa: E731
        timed = timing.bench_time(call, s.calls, s.repeats, mode=p.mode, warmup=s.warmup, stream=self.stream,
                                  device=self.device, start=lambda: self._gather(None))  # every rank together
        return statistics.median(timed.samples)

    def _buffers(self, spec: ops.OpSpec, p: Point | PathPoint) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's output and input of ``p.size`` bytes per rank (bfloat16, as the sweeps), in place where
        asked. Their contents do not matter: nothing is checked, only timed."""
        size = 2
        chunk = p.size // size // spec.chunks(self.world)[0]
        n_in, n_out = spec.numels(chunk, self.world, self.rank)
        out = self.output[: n_out * size].view(torch.bfloat16)
        inp = self.input[: n_in * size].view(torch.bfloat16)
        return spec.in_place_views(out, inp, self.rank) if p.place == "in" else (out, inp)

    def _gather(self, value) -> list:
        out: list = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
        return out
