"""Tables from sweep CSVs: best dma over NCCL at chosen sizes, and the issue's targets.

Every number printed here is computed from the CSV it is given; the README's
results table is this output pasted between markers by ``dmacoll report readme``
(and a test checks that it still matches).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..sizes import human
from . import load as results

README_SIZES = (4 << 10, 1 << 20, 64 << 20, 256 << 20)
BEGIN, END = "<!-- operator-table:begin -->", "<!-- operator-table:end -->"


def load(paths: list[str]) -> pd.DataFrame:
    """Sweep CSVs as one table; ``source`` names the file (the run) each row came from."""
    return results.read("operator", paths)


def best(df: pd.DataFrame, impl: str) -> pd.DataFrame:
    """Fastest correct row of ``impl`` per (op, mode, size), with its configuration."""
    sub = df[(df["impl"] == impl) & df["ok"]]
    idx = sub.groupby(["op", "mode", "bytes_per_rank"])["time_us"].idxmin()
    out = sub.loc[idx, ["op", "mode", "bytes_per_rank", "time_us", "busbw_GBps", "variant", "direction", "place",
                        "signal", "prerecord", "submit", "handshake"]]
    return out.set_index(["op", "mode", "bytes_per_rank"])


def config_label(r) -> str:
    """variant/direction/place, plus the non-default signal, prerecord, submit and handshake choices."""
    extra = (f"/{r['signal']}-signal" if r["signal"] in ("copy", "kernel") else "") + (
        "/prerecorded" if r["prerecord"] else "") + ("/native" if r.get("submit", "python") == "native" else "") + (
        "/lean" if r.get("handshake", "full") == "lean" else "")
    return f"{r['variant']}/{r['direction']}/{r['place']}{extra}"


def ratio_table(df: pd.DataFrame, sizes=README_SIZES) -> pd.DataFrame:
    dma, nccl, ce, floor = best(df, "dma"), best(df, "nccl"), best(df, "nccl_ce"), best(df, "peer_copy")
    rows = []
    for (op, mode, size), r in dma.iterrows():
        if size not in sizes or (op, mode, size) not in nccl.index:
            continue
        n = nccl.loc[(op, mode, size), "time_us"]
        rows.append({"op": op, "mode": mode, "size": human(int(size)), "bytes": int(size),
                     "nccl_us": round(float(n), 1),
                     "nccl_ce_us": round(float(ce.loc[(op, mode, size), "time_us"]), 1)
                     if (op, mode, size) in ce.index else "failed/not run",
                     "dma_us": round(float(r["time_us"]), 1),
                     "dma_over_nccl": round(float(r["time_us"] / n), 2),
                     # the fixed cost of the protocol (flags, fork/join) beyond moving the bytes
                     "dma_minus_peer_copy_us": round(float(r["time_us"] - floor.loc[(op, mode, size), "time_us"]), 1)
                     if (op, mode, size) in floor.index else "",
                     "best_dma": config_label(r)})
    return pd.DataFrame(rows).sort_values(["op", "mode", "bytes"]).reset_index(drop=True)


# DMA-Latte's plain baseline, and each feature as one change to it (PERFORMANCE.md style)
BASELINE = {"variant": "pcpy", "direction": "push", "place": "out", "signal": "memop", "prerecord": False,
            "submit": "python", "handshake": "full"}
FEATURES = {"b2b": {"variant": "b2b"}, "multi": {"variant": "multi"}, "pull": {"direction": "pull"},
            "in_place": {"place": "in"}, "copy_signal": {"signal": "copy"}, "kernel_signal": {"signal": "kernel"},
            "prerecord": {"prerecord": True}, "native_submit": {"submit": "native"},
            "lean_handshake": {"handshake": "lean"}}


def matching(df: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The rows whose columns equal every value of ``config``."""
    for col, value in config.items():
        df = df[df[col] == value]
    return df


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (op, mode, size): time of the plain pcpy baseline over the time with one feature
    switched (> 1: the feature helps), and over the best dma configuration of all. Each ratio
    comes from one run (``source``): where several runs measured a cell, the largest run's
    (the full sweep) is kept; a smaller run fills in only the features it alone measured."""
    runs = sorted(df.groupby("source") if "source" in df else [("", df)], key=lambda sp: -len(sp[1]))
    tables = [_speedup_one_run(part) for _, part in runs]
    out = tables[0]
    for t in tables[1:]:
        out = out.combine_first(t)
    out = out.reset_index().sort_values(["op", "mode", "bytes_per_rank"])
    out.insert(2, "size", out["bytes_per_rank"].map(lambda b: human(int(b))))
    out = out.dropna(axis=1, how="all").round(2)
    return out[["op", "mode", "size", "bytes_per_rank", "pcpy_us", *[c for c in [*FEATURES, "best"] if c in out]]]


def _speedup_one_run(df: pd.DataFrame) -> pd.DataFrame:
    dma = df[(df["impl"] == "dma") & df["ok"]]

    def times(change: dict) -> pd.Series:
        return matching(dma, {**BASELINE, **change}).set_index(["op", "mode", "bytes_per_rank"])["time_us"]

    base = times({})
    out = pd.DataFrame({"pcpy_us": base})
    for name, change in FEATURES.items():
        out[name] = base / times(change)
    out["best"] = base / dma.groupby(["op", "mode", "bytes_per_rank"])["time_us"].min()
    return out


# issue 3's latency targets: the worst best-dma / NCCL ratio in each size band, per op and mode
BANDS = ((1 << 10, 64 << 10), (128 << 10, 1 << 20), (2 << 20, 16 << 20), (32 << 20, 256 << 20))


def band_targets(df: pd.DataFrame) -> list[dict]:
    dma, nccl = best(df, "dma"), best(df, "nccl")
    ratio = (dma["time_us"] / nccl["time_us"]).dropna()
    out = []
    for op in sorted(set(ratio.index.get_level_values("op"))):
        for mode, limit, bands in (("graph", 1.00, BANDS), ("eager", 0.50, ((1 << 10, 256 << 10),))):
            for lo, hi in bands:
                part = ratio[[k for k in ratio.index if k[0] == op and k[1] == mode and lo <= k[2] <= hi]]
                if part.empty:
                    continue
                v = float(part.max())
                out.append({"target": f"{op} {mode}: best dma <= {limit:.2f} x NCCL",
                            "size": f"{human(lo)} - {human(hi)}", "value": round(v, 3), "pass": bool(v <= limit)})
    return out


def targets(df: pd.DataFrame) -> list[dict]:
    """Issue 2's done-when checks on the all-gather, graph mode."""
    dma, nccl, floor = best(df, "dma"), best(df, "nccl"), best(df, "peer_copy")
    out = []
    for (op, mode, size), r in dma.iterrows():
        if op != "all_gather" or mode != "graph":
            continue
        if size >= 4 << 20 and (op, mode, size) in nccl.index:
            v = r["time_us"] / nccl.loc[(op, mode, size), "time_us"]
            out.append({"target": "dma <= 0.70 x NCCL", "size": human(int(size)), "value": round(float(v), 3),
                        "pass": bool(v <= 0.70)})
        if size >= 64 << 20 and (op, mode, size) in floor.index:
            v = r["time_us"] / floor.loc[(op, mode, size), "time_us"]
            out.append({"target": "dma <= 1.05 x one peer copy", "size": human(int(size)),
                        "value": round(float(v), 3), "pass": bool(v <= 1.05)})
    return out


