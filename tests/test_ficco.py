"""FiCCO grid arithmetic, the schedule heuristic, the CLI plan and the notebook, all on a CPU."""
import numpy as np
import pandas as pd
import pytest

from dmacoll_lab import cli
from dmacoll_lab.analysis import ficco_rules as fh
from dmacoll_lab.bench import ficco_grid as g

from test_c3 import ROOT, run_notebook


def test_slices_cover_every_row_once_with_uneven_sizes():
    for n, d in [(10, 3), (7, 7), (1024, 8), (1000, 16), (5, 2)]:
        cuts = g.split_rows(n, d)
        rows = [off + j for off, size in cuts for j in range(size)]
        assert rows == list(range(n)) and len(cuts) == d
        assert max(s for _, s in cuts) - min(s for _, s in cuts) <= 1
    assert g.split_rows(10, 3) == [(0, 4), (4, 3), (7, 3)]
    with pytest.raises(ValueError):
        g.split_rows(3, 4)
    order = g.piece_major_order(5, 2, 2)  # blocks of 5 rows, pieces (0,3) and (3,2)
    assert order == [0, 1, 2, 5, 6, 7, 3, 4, 8, 9]
    assert sorted(g.piece_major_order(1000, 4, 16)) == list(range(4000))


def test_schedules_and_scenarios():
    assert g.schedules(2, [1, 2, 4], ["nccl", "dma"]) == [("nccl", 1), ("nccl", 2), ("nccl", 4), ("nccl", 8),
                                                         ("dma", 1), ("dma", 2), ("dma", 4), ("dma", 8)]
    assert g.schedules(4, [1], ["dma"]) == [("dma", 1), ("dma", 4)]
    assert g.option_label("dma", 8) == "dma d=8" and g.option_label("nccl", 1) == "nccl serial"
    scs = g.scenarios(g.DEFAULTS["models"], [2048], g.DEFAULTS["patterns"], 2)
    assert {(s.model, s.pattern) for s in scs} == {("llama3-8b", "ag_gemm"), ("llama3-8b", "gemm_rs"),
                                                   ("llama3-70b", "ag_gemm"), ("llama3-70b", "gemm_rs"),
                                                   ("mixtral-8x7b", "a2a_gemm")}
    ag, rs = g.Scenario("llama3-8b", "ag_gemm", 2048, 2), g.Scenario("llama3-8b", "gemm_rs", 2048, 2)
    assert ag.mnk == (2048, 7168, 4096) and ag.rows_per_block == 1024
    assert ag.coll_in_bytes == 1024 * 4096 * 2 and ag.coll_out_bytes == 2 * ag.coll_in_bytes
    assert rs.mnk == (2048, 4096, 7168) and rs.coll_out_bytes == 1024 * 4096 * 2
    moe = g.Scenario("mixtral-8x7b", "a2a_gemm", 2048, 2)
    assert moe.experts_local == 4 and moe.rows_per_block == 256 and moe.mnk == (2048, 14336, 4096)
    assert g.Scenario("mixtral-8x7b", "a2a_gemm", 2048, 3).reason() and g.Scenario("llama3-8b", "a2a_gemm", 2048, 2).reason()
    assert g.band_ok(8) and not g.band_ok(16)


def test_loss_metrics():
    # coll pieces 100 us, gemm pieces 440 us (whole GEMM 400), d=4: ideal = 25 + 110 + 3 x 110 = 465
    m = g.metrics("ag_gemm", 4, t=500.0, t_serial=520.0, t_serial_nccl=600.0, t_gemm=400.0, t_gemm_pieces=440.0,
                  t_coll=120.0, t_coll_pieces=100.0)
    assert m["decomposition_loss"] == pytest.approx(1.1)
    assert m["t_pipeline_ideal_us"] == pytest.approx(465.0)
    assert m["contention_loss"] == pytest.approx(500 / 465)
    assert m["overlap_vs_isolated_sum"] == pytest.approx(500 / 540)
    assert m["speedup_vs_serial"] == pytest.approx(520 / 500) and m["speedup_vs_nccl_serial"] == pytest.approx(1.2)
    assert g.pipeline_time(100.0, 400.0, 1) == 500.0  # serial: the sum
    # gemm_rs: the GEMM is the first step
    rs = g.metrics("gemm_rs", 2, 300.0, 300.0, 300.0, 200.0, 200.0, 200.0, 200.0)
    assert rs["t_pipeline_ideal_us"] == pytest.approx(300.0) and rs["contention_loss"] == pytest.approx(1.0)


def test_default_grid_fits_three_minutes_on_two_gpus():
    est = g.estimate_seconds(g.DEFAULTS, 2)
    assert 60 < est["seconds"] < 180 and est["scenarios"] == 10 and len(est["schedules"]) == 8
    assert g.heap_top(g.scenarios(g.DEFAULTS["models"], [8192], g.DEFAULTS["patterns"], 2)) == 8192 * 8192 * 2


# -- heuristic ---------------------------------------------------------------------------------------------------
def _row(sc, impl, d, t, rank, serial, serial_nccl):
    base = {**sc.fields(2, rank), "impl": impl, "pieces": d, "option": g.option_label(impl, d)}
    return {**base, **g.metrics(sc.pattern, d, t, serial, serial_nccl, 400.0, 400.0 * (1 + 0.02 * d), 100.0,
                                100.0 + 5 * d), "correct": True, "skipped": ""}


