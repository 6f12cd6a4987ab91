"""Summary tables of the experiments besides the operator sweep, shared by the notebooks and the generated
documents (``docs.py``), so that a number printed in both comes from one computation."""
from __future__ import annotations

import numpy as np
import pandas as pd

from dmacoll.lab_api import human
from . import report


def config_names(df: pd.DataFrame) -> pd.Series:
    """A row's implementation as every page names it: the impl, then its variant, the variant 'auto' (every option
    left to ``Communicator()``) as 'default', the name the operator page and the claims give that configuration:
    'nccl', 'dma pcpy', 'dma default'."""
    variant = df["variant"].fillna("").replace({"auto": "default"})
    return df["impl"] + variant.map(lambda v: f" {v}" if v else "")


def power_summary(power: pd.DataFrame) -> pd.DataFrame:
    """Per (op, implementation, size): median average power, idle power, and energy per call above idle (also
    per byte, and over NCCL's), over every GPU and repeat."""
    runs = power[power["impl"] != "idle"].copy()
    runs["impl"] = config_names(runs)
    runs["size"] = runs["bytes_per_rank"].map(lambda b: human(int(b)))
    summary = (runs.groupby(["op", "impl", "bytes_per_rank", "size"])
               [["avg_power_w", "idle_power_w", "dynamic_energy_per_call_uj", "dynamic_energy_per_byte_pj"]]
               .median().reset_index())
    nccl = summary[summary["impl"] == "nccl"].set_index(["op", "bytes_per_rank"])["dynamic_energy_per_call_uj"]
    summary["energy_vs_nccl"] = [r.dynamic_energy_per_call_uj / nccl.get((r.op, r.bytes_per_rank), float("nan"))
                                 for r in summary.itertuples()]
    return summary.round(3)


def interference_summary(inter: pd.DataFrame) -> pd.DataFrame:
    """Per (compute, option, size) of an interference table (C3's schema): the slowest rank's slowdowns and the
    range of the fraction of ideal over ranks."""
    df = inter.copy()
    df["size"] = df["bytes_per_rank"].map(lambda b: human(int(b)))
    out = (df.groupby(["compute", "option", "bytes_per_rank", "size"])
           .agg(comp_slowdown=("comp_slowdown", "max"), comm_slowdown=("comm_slowdown", "max"),
                fraction_min=("fraction_of_ideal", "min"), fraction_max=("fraction_of_ideal", "max"))
           .reset_index().drop(columns="bytes_per_rank"))
    return out.round(3)


def breakdown_wide(bd: pd.DataFrame) -> pd.DataFrame:
    """Median microseconds per phase (columns) and transfer size (rows)."""
    wide = bd.pivot(index="bytes", columns="phase", values="time_us")
    wide.index = [human(int(b)) for b in wide.index]
    return wide


def breakdown_stack(wide: pd.DataFrame) -> pd.DataFrame:
    """The phases as they add up along one transfer, none negative: issue (the call's start to the engine's start:
    control + schedule, the sum of their medians), copy and sync; and the share of the non-copy phases."""
    out = pd.DataFrame({"issue": wide["control"] + wide["schedule"], "copy": wide["copy"], "sync": wide["sync"]},
                       index=wide.index)
    out["non_copy_share"] = (out["issue"] + out["sync"]) / out.sum(axis=1)
    return out


E2E_KEYS = ["model", "parallel", "layers", "batch", "prompt_len"]


