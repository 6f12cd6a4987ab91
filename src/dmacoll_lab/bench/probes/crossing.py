"""Which half of a completion signal costs: the send or the wait? (one GPU; ``--placements peer``: two)

Every dmacoll call pays one or two flag crossings (data copied, then a completion flag the receiver waits for):
2.2 us between two streams of one GPU (``dmacoll probe flag_latency``), 7-12 us across NVLink (``breakdown/``).
This probe times each way to *send* completion against each way to *wait* for it, as the time from the data's
arrival to the consumer running on the receiving side.

Sends (after the data copy, on the sender's stream):

* ``memop``: ``cuStreamWriteValue32`` of the leg's value, with its default memory barrier (dmacoll's default);
* ``copy``: a 4-byte ``cuMemcpyAsync`` of the value queued behind the data (dmacoll's ``signal="copy"``, NCCL
  2.29's copy-engine flags);
* ``kernel``: a one-thread NVRTC kernel, ``__threadfence_system()`` then a volatile store.

Waits (on the receiver):

* ``memop``: ``cuStreamWaitValue32`` GEQ on the receiver's stream (no flush flag, as dmacoll waits), then the
  consumer kernel;
* ``spin``: a one-thread kernel polling with ``ld.acquire.sys`` (no sleep), then the consumer kernel;
* ``fold``: the consumer kernel polls itself (thread 0, ``ld.acquire.sys``, then a block barrier) and consumes;
* ``host``: the CPU polls a flag in pinned, mapped host memory (the sender writes it there, which all three sends
  can do) and then launches the consumer, from Python (one cuda-bindings call a launch, its arguments packed
  beforehand), and queues the next leg's copy and send. Eager only: a captured graph cannot wait on the CPU, so
  host x graph pairs are not rows.

Method: a ping-pong of ``--legs`` legs (even) between side 0 and side 1. Leg i: its sender (i % 2) copies
``--bytes`` of leg-i data (word w = (i + 1) * words + w) into the receiver's inbox and sends flag value i + 1; the
receiver waits for it, and the consumer kernel (one block) reads every word, compares it with leg i's, and writes
leg i's status (ok, wrong data, wait timed out). The receiver of leg i sends leg i + 1, so the legs are serial and
the last one lands on side 0: CUDA events on side 0's stream (start before leg 0's copy, end after leg N-1's
consumer) time all N legs on one stream; no clocks of different streams or processes are compared. The baseline
leg is the same copy (into side 0's inbox from side 1's data, issued by side 0: a pull where the sides are two
GPUs, the same device-local copy otherwise) and the same consumer, N times on side 0's stream, with no crossing.
Per pair: ``leg_us`` = median over ``--repeats`` of total / legs; ``crossing_us`` = ``leg_us`` - ``base_leg_us``
(the baseline of the same placement and mode): the extra time from data arrival to the consumer running.

Modes: ``eager``, everything queued behind a gate (a host word the CPU sets once both sides are queued, as
flag_latency does; host waits are driven by the CPU instead, no gate); ``graph``, each side's half captured once as
a CUDA graph on its stream and replayed behind the gate.

Placements (``--placements``; by default every one the visible GPUs allow): ``streams``, two streams of one
process on GPU 0; ``ipc``, two processes on GPU 0, each side's inbox (flag, data) shared with the other through
CUDA IPC (torch tensor sharing) and the host flags in a shared /dev/shm page both register with
``cuMemHostRegister``; without MPS two contexts time-slice, so a pair may take a time slice per leg; ``peer``,
side 0 on GPU 0 and side 1 on GPU 1 of one process, peer access enabled (NVLink; two GPUs: the library's ranks
are two processes, over the same peer mappings). Every placement runs in child processes that the parent stops
after a deadline.

Never hung: the spin and fold waits give up after ``--wait-timeout-ms`` (status: timed out), host polls after that
or 1 s, whichever is longer; a run with a timed-out wait ends its pair, recorded with the count and no times. A
side whose stream does not finish by the deadline releases its own waits (its flags set to the largest value) and
the row records it. Before its first pair each send is tried once per placement (a write into the other side's
flag, observed): a driver that refuses it (from CUDA 13.1 stream memop writes to peer memory) gets rows with the
reason and no times.

Columns: placement, mode, send, wait (``none`` for the baseline rows), legs, bytes, leg_us (min, max over
repeats), base_leg_us, crossing_us, correct (every leg's consumer saw its leg's data, in every run), timeouts
(legs whose wait gave up), note (why a row has no times).

Usage: dmacoll probe crossing [--placements streams ipc peer] [--legs 100] [--repeats 5] [--bytes 4K]
       [--sends ...] [--waits ...] [--modes ...] [--wait-timeout-ms 20] [--out CSV]
"""
from __future__ import annotations

