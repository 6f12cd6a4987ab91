"""Tables come from the committed results, and the README's table is current."""
import math
from pathlib import Path

import pandas as pd
import pytest

from dmacoll_lab.analysis import report
from dmacoll_lab.bench.sweep import COLUMNS, SweepConfig, merge, Point, points
from dmacoll_lab.bench.harness import summarize
from dmacoll.sizes import parse_size

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "results/h200x2/operator"
SWEEPS = [str(REF / "sweep_all_gather/data.csv"), str(REF / "sweep_all_to_all/data.csv")]
CSVS = SWEEPS + [str(REF / "nccl_ce/data.csv")]


def test_reference_results_have_provenance_and_all_columns():
    x4 = ROOT / "results/h200x4/operator"
    for csv in CSVS + [str(x4 / run / "data.csv") for run in ("sweep_all_gather", "sweep_all_to_all", "nccl_ce")]:
        df = pd.read_csv(csv)
        # in order; `submit`, `handshake`, `wait`, `path` came later and report.load fills in their defaults for
        # older sweeps
        assert list(df.columns) == [c for c in COLUMNS if c in df.columns]
        assert set(COLUMNS) - set(df.columns) <= {"submit", "handshake", "wait", "path"}
        side = Path(csv).with_suffix(".json")
        assert side.exists()
        text = side.read_text()
        for key in ('"git_sha"', '"torch"', '"nccl"', '"topology"', '"gpus"', '"command"'):
            assert key in text


def test_picks_lead_with_what_communicator_does_by_default():
    """default: Communicator()'s options and the shipped table's variant; tuned: the table's variant with
    promise-free options; oracle: every configuration. Each picks the fastest of its N rows."""
    from dmacoll import tuning

    df = report.load(CSVS)
    p = report.picks(df)
    key = ("all_gather", "graph", 4 << 10)
    table = tuning.find(tuning.Platform("NVIDIA H200", 2, "nvlink"))
    # what every 'auto' option resolves to in a captured call on a cuda engine (no prerecording, no native)
    choice = table.select("all_gather", 4 << 10, "graph", False, {"signal": {"memop", "copy"}, "prerecord": {False},
                                                                  "submit": {"python"}})
    default = p["default"].loc[key]
    assert tuple(default[list(report.CHOSEN)]) == tuple(choice)
    assert (default["place"], default["handshake"], default["n"]) == ("out", "full", 1)
    dma = df[(df["impl"] == "dma") & df["ok"]].set_index(report.KEYS).loc[key]
    assert p["oracle"].loc[key, "n"] == len(dma) and p["oracle"].loc[key, "time_us"] == dma["time_us"].min()
    assert p["oracle"].loc[key, "time_us"] <= p["tuned"].loc[key, "time_us"] <= p["default"].loc[key, "time_us"]
    assert p["tuned"].loc[key, "handshake"] == "full" and 1 < p["tuned"].loc[key, "n"] < p["oracle"].loc[key, "n"]
    ratio = report.ratio_table(df).set_index(["op", "mode", "bytes"])
    assert ratio.loc[("all_gather", "graph", 4 << 10), "default_over_nccl"] == round(
        default["time_us"] / report.best(df, "nccl").loc[key, "time_us"], 2)


def test_every_reference_point_is_correct_or_explained():
    df = report.load(CSVS)
    ok = df[df["status"] == "ok"]
    assert ok["ok"].all(), ok[~ok["ok"]].head()
    failed = df[df["status"] != "ok"]
    assert (failed["error"].str.len() > 0).all()


