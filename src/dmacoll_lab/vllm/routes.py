"""The vLLM plugin's routing table (``dmacoll/integrations/vllm_routes.json``) from committed operator sweeps.

    dmacoll vllm routes           # rewrite it from results/<machine>/operator/ of every reference machine
    dmacoll vllm routes --check   # exit 1 if it differs from what the committed sweeps give

Per machine and (op, mode, size): the time of ``Communicator()``'s defaults (``report.picks``' *default*: what
the plugin runs) and NCCL's (vLLM's ``all_gather`` / ``reduce_scatter`` call PyNccl). The decision rule lives in
``integrations/vllm_routes.py``; this module only gathers the numbers.
"""
from __future__ import annotations

import json
from pathlib import Path

from dmacoll.lab_api import vllm_routes
from ..analysis import load as results
from ..analysis import report

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "src/dmacoll/integrations" / vllm_routes.TABLE_FILE
MACHINES = ("h200x2", "h200x4")  # the reference result sets with operator sweeps
MARGIN = 0.10  # dmacoll must be this much faster at both ends of a size class (staging, run-to-run spread)
NEVER = {"all_reduce": "vLLM's all-reduce is custom all-reduce, symmetric memory or PyNccl by size (its log line "
                       "'Using [...] all-reduce backends' names them); no committed measurement compares dmacoll "
                       "with those"}
# the other dmacoll ops that serve vLLM's calls (vllm_routes.SERVED), and what stands for vLLM's own path in the
# sweeps: vLLM's all_gather / reduce_scatter call PyNccl
BASELINE = {op: "nccl" for op in vllm_routes.SERVED if op not in NEVER}


def sweeps(machine: str, root: Path = ROOT) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "results" / machine / "operator").glob("sweep_*/data.csv"))


def machine_table(machine: str, root: Path = ROOT) -> dict:
    csvs = sweeps(machine, root)
    if not csvs:
        raise FileNotFoundError(f"no operator sweeps under results/{machine}/operator/")
    df = report.load([str(root / c) for c in csvs])
    default = report.picks(df)["default"]
    prov = results.provenance(root / csvs[0])
    entries = []
    for op, base in BASELINE.items():
        theirs = report.best(df, base)
        for key in sorted(k for k in default.index if k[0] == op and k in theirs.index):
            mine = default.loc[key]
            entries.append({"op": op, "mode": key[1], "bytes_per_rank": int(key[2]),
                            "dmacoll_us": round(float(mine["time_us"]), 2), "dmacoll_config": report.config_label(mine),
                            "vllm_path": base, "vllm_us": round(float(theirs.loc[key, "time_us"]), 2)})
    gpus = prov.get("hardware", {}).get("gpus", [])
    return {"machine": machine, "world": int(df["world"].iloc[0]), "gpu": gpus[0] if gpus else "", "source": csvs,
            "source_git_sha": prov.get("git_sha"), "entries": entries}


def derive(machines=MACHINES, root: Path = ROOT) -> dict:
    tables = [machine_table(m, root) for m in machines]
    measured = {e["op"] for t in tables for e in t["entries"]}
    deferred = dict(NEVER)
    deferred.update({op: f"no committed sweep of {op} (measure: dmacoll sweep --ops {op}; then dmacoll vllm "
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
