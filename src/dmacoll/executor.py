"""Run a plan on an engine: the one place where flag values are chosen.

An engine (``dmacoll.backends.*``) offers four primitives on a queue:
``copy``, ``memops`` (flag writes to any rank and waits on own flags, issued
together), ``reduce`` (a local elementwise sum, see ``plan.Reduce``) and
``parallel`` (run several command lists concurrently, the first on the
caller's queue). The executor maps Signal/Wait onto memory operations
for a sync mode:

* ``reset`` (graph-safe, default): signal writes 1, wait for == 1 then write 0.
  Every call uses the same values, so a captured CUDA graph replays correctly.
* ``epoch`` (eager only): signal writes the call's sequence number, wait for
  >= it, no reset: one memory operation less per wait.

The two modes use disjoint flag words, so switching between them is safe.

How a flag travels (``signal``, reset mode only for the last two):

* ``memop``: ``cuStreamWriteValue32`` / ``cuStreamWaitValue32``: no kernel at all;
* ``copy``: a write to a peer is a 4-byte copy of a word that always reads 1,
  queued behind the data like any copy;
* ``kernel``: one one-thread kernel writes the words of a group of consecutive signals (to any peers) behind a
  system fence: one launch for all of them, where memops are a batch node of their own in a graph (measured
  the more expensive node: ``dmacoll probe call_cost``). It uses a sliver of one SM for a moment.

How a rank waits for a flag (``wait``, whatever the signal):

* ``memop``: ``cuStreamWaitValue32`` on the stream (then a write re-arms the word);
* ``spin``: one thread of one block polls the words of a group of waits with acquire loads, no sleep, and
  re-arms them itself; the queue's next command starts when it ends;
* ``fold``: as ``spin``, and the DONE waits in front of a pushed reduction (one per slot, ``Reduce.senders``)
  go into the sum kernel, which polls each slot's flag before adding that slot (``Folded``): no separate
  wait, and on more ranks the sum of the slots already there overlaps the others' arrival.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, Sequence, Union

from .plan import DONE, DONE_ALT, NUM_PHASES, Command, Copy, Plan, Reduce, Signal, Wait

SYNC_MODES = ("reset", "epoch")
SIGNAL_MODES = ("memop", "copy", "kernel")  # how a flag travels (see above)
WAIT_MODES = ("memop", "spin", "fold")  # how a flag is awaited (see above)
GATES = 4  # prelaunch gates per communicator (see Communicator.prelaunch)

# A rank's flag words: [collective flags: sync mode x phase x signalling rank | GATES gates | ONE (reads 1) | PROBE]


def _collective_words(world: int) -> int:
    return len(SYNC_MODES) * NUM_PHASES * world


def flag_words(world: int) -> int:
    return _collective_words(world) + GATES + 2


def gate_index(world: int, slot: int) -> int:
    return _collective_words(world) + slot


def one_index(world: int) -> int:
    return _collective_words(world) + GATES


def probe_index(world: int) -> int:
    """A word a peer writes once, at start-up, to see whether the driver takes memop writes to peer memory."""
    return _collective_words(world) + GATES + 1


def gate_ops(world: int, rank: int, slot: int) -> tuple["MemOp", "MemOp"]:
    """Wait for the gate to open, then close it again for the next use (graph-safe values)."""
    index = gate_index(world, slot)
    return MemOp(True, rank, index, 1), MemOp(False, rank, index, 0)


def flag_index(world: int, sync: str, phase: int, signaller: int) -> int:
    return (SYNC_MODES.index(sync) * NUM_PHASES + phase) * world + signaller


class MemOp(NamedTuple):
    """A flag operation: write ``value`` to ``rank``'s flag word ``index``, or (``wait``)
    block the queue until the own word is == value (>= with ``geq``). ``via`` says how
    (see SIGNAL_MODES, WAIT_MODES); a ``spin`` wait of the reset mode also sets the word back to 0."""

    wait: bool
    rank: int
    index: int
    value: int
    geq: bool = False
    via: str = "memop"


class Folded(NamedTuple):
    """A reduction that waits for its slots itself (``wait='fold'``): ``waits[i]`` is slot i's DONE wait."""

    reduce: Reduce
    waits: tuple[MemOp, ...]


