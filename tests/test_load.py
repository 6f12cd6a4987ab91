"""dmacoll_lab.analysis.load: result CSVs of any name or run folder, older sweeps brought up to today's columns."""
import json

import pandas as pd
import pytest

from dmacoll_lab.analysis import load

# an operator sweep from before the signal / prerecord / submit / handshake options, with the old peer_copy busbw
OLD_SWEEP = pd.DataFrame([
    {"op": "all_gather", "impl": "dma", "variant": "pcpy", "direction": "push", "place": "out", "mode": "graph",
     "world": 4, "bytes_per_rank": 1 << 20, "total_bytes": 4 << 20, "time_us": 10.0, "algbw_GBps": 1.0,
     "busbw_GBps": 1.0, "status": "ok", "correct": True, "error": ""},
    {"op": "all_gather", "impl": "peer_copy", "variant": "", "direction": "", "place": "", "mode": "graph",
     "world": 4, "bytes_per_rank": 1 << 20, "total_bytes": 4 << 20, "time_us": 10.0, "algbw_GBps": 419.4,
     "busbw_GBps": 314.6, "status": "ok", "correct": True, "error": ""},
])


def test_a_run_folder_and_an_old_file_name_read_alike(tmp_path):
    old = tmp_path / "sweep_all_gather.csv"
    run = tmp_path / "operator" / "sweep_all_gather"
    run.mkdir(parents=True)
    OLD_SWEEP.to_csv(old, index=False)
    OLD_SWEEP.to_csv(run / "data.csv", index=False)
    (run / "data.json").write_text(json.dumps({"git_sha": "abc"}))
    a, b, c = load.read("operator", [old]), load.read("operator", [run]), load.read("operator", [run / "data.csv"])
    assert list(a["source"]) == [str(old)] * 2 and list(b["source"]) == [str(run / "data.csv")] * 2
    pd.testing.assert_frame_equal(a.drop(columns="source"), b.drop(columns="source"))
    pd.testing.assert_frame_equal(b, c)
    assert load.provenance(run) == load.provenance(run / "data.csv") == {"git_sha": "abc"}


def test_operator_sweeps_get_the_options_they_predate_and_peer_copy_bandwidth(tmp_path):
    OLD_SWEEP.to_csv(tmp_path / "data.csv", index=False)
    df = load.read("operator", [tmp_path / "data.csv"]).set_index("impl")
    assert df.loc["dma", ["signal", "prerecord", "submit", "handshake"]].tolist() == ["memop", False, "python", "full"]
    assert df.loc["peer_copy", ["signal", "handshake", "variant"]].tolist() == ["", "", ""]  # "" is not missing
    assert df["ok"].all()
    # one chunk to one peer: the chunk's bytes over the time, bus factor 1
    assert df.loc["peer_copy", "total_bytes"] == 1 << 20
    assert df.loc["peer_copy", "busbw_GBps"] == pytest.approx((1 << 20) / 10e-6 / 1e9)


def test_kinds_keep_their_missing_value_rules(tmp_path):
    (tmp_path / "c3.csv").write_text("option,skipped,x\ndma,,NaN\n")
    c3 = load.read("c3", [tmp_path / "c3.csv"])
    assert c3["skipped"].isna().all() and c3["x"].isna().all()
    with pytest.raises(ValueError, match="unknown result kind"):
        load.read("sweep", [tmp_path / "c3.csv"])


def test_interference_tables_from_before_c3_are_read_in_c3s_schema(tmp_path):
    from dmacoll_lab.bench.c3_grid import C3_COLUMNS

    old = load.read("interference", ["results/h200x2/power/interference/data.csv"])
    assert set(C3_COLUMNS) - set(old.columns) <= {"gflop", "intensity", "bound", "comp_reps", "ratio", "ratio_nccl",
                                                  "t_comm_nccl_us", "t_comp_strategy_us", "speedup_vs_nccl_serial",
                                                  "sm_split", "comm_priority"}
    assert set(old["option"]) == {"baseline", "dma", "dma pcpy"} and set(old["strategy"]) == {"baseline", "dma"}
    gemm = old[old["compute"] == "gemm"]
    assert (gemm[["M", "N", "K"]] == 8192).all().all() and set(old["op"]) == {"all_gather"}
    # the measurements themselves are untouched
    raw = pd.read_csv("results/h200x2/power/interference/data.csv")
    assert old["fraction_of_ideal"].tolist() == raw["fraction_of_ideal"].tolist()
    # a table written by today's `dmacoll interference` (C3 rows) is read as it is
    new = old.drop(columns="source")
    new.to_csv(tmp_path / "data.csv", index=False)
    again = load.read("interference", [tmp_path / "data.csv"])
    assert list(again["option"]) == list(old["option"])
