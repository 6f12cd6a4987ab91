"""Figures shared by the notebooks and the index page (matplotlib, imported when drawn)."""
from __future__ import annotations

import pandas as pd

from dmacoll.lab_api import human
from . import report, tables

# the headline's lines: name -> how a sweep gives it (report.best of a baseline, or one of report.picks)
HEADLINE_LINES = (("NCCL", "nccl"), ("peer copy", "peer_copy"), ("dma default", "default"), ("dma tuned", "tuned"),
                  ("dma oracle", "oracle"))


def headline_mode(df: pd.DataFrame) -> str:
    """The mode a machine's headline shows: graph-replayed where its sweeps captured graphs, else eager (the host
    emulator's sweeps: CUDA graphs need a GPU)."""
    return "graph" if (df["mode"] == "graph").any() else "eager"


def headline_curves(df: pd.DataFrame, mode: str = "graph") -> pd.DataFrame:
    """Per line of the headline figure, op and size: the median time per call and the p10-p90 of its repeats."""
    picks = report.picks(df)
    parts = []
    for label, name in HEADLINE_LINES:
        rows = picks[name] if name in report.PICKS else report.best(df, name)
        rows = rows.reset_index()
        rows = rows[rows["mode"] == mode]
        if not rows.empty:
            parts.append(rows[["op", "bytes_per_rank", "time_us", "time_us_p10", "time_us_p90"]].assign(line=label))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["op", "bytes_per_rank", "time_us", "time_us_p10", "time_us_p90", "line"])


def headline(df: pd.DataFrame, label: str, mode: str = "graph"):
    """Time per call against size per op: NCCL, one peer copy and dmacoll's default, tuned and oracle, each with
    the p10-p90 band of its repeats."""
    import matplotlib.pyplot as plt

    curves = headline_curves(df, mode)
    ops = sorted(curves["op"].unique())
    fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(6 * max(len(ops), 1), 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for line in [name for name, _ in HEADLINE_LINES]:
            c = curves[(curves["op"] == op) & (curves["line"] == line)].sort_values("bytes_per_rank")
            if c.empty:
                continue
            drawn = ax.plot(c["bytes_per_rank"], c["time_us"], marker="o", ms=3, label=line,
                            ls="--" if line in ("NCCL", "peer copy") else "-")
            ax.fill_between(c["bytes_per_rank"], c["time_us_p10"], c["time_us_p90"], alpha=0.2,
                            color=drawn[0].get_color(), lw=0)
        ax.set(xscale="log", yscale="log", title=op, ylabel="time per call (us)", xlabel="bytes per rank")
        ticks = sorted(curves["bytes_per_rank"].unique())[::2]
        ax.set_xticks(ticks, [human(int(t)) for t in ticks], rotation=45)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    # one legend below the axes, off the data (inside an axis it covered points wherever the curves came close)
    found = {}  # label -> handle, each line once (an op may lack some lines)
    for ax in axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            found.setdefault(name, handle)
    fig.legend(list(found.values()), list(found), loc="lower center", ncol=max(len(found), 1), fontsize=8,
               bbox_to_anchor=(0.5, -0.06))
    fig.suptitle(f"time per call, {'graph-replayed' if mode == 'graph' else mode}, {label}; bands: p10-p90 of "
                 "the repeats")
    fig.tight_layout()
    return fig


def default_call_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """Per op, mode and size of runs of ``dmacoll probe sm_path`` (``machines.default_call_runs``): Communicator() / NCCL
    in each run (``tables.per_run_ratios``), then the median over the runs, its range, and the paths the default
    call took."""
    runs = tables.per_run_ratios(rows).dropna(subset=["ratio"])
    return (runs.groupby(["op", "mode", "bytes"])
            .agg(median=("ratio", "median"), low=("ratio", "min"), high=("ratio", "max"), runs=("ratio", "size"),
                 path=("path", lambda p: "/".join(sorted(set(p)))))
            .reset_index())


def default_call(rows: pd.DataFrame, label: str):
    """Communicator() / NCCL against size per op, graph-replayed and eager: the median over the runs, error bars from
    the lowest to the highest run, a marker per data path the default call took."""
    import matplotlib.pyplot as plt

    ratios = default_call_ratios(rows)
    ops = sorted(ratios["op"].unique())
    fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(4.6 * max(len(ops), 1), 4.2), squeeze=False,
                             sharey=True)
    markers = {"sm": "o", "nccl": "s", "dma": "^"}
    for ax, op in zip(axes[0], ops):
        for mode, style in (("graph", "-"), ("eager", ":")):
            c = ratios[(ratios["op"] == op) & (ratios["mode"] == mode)].sort_values("bytes")
            if c.empty:
                continue
            drawn = ax.errorbar(c["bytes"], c["median"], yerr=[c["median"] - c["low"], c["high"] - c["median"]],
                                ls=style, capsize=2, label=mode)
            for path, marker in markers.items():
                at = c[c["path"] == path]
                ax.plot(at["bytes"], at["median"], ls="", marker=marker, ms=5, color=drawn[0].get_color())
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", title=op, ylabel="Communicator() / NCCL (time per call)", xlabel="bytes per rank")
        ticks = sorted(ratios["bytes"].unique())[::2]
        ax.set_xticks(ticks, [human(int(t)) for t in ticks], rotation=45)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    handles = axes[0][0].get_legend_handles_labels()[0] + [
        plt.Line2D([], [], ls="", marker=m, color="grey", label=f"{p} path") for p, m in markers.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle(f"Communicator() over NCCL, {label}; median of the runs, bars: lowest to highest run")
    fig.tight_layout()
    return fig


def e2e_repeats(repeats: pd.DataFrame, label: str):
    """dma / NCCL of the serial schedule per batch (``tables.e2e_repeats``): a panel per metric (decode step, TTFT) and
    world, a line per model at the median over the runs, error bars from the lowest to the highest run."""
    import matplotlib.pyplot as plt

    panels = sorted({(m, w) for m, w in zip(repeats["metric"], repeats["world"])}, key=lambda k: (k[0] != "decode step",
                                                                                                  -k[1]))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.4 * max(len(panels), 1), 3.8), squeeze=False)
    for ax, (metric, world) in zip(axes[0], panels):
        for model, c in repeats[(repeats["metric"] == metric) & (repeats["world"] == world)].groupby("model"):
            ax.errorbar(c["batch"], c["median"], yerr=[c["median"] - c["low"], c["high"] - c["median"]], marker="o",
                        ms=4, capsize=2, label=model)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", title=f"{metric}, {world} GPUs", xlabel="batch size", ylabel="dmacoll / NCCL (time)")
        ax.set_xticks(sorted(repeats["batch"].unique()), [str(b) for b in sorted(repeats["batch"].unique())])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(len(labels), 1), fontsize=8, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(f"Communicator()'s default call in the serial schedule, {label}; median of the runs, bars: lowest to "
                 "highest run", fontsize=9)
    fig.tight_layout()
    return fig


