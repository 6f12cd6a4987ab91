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
# # Resource footprint: power, energy, SM use and interference
#
# * Power and energy per collective (`dmacoll power`): NVML's total-energy counter around sustained
#   graph-replayed calls on every GPU, the idle power measured in the same run and subtracted
#   ("dynamic" energy); medians over every GPU and repeat.
# * SM use (`dmacoll sm-usage`): GPU kernels versus copies per call, from the PyTorch profiler.
# * Interference (`dmacoll interference`): slowdown of a bf16 GEMM / memory-bound kernel and of the
#   all-gather when they run together on separate streams; fraction of ideal overlap
#   = (serial - together) / (serial - max(alone)).
#
# `dma pcpy` is the plain collective, `dma default` what `Communicator()` picks with no options on the copy engines
# (`path='dma'`: every other option 'auto'; the name the operator page and the claims give it; the CSVs keep the variant
# `auto`). Measured on NVIDIA Hopper; the papers measured AMD MI300X.

# %% tags=["parameters"]
csvs = ["results/h200x2/power/power/data.csv", "results/h200x2/power/sm_usage/data.csv",
        "results/h200x2/power/interference/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/resources"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dmacoll_lab.analysis import load, page, readings, report, tables  # noqa: E402
from dmacoll.lab_api import human  # noqa: E402

page.setup()
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
power, sm, inter = (load.read(kind, [p]) for kind, p in zip(("power", "sm_usage", "interference"), csvs))
report.print_provenance(csvs)

# %% [markdown]
# ## Power and energy per call

# %%
summary = tables.power_summary(power)
summary.to_csv(out / "power.csv", index=False)
report.write_markdown(out / "power.md", summary.drop(columns=["bytes_per_rank"]))
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
sns.barplot(data=summary, x="size", y="avg_power_w", hue="impl", ax=axes[0], errorbar=None)
axes[0].axhline(summary["idle_power_w"].median(), color="grey", ls="--", label="idle")
axes[0].set_ylabel("average GPU power (W)")
axes[0].set_xlabel("message size per rank")
sns.barplot(data=summary, x="size", y="dynamic_energy_per_call_uj", hue="impl", ax=axes[1], errorbar=None)
axes[1].set_yscale("log")
axes[1].set_ylabel("energy per call above idle (uJ, log)")
axes[1].set_xlabel("message size per rank")
fig.suptitle(f"power and energy per collective (both ops), {platform_label}")
page.figure(fig, out, "power")
page.reading(readings.power(summary))
page.table(summary.drop(columns=["bytes_per_rank"]))

# %% [markdown]
# ## What runs on the SMs

# %%
sm["impl"] = tables.config_names(sm)
sm_table = sm[["op", "impl", "bytes_per_rank", "mode", "kernels_per_call", "kernel_us_per_call", "copies_per_call",
               "memsets_per_call", "kernel_names"]]
report.write_markdown(out / "sm_usage.md", sm_table)
counts = sm.melt(id_vars=["op", "impl", "mode"], value_vars=["kernels_per_call", "copies_per_call"], var_name="what",
                 value_name="per call")
g = sns.catplot(data=counts, x="impl", y="per call", hue="what", col="op", row="mode", kind="bar", height=2.8,
                aspect=1.6, errorbar=None)
g.set_axis_labels("implementation", "launches per call")
page.grid(g)
g.figure.suptitle(f"kernels and copy-engine copies per call, {platform_label}", y=1.02)
page.figure(g, out, "sm_usage")
page.reading(readings.sm_usage(sm))
shown = sm_table.assign(bytes_per_rank=sm_table["bytes_per_rank"].map(lambda b: human(int(b))))
page.table(shown.round(2).rename(columns={
    "impl": "implementation", "bytes_per_rank": "size per rank", "kernels_per_call": "kernels per call",
    "kernel_us_per_call": "kernel time per call (us)", "copies_per_call": "copy-engine copies per call",
    "memsets_per_call": "memsets per call", "kernel_names": "kernels (names)"}))

# %% [markdown]
# ## Interference with a GEMM or a memory-bound kernel

# %%
# `dmacoll interference` is C3 at fixed collective sizes: its rows are C3's (older tables are read in that
# schema), and `option` names the strategy: baseline (NCCL), dma (the tuned choice), dma pcpy (the plain one)
inter["size"] = inter["bytes_per_rank"].map(lambda b: human(int(b)))
cols = ["compute", "option", "size", "rank", "comp_slowdown", "comm_slowdown", "fraction_of_ideal"]
report.write_markdown(out / "interference.md", inter[cols].round(3))
long = inter[inter["rank"] == 0].melt(id_vars=["compute", "option", "size"],
                                      value_vars=["comp_slowdown", "comm_slowdown"], var_name="who",
                                      value_name="slowdown")
long["who"] = long["who"].map({"comp_slowdown": "compute slowed", "comm_slowdown": "communication slowed"})
g = sns.catplot(data=long, x="size", y="slowdown", hue="option", col="compute", row="who", kind="bar", height=3,
                aspect=1.5, errorbar=None)
g.set_axis_labels("message size per rank", "time together over alone")
page.grid(g)
g.figure.suptitle(f"slowdown when running together (1 = none), rank 0, {platform_label}", y=1.02)
page.figure(g, out, "interference")
inter_summary = tables.interference_summary(inter)
page.reading(readings.interference(inter_summary))
page.table(inter_summary)
