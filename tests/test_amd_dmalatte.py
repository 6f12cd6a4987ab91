"""AMD DMA-Latte's sdma_collective output -> the operator sweep's tidy rows (hand-written samples
in tests/data/amd_dmalatte, in the format its README and source print)."""
import csv
import math
from pathlib import Path

import pytest

from dmacoll_lab.bench import amd_dmalatte
from dmacoll_lab.bench.amd_dmalatte import FormatError
from dmacoll_lab.bench.sweep import COLUMNS

DATA = Path(__file__).parent / "data" / "amd_dmalatte"


def test_all_gather_rows_use_this_repositorys_bandwidth_names():
    rows = amd_dmalatte.read(DATA / "ag_pcpy_8gpu.txt", world=8, sync_type=2, num_iter=20)
    assert [r["total_bytes"] for r in rows] == [1024, 8192, 65536, 1 << 20, 16 << 20, 256 << 20]
    r = rows[3]
    assert set(r) == set(COLUMNS)
    assert (r["op"], r["impl"], r["variant"], r["place"], r["signal"], r["mode"]) == \
        ("all_gather", "amd_dmalatte", "pcpy", "in", "atomic64", "eager")
    assert r["bytes_per_rank"] == (1 << 20) // 8 and r["time_us"] == 61.33 and r["calls"] == 15
    assert r["algbw_GBps"] == pytest.approx((1 << 20) / 61.33e-6 / 1e9)  # size / time (nccl-tests algbw)
    assert r["busbw_GBps"] == pytest.approx(14.96, abs=0.01)  # what the tool calls algbw
    assert all(r["correct"] and r["status"] == "ok" for r in rows)
    assert math.isnan(r["time_us_p10"])  # the tool prints a mean only


def test_all_to_all_swap_with_prelaunch_and_verbose_lines():
    rows = amd_dmalatte.read(DATA / "aa_swap_prelaunch_verbose_8gpu.txt", world=8, variant="swap", prelaunch=True)
    assert [(r["op"], r["variant"], r["place"], r["bytes_per_rank"]) for r in rows] == \
        [("all_to_all", "swap+PRELAUNCH", "in", 1 << 20), ("all_to_all", "swap+PRELAUNCH", "in", 2 << 20)]
    # 'PRELAUNCH' alone is the authors' pcpy+PRELAUNCH; the banner's collective must agree with op/variant
    assert amd_dmalatte.variant_name("PRELAUNCH") == ("pcpy", "pcpy+PRELAUNCH")
    with pytest.raises(FormatError, match="the text is AlltoallSwap but op='aa', variant='pcpy'"):
        amd_dmalatte.read(DATA / "aa_swap_prelaunch_verbose_8gpu.txt", world=8, op="aa", variant="pcpy")


def test_failed_validation_marks_the_size_incorrect():
    rows = amd_dmalatte.read(DATA / "ag_b2b_4gpu_failed.txt", world=4)
    assert [(r["variant"], r["total_bytes"], r["correct"]) for r in rows] == \
        [("b2b", 4096, True), ("b2b", 65536, False)]


def test_convert_writes_a_tidy_csv_and_its_sidecar(tmp_path):
    out = amd_dmalatte.convert(DATA / "ag_pcpy_8gpu.txt", tmp_path / "dmalatte.csv", world=8)
    with open(out) as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == COLUMNS and len(table) == 6 and table[0]["impl"] == "amd_dmalatte"
    assert (tmp_path / "dmalatte.json").exists()


@pytest.mark.parametrize("name,meta,message", [
    ("nccl_tests_output.txt", {"world": 8, "op": "ag"}, "no header line .* nccl-tests"),
    ("ag_truncated_row.txt", {"world": 8}, r"ag_truncated_row.txt:5: not a row of"),
    ("ag_wrong_world.txt", {"world": 4}, r":5: their algbw 0.22 GB/s does not match .* world=4"),
    ("ag_skipped.txt", {"world": 8}, r"ag_skipped.txt:1: the run was skipped.*Required GPUs: 8"),
    ("ag_pcpy_8gpu.txt", {"world": 3}, "size 1024 is not chunk x 3 GPUs"),
    ("ag_pcpy_8gpu.txt", {"world": 8, "variant": "swap"}, "variant 'swap' does not exist for all_gather"),
    ("ag_pcpy_8gpu.txt", {"world": 1}, "world must be the number of GPUs"),
])
def test_malformed_input_says_what_and_where(name, meta, message):
    with pytest.raises(FormatError, match=message):
        amd_dmalatte.read(DATA / name, **meta)


def test_text_without_banner_needs_the_op():
    text = "size(B),time(us),algbw(GB/s),busbw(GB/s)\n1024,31.52,0.03,0.00\n"
    with pytest.raises(FormatError, match="give op="):
        amd_dmalatte.parse(text, world=8)
    with pytest.raises(FormatError, match="the table has no rows"):
        amd_dmalatte.parse(text.splitlines()[0], world=8, op="aa")
    assert amd_dmalatte.parse(text, world=8, op="ag")[0]["variant"] == "pcpy"


def test_command_line_converts_one_run(tmp_path, capsys):
    from dmacoll_lab.cli import main

    assert main(["amd-dmalatte", str(DATA / "ag_pcpy_8gpu.txt"), str(tmp_path / "run.csv"), "--world", "8",
                 "--op", "ag", "--variant", "pcpy"]) == 0
    assert (tmp_path / "run.csv").exists() and "wrote" in capsys.readouterr().out
