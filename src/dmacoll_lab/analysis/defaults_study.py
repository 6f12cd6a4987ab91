"""What `Communicator()` gives against the oracle and NCCL, from the 2x H100 defaults study (results/h100x2/defaults;
its runs came from the reference-run script removed after 4071565): the generated block ``defaults_study`` of that
folder's README (``docs.BLOCKS``; `dmacoll report docs` rewrites it).

The folder holds sweep_all_gather/, sweep_all_to_all/ (dma_default beside every dma configuration, NCCL, one peer
copy, one run per op) and default_<source>/ (dma_default and NCCL only, one run per source).

The oracle at a size and mode: the fastest correct dma row that 'auto' may choose there (out of place, the full
handshake, memop waits; prerecorded and native only eager) of the same run; 'oracle lean' the same with the lean
handshake (a caller promise 'auto' does not make). Ratios are of medians of the same run: side by side.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

SMALL_MAX = 1 << 20
OPS = ("all_gather", "all_to_all")


def load(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    return df[(df["status"] == "ok") & df["correct"].astype(bool)]


def fastest(df: pd.DataFrame) -> pd.Series:
    return df.groupby(["mode", "bytes_per_rank"])["time_us"].min()


def oracle(df: pd.DataFrame, handshake: str) -> pd.Series:
    dma = df[(df["impl"] == "dma") & (df["place"] == "out") & (df["handshake"] == handshake)
             & (df["wait"] == "memop")]
    graph_ok = (dma["mode"] == "eager") | (~dma["prerecord"].astype(bool) & (dma["submit"] == "python"))
    return fastest(dma[graph_ok])


CHOICE = ["variant", "direction", "signal", "wait", "prerecord", "submit"]


def pick_rows(df: pd.DataFrame) -> pd.Series:
    """Per (mode, size), the time of the dma row (same sweep) that ran the configuration the default chose."""
    default = df[df["impl"] == "dma_default"]
    dma = df[(df["impl"] == "dma") & (df["place"] == "out") & (df["handshake"] == "full")]
    merged = default[["mode", "bytes_per_rank", *CHOICE]].merge(dma[["mode", "bytes_per_rank", *CHOICE, "time_us"]],
                                                                on=["mode", "bytes_per_rank", *CHOICE])
    return merged.groupby(["mode", "bytes_per_rank"])["time_us"].min()


def size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def band(ratios: pd.Series) -> str:
    return f"{statistics.median(ratios):.2f} / {max(ratios):.2f}" if len(ratios) else "-"


def ratios(a: pd.Series, b: pd.Series, mode: str, sizes) -> pd.Series:
    """a / b at each of ``sizes`` that both measured in ``mode``."""
    return pd.Series([a[mode, n] / b[mode, n] for n in sizes if (mode, n) in a.index and (mode, n) in b.index])


def op_section(df: pd.DataFrame, op: str) -> list[str]:
    impl = {name: fastest(df[df["impl"] == name]) for name in ("nccl", "dma_default", "peer_copy")}
    best, pick = oracle(df, "full"), pick_rows(df)
    lines = [f"### {op}", "",
             "Median / max over sizes. *pick / oracle*: the dma row of the configuration the default chose over the "
             "oracle (what the choice costs); *default / pick*: the default's own row over that dma row (one "
             "configuration measured twice: the noise).", "",
             "| mode | sizes | default / oracle | pick / oracle | default / pick | default / NCCL |",
             "|---|---|---|---|---|---|"]
    for mode in ("graph", "eager"):
        for label, keep in (("1 KB - 512 KB", lambda n: n < SMALL_MAX), (">= 1 MB", lambda n: n >= SMALL_MAX)):
            sizes = [n for (m, n) in impl["dma_default"].index if m == mode and keep(n)]
            ratio = lambda a, b: ratios(a, b, mode, sizes)  # noqa: E731
            default = impl["dma_default"]
            lines.append(f"| {mode} | {label} | {band(ratio(default, best))} | {band(ratio(pick, best))} "
                         f"| {band(ratio(default, pick))} | {band(ratio(default, impl['nccl']))} |")
    lean = oracle(df, "lean")
    lines += ["", f"Small messages, graph-replayed (us per call; {op}):", "",
              "| size | NCCL | one peer copy | default | oracle (full) | oracle (lean) | default / NCCL |",
              "|---|---|---|---|---|---|---|"]
    for n in sorted(n for (m, n) in impl["dma_default"].index if m == "graph" and n <= SMALL_MAX):
        d, c = impl["dma_default"]["graph", n], impl["nccl"]["graph", n]
        lines.append(f"| {size(n)} | {c:.1f} | {impl['peer_copy']['graph', n]:.1f} | {d:.1f} | "
                     f"{best['graph', n]:.1f} | {lean.get(('graph', n), float('nan')):.1f} | {d / c:.2f} |")
    return lines + [""]


def sources_section(run: Path, oracles: dict) -> list[str]:
    lines = ["### The default under each source of its choices", "",
             "dma_default over NCCL of the same run, and over the oracle of the op's sweep (another run: noisier), "
             "median / max over sizes:", "",
             "| source | op | mode | default / NCCL | default / oracle |", "|---|---|---|---|---|"]
    for folder in sorted(run.glob("default_*")):
        df = load(folder / "data.csv")
        for op in OPS:
            part = df[df["op"] == op]
            d, c = fastest(part[part["impl"] == "dma_default"]), fastest(part[part["impl"] == "nccl"])
            for mode in ("graph", "eager"):
                sizes = [n for (m, n) in d.index if m == mode]
                lines.append(f"| {folder.name[len('default_'):]} | {op} | {mode} | {band(ratios(d, c, mode, sizes))} | "
                             f"{band(ratios(d, oracles[op], mode, sizes))} |")
    return lines + [""]


def summary(run: Path) -> str:
    """The study's tables in markdown."""
    lines, oracles = [], {}
    for op in OPS:
        df = load(run / f"sweep_{op}" / "data.csv")
        oracles[op] = oracle(df, "full")
        lines += op_section(df, op)
    lines += sources_section(run, oracles)
    return "\n".join(lines)

