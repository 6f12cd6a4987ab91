"""Tables from operator sweeps: dmacoll's configurations against NCCL, DMA-Latte-style feature speedups, targets.

Three dmacoll configurations are reported per (op, mode, size), never mixed (``picks``):

* **default**: what ``Communicator()`` does with no options for an out-of-place call on the copy engines: the
  sweep's ``dma_default`` rows where it measured them (a call with no options; rows whose call took the sm path,
  ``path='sm'``, or NCCL, ``path='nccl'``, are not the papers' DMA collectives and are left out); for sweeps without them, the row of the configuration
  that every 'auto' option takes from the tuning table shipped for the machine (``tuning.find``; the fallback
  without one): the variant, direction, flag signal, wait, prerecording and submission, with the full
  handshake. Where that table was derived from the same sweep, this pick is in-sample (the fastest of the
  promise-free rows of that very sweep): only a measured ``dma_default`` row is a fresh sample;
* **tuned**: ``variant='auto'`` with the shipped table and the options a caller may set without promising
  anything about its data flow (signal, prerecord, submit, in place), the fastest of those N measured rows;
* **oracle**: the fastest of all N measured dma configurations, picked after the fact (the lean handshake
  included, which needs the caller's promise).

Every number printed here is computed from the CSVs it is given.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dmacoll.lab_api import human, options, tuning
from . import load as results

TABLE_SIZES = (1 << 10, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20)


def load(paths: list[str]) -> pd.DataFrame:
    """Sweep CSVs as one table; ``source`` names the file (the run) each row came from."""
    return results.read("operator", paths)


def best(df: pd.DataFrame, impl: str) -> pd.DataFrame:
    """Fastest correct row of ``impl`` per (op, mode, size), with its configuration."""
    sub = df[(df["impl"] == impl) & df["ok"]]
    idx = sub.groupby(["op", "mode", "bytes_per_rank"])["time_us"].idxmin()
    out = sub.loc[idx].reindex(columns=["op", "mode", "bytes_per_rank", "time_us", "time_us_p10", "time_us_p90",
                                        "busbw_GBps", "variant", "direction", "place", "signal", "wait", "prerecord",
                                        "submit", "handshake"])
    return out.set_index(["op", "mode", "bytes_per_rank"])


def ratio_spread(row: pd.Series, base: pd.Series) -> tuple[float, float, float]:
    """``row``'s time over ``base``'s (two rows of a sweep), with the interval their repeats allow: row's p10 over
    base's p90 up to row's p90 over base's p10 (NaN where a sweep recorded no p10/p90)."""
    def t(r: pd.Series, col: str) -> float:
        return float(r.get(col, float("nan")))
    return (t(row, "time_us") / t(base, "time_us"), t(row, "time_us_p10") / t(base, "time_us_p90"),
            t(row, "time_us_p90") / t(base, "time_us_p10"))


KEYS = ["op", "mode", "bytes_per_rank"]
CHOSEN = tuning.Choice._fields  # what 'auto' resolves: variant, direction and tuning.CHOSEN
PICKS = ("default", "tuned", "oracle")


def shipped_table(df: pd.DataFrame):
    """The tuning table ``variant='auto'`` finds on the machine a sweep ran on (None: it falls back to pcpy/push;
    also for a table without provenance)."""
    if "source" not in df:
        return None
    return tuning.find(results.platform(results.provenance(df["source"].iloc[0]), int(df["world"].iloc[0])))


def _table_choice(table, op: str, nbytes: int, mode: str, in_place: bool, allowed: dict) -> tuple:
    from dmacoll.lab_api import ops  # the op specs (torch) only where the analysis needs them

    op = ops.get(op).tuning_op  # all_to_all_v's choice comes from all_to_all's rows, as in the communicator
    choice = table.select(op, nbytes, mode, in_place, allowed) if table else None
    return tuple(choice or options.fallback(allowed))


def auto_choice(dma: pd.DataFrame) -> pd.Series:
    """Per row, whether its (variant, direction) is what ``variant='auto'`` picks for its op, size, mode, place
    and the other options the row fixed."""
    table = shipped_table(dma) if len(dma) else None

    def picked(r) -> bool:
        allowed = {"signal": {r.signal}, "wait": {r.wait}, "prerecord": {r.prerecord}, "submit": {r.submit}}
        return (r.variant, r.direction) == _table_choice(table, r.op, int(r.bytes_per_rank), r.mode, r.place == "in",
                                                         allowed)[:2]
    return pd.Series([picked(r) for r in dma.itertuples()], index=dma.index, dtype=bool)


