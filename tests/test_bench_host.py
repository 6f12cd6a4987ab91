"""The benchmark harness end to end on the host emulator (no GPU): the sweep of every collective, every dma
configuration and the baselines that run on the CPU (gloo standing in for NCCL), every point checked after
timing against the op spec's reference."""
import pandas as pd

from dmacoll import ops
from dmacoll_lab.bench.sweep import COLUMNS, SweepConfig, run_sweep
from dmacoll_lab.verify.launch import run_ranks


def test_host_sweep_runs_and_checks_every_collective(tmp_path):
    out = tmp_path / "sweep" / "data.csv"
    cfg = SweepConfig(ops=ops.names(), impls=("nccl", "dma_default", "dma", "peer_copy"), variants=("pcpy", "b2b"),
                      directions=("push", "pull"), places=("out", "in"), handshakes=("full", "lean"),
                      min_bytes=1 << 10, max_bytes=3 << 10, modes=("eager",), dtype="bfloat16", calls=2,
                      repeats=2, warmup=1, out=str(out))
    rows = run_ranks(run_sweep, 3, cfg, timeout_s=600)[0]
    df = pd.read_csv(out)
    assert list(df.columns) == COLUMNS and len(df) == len(rows) and out.with_suffix(".json").exists()
    assert set(df["op"]) == set(ops.names()) and set(df["impl"]) == {"nccl", "dma_default", "dma", "peer_copy"}
    # the no-options call says what it ran (no tuning table on the host: the fallback, flags as copies)
    default = df[df["impl"] == "dma_default"]
    ran = zip(*(default[name] for name in ("variant", "direction", "signal", "wait", "prerecord", "submit")))
    assert set(ran) == {("pcpy", "push", "copy", "memop", False, "python")}
    bad = df[(df["status"] != "ok") | ~df["correct"]]
    assert bad.empty, bad[["op", "impl", "variant", "direction", "place", "handshake", "bytes_per_rank", "error"]]
    # in place and lean only where they apply: in-place forms, push exchanges
    assert set(df[df["place"] == "in"]["op"]) == {n for n, s in ops.REGISTRY.items() if s.in_place}
    assert set(df[df["handshake"] == "lean"]["op"]) == {n for n, s in ops.REGISTRY.items() if not s.reduces}
    assert set(df[df["handshake"] == "lean"]["direction"]) == {"push"}
    # nccl-tests sizes: all-gather's total is the output, the others' the input
    ag = df[(df["op"] == "all_gather") & (df["impl"] == "nccl")]
    assert (ag["total_bytes"] == 3 * ag["bytes_per_rank"]).all()


def _bound_checks(rank, world):
    """A call that writes nothing, and one that writes the right bytes, through the harness's check."""
    from dmacoll_lab.bench import harness

    rk = harness.Rank(rank, world, pool_bytes=4096)
    spec = ops.get("all_reduce")
    lazy = harness.Bound(rk, spec, 4096, 7, lambda out, inp, counts: (lambda: None), symmetric=False)
    nothing = lazy.check(lazy.run)
    right = harness.Bound(rk, spec, 4096, 7, harness.torch_caller(spec), symmetric=False)
    ok = right.check(right.run)
    rk.close()
    return nothing, ok


def test_the_harness_check_fails_an_unwritten_output_and_passes_a_right_one():
    for nothing, ok in run_ranks(_bound_checks, 2, timeout_s=300):
        assert nothing is False and ok is True


def test_check_cost_times_every_op_with_the_check_off_and_on(tmp_path):
    from dmacoll_lab.analysis import load, tables
    from dmacoll_lab.cli import main

    out = tmp_path / "check_cost" / "data.csv"
    assert main(["check-cost", "--world", "3", "--sizes", "1K", "4K", "--calls", "2", "--repeats", "2",
                 "--out", str(out)]) == 0
    df = load.read("check_cost", [out])
    assert len(df) == len(ops.names()) * 2 * 2 and df["ok"].all() and set(df["world"]) == {3}
    summary = tables.check_cost(df)
    assert len(summary) == len(ops.names()) * 2 and summary["correct"].all()
    assert (summary["added_us"] == (summary["on_us"] - summary["off_us"]).round(1)).all()
