# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Operator level: copy-engine (dma) collectives vs NCCL
#
# Latency and bus bandwidth per message size, graph-replayed and eager, from the sweep CSVs given as parameters
# (`csvs`). dmacoll appears three times (`dmacoll_lab.analysis.report` defines them): `dma default` is what
# `Communicator()` does with no options on the copy engines (`path='dma'`, the papers' reproduction; the call with no
# options at all, SM kernels and NCCL included, is the last section's), `dma tuned` is `variant='auto'` with the options
# a caller may set without promises, `dma oracle` the best of every measured configuration at each size (its N and
# configuration are in the table). `peer_copy` is one raw copy-engine copy of what a rank sends one peer: at 2 ranks the
# whole collective's data, the NVLink floor.
# Measured on NVIDIA Hopper; the papers this reproduces (ConCCL, DMA-Latte) ran on AMD MI300X.

# %% tags=["parameters"]
csvs = ["results/h200x2/operator/sweep_all_gather/data.csv",
        "results/h200x2/operator/sweep_all_to_all/data.csv", "results/h200x2/operator/nccl_ce/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/operator"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dmacoll_lab.analysis import docs, figures, load, page, readings, report  # noqa: E402

page.setup()
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
default_runs = [c for c in csvs if "/sm_path/" in str(c)]  # runs of the current defaults, for the last section
csvs = [c for c in csvs if c not in default_runs]
df = load.read("operator", csvs)
prov = load.provenance(csvs[0])
print(f"{len(df)} points from {len(csvs)} files; git {prov['git_sha'][:10]}, torch {prov['software']['torch']}, "
      f"NCCL {prov['software']['nccl']}, GPUs {prov['hardware']['gpus']}")
print("failed points:", int((df['status'] != 'ok').sum()), " wrong outputs:",
      int(((df['status'] == 'ok') & ~df['ok']).sum()))
# saved as ratios.csv and ratios.md; an assignment, so the cell shows nothing
table = report.save_table(report.ratio_table(df, sizes=sorted(df["bytes_per_rank"].unique())), out, "ratios")

# %% [markdown]
# ## Headline: time per call, graph-replayed (eager where the sweeps captured no graphs: the host emulator)
#
# The index page shows this figure and table for each machine. Bands: the p10-p90 of the repeats; the table's
# brackets: the same spread as a ratio (the configuration's p10 over NCCL's p90 up to its p90 over NCCL's p10).
# *(derived)*: the sweep measured no call with no options at that point (no `dma_default` row), so the default
# shown is the configuration the shipped table picks, read from that same sweep's rows (an in-sample pick).

# %%
mode = figures.headline_mode(df)
page.figure(figures.headline(df, platform_label, mode), out, "headline")
headline = docs.headline_table(df, mode)
headline.to_csv(out / "headline.csv", index=False)
page.table(headline)
page.reading(readings.operator(table, mode))

# %% [markdown]
# ## Every baseline and configuration, graph-replayed and eager

# %%
# One line per baseline as measured, and three for dmacoll: its default (Communicator() on the copy engines), tuned
# (variant='auto' plus options that need no promise) and best-of-N oracle configurations (report.picks).
lines = []
for impl in ("nccl", "nccl_ce", "symm_mem_lc", "peer_copy"):
    b = report.best(df, impl).reset_index()
    if not b.empty:
        b["impl"] = impl
        lines.append(b)
for name, b in report.picks(df).items():
    if name in report.PICKS and not b.empty:
        lines.append(b.reset_index().assign(impl=f"dma {name}"))
curves = pd.concat(lines, ignore_index=True)
curves["MB per rank"] = curves["bytes_per_rank"] / (1 << 20)


def facet_plot(y: str, ylabel: str, name: str) -> None:
    g = sns.relplot(data=curves, x="MB per rank", y=y, hue="impl", col="op", row="mode", kind="line",
                    marker="o", height=3.2, aspect=1.4, facet_kws={"sharey": False})
    g.set(xscale="log", yscale="log")
    g.set_axis_labels("message size per rank (MB)", ylabel)
    page.grid(g)
    g.figure.suptitle(f"{ylabel}, {platform_label}", y=1.02)
    page.figure(g, out, name)


facet_plot("time_us", "time per call (us)", "latency")
page.reading(readings.operator(table, "eager"))
facet_plot("busbw_GBps", "bus bandwidth (GB/s)", "busbw")

# %% [markdown]
# ## dmacoll over NCCL at every size, graph-replayed
#
# Time over NCCL's (below 1: dmacoll faster), with the p10-p90 spread; N: how many measured configurations a
# pick was made from; the oracle's configuration and its cost beyond one raw peer copy.

# %%
targets = pd.DataFrame(report.targets(df))
(out / "targets.md").write_text(report.markdown(targets) + "\n" if not targets.empty else "no targets\n")
wide = docs.operator_columns(table)
page.table(wide[wide["mode"] == "graph"].drop(columns="mode"))

# %% [markdown]
# ## `Communicator()` with its current defaults: sm path, NCCL or copy engines by size
#
# The library's default call, not the papers' reproduction: runs of `dmacoll probe sm_path` of this machine
# (`machines.DEFAULT_CALL_RUNS`, given after the sweeps in `csvs`), each with NCCL in the same run. Time over NCCL's per op and size (below 1: faster),
# the median over the runs with bars from the lowest to the highest run; the marker says which path the default call
# took (`sm`: dmacoll's one-shot kernels, `nccl`: handed to NCCL where dmacoll's own paths lose, `dma`: the copy
# engines where they win).

# %%
from dmacoll_lab.analysis import tables  # noqa: E402

if default_runs:
    rows = load.read("probe", default_runs)
    page.figure(figures.default_call(rows, platform_label), out, "default_call")
    page.table(tables.default_call(rows, "graph"))
else:
    print("no runs of Communicator()'s current defaults on this machine (machines.DEFAULT_CALL_RUNS)")