def default_choice(dma: pd.DataFrame) -> pd.Series:
    """Per row, whether it is the configuration a call with no options takes on the sweep's machine (every 'auto'
    option resolved by the shipped table, out of place, the full handshake), on a cuda engine
    (``options.candidates`` of the cuda engine's capabilities)."""
    table = shipped_table(dma) if len(dma) else None

    def picked(r) -> bool:
        if r.place != "out" or r.handshake != "full":
            return False
        choice = _table_choice(table, r.op, int(r.bytes_per_rank), r.mode, False,
                               options.candidates(options.EngineCapabilities("cuda"), r.mode == "eager"))
        return tuple(getattr(r, name) for name in CHOSEN) == choice
    return pd.Series([picked(r) for r in dma.itertuples()], index=dma.index, dtype=bool)


def fastest(rows: pd.DataFrame) -> pd.DataFrame:
    """The fastest row per (op, mode, size), with ``n``: how many rows it was picked from."""
    if rows.empty:
        return pd.DataFrame(columns=[*KEYS, "time_us", "n"]).set_index(KEYS)
    idx = rows.groupby(KEYS)["time_us"].idxmin()
    out = rows.loc[idx].set_index(KEYS)
    out["n"] = rows.groupby(KEYS).size()
    return out


def on_copy_engines(df: pd.DataFrame) -> pd.Series:
    """The rows whose call ran on the copy engines: the papers' reproduction. A default call that took the sm path or
    NCCL (``path`` 'sm', 'nccl') is not one of its rows."""
    if "path" not in df:
        return pd.Series(True, index=df.index)
    return df["path"].fillna("").isin(("dma", ""))


