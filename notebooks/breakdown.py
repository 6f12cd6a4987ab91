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
# # Where the time of one copy-engine transfer goes
#
# Control (the host's `cuMemcpyAsync` call), schedule (call returned -> the engine starts the copy),
# copy (engine start -> end) and sync (copy end -> the receiving GPU's stream observes a flag written
# behind the copy), from CUPTI timestamps (`dmacoll breakdown`; method in `docs/design.md`). A negative
# schedule means the engine started before the call had returned: the phases then overlap, and the
# stacked bar draws schedule as zero. Medians of isolated transfers. Measured on NVIDIA Hopper; the
# paper's breakdown is for AMD MI300X SDMA engines.

# %% tags=["parameters"]
csvs = ["results/h200x2/breakdown/breakdown/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/breakdown"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dmacoll.analysis import load, report, tables  # noqa: E402

out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
df = load.read("breakdown", csvs[:1])
prov = load.provenance(csvs[0])
print(f"{len(df)} rows from {csvs[0]}; git {prov['git_sha'][:10]}, GPUs {prov['hardware']['gpus']}")
wide = tables.breakdown_wide(df)
wide.to_csv(out / "breakdown_wide.csv")
(out / "breakdown.md").write_text(report.markdown(wide.round(2).reset_index(names="size")) + "\n")
wide.round(2)

# %%
phases = ["control", "schedule", "copy", "sync"]
stack = wide[phases].clip(lower=0)
share = stack.div(stack.sum(axis=1), axis=0)
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
stack.plot(kind="bar", stacked=True, ax=axes[0], logy=True, rot=45)
axes[0].set_ylabel("time (us, log)")
axes[0].set_title("phases of one peer copy")
share.plot(kind="bar", stacked=True, ax=axes[1], rot=45, legend=False)
axes[1].set_ylabel("share of the end-to-end time")
axes[1].set_title("share per phase")
fig.suptitle(f"copy-engine transfer breakdown, {platform_label}")
report.save_figure(fig, out, "breakdown")