def print_provenance(paths: list[str]) -> None:
    """A line per result file with a JSON sidecar: its git sha and GPUs (notebooks say what they render)."""
    for p in paths:
        if results.csv_path(p).with_suffix(".json").exists():
            prov = results.provenance(p)
            print(f"{p}: git {str(prov.get('git_sha'))[:10]}, GPUs {prov.get('hardware', {}).get('gpus')}")


def save_figure(fig, outdir: str | Path, name: str) -> None:
    """A notebook figure as PNG (for the HTML pages) and PDF (for papers), then shown in the notebook."""
    import matplotlib.pyplot as plt

    for ext in ("png", "pdf"):
        fig.savefig(Path(outdir) / f"{name}.{ext}", bbox_inches="tight")
    plt.show()


def markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def readme_block(paths: list[str]) -> str:
    df = load(paths)
    table = ratio_table(df).drop(columns=["bytes"])
    tg = pd.DataFrame(targets(df))
    bands = pd.DataFrame(band_targets(df))
    fails = int((df["status"] != "ok").sum())
    wrong = int(((df["status"] == "ok") & ~df["ok"]).sum())
    prov = results.provenance(paths[0])
    hw = prov.get("hardware", {})
    head = (f"Measured on {len(hw.get('gpus', []))}x {', '.join(sorted(set(hw.get('gpus', []))))} "
            f"(torch {prov['software']['torch']}, NCCL {prov['software'].get('nccl')}, git {prov['git_sha'][:10]}); "
            f"source: {', '.join(f'`{p}`' for p in paths)}. Time per call, slowest rank, median of repeats; "
            f"bytes per rank. {fails} points failed to run (see the CSV's error column), {wrong} gave wrong output.")
    parts = [BEGIN, head, "", markdown(table)]
    if not tg.empty:
        parts += ["", "Targets (all-gather, graph mode):", "", markdown(tg)]
    if not bands.empty:
        parts += ["", "Latency targets (worst ratio in each size band; eager counts prerecorded calls):", "",
                  markdown(bands)]
    parts.append(END)
    return "\n".join(parts)


def update_readme(readme: Path, block: str) -> bool:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    new = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    changed = new != text
    readme.write_text(new)
    return changed