def test_speedup_table_switches_one_feature_at_a_time():
    df = report.load(SWEEPS)
    table = report.speedup_table(df).set_index(["op", "mode", "bytes_per_rank"])
    dma = df[(df["impl"] == "dma") & df["ok"]]
    key = ("all_gather", "graph", 1 << 20)
    pick = lambda **kw: dma[(dma[list(kw)] == pd.Series(kw)).all(axis=1)]  # noqa: E731
    base = pick(op=key[0], mode=key[1], bytes_per_rank=key[2], variant="pcpy", direction="push", place="out",
                signal="memop", prerecord=False, handshake="full")["time_us"].item()
    b2b = pick(op=key[0], mode=key[1], bytes_per_rank=key[2], variant="b2b", direction="push", place="out",
               signal="memop", prerecord=False, handshake="full")["time_us"].item()
    assert table.loc[key, "pcpy_us"] == round(base, 2)
    assert table.loc[key, "b2b"] == round(base / b2b, 2)
    measured = [f for f in report.FEATURES if f in table]  # features a sweep did not measure have no column
    assert table.loc[key, "best"] >= max(table.loc[key, measured].dropna()) - 0.01
    assert "prerecord" not in table.loc[("all_gather", "graph")].dropna(axis=1).columns  # graphs: nothing to prerecord


def test_ratio_table_picks_fastest_correct_dma():
    rows = []
    for impl, variant, t in (("nccl", "", 10.0), ("dma", "pcpy", 8.0), ("dma", "b2b", 6.0)):
        rows.append({"op": "all_gather", "impl": impl, "variant": variant, "direction": "push", "place": "out",
                     "signal": "memop", "wait": "memop", "prerecord": False, "submit": "python", "handshake": "full",
                     "mode": "graph", "bytes_per_rank": 4096, "time_us": t, "busbw_GBps": 1.0, "status": "ok", "correct": True,
                     "error": ""})
    rows.append({**rows[-1], "variant": "multi", "time_us": 1.0, "correct": False})  # wrong: never picked
    rows[1]["signal"] = "copy"  # the fallback's flags
    df = pd.DataFrame(rows)
    df["ok"] = df["correct"]
    table = report.ratio_table(df, sizes=(4096,))  # no provenance, no table: the fallback (pcpy/push, copy flags)
    assert table.loc[0, "default_over_nccl"] == 0.8 and table.loc[0, "default_n"] == 1
    assert table.loc[0, "oracle_over_nccl"] == 0.6 and table.loc[0, "oracle_n"] == 2  # the wrong row never counts
    assert table.loc[0, "oracle_config"] == "b2b/push/out"


def test_merge_reports_the_slowest_rank_and_bandwidth():
    cfg = SweepConfig()
    ranks = [{"status": "ok", "error": "", "time_us": 10.0, "time_us_p10": 9.0, "time_us_p90": 11.0, "correct": True},
             {"status": "ok", "error": "", "time_us": 20.0, "time_us_p10": 19.0, "time_us_p90": 21.0, "correct": True}]
    row = merge(ranks, cfg, Point("all_gather", "dma"), 1 << 20, "graph", 2)
    assert row["time_us"] == 20.0 and row["total_bytes"] == 2 << 20
    assert math.isclose(row["algbw_GBps"], (2 << 20) / 20e-6 / 1e9)
    assert math.isclose(row["busbw_GBps"], row["algbw_GBps"] / 2)
    ranks[1] = {**ranks[1], "status": "failed", "error": "boom"}
    assert merge(ranks, cfg, Point("all_gather", "dma"), 1 << 20, "graph", 2)["status"] == "failed"


def test_sweep_points_and_sizes():
    cfg = SweepConfig(min_bytes=1024, max_bytes=8192)
    assert cfg.sizes() == [1024, 2048, 4096, 8192]
    ag = points(cfg, "all_gather", 2)
    a2a = points(cfg, "all_to_all", 2)
    assert any(p.impl == "symm_mem_lc" for p in ag) and not any(p.impl == "symm_mem_lc" for p in a2a)
    assert not any(p.place == "in" for p in a2a)
    assert {p.handshake for p in ag} == {"full"}
    lean = SweepConfig(handshakes=("full", "lean"), prerecord=(False, True))
    dma = [p for p in points(lean, "all_gather", 2) if p.impl == "dma"]
    assert {(p.direction, p.prerecord) for p in dma if p.handshake == "lean"} == {("push", False)}
    assert len([p for p in dma if p.handshake == "full"]) == len([p for p in points(
        SweepConfig(prerecord=(False, True)), "all_gather", 2) if p.impl == "dma"])


