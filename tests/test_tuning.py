"""variant='auto': tables derived from measured sweeps, selection by size and mode."""
import json
from pathlib import Path

import pytest
import torch

from dmacoll import InvalidArgument, tuning
from dmacoll_lab.analysis.tuning_table import derive
from dmacoll_lab.verify.launch import run_ranks

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = [ROOT / "results/h200x2/operator/sweep_all_gather/data.csv",
          ROOT / "results/h200x2/operator/sweep_all_to_all/data.csv"]


def _table(entries):
    return tuning.TuningTable({"world": 2, "gpu": "NVIDIA H200"}, [tuning.Entry(*e) for e in entries])


def _pick(choice):
    return choice and (choice.variant, choice.direction)


def test_select_takes_smallest_measured_size_at_or_above_the_message():
    t = _table([("all_gather", "graph", "out", 1024, "b2b", "pull", 1.0),
                ("all_gather", "graph", "out", 4096, "pcpy", "push", 2.0),
                ("all_gather", "eager", "out", 1024, "multi", "push", 3.0)])
    assert _pick(t.select("all_gather", 100, "graph", False)) == ("b2b", "pull")
    assert _pick(t.select("all_gather", 1025, "graph", False)) == ("pcpy", "push")
    assert _pick(t.select("all_gather", 1 << 30, "graph", False)) == ("pcpy", "push")  # beyond the table: largest
    assert _pick(t.select("all_gather", 100, "eager", False)) == ("multi", "push")
    assert _pick(t.select("all_gather", 100, "graph", True)) == ("b2b", "pull")  # no in-place rows: out-of-place
    assert t.select("all_to_all", 100, "graph", False) is None


def test_select_picks_the_fastest_combination_the_call_allows():
    t = _table([("all_gather", "graph", "out", 1024, "b2b", "pull", 1.0),
                ("all_gather", "graph", "out", 1024, "multi", "push", 0.5, "copy", "spin"),
                ("all_gather", "graph", "out", 1024, "pcpy", "pull", 0.7, "copy", "memop", True, "native")])
    assert t.select("all_gather", 100, "graph", False) == ("multi", "push", "copy", "spin", False, "python")
    assert _pick(t.select("all_gather", 100, "graph", False, {"wait": {"memop"}})) == ("pcpy", "pull")
    assert _pick(t.select("all_gather", 100, "graph", False,
                          {"wait": {"memop"}, "submit": {"python"}})) == ("b2b", "pull")
    assert t.select("all_gather", 100, "graph", False, {"signal": {"kernel"}}) is None  # nothing measured


def test_shipped_tables_are_derived_from_the_committed_sweeps():
    shipped = tuning.find(tuning.Platform("NVIDIA H200", 2, "nvlink"))
    assert shipped is not None and shipped.meta["source"][:2] == [str(p.relative_to(ROOT)) for p in SWEEPS]
    for path in tuning.shipped_tables():
        shipped = tuning.TuningTable.load(path)
        sources = shipped.meta["source"]
        prov = json.loads((ROOT / sources[0]).with_suffix(".json").read_text())
        assert shipped.meta["source_git_sha"] == prov["git_sha"]
        assert shipped.meta["source_git_shas"] == [json.loads((ROOT / s).with_suffix(".json").read_text())["git_sha"]
                                                   for s in sources]
        assert {e.op for e in shipped.entries} == {"all_gather", "all_to_all", "reduce_scatter", "all_reduce"}
        derived = derive(sources, prov)
        assert [e.__dict__ for e in derived.entries] == [e.__dict__ for e in shipped.entries], path
        assert derived.meta == shipped.meta, path  # the platform fields (topology, driver) too
    assert tuning.find(tuning.Platform("NVIDIA H200", 8, "nvlink")) is None
    assert tuning.find(tuning.Platform("cpu", 2, "host")) is None


