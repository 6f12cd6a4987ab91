"""GPU probes: small, single-purpose measurements behind the experiments' explanations (`dmacoll probe <name>`).

Each module is one probe with the same interface:

* ``NAME``, ``HELP`` (one line), ``GPUS`` (how many CUDA GPUs it needs);
* ``COLUMNS``: its table's columns; ``EXTRA``: further tables it writes, run-folder name -> columns (``{}`` for
  most; sm_carveout's GEMM-cost table);
* ``add_arguments(parser)``: its options (today's values as defaults, so a rerun measures the same thing);
* ``run(args) -> {table name: Table}``: the GPU work; the main table under ``NAME``, the others under their
  ``EXTRA`` names.

The GPU-free parts (row assembly, derived quantities, argument types) are plain functions that tests call with
fake measurements. torch and cuda-bindings are imported inside functions, so every module imports without a GPU.
"""
from __future__ import annotations

from pathlib import Path

from . import (call_cost, call_timeline, copy_contention, crossing, few_sm_kernels, flag_latency, local_copy_paths,
               memcpy_batch, peer_window, sm_carveout, sm_path, submit_cost)

PROBES = {m.NAME: m for m in (call_cost, call_timeline, copy_contention, crossing, few_sm_kernels, flag_latency,
                              local_copy_paths, memcpy_batch, peer_window, sm_carveout, sm_path,
                              submit_cost)}
__all__ = ["PROBES", "tables", "table_path"]


def tables(probe) -> dict[str, list[str]]:
    """Every table a probe writes, name -> columns (its main table under its NAME)."""
    return {probe.NAME: probe.COLUMNS, **probe.EXTRA}


def table_path(out: str | Path, probe_name: str, table: str) -> Path:
    """Where a table goes, given the main table's ``out``: an extra table gets a run folder of its own beside the
    main one (``.../probes/sm_carveout/data.csv`` -> ``.../probes/sm_carveout_gemm_cost/data.csv``); a CSV not
    named data.csv gets a sibling file (``x.csv`` -> ``x_gemm_cost.csv``)."""
    out = Path(out)
    if table == probe_name:
        return out
    if out.name == "data.csv":
        return out.parent.parent / table / out.name
    return out.with_name(f"{out.stem}_{table.removeprefix(probe_name + '_')}{out.suffix}")