def picks(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The default, tuned and oracle dma configurations (module docstring), and DMA-Latte's unoptimised
    ``baseline``, per (op, mode, size): the row measured for each, and the N it was picked from."""
    dma = df[(df["impl"] == "dma") & df["ok"]]
    auto = dma[auto_choice(dma)]
    measured = fastest(df[(df["impl"] == "dma_default") & df["ok"] & on_copy_engines(df)]).assign(measured=True)
    derived = fastest(dma[default_choice(dma)]).assign(measured=False)
    default = pd.concat([measured, derived[~derived.index.isin(measured.index)]])
    return {"default": default, "tuned": fastest(auto[auto["handshake"] == "full"]),
            "oracle": fastest(dma), "baseline": fastest(matching(dma, BASELINE))}


def config_label(r) -> str:
    """variant/direction/place, plus the non-default signal, prerecord, submit and handshake choices."""
    extra = (f"/{r['signal']}-signal" if r["signal"] in ("copy", "kernel") else "") + (
        f"/{r['wait']}-wait" if r.get("wait", "memop") in ("spin", "fold") else "") + (
        "/prerecorded" if r["prerecord"] else "") + ("/native" if r.get("submit", "python") == "native" else "") + (
        "/lean" if r.get("handshake", "full") == "lean" else "")
    return f"{r['variant']}/{r['direction']}/{r['place']}{extra}"


def ratio_table(df: pd.DataFrame, sizes=TABLE_SIZES) -> pd.DataFrame:
    """Per (op, mode, size): NCCL's time (and the p10-p90 of its repeats), and each dmacoll configuration's time
    over it with the N it was picked from and its spread (``<pick>_lo``-``<pick>_hi``: ``ratio_spread``); the
    oracle's configuration and what it costs beyond one raw peer copy (the protocol's fixed part)."""
    nccl, ce, floor, p = best(df, "nccl"), best(df, "nccl_ce"), best(df, "peer_copy"), picks(df)
    rows = []
    for key in sorted(k for k in p["oracle"].index if k[2] in sizes and k in nccl.index):
        n = nccl.loc[key]
        row = {"op": key[0], "mode": key[1], "size": human(int(key[2])), "bytes": int(key[2]),
               "nccl_us": round(float(n["time_us"]), 1), "nccl_p10_us": round(float(n["time_us_p10"]), 1),
               "nccl_p90_us": round(float(n["time_us_p90"]), 1),
               "nccl_ce_us": round(float(ce.loc[key, "time_us"]), 1) if key in ce.index else "not run"}
        for name in PICKS:
            got = p[name].loc[key] if key in p[name].index else None
            ratio = ratio_spread(got, n) if got is not None else None
            row[f"{name}_over_nccl"] = round(ratio[0], 2) if got is not None else "not measured"
            row[f"{name}_lo"], row[f"{name}_hi"] = (round(ratio[1], 2), round(ratio[2], 2)) if got is not None \
                else ("", "")
            row[f"{name}_n"] = int(got["n"]) if got is not None else 0
        row["default_measured"] = bool(p["default"].loc[key, "measured"]) if key in p["default"].index else False
        oracle = p["oracle"].loc[key]
        row["oracle_config"] = config_label(oracle)
        row["oracle_minus_peer_copy_us"] = round(float(oracle["time_us"] - floor.loc[key, "time_us"]), 1) \
            if key in floor.index else ""
        rows.append(row)
    return pd.DataFrame(rows)


# DMA-Latte's plain baseline, and each feature as one change to it (PERFORMANCE.md style), and one pair
BASELINE = {"variant": "pcpy", "direction": "push", "place": "out", "signal": "memop", "wait": "memop",
            "prerecord": False, "submit": "python", "handshake": "full"}
FEATURES = {"b2b": {"variant": "b2b"}, "multi": {"variant": "multi"}, "pull": {"direction": "pull"},
            "in_place": {"place": "in"}, "copy_signal": {"signal": "copy"}, "kernel_signal": {"signal": "kernel"},
            "spin_wait": {"wait": "spin"}, "fold_wait": {"wait": "fold"},
            "prerecord": {"prerecord": True}, "native_submit": {"submit": "native"},
            "lean_handshake": {"handshake": "lean"},
            "b2b_prerecord": {"variant": "b2b", "prerecord": True}}  # two changes: DMA-Latte's b2b+PL


def matching(df: pd.DataFrame, config: dict) -> pd.DataFrame:
    """The rows whose columns equal every value of ``config``."""
    for col, value in config.items():
        df = df[df[col] == value]
    return df


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (op, mode, size): time of the plain pcpy baseline over the time with one feature
    switched (> 1: the feature helps), and over the best dma configuration of all. Each ratio
    comes from one run (``source``): where several runs measured a cell, the largest run's
    (the full sweep) is kept; a smaller run fills in only the features it alone measured."""
    runs = sorted(df.groupby("source") if "source" in df else [("", df)], key=lambda sp: -len(sp[1]))
    tables = [_speedup_one_run(part) for _, part in runs]
    out = tables[0]
    for t in tables[1:]:
        out = out.combine_first(t)
    out = out.reset_index().sort_values(["op", "mode", "bytes_per_rank"])
    out.insert(2, "size", out["bytes_per_rank"].map(lambda b: human(int(b))))
    out = out.dropna(axis=1, how="all").round(2)
    return out[["op", "mode", "size", "bytes_per_rank", "pcpy_us", *[c for c in [*FEATURES, "best"] if c in out]]]


def _speedup_one_run(df: pd.DataFrame) -> pd.DataFrame:
    dma = df[(df["impl"] == "dma") & df["ok"]]

    def times(change: dict) -> pd.Series:
        return matching(dma, {**BASELINE, **change}).set_index(["op", "mode", "bytes_per_rank"])["time_us"]

    base = times({})
    out = pd.DataFrame({"pcpy_us": base})
    for name, change in FEATURES.items():
        out[name] = base / times(change)
    out["best"] = base / dma.groupby(["op", "mode", "bytes_per_rank"])["time_us"].min()
    return out