def test_summarize_and_parse_size():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == {"time_us": 3.0, "time_us_p10": 1.0, "time_us_p90": 5.0}
    assert parse_size("256M") == 256 << 20 and parse_size("1K") == 1024 and parse_size("4096") == 4096
    with pytest.raises(Exception):
        parse_size("big")


def test_claims_report_each_configuration_and_the_worst_of_several_runs():
    from dmacoll_lab.analysis import c3_rules as h
    from dmacoll_lab.analysis import claims

    c3 = str(ROOT / "results/h200x2/c3/c3/data.csv")
    rows = {(r["id"], r["configuration"]): r for r in claims.evaluate(CSVS, c3_csvs=[c3])}
    assert {c for i, c in rows if i == "dmalatte-ag-large"} == {"default", "tuned", "oracle"}
    assert rows[("dmalatte-ag-small-slow", "pcpy")]["n"] == 1
    oracle, default = rows[("conccl-c3-dma", "oracle")], rows[("conccl-c3-dma", "default")]
    coll = h.collapse(h.load([c3]))
    assert coll["fraction_of_ideal"].max() <= 1 < coll["fraction_of_ideal_raw"].max()  # clipped, and said so
    # default, tuned and oracle on the same scenarios: the shapes the rule was not learned on
    feats, _ = h.scenarios(coll)
    held = coll[coll.set_index(h.KEYS).index.isin(feats.index[h.held_out(feats)])]
    means = held[held["strategy"].str.startswith("dma")].groupby("option")["fraction_of_ideal"].mean()
    assert oracle["reproduced"] == round(means.max(), 3) and oracle["n"] == len(means) >= default["reproduced"]
    assert default["reproduced"] == round(means["dma"], 3)
    n_held = len(feats.index[h.held_out(feats)])
    for config in ("default", "tuned", "oracle"):
        assert f"{n_held} held-out scenarios" in rows[("conccl-c3-dma", config)]["note"]
    assert "clipped" in default["note"] and "rule learned" in rows[("conccl-c3-dma", "tuned")]["note"]
    assert rows[("dmalatte-power-large", "default")]["status"] == "not run"  # no power CSV given
    # two runs: the worse decides, the range over runs is stated and is the spread
    twice = {(r["id"], r["configuration"]): r for r in claims.evaluate(CSVS, c3_csvs=[c3, c3])}
    again = twice[("conccl-c3-dma", "default")]
    value = default["reproduced"]
    assert again["runs"] == 2 and again["reproduced"] == value and again["over runs"] == f"{value:g}-{value:g}"
    assert again["spread"] == f"{value:g}-{value:g}"
    assert {(r["id"], r["configuration"]): r for r in claims.evaluate(CSVS)}[("conccl-c3-dma", "default")][
        "status"] == "not run"


def test_the_worst_run_decides_a_claim():
    c = __import__("dmacoll_lab.analysis.claims", fromlist=["CLAIMS"]).CLAIMS
    upper = next(x for x in c if x.test[0] == "<=")
    lower = next(x for x in c if x.test[0] == ">=")
    assert upper.worst([0.9, 1.2]) == 1.2 and lower.worst([0.6, 0.8]) == 0.6


def test_a_measured_no_options_call_is_the_default_where_a_sweep_has_one():
    rows = []
    for impl, variant, t in (("nccl", "", 10.0), ("dma_default", "b2b", 9.0), ("dma", "pcpy", 8.0),
                             ("dma", "b2b", 6.0)):
        rows.append({"op": "all_gather", "impl": impl, "variant": variant, "direction": "push", "place": "out",
                     "signal": "memop", "wait": "memop", "prerecord": False, "submit": "python", "handshake": "full", "mode": "graph",
                     "bytes_per_rank": 4096, "time_us": t, "busbw_GBps": 1.0, "status": "ok", "correct": True,
                     "error": "", "ok": True})
    p = report.picks(pd.DataFrame(rows))
    key = ("all_gather", "graph", 4096)
    assert p["default"].loc[key, "time_us"] == 9.0 and p["default"].loc[key, "impl"] == "dma_default"
    assert p["oracle"].loc[key, "time_us"] == 6.0  # the oracle picks among the configurations, not the default row


