"""The AMD-DMA-Latte authors' published figures, beside ours: their PERFORMANCE.md tables, copied verbatim at a named
commit into ``reference/amd_dmalatte/PERFORMANCE.md`` (its first lines cite the source). Nothing in that file was
measured here; every number of theirs on a page is read from it.

* ``speedups``: per collective and size, each variant's speedup over their plain ``pcpy`` (8x MI300X, host-driven);
* ``phases``: the share of each phase of one DMA copy (control, schedule, copy, sync) per size;
* ``comparison``: their speedup columns next to ours (eager, from one sweep run) for the variants both have.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from dmacoll.lab_api import human, parse_size

PATH = Path(__file__).resolve().parents[3] / "reference/amd_dmalatte/PERFORMANCE.md"
OPS = {"All-Gather": "all_gather", "All-to-All": "all_to_all"}
# their column -> ours: the same change to the plain pcpy collective (report.FEATURES; PL, PRELAUNCH=1, is the
# prerecorded call here: the commands created ahead, released by one trigger)
PAIRS = {"pcpy+PL": "prerecord", "b2b": "b2b", "b2b+PL": "b2b_prerecord", "best": "best"}


def source(path: Path = PATH) -> str:
    """The reference's source URL (its ``Source:`` line)."""
    found = re.search(r"^Source: (\S+)", Path(path).read_text(), re.M)
    if not found:
        raise ValueError(f"{path} names no source")
    return found.group(1)


def _tables(text: str) -> dict[str, pd.DataFrame]:
    """Each Markdown table of ``text`` under the ``###`` heading before it, cells as strings."""
    tables: dict[str, pd.DataFrame] = {}
    heading, rows = "", []
    for line in text.splitlines() + [""]:
        if line.startswith("### "):
            heading = line[4:].strip()
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            header, body = rows[0], [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]
            tables[heading] = pd.DataFrame(body, columns=header)
            rows = []
    return tables


def _number(cell: str) -> float:
    return float(re.sub(r"[^0-9.]", "", cell))


def speedups(path: Path = PATH) -> pd.DataFrame:
    """Per op and size (``bytes_per_rank``): every variant's speedup over pcpy, as the authors published it."""
    parts = []
    for heading, op in OPS.items():
        t = _tables(Path(path).read_text())[heading]
        values = t.drop(columns="Size").apply(lambda col: col.map(_number))
        parts.append(values.assign(op=op, bytes_per_rank=t["Size"].map(parse_size)))
    out = pd.concat(parts, ignore_index=True)
    return out[["op", "bytes_per_rank", *[c for c in out if c not in ("op", "bytes_per_rank")]]]


def phases(path: Path = PATH) -> pd.DataFrame:
    """Per size: the share of one DMA copy's time in each phase (fractions), as the authors published it."""
    t = _tables(Path(path).read_text())["MI300X Results"]
    out = t.drop(columns="Size").apply(lambda col: col.map(lambda c: _number(c) / 100))
    return out.assign(bytes=t["Size"].map(parse_size))


def comparison(ours: pd.DataFrame, theirs: pd.DataFrame, mode: str = "eager") -> pd.DataFrame:
    """Per op and size measured here: their speedup over pcpy (8x MI300X) next to ours (``report.speedup_table``
    of one mode) for each pair in ``PAIRS``; their value is empty at a size they did not publish."""
    mine = ours[ours["mode"] == mode]
    published = theirs.rename(columns={c: f"{c} (MI300X)" for c in PAIRS})[
        ["op", "bytes_per_rank", *[f"{c} (MI300X)" for c in PAIRS]]]
    merged = mine.merge(published, on=["op", "bytes_per_rank"], how="left")
    out = merged[["op", "bytes_per_rank"]].copy()
    out.insert(1, "size", out["bytes_per_rank"].map(lambda b: human(int(b))))
    for their_col, our_col in PAIRS.items():
        out[f"{their_col} (MI300X)"] = merged[f"{their_col} (MI300X)"]
        out[f"{our_col} (here)"] = merged[our_col] if our_col in merged else float("nan")
    return out.sort_values(["op", "bytes_per_rank"]).reset_index(drop=True)
