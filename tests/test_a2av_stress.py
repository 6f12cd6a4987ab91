"""`dmacoll a2av-stress` (issue 47's crash map, dmacoll_lab/verify/a2av_stress.py): its bookkeeping, and a run on the
host emulator."""
import json
import subprocess
import sys
from pathlib import Path

from dmacoll_lab.verify import a2av_stress


def test_the_case_in_flight_is_the_lowest_one_a_rank_never_ended(tmp_path):
    progress = str(tmp_path / "p")
    ok = json.dumps({"ran": {}, "error": None})
    # rank 0 died in case 7; rank 1, with nothing to move in cases 7-11, ran on to case 12 and waits there
    Path(f"{progress}.0").write_text("".join(f"start {i}\nok {i} {ok}\n" for i in range(7)) + "start 7\n")
    Path(f"{progress}.1").write_text("".join(f"start {i}\nok {i} {ok}\n" for i in range(12)) + "start 12\n")
    state = a2av_stress.read_progress(progress, 2)
    assert a2av_stress.in_flight(state, 0) == (7, True)
    Path(f"{progress}.0").write_text("".join(f"start {i}\nok {i} {ok}\n" for i in range(3, 13)))
    Path(f"{progress}.1").write_text("".join(f"start {i}\nok {i} {ok}\n" for i in range(3, 13)))
    assert a2av_stress.in_flight(a2av_stress.read_progress(progress, 2), 3) == (12, False)


def test_the_worst_result_over_the_ranks_is_the_cases():
    rows = [{"case": 1, "splits": "one_huge", "variant": "b2b", "direction": "push", "buffers": "private",
             "dtype": "int32", "ranks": {0: {"result": "raised", "error": "AcceleratorError: CUDA error: x\nmore"},
                                         1: {"result": "wrong", "ran": {"variant": "b2b", "prerecord": True}}}}]
    (row,) = a2av_stress.tidy(rows, 2)
    assert (row["result"], row["ranks"], row["ran_variant"], row["prerecord"]) == ("raised", "0", "b2b", True)
    assert row["error"] == "AcceleratorError: CUDA error: x"


def test_a_run_on_the_host_emulator_writes_its_table(tmp_path):
    out = tmp_path / "w2"
    done = subprocess.run([sys.executable, "-m", "dmacoll_lab", "a2av-stress", "--backend", "host", "--world", "2",
                           "--out", str(out), "--seeds", "1", "--only", "one_huge", "random:0", "--table"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (out / "data.csv").read_text().splitlines()
    assert len(lines) == 1 + 2 * 4 * 3 * 2 * 3 and all(",ok," in line for line in lines[1:])
    assert json.loads((out / "data.json").read_text())["config"]["world"] == 2