import argparse
import statistics

from .common import Table, add_repeats, count, driver, require_gpus, size_multiple_of
from .crossing_legs import Measured, Pair, baseline, pair_matrix

NAME = "crossing"
HELP = "a completion crossing by halves: memop / copy / kernel send x memop / spin / fold / host wait (1 GPU)"
GPUS = 1
COLUMNS = ["placement", "mode", "send", "wait", "legs", "bytes", "leg_us", "leg_us_min", "leg_us_max", "base_leg_us",
           "crossing_us", "correct", "timeouts", "note"]
EXTRA: dict[str, list[str]] = {}
SENDS = ("memop", "copy", "kernel")
WAITS = ("memop", "spin", "fold", "host")
MODES = ("eager", "graph")
PLACEMENTS = ("streams", "ipc", "peer")
PLACEMENT_GPUS = {"streams": 1, "ipc": 1, "peer": 2}
# every leg of a gated run is queued before the gate opens: 200 legs are ~300 commands per stream, well inside a
# stream's queue (more could fill it, and the host would block behind the gate it has not opened yet)
MAX_LEGS = 200
MAX_BYTES = 1 << 20  # each side holds legs x bytes of leg data


def even_legs(text: str) -> int:
    value = count(text)
    if value % 2 or value > MAX_LEGS:
        raise argparse.ArgumentTypeError(f"an even number up to {MAX_LEGS} (the last leg lands on side 0): {text!r}")
    return value


def leg_bytes(text: str) -> int:
    value = size_multiple_of(4)(text)
    if value > MAX_BYTES:
        raise argparse.ArgumentTypeError(f"at most {MAX_BYTES} bytes: {text!r}")
    return value