def machines(ratios: dict[str, pd.DataFrame]):
    """The machines side by side (the report's front page): per op that two or more machines swept, graph-replayed,
    NCCL's time per call and the best copy-engine configuration's time over NCCL's, a line per machine.
    ``ratios``: machine label -> its operator page's ``ratios.csv`` (``report.ratio_table``)."""
    import matplotlib.pyplot as plt

    graph = {label: df[df["mode"] == "graph"] for label, df in ratios.items()}
    counts = pd.Series([op for df in graph.values() for op in df["op"].unique()]).value_counts()
    ops = sorted(counts[counts >= 2].index)
    fig, axes = plt.subplots(2, max(len(ops), 1), figsize=(5.2 * max(len(ops), 1), 7.4), squeeze=False)
    ticks = sorted({int(b) for df in graph.values() for b in df["bytes"]})[::3]
    for col, op in enumerate(ops):
        for label, df in graph.items():
            c = df[df["op"] == op].sort_values("bytes")
            if c.empty:
                continue
            axes[0][col].plot(c["bytes"], c["nccl_us"], marker="o", ms=3, label=label)
            axes[1][col].plot(c["bytes"], c["oracle_over_nccl"], marker="o", ms=3, label=label)
        axes[0][col].set(yscale="log", title=op, ylabel="NCCL time per call (us)")
        axes[1][col].axhline(1.0, color="grey", lw=0.8)
        axes[1][col].set(ylabel="best copy-engine configuration / NCCL")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log")
            ax.set_xticks(ticks, [human(t) for t in ticks], rotation=45)
            ax.minorticks_off()
            ax.set_xlabel("bytes per rank")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("the machines side by side, graph-replayed: NCCL, and the copy engines' best over NCCL")
    fig.tight_layout()
    return fig
