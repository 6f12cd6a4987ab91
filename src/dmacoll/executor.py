"""Run a plan on an engine: the one place where flag values are chosen.

An engine (``dmacoll.backends.*``) offers three primitives on a queue:
``copy``, ``memops`` (flag writes to any rank and waits on own flags, issued
together) and ``parallel`` (run several command lists concurrently, the first
on the caller's queue). The executor maps Signal/Wait onto memory operations
for a sync mode:

* ``reset`` (graph-safe, default): signal writes 1, wait for == 1 then write 0.
  Every call uses the same values, so a captured CUDA graph replays correctly.
* ``epoch`` (eager only): signal writes the call's sequence number, wait for
  >= it, no reset: one memory operation less per wait.

The two modes use disjoint flag words, so switching between them is safe.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Protocol, Sequence

from .plan import NUM_PHASES, Command, Copy, Plan, Ref, Signal, Wait

SYNC_MODES = ("reset", "epoch")


def flag_words(world: int) -> int:
    """Number of 32-bit flag words a rank's heap holds for ``world`` ranks."""
    return len(SYNC_MODES) * NUM_PHASES * world


def flag_index(world: int, sync: str, phase: int, signaller: int) -> int:
    return (SYNC_MODES.index(sync) * NUM_PHASES + phase) * world + signaller


class MemOp(NamedTuple):
    """A stream memory operation: write ``value`` to ``rank``'s flag word ``index``, or
    (``wait``) block the queue until the own word is == value (>= with ``geq``)."""

    wait: bool
    rank: int
    index: int
    value: int
    geq: bool = False


class Engine(Protocol):
    def copy(self, queue: object, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, object]) -> None: ...

    def memops(self, queue: object, ops: Sequence[MemOp]) -> None:
        """Issue consecutive memory operations, in order, as one command where the backend can."""

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None: ...

    main_queue: object


def execute(plan: Plan, engine: Engine, bases: Mapping[str, object], sync: str = "reset", epoch: int = 1) -> None:
    if sync not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {sync!r}; choose one of {SYNC_MODES}")
    value = 1 if sync == "reset" else epoch
    me, world = plan.rank, plan.world

    def run(commands: Sequence[Command], queue: object) -> None:
        ops: list[MemOp] = []  # consecutive signals/waits go out together (fewer commands)
        for c in commands:
            if isinstance(c, Copy):
                if ops:
                    engine.memops(queue, ops)
                    ops = []
                engine.copy(queue, c.src, c.dst, c.nbytes, bases)
            elif isinstance(c, Signal):
                ops.append(MemOp(False, c.peer, flag_index(world, sync, c.phase, me), value))
            elif isinstance(c, Wait):
                index = flag_index(world, sync, c.phase, c.peer)
                ops.append(MemOp(True, me, index, value, geq=sync == "epoch"))
                if sync == "reset":
                    ops.append(MemOp(False, me, index, 0))
            else:  # pragma: no cover - plans only hold the three kinds
                raise TypeError(f"not a command: {c!r}")
        if ops:
            engine.memops(queue, ops)

    main = engine.main_queue
    if len(plan.queues) <= 1:  # one queue: everything in order on the caller's queue, no fork/join
        run((*plan.pre, *(plan.queues[0] if plan.queues else ()), *plan.post), main)
        return
    run(plan.pre, main)
    engine.parallel([lambda q, cmds=cmds: run(cmds, q) for cmds in plan.queues])
    run(plan.post, main)
