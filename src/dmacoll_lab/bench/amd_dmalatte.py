"""AMD DMA-Latte's collective benchmark output as rows of the operator sweep's tidy table.

The authors' ``sdma_collective`` (AMDResearch/AMD-DMA-Latte) prints, per run, a line
``Collective: <Name>`` (e.g. ``AllgatherPcpy``), a blank line, the header
``size(B),time(us),algbw(GB/s),busbw(GB/s)`` and one row per size; with SDMA_VERBOSE an indented
``control(ns)=...`` line follows each row. Its columns, per its README:

* ``size``: the whole collective, chunk x N GPUs: nccl-tests' size, our ``total_bytes``;
* ``time``: mean end-to-end latency of the iterations after 5 warm-up ones (a mean, not a median);
* ``algbw`` = (N-1)/N x size / time: what nccl-tests and this repository call **busbw**;
* ``busbw`` = size / (N x time): bandwidth per link, which has no column here.

So ``algbw_GBps`` is recomputed as size / time and ``busbw_GBps`` is their algbw; both of their
bandwidths are checked against the given world size, which catches a wrong ``world``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional, Union

from .sweep import COLUMNS

IMPL = "amd_dmalatte"
HEADER = "size(B),time(us),algbw(GB/s),busbw(GB/s)"
OPS = {"ag": "all_gather", "aa": "all_to_all", "all_gather": "all_gather", "all_to_all": "all_to_all"}
VARIANTS = {"all_gather": ("pcpy", "bcst", "b2b"), "all_to_all": ("pcpy", "swap", "b2b")}
COLLECTIVES = {"AllgatherPcpy": ("all_gather", "pcpy"), "AllgatherBcst": ("all_gather", "bcst"),
               "AllgatherNwayB2b": ("all_gather", "b2b"), "AlltoallPcpy": ("all_to_all", "pcpy"),
               "AlltoallSwap": ("all_to_all", "swap"), "AlltoallNwayB2b": ("all_to_all", "b2b")}
SYNC_TYPES = {0: "fence32", 1: "fence2x32", 2: "atomic64"}  # SYNC_TYPE: the completion command
WARMUP = 5  # iterations the tool discards
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|inf|nan"
_ROW = re.compile(rf"^\s*([0-9]+)\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*$")
_COLLECTIVE = re.compile(r"^Collective:\s*(\w+)\s*$")
_FAILED = re.compile(r"for size:\s*([0-9]+),.*FAILED")


class FormatError(ValueError):
    """The text is not sdma_collective output (or does not fit the metadata given)."""


def variant_name(variant: str, prelaunch: bool = False) -> tuple[str, str]:
    """('pcpy', 'pcpy+PRELAUNCH') from 'pcpy' + prelaunch, 'pcpy+PRELAUNCH' or 'PRELAUNCH' (their
    shorthand for pcpy with PRELAUNCH=1): the base variant and the name rows carry."""
    parts = [p for p in variant.replace(" ", "").split("+") if p]
    pre = prelaunch or any(p.upper() == "PRELAUNCH" for p in parts)
    base = [p.lower() for p in parts if p.upper() != "PRELAUNCH"]
    if len(base) > 1:
        raise FormatError(f"variant {variant!r}: one of pcpy/bcst/swap/b2b, optionally +PRELAUNCH")
    base_name = base[0] if base else "pcpy"
    return base_name, base_name + ("+PRELAUNCH" if pre else "")


def parse(text: str, *, world: int, op: Optional[str] = None, variant: Optional[str] = None,
          prelaunch: bool = False, sync_type: Optional[int] = None, num_iter: Optional[int] = None,
          direction: str = "", place: Optional[str] = None, source: str = "<text>") -> list[dict]:
    """Rows (COLUMNS of bench.sweep) from one run's stdout. ``op`` and ``variant`` may be left out
    when the text names its collective (``Collective: AllgatherPcpy``); given, they must agree."""
    if not isinstance(world, int) or world < 2:
        raise FormatError(f"{source}: world must be the number of GPUs (>= 2), got {world!r}")
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if line.startswith("Skipping execution"):
            raise FormatError(f"{source}:{i}: the run was skipped, it has no results: {line.strip()}")
    named = [(i, _COLLECTIVE.match(line.strip())) for i, line in enumerate(lines, 1)]
    named = [(i, m.group(1)) for i, m in named if m]
    for i, name in named:
        if name not in COLLECTIVES:
            raise FormatError(f"{source}:{i}: unknown collective {name!r}; expected one of {sorted(COLLECTIVES)}")
    if len({n for _, n in named}) > 1:
        raise FormatError(f"{source}: several collectives in one file ({sorted({n for _, n in named})}); "
                          "convert one run per file")
    if op is None and not named:
        raise FormatError(f"{source}: give op= (ag/aa): the text does not name its collective")
    op_name = OPS.get(op) if op is not None else COLLECTIVES[named[0][1]][0]
    if op_name is None:
        raise FormatError(f"{source}: op {op!r} is not one of {sorted(OPS)}")
    base, name = variant_name(variant if variant is not None else
                              (COLLECTIVES[named[0][1]][1] if named else "pcpy"), prelaunch)
    if base not in VARIANTS[op_name]:
        raise FormatError(f"{source}: variant {base!r} does not exist for {op_name}; one of {VARIANTS[op_name]}")
    if named and COLLECTIVES[named[0][1]] != (op_name, base):
        raise FormatError(f"{source}:{named[0][0]}: the text is {named[0][1]} but op={op!r}, variant={variant!r} "
                          "were given")
    if sync_type is not None and sync_type not in SYNC_TYPES:
        raise FormatError(f"{source}: sync_type {sync_type!r} is not one of {sorted(SYNC_TYPES)}")
    if num_iter is not None and num_iter <= WARMUP:
        raise FormatError(f"{source}: num_iter={num_iter}: the tool prints nothing for <= {WARMUP} iterations")

    failed_chunks = {int(m.group(1)) for m in map(_FAILED.search, lines) if m}
    rows, in_table, seen_header = [], False, False
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s == HEADER:
            in_table = seen_header = True
            continue
        if not s or not in_table:
            continue  # banner, warnings and blank lines around the table
        if s.startswith("control(ns)=") or "FAILED" in s or s.startswith("sysBufs"):
            continue  # SDMA_VERBOSE breakdowns and validation messages
        m = _ROW.match(s)
        if m is None:
            raise FormatError(f"{source}:{i}: not a row of {HEADER!r}: {line!r}")
        rows.append(_row(i, source, *m.groups(), world=world, op=op_name, variant=name, base=base,
                         sync_type=sync_type, num_iter=num_iter, direction=direction, place=place,
                         failed=failed_chunks))
    if not seen_header:
        hint = " (this looks like nccl-tests output)" if "busbw" in text and "#" in text else ""
        raise FormatError(f"{source}: no header line {HEADER!r}{hint}")
    if not rows:
        raise FormatError(f"{source}: the table has no rows (did the run skip, e.g. too few GPUs?)")
    return rows


def _row(i: int, source: str, size: str, time: str, their_algbw: str, their_busbw: str, *, world: int, op: str,
         variant: str, base: str, sync_type: Optional[int], num_iter: Optional[int], direction: str,
         place: Optional[str], failed: set) -> dict:
    total, time_us = int(size), float(time)
    if total % world:
        raise FormatError(f"{source}:{i}: size {total} is not chunk x {world} GPUs: wrong world?")
    if not time_us > 0:
        raise FormatError(f"{source}:{i}: time {time!r} us is not a positive duration")
    algbw = total / (time_us * 1e-6) / 1e9
    busbw = algbw * (world - 1) / world
    per_link = total / world / (time_us * 1e-6) / 1e9
    tol = max(2e-3, 0.006 / time_us)  # the tool prints 2 decimals; time's rounding dominates at small sizes
    for what, ours, theirs in (("algbw", busbw, float(their_algbw)), ("busbw", per_link, float(their_busbw))):
        if not math.isclose(ours, theirs, rel_tol=tol, abs_tol=0.011):
            raise FormatError(f"{source}:{i}: their {what} {theirs} GB/s does not match size/time with world={world} "
                              f"({ours:.2f} GB/s expected): wrong world, or not sdma_collective output?")
    chunk = total // world
    row = {"op": op, "impl": IMPL, "variant": variant, "direction": direction,
           "place": place or ("in" if op == "all_gather" or base == "swap" else "out"),
           "signal": SYNC_TYPES.get(sync_type, "") if sync_type is not None else "", "prerecord": False,
           "world": world, "bytes_per_rank": chunk if op == "all_gather" else total, "total_bytes": total,
           "dtype": "", "mode": "eager", "time_us": time_us, "time_us_p10": float("nan"),
           "time_us_p90": float("nan"), "algbw_GBps": algbw, "busbw_GBps": busbw,
           "correct": chunk not in failed, "status": "ok", "error": "",
           "calls": num_iter - WARMUP if num_iter else "", "repeats": 1}
    return {c: row.get(c, "") for c in COLUMNS}  # the sweep's columns decide; ones this tool lacks stay empty


def read(path: Union[str, Path], **meta) -> list[dict]:
    path = Path(path)
    return parse(path.read_text(), source=str(path), **meta)


def convert(path: Union[str, Path], out: Union[str, Path], **meta) -> Path:
    """Parse ``path`` and write the tidy CSV ``out`` with its provenance sidecar."""
    from . import provenance

    rows = read(path, **meta)
    return provenance.write_table(Path(out), rows, COLUMNS, {"source": str(path), "impl": IMPL, **meta})
