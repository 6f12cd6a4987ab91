"""`vllm bench latency` / `vllm bench throughput` JSON -> one tidy CSV (a row per metric) with provenance.

Each JSON comes with a ``<name>.meta.json`` beside it (written by the workflow before the run: bench kind, model,
TP / EP, plugin on or off, batch, lengths, vLLM version), because vLLM's JSON does not say how it was run.

    python -m dmacoll.e2e.vllm_results meta --out X.meta.json bench=latency model=... plugin=dma tp=2 ...
    python -m dmacoll.e2e.vllm_results csv --out vllm.csv A.json B.json ...

Fields read (the rest is ignored): latency: ``avg_latency`` (s), ``percentiles`` {"10": s, ...};
throughput: ``elapsed_time`` (s), ``num_requests``, ``total_num_tokens``, ``requests_per_second``,
``tokens_per_second`` (prompt + output tokens).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

META_KEYS = ["bench", "model", "tp", "ep", "plugin", "batch", "input_len", "output_len", "num_prompts",
             "vllm_version"]
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


def load(paths: Sequence[str]) -> list[dict]:
    rows = []
    for p in paths:
        path = Path(p)
        meta_path = path.with_suffix(".meta.json")
        if not meta_path.exists():
            raise FileNotFoundError(f"{meta_path} is missing: it says how {path} was run (see this module)")
        rows += rows_for(json.loads(path.read_text()), json.loads(meta_path.read_text()), str(path))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmacoll.e2e.vllm_results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta", help="write the settings of one vLLM run (key=value ...)")
    m.add_argument("--out", required=True)
    m.add_argument("pairs", nargs="+", metavar="key=value")
    c = sub.add_parser("csv", help="convert vLLM result JSONs (each with its .meta.json) to a tidy CSV")
    c.add_argument("--out", required=True)
    c.add_argument("jsons", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "meta":
        bad = [x for x in a.pairs if "=" not in x]
        if bad:
            print(f"not key=value: {bad}", file=sys.stderr)
            return 2
        meta = {k: _value(v) for k, v in (x.split("=", 1) for x in a.pairs)}
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(meta, indent=1) + "\n")
        return 0
    from ..bench import provenance

    rows = load(a.jsons)
    provenance.write_table(Path(a.out), rows, VLLM_COLUMNS, {"inputs": list(a.jsons)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