def test_a_default_call_on_the_sm_path_is_not_the_copy_engines_default():
    """Issue 49: the report's default is the papers' DMA reproduction; a no-options call that took the sm path
    (``path`` column 'sm') is not one of its rows."""
    rows = []
    for impl, variant, path, t in (("nccl", "", "", 10.0), ("dma_default", "b2b", "sm", 4.0),
                                   ("dma", "b2b", "dma", 6.0)):
        rows.append({"op": "all_gather", "impl": impl, "variant": variant, "direction": "push", "place": "out",
                     "signal": "memop", "wait": "memop", "prerecord": False, "submit": "python", "handshake": "full",
                     "path": path, "mode": "graph", "bytes_per_rank": 4096, "time_us": t, "busbw_GBps": 1.0,
                     "status": "ok", "correct": True, "error": "", "ok": True})
    default = report.picks(pd.DataFrame(rows))["default"]
    assert not default["measured"].any() and (default["time_us"] != 4.0).all()


def test_e2e_and_ficco_claims_are_scored_from_their_runs():
    """Issue 52: the end-to-end and FiCCO claims are claims like the others (counted on the index): each the best
    point of its run, the same number the pages compute another way."""
    from dmacoll_lab.analysis import claims, ficco_rules, tables
    from dmacoll_lab.analysis import load as results

    d = ROOT / "results/h200x4"
    e2e, ficco = str(d / "e2e/e2e/data.csv"), str(d / "ficco/ficco/data.csv")
    scored = claims.evaluate(SWEEPS, e2e_csvs=[e2e], ficco_csvs=[ficco])
    rows = {r["id"]: r for r in scored if r["configuration"] != "tuned"}
    assert {r["status"] for r in scored if r["configuration"] == "tuned" and r["id"].startswith("dmalatte-e2e")} \
        == {"not run"}  # a run without phased rows
    ratios = tables.e2e_ratios(results.read("e2e", [e2e]))
    assert rows["dmalatte-e2e-decode"]["reproduced"] == round(ratios["decode_dma_over_nccl"].min(), 3)
    assert rows["dmalatte-e2e-ttft"]["reproduced"] == round(ratios["ttft_dma_over_nccl"].min(), 3)
    assert rows["dmalatte-e2e-throughput"]["reproduced"] == round(ratios["tokens_per_s_dma_over_nccl"].max(), 3)
    coll = ficco_rules.collapse(ficco_rules.load([ficco]))
    decomposed = coll[coll["option"].str.startswith("dma") & (coll["pieces"] > 1)]
    assert rows["ficco-speedup"]["reproduced"] == round(decomposed["speedup_vs_nccl_serial"].max(), 3)
    for claim_id in ("dmalatte-e2e-decode", "dmalatte-e2e-ttft", "dmalatte-e2e-throughput", "ficco-speedup"):
        assert rows[claim_id]["status"] in ("pass", "within noise", "fail"), claim_id
    without = {r["id"]: r["status"] for r in claims.evaluate(SWEEPS)}
    assert without["dmalatte-e2e-decode"] == without["ficco-speedup"] == "not run"


