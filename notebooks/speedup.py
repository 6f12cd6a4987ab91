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
# # DMA features: speedup of each one over the plain `pcpy` collective
#
# DMA-Latte's PERFORMANCE.md style: the baseline is the plain per-peer-queue collective (pcpy, push,
# out of place, stream-memop flags, no prerecording); each column switches one feature (`b2b_prerecord`: two) and
# reports baseline time / feature time (> 1: faster; a speedup over pcpy, unlike the other pages' time ratios);
# `best` is the fastest dma configuration of all. From the sweep CSVs given as `csvs`. Measured on NVIDIA Hopper;
# the paper ran on AMD MI300X.

# %% tags=["parameters"]
csvs = ["results/h200x2/operator/sweep_all_gather/data.csv",
        "results/h200x2/operator/sweep_all_to_all/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/speedup"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from dmacoll_lab.analysis import dmalatte_reference, load, page, readings, report  # noqa: E402

page.setup()
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
df = load.read("operator", csvs)
report.print_provenance(csvs)
table = report.speedup_table(df)
table.to_csv(out / "speedup.csv", index=False)
for (op, mode), part in table.groupby(["op", "mode"]):
    (out / f"speedup_{op}_{mode}.md").write_text(report.markdown(part.drop(columns=["op", "mode", "bytes_per_rank"]))
                                                 + "\n")

# %% [markdown]
# ## Beside the authors' published speedups
#
# The AMD-DMA-Latte authors' PERFORMANCE.md (8x MI300X, their SDMA collectives driven from the host; the file and
# commit are cited below) gives each variant's speedup over their plain `pcpy`; here are the same changes measured
# on this machine's copy engines, eager (host-submitted, as theirs are). Their `PL` (`PRELAUNCH=1`: commands
# created ahead, released by one trigger) is the prerecorded call here. Their `bcst` / `swap` commands have no CUDA
# counterpart. Different GPUs, interconnect and GPU count: the shapes compare, not the numbers.

# %%
theirs = dmalatte_reference.speedups()
print(f"the authors' figures: {dmalatte_reference.source()}")
comparison = dmalatte_reference.comparison(table, theirs)
comparison.to_csv(out / "dmalatte_comparison.csv", index=False)
ops = sorted(comparison["op"].unique())
fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(6.5 * max(len(ops), 1), 4.2), squeeze=False)
for ax, op in zip(axes[0], ops):
    c = comparison[comparison["op"] == op]
    for i, (their_col, our_col) in enumerate(dmalatte_reference.PAIRS.items()):
        colour = f"C{i}"
        ax.plot(c["bytes_per_rank"], c[f"{our_col} (here)"], marker="o", ms=3, color=colour,
                label=f"{our_col}, {platform_label}")
        ax.plot(c["bytes_per_rank"], c[f"{their_col} (MI300X)"], ls="--", color=colour,
                label=f"{their_col}, authors (8x MI300X)")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(xscale="log", title=f"{op}, speedup over pcpy (> 1 faster)", xlabel="message size per rank (bytes)",
           ylabel="pcpy time / variant time")
handles, labels = axes[0][0].get_legend_handles_labels()
fig.tight_layout()
fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8)  # below, off the data
page.figure(fig, out, "dmalatte_comparison")
page.reading(readings.dmalatte(comparison))
page.table(comparison.drop(columns="bytes_per_rank").round(2))

# %% [markdown]
# ## Every feature, per size

# %%
features = [c for c in table.columns if c in report.FEATURES or c == "best"]
for (op, mode), part in table.groupby(["op", "mode"]):
    heat = part.set_index("size")[features].T.dropna(how="all")  # graphs: nothing to prerecord
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(heat) + 1.2))
    sns.heatmap(heat, annot=True, fmt=".2f", center=1.0, cmap="RdBu", cbar=False, ax=ax, annot_kws={"size": 7})
    ax.set_title(f"{op}, {mode}: speedup over pcpy (> 1 faster), {platform_label}")
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("option (row: its speedup at each size)")
    page.figure(fig, out, f"speedup_{op}_{mode}")
    page.reading(readings.speedup(table, op, mode))
