"""Run a plan on an engine: the one place where flag values are chosen.

An engine (``dmacoll.backends.*``) offers four primitives on a queue:
``copy``, ``write_flag`` (to any rank's flag), ``wait_flag`` (on an own flag)
and ``parallel`` (run several command lists concurrently, the first on the
caller's queue). The executor maps Signal/Wait onto them for a sync mode:

* ``reset`` (graph-safe, default): signal writes 1, wait for == 1 then write 0.
  Every call uses the same values, so a captured CUDA graph replays correctly.
* ``epoch`` (eager only): signal writes the call's sequence number, wait for
  >= it, no reset: one memory operation less per wait.

The two modes use disjoint flag words, so switching between them is safe.
"""
from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

from .plan import NUM_PHASES, Command, Copy, Plan, Ref, Signal, Wait

SYNC_MODES = ("reset", "epoch")


def flag_words(world: int) -> int:
    """Number of 32-bit flag words a rank's heap holds for ``world`` ranks."""
    return len(SYNC_MODES) * NUM_PHASES * world


def flag_index(world: int, sync: str, phase: int, signaller: int) -> int:
    return (SYNC_MODES.index(sync) * NUM_PHASES + phase) * world + signaller


class Engine(Protocol):
    def copy(self, queue: object, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, object]) -> None: ...

    def write_flag(self, queue: object, rank: int, index: int, value: int) -> None: ...

    def wait_flag(self, queue: object, index: int, value: int, geq: bool) -> None: ...

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None: ...

    main_queue: object


def execute(plan: Plan, engine: Engine, bases: Mapping[str, object], sync: str = "reset", epoch: int = 1) -> None:
    if sync not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {sync!r}; choose one of {SYNC_MODES}")
    value = 1 if sync == "reset" else epoch
    me, world = plan.rank, plan.world

    def run(commands: Sequence[Command], queue: object) -> None:
        for c in commands:
            if isinstance(c, Copy):
                engine.copy(queue, c.src, c.dst, c.nbytes, bases)
            elif isinstance(c, Signal):
                engine.write_flag(queue, c.peer, flag_index(world, sync, c.phase, me), value)
            elif isinstance(c, Wait):
                index = flag_index(world, sync, c.phase, c.peer)
                engine.wait_flag(queue, index, value, geq=sync == "epoch")
                if sync == "reset":
                    engine.write_flag(queue, me, index, 0)
            else:  # pragma: no cover - plans only hold the three kinds
                raise TypeError(f"not a command: {c!r}")

    main = engine.main_queue
    run(plan.pre, main)
    if len(plan.queues) == 1:
        run(plan.queues[0], main)  # one queue: no fork/join needed
    elif plan.queues:
        engine.parallel([lambda q, cmds=cmds: run(cmds, q) for cmds in plan.queues])
    run(plan.post, main)