def test_the_e2e_claims_score_the_schedule_per_phase_as_tuned():
    """tuned: the benchmark's ``phased`` rows (its schedule per phase, chosen in-sample) against NCCL serial, the
    same best point the phased table gives (TTFT and throughput; its decode step is the serial one); default stays
    dmacoll's serial schedule."""
    from dmacoll_lab.analysis import claims, e2e_tables, tables
    from dmacoll_lab.analysis import load as results

    csv = str(ROOT / "results/h200x4/e2e/phased_tp4_llama-3.1-8b_run1/data.csv")
    rows = {(r["id"], r["configuration"]): r for r in claims.evaluate(SWEEPS, e2e_csvs=[csv])}
    e2e = results.read("e2e", [csv])
    ours = e2e_tables.phased(e2e)
    ttft = rows["dmalatte-e2e-ttft", "tuned"]
    assert ("dmalatte-e2e-decode", "tuned") not in rows  # a phased decode step is the serial one
    assert ttft["reproduced"] == round(ours["ttft_dma_over_nccl"].min(), 3) and "in-sample" in ttft["note"]
    assert rows["dmalatte-e2e-throughput", "tuned"]["reproduced"] == round(ours["tok_s_dma_over_nccl"].max(), 3)
    serial = tables.e2e_ratios(e2e)
    assert rows["dmalatte-e2e-decode", "default"]["reproduced"] == round(serial["decode_dma_over_nccl"].min(), 3)


def test_nccl_tests_table_compares_one_run_and_counts_wrong_rows():
    from dmacoll_lab.analysis import tables

    def row(impl, place, time, ok=True, path="", variant=""):
        return {"op": "all_gather", "impl": impl, "variant": variant, "place": place, "path": path, "mode": "graph",
                "bytes_per_rank": 4096, "time_us": time, "algbw_GBps": 8192 / time / 1e3,
                "busbw_GBps": 4096 / time / 1e3, "ok": ok}
    sweep = pd.DataFrame([row("nccl", "out", 10.0), row("dma_default", "out", 8.0, path="sm"),
                          row("dma", "out", 15.0, variant="pcpy"), row("dma", "out", 12.0, variant="b2b"),
                          row("dma", "out", 5.0, ok=False, variant="multi"),  # wrong: never the best, counted
                          row("dma", "out", 9.0, path="sm", variant="auto"),  # an sm row: not a copy-engine one
                          row("dma", "in", 7.0, variant="pcpy")])  # NCCL ran no in-place point: left out
    t = tables.nccl_tests(sweep)
    assert len(t) == 1
    r = t.iloc[0]
    assert (r["size"], r["place"], r["NCCL us"], r["Communicator() us"], r["path"]) == ("4 KB", "out", 10.0, 8.0, "sm")
    assert (r["oracle us"], r["oracle #wrong"], r["of N"], r["NCCL #wrong"]) == (12.0, 1, 3, 0)
    assert r["oracle busbw"] == round(4096 / 12.0 / 1e3, 2)
    alone = tables.nccl_tests(sweep[sweep["impl"] != "dma_default"])
    assert "Communicator() us" not in alone and "path" not in alone  # a run without it shows no such columns


def test_default_call_table_gives_each_run_its_ratio_and_counts_refusals():
    from dmacoll_lab.analysis import tables

    def row(source, impl, us, path="", correct="True", mode="graph", size=1024):
        return {"source": source, "op": "all_reduce", "impl": impl, "mode": mode, "bytes": size, "per_call_us": us,
                "path": path, "correct": correct}
    rows = pd.DataFrame([row("a", "nccl", 8.0), row("a", "default", 4.0, "sm"),
                         row("b", "nccl", 10.0), row("b", "default", 6.0, "sm"),
                         row("a", "nccl", 90.0, size=1 << 24), row("a", "default", float("nan"), "dma", "False",
                                                                   size=1 << 24),
                         row("a", "nccl", 40.0, mode="eager"), row("a", "default", 30.0, "sm", mode="eager")])
    t = tables.default_call(rows)
    small, large = t.iloc[0], t.iloc[1]
    assert small["Communicator() / NCCL, per run"] == "0.50 / 0.60" and small["path"] == "sm"
    assert small["NCCL us (median of runs)"] == 9.0 and small["#wrong"] == 0
    assert large["Communicator() / NCCL, per run"] == "failed" and large["#wrong"] == 1 and large["path"] == "dma"
    assert tables.default_call(rows, "eager").iloc[0]["Communicator() / NCCL, per run"] == "0.75"


