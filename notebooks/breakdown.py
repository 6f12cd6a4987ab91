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
# schedule means the engine started before the call had returned: control and schedule then overlap, so the
# figures stack their sum, issue (the call's start to the engine's start), which cannot be negative. Medians of
# isolated transfers. Measured on NVIDIA Hopper; the paper's breakdown (shown beside ours, from the authors'
# PERFORMANCE.md) is for AMD MI300X SDMA engines.

# %% tags=["parameters"]
csvs = ["results/h200x2/breakdown/breakdown/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/breakdown"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dmacoll_lab.analysis import dmalatte_reference, load, page, readings, report, tables  # noqa: E402
from dmacoll.lab_api import human  # noqa: E402

page.setup()
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
df = load.read("breakdown", csvs[:1])
prov = load.provenance(csvs[0])
print(f"{len(df)} rows from {csvs[0]}; git {prov['git_sha'][:10]}, GPUs {prov['hardware']['gpus']}")
wide = tables.breakdown_wide(df)
wide.to_csv(out / "breakdown_wide.csv")
report.write_markdown(out / "breakdown.md", wide.round(2).reset_index(names="size"))
stack = tables.breakdown_stack(wide)
theirs = dmalatte_reference.phases()

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
stack[["issue", "copy", "sync"]].plot(kind="bar", stacked=True, ax=axes[0], logy=True, rot=45)
axes[0].set_ylabel("time (us, log)")
axes[0].set_xlabel("bytes per copy")
axes[0].set_ylim(bottom=1)
axes[0].set_title("phases of one peer copy (issue = control + schedule)")
share = stack[["issue", "copy", "sync"]].div(stack[["issue", "copy", "sync"]].sum(axis=1), axis=0)
share.plot(kind="bar", stacked=True, ax=axes[1], rot=45, legend=False)
mine = {label: i for i, label in enumerate(wide.index)}  # bar positions by size label (tables.breakdown_wide)
points = [(mine[human(int(b))], v) for b, v in zip(theirs["bytes"], theirs["non-copy total"])
          if human(int(b)) in mine]
if points:
    axes[1].plot([p[0] for p in points], [p[1] for p in points], "kD--", label="non-copy share, authors' MI300X")
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
axes[1].set_ylabel("share of the end-to-end time")
axes[1].set_xlabel("bytes per copy")
axes[1].set_title("share per phase (bars: here; line: the authors' non-copy share)")
fig.suptitle(f"copy-engine transfer breakdown, {platform_label}")
page.figure(fig, out, "breakdown")
page.reading(readings.breakdown(wide, stack, theirs))
page.table(wide.round(2).reset_index(names="size"))
