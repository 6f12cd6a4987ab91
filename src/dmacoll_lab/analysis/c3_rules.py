"""Which C3 strategy should a runtime use? Rules learned from a `dmacoll c3` table, tested on unseen shapes.

A scenario is (compute, M, N, K, op, target ratio); an option is a strategy with its SM split (``option``
column). Ranks are merged first: a C3 step ends when the slowest rank ends, so every time is the maximum over
ranks and the ConCCL metrics are recomputed from those. Only measured, correct rows count. Fractions of ideal
above 1 are clipped at 1 (a pair cannot overlap better than perfectly; ``fraction_of_ideal_raw`` keeps them).

Inputs a runtime has before it runs: ``op``; ``bound`` (memory- or compute-bound: arithmetic intensity against
the ridge point); ``gflop`` of one compute operator; ``ratio``, its T_comm / T_comp estimate (here the
scenario's measured NCCL-alone ratio, else the target ratio).

Loss: regret of a pick = T_c3(pick) / T_c3(best option) - 1. An option that did not run in a scenario counts
as the baseline's time there (a runtime that cannot run its pick runs the default).

Rules: ``rules.learn``'s decision tree of depth <= ``depth`` (2 by default) whose tests are ``op == x``,
``bound == memory``, ``ratio <= t`` (t in RATIO_CUTS) and ``gflop <= g`` (g in GFLOP_CUTS); each leaf names
one option.

Split: by shape. The distinct shapes (compute, M, N, K) sorted; every third from the second is held out (all
its ops and ratios); the rest train. Scores on a set: accuracy = the pick is the best option (within 0.1%);
within_5pct = the pick's T_c3 is within 5% of the best; mean regret; and the mean fraction of ideal (ConCCL's
metric) the picks realize, to set next to the single strategies' means.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import load as results
from .rules import Test, by_option, learn_and_score, pick, skipped

SHAPE = ["compute", "M", "N", "K"]
KEYS = SHAPE + ["op", "target_ratio"]
RATIO_CUTS = (0.35, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)
GFLOP_CUTS = (10.0, 100.0, 300.0, 1000.0, 3000.0)


def shape_label(compute: str, m: int, n: int, k: int) -> str:
    return f"{compute}:{m}x{n}" + (f"x{k}" if compute == "gemm" else "")


def runs(folder: Path) -> list[Path]:
    """The `dmacoll c3` tables in a machine's c3 folder (``results/<machine>/c3``): the full run ``c3/`` first,
    then the others (repeats of some strategies) by name; probe tables beside them are not C3's."""
    tables = [p for p in sorted(Path(folder).glob("*/data.csv")) if {"strategy", "option", "t_c3_us"} <= set(
        p.open().readline().strip().split(","))]
    return sorted(tables, key=lambda p: (p.parent.name != "c3", p.parent.name))


def load(paths: Sequence[str]) -> pd.DataFrame:
    """`dmacoll c3` tables as one table (``source``: each row's file)."""
    return results.read("c3", paths)


# -- the table -------------------------------------------------------------------------------------------------
def collapse(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, option): measured, correct rows; times the slowest rank's; metrics recomputed."""
    ok = df[~skipped(df) & (df["correct"].astype(str) == "True")]
    times = ["t_comp_us", "t_comm_us", "t_comm_nccl_us", "t_c3_us", "t_comp_together_us", "t_comm_together_us"]
    first = ["strategy", "sm_split", "bound", "gflop", "intensity", "bytes_per_rank", "comm_calls", "impl"]
    out = ok.groupby(KEYS + ["option"], dropna=False).agg(
        {**{c: "max" for c in times}, **{c: "first" for c in first if c in ok}}).reset_index()
    serial = out["t_comp_us"] + out["t_comm_us"]
    longest = np.maximum(out["t_comp_us"], out["t_comm_us"])
    out["ratio"] = out["t_comm_us"] / out["t_comp_us"]
    out["ratio_nccl"] = out["t_comm_nccl_us"] / out["t_comp_us"]
    out["ideal_speedup"] = serial / longest
    out["realized_speedup"] = serial / out["t_c3_us"]
    # a pair cannot overlap better than perfectly: a fraction above 1 (T_c3 below the longer side alone) is timing
    # noise, so it counts as 1 in every mean; the measured value stays in fraction_of_ideal_raw
    out["fraction_of_ideal_raw"] = (serial - out["t_c3_us"]) / (serial - longest)
    out["fraction_of_ideal"] = out["fraction_of_ideal_raw"].clip(upper=1.0)
    out["speedup_vs_nccl_serial"] = (out["t_comp_us"] + out["t_comm_nccl_us"]) / out["t_c3_us"]
    return out


ORDER = ("baseline", "priority", "partition", "carveout", "dma", "dma_priority", "dma_partition", "dma_carveout")
PAPER = {"baseline": 0.21, "priority": 0.42, "partition": 0.42, "dma": 0.72}  # ConCCL's averages on MI300X