def test_default_call_as_nccl_tests_takes_the_median_of_the_runs_and_nccl_tests_bandwidths():
    from dmacoll_lab.analysis import tables

    def row(source, op, impl, us, path="", correct="True", size=1 << 20):
        return {"source": source, "world": 2, "op": op, "impl": impl, "mode": "graph", "bytes": size,
                "per_call_us": us, "path": path, "correct": correct}
    rows = pd.DataFrame([row("a", "all_gather", "nccl", 10.0), row("b", "all_gather", "nccl", 30.0),
                         row("c", "all_gather", "nccl", 20.0), row("a", "all_gather", "default", 8.0, "sm"),
                         row("a", "all_gather", "dma", float("nan"), "dma", "False"),
                         row("a", "reduce_scatter", "nccl", 10.0), row("a", "reduce_scatter", "default", 5.0, "nccl")])
    t = tables.default_call_nccl_tests(rows).set_index("op")
    gather, scatter = t.loc["all_gather"], t.loc["reduce_scatter"]
    # nccl-tests: all_gather's size is its output (2 MB at 1 MB per rank), busbw = algbw x (n - 1) / n
    assert gather["NCCL us"] == 20.0 and gather["NCCL algbw"] == round(2 * (1 << 20) / 20e-6 / 1e9, 1)
    assert gather["NCCL busbw"] == round(2 * (1 << 20) / 20e-6 / 1e9 / 2, 1)
    assert gather["Communicator() us"] == 8.0 and gather["path"] == "sm" and gather["#wrong"] == 0
    assert gather["copy engines us"] == "not run" and gather["copy engines busbw"] == "-"
    # the probe counts reduce_scatter by its chunk: the input nccl-tests counts is two chunks at two ranks
    assert scatter["Communicator() algbw"] == round(2 * (1 << 20) / 5e-6 / 1e9, 1) and scatter["path"] == "nccl"


def test_dma_auto_sizes_take_the_copy_engines_only_from_a_size_they_win_at_and_above():
    from dmacoll_lab.analysis import tables

    def point(size, dma_graph, dma_eager, default_path="nccl", source="a", dma_correct="True"):
        rows = []
        for mode, dma in (("graph", dma_graph), ("eager", dma_eager)):
            rows += [{"source": source, "world": 4, "op": "all_gather", "mode": mode, "bytes": size, **r}
                     for r in ({"impl": "nccl", "per_call_us": 100.0, "path": "", "correct": "True"},
                               {"impl": "dma", "per_call_us": dma, "path": "dma", "correct": dma_correct},
                               {"impl": "default", "per_call_us": 99.0, "path": default_path, "correct": "True"})]
        return rows
    rows = pd.DataFrame(point(1 << 20, 50.0, 50.0, "sm")  # on the sm path: not the rule's
                        + point(2 << 20, 90.0, 90.0) + point(4 << 20, 99.5, 80.0)  # a tie in one mode is no win
                        + point(8 << 20, 90.0, 90.0) + point(16 << 20, 90.0, 90.0, source="a")
                        + point(16 << 20, 95.0, 95.0, source="b") + point(16 << 20, 200.0, 1.0, source="c",
                                                                          dma_correct="False"))
    t = tables.dma_auto_sizes(rows).set_index("size")
    assert list(t.index) == [2 << 20, 4 << 20, 8 << 20, 16 << 20]
    assert list(t["faster"]) == [True, False, True, True]  # 16 MB: median of 0.90, 0.95 and a failed run (inf)
    assert list(t["from here"]) == [False, False, True, True]
    assert t.loc[16 << 20, "graph"] == 0.95


