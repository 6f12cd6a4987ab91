"""`dmacoll e2e` with its schedules side by side (the notebook's tables): every (implementation, schedule) against
NCCL serial and against NCCL under the same schedule, where the time goes, and issue 23's targets."""
from __future__ import annotations

import pandas as pd

from ..e2e.phases import OVERLAPPED as OVERLAPPED_PREFILLS  # the prefills a phased row chooses from (pure Python)
from .tables import E2E_KEYS as KEYS

# phase -> (column, True: a time (smaller is better), the column of its fraction of the ideal overlap)
PHASES = {"ttft": ("ttft_ms", True, "ttft_fraction_of_ideal"),
          "decode": ("decode_ms", True, "decode_fraction_of_ideal"),
          "throughput": ("e2e_tok_s", False, "decode_fraction_of_ideal")}
OVERLAPPED = {"ttft": "seqpar", "decode": "microbatch", "throughput": "microbatch"}  # the schedule each target is on
BREAKDOWN = [f"{p}_{m}" for p in ("ttft", "decode") for m in ("compute_ms", "comm_ms", "ideal_speedup",
                                                               "fraction_of_ideal", "fraction_of_ideal_raw")]


def side_by_side(e2e: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, implementation, schedule) measured: times, tokens/s, the breakdown, and per phase
    ``<phase>_vs_nccl_serial`` and ``<phase>_vs_nccl`` (the same schedule's NCCL run): > 1 is faster."""
    ok = e2e[e2e["status"] == "ok"]
    cols = [c for c in ["ttft_ms", "decode_ms", "e2e_tok_s", *BREAKDOWN, "decode_compute_over_floor",
                        "prefill_compute_over_floor"] if c in ok]
    out = ok[KEYS + ["impl", "schedule"] + cols].reset_index(drop=True)
    nccl = ok[ok["impl"] == "nccl"]
    for phase, (col, is_time, _) in PHASES.items():
        serial = nccl[nccl["schedule"] == "serial"][KEYS + [col]].rename(columns={col: "_serial"})
        same = nccl[KEYS + ["schedule", col]].rename(columns={col: "_same"})
        ref = out[KEYS + ["schedule", col]].merge(serial, on=KEYS, how="left").merge(
            same, on=KEYS + ["schedule"], how="left")
        for name, base in (("nccl_serial", ref["_serial"]), ("nccl", ref["_same"])):
            out[f"{phase}_vs_{name}"] = (base / ref[col] if is_time else ref[col] / base).to_numpy()
    return out


def compute_speed(e2e: pd.DataFrame) -> pd.DataFrame:
    """Per point (serial schedule, one implementation: compute does not depend on it): compute alone over its
    floor, decode (bytes at the measured copy rate) and prefill (GEMM FLOPs at the measured GEMM rate)."""
    cols = ["decode_compute_ms", "decode_floor_ms", "decode_compute_over_floor", "ttft_compute_ms",
            "prefill_floor_ms", "prefill_compute_over_floor"]
    ok = e2e[(e2e["status"] == "ok") & (e2e["schedule"] == "serial")]
    if not set(cols) <= set(ok):
        return pd.DataFrame(columns=KEYS + cols)
    return ok[ok["impl"] == ok["impl"].iloc[0]][KEYS + cols].reset_index(drop=True) if len(ok) else \
        pd.DataFrame(columns=KEYS + cols)


def targets(e2e: pd.DataFrame, min_batch: int = 8) -> pd.DataFrame:
    """Issue 23's targets, each measured over the points it names: value, target, met (NaN values: not measured).
    The overlapped schedule of a target is OVERLAPPED's."""
    sbs = side_by_side(e2e)
    speed = compute_speed(e2e)
    rows = [
        _row("decode compute / floor (weights + live KV at the copy rate), worst point",
             speed["decode_compute_over_floor"].max(), "<= 1.5", lambda v: v <= 1.5, len(speed)),
        _row("prefill compute / floor (GEMM FLOPs at the GEMM rate), worst point",
             speed["prefill_compute_over_floor"].max(), "<= 1.3", lambda v: v <= 1.3, len(speed))]
    big = sbs[sbs["batch"] >= min_batch]
    dma, nccl = (big[(big["impl"] == i) & (big["schedule"] == OVERLAPPED["decode"])] for i in ("dma", "nccl"))
    frac = "decode_fraction_of_ideal"
    rows.append(_row(f"dma {OVERLAPPED['decode']}: mean decode fraction of ideal overlap, batch >= {min_batch}",
                     dma[frac].mean() if frac in dma else float("nan"), ">= 0.8", lambda v: v >= 0.8, len(dma)))
    if frac in dma:
        pair = dma[KEYS + [frac]].merge(nccl[KEYS + [frac]], on=KEYS, suffixes=("_dma", "_nccl"))
        more = (pair[f"{frac}_dma"] > pair[f"{frac}_nccl"])
        rows.append(_row(f"points where dma {OVERLAPPED['decode']} overlaps more of the ideal than NCCL's, batch >= "
                         f"{min_batch}", f"{int(more.sum())} of {len(pair)}", "all",
                         lambda v: len(pair) > 0 and bool(more.all()), len(pair)))
    gain = dma["throughput_vs_nccl_serial"]
    rows.append(_row(f"dma {OVERLAPPED['throughput']} tokens/s over NCCL serial, worst point with batch >= {min_batch}",
                     gain.min(), ">= 1.0", lambda v: v >= 1.0, len(gain)))
    rows.append(_row(f"dma {OVERLAPPED['throughput']} tokens/s over NCCL serial, best point with batch >= "
                     f"{min_batch}", gain.max(), ">= 1.15",
                     lambda v: v >= 1.15, len(gain)))
    long = sbs[(sbs["prompt_len"] == 2048) & (sbs["impl"] == "dma") & (sbs["schedule"] == OVERLAPPED["ttft"])]
    for parallel, df in long.groupby("parallel"):
        ratio = (1 / df["ttft_vs_nccl_serial"]).max()
        rows.append(_row(f"TTFT at prompt 2048, dma {OVERLAPPED['ttft']} / NCCL serial, worst batch ({parallel})",
                         ratio, "<= 0.9 at TP4", lambda v: v <= 0.9, len(df)))
    return pd.DataFrame(rows + phased_targets(sbs, min_batch))


def phased_targets(sbs: pd.DataFrame, min_batch: int = 8) -> list[dict]:
    """Issue 50's targets for dmacoll's schedule per phase (``phased`` rows, e2e/phases.py) against NCCL serial, per
    parallelism: decode never slower; TTFT never slower, and <= 0.87 at one point of batch >= ``min_batch``."""
    rows = []
    ours = sbs[(sbs["impl"] == "dma") & (sbs["schedule"] == "phased")]
    for parallel, df in ours.groupby("parallel"):
        decode, ttft = 1 / df["decode_vs_nccl_serial"], 1 / df["ttft_vs_nccl_serial"]
        big = ttft[df["batch"] >= min_batch]
        rows += [_row(f"decode step, dma phased / NCCL serial, worst point ({parallel})", decode.max(), "<= 1.00",
                      lambda v: v <= 1.0, len(df)),
                 _row(f"TTFT, dma phased / NCCL serial, worst point ({parallel})", ttft.max(), "<= 1.00",
                      lambda v: v <= 1.0, len(df)),
                 _row(f"TTFT, dma phased / NCCL serial, best point with batch >= {min_batch} ({parallel})",
                      big.min() if len(big) else float("nan"), "<= 0.87", lambda v: v <= 0.87, len(big))]
    return rows


def _row(what: str, value, target: str, ok, points: int) -> dict:
    measured = points > 0 and (isinstance(value, str) or pd.notna(value))
    return {"target": what, "value": round(value, 3) if isinstance(value, float) else value, "goal": target,
            "met": bool(ok(value)) if measured else "", "points": points}


def phased(e2e: pd.DataFrame) -> pd.DataFrame:
    """dmacoll's schedule per phase (``phased`` rows, e2e/phases.py) against NCCL serial, per run (``source``) and
    point: decode and TTFT ratios (< 1: faster), end-to-end tokens/s (> 1: faster), the prefill dma took, and the
    bound no prefill overlap of this point can beat: the best overlapped schedule's compute or communication alone
    (whichever is longer) over NCCL serial."""
    cols = ["source", *KEYS, "decode_dma_over_nccl", "ttft_dma_over_nccl", "tok_s_dma_over_nccl", "prefill",
            "ideal_overlap_over_nccl", "comm_share"]
    out = []
    for source, run in e2e[e2e["status"] == "ok"].groupby("source", sort=False):
        nccl = run[(run["impl"] == "nccl") & (run["schedule"] == "serial")].set_index(KEYS)
        dma = run[run["impl"] == "dma"]
        ours = dma[dma["schedule"] == "phased"].set_index(KEYS)
        if ours.empty:
            continue
        over = dma[dma["schedule"].isin(OVERLAPPED_PREFILLS)]
        bound = over.assign(b=over[["ttft_compute_ms", "ttft_comm_ms"]].max(axis=1)).groupby(KEYS)["b"].min()
        serial = dma[dma["schedule"] == "serial"].set_index(KEYS)
        base = nccl["ttft_ms"].reindex(ours.index)
        out.append(pd.DataFrame({
            "source": source, "decode_dma_over_nccl": ours["decode_ms"] / nccl["decode_ms"].reindex(ours.index),
            "ttft_dma_over_nccl": ours["ttft_ms"] / base,
            "tok_s_dma_over_nccl": ours["e2e_tok_s"] / nccl["e2e_tok_s"].reindex(ours.index),
            "prefill": ours["prefill_schedule"],
            "ideal_overlap_over_nccl": bound.reindex(ours.index) / base,
            "comm_share": (serial["ttft_comm_ms"] / (serial["ttft_compute_ms"] + serial["ttft_comm_ms"]))
            .reindex(ours.index)}).reset_index())
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def phased_summary(phased_rows: pd.DataFrame) -> pd.DataFrame:
    """``phased`` over its runs, per (model, batch): dmacoll over NCCL serial, the median and range over the runs of
    the decode step, the TTFT and the end-to-end tokens/s (> 1: more), the prefills taken, and the lowest bound of a
    perfect prefill overlap."""
    def spread(v: pd.Series) -> str:
        return f"{v.median():.2f} ({v.min():.2f}-{v.max():.2f})"

    cols = ["model", "batch", "runs", "decode (range)", "TTFT (range)", "tokens/s (range)", "prefill taken",
            "ideal overlap, lowest"]
    if phased_rows.empty:
        return pd.DataFrame(columns=cols)
    out = (phased_rows.groupby(["model", "batch"], sort=True)
           .agg(runs=("source", "nunique"), decode=("decode_dma_over_nccl", spread),
                ttft=("ttft_dma_over_nccl", spread), tok_s=("tok_s_dma_over_nccl", spread),
                prefill=("prefill", lambda p: ", ".join(f"{k} x{n}" for k, n in p.value_counts().sort_index().items())),
                bound=("ideal_overlap_over_nccl", "min"))
           .reset_index())
    out["bound"] = out["bound"].round(2)
    out.columns = cols
    return out
