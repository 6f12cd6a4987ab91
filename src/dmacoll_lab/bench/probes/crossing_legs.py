"""The crossing probe's pure parts (no torch, no GPU): the pairs to measure, what each side of a run queues,
the legs a host wait polls, a run's status counts and a pair's measurements; the probe (crossing.py), its
device side (crossing_device.py) and its process launcher (crossing_launch.py) all build on them."""
from __future__ import annotations

from typing import NamedTuple

STATUS = {0: "missing", 1: "ok", 2: "wrong", 3: "timeout"}  # a leg's status word, written by its consumer


class Pair(NamedTuple):
    mode: str
    send: str
    wait: str


def baseline(mode: str) -> Pair:
    return Pair(mode, "none", "none")


def pair_matrix(sends, waits, modes) -> list[Pair]:
    """Every send x wait x mode to measure, host waits eager only (a graph cannot wait on the CPU)."""
    return [Pair(m, s, w) for m in modes for s in sends for w in waits if not (m == "graph" and w == "host")]


def sender(leg: int) -> int:
    return leg % 2


def receiver(leg: int) -> int:
    return 1 - leg % 2


def half(side: int, wait: str, legs: int) -> list[tuple[str, int]]:
    """What ``side`` queues on its stream for a run whose waits are not the host's, in order: on its sending legs
    (copy, leg) (signal, leg); on its receiving legs (wait, leg) for memop and spin waits, then (consume, leg) (the
    fold consumer polls itself)."""
    ops: list[tuple[str, int]] = []
    for leg in range(legs):
        if sender(leg) == side:
            ops += [("copy", leg), ("signal", leg)]
        else:
            ops += ([("wait", leg)] if wait in ("memop", "spin") else []) + [("consume", leg)]
    return ops


def host_legs(here, legs: int) -> list[int]:
    """The legs whose arrival the CPU of a process holding ``here`` (side indices) polls for, in order; after each
    it launches the consumer and the receiver's send of the next leg (leg 0 is sent first, by side 0)."""
    return [leg for leg in range(legs) if receiver(leg) in here]


def counts(status: list[int], side: int | None, legs: int) -> dict[str, int]:
    """A run's status words on ``side``, counted over the legs it received (None: every leg, the baseline's)."""
    out = {name: 0 for name in STATUS.values()}
    for leg in range(legs):
        if side is None or receiver(leg) == side:
            out[STATUS.get(status[leg], "wrong")] += 1
    return out


# -- a pair's measurements from its processes (pure) -----------------------------------------------------------------
class Measured(NamedTuple):
    totals_us: list  # side 0's total time of each timed run
    counts: dict  # status counts over every run, both sides
    runs: int  # runs made (warm-up included)
    note: str  # why the times are missing or partial ('' when none)


def merge(parts: list[Measured]) -> Measured:
    """One pair's reports from the processes of its placement (ipc: one per side) as one."""
    totals = [t for p in parts for t in p.totals_us]
    total_counts = {name: sum(p.counts.get(name, 0) for p in parts) for name in STATUS.values()}
    notes = list(dict.fromkeys(p.note for p in parts if p.note))
    return Measured(totals, total_counts, max((p.runs for p in parts), default=0), "; ".join(notes))