def e2e_ratios(e2e: pd.DataFrame, schedule: str = "serial") -> pd.DataFrame:
    """Per (model, parallelism, batch, prompt) under one schedule: both implementations' TTFT, decode step and
    tokens/s, and NCCL / dma (> 1: dma faster): ttft_speedup, decode_speedup, and throughput_gain (dma / NCCL
    tokens/s); and the same as the pages show them, dmacoll over NCCL: ttft_dma_over_nccl and decode_dma_over_nccl
    (times, < 1: dma faster), tokens_per_s_dma_over_nccl (> 1: dma faster). The schedules side by side:
    ``e2e_tables``."""
    ok = e2e[(e2e["status"] == "ok") & (e2e["schedule"] == schedule)]
    wide = ok.pivot_table(index=E2E_KEYS, columns="impl", values=["ttft_ms", "decode_ms", "decode_tok_s",
                                                                   "e2e_tok_s"])
    summary = pd.DataFrame(index=wide.index)
    for metric in ("ttft_ms", "decode_ms", "decode_tok_s", "e2e_tok_s"):
        for impl in ("nccl", "dma"):
            if (metric, impl) in wide:
                summary[f"{metric}_{impl}"] = wide[(metric, impl)]
    if {"ttft_ms_nccl", "ttft_ms_dma"} <= set(summary):
        summary["ttft_speedup"] = summary["ttft_ms_nccl"] / summary["ttft_ms_dma"]
        summary["decode_speedup"] = summary["decode_ms_nccl"] / summary["decode_ms_dma"]
        summary["throughput_gain"] = summary["e2e_tok_s_dma"] / summary["e2e_tok_s_nccl"]
        summary["ttft_dma_over_nccl"] = summary["ttft_ms_dma"] / summary["ttft_ms_nccl"]
        summary["decode_dma_over_nccl"] = summary["decode_ms_dma"] / summary["decode_ms_nccl"]
        summary["tokens_per_s_dma_over_nccl"] = summary["throughput_gain"]
    return summary.reset_index()


def e2e_overview(e2e: pd.DataFrame) -> pd.DataFrame:
    """dma time over NCCL's (decode step, TTFT) and dma tokens/s over NCCL's: min, median, max over the points;
    and whether every logits check passed."""
    r = e2e_ratios(e2e)
    rows = []
    for what, values in (("decode step time, dma / NCCL", 1 / r["decode_speedup"]),
                         ("TTFT, dma / NCCL", 1 / r["ttft_speedup"]),
                         ("e2e tokens/s, dma / NCCL", r["throughput_gain"])):
        rows.append({"metric": what, "points": len(values), "min": round(float(values.min()), 2),
                     "median": round(float(values.median()), 2), "max": round(float(values.max()), 2)})
    checked = e2e[e2e["logits_ok"].astype(str).isin(["True", "False"])]
    rows.append({"metric": "logits checks passed", "points": len(checked),
                 "min": int((checked["logits_ok"].astype(str) == "True").sum()), "median": "", "max": ""})
    return pd.DataFrame(rows)


def e2e_repeats(e2e: pd.DataFrame) -> pd.DataFrame:
    """Repeated serial runs (``source``: one file per run, ``machines.e2e_default_call_runs``): per world, model, batch
    and metric (decode step, TTFT), dma / NCCL in each run, in run order, and their median, lowest and highest."""
    out = []
    for source, run in e2e.groupby("source", sort=False):
        for _, r in e2e_ratios(run).iterrows():
            for metric, column in (("decode step", "decode_dma_over_nccl"), ("TTFT", "ttft_dma_over_nccl")):
                out.append({"world": int(run["world"].iloc[0]), "model": r["model"], "batch": int(r["batch"]),
                            "metric": metric, "source": source, "ratio": float(r[column])})
    per_run = pd.DataFrame(out, columns=["world", "model", "batch", "metric", "source", "ratio"])
    return (per_run.groupby(["world", "model", "metric", "batch"], sort=True)
            .agg(runs=("ratio", "size"), median=("ratio", "median"), low=("ratio", "min"), high=("ratio", "max"),
                 per_run=("ratio", lambda r: " ".join(f"{x:.2f}" for x in r)))
            .reset_index())


def native_speedup(native: pd.DataFrame) -> pd.DataFrame:
    """Eager dma calls: Python submission's time over the native library's, per (op, variant, signal): median,
    min and max over sizes; and the best native dma time over NCCL's (min-max over sizes)."""
    ok = native[native["ok"]]
    dma = ok[ok["impl"] == "dma"]
    wide = dma.pivot_table(index=["op", "variant", "signal", "bytes_per_rank"], columns="submit", values="time_us")
    ratio = (wide["python"] / wide["native"]).groupby(level=["op", "variant", "signal"])
    out = pd.DataFrame({"python_over_native_median": ratio.median(), "min": ratio.min(), "max": ratio.max()})
    nccl = ok[ok["impl"] == "nccl"].set_index(["op", "bytes_per_rank"])["time_us"]
    best = dma[dma["submit"] == "native"].groupby(["op", "bytes_per_rank"])["time_us"].min()
    vs = (best / nccl.reindex(best.index)).groupby(level="op")
    out = out.reset_index().merge(pd.DataFrame({"native_best_over_nccl_min": vs.min(),
                                                "native_best_over_nccl_max": vs.max()}).reset_index(), on="op")
    return out.round(2)