def test_auto_takes_the_copy_engines_exactly_where_the_committed_runs_say_they_win():
    """options.DMA_AUTO_MIN_BYTES against the runs that set it (machines.DMA_AUTO_RUNS): at every size measured above
    the sm path, 'auto' leaves NCCL for the copy engines where, and only where, they were faster there and at every
    larger size."""
    from dmacoll.options import nccl_auto
    from dmacoll_lab.analysis import load, machines, tables

    for machine in machines.DMA_AUTO_RUNS:
        runs = machines.dma_auto_runs(ROOT / "results" / machine)
        assert len(runs) >= 6, machine
        table = tables.dma_auto_sizes(load.read("probe", runs))
        assert not table.empty
        for r in table.to_dict("records"):
            assert nccl_auto(r["world"], r["op"], r["input bytes"]) == (not r["from here"]), (machine, r)


def test_e2e_repeats_give_each_run_its_ratio_and_the_range_over_runs():
    from dmacoll_lab.analysis import tables

    def run(source, dma_decode, dma_ttft):
        return [{"source": source, "model": "m", "parallel": "tp2", "layers": 4, "batch": 8, "prompt_len": 512,
                 "world": 2, "schedule": "serial", "status": "ok", "impl": impl, "decode_ms": d, "ttft_ms": t,
                 "decode_tok_s": 1.0, "e2e_tok_s": 1.0}
                for impl, d, t in (("nccl", 1.0, 10.0), ("dma", dma_decode, dma_ttft))]
    rows = pd.DataFrame(run("b", 0.9, 12.0) + run("a", 0.8, 9.0) + run("c", 1.1, 10.0))
    t = tables.e2e_repeats(rows).set_index("metric")
    decode, ttft = t.loc["decode step"], t.loc["TTFT"]
    assert decode["runs"] == 3 and decode["median"] == pytest.approx(0.9)
    assert (decode["low"], decode["high"]) == (pytest.approx(0.8), pytest.approx(1.1))
    assert decode["per_run"] == "0.90 0.80 1.10"  # in the order the runs were given
    assert ttft["median"] == pytest.approx(1.0) and ttft["high"] == pytest.approx(1.2)


def test_a_source_line_names_the_snakemake_rule_that_made_its_runs(tmp_path):
    import json

    from dmacoll_lab.analysis.report import source_line

    def run(name, env):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.csv").write_text("x\n1\n")
        (tmp_path / name / "data.json").write_text(json.dumps({"git_sha": "abc1234", "env": env}))
        return f"{name}/data.csv"

    ruled = [run("a", {"DMACOLL_WORKFLOW_RULE": "default_call"}), run("b", {"DMACOLL_WORKFLOW_RULE": "default_call"})]
    assert source_line(ruled, tmp_path).endswith("Snakemake rule: `default_call`.")
    mixed = ruled + [run("c", {})]  # a run made by a script: how many the rule made
    assert source_line(mixed, tmp_path).endswith("Snakemake rule `default_call` made 2 of 3 runs; the others name "
                                                 "none (each run's command is in its data.json).")
    assert source_line(mixed[2:], tmp_path).endswith("No Snakemake rule named in the runs' provenance (each run's "
                                                     "command is in its data.json).")
    (tmp_path / "c" / "data.json").write_text(json.dumps({"git_sha": "def5678"}))  # runs of two codes: both named
    assert "(code abc1234, def5678, " in source_line(mixed, tmp_path)