def test_a_table_is_derived_from_sweeps_of_one_platform_and_world():
    x2, x4 = (str(p.relative_to(ROOT)) for p in (SWEEPS[0], ROOT / "results/h200x4/operator/sweep_all_gather/data.csv"))
    prov = json.loads((ROOT / x2).with_suffix(".json").read_text())
    with pytest.raises(InvalidArgument, match="one table per world"):
        derive([x2, x4], prov)


def test_shipped_tables_match_their_platforms_only():
    """Each shipped table is found for the platform it was measured on (whatever the driver or code), not for
    another world, GPU or topology; where the topology is unknown (no NVML) the GPU and world decide."""
    for path in tuning.shipped_tables():
        table = tuning.TuningTable.load(path)
        m = table.meta
        assert m["topology"] == "nvlink" and m["driver"], path
        own = tuning.Platform(m["gpu"], m["world"], "nvlink", "999.1", "0.0+other")
        assert tuning.find(own) is not None and tuning.find(own).meta == m, path
        assert tuning.find(own._replace(topology="unknown")).meta == m
        for other in (own._replace(world=8), own._replace(gpu="NVIDIA H100 80GB HBM3"),
                      own._replace(topology="pcie"), own._replace(topology="shared-device")):
            assert tuning.find(other) is None, other
        assert not table.matches(own, exact=True)  # a calibrated table needs every field equal


def _ran(comm):
    o = comm.last_options
    return o.variant, o.direction, o.signal


def _auto(rank, world, table_path):
    from dmacoll import Communicator, Options

    out = {}
    for name, path in (("default", None), ("table", table_path)):
        comm = Communicator(backend="host", timeout_s=10, options=Options(tuning_table=path))
        x = torch.arange(4, dtype=torch.float32) + 10 * rank
        y = torch.empty(4 * world)
        comm.all_gather(y, x)
        out[name] = (_ran(comm), y.tolist())
        comm.all_gather(y, x, variant="b2b")  # a per-call override wins over the table
        out[name + "_override"] = _ran(comm)
        comm.close()
    return out


def test_communicator_resolves_auto_from_the_table(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(_table([("all_gather", "eager", "out", 1 << 20, "multi", "pull", 1.0)]).to_json())
    res = run_ranks(_auto, 2, str(path))[0]
    assert res["default"][0] == ("pcpy", "push", "copy")  # the host emulator has no table: fallback
    assert res["table"][0] == ("multi", "pull", "memop")
    assert res["table"][1] == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
    assert res["table_override"] == ("b2b", "pull", "memop")


def _uneven_auto(rank, world, table_path):
    """all_to_all_v whose rows differ per rank, variant 'auto' from a table whose choice flips with the size."""
    from dmacoll import Communicator, Options

    comm = Communicator(backend="host", timeout_s=10, options=Options(tuning_table=table_path))
    counts = [[256, 256], [128, 128]]  # rank 0 sends 2 KB in all, rank 1 1 KB (float32)
    x = torch.arange(sum(counts[rank]), dtype=torch.float32) + 1000 * rank
    y = torch.full((sum(row[rank] for row in counts),), -1.0)
    comm.all_to_all_v(y, x, counts)
    choice = _ran(comm)
    comm.close()
    return choice, y.tolist()


def test_all_to_all_v_ranks_agree_on_the_variant_whatever_their_own_row():
    """Each rank must look the table up by a size every rank agrees on, or their plans would not meet."""
    import tempfile

    rows = [("all_to_all", "eager", "out", 1 << 10, "pcpy", "pull", 1.0),
            ("all_to_all", "eager", "out", 2 << 10, "pcpy", "push", 1.0)]
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/t.json"
        with open(path, "w") as f:
            f.write(_table(rows).to_json())
        (c0, y0), (c1, y1) = run_ranks(_uneven_auto, 2, path)
    assert c0 == c1 == ("pcpy", "push", "memop")  # the largest row (2 KB) decides, alike on both ranks
    assert -1.0 not in y0 + y1
    assert y1 == list(range(256, 512)) + [1000.0 + i for i in range(128, 256)]