def flag_latency(flags: pd.DataFrame) -> pd.DataFrame:
    """One flag crossing between two streams of one GPU, per way (empty: the driver refused it)."""
    return flags[["way", "crossing_us", "error"]].fillna("").round(2)


def crossing(rows: pd.DataFrame) -> pd.DataFrame:
    """The crossing probe: per placement, mode, send and wait, the leg time and the crossing (the leg time over the
    same placement and mode's baseline leg), in the probe's order of sends and waits; the baseline rows left out
    (they are every row's base_leg_us). A row without times keeps its note."""
    from ..bench.probes.crossing import MODES, PLACEMENTS, SENDS, WAITS

    pairs = rows[rows["send"] != "none"].copy()
    for column, order in (("placement", PLACEMENTS), ("mode", MODES), ("send", SENDS), ("wait", WAITS)):
        pairs[column] = pd.Categorical(pairs[column], categories=order, ordered=True)
    cols = ["placement", "mode", "send", "wait", "leg_us", "base_leg_us", "crossing_us", "correct", "timeouts", "note"]
    out = pairs.sort_values(["placement", "mode", "send", "wait"])[cols]
    for column in ("placement", "mode", "send", "wait"):
        out[column] = out[column].astype(str)
    for column in ("leg_us", "base_leg_us", "crossing_us"):  # empty where a pair has no times
        out[column] = pd.to_numeric(out[column], errors="coerce").round(2).astype(object)
    return out.fillna("").reset_index(drop=True)


def carveout_effect(sm: pd.DataFrame) -> pd.DataFrame:
    """A device-local copy or a bf16 add next to the GEMMs, per BLAS library and SM setting: its time alone,
    next to the GEMMs, and what the GEMMs took."""
    cols = ["blas", "setting", "green_sms", "carveout", "side", "side_alone_us", "side_us", "gemm_alone_us", "gemm_us"]
    return sm[cols].round(1)


