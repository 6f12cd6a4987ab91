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
# out of place, stream-memop flags, no prerecording); each column switches one feature and reports
# baseline time / feature time (> 1: faster); `best` is the fastest dma configuration of all. From the
# sweep CSVs given as `csvs`. Measured on NVIDIA Hopper; the paper ran on AMD MI300X.

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

from dmacoll.analysis import load, report  # noqa: E402

out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
df = load.read("operator", csvs)
table = report.speedup_table(df)
table.to_csv(out / "speedup.csv", index=False)
for (op, mode), part in table.groupby(["op", "mode"]):
    (out / f"speedup_{op}_{mode}.md").write_text(report.markdown(part.drop(columns=["op", "mode", "bytes_per_rank"]))
                                                 + "\n")

# %%
features = [c for c in table.columns if c in report.FEATURES or c == "best"]
for (op, mode), part in table.groupby(["op", "mode"]):
    heat = part.set_index("size")[features].T.dropna(how="all")  # graphs: nothing to prerecord
    fig, ax = plt.subplots(figsize=(12, 3.2))
    sns.heatmap(heat, annot=True, fmt=".2f", center=1.0, cmap="RdBu", cbar=False, ax=ax)
    ax.set_title(f"{op}, {mode}: speedup over pcpy (> 1 faster), {platform_label}")
    ax.set_xlabel("message size per rank")
    report.save_figure(fig, out, f"speedup_{op}_{mode}")
