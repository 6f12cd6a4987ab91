"""The vLLM plugin's routing table: derived from the committed sweeps, and the decisions it gives."""
import json

import pandas as pd
import pytest

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
def test_entries_are_the_default_call_and_nccl_of_the_runs(machine):
    """Every entry against the runs read independently: the median over the runs of Communicator()'s default rows
    and of NCCL's, at the vLLM call's input size (reduce_scatter: the probe's chunk times the world)."""
    table = derive.machine_table(machine)
    frames = [pd.read_csv(derive.ROOT / c) for c in table["source"]]
    rows = pd.concat(frames)
    world = table["world"]
    assert {e["op"] for e in table["entries"]} == {"all_gather", "reduce_scatter"}  # the ops vLLM calls there
    for e in table["entries"]:
        chunk = e["bytes_per_rank"] // (world if e["op"] == "reduce_scatter" else 1)
        point = rows[(rows["op"] == e["op"]) & (rows["mode"] == e["mode"]) & (rows["bytes"] == chunk)]
        assert e["dmacoll_us"] == pytest.approx(point[point["impl"] == "default"]["per_call_us"].median(), abs=0.005)
        assert e["vllm_us"] == pytest.approx(point[point["impl"] == "nccl"]["per_call_us"].median(), abs=0.005)
    for op in ("all_gather", "reduce_scatter"):  # both modes at every size
        assert sum(e["op"] == op for e in table["entries"]) == 2 * rows[rows["op"] == op]["bytes"].nunique()


def test_bracket_and_size_classes():
    sizes = [1024, 4096, 16384]
    assert bracket(sizes, 4096) == ((4096,), "4 KB")
    assert bracket(sizes, 5000) == ((4096, 16384), "4 KB-16 KB")
    assert bracket(sizes, 10) == ((1024,), "below 1 KB") and bracket(sizes, 1 << 20) == ((16384,), "above 16 KB")


def test_decisions_on_the_shipped_table():
    r = Routes.shipped()
    h200x2 = r.table(2, H200)
    rows = {(e["mode"], e["bytes_per_rank"]): e for e in h200x2["entries"] if e["op"] == "all_gather"}
    for (mode, size), e in rows.items():  # every measured size decides by its own row
        d = r.decide("all_gather", size, mode, 2, H200)
        assert d.route == (e["dmacoll_us"] <= 0.9 * e["vllm_us"]), (mode, size)
    # between two sizes: both must favour dmacoll
    crossings = [(m, a, b) for (m, a), ea in rows.items() for (m2, b), eb in rows.items()
                 if m == m2 and a < b and not [s for (m3, s) in rows if m3 == m and a < s < b]
                 and (ea["dmacoll_us"] <= 0.9 * ea["vllm_us"]) != (eb["dmacoll_us"] <= 0.9 * eb["vllm_us"])]
    assert crossings  # the committed data has one
    for mode, a, b in crossings:
        assert not r.decide("all_gather", (a + b) // 2, mode, 2, H200).route
    assert r.decide("all_gather", 4 << 10, "graph", 2, H200).route  # KB sizes: the sm path beats NCCL
    d = r.decide("all_reduce", 64 << 20, "graph", 2, H200)
    assert not d.route and d.reason == r.deferred["all_reduce"]
    d = r.decide("reduce_scatter", 128 << 20, "graph", 4, H200)  # there Communicator() hands it to NCCL itself
    assert not d.route and d.reason.startswith("dmacoll not faster")
    assert r.decide("reduce_scatter", 128 << 20, "graph", 2, H200).route  # the copy engines' sums, 0.80-0.85
    assert r.decide("reduce_scatter", 64 << 10, "graph", 4, H200).route
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