class Copies(NamedTuple):
    """Consecutive copies on one queue, which an engine may issue as one batch."""

    run: tuple[Copy, ...]


Step = Union[Copy, Copies, Reduce, Folded, tuple]  # copies, a reduction, or consecutive flag operations together


@dataclass(frozen=True)
class Program:
    """A plan lowered for one sync mode: the flag values chosen and consecutive signals and
    waits grouped, done once per plan so that a call only walks the steps."""

    pre: tuple[Step, ...]
    queues: tuple[tuple[Step, ...], ...]
    post: tuple[Step, ...]
    epoch: bool  # every flag value is the call's sequence number, filled in by run()

    @property
    def steps(self) -> int:
        """How many steps the program issues (0: a rank with nothing to move and no one to signal)."""
        return len(self.pre) + sum(map(len, self.queues)) + len(self.post)


def lower(plan: Plan, sync: str = "reset", signal: str = "memop", wait: str = "memop") -> Program:
    if sync not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {sync!r}; choose one of {SYNC_MODES}")
    if signal not in SIGNAL_MODES:
        raise ValueError(f"unknown signal mode {signal!r}; choose one of {SIGNAL_MODES}")
    if wait not in WAIT_MODES:
        raise ValueError(f"unknown wait mode {wait!r}; choose one of {WAIT_MODES}")
    if signal != "memop" and sync != "reset":
        raise ValueError(f"signal={signal!r} sends a constant 1: it needs sync='reset'")
    value = 1 if sync == "reset" else 0  # epoch mode: a placeholder, see run()
    me, world = plan.rank, plan.world
    wait_via = "memop" if wait == "memop" else "spin"

    def fold(reduce: Reduce, ops: list[MemOp]) -> Optional[Folded]:
        """``reduce`` with its slots' DONE waits taken out of ``ops``, when they are all there."""
        if wait != "fold" or reduce.senders is None:
            return None
        waiting = {op.index % world: op for op in ops if op.wait and op.index // world % NUM_PHASES in (DONE, DONE_ALT)}
        if not set(reduce.senders) <= set(waiting):
            return None
        waits = tuple(waiting[s] for s in reduce.senders)
        ops[:] = [op for op in ops if op not in waits]
        return Folded(reduce, waits)

    def steps(commands: Sequence[Command]) -> tuple[Step, ...]:
        out: list[Step] = []
        ops: list[MemOp] = []  # consecutive signals/waits go out together (fewer commands)
        for c in commands:
            if isinstance(c, (Copy, Reduce)):
                folded = fold(c, ops) if isinstance(c, Reduce) else None
                if ops:
                    out.append(tuple(ops))
                    ops = []
                if isinstance(c, Copy) and out and isinstance(out[-1], (Copy, Copies)):  # a run of copies
                    out[-1] = Copies((*(out[-1].run if isinstance(out[-1], Copies) else (out[-1],)), c))
                else:
                    out.append(folded or c)
            elif isinstance(c, Signal):
                ops.append(MemOp(False, c.peer, flag_index(world, sync, c.phase, me), value, via=signal))
            elif isinstance(c, Wait):
                index = flag_index(world, sync, c.phase, c.peer)
                ops.append(MemOp(True, me, index, value, geq=sync == "epoch", via=wait_via))
                if sync == "reset" and wait_via == "memop":  # a spinning kernel re-arms the word itself
                    ops.append(MemOp(False, me, index, 0))
            else:  # pragma: no cover - plans only hold the four kinds
                raise TypeError(f"not a command: {c!r}")
        if ops:
            out.append(tuple(ops))
        return tuple(out)

    if len(plan.queues) <= 1:  # one queue: everything in order on the caller's queue, no fork/join
        return Program(steps((*plan.pre, *(plan.queues[0] if plan.queues else ()), *plan.post)), (), (),
                       sync == "epoch")
    return Program(steps(plan.pre), tuple(steps(q) for q in plan.queues), steps(plan.post), sync == "epoch")


def run(program: Program, engine, bases: Mapping[str, object], epoch: int = 1) -> None:
    """Issue ``program`` on ``engine`` (a ``backends.engine.Engine``): pre, the queues in parallel, post."""
    def issue(steps: Sequence[Step], queue: object) -> None:
        for step in steps:
            if type(step) is Copy:
                engine.copy(queue, step.src, step.dst, step.nbytes, bases)
            elif type(step) is Copies:
                engine.copies(queue, step.run, bases)
            elif type(step) is Reduce:
                engine.reduce(queue, step, bases)
            elif type(step) is Folded:
                engine.folded_reduce(queue, step._replace(waits=tuple(op._replace(value=epoch) for op in step.waits))
                                     if program.epoch else step, bases)
            else:
                engine.memops(queue, tuple(op._replace(value=epoch) for op in step) if program.epoch else step)

    main = engine.main_queue
    issue(program.pre, main)
    if program.queues:
        engine.parallel([lambda q, steps=steps: issue(steps, q) for steps in program.queues])
    issue(program.post, main)


def execute(plan: Plan, engine, bases: Mapping[str, object], sync: str = "reset", epoch: int = 1,
            signal: str = "memop", wait: str = "memop") -> None:
    """Lower and run in one go (callers that repeat a plan keep the Program instead)."""
    run(lower(plan, sync, signal, wait), engine, bases, epoch)


def wait_words(programs: Sequence[Program]) -> tuple[int, ...]:
    """The flag words ``programs`` (run back to back) wait on, each once, in the order they are issued (per program:
    pre, each queue, post): what a timeout decodes to name the peers that never signalled."""
    words: dict[int, None] = {}
    for program in programs:
        for step in (*program.pre, *(s for q in program.queues for s in q), *program.post):
            ops = step.waits if type(step) is Folded else step if type(step) is tuple else ()
            words.update((op.index, None) for op in ops if op.wait)
    return tuple(words)


def critical_crossings(programs: Sequence[Program], rank: int, world: int) -> int:
    """Flag crossings on the critical path of a call made of ``programs`` (run back to back, e.g. all-reduce's
    two), every rank running a program of the same shape: a wait costs one crossing more than the point in the
    peer's program where the awaited signal goes out (a signal is the same phase of the same program on the peer).
    The structure's latency floor: what no lowering of the same protocol can go below."""
    def ops_of(step: Step) -> tuple:
        return step.waits if type(step) is Folded else step if type(step) is tuple else ()

    def phase_of(op: MemOp) -> int:
        return op.index // world % NUM_PHASES

    signals: dict[tuple[int, int], int] = {}  # (program, phase) -> depth at which that signal goes out
    for _ in range(2 * NUM_PHASES * len(programs) + 1):  # a fixed point: signal depths follow from waits
        seen: dict[tuple[int, int], int] = {}

        def walk(steps: Sequence[Step], depth: int, k: int) -> int:
            for step in steps:
                for op in ops_of(step):
                    key = (k, phase_of(op))
                    if op.wait:
                        depth = max(depth, signals.get(key, 0) + 1)
                    elif op.rank != rank:  # a signal to a peer (writes to our own words re-arm them)
                        seen[key] = max(seen.get(key, 0), depth)
            return depth

        end = 0
        for k, program in enumerate(programs):
            start = walk(program.pre, end, k)
            end = walk(program.post, max([walk(q, start, k) for q in program.queues] or [start]), k)
        if seen == signals:
            return end
        signals = seen
    raise RuntimeError("critical_crossings did not settle")  # pragma: no cover - bounded by the phases
