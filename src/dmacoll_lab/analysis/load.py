"""Result tables: the one place that reads a result CSV of a given kind into a DataFrame.

    df = load.read("operator", ["results/h200x2/operator/sweep_all_gather/data.csv", ...])

A path is a CSV (any name: ``data.csv`` of a run folder or an older ``sweep_all_gather.csv``) or a run folder
(its ``data.csv``). Each kind says which strings are missing values and how files written by older code are
brought up to today's columns; every table gets ``source``, the file each row came from. ``provenance`` reads a
CSV's JSON sidecar (``data.csv`` -> ``data.json``, as ``bench.provenance.write_table`` writes it), ``platform``
the machine a result was measured on, from that provenance.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from dmacoll.lab_api import Platform


def csv_path(path: str | Path) -> Path:
    """A run folder's ``data.csv``, or the CSV given."""
    p = Path(path)
    return p / "data.csv" if p.is_dir() else p


def provenance(path: str | Path) -> dict:
    """The provenance sidecar of a result CSV (or run folder)."""
    return json.loads(csv_path(path).with_suffix(".json").read_text())


def platform(provenance: dict, world: int) -> Platform:
    """The platform a result was measured on, from its provenance: the GPU, the world, the topology (``nvlink``
    where `nvidia-smi topo -m` shows NV# links between the GPUs, ``pcie`` where it shows only PCIe paths, else
    ``unknown``) and the driver."""
    hardware = provenance.get("hardware", {})
    gpus, matrix = hardware.get("gpus") or [""], (hardware.get("topology") or "").split("Legend")[0]
    topology = "nvlink" if re.search(r"\bNV\d+\b", matrix) else \
        "pcie" if re.search(r"\b(PIX|PXB|PHB|NODE|SYS)\b", matrix) else "unknown"
    return Platform(gpus[0], world, topology, (hardware.get("driver") or [""])[0])


def _operator(df: pd.DataFrame) -> pd.DataFrame:
    """Sweeps (operator, NCCL CE, native, AMD-DMA-Latte runs): fill in options older sweeps lack, fix peer_copy."""
    # sweeps from before an option existed ran with its default (a column missing in some files is NaN there)
    defaults = {"signal": df["impl"].map(lambda i: "memop" if i == "dma" else ""),
                "wait": df["impl"].map(lambda i: "memop" if i in ("dma", "dma_default") else ""), "prerecord": False,
                "submit": "python", "handshake": df["impl"].map(lambda i: "full" if i == "dma" else ""),
                # before the sm path (issue 49) every dmacoll call ran on the copy engines
                "path": df["impl"].map(lambda i: "dma" if i in ("dma", "dma_default") else "")}
    for col, default in defaults.items():
        df[col] = df[col].where(df[col].notna(), default) if col in df else default
    df["submit"] = df["submit"].replace("", "python").astype(str)
    for col in ("variant", "direction", "place", "signal", "wait", "handshake", "path", "error"):
        df[col] = df[col].astype(str)
    df["prerecord"] = df["prerecord"].astype(str) == "True"
    df["ok"] = (df["status"] == "ok") & (df["correct"].astype(str) == "True")
    # sweeps before 2026-11-22 gave peer_copy the collective's bus factor (wrong at world > 2): recompute
    copies = df["impl"] == "peer_copy"
    if copies.any():
        from ..bench.bandwidth import bandwidths

        df.loc[copies, ["total_bytes", "algbw_GBps", "busbw_GBps"]] = [
            bandwidths(r.op, r.impl, r.bytes_per_rank, r.world, r.time_us) for r in df[copies].itertuples()]
    return df


def _as_written(df: pd.DataFrame) -> pd.DataFrame:
    return df


# `dmacoll interference` before it became C3 at fixed sizes: its shapes, and its rows' names in C3's schema
_OLD_INTERFERENCE_SHAPES = {"gemm": (8192, 8192, 8192), "membound": (32768, 16384, 0)}  # membound: 2^29 elements


def _interference(df: pd.DataFrame) -> pd.DataFrame:
    """Interference tables: C3's schema (``dmacoll interference`` is C3 at fixed sizes). Tables written before
    that (no ``strategy`` column: a dma ``pcpy`` / ``auto`` row per size next to NCCL's) are rewritten into it, the
    measured times and metrics as they are; ``option`` names the row (``baseline``, ``dma``, ``dma pcpy``)."""
    if "strategy" in df:
        return df
    old = df.copy()
    dma = old["impl"] == "dma"
    old["strategy"] = dma.map({True: "dma", False: "baseline"})
    old["option"] = [("dma" if v == "auto" else f"dma {v}") if d else "baseline" for d, v in zip(dma, old["variant"])]
    old["variant"] = [f"{v}/{d}" if isinstance(v, str) else "" for v, d in zip(old["variant"], old["direction"])]
    for i, dim in enumerate(("M", "N", "K")):
        old[dim] = old["compute"].map(lambda c: _OLD_INTERFERENCE_SHAPES[c][i])
    old["op"], old["target_ratio"], old["skipped"] = "all_gather", 1.0, ""
    return old.drop(columns=["direction", "place"])


def _e2e(df: pd.DataFrame) -> pd.DataFrame:
    """`dmacoll e2e` tables: those written before the schedules ran every collective in line (``serial``), one
    piece, one micro-batch; their other new columns stay missing."""
    for col, default in (("schedule", "serial"), ("pieces", 1), ("microbatches", 1)):
        df[col] = df[col].where(df[col].notna(), default) if col in df else default
    df["schedule"] = df["schedule"].astype(str)
    return df


def _vllm(df: pd.DataFrame) -> pd.DataFrame:
    """`dmacoll vllm results csv` tables: ``round``, the plugin off/on round of each row's vLLM run (``_r<n>`` ending
    its JSON's name, ``row_source``; 1 where a run had no rounds)."""
    own = df["row_source"].astype(str) if "row_source" in df else pd.Series("", index=df.index)
    df["round"] = own.str.extract(r"_r(\d+)\.json$", expand=False).fillna("1").astype(int)
    return df


# kind -> (strings read as missing; None: pandas' defaults), migration of the concatenated table
KINDS: dict[str, tuple[list[str] | None, Callable[[pd.DataFrame], pd.DataFrame]]] = {
    "operator": (["nan"], _operator),  # "" stays "": a column empty for some implementations (variant, error)
    "power": (["nan", ""], _as_written),
    "sm_usage": (["nan", ""], _as_written),
    "interference": (["nan", "NaN", ""], _interference),
    "breakdown": (None, _as_written),
    "c3": (["nan", "NaN", ""], _as_written),
    "ficco": (["nan", "NaN", ""], _as_written),
    "e2e": (["nan", ""], _e2e),
    "vllm": (["nan", ""], _vllm),
    "probe": (["nan", ""], _as_written),  # `dmacoll probe` tables
    "check_cost": (["nan", ""], _as_written),  # `dmacoll check-cost`
}


def read(kind: str, paths: Sequence[str | Path]) -> pd.DataFrame:
    """The result CSVs ``paths`` of one ``kind`` as one table; ``source`` names each row's file (a table's own
    ``source`` column, what its row was made from, becomes ``row_source``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; known: {', '.join(KINDS)}")
    na_values, migrate = KINDS[kind]
    na = {"keep_default_na": False, "na_values": na_values} if na_values is not None else {}
    frames = [pd.read_csv(csv_path(p), **na).rename(columns={"source": "row_source"}).assign(source=str(csv_path(p)))
              for p in paths]
    return migrate(pd.concat(frames, ignore_index=True))