def targets(df: pd.DataFrame) -> list[dict]:
    """Issue 2's done-when checks on the all-gather, graph mode, for the oracle (the best of every measured
    configuration: what the targets were set on)."""
    dma, nccl, floor = best(df, "dma"), best(df, "nccl"), best(df, "peer_copy")
    out = []
    for (op, mode, size), r in dma.iterrows():
        if op != "all_gather" or mode != "graph":
            continue
        if size >= 4 << 20 and (op, mode, size) in nccl.index:
            v = r["time_us"] / nccl.loc[(op, mode, size), "time_us"]
            out.append({"target": "dma <= 0.70 x NCCL", "size": human(int(size)), "value": round(float(v), 3),
                        "pass": bool(v <= 0.70)})
        if size >= 64 << 20 and (op, mode, size) in floor.index:
            v = r["time_us"] / floor.loc[(op, mode, size), "time_us"]
            out.append({"target": "dma <= 1.05 x one peer copy", "size": human(int(size)),
                        "value": round(float(v), 3), "pass": bool(v <= 1.05)})
    return out


def print_provenance(paths: list[str]) -> None:
    """A line per result file with a JSON sidecar: its git sha and GPUs (notebooks say what they render)."""
    for p in paths:
        if results.csv_path(p).with_suffix(".json").exists():
            prov = results.provenance(p)
            print(f"{p}: git {str(prov.get('git_sha'))[:10]}, GPUs {prov.get('hardware', {}).get('gpus')}")


def markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def write_markdown(path: Path, df: pd.DataFrame) -> None:
    """``df`` as a Markdown table in ``path`` (beside a page's CSV). Returns nothing: as a notebook cell's last line
    it prints nothing (``write_text``'s character count was the stray number on the pages)."""
    Path(path).write_text(markdown(df) + "\n")


def save_table(df: pd.DataFrame, outdir: Path, name: str) -> pd.DataFrame:
    """A page's table as ``name``.csv and ``name``.md in ``outdir``; returns ``df`` (to show it too)."""
    df.to_csv(Path(outdir) / f"{name}.csv", index=False)
    write_markdown(Path(outdir) / f"{name}.md", df)
    return df


def source_line(paths: list[str], root: Path = Path(".")) -> str:
    """Where a table's numbers come from: the files, and the code and machine their provenance names."""
    provs = [results.provenance(root / p) for p in paths]
    prov = provs[0]
    hw, sw = prov.get("hardware", {}), prov.get("software", {})
    gpus = hw.get("gpus", [])
    machine = f"{len(gpus)}x {', '.join(sorted(set(gpus)))}" if gpus else "no GPU recorded"
    where = ("Measured on NVIDIA Hopper, not the papers' MI300X." if gpus else
             f"Measured on the host emulator ({hw.get('cpu_count')} CPUs), no GPU.")
    made = made_by([p.get("env", {}).get("DMACOLL_WORKFLOW_RULE") for p in provs])
    codes = list(dict.fromkeys(str(p.get("git_sha"))[:10] for p in provs))  # every code the runs ran, in order
    return (f"Source: {', '.join(f'`{p}`' for p in paths)} (code {', '.join(codes)}, {machine}, "
            f"torch {sw.get('torch')}, NCCL {sw.get('nccl')}). {where} {made}")


def made_by(rules: list) -> str:
    """What made a table's runs, from each run's ``DMACOLL_WORKFLOW_RULE`` (None: its provenance names no rule, as
    for runs made before the rules exported it; its ``data.json`` names the command): the rules, or how many runs
    name none."""
    named = list(dict.fromkeys(r for r in rules if r))
    plural = "s" if len(named) > 1 else ""
    ticks = ", ".join(f"`{r}`" for r in named)
    if not named:
        return "No Snakemake rule named in the runs' provenance (each run's command is in its data.json)."
    if all(rules):
        return f"Snakemake rule{plural}: {ticks}."
    return (f"Snakemake rule{plural} {ticks} made {sum(map(bool, rules))} of {len(rules)} runs; the others name none "
            "(each run's command is in its data.json).")


def failures_line(df: pd.DataFrame) -> str:
    fails, wrong = int((df["status"] != "ok").sum()), int(((df["status"] == "ok") & ~df["ok"]).sum())
    return (f"Points that failed to run: {fails}; points with a wrong output: {wrong}. Time per call, slowest rank, "
            "median of repeats; bytes per rank.")


def table(paths: list[str], sizes=TABLE_SIZES) -> str:
    """`dmacoll report table`: the ratio table of some sweeps, with their provenance and what failed."""
    df = load(paths)
    return (source_line(paths) + "\n\n" + markdown(ratio_table(df, sizes).drop(columns=["bytes"])) + "\n\n" +
            failures_line(df))
