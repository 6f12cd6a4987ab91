"""The machines the report shows, found in ``results/`` instead of listed by hand: every folder holding a run
(``data.csv`` with its provenance ``data.json``) measured on GPUs. Its label comes from that provenance (GPU count,
model, NVLink), its operator sweeps from ``operator/sweep_*`` or, where it has none, from the sweep-format runs of
its other experiments (2x H100's ``defaults/sweep_*``). No pandas: the workflow imports this at parse time.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

NOT_MACHINES = ("local",)  # results/local: this checkout's own fresh runs, not committed
SWEEP_COLUMNS = {"impl", "bytes_per_rank", "time_us", "busbw_GBps", "place"}  # an operator sweep's header
GPU_MODELS = ("MI300X", "H200", "H100", "B200", "A100")


# per machine folder, the runs of dmacoll probe sm_path that measured Communicator()'s current defaults (globs), three
# runs each at 1 KB-4 MB and 8-256 MB per rank, the implementations' samples interleaved, made by the workflow's rule
# default_call (tools/lent_snakemake.sh): on 2x H200 at 8855b00 and later, on 4x H200 at be50f6f
DEFAULT_CALL_RUNS = {"h200x2": ("sm_path/default_call_small_run*", "sm_path/default_call_large_run*"),
                     "h200x4": ("sm_path/default_call_small_run*", "sm_path/default_call_large_run*")}


# per machine folder, the runs whose copy-engine rows (path='dma', sums staged) against NCCL set where 'auto' takes
# the copy engines above the sm path (options.DMA_AUTO_MIN_BYTES; tables.dma_auto_sizes): 8-256 MB per rank, six runs
DMA_AUTO_RUNS = {machine: ("sm_path/large_calls_staged_run*", "sm_path/large_calls_dma_sums_run*")
                 for machine in ("h200x2", "h200x4")}


# per machine folder, the repeated e2e runs of the current default call at the machine's full world that the end-to-end
# claims rest on (each point's ratio the median over its runs): the rule e2e_phased's runs with every schedule, at
# 2 GPUs code e1900de, at 4 be50f6f
E2E_CLAIM_RUNS = {"h200x2": ("e2e/phased_tp2_*_run*",),
                  "h200x4": ("e2e/phased_tp4_*_run*",)}


# per machine folder, the vLLM runs (plugin off and on in one lease, the default route) that the vLLM claims rest on:
# not the runs that routed every call (DMACOLL_VLLM_ROUTE=all, a policy, not the default)
VLLM_CLAIM_RUNS = {"h200x2": ("vllm/tp2_latency", "vllm/tp2_latency_alternating", "vllm/tp2_latency_measured_*",
                              "vllm/tp2_throughput_*"),
                   "h200x4": ("vllm/tp4_latency_round*", "vllm/tp*_throughput_rounds")}


def _globbed(folder: Path, registry: dict) -> list[Path]:
    folder = Path(folder)
    return [p for runs in registry.get(folder.name, ()) for p in sorted(folder.glob(f"{runs}/data.csv"))]


def default_call_runs(folder: Path) -> list[Path]:
    """The data.csv of each run of the current defaults in a machine folder (``DEFAULT_CALL_RUNS``), in order."""
    return _globbed(folder, DEFAULT_CALL_RUNS)


def dma_auto_runs(folder: Path) -> list[Path]:
    """The data.csv of each run that sets where 'auto' takes the copy engines (``DMA_AUTO_RUNS``), in order."""
    return _globbed(folder, DMA_AUTO_RUNS)


def e2e_phased_runs(folder: Path) -> list[Path]:
    """The data.csv of each run of the rule e2e_phased in a machine folder (``e2e/phased_<parallel>_<model>_run<n>/``:
    one model each, every schedule and its ``phased`` rows), in name order; the earlier script runs beside them
    (``_fixed_order``, ``_alternating``: the implementations' order before and after it alternated) are history."""
    return sorted(Path(folder).glob("e2e/phased_*_run[0-9]*/data.csv"))


def e2e_default_call_runs(folder: Path) -> list[Path]:
    """The data.csv of each repeated ``dmacoll e2e --schedules serial`` run of ``Communicator()``'s default call in a
    machine folder (``e2e/default_call_serial_<model>_<label>/``: one model each), in name order."""
    return sorted(Path(folder).glob("e2e/default_call_serial_*/data.csv"))


def e2e_claim_runs(folder: Path) -> list[str]:
    """The e2e runs a machine's claims rest on: its repeated runs of the current default call (``E2E_CLAIM_RUNS``),
    else the run its e2e page shows first (``e2e_runs``); paths as the folder was given."""
    return [str(p) for p in _globbed(folder, E2E_CLAIM_RUNS)] or e2e_runs(folder)[:1]


def vllm_claim_runs(folder: Path) -> list[str]:
    """The vLLM runs a machine's vLLM claims rest on (``VLLM_CLAIM_RUNS``); paths as the folder was given."""
    return [str(p) for p in _globbed(folder, VLLM_CLAIM_RUNS)]


def vllm_page_runs(folder: Path) -> list[str]:
    """The vLLM runs a machine's e2e page shows: its output checks, and its benchmarks of the default route where
    ``VLLM_CLAIM_RUNS`` names them (a run routing every call is a policy's, not the plugin's: its medians would mix
    into the default's), else every benchmark; paths as the folder was given."""
    claimed = set(vllm_claim_runs(folder))
    every = sorted(str(p) for p in Path(folder).glob("vllm/*/data.csv"))
    return [p for p in every if not claimed or p in claimed or not compares(Path(p), "plugin", ("dma", "vllm"))]


def runs(folder: Path) -> list[Path]:
    """Every committed run of a machine folder (its ``data.csv``), sorted."""
    return sorted(p for p in Path(folder).rglob("data.csv") if p.with_suffix(".json").is_file())


def _provenance(run: Path) -> dict:
    """A run's provenance sidecar, or {} where it is missing or unreadable."""
    try:
        return json.loads(run.with_suffix(".json").read_text()) or {}
    except (OSError, ValueError):
        return {}


def _hardware(run: Path) -> dict:
    return _provenance(run).get("hardware", {}) or {}


def gpu_runs(folder: Path) -> list[Path]:
    """The runs whose provenance names GPUs (a CPU machine's runs are not a GPU machine's results)."""
    return [r for r in runs(folder) if _hardware(r).get("gpus")]


def label(folder: Path) -> str:
    """``2x H200 (NVLink NV18)``: from the provenance of the folder's run that saw the most GPUs (a run may have
    used some of the machine's, ``CUDA_VISIBLE_DEVICES``)."""
    hw = max((_hardware(r) for r in gpu_runs(folder)), key=lambda h: len(h["gpus"]))
    gpus = hw["gpus"]
    model = next((m for m in GPU_MODELS if m in gpus[0]), gpus[0])
    link = re.search(r"\bNV(\d+)\b", hw.get("topology", "") or "")
    return f"{len(gpus)}x {model}" + (f" (NVLink NV{link.group(1)})" if link and len(gpus) > 1 else "")


def compares(run: Path, column: str = "impl", values: tuple[str, ...] = ("nccl", "dma")) -> bool:
    """Whether a committed run measured each of ``values`` in ``column`` (a page that compares them can render it;
    1x H100's e2e run measured NCCL alone, at world 1)."""
    import csv

    with Path(run).open() as f:
        seen = {row.get(column) for row in csv.DictReader(f)}
    return set(values) <= seen


def e2e_runs(folder: Path) -> list[str]:
    """The machine's end-to-end runs the report shows: per world (a run may use some of the machine's GPUs), the
    newest run (provenance ``created_utc``) comparing NCCL and dma that covers every model measured at that world,
    largest world first; paths as the folder was given. A later run of one model (an A/B of a fix) does not hide
    the others."""
    import csv

    by_world: dict[int, list[tuple[str, set, Path]]] = {}
    for run in sorted(Path(folder).glob("e2e/*/data.csv")):
        if not compares(run):
            continue
        with run.open() as f:
            rows = list(csv.DictReader(f))
        by_world.setdefault(int(rows[0]["world"]), []).append((str(_provenance(run).get("created_utc") or ""),
                                                         {r["model"] for r in rows}, run))
    chosen = []
    for world in sorted(by_world, reverse=True):
        every = set().union(*(models for _, models, _ in by_world[world]))
        complete = [r for r in by_world[world] if r[1] >= every] or by_world[world]
        chosen.append(str(max(complete, key=lambda r: r[0])[2]))
    return chosen


def is_sweep(run: Path) -> bool:
    with Path(run).open() as f:
        return SWEEP_COLUMNS <= set(f.readline().strip().split(","))


def operator_sweeps(folder: Path) -> list[str]:
    """The machine's operator sweeps (``operator/sweep_*``), else its other experiments' runs named ``sweep_*``
    in sweep format; paths as the folder was given."""
    folder = Path(folder)
    main = sorted(folder.glob("operator/sweep_*/data.csv"))
    other = sorted(p for p in folder.glob("*/sweep_*/data.csv") if p.parent.parent.name != "operator")
    return [str(p) for p in (main or other) if is_sweep(p)]


def discover(results: Path) -> dict[str, tuple[str, str]]:
    """name -> (folder, label) of every machine folder under ``results`` with a GPU run, sorted by name; folders
    as paths under ``results`` as it was given (``results/h200x2`` for ``results``)."""
    found = {}
    for folder in sorted(p for p in Path(results).iterdir() if p.is_dir() and p.name not in NOT_MACHINES):
        if gpu_runs(folder):
            found[folder.name] = (str(folder), label(folder))
    return found
