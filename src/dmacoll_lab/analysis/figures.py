"""Figures shared by the notebooks and the index page (matplotlib, imported when drawn)."""
from __future__ import annotations

import pandas as pd

from dmacoll.lab_api import human
from . import report

# the headline's lines: name -> how a sweep gives it (report.best of a baseline, or one of report.picks)
HEADLINE_LINES = (("NCCL", "nccl"), ("peer copy", "peer_copy"), ("dma default", "default"), ("dma tuned", "tuned"),
                  ("dma oracle", "oracle"))


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
        ax.legend(fontsize=8)
    fig.suptitle(f"time per call, {'graph-replayed' if mode == 'graph' else mode}, {label}; bands: p10-p90 of "
                 "the repeats")
    fig.tight_layout()
    return fig