def test_e2e_claims_over_several_runs_take_each_points_median_before_the_best_point():
    """Issue 50: a machine's e2e claims rest on its repeated runs of the default call (``machines.E2E_CLAIM_RUNS``):
    each point's dma/NCCL ratio is the median over the runs that measured it, the best point is taken from those
    medians, and its range over the runs is the spread that decides 'within noise'."""
    from dmacoll_lab.analysis import claims, machines, tables
    from dmacoll_lab.analysis import load as results

    csvs = machines.e2e_claim_runs(ROOT / "results/h200x2")
    assert len(csvs) >= 6 and all("/e2e/phased_tp2_" in c for c in csvs), csvs
    rows = {r["id"]: r for r in claims.evaluate(SWEEPS, e2e_csvs=csvs)}
    per_run = pd.concat([tables.e2e_ratios(results.read("e2e", [c])).assign(run=i) for i, c in enumerate(csvs)])
    keys = [k for k in tables.E2E_KEYS if k in per_run]
    for claim_id, column, best in (("dmalatte-e2e-decode", "decode_dma_over_nccl", "min"),
                                   ("dmalatte-e2e-ttft", "ttft_dma_over_nccl", "min"),
                                   ("dmalatte-e2e-throughput", "tokens_per_s_dma_over_nccl", "max")):
        medians = per_run.groupby(keys)[column].median()
        at = getattr(medians, f"idx{best}")()
        over = per_run.set_index(keys).loc[at, column]
        row = rows[claim_id]
        assert row["reproduced"] == round(getattr(medians, best)(), 3), (claim_id, row)
        assert row["runs"] == len(over) >= 2 and row["over runs"] == claims._fmt(round(over.min(), 3),
                                                                                 round(over.max(), 3)), row
        assert "one run" not in row["note"] and f"the median of {len(over)} runs" in row["note"], row
    one = {r["id"]: r for r in claims.evaluate(SWEEPS, e2e_csvs=csvs[:1])}["dmalatte-e2e-decode"]
    assert one["runs"] == 1 and "one run" in one["note"], one


def test_vllm_claims_score_the_plugin_against_vllm_over_runs():
    """DMA-Latte's comparison itself: vLLM with the plugin on over off, from a machine's runs of the default route
    (``machines.VLLM_CLAIM_RUNS``): the ratio per round (``_r<n>`` in a run's source; else one round), per point the
    median over every run's rounds, the spread their range."""
    import re

    from dmacoll_lab.analysis import claims, machines

    for machine in ("h200x2", "h200x4"):
        csvs = machines.vllm_claim_runs(ROOT / "results" / machine)
        assert csvs and not any("route_all" in c for c in csvs), csvs
        rows = {r["id"]: r for r in claims.evaluate(SWEEPS, vllm_csvs=csvs)}
        for claim_id, metric in (("dmalatte-vllm-latency", "latency_avg"),
                                 ("dmalatte-vllm-throughput", "output_tokens_per_s")):
            per_point: dict[tuple, list[float]] = {}
            for c in csvs:
                df = pd.read_csv(c)  # its own source column: the vLLM JSON each row came from
                df = df[df["metric"] == metric]
                rounds = df["source"].map(lambda s: (re.findall(r"_r(\d+)\.json$", s) or ["1"])[0])
                for (tp, batch, n), g in df.groupby([df["tp"], df["batch"].fillna(0), rounds]):
                    m = g.groupby("plugin")["value"].median()
                    per_point.setdefault((tp, batch), []).append(m["dma"] / m["vllm"])
            pick = min if metric == "latency_avg" else max
            point = pick(per_point, key=lambda k: pd.Series(per_point[k]).median())
            ratios = per_point[point]
            row = rows[claim_id]
            assert row["runs"] == len(ratios) >= 2, (machine, row, ratios)
            assert row["reproduced"] == round(float(pd.Series(ratios).median()), 3), (row, ratios)
            assert row["over runs"] == claims._fmt(round(min(ratios), 3), round(max(ratios), 3)), row
            assert row["status"] in ("pass", "fail", "within noise"), row
    assert {r["id"]: r for r in claims.evaluate(SWEEPS)}["dmalatte-vllm-latency"]["status"] == "not run"


def test_the_headline_shows_graph_replays_where_measured_else_eager():
    """The host emulator's sweeps have eager calls alone: its headline is theirs, not an empty graph figure."""
    from dmacoll_lab.analysis import figures

    assert figures.headline_mode(pd.DataFrame({"mode": ["eager", "graph"]})) == "graph"
    assert figures.headline_mode(pd.DataFrame({"mode": ["eager", "eager"]})) == "eager"
