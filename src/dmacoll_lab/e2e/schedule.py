"""Where a forward's collectives run: in line on the compute stream (``serial``, today's), or on a communication
stream of their own, fenced by events (every other schedule), with micro-batches interleaved.

The schedule owns the strategy of a forward pass (``prefill``, ``decode``): how a batch becomes forwards, one per
micro-batch (serial: one; microbatch: two, ``calls.split``) or seqpar's sequence-parallel prefill (seqpar.py). A
forward is written as a generator (model.py, seqpar.py): it yields a ``Call`` (a collective to start; it gets back
a handle at once) and later a ``Wait`` on that handle (it gets back the collective's output, safe to read on the
compute stream); steps.py. ``Schedule.run`` drives one generator per micro-batch:

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
from typing import Optional

import torch

from dmacoll.lab_api import ops
from .calls import Part, split
from .collectives import Collectives
from .model import KVCache, Model
from .seqpar import seqpar_prefill
from .steps import Call, Forward, Handle, Wait


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

    # -- the strategy: how a batch becomes forwards ------------------------------------------------------------
    def parts(self, batch: int, length: int) -> list[Part]:
        """The micro-batches of ``batch`` sequences of ``length`` tokens: two for microbatch, else one."""
        return split(batch, length) if self.name == "microbatch" else [Part(0, batch, 0, length)]

    def prefill(self, model: Model, coll: Collectives, tokens: torch.Tensor, cache: KVCache,
                first_seq: int = 0) -> torch.Tensor:
        """tokens [b, S]: whole prompts for cache rows first_seq..first_seq+b-1; float32 logits of their last
        tokens [b, vocab]."""
        if self.name == "seqpar":
            return self.run(coll, [seqpar_prefill(model, coll, tokens, cache, first_seq, self.pieces)])[0]
        outs = self.run(coll, model.prefill_forwards(coll, tokens, cache, first_seq, self.parts(*tokens.shape)))
        return torch.cat([o for o in outs if o is not None])

    def decode(self, model: Model, coll: Collectives, tokens: torch.Tensor, pos: torch.Tensor,
               cache: KVCache) -> torch.Tensor:
        """tokens [B] at position ``pos`` (a one-element device tensor); float32 logits [B, vocab] (model.py:
        capturable)."""
        if self.name not in ("serial", "microbatch"):
            raise ValueError(f"schedule {self.name!r} is for prefill only")
        parts = self.parts(tokens.shape[0], 1)
        return torch.cat(self.run(coll, model.decode_forwards(coll, tokens, pos, cache, parts)))

    def prefill_batch(self, model: Model, coll: Collectives, prompts: torch.Tensor, cache: KVCache,
                      chunks: list[int]) -> torch.Tensor:
        """All prompts [B, S], ``chunks`` sequences per prefill; the logits of every last token [B, vocab]."""
        out, first = [], 0
        for n in chunks:
            out.append(self.prefill(model, coll, prompts[first:first + n], cache, first))
            first += n
        return torch.cat(out)

    # -- the driver ------------------------------------------------------------------------------------------------
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
        call.overlapped = self.overlapped  # dmacoll takes its overlap path (collectives.py), in line on the host too
        if self.log is not None:
            self.log.append(call)
        if side is None:
            coll.collective(call.op, call.out, call.x, call.overlapped, call.counts)
            return Handle(call)
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)
        with torch.cuda.stream(side):
            coll.collective(call.op, call.out, call.x, call.overlapped, call.counts)
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
    """The recorded calls again, back to back on the current stream, nothing else: communication alone (on the
    paths they took)."""
    for call in calls:
        coll.collective(call.op, call.out, call.x, call.overlapped, call.counts)


class NoComm(Collectives):
    """``coll``'s buffers, collectives that do nothing: a forward's compute alone, same shapes and streams. The
    outputs keep what the last real call left there (an all-to-all's received tokens route as before)."""

    def __init__(self, coll: Collectives):
        super().__init__(coll.device, coll.rank, coll.world)
        self.name = f"{coll.name}-compute"
        self._blocks = coll._blocks

    def collective(self, op: str, out: torch.Tensor, x: Optional[torch.Tensor] = None,
                   overlapped: bool = False, counts: Optional[list] = None) -> torch.Tensor:
        ops.get(op)  # an unknown name fails here as it does with communication
        return out
