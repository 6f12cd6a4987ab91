"""Which FiCCO schedule should a runtime use? Rules learned from a `dmacoll ficco` table, tested on a held-out model.

A scenario is (model, pattern, tokens, world); an option is a schedule (``option``: "nccl serial", "dma d=4",
...). Ranks are merged first (a step ends when the slowest rank ends: every time is the maximum over ranks);
only measured, correct rows count; an option missing in a scenario counts as NCCL serial's time there.

Features, all static sizes a runtime knows before it runs: ``op`` (the pattern), ``gflop`` of the rank's whole
GEMM, ``tokens``, and ``ratio``, the static T_comm / T_gemm estimate (``ficco_grid.Scenario.est_ratio``).
Rules: ``rules.learn``'s exhaustive depth-limited decision tree (least total training regret, regret =
T(pick) / T(best) - 1), with this module's candidate tests.

Split: by model. The distinct models sorted by name; the first is held out (all its patterns and token
counts; "llama3-70b" in the default grid), the rest train. Scores: accuracy = the pick is the best option
(within 0.1%); within_5pct = the pick's time is within 5% of the best; mean regret.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from . import load as results
from .rules import Test, by_option, learn_and_score, skipped

KEYS = ["model", "pattern", "tokens", "world"]
DEFAULT = "nccl serial"
GFLOP_CUTS = (50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
RATIO_CUTS = (0.05, 0.1, 0.2, 0.4, 0.8)
TOKEN_CUTS = (4096,)


def load(paths: Sequence[str]) -> pd.DataFrame:
    """`dmacoll ficco` tables as one table (``source``: each row's file)."""
    return results.read("ficco", paths)


def collapse(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, option) measured and correct on every rank: the slowest rank's times, speedups and
    losses recomputed from them."""
    from ..bench.ficco_grid import pipeline_time

    good = ~skipped(df) & (df["correct"].astype(str) == "True")
    # a schedule wrong or missing on any rank does not count for its scenario
    whole = good.groupby([df[k] for k in KEYS + ["option"]]).transform("all")
    ok = df[whole]
    times = ["t_us", "t_serial_us", "t_serial_nccl_us", "t_gemm_us", "t_gemm_pieces_us", "t_coll_us",
             "t_coll_pieces_us"]
    first = ["op", "impl", "pieces", "gflop", "est_ratio", "coll_bytes", "M", "N", "K"]
    out = ok.groupby(KEYS + ["option"], dropna=False).agg(
        {**{c: "max" for c in times}, **{c: "first" for c in first}}).reset_index()
    out["decomposition_loss"] = out["t_gemm_pieces_us"] / out["t_gemm_us"]
    out["overlap_vs_isolated_sum"] = out["t_us"] / (out["t_gemm_pieces_us"] + out["t_coll_pieces_us"])
    rs = out["pattern"] == "gemm_rs"
    first_t = np.where(rs, out["t_gemm_pieces_us"], out["t_coll_pieces_us"])
    second_t = np.where(rs, out["t_coll_pieces_us"], out["t_gemm_pieces_us"])
    out["t_pipeline_ideal_us"] = [pipeline_time(a, b, int(d)) for a, b, d in zip(first_t, second_t, out["pieces"])]
    out["contention_loss"] = out["t_us"] / out["t_pipeline_ideal_us"]
    out["speedup_vs_serial"] = out["t_serial_us"] / out["t_us"]
    out["speedup_vs_nccl_serial"] = out["t_serial_nccl_us"] / out["t_us"]
    return out


PAPER_MAX_SPEEDUP = 1.6  # FiCCO paper, MI300X: "up to 1.6x"


def option_order(options) -> list[str]:
    """Schedules in reading order: per implementation, serial first, then by the number of pieces."""
    return sorted(set(options), key=lambda o: (o.split()[0], 0 if "serial" in o else int(o.split("=")[1])))


def summary_table(coll: pd.DataFrame) -> pd.DataFrame:
    """Per schedule: scenarios, mean and best speedup over NCCL serial, mean speedup over its own serial schedule,
    next to the paper's best on MI300X."""
    out = (coll.groupby("option").agg(scenarios=("t_us", "size"), speedup_mean=("speedup_vs_nccl_serial", "mean"),
                                      speedup_max=("speedup_vs_nccl_serial", "max"),
                                      speedup_vs_own_serial=("speedup_vs_serial", "mean"))
           .reindex(option_order(coll["option"])).reset_index())
    out["ficco_paper_max_mi300x"] = PAPER_MAX_SPEEDUP
    return out.round(3)


def losses(coll: pd.DataFrame) -> pd.DataFrame:
    """The decomposed schedules' mean losses per pattern: decomposition (GEMM pieces over the whole GEMM),
    contention (measured over the ideal pipeline), and the overlap against the pieces' isolated sum."""
    dec = coll[coll["pieces"] > 1]
    return (dec.groupby(["pattern", "option"])
            .agg(decomposition_loss=("decomposition_loss", "mean"), contention_loss=("contention_loss", "mean"),
                 overlap_vs_isolated_sum=("overlap_vs_isolated_sum", "mean")).reset_index().round(3))


def scenarios(coll: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(features, time per option) indexed by scenario."""
    times = by_option(coll, KEYS, "t_us", DEFAULT, pd.DataFrame.max).dropna()
    feats = coll.groupby(KEYS).agg(gflop=("gflop", "first"), ratio=("est_ratio", "first")).reindex(times.index)
    feats["op"] = feats.index.get_level_values("pattern")
    feats["tokens"] = feats.index.get_level_values("tokens").astype(float)
    feats["model"] = feats.index.get_level_values("model")
    return feats, times[sorted(times.columns)]


def candidate_tests(feats: pd.DataFrame) -> list:
    tests = [Test("op", p, False) for p in sorted(feats["op"].unique())]
    tests += [Test("gflop", g, True) for g in GFLOP_CUTS]
    tests += [Test("ratio", r, True) for r in RATIO_CUTS]
    return tests + [Test("tokens", float(t), True) for t in TOKEN_CUTS]


def holdout_model(models) -> str:
    return sorted(set(models))[0]


def fit_and_evaluate(coll: pd.DataFrame, depth: int = 2, min_leaf: int = 2, min_gain: float = 0.005,
                     holdout: Optional[str] = None) -> dict:
    """The learned rule; its scores on train and held-out scenarios next to 'always the single best option on
    train' and 'always NCCL serial'."""
    feats, times = scenarios(coll)
    models = sorted(set(feats["model"]))
    if len(models) < 2:
        raise ValueError(f"need at least two models to hold one out, have {models}")
    held = holdout or holdout_model(models)
    test = (feats["model"] == held).to_numpy()
    rule, scores = learn_and_score(feats, times, test, candidate_tests(feats[~test]), DEFAULT, depth, min_leaf,
                                   min_gain)
    return {"rule": rule, "text": rule.text(), "scores": scores, "held_out": held,
            "train_models": [m for m in models if m != held], "best": times.idxmin(axis=1),
            "features": feats, "times": times, "test_mask": test}


def summary(res: dict) -> str:
    """What `dmacoll rules ficco` prints: the held-out model, the rule and its scores."""
    return "\n".join([f"held out: {res['held_out']}; trained on {', '.join(res['train_models'])}", res["text"],
                      res["scores"].round(3).to_string(index=False)])