def synthetic(best_of, seed=0) -> pd.DataFrame:
    """Two ranks' rows for the default scenarios; ``best_of(scenario, rng)`` is 10% ahead of the rest."""
    rng = np.random.default_rng(seed)
    rows = []
    for sc in g.scenarios(g.DEFAULTS["models"], [2048, 8192], g.DEFAULTS["patterns"], 2):
        best = best_of(sc, rng)
        sch = g.schedules(2, g.DEFAULTS["factors"], g.IMPLS)
        times = {(i, d): 500.0 + 10 * k for k, (i, d) in enumerate(sch)}
        times = {s: (400.0 if g.option_label(*s) == best else t) for s, t in times.items()}
        for impl, d in sch:
            for rank in (0, 1):
                rows.append(_row(sc, impl, d, times[(impl, d)] * (1 + 0.001 * rank), rank, times[(impl, 1)],
                                 times[("nccl", 1)]))
    return pd.DataFrame(rows, columns=g.FICCO_COLUMNS)


def known(sc, rng):
    return "dma d=4" if sc.pattern == "ag_gemm" else ("nccl d=2" if sc.pattern == "gemm_rs" else "dma serial")


def test_heuristic_learns_on_some_models_and_generalizes_to_the_held_out_one():
    res = fh.fit_and_evaluate(fh.collapse(synthetic(known)))
    assert res["held_out"] == "llama3-70b" and res["train_models"] == ["llama3-8b", "mixtral-8x7b"]
    assert (res["features"][res["test_mask"]]["model"] == "llama3-70b").all()
    scores = res["scores"].set_index(["model", "set"])
    assert scores.loc[("rule", "test"), "accuracy"] == 1.0 and scores.loc[("rule", "test"), "within_5pct"] == 1.0
    assert scores.loc[("always nccl serial", "test"), "accuracy"] == 0.0
    assert "op ==" in res["text"]
    assert res["text"] == fh.fit_and_evaluate(fh.collapse(synthetic(known)))["text"]  # deterministic


def test_heuristic_fails_when_the_best_schedule_depends_on_nothing_it_sees():
    opts = [g.option_label(i, d) for i, d in g.schedules(2, g.DEFAULTS["factors"], g.IMPLS)]
    # one fixed draw, not the seed fixture: a rule may fit random labels by chance, so the bound below holds for
    # a given draw, not for every one (60 draws: test accuracy up to 0.5)
    res = fh.fit_and_evaluate(fh.collapse(synthetic(lambda sc, rng: opts[rng.integers(len(opts))], seed=5)))
    scores = res["scores"].set_index(["model", "set"])
    assert scores.loc[("rule", "test"), "accuracy"] < 0.6
    one = synthetic(known)
    with pytest.raises(ValueError):
        fh.fit_and_evaluate(fh.collapse(one[one["model"] == "llama3-8b"]))


def test_collapse_takes_the_slowest_rank_and_drops_bad_rows():
    df = synthetic(known)
    df.loc[(df["option"] == "dma d=8") & (df["rank"] == 1), "correct"] = False
    coll = fh.collapse(df)
    assert "dma d=8" not in set(coll["option"])
    r = coll[(coll["model"] == "llama3-8b") & (coll["pattern"] == "ag_gemm") & (coll["tokens"] == 2048)]
    assert r.set_index("option").loc["dma d=4", "t_us"] == pytest.approx(400.0 * 1.001)


# -- CLI, notebook ---------------------------------------------------------------------------------------------------
def test_cli_dry_run_needs_no_gpu(capsys):
    assert cli.main(["ficco", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "estimated" in out and "10 scenarios" in out and "dma d=8" in out
    assert cli.main(["ficco", "--dry-run", "--models", "mixtral-8x7b", "--world", "4", "--factors", "1"]) == 0
    assert "2 scenarios" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["ficco", "--dry-run", "--patterns", "gemm"])


def test_notebook_renders_a_synthetic_table(tmp_path):
    df = synthetic(known)
    df.loc[df.index[:2], "skipped"] = "dma: no heap"
    csv = tmp_path / "ficco.csv"
    df.to_csv(csv, index=False)
    outdir = tmp_path / "fig"
    ns = run_notebook(ROOT / "notebooks/ficco.py", {"csvs": [str(csv)], "platform_label": "test",
                                                    "outdir": str(outdir)})
    for name in ("speedup.png", "speedup.pdf", "losses.png", "speedup_summary.md", "heuristic_accuracy.csv",
                 "heuristic_rule.txt", "skipped.md"):
        assert (outdir / name).exists(), name
    assert (ns["summary"]["ficco_paper_max_mi300x"] == 1.6).all()


def test_integer_inputs_keep_sums_exact():
    import torch

    from dmacoll_lab.bench.ficco import int_matrix

    a = int_matrix((64, 200), 3, "cpu", banded=True)
    assert a.dtype == torch.bfloat16 and (a.abs() <= 1).all()
    assert int((a != 0).sum(1).max()) <= g.BAND and int((a != 0).sum()) > 0
    w = int_matrix((200, 48), 4, "cpu")
    exact = a.double() @ w.double()
    assert exact.abs().max() <= g.BAND and torch.equal(torch.mm(a, w).double(), exact)