def summary_table(coll: pd.DataFrame) -> pd.DataFrame:
    """Per option: scenarios, mean and median fraction of ideal (clipped at 1), how many were clipped, the mean and
    best speedup over NCCL serial, and ConCCL's average on MI300X for its strategy (priority and partition are
    one combined number there)."""
    out = (coll.groupby(["option", "strategy"])
           .agg(scenarios=("fraction_of_ideal", "size"), fraction_mean=("fraction_of_ideal", "mean"),
                fraction_median=("fraction_of_ideal", "median"),
                above_1_clipped=("fraction_of_ideal_raw", lambda s: int((s > 1).sum())),
                speedup_vs_nccl_serial=("speedup_vs_nccl_serial", "mean"),
                best_speedup=("speedup_vs_nccl_serial", "max"))
           .reset_index())
    out = out.sort_values(["strategy", "option"], key=lambda c: c.map(ORDER.index) if c.name == "strategy" else c)
    out["conccl_paper_mi300x"] = out["strategy"].map(PAPER)
    return out.round(3).reset_index(drop=True)


def scenarios(coll: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(features, T_c3 per option) indexed by scenario; missing options filled with the baseline's time."""
    times = by_option(coll, KEYS, "t_c3_us", "baseline", pd.DataFrame.max).dropna()
    feats = coll.groupby(KEYS).agg(bound=("bound", "first"), gflop=("gflop", "first"),
                                   ratio_nccl=("ratio_nccl", "median")).reindex(times.index)
    target = feats.index.get_level_values("target_ratio").to_series(index=feats.index).astype(float)
    feats["ratio"] = feats["ratio_nccl"].where(feats["ratio_nccl"].notna(), target)
    feats["op"] = feats.index.get_level_values("op")
    return feats[["op", "bound", "gflop", "ratio"]], times[sorted(times.columns)]


def held_out(feats: pd.DataFrame) -> np.ndarray:
    """Test mask: every third distinct shape (sorted), starting from the second."""
    shapes = feats.index.droplevel(["op", "target_ratio"])
    test = set(sorted(set(shapes))[1::3])
    return np.array([s in test for s in shapes])


def scored_rows(coll: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The rows of the scenarios a rule is scored on (the held-out shapes), and whether there were shapes to hold
    out (with a single shape: every row, False)."""
    feats, _ = scenarios(coll)
    mask = held_out(feats)
    if mask.all() or not mask.any():
        return coll, False
    return coll[coll.set_index(KEYS).index.isin(feats.index[mask])], True


def run_means(paths: Sequence[Path]) -> pd.DataFrame:
    """Per C3 run (its folder's name) and option: scenarios, the mean fraction of ideal (clipped at 1, as every
    claim and summary takes it), the mean unclipped, and the clipped mean over the held-out scenarios the claims
    score. Options repeated in several runs show the run-to-run noise."""
    rows = []
    for path in paths:
        coll = collapse(load([path]))
        held, _ = scored_rows(coll)
        for option, g in coll.groupby("option"):
            rows.append({"run": Path(path).parent.name, "option": option, "scenarios": len(g),
                         "mean": g["fraction_of_ideal"].mean(), "mean_unclipped": g["fraction_of_ideal_raw"].mean(),
                         "held_out_mean": held[held["option"] == option]["fraction_of_ideal"].mean()})
    return pd.DataFrame(rows).round(3)


# -- rules -----------------------------------------------------------------------------------------------------
def candidate_tests(feats: pd.DataFrame) -> list[Test]:
    tests = [Test("op", op, False) for op in sorted(feats["op"].unique())]
    tests += [Test("bound", "memory", False)] if feats["bound"].nunique() > 1 else []
    tests += [Test("ratio", t, True) for t in RATIO_CUTS]
    tests += [Test("gflop", g, True) for g in GFLOP_CUTS]
    return tests


def fit_and_evaluate(coll: pd.DataFrame, depth: int = 2, min_leaf: int = 3, min_gain: float = 0.005) -> dict:
    """The learned rule, its scores on train and held-out shapes, and two references (always the baseline,
    always the single best option on train)."""
    feats, times = scenarios(coll)
    test = held_out(feats)
    if test.all() or not test.any():
        raise ValueError("need at least two shapes to hold one out")
    fractions = by_option(coll, KEYS, "fraction_of_ideal", "baseline", pd.DataFrame.min).reindex(
        index=times.index, columns=times.columns)
    rule, scores = learn_and_score(
        feats, times, test, candidate_tests(feats[~test]), "baseline", depth, min_leaf, min_gain,
        extra=lambda picks, m: {"mean_fraction_of_ideal": float(np.mean(pick(fractions[m], picks)))})
    best = times.idxmin(axis=1)
    return {"rule": rule, "text": rule.text(), "scores": scores,
            "held_out": sorted(set(feats.index[test].droplevel(["op", "target_ratio"]))),
            "best_counts": best.value_counts().to_dict(), "features": feats, "times": times, "test_mask": test}


def summary(res: dict) -> str:
    """What `dmacoll rules c3` prints: the held-out shapes, the best options, the rule and its scores."""
    return "\n".join(["held-out shapes: " + ", ".join(shape_label(*s) for s in res["held_out"]),
                      f"best option counts: {res['best_counts']}", res["text"],
                      res["scores"].round(3).to_string(index=False)])
