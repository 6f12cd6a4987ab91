"""Readings: the paragraph under a figure or table of a notebook page, every number in it computed from the data
(no number is written by hand). Each function takes the table the page draws and returns Markdown."""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from dmacoll.lab_api import human


def _num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def _range(values: Sequence[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    if round(lo, digits) == round(hi, digits):
        return _num(lo, digits)
    return f"{_num(lo, digits)} to {_num(hi, digits)}" if lo < 0 else f"{_num(lo, digits)}-{_num(hi, digits)}"


def faster_from(sizes: Sequence[int], ratios: Sequence[float]) -> Optional[int]:
    """The smallest size from which every larger size's time ratio is below 1 (None: not at the largest)."""
    start = None
    for size, ratio in sorted(zip(sizes, ratios)):
        if ratio < 1:
            start = size if start is None else start
        else:
            start = None
    return start


def operator(table: pd.DataFrame, mode: str) -> str:
    """The operator figures of one mode: per op, from which size the default and the oracle beat NCCL, the ratio at
    the largest size with its spread, and the oracle's cost beyond one raw peer copy (``report.ratio_table``)."""
    parts = []
    for op, t in table[table["mode"] == mode].groupby("op"):
        t = t[t["default_over_nccl"].map(lambda v: isinstance(v, float))].sort_values("bytes")
        if t.empty:
            continue
        big = t.iloc[-1]
        sentence = [f"**{op}** ({mode}):"]
        for name in ("default", "oracle"):
            start = faster_from(t["bytes"], t[f"{name}_over_nccl"])
            where = (f"faster than NCCL from {human(int(start))} up" if start is not None
                     else "not faster than NCCL at the largest size")
            sentence.append(f"the {name} is {where} ({_num(big[f'{name}_over_nccl'])}x NCCL's time at "
                            f"{big['size']}, p10-p90 {_num(big[f'{name}_lo'])}-{_num(big[f'{name}_hi'])});")
        small = t[t["bytes"] <= 64 << 10]
        if not small.empty:
            sentence.append(f"up to 64 KB the default takes {_range(small['default_over_nccl'])}x NCCL's time.")
        extra = pd.to_numeric(t["oracle_minus_peer_copy_us"], errors="coerce").dropna()
        if not extra.empty:
            sentence.append(f"The oracle costs {_range(extra, 1)} us per call beyond one raw peer copy of the same "
                            "bytes: the protocol's flag crossings.")
        parts.append(" ".join(sentence))
    return "\n\n".join(parts) if parts else "No dmacoll point was measured against NCCL in this mode."


def speedup(table: pd.DataFrame, op: str, mode: str) -> str:
    """A feature heatmap (``report.speedup_table`` of one op and mode): which features speed pcpy up, where."""
    t = table[(table["op"] == op) & (table["mode"] == mode)].sort_values("bytes_per_rank")
    feats = [c for c in t.columns if c not in ("op", "mode", "size", "bytes_per_rank", "pcpy_us", "best")
             and t[c].notna().any()]
    if t.empty or not feats:
        return f"No feature of {op} was measured against pcpy in {mode} mode."
    means = {f: t[f].median() for f in feats}
    top = max(means, key=means.get)
    best = t["best"].dropna()
    return (f"**{op}** ({mode}): the best configuration is {_range(best)}x faster than plain pcpy over the sizes "
            f"({_num(best.iloc[0])}x at {t['size'].iloc[0]}, {_num(best.iloc[-1])}x at {t['size'].iloc[-1]}); the "
            f"single feature that helps most at the median size is {top.replace('_', ' ')} ({_num(means[top])}x); "
            f"{sum(means[f] < 1 for f in feats)} of {len(feats)} features slow it down at the median size.")


def dmalatte(comp: pd.DataFrame, small: int = 128 << 10) -> str:
    """Our speedups over pcpy next to the AMD-DMA-Latte authors' (``dmalatte_reference.comparison``)."""
    parts = []
    for op, t in comp.groupby("op"):
        kb = t[t["bytes_per_rank"] <= small]
        both = t.dropna(subset=["best (MI300X)", "best (here)"])
        if kb.empty or both.empty:
            continue
        last = both.iloc[-1]
        parts.append(
            f"**{op}**, up to {human(small)}: the best configuration here is {_range(kb['best (here)'])}x faster "
            f"than pcpy, the authors' best {_range(kb['best (MI300X)'])}x on 8x MI300X; prerecording alone "
            f"{_range(kb['prerecord (here)'])}x here against their pcpy+PL {_range(kb['pcpy+PL (MI300X)'])}x. At "
            f"{last['size']}: {_num(last['best (here)'])}x here, {_num(last['best (MI300X)'])}x theirs.")
    return "\n\n".join(parts) if parts else "No size was measured both here and in the authors' table."


def breakdown(wide: pd.DataFrame, stack: pd.DataFrame, theirs: Optional[pd.DataFrame] = None) -> str:
    """The transfer breakdown (``tables.breakdown_wide`` and ``breakdown_stack``; ``theirs``:
    ``dmalatte_reference.phases``): what dominates small and large transfers, and why schedule is negative."""
    first, last = wide.index[0], wide.index[-1]
    text = [f"At {first} the non-copy phases take {stack['non_copy_share'].iloc[0]:.0%} of a transfer "
            f"(issue {_num(stack['issue'].iloc[0], 1)} us, sync {_num(stack['sync'].iloc[0], 1)} us, copy "
            f"{_num(stack['copy'].iloc[0], 1)} us); at {last} {stack['non_copy_share'].iloc[-1]:.0%}."]
    if theirs is not None and not theirs.empty:
        text.append(f"The authors' 1 KB DMA copy on MI300X: {theirs['non-copy total'].iloc[0]:.0%} non-copy.")
    negative = wide["schedule"][wide["schedule"] < 0]
    if not negative.empty:
        text.append(
            f"**Schedule is negative** at {len(negative)} of {len(wide)} sizes ({_range(negative, 1)} us): it is "
            "measured from the moment `cuMemcpyAsync` returns to the moment the engine starts the copy (both CUPTI "
            "records), and the driver hands the copy to the engine before the call returns; the engine is already "
            "copying during the last part of the call. So control and schedule overlap, and the figures stack "
            "their sum instead, issue = the call's start to the engine's start, which cannot be negative "
            f"({_range(stack['issue'], 1)} us here).")
    return " ".join(text)


def power(summary: pd.DataFrame) -> str:
    """The power figure (``tables.power_summary``): per op at the largest size, the dma points' power against
    NCCL's, and where dma's energy per call falls below NCCL's."""
    parts = []
    for op, t in summary.groupby("op"):
        big = t[t["bytes_per_rank"] == t["bytes_per_rank"].max()].set_index("impl")
        if "nccl" not in big.index:
            continue
        dma = big.drop(index="nccl")
        saving = 1 - dma["avg_power_w"] / big.loc["nccl", "avg_power_w"]
        cheaper = t[(t["impl"] != "nccl") & (t["energy_vs_nccl"] < 1)]
        where = (f"from {human(int(cheaper['bytes_per_rank'].min()))} up" if not cheaper.empty else "at no size")
        parts.append(f"**{op}** at {big['size'].iloc[0]}: NCCL draws {_num(big.loc['nccl', 'avg_power_w'], 0)} W, "
                     + ", ".join(f"{impl} {_num(w, 0)} W ({s:.0%} less)" for impl, w, s in
                                 zip(dma.index, dma["avg_power_w"], saving))
                     + f"; a dma call's energy above idle is below NCCL's {where}.")
    return " ".join(parts) or "No power point was measured next to NCCL."


def sm_usage(sm: pd.DataFrame) -> str:
    """What runs on the SMs per call (the profiler's activities of `dmacoll sm-usage`), per implementation."""
    per = sm.groupby("impl")[["kernels_per_call", "copies_per_call"]].agg(["min", "max"])
    return "Per call, " + "; ".join(
        f"{impl}: {_range(per.loc[impl, ('kernels_per_call', slice(None))], 0)} kernels and "
        f"{_range(per.loc[impl, ('copies_per_call', slice(None))], 0)} copy-engine copies"
        for impl in per.index) + " (over ops, sizes and modes)."


def interference(summary: pd.DataFrame) -> str:
    """The interference figure (``tables.interference_summary``): per compute kind, the fraction of the ideal
    overlap each option keeps, over sizes and ranks."""
    parts = []
    for compute, t in summary.groupby("compute"):
        ranges = [f"{option} {_range(list(g['fraction_min']) + list(g['fraction_max']))}"
                  for option, g in t.groupby("option")]
        parts.append(f"Next to the {compute} kernel the fraction of the ideal overlap is {', '.join(ranges)} (over "
                     "sizes and ranks; 1: perfect overlap, 0: none).")
    return " ".join(parts)


def c3_summary(summary: pd.DataFrame, paper: dict) -> str:
    """The C3 strategies' bar chart (``c3_rules.summary_table``), against ConCCL's averages (``paper``)."""
    s = summary.set_index("option")
    best = s["fraction_mean"].idxmax()
    nccl = s[~s["strategy"].str.startswith("dma")]
    text = [f"Mean fraction of the ideal overlap over {int(s['scenarios'].max())} scenarios:"]
    if "baseline" in s.index:
        text.append(f"NCCL as is {_num(s.loc['baseline', 'fraction_mean'])},")
    if not nccl.empty:
        top = nccl["fraction_mean"].idxmax()
        text.append(f"the best NCCL strategy ({top}) {_num(nccl.loc[top, 'fraction_mean'])},")
    if "dma" in s.index:
        text.append(f"the plain dma strategy {_num(s.loc['dma', 'fraction_mean'])},")
    text.append(f"the best single strategy ({best}) {_num(s.loc[best, 'fraction_mean'])};")
    text.append(f"{int(s['above_1_clipped'].sum())} fractions above 1 were clipped to 1. ConCCL's averages on "
                f"MI300X (the paper's): {', '.join(f'{k} {v:.2f}' for k, v in paper.items())}.")
    return " ".join(text)


def c3_per_shape(per_shape: pd.DataFrame) -> str:
    """The per-shape heatmap: which option keeps most of the ideal overlap at how many shapes."""
    best = per_shape.idxmax(axis=1).value_counts()
    return ("The option with the highest mean fraction per shape: " + ", ".join(
        f"{option} at {n} of {len(per_shape)} shapes" for option, n in best.items()) + ".")


def c3_ratios(coll: pd.DataFrame) -> str:
    """The speedup-per-ratio figure: per target T_comm / T_comp, the option with the best mean speedup over serial
    NCCL."""
    means = coll.groupby(["target_ratio", "option"])["speedup_vs_nccl_serial"].mean()
    parts = [f"at {ratio:g} {means[ratio].idxmax()} ({_num(means[ratio].max())}x)"
             for ratio in sorted(means.index.get_level_values(0).unique())]
    return "Best mean speedup over computing then communicating with NCCL, per target T_comm / T_comp: " + \
        "; ".join(parts) + "."


def rule_scores(scores: pd.DataFrame, fraction: bool) -> str:
    """A learned rule's scores on the held-out scenarios, next to always picking one option."""
    test = scores[scores["set"] == "test"].set_index("model")
    if "rule" not in test.index:
        return "No rule was scored on held-out scenarios."
    r = test.loc["rule"]
    text = (f"On {int(r['scenarios'])} held-out scenarios the rule picks the best option in {r['accuracy']:.0%} and "
            f"one within 5% of the best in {r['within_5pct']:.0%} (mean regret {r['mean_regret']:.1%})")
    others = test.drop(index="rule")
    if fraction and "mean_fraction_of_ideal" in test:
        text += (f", realizing a mean fraction of ideal of {_num(r['mean_fraction_of_ideal'], 3)} against " +
                 ", ".join(f"{_num(o['mean_fraction_of_ideal'], 3)} for {m}" for m, o in others.iterrows()) +
                 " on the same scenarios (the claims score default, tuned and oracle there too)")
    else:
        text += "; " + ", ".join(f"{m}: best in {o['accuracy']:.0%}, within 5% in {o['within_5pct']:.0%}"
                                 for m, o in others.iterrows())
    return text + "."


def ficco(summary: pd.DataFrame, paper_max: float) -> str:
    """The FiCCO schedules' speedups over serial NCCL (``ficco_rules.summary_table``)."""
    s = summary.set_index("option")
    best = s["speedup_mean"].idxmax()
    top = s["speedup_max"].idxmax()
    return (f"Over {int(s['scenarios'].max())} scenarios the best schedule on average is {best} "
            f"({_num(s.loc[best, 'speedup_mean'])}x NCCL serial); the largest single speedup is "
            f"{_num(s.loc[top, 'speedup_max'])}x ({top}); the FiCCO paper reports up to {paper_max:g}x on MI300X.")


def ficco_losses(losses: pd.DataFrame) -> str:
    """The loss figure (``ficco_rules.losses``): per pattern, the range of each loss over the decomposed
    schedules."""
    return " ".join(
        f"**{pattern}**: decomposition {_range(t['decomposition_loss'])}x, contention {_range(t['contention_loss'])}x"
        f" over the decomposed schedules." for pattern, t in losses.groupby("pattern"))


def e2e(overview: pd.DataFrame) -> str:
    """The end-to-end overview (``tables.e2e_overview``): dmacoll over NCCL per metric, and the logits checks."""
    rows = overview.set_index("metric")
    parts = [f"{metric}: {_num(r['min'])}-{_num(r['max'])} (median {_num(r['median'])}) over {int(r['points'])} "
             "points" for metric, r in rows.iterrows() if metric != "logits checks passed"]
    text = "Serial schedule, " + "; ".join(parts) + " (times below 1 and tokens/s above 1 favour dmacoll)."
    if "logits checks passed" in rows.index:
        r = rows.loc["logits checks passed"]
        text += f" {int(r['min'])} of {int(r['points'])} logits checks passed."
    return text


def e2e_paper(claims: pd.DataFrame) -> str:
    """The paper-claim table of the end-to-end page: the best point here next to DMA-Latte's "up to" numbers."""
    return " ".join(f"{r['metric']}: best {_num(r['measured_best'])} ({r['ratio']}, {r['best_at']}), median "
                    f"{_num(r['measured_median'])}; the paper: {r['dmalatte_paper_mi300x_vs_vllm']} than vLLM on "
                    "MI300X." for _, r in claims.iterrows())


def e2e_schedules(sbs: pd.DataFrame) -> str:
    """The schedules figure (``e2e_tables.side_by_side``): which schedules this run measured, and the best decode
    step time of dmacoll over NCCL serial."""
    schedules = sorted(sbs["schedule"].unique())
    dma = sbs[(sbs["impl"] == "dma") & sbs["decode_vs_nccl_serial"].notna()]
    text = f"Schedules measured in this run: {', '.join(schedules)}."
    if not dma.empty:
        best = dma.loc[dma["decode_vs_nccl_serial"].idxmax()]
        text += (f" The fastest dma decode step takes {_num(1 / best['decode_vs_nccl_serial'])} of NCCL serial's "
                 f"time ({best['schedule']}, {best['model']}, batch {best['batch']}).")
    return text


def e2e_breakdown(goals: pd.DataFrame) -> str:
    """Where the time goes: how many of the targets this run can evaluate, and why not the others."""
    measured = goals[goals["points"] > 0]
    if measured.empty:
        return ("This run measured no breakdown: it has neither compute-alone nor communication-alone times nor "
                "an overlapped schedule (it predates them), so none of the targets below can be evaluated; a fresh "
                "`dmacoll e2e` run measures them.")
    met = int((measured["met"] == True).sum())  # noqa: E712 (a column of True / False / "")
    return f"{met} of {len(measured)} targets this run can evaluate are met ({len(goals) - len(measured)} cannot be)."


def e2e_phased(phased: pd.DataFrame, goals: pd.DataFrame, min_batch: int = 8) -> str:
    """The schedule per phase (``e2e_tables.phased``, ``phased_targets`` per run): its decode and TTFT against NCCL
    serial, where the prefill overlapped, and, at batch >= ``min_batch`` (the TTFT target's points), what bounds the
    TTFT."""
    n, runs = len(phased), phased["source"].nunique()
    overlapped = phased[phased["prefill"] != "serial"]
    text = (f"Over {n} points in {runs} runs, dmacoll's decode step took {_range(phased['decode_dma_over_nccl'])} of "
            f"NCCL serial's and its TTFT {_range(phased['ttft_dma_over_nccl'])}. The prefill overlapped at "
            f"{len(overlapped)} of them")
    if len(overlapped):
        text += f" ({', '.join(sorted(set(overlapped['model'] + ' batch ' + overlapped['batch'].astype(str))))})"
    big = phased[phased["batch"] >= min_batch]
    if not big.empty:
        best = big.loc[big["ttft_dma_over_nccl"].idxmin()]
        text += (f". At batch >= {min_batch} the best TTFT, {_num(best['ttft_dma_over_nccl'])} of NCCL serial's, was "
                 f"{best['model']} at batch {best['batch']}")
        if big["ideal_overlap_over_nccl"].notna().any():
            bound = big.loc[big["ideal_overlap_over_nccl"].idxmin()]
            text += (f"; no overlap of those prefills could go below {_num(bound['ideal_overlap_over_nccl'])} "
                     f"({bound['model']}, batch {bound['batch']}: its compute or communication alone), the "
                     f"communication being {_range(big['comm_share'].dropna())} of a serial prefill")
    met = goals[goals["met"] == True]  # noqa: E712 (a column of True / False / "")
    return text + f". {len(met)} of {len(goals)} target rows are met."
