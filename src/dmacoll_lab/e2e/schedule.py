"""Where a forward's collectives run: in line on the compute stream (``serial``, today's), or on a communication
stream of their own, fenced by events (every other schedule), with micro-batches interleaved.

A forward is written as a generator (model.py): it yields a ``Call`` (a collective to start; it gets back a
handle at once) and later a ``Wait`` on that handle (it gets back the collective's output, safe to read on the
compute stream). ``collective`` does both in one step. ``Schedule.run`` drives one generator per micro-batch:

* serial: each call runs on the current stream when it is yielded; a wait is nothing.
* overlapped: a call is queued on the communication stream behind an event of the compute stream (so it sees
  its inputs), and records an event of its own; a wait makes the compute stream wait for that event. When a
  micro-batch waits and another one can still run, the driver parks it and runs the other until that one waits,
  then comes back: micro-batch A's collective runs while micro-batch B computes, and the other way round.
  A single generator (seqpar) starts its pieces ahead itself and waits for them later.

Both NCCL and dmacoll run the same way: ``Collectives`` issues on the current stream, which is the communication
stream here (dmacoll forks its copy-engine streams from it and joins them back). All ranks run the same code,
so every rank issues the same collectives in the same order on its communication stream. Without CUDA (the host
emulator) there are no streams: calls run in line, in the interleaved order.

``NoComm`` wraps a ``Collectives`` with the same buffers and no communication: the schedule's compute alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Optional

import torch

from .collectives import Collectives

ISSUE: dict[str, Callable[[Collectives, "Call"], torch.Tensor]] = {
    "all_reduce": lambda c, k: c.all_reduce(k.out),
    "all_gather": lambda c, k: c.all_gather(k.out, k.x),
    "all_to_all": lambda c, k: c.all_to_all(k.out, k.x),
    "reduce_scatter": lambda c, k: c.reduce_scatter(k.out, k.x),
}


@dataclass
class Call:
    op: str
    site: str  # where in the model (calls.py names them), for the check against the expected calls
    out: torch.Tensor
    x: Optional[torch.Tensor] = None
    mb: int = 0  # set by the driver

    def record(self) -> tuple[int, str, str, int]:
        return self.mb, self.site, self.op, self.out.numel()


@dataclass
class Handle:
    call: Call
    done: Optional[object] = None  # the communication stream's event after the call (None: ran in line)
    waited: bool = False


@dataclass
class Wait:
    handle: Handle


Forward = Generator[object, object, object]


def collective(op: str, site: str, out: torch.Tensor, x: Optional[torch.Tensor] = None):
    """``result = yield from collective(...)``: start a collective and wait for it (a serial step)."""
    handle = yield Call(op, site, out, x)
    return (yield Wait(handle))


@dataclass
class Schedule:
    name: str = "serial"
    pieces: int = 1  # seqpar: pieces per block boundary
    log: Optional[list] = None  # when a list: every Call issued is appended (the trace, and comm-only replays)
    _streams: dict = field(default_factory=dict, repr=False)

    @property
    def overlapped(self) -> bool:
        return self.name != "serial"

    def comm_stream(self, device: torch.device):
        if not self.overlapped or device.type != "cuda":
            return None
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def run(self, coll: Collectives, forwards: list[Forward]) -> list:
        """Drive the generators to the end (module docstring); their return values."""
        side = self.comm_stream(coll.device)
        main = torch.cuda.current_stream(coll.device) if side is not None else None
        results: list = [None] * len(forwards)
        send: list = [None] * len(forwards)
        parked: dict[int, Handle] = {}
        issued: list[Handle] = []
        live = list(range(len(forwards)))
        while live:
            for j in list(live):
                value = send[j]
                if j in parked:
                    value = self._wait(parked.pop(j), main)
                while True:
                    try:
                        req = forwards[j].send(value)
                    except StopIteration as stop:
                        results[j] = stop.value
                        live.remove(j)
                        break
                    if isinstance(req, Call):
                        req.mb = j
                        value = self._issue(coll, req, main, side)
                        issued.append(value)
                    elif self.overlapped and len(live) > 1:
                        parked[j] = req.handle  # let the other micro-batch compute under this one's collective
                        break
                    else:
                        value = self._wait(req.handle, main)
        if not all(h.waited for h in issued):  # a capture would end with the communication stream unjoined
            raise RuntimeError(f"{self.name}: a forward started a collective it never waited for")
        return results

    def _issue(self, coll: Collectives, call: Call, main, side) -> Handle:
        if self.log is not None:
            self.log.append(call)
        if side is None:
            ISSUE[call.op](coll, call)
            return Handle(call)
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)
        with torch.cuda.stream(side):
            ISSUE[call.op](coll, call)
        done = torch.cuda.Event()
        done.record(side)
        return Handle(call, done)

    @staticmethod
    def _wait(handle: Handle, main) -> torch.Tensor:
        if handle.done is not None and not handle.waited:
            main.wait_event(handle.done)
        handle.waited = True
        return handle.call.out


def replay(coll: Collectives, calls: list[Call]) -> None:
    """The recorded calls again, back to back on the current stream, nothing else: communication alone."""
    for call in calls:
        ISSUE[call.op](coll, call)


class NoComm(Collectives):
    """``coll``'s buffers, collectives that do nothing: a forward's compute alone, same shapes and streams. The
    outputs keep what the last real call left there (an all-to-all's received tokens route as before)."""

    def __init__(self, coll: Collectives):
        super().__init__(coll.device, coll.rank, coll.world)
        self.name = f"{coll.name}-compute"
        self._blocks = coll._blocks

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out

    def reduce_scatter(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out
