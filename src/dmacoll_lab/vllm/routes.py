"""The vLLM plugin's routing table (``dmacoll/integrations/vllm_routes.json``) from committed measurements.

    dmacoll vllm routes           # rewrite it from the committed runs of Communicator()'s current defaults
    dmacoll vllm routes --check   # exit 1 if it differs from what those runs give

Per machine and (op, mode, size): the time of ``Communicator()``'s defaults (what the plugin runs: the ``default``
rows of ``dmacoll probe sm_path``, which took the sm, nccl or copy-engine path by size) and NCCL's in the same runs
(vLLM's ``all_gather`` / ``reduce_scatter`` call PyNccl), each the median over the runs (``machines.DEFAULT_CALL_RUNS``).
Sizes are the vLLM call's input bytes per rank (``sm_path.shapes``: the probe counts reduce_scatter by its chunk).
The decision rule lives in ``integrations/vllm_routes.py``; this module only gathers the numbers.
"""
from __future__ import annotations

import json
from pathlib import Path

from dmacoll.lab_api import vllm_routes
from ..analysis import load as results
from ..analysis import machines
from ..bench.probes import sm_path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "src/dmacoll/integrations" / vllm_routes.TABLE_FILE
MACHINES = ("h200x2", "h200x4")  # the reference result sets with runs of the current defaults
MARGIN = 0.10  # dmacoll must be this much faster at both ends of a size class (staging, run-to-run spread)
NEVER = {"all_reduce": "vLLM's all-reduce is custom all-reduce, symmetric memory or PyNccl by size (its log line "
                       "'Using [...] all-reduce backends' names them); no committed measurement compares dmacoll "
                       "with those"}
# the other dmacoll ops that serve vLLM's calls (vllm_routes.SERVED), and what stands for vLLM's own path in the
# runs: vLLM's all_gather / reduce_scatter call PyNccl
BASELINE = {op: "nccl" for op in vllm_routes.SERVED if op not in NEVER}


def sources(machine: str, root: Path = ROOT) -> list[str]:
    return [str(p.relative_to(root)) for p in machines.default_call_runs(root / "results" / machine)]


def machine_table(machine: str, root: Path = ROOT) -> dict:
    csvs = sources(machine, root)
    if not csvs:
        raise FileNotFoundError(f"no runs of the current defaults under results/{machine}/ "
                                f"({', '.join(machines.DEFAULT_CALL_RUNS.get(machine, ()))})")
    rows = results.read("probe", [root / c for c in csvs])
    rows = rows[rows["op"].isin(list(BASELINE)) & (rows["correct"].astype(str) == "True")]
    world = int(rows["world"].iloc[0])
    medians = rows.groupby(["op", "mode", "bytes", "impl"])["per_call_us"].median()
    entries = []
    for (op, mode, nbytes), point in medians.groupby(level=[0, 1, 2], sort=True):
        times = point.droplevel([0, 1, 2])
        if "default" not in times or BASELINE[op] not in times:
            continue
        entries.append({"op": op, "mode": mode, "bytes_per_rank": sm_path.shapes(op, world, int(nbytes))[0],
                        "dmacoll_us": round(float(times["default"]), 2), "dmacoll_config": "Communicator()",
                        "vllm_path": BASELINE[op], "vllm_us": round(float(times[BASELINE[op]]), 2)})
    entries.sort(key=lambda e: (e["op"], e["mode"], e["bytes_per_rank"]))
    prov = results.provenance(root / csvs[0])
    gpus = prov.get("hardware", {}).get("gpus", [])
    return {"machine": machine, "world": world, "gpu": gpus[0] if gpus else "", "source": csvs,
            "source_git_sha": prov.get("git_sha"), "entries": entries}


def derive(machines=MACHINES, root: Path = ROOT) -> dict:
    tables = [machine_table(m, root) for m in machines]
    measured = {e["op"] for t in tables for e in t["entries"]}
    deferred = dict(NEVER)
    deferred.update({op: f"no committed run of {op} (measure: dmacoll probe sm_path --ops {op}; then dmacoll vllm "
                         "routes)" for op in BASELINE if op not in measured})
    return {"generated_by": "dmacoll vllm routes", "margin": MARGIN,
            "rule": "route a call when dmacoll_us <= (1 - margin) x vllm_us at every measured size around it "
                    "(same machine, world, op, mode); else vLLM's path",
            "deferred": deferred, "tables": tables}


def text(data: dict) -> str:
    """JSON with one line per entry (reviewable diffs)."""
    rows = {id(e): json.dumps(e) for t in data["tables"] for e in t["entries"]}
    out = json.dumps(data, indent=1)
    for t in data["tables"]:  # json.dumps cannot format parts differently: put the one-line entries in after
        body = json.dumps(t["entries"], indent=1).replace("\n", "\n   ")
        out = out.replace(body, "[\n    " + ",\n    ".join(rows[id(e)] for e in t["entries"]) + "\n   ]", 1)
    return out + "\n"


def write(out: Path = OUT) -> bool:
    """Rewrite the shipped table; True if it changed."""
    new = text(derive())
    old = out.read_text() if out.exists() else ""
    if new != old:
        out.write_text(new)
    return new != old


def stale(out: Path = OUT) -> bool:
    return not out.exists() or out.read_text() != text(derive())