def positive_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=None,
                   help="where the two sides run (default: every one the visible GPUs allow: streams ipc, and peer "
                        "with two GPUs)")
    p.add_argument("--legs", type=even_legs, default=100,
                   help=f"legs per timing, even, at most {MAX_LEGS} (default 100)")
    add_repeats(p, 5)
    p.add_argument("--bytes", type=leg_bytes, default=4096,
                   help=f"data copied per leg (a multiple of 4, at most {MAX_BYTES}; default 4K)")
    p.add_argument("--sends", nargs="+", choices=SENDS, default=list(SENDS), help="ways to send (default: all)")
    p.add_argument("--waits", nargs="+", choices=WAITS, default=list(WAITS), help="ways to wait (default: all)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="eager, graph (default: both)")
    p.add_argument("--wait-timeout-ms", type=positive_ms, default=20.0,
                   help="a spin or fold wait gives up after this long, a host poll after this or 1 s (default 20)")


# -- the pairs and each side's part of a run (pure) ----------------------------------------------------------------
# -- a pair's row (pure) -----------------------------------------------------
def leg_times(m: Measured, legs: int) -> tuple:
    """(median, min, max) microseconds per leg, or three empty strings without times."""
    if not m.totals_us:
        return "", "", ""
    per_leg = [t / legs for t in m.totals_us]
    return statistics.median(per_leg), min(per_leg), max(per_leg)


def pair_row(placement: str, pair: Pair, legs: int, nbytes: int, m: Measured, base: Measured | None) -> dict:
    """One pair's row: its leg time, the baseline's, their difference (the crossing), and its checks. A baseline row
    (send none) has no crossing; a pair whose baseline has no times has none either."""
    leg, lo, hi = leg_times(m, legs)
    base_leg = leg_times(base, legs)[0] if base is not None else ""
    if pair.send == "none":
        base_leg = leg
    crossing = leg - base_leg if pair.send != "none" and leg != "" and base_leg != "" else ""
    c = m.counts
    correct = m.runs > 0 and c.get("ok", 0) == legs * m.runs and c.get("ok", 0) == sum(c.values())
    return {"placement": placement, "mode": pair.mode, "send": pair.send, "wait": pair.wait, "legs": legs,
            "bytes": nbytes, "leg_us": leg, "leg_us_min": lo, "leg_us_max": hi, "base_leg_us": base_leg,
            "crossing_us": crossing, "correct": correct, "timeouts": c.get("timeout", 0), "note": m.note}


def placement_rows(placement: str, pairs: list[Pair], legs: int, nbytes: int, got: dict,
                   stopped: str = "") -> list[dict]:
    """The baseline rows (one per mode measured) and every pair's, from ``got``: Pair -> Measured; a pair missing
    from it (the placement's processes stopped before it, ``stopped`` saying why) gets a row that says so."""
    missing = Measured([], {}, 0, f"not measured: {stopped or 'the processes stopped before it'}")
    modes = list(dict.fromkeys(p.mode for p in pairs))
    rows = [pair_row(placement, baseline(mode), legs, nbytes, got.get(baseline(mode), missing), None)
            for mode in modes]
    rows += [pair_row(placement, p, legs, nbytes, got.get(p, missing), got.get(baseline(p.mode))) for p in pairs]
    return rows


def summary_line(row: dict) -> str:
    if row["leg_us"] == "":
        times = "no times"
    else:
        crossing = "" if row["crossing_us"] == "" else f"crossing {row['crossing_us']:7.2f} us  "
        times = f"{crossing}leg {row['leg_us']:7.2f} us"
    flags = ("" if row["correct"] else "  WRONG") + (f"  {row['timeouts']} timeouts" if row["timeouts"] else "")
    note = f"  ({row['note']})" if row["note"] else ""
    return f"{row['placement']:8s} {row['mode']:6s} {row['send']:7s} -> {row['wait']:6s} {times}{flags}{note}"


def default_placements() -> list[str]:
    """Every placement the visible GPUs allow."""
    import torch

    gpus = torch.cuda.device_count() if torch.version.cuda and torch.cuda.is_available() else 0
    return [p for p in PLACEMENTS if PLACEMENT_GPUS[p] <= max(gpus, 1)]


def run(args: argparse.Namespace) -> dict[str, Table]:
    from .crossing_launch import measure_placement

    driver()  # a missing cuda-bindings is one line, before any process starts
    placements = args.placements or default_placements()
    for placement in placements:
        require_gpus(PLACEMENT_GPUS[placement], f"crossing --placements {placement}")
    pairs = pair_matrix(args.sends, args.waits, args.modes)
    cfg = {"legs": args.legs, "bytes": args.bytes, "repeats": args.repeats, "wait_timeout_ms": args.wait_timeout_ms}
    rows = []
    for placement in placements:
        got, stopped = measure_placement(placement, pairs, cfg)
        if stopped:
            print(f"crossing {placement}: stopped early: {stopped}", flush=True)
        for row in placement_rows(placement, pairs, args.legs, args.bytes, got, stopped):
            rows.append(row)
            print(summary_line(row), flush=True)
    config = {**cfg, "placements_run": placements, "sends": list(args.sends), "waits": list(args.waits),
              "modes": list(args.modes)}
    return {NAME: Table(rows, config)}
