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
# # C3: computation next to communication, per strategy
#
# A bf16 GEMM (or a memory-bound add) and a collective launched together on separate streams
# (`dmacoll c3`, method in `src/dmacoll_lab/bench/c3.py`). The collective's size and call count are chosen per
# shape so that T_comm / T_comp is near 0.25, 1 or 4; every strategy moves the same bytes.
#
# * **baseline**: NCCL, both streams at default priority; **priority**: NCCL on the highest-priority stream,
#   launched first; **partition k/n**: the compute confined to k of n SMs (green context), NCCL gets the rest;
#   **carveout k/n**: NCCL, the compute's GEMMs sized by cuBLASLt for k of n SMs (the rest stay free);
#   **dma**: dmacoll's copy-engine collective; **dma_priority**: dma from the greatest-priority stream, launched
#   first; **dma_partition**: dma with the compute on all SMs but a few; **dma_carveout**: dma with the compute
#   as in carveout, the free SMs serving the collective's own small kernels.
# * Fraction of ideal (ConCCL) = (serial - T_c3) / (serial - max(T_comp, T_comm)), serial = T_comp + T_comm,
#   all alone-times from the same run; 1 = perfect overlap, 0 = no gain over running one after the other.
#   Times are the slowest rank's (a step ends when every rank is done).
# * The ConCCL paper's averages on AMD MI300X are shown next to ours as the paper's values (not measured
#   here): 21% baseline, 42% with schedule prioritization and CU partitioning, 72% with DMA collectives.

# %% tags=["parameters"]
csvs = ["results/h200x2/c3/c3/data.csv"]
platform_label = "2x H200 (NVLink)"
outdir = "results/local/figures/c3"

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dmacoll_lab.analysis import c3_rules as h  # noqa: E402
from dmacoll_lab.analysis import page, readings, report  # noqa: E402

page.setup()
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
raw = h.load(csvs)
report.print_provenance(csvs)
coll = h.collapse(raw)
coll["shape"] = [h.shape_label(r.compute, r.M, r.N, r.K) for r in coll.itertuples()]


def table(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return report.save_table(df, out, name)


skipped = raw[h.skipped(raw)]
wrong = raw[~h.skipped(raw) & (raw["correct"].astype(str) != "True")]
print(f"{len(raw)} rows, {len(coll)} (scenario, option) points; {len(skipped)} rows skipped, {len(wrong)} wrong")
page.table(table(skipped.groupby(["option", "op", "skipped"]).size().reset_index(name="rows"), "skipped"),
           empty="No row was skipped: every strategy ran in every scenario.")

# %% [markdown]
# ## Fraction of ideal per strategy (mean over shapes, ops and ratios)

# %%
summary = table(h.summary_table(coll), "fraction_of_ideal")  # fractions clipped at 1: h.collapse says why
fig, ax = plt.subplots(figsize=(9, 4))
sns.barplot(data=coll, x="option", y="fraction_of_ideal", order=list(summary["option"]), errorbar=("pi", 50),
            ax=ax, color="tab:blue", label=f"measured, {platform_label} (mean, 25-75%)")
paper = summary["conccl_paper_mi300x"]
ax.scatter(range(len(summary)), paper, marker="D", color="tab:red", zorder=3,
           label="ConCCL paper, MI300X (21% / 42% / 72%)")
ax.axhline(0, color="grey", lw=0.8)
ax.set_ylabel("fraction of ideal speedup")
ax.set_xlabel("strategy (SMs the GEMM keeps of the GPU's)")
plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
ax.legend(fontsize=8)
ax.set_title("C3: share of the ideal overlap realized")
page.figure(fig, out, "fraction_of_ideal")
page.reading(readings.c3_summary(summary, h.PAPER))
page.table(summary)

# %% [markdown]
# ## Per shape and per T_comm / T_comp

# %%
per_shape = coll.pivot_table(index="shape", columns="option", values="fraction_of_ideal", aggfunc="mean")
per_shape = per_shape[[o for o in summary["option"] if o in per_shape]]
table(per_shape.round(3).reset_index(), "fraction_per_shape")
fig, ax = plt.subplots(figsize=(1.3 * len(per_shape.columns) + 3, 0.45 * len(per_shape) + 1.5))
sns.heatmap(per_shape, annot=True, fmt=".2f", cmap="RdYlGn", vmin=-0.5, vmax=1, ax=ax)
ax.set_title(f"fraction of ideal, mean over ops and ratios, {platform_label}")
page.figure(fig, out, "fraction_per_shape")
page.reading(readings.c3_per_shape(per_shape))

ops = [o for o in ["all_gather", "all_to_all", "reduce_scatter", "all_reduce"] if o in set(coll["op"])]
g = sns.catplot(data=coll, x="target_ratio", y="speedup_vs_nccl_serial", hue="option", col="op", kind="point",
                hue_order=list(summary["option"]), col_order=ops, height=3, aspect=1.2, errorbar=None,
                col_wrap=min(4, len(ops)))
g.set_axis_labels("target T_comm / T_comp", "speedup over serial NCCL")
g.figure.suptitle(f"C3 speedup over compute-then-NCCL, mean over shapes, {platform_label}", y=1.03)
page.figure(g, out, "speedup_per_ratio")
page.reading(readings.c3_ratios(coll))

# %% [markdown]
# ## Picking a strategy at run time
#
# A depth-2 decision table learned on some shapes, tested on held-out ones (`dmacoll_lab.analysis.c3_rules`
# states the features, the loss and the split). Accuracy: the pick is the best strategy; within 5%: its
# T_c3 is within 5% of the best's; mean fraction of ideal: what the picks realize, to compare with the
# single strategies' means above.

# %%
try:
    res = h.fit_and_evaluate(coll)
except ValueError as e:  # one shape only: nothing to hold out
    res = None
    print(f"no heuristic: {e}")
if res is not None:
    print("held out:", ", ".join(h.shape_label(*s) for s in res["held_out"]))
    print(res["text"])
    (out / "heuristic_rule.txt").write_text(res["text"] + "\n")
    scores = table(res["scores"].round(3), "heuristic_accuracy")
    best = pd.Series(res["best_counts"], name="scenarios where best").rename_axis("option").reset_index()
    table(best, "best_option_counts")
    page.reading(readings.rule_scores(res["scores"], fraction=True))
    page.table(scores)
