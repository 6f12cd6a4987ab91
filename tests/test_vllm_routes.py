"""The vLLM plugin's routing table: derived from the committed sweeps, and the decisions it gives."""
import json

import pytest

from dmacoll_lab.analysis import report
from dmacoll_lab.vllm import routes as derive
from dmacoll_lab.cli import main
from dmacoll.integrations.vllm_routes import Routes, bracket, policy

H200 = "NVIDIA H200"


def test_shipped_table_is_what_the_committed_sweeps_give(capsys):
    assert not derive.stale()
    assert main(["vllm", "routes", "--check"]) == 0 and "up to date" in capsys.readouterr().out
    shipped = json.loads(derive.OUT.read_text())
    assert [(t["machine"], t["world"], t["gpu"]) for t in shipped["tables"]] == [("h200x2", 2, H200),
                                                                                ("h200x4", 4, H200)]


@pytest.mark.parametrize("machine", derive.MACHINES)
def test_entries_are_the_default_pick_and_nccl_of_the_sweep(machine):
    """Every entry against the sweep read independently: Communicator()'s default row and NCCL's row."""
    table = derive.machine_table(machine)
    df = report.load([str(derive.ROOT / c) for c in table["source"]])
    default, nccl = report.picks(df)["default"], report.best(df, "nccl")
    # the ops vLLM calls that the sweeps hold (all_to_all serves no vLLM call; 4x H200 swept the reductions too)
    served = {"h200x2": {"all_gather"}, "h200x4": {"all_gather", "reduce_scatter"}}[machine]
    assert {e["op"] for e in table["entries"]} == served
    for e in table["entries"]:
        key = (e["op"], e["mode"], e["bytes_per_rank"])
        assert e["dmacoll_us"] == pytest.approx(default.loc[key, "time_us"], abs=0.005)
        assert e["vllm_us"] == pytest.approx(nccl.loc[key, "time_us"], abs=0.005)
    for op in served:  # both modes at every size
        assert sum(e["op"] == op for e in table["entries"]) == 2 * df[df["op"] == op]["bytes_per_rank"].nunique()


def test_bracket_and_size_classes():
    sizes = [1024, 4096, 16384]
    assert bracket(sizes, 4096) == ((4096,), "4 KB")
    assert bracket(sizes, 5000) == ((4096, 16384), "4 KB-16 KB")
    assert bracket(sizes, 10) == ((1024,), "below 1 KB") and bracket(sizes, 1 << 20) == ((16384,), "above 16 KB")


def test_decisions_on_the_shipped_table():
    r = Routes.shipped()
    h200x2 = r.table(2, H200)
    rows = {(e["mode"], e["bytes_per_rank"]): e for e in h200x2["entries"]}
    for (mode, size), e in rows.items():  # every measured size decides by its own row
        d = r.decide("all_gather", size, mode, 2, H200)
        assert d.route == (e["dmacoll_us"] <= 0.9 * e["vllm_us"]), (mode, size)
    # between two sizes: both must favour dmacoll
    slow_fast = [(m, a, b) for (m, a), ea in rows.items() for (m2, b), eb in rows.items()
                 if m == m2 and b == 2 * a and (ea["dmacoll_us"] <= 0.9 * ea["vllm_us"]) != (
                     eb["dmacoll_us"] <= 0.9 * eb["vllm_us"])]
    assert slow_fast  # the committed data has a crossing
    for mode, a, b in slow_fast:
        assert not r.decide("all_gather", a + a // 2, mode, 2, H200).route
    assert r.decide("all_gather", 1 << 10, "graph", 2, H200).route is False  # KB sizes: NCCL is faster
    d = r.decide("all_reduce", 64 << 20, "graph", 2, H200)
    assert not d.route and d.reason == r.deferred["all_reduce"]
    d = r.decide("reduce_scatter", 64 << 20, "graph", 2, H200)  # measured on 4x H200 only
    assert not d.route and d.reason == "no graph measurement of reduce_scatter at world 2 (h200x2)"
    d = r.decide("reduce_scatter", 64 << 20, "graph", 4, H200)  # there the copy engines lose to NCCL
    assert not d.route and d.reason.startswith("dmacoll not faster")
    assert "no measurement at world 8" in r.decide("all_gather", 64 << 20, "graph", 8, H200).reason
    assert not r.decide("all_gather", 64 << 20, "graph", 2, "NVIDIA H100 80GB HBM3").route


def test_policies():
    r = Routes.shipped()
    assert policy({}) == "measured" and policy({"DMACOLL_VLLM_ROUTE": " Moves "}) == "moves"
    with pytest.raises(ValueError, match="DMACOLL_VLLM_ROUTE='fast'"):
        policy({"DMACOLL_VLLM_ROUTE": "fast"})
    assert r.decide("all_reduce", 1, "eager", 8, "cpu", "all").route
    assert r.decide("all_gather", 1, "eager", 8, "cpu", "moves").route
    assert not r.decide("reduce_scatter", 1, "eager", 2, H200, "moves").route
