"""`vllm bench latency` / `vllm bench throughput` JSON -> one tidy CSV (a row per metric) with provenance.

Each JSON comes with a ``<name>.meta.json`` beside it (written by ``dmacoll vllm bench`` after the run: bench kind,
model, TP / EP, plugin on or off, batch, lengths, vLLM version, GPU, vLLM's all-reduce backends per group, what the
plugin routed), because vLLM's JSON does not say how it was run.

    dmacoll vllm results meta --out X.meta.json bench=latency model=... plugin=dma tp=2 ...
    dmacoll vllm results csv --out vllm.csv A.json B.json ...
    dmacoll vllm results tests --out data.csv junit.xml        # pytest's JUnit XML as a table (device runs)

Fields read (the rest is ignored): latency: ``avg_latency`` (s), ``percentiles`` {"10": s, ...};
throughput: ``elapsed_time`` (s), ``num_requests``, ``total_num_tokens``, ``requests_per_second``,
``tokens_per_second`` (prompt + output tokens).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

META_KEYS = ["bench", "model", "spec", "layers", "tp", "ep", "plugin", "batch", "input_len", "output_len",
             "num_prompts", "max_model_len", "vllm_version", "gpu", "allreduce_backends", "plugin_registered",
             "dmacoll_routed"]
VLLM_COLUMNS = META_KEYS + ["metric", "value", "unit", "source"]


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def rows_for(data: dict, meta: dict, source: str = "") -> list[dict]:
    """Tidy rows of one vLLM result: one per metric, the run's settings repeated on each."""
    head = {k: meta.get(k, "") for k in META_KEYS}
    head["source"] = source
    out: list[tuple[str, float, str]] = []
    if meta.get("bench") == "latency":
        out.append(("latency_avg", float(data["avg_latency"]) * 1e3, "ms"))  # ms: the CSV keeps 4 decimals
        for q, v in sorted(data.get("percentiles", {}).items(), key=lambda kv: float(kv[0])):
            out.append((f"latency_p{q}", float(v) * 1e3, "ms"))
        if meta.get("output_len"):  # the whole request over its output tokens: decode-dominated per token time
            out.append(("latency_per_output_token", float(data["avg_latency"]) / int(meta["output_len"]) * 1e3,
                        "ms"))
    elif meta.get("bench") == "throughput":
        elapsed = float(data["elapsed_time"])
        out += [("elapsed", elapsed, "s"), ("requests_per_s", float(data["requests_per_second"]), "1/s"),
                ("tokens_per_s", float(data["tokens_per_second"]), "tok/s")]
        prompts = int(data.get("num_requests", meta.get("num_prompts") or 0))
        if prompts and meta.get("output_len"):
            out.append(("output_tokens_per_s", prompts * int(meta["output_len"]) / elapsed, "tok/s"))
    else:
        raise ValueError(f"{source or 'meta'}: bench must be 'latency' or 'throughput', got {meta.get('bench')!r}")
    return [{**head, "metric": m, "value": v, "unit": u} for m, v, u in out]


SIDECARS = (".meta.json", ".info.json")  # written beside each run's JSON (runs.py): not results themselves


def load(paths: Sequence[str]) -> list[dict]:
    """The rows of vLLM's result JSONs (a glob of a raw folder may name the sidecars too: they are skipped)."""
    rows = []
    for p in paths:
        path = Path(p)
        if path.name.endswith(SIDECARS):
            continue
        meta_path = path.with_suffix(".meta.json")
        if not meta_path.exists():
            raise FileNotFoundError(f"{meta_path} is missing: it says how {path} was run (see this module)")
        rows += rows_for(json.loads(path.read_text()), json.loads(meta_path.read_text()), str(path))
    return rows


def write_meta(out: str, pairs: dict[str, str]) -> None:
    """The settings of one vLLM run (values read as numbers and booleans where they are)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({k: _value(v) for k, v in pairs.items()}, indent=1) + "\n")


def write_csv(out: str, jsons: Sequence[str]) -> None:
    from ..bench import provenance

    provenance.write_table(Path(out), load(jsons), VLLM_COLUMNS, {"inputs": list(jsons)})


TEST_COLUMNS = ["test", "outcome", "seconds", "message"]


def junit_rows(xml_path: str) -> list[dict]:
    """pytest's JUnit XML as rows: test, outcome (passed / failed / error / skipped), seconds, message."""
    import xml.etree.ElementTree as ET

    rows = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (el.get("message") or "")[:300]
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                     "seconds": float(case.get("time") or 0), "message": message})
    return rows


def write_tests(out: str, xml_path: str) -> list[dict]:
    from ..bench import provenance

    rows = junit_rows(xml_path)
    provenance.write_table(Path(out), rows, TEST_COLUMNS, {"junit": xml_path})
    return rows