def submit_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Host microseconds to issue k copies, per stream and k (rows) and way (columns); empty where the driver
    refused the way (the legacy stream's batch)."""
    ok = rows[rows["error"].fillna("") == ""]
    table = ok.pivot_table(index=["stream", "copies"], columns="way", values="host_us", aggfunc="first")
    order = [w for w in ("cuMemcpyAsync", "cuMemcpyBatchAsync", "native", "torch") if w in table.columns]
    return table[order].round(2).astype(object).fillna("").reset_index()


def few_sm_best(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per carveout and job: the driver's copy / torch's add next to the GEMM, the best of the few-SM kernels
    (picked after the fact, N configurations), and their ratio."""
    rows = []
    for (carveout, job), df in kernels[kernels["carveout"] != "alone"].groupby(["carveout", "side"]):
        if job in ("driver_copy", "torch_add"):
            continue
        kind = "driver_copy" if "copy" in job else "torch_add"
        ref = kernels[(kernels["carveout"] == carveout) & (kernels["side"] == kind)]["side_us"]
        if ref.empty:
            continue
        best = df["side_us"].min()
        rows.append({"carveout": carveout, "job": job, "reference": kind, "reference_us": round(float(ref.iloc[0]), 1),
                     "best_custom_us": round(float(best), 1), "n": len(df),
                     "speedup": round(float(ref.iloc[0]) / float(best), 2)})
    return pd.DataFrame(rows)


def check_cost(rows: pd.DataFrame) -> pd.DataFrame:
    """Per op and size: an eager call's median time with the cross-rank check off and on (slowest rank), what
    the check adds, and whether every output was right."""
    table = rows.pivot_table(index=["op", "bytes_per_rank", "world", "device"], columns="check_calls",
                             values="time_us", aggfunc="first")
    right = rows.groupby(["op", "bytes_per_rank", "world", "device"])["ok"].all()
    off, on = table[False].round(1), table[True].round(1)
    out = pd.DataFrame({"off_us": off, "on_us": on, "added_us": (on - off).round(1), "correct": right}).reset_index()
    out.insert(1, "size", [human(int(b)) for b in out.pop("bytes_per_rank")])
    return out


def call_cost_structure(after: pd.DataFrame, before: pd.DataFrame) -> pd.DataFrame:
    """`dmacoll probe call_cost`'s structure setting, graph-replayed: per lowering (variant, handshake, signal, wait)
    the time per call at each world, its graph nodes at the largest, the flag crossings on its critical path, and
    the same lowering before this session's changes at the largest world (empty where it was not measured)."""
    def graph(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["setting"] == "structure") & (df["mode"] == "graph") & (df["world"] > 1)]

    keys = ["variant", "handshake", "signal", "wait"]
    now = graph(after)
    table = now.pivot_table(index=keys, columns="world", values="per_call_us", aggfunc="first")
    top = int(now["world"].max())
    table.columns = [f"world {w} (us)" for w in table.columns]
    last = now[now["world"] == top].set_index(keys)
    table[f"nodes at world {top}"] = last["graph_nodes"]
    table["crossings"] = last["crossings"]
    was = graph(before)
    was = was[was["world"] == top].set_index(keys)["per_call_us"]
    table[f"world {top} before (us)"] = was.reindex(table.index)
    return table.round(1).astype(object).fillna("").reset_index()


def call_cost_shared(rows: pd.DataFrame) -> pd.DataFrame:
    """The shared setting (ranks as processes on one GPU): per world, each variant and handshake's time per call and
    its ratio to the floor of its handshake measured in the same run (one peer copy and one crossing with every
    peer for lean, two for full)."""
    shared = rows[rows["setting"] == "shared"]
    floors = {(w, c): t for w, v, t in zip(shared["world"], shared["variant"], shared["per_call_us"])
              for c in (1, 2) if v == f"floor: copy + {c} crossing{'s' if c > 1 else ''}"}
    out = shared[["world", "variant", "handshake", "per_call_us", "per_call_us_p10", "per_call_us_p90"]].copy()
    crossings = out["handshake"].map({"full": 2, "lean": 1})
    out["over its floor"] = [t / floors[(w, c)] if c == c and (w, c) in floors else float("nan")
                             for w, c, t in zip(out["world"], crossings, out["per_call_us"])]
    return out.round(2).astype(object).fillna("").reset_index(drop=True)


def per_run_ratios(rows: pd.DataFrame, impl: str = "default") -> pd.DataFrame:
    """Runs of ``dmacoll probe sm_path`` (NCCL in the same run), one row per run, mode, op and size (bytes per rank)
    that measured both ``impl`` (``default``: ``Communicator()`` with no options; ``dma``: the copy engines) and NCCL,
    in run order (``source``): ``impl`` / NCCL (NaN where its row failed its check or did not run), NCCL's time and
    the path ``impl`` took."""
    out = []
    for source in dict.fromkeys(rows["source"]):
        for (mode, op, size), point in rows[rows["source"] == source].groupby(["mode", "op", "bytes"], sort=True):
            mine, theirs = point[point["impl"] == impl], point[point["impl"] == "nccl"]
            if mine.empty or theirs.empty:
                continue
            ok = str(mine["correct"].iloc[0]) == "True" and pd.notna(mine["per_call_us"].iloc[0])
            nccl = float(theirs["per_call_us"].iloc[0])
            out.append({"source": source, "mode": mode, "op": op, "bytes": int(size), "nccl_us": nccl,
                        "ratio": float(mine["per_call_us"].iloc[0]) / nccl if ok else float("nan"),
                        "path": str(mine["path"].iloc[0])})
    return pd.DataFrame(out, columns=["source", "mode", "op", "bytes", "nccl_us", "ratio", "path"])


def default_call(rows: pd.DataFrame, mode: str = "graph") -> pd.DataFrame:
    """Repeated runs of ``dmacoll probe sm_path`` (``per_run_ratios``): per op and size (bytes per rank),
    NCCL's median time over the runs, ``Communicator()`` / NCCL in each run (run order: ``source``), the data paths
    the default call took and ``#wrong``, its rows that failed their check or did not run."""
    rows = rows[rows["mode"] == mode]
    per_run = per_run_ratios(rows)
    out = []
    for (op, size), point in per_run.groupby(["op", "bytes"], sort=True):
        at = rows[(rows["op"] == op) & (rows["bytes"] == size) & (rows["impl"] == "default")]
        paths = sorted(set(at["path"].dropna().astype(str)) - {""})
        out.append({"op": op, "size": human(int(size)),
                    "NCCL us (median of runs)": round(float(np.median(point["nccl_us"])), 1),
                    "Communicator() / NCCL, per run": " / ".join(
                        "failed" if pd.isna(r) else f"{r:.2f}" for r in point["ratio"]),
                    "path": ", ".join(paths), "#wrong": int(point["ratio"].isna().sum())})
    return pd.DataFrame(out).astype(object)


# The copy engines count as faster than NCCL at a size where the median over runs of their time over NCCL's is below
# this in graph-replayed and eager calls alike: 1% below parity, so a tie (the nccl path's own rows spread 0.95-1.03)
# does not move a call off NCCL
DMA_AUTO_MARGIN = 0.99


def dma_auto_sizes(rows: pd.DataFrame, margin: float = DMA_AUTO_MARGIN) -> pd.DataFrame:
    """Runs of ``dmacoll probe sm_path`` with copy-engine rows (``machines.dma_auto_runs``): per world, op and size
    above the sm path (where the ``default`` rows did not take it), the median over runs of the copy engines' time
    over NCCL's per mode, whether they are faster (below ``margin`` in both modes), and ``from here``: faster here and
    at every larger size measured, which is where 'auto' should take them (``options.DMA_AUTO_MIN_BYTES``, whose
    sizes are the call's input: ``input bytes``)."""
    from ..bench.probes import sm_path

    out = []
    for world, at in rows.groupby("world"):
        on_sm = set(at.loc[(at["impl"] == "default") & (at["path"].astype(str) == "sm"), ["op", "bytes"]]
                    .itertuples(index=False, name=None))
        # a failed copy-engine row, or a mode not measured, counts as slower than any margin
        medians = (per_run_ratios(at, "dma").fillna({"ratio": float("inf")})
                   .groupby(["op", "bytes", "mode"])["ratio"].median().unstack("mode")
                   .reindex(columns=["graph", "eager"]).fillna(float("inf")))
        for (op, size), (graph, eager) in medians.iterrows():
            if (op, size) in on_sm:
                continue
            out.append({"world": int(world), "op": op, "size": int(size),
                        "input bytes": sm_path.shapes(op, int(world), int(size))[0], "graph": float(graph),
                        "eager": float(eager), "faster": graph < margin and eager < margin})
    table = pd.DataFrame(out, columns=["world", "op", "size", "input bytes", "graph", "eager", "faster"])
    # faster here and at every larger size: a reversed running "all"
    table["from here"] = table.groupby(["world", "op"])["faster"].transform(
        lambda f: f[::-1].astype(bool).cummin()[::-1].astype(bool))
    return table


NCCL_TESTS_IMPLS = ("NCCL", "Communicator()", "oracle")


def nccl_tests(sweep: pd.DataFrame, mode: str = "graph", sizes=None) -> pd.DataFrame:
    """One sweep run as nccl-tests prints a run: per op, size (bytes per rank) and place (out of / in place) that
    NCCL ran, each implementation the run measured side by side: NCCL, ``Communicator()`` (its ``dma_default``
    rows; ``path``: the data path its calls took) and the oracle, the fastest copy-engine configuration (``dma``
    rows; ``of N``: how many it was picked from). Time per call (us), algbw and busbw (GB/s, nccl-tests'
    definitions, from the sweep), and ``#wrong``: that implementation's rows at the point whose output check failed
    or that did not run."""
    rows = sweep[sweep["mode"] == mode]
    if sizes is not None:
        rows = rows[rows["bytes_per_rank"].isin(sizes)]
    on_dma = report.on_copy_engines(rows)
    chosen = {"NCCL": rows["impl"] == "nccl", "Communicator()": rows["impl"] == "dma_default",
              "oracle": (rows["impl"] == "dma") & on_dma}
    out = []
    for (op, size, place), point in rows.groupby(["op", "bytes_per_rank", "place"], sort=True):
        if not chosen["NCCL"].loc[point.index].any():
            continue  # a point NCCL did not run (its in-place rows): nothing to compare in the same run
        row = {"op": op, "size": human(int(size)), "place": place}
        for name in NCCL_TESTS_IMPLS:
            sub = point[chosen[name].loc[point.index]]
            if sub.empty:
                continue
            good = sub[sub["ok"]]
            best = good.loc[good["time_us"].idxmin()] if len(good) else None
            row[f"{name} us"] = round(float(best["time_us"]), 1) if best is not None else "none correct"
            row[f"{name} algbw"] = round(float(best["algbw_GBps"]), 2) if best is not None else ""
            row[f"{name} busbw"] = round(float(best["busbw_GBps"]), 2) if best is not None else ""
            row[f"{name} #wrong"] = int((~sub["ok"]).sum())
            if name == "Communicator()":
                row["path"] = str(best["path"]) if best is not None and "path" in best else ""
            if name == "oracle":
                row["of N"] = len(sub)
        out.append(row)
    columns = ["op", "size", "place"] + [c for name in NCCL_TESTS_IMPLS
                                         for c in (f"{name} us", f"{name} algbw", f"{name} busbw", f"{name} #wrong",
                                                   *(("path",) if name == "Communicator()" else ()),
                                                   *(("of N",) if name == "oracle" else ()))]
    table = pd.DataFrame(out)
    table = table.reindex(columns=[c for c in columns if c in table])
    for c in [c for c in table if c.endswith("#wrong") or c == "of N"]:  # counts, not floats beside the gaps
        table[c] = pd.Series([int(v) if pd.notna(v) else v for v in table[c]], index=table.index, dtype=object)
    return table.astype(object).where(table.notna(), "not run")


def default_call_nccl_tests(rows: pd.DataFrame, mode: str = "graph") -> pd.DataFrame:
    """Runs of ``dmacoll probe sm_path`` (``machines.default_call_runs``) as nccl-tests prints a run: per op and size
    (the probe's bytes per rank), the median over the runs of each implementation's time per call, NCCL,
    ``Communicator()`` (its ``default`` rows; ``path``: the data paths it took) and the copy engines with the table's
    choice (``path='dma'``), with nccl-tests' algbw and busbw from that time; ``#wrong``: ``Communicator()``'s rows
    that failed their check or did not run."""
    from ..bench.bandwidth import bandwidths  # nccl-tests' definitions, from the op specs
    from ..bench.probes import sm_path

    rows = rows[rows["mode"] == mode]
    out = []
    for (op, size), point in rows.groupby(["op", "bytes"], sort=True):
        world = int(point["world"].iloc[0])
        nbytes = sm_path.shapes(op, world, int(size))[0]  # the call's input: the sweep's size per rank
        row = {"op": op, "size": human(int(size))}
        for label, impl in (("NCCL", "nccl"), ("Communicator()", "default"), ("copy engines", "dma")):
            mine = point[point["impl"] == impl]
            good = mine[(mine["correct"].astype(str) == "True") & mine["per_call_us"].notna()]
            if good.empty:
                row.update({f"{label} us": "not run", f"{label} busbw": "-"})
                row.update({f"{label} algbw": "-"} if label != "copy engines" else {})
                row.update({"path": "-", "#wrong": len(mine)} if impl == "default" else {})
                continue
            time_us = float(good["per_call_us"].median())
            _, algbw, busbw = bandwidths(op, impl, nbytes, world, time_us)
            row[f"{label} us"] = round(time_us, 1)
            if label != "copy engines":
                row[f"{label} algbw"] = round(algbw, 1)
            row[f"{label} busbw"] = round(busbw, 1)
            if impl == "default":
                row["path"] = "/".join(sorted(set(good["path"].astype(str))))
                row["#wrong"] = len(mine) - len(good)
        out.append(row)
    return pd.DataFrame(out).astype(object)
