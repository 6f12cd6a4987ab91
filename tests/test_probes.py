"""`dmacoll probe <name>` without a GPU: argument handling, each probe's tables (rows assembled by its pure functions
from fake measurements, written by the command), the committed results each probe made, and the one-line refusal
where its GPUs are missing."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dmacoll_lab.bench.probes import (PROBES, call_cost, call_timeline, copy_contention, crossing, crossing_legs,
                                      few_sm_kernels, flag_latency, local_copy_paths, memcpy_batch, peer_window,
                                      sm_carveout, sm_path, submit_cost,
                                      table_path, tables)
from dmacoll_lab.bench.probes.common import Table
from dmacoll_lab.cli import build_parser, main
from dmacoll_lab.cli.probe import cmd_probe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
NAMES = sorted(PROBES)
NAN = float("nan")

# today's values (what the committed results were measured with): a rerun with the defaults measures the same
DEFAULTS = {
    "call_cost": dict(worlds=[2, 4, 8], bytes=1024, settings=list(call_cost.SETTINGS), signals=["memop", "copy", "kernel"],
                      waits=["memop", "spin"], calls_per_graph=10, eager_calls=200, repeats=20),
    "call_timeline": dict(worlds=[2, 4], sizes=[1024, 65536], calls=10, max_connections=[], timeline=True,
                          repeats=30),
    "copy_contention": dict(bytes=64 << 20, copies=[1, 4], repeats=7),
    "crossing": dict(placements=None, legs=100, repeats=5, bytes=4096, sends=list(crossing.SENDS),
                     waits=list(crossing.WAITS), modes=list(crossing.MODES), wait_timeout_ms=20.0),
    "few_sm_kernels": dict(repeats=5, carveouts=[8, 16], threads=[256, 512, 1024], unrolls=[4, 8],
                           blocks=[8, 16, 32, 264], copy_bytes=64 << 20, add_elements=16 << 20),
    "flag_latency": dict(rounds=200, repeats=5, ways=list(flag_latency.WAYS)),
    "local_copy_paths": dict(bytes=64 << 20, repeats=7, ways=list(local_copy_paths.WAYS),
                             orders=list(local_copy_paths.ORDERS)),
    "memcpy_batch": dict(bytes=1 << 20, repeats=200),
    "peer_window": dict(worlds=[4], sizes=[1024, 65536, 1 << 20], calls=10, repeats=20),
    "sm_carveout": dict(repeats=5, rounds=15, copy_bytes=64 << 20, add_elements=16 << 20),
    "sm_path": dict(worlds=[2, 4], sizes=[1024, 4096, 16384, 65536, 262144], ops=list(sm_path.OPS), calls=10,
                    repeats=30, blocks=None),
    "submit_cost": dict(bytes=4096, repeats=300, calls=200),
}

# values each probe must refuse (argparse: usage + exit 2), beside the ones every probe refuses
BAD = {
    "call_cost": [["--worlds", "0"], ["--bytes", "100"], ["--settings", "nvlink"], ["--signals", "smoke"],
                  ["--calls-per-graph", "0"]],
    "call_timeline": [["--worlds", "0"], ["--sizes", "100"], ["--calls", "0"], ["--max-connections", "0"]],
    "copy_contention": [["--bytes", "-64M"], ["--bytes", "lots"], ["--copies", "0"]],
    "crossing": [["--legs", "3"], ["--legs", "0"], ["--legs", str(crossing.MAX_LEGS + 2)], ["--bytes", "6"],
                 ["--bytes", "2M"], ["--placements", "mps"], ["--sends", "pigeon"], ["--waits", "sleep"],
                 ["--modes", "lazy"], ["--wait-timeout-ms", "0"], ["--wait-timeout-ms", "-1"],
                 ["--wait-timeout-ms", "soon"], ["--placements"]],
    "few_sm_kernels": [["--copy-bytes", "-1"], ["--copy-bytes", "100"], ["--add-elements", "3"], ["--threads", "0"],
                       ["--carveouts", "-8"]],
    "flag_latency": [["--rounds", "-5"], ["--rounds", str(flag_latency.MAX_ROUNDS + 1)], ["--ways", "smoke_signal"]],
    "local_copy_paths": [["--bytes", "-1M"], ["--bytes", "1000"], ["--orders", "sideways"], ["--ways", "dma"]],
    "memcpy_batch": [["--bytes", "-1"], ["--bytes", "12"]],
    "peer_window": [["--worlds", "0"], ["--sizes", "100"], ["--calls", "0"]],
    "sm_carveout": [["--copy-bytes", "-64M"], ["--copy-bytes", "1000K"], ["--rounds", "0"]],
    "sm_path": [["--worlds", "0"], ["--sizes", "101"], ["--ops", "broadcast"], ["--calls", "0"],  # 101: not whole bf16
                ["--blocks", "0"]],
    "submit_cost": [["--bytes", "-4K"], ["--bytes", "100"], ["--calls", "0"]],
}
EVERY_PROBE_BAD = [["--repeats", "0"], ["--repeats", "-3"], ["--repeats", "two"], ["--nope"], ["--out"]]


def parse(*argv):
    return build_parser().parse_args(["probe", *argv])


# -- (a) argument handling -------------------------------------------------------------------------------------------
def test_help_lists_every_probe(capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert re.search(rf"^\s+{name}\b", out, re.M), name
    assert set(NAMES) == {"call_cost", "call_timeline", "copy_contention", "crossing", "few_sm_kernels", "flag_latency",
                          "local_copy_paths", "memcpy_batch", "peer_window", "sm_carveout", "sm_path", "submit_cost"}


@pytest.mark.parametrize("name", NAMES)
def test_defaults_parse_to_todays_values(name):
    a = parse(name)
    assert a.func is cmd_probe and a.probe_module is PROBES[name]
    assert a.out == f"results/local/probes/{name}/data.csv"
    assert {k: getattr(a, k) for k in DEFAULTS[name]} == DEFAULTS[name]
    assert set(vars(a)) == {"cmd", "probe", "func", "probe_module", "out", *DEFAULTS[name]}  # no option untested


def test_sizes_take_units():
    assert parse("crossing", "--bytes", "64K", "--legs", "200").bytes == 64 << 10
    assert parse("local_copy_paths", "--bytes", "128M").bytes == 128 << 20
    assert parse("memcpy_batch", "--bytes", "4K").bytes == 4096
    assert parse("copy_contention", "--copies", "1", "2", "8").copies == [1, 2, 8]


@pytest.mark.parametrize("name, argv", [(n, bad) for n in NAMES for bad in BAD[n] + EVERY_PROBE_BAD],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_bad_values_exit_2(name, argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", name, *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err  # an unknown option too is the probe's own parser's to report
    assert f"dmacoll probe {name}: error:" in err and f"usage: dmacoll probe {name} " in err


def test_unknown_or_missing_probe_exits_2(capsys):
    for argv in (["probe", "nope"], ["probe"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


# -- (b) tables: rows from fake measurements, written by the command --------------------------------------------------
def fake_tables(name: str) -> dict[str, Table]:
    """Each probe's rows as its pure functions assemble them from made-up measurements."""
    if name == "copy_contention":
        rows = [copy_contention.measurement_row(0, "local", 64 << 20, 1, False, [70.5, 70.1, 71.0]),
                copy_contention.measurement_row(1, "peer", 64 << 20, 4, True, [1450.0, 1460.0, 1440.0])]
        for r in rows:
            r["correct"] = True
        return {name: Table(rows, {"bytes": 64 << 20})}
    if name == "crossing":
        Measured, Pair = crossing_legs.Measured, crossing_legs.Pair
        base, pair = Measured([800.0] * 5, {"ok": 600}, 6, ""), Pair("eager", "copy", "fold")
        return {name: Table(crossing.placement_rows("streams", [pair, Pair("graph", "memop", "spin")], 100,
                                                    4096, {crossing_legs.baseline("eager"): base,
                                                           pair: Measured([1000.0] * 5, {"ok": 600}, 6, "")}),
                            {"legs": 100})}
    if name == "few_sm_kernels":
        return {name: Table([
            few_sm_kernels.side_row(None, "driver_copy", 0, 0, 0, 2 * (64 << 20), [(35.0, NAN)] * 5, True),
            few_sm_kernels.side_row(8, "copy_u4", 256, 4, 32, 2 * (64 << 20), [(276.0, 4200.0), (280.0, 4210.0)],
                                    True)], {"repeats": 5})}
    if name == "flag_latency":
        return {name: Table([flag_latency.way_row("memop_device", 200, [2800.0, 2810.0, 2790.0]),
                             flag_latency.failed_row("memop_graph", 200, "CUDA driver error 1")], {"rounds": 200})}
    if name == "local_copy_paths":
        return {name: Table([local_copy_paths.path_row("cuMemcpyAsync", "alone", [(70.0, NAN)] * 7, True),
                             local_copy_paths.path_row("host_bounce", "together", [(900.0, 4300.0)] * 7, False)],
                            {"bytes": 64 << 20})}
    if name == "memcpy_batch":
        ok = "CUresult.CUDA_SUCCESS"
        return {name: Table([memcpy_batch.case_row(0, "created", "vmm_to_peer_vmm", "stream", "none", 0, "eager", ok,
                                                   True),
                             memcpy_batch.case_row(1, "legacy_default", "plain_to_peer_vmm", "unset", "device", 1,
                                                   "capture", "skipped: the legacy stream cannot be captured", False),
                             memcpy_batch.submit_row(0, "batch", 4, ok, [3.0, 2.0, 2.5])], {"bytes": 1 << 20})}
    if name == "call_cost":
        return {name: Table([call_cost.row("structure", 4, "b2b", "full", "memop", "memop", "graph", 1024,
                                           [9.0, 8.0, 10.0], graph_nodes="batch_mem_op:3 memcpy:4", crossings=2),
                             call_cost.row("shared", 2, "", "", "memop", "memop", "graph", 1024, [],
                                           error="rank 1 died")], {"bytes": 1024})}
    if name == "call_timeline":
        trace = {"traceEvents": [
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "ts": 1000.5, "dur": 2.0,
             "args": {"stream": 7, "bytes": 1024, "correlation": 3}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 999.0, "dur": 1.0, "args": {}}]}
        peer = [{**call_timeline.activities(trace)[0], "start_us": 1003.0}]
        return {name: Table([call_timeline.row(4, None, "nccl", "nccl", 1024, [12.0, 11.0, 13.0]),
                             call_timeline.row(2, 8, "auto", "dmacoll", 1024, [], error="rank 1 died")],
                            {"sizes": [1024]}),
                call_timeline.ACTIVITIES: Table(call_timeline.timeline_rows(
                    2, None, "nccl", 1024, [call_timeline.activities(trace), peer]), {"sizes": [1024]})}
    if name == "sm_path":
        return {name: Table([sm_path.row(4, "all_reduce", "sm", "graph", 1024, [5.0, 4.0, 6.0], 10, True, path="sm"),
                             sm_path.row(2, "", "", "", 0, [], 10, error="rank 1 died")], {"sizes": [1024]})}
    if name == "peer_window":
        return {name: Table([peer_window.row(4, "rows + flag rows", "graph", 1024, [9.0, 8.0, 10.0], 10, True,
                                             "stride 130 MiB (remapped)"),
                             peer_window.row(2, "", "", 0, [], 10, error="rank 1 died")], {"sizes": [1024]})}
    if name == "submit_cost":
        return {name: Table([submit_cost.row("cuMemcpyAsync", "created", 4, 4096, [9.0, 8.0, 10.0], 8.5, True),
                             submit_cost.row("cuMemcpyBatchAsync", "legacy", 4, 4096, [], NAN, False,
                                             "driver result 1")], {"bytes": 4096})}
    assert name == "sm_carveout"
    copy, add = sm_carveout.side_names(64 << 20, 16 << 20)
    rows = [sm_carveout.setting_row("cublas", "full", None, None, 132, copy, 4200.0, 35.0, [(1400.0, 4250.0)] * 5,
                                    True),
            sm_carveout.setting_row("cublaslt", "green_120_carveout_12", 120, 12, 132, add, 4500.0, 60.0,
                                    [(200.0, 4600.0)] * 5, True)]
    times = {s: [100.0 + 10 * i, 200.0] for i, s in enumerate(sm_carveout.COST_SETTINGS)}
    return {name: Table(rows, {"repeats": 5}),
            sm_carveout.COST: Table(sm_carveout.cost_rows(512, 28672, 8192, times), {"rounds": 2})}


def header(csv_path: Path) -> list[str]:
    return csv_path.read_text().splitlines()[0].split(",")


@pytest.mark.parametrize("name", NAMES)
def test_rows_have_the_declared_columns_and_the_command_writes_them(name, tmp_path, monkeypatch):
    probe = PROBES[name]
    fake = fake_tables(name)
    assert set(fake) == set(tables(probe))  # every table the probe declares, and no other
    for table, (rows, _) in fake.items():
        for row in rows:
            assert list(row) == tables(probe)[table], (table, row)
    # the command, its GPU part replaced: the tables land where table_path says, with their sidecars
    monkeypatch.setattr("dmacoll_lab.bench.probes.common.require_gpus", lambda n, what: None)
    monkeypatch.setattr(probe, "run", lambda args: fake)
    out = tmp_path / "probes" / name / "data.csv"
    assert main(["probe", name, "--out", str(out)]) == 0
    for table, (rows, config) in fake.items():
        path = table_path(out, name, table)
        assert path == tmp_path / "probes" / table / "data.csv"
        assert header(path) == tables(probe)[table]
        assert len(path.read_text().splitlines()) == 1 + len(rows)
        assert json.loads(path.with_suffix(".json").read_text())["config"] == config


def test_derived_quantities():
    r = few_sm_kernels.side_row(16, "add_bf16", 512, 8, 16, 6 * (16 << 20), [(100.0, 1.0), (200.0, 3.0),
                                                                              (300.0, 2.0)], True)
    assert (r["side_us"], r["gemm_us"], r["gb_per_s"]) == (200.0, 2.0, 6 * (16 << 20) / 200.0 / 1e3)
    assert few_sm_kernels.side_row(None, "torch_add", 0, 0, 0, 6, [(1.0, NAN)], True)["carveout"] == "alone"
    f = flag_latency.way_row("self_chain", 200, [2000.0, 2400.0, 1000.0])
    assert (f["total_us"], f["crossing_us"], f["total_us_min"], f["total_us_max"]) == (2000.0, 5.0, 1000.0, 2400.0)
    p = local_copy_paths.path_row("cuMemcpyAsync", "alone", [(70.0, NAN), (72.0, NAN), (71.0, NAN)], True)
    assert p["copy_us"] == 71.0 and math.isnan(p["gemm_us"])
    assert memcpy_batch.submit_row(0, "loop", 8, "ok", [1.0, 9.0, 2.0])["mode"] == "submit_loop_k8"
    # the GEMM-cost ratio is per round, against cuBLAS in the same round, then the median over rounds
    base, lt = ("cublas", None), ("cublaslt", 8)
    cost = {r["blas"] + str(r["carveout"]): r for r in sm_carveout.cost_rows(
        1, 2, 3, {base: [100.0, 200.0, 400.0], lt: [110.0, 180.0, 400.0]})}
    assert cost["cublas0"]["ratio_to_cublas"] == 1.0
    assert (cost["cublaslt8"]["gemm_us"], cost["cublaslt8"]["ratio_to_cublas"]) == (180.0, 1.0)
    s = sm_carveout.setting_row("cublas", "green_128", 128, None, 132, "x", 1.0, 2.0, [(3.0, 4.0)], True)
    assert (s["green_sms"], s["carveout"]) == (128, 0)
    assert sm_carveout.setting_row("cublas", "full", None, None, 132, "x", 1, 2, [(3, 4)], True)["green_sms"] == 132
    assert sm_carveout.side_names(64 << 20, 16 << 20) == ("local_copy_64MB", "add_bf16_16Mi")
    assert sm_carveout.side_names(1 << 30, 1 << 20) == ("local_copy_1GB", "add_bf16_1Mi")


def test_submit_cost_rows_and_savings():
    rows = [submit_cost.row("cuMemcpyAsync", "created", 4, 4096, [float(x) for x in range(1, 12)], 9.0, True),
            submit_cost.row("native", "created", 4, 4096, [3.0, 2.0, 4.0], 2.5, True),
            submit_cost.row("cuMemcpyBatchAsync", "legacy", 4, 4096, [], NAN, False, "driver result 1")]
    assert (rows[0]["host_us"], rows[0]["host_us_p10"], rows[0]["host_us_p90"]) == (6.0, 2.0, 10.0)
    assert math.isnan(rows[2]["host_us"])
    assert submit_cost.savings(rows) == ["created  k=4: native                3.00 us vs    6.00 us (+3.00 us saved "
                                         "per call)"]


def test_memcpy_batch_summary():
    ok = "CUresult.CUDA_SUCCESS"
    rows = [memcpy_batch.case_row(0, "created", "vmm_to_peer_vmm", "any", "none", 0, "eager", ok, True),
            memcpy_batch.case_row(1, "created", "vmm_to_peer_vmm", "any", "none", 0, "eager",
                                  "CUresult.CUDA_ERROR_INVALID_VALUE", False),
            memcpy_batch.submit_row(0, "batch", 2, ok, [1.5])]
    lines = memcpy_batch.summary(rows)
    assert lines[0] == "3 rows, 1 accepted with the data delivered"
    assert "('created', 'any', 'eager') ['CUDA_ERROR_INVALID_VALUE', 'CUDA_SUCCESS']" in lines
    assert lines[-1] == "submit_batch_k2 CUDA_SUCCESS 1.50 us"


def test_table_paths():
    assert table_path("r/probes/sm_carveout/data.csv", "sm_carveout", "sm_carveout") == \
        Path("r/probes/sm_carveout/data.csv")
    assert table_path("r/probes/sm_carveout/data.csv", "sm_carveout", "sm_carveout_gemm_cost") == \
        Path("r/probes/sm_carveout_gemm_cost/data.csv")
    assert table_path("out/x.csv", "sm_carveout", "sm_carveout_gemm_cost") == Path("out/x_gemm_cost.csv")


# -- (c) the committed results each probe made -------------------------------------------------------------------------
# code f92be3f-ba4853a: the sm path's runs before their rows said how many blocks a launch had (then always <= 64)
SM_PATH_BEFORE_BLOCKS = ["world", "op", "impl", "path", "mode", "bytes", "per_call_us", "per_call_us_p10",
                         "per_call_us_p90", "calls", "correct", "error"]
# Made by a probe's earlier version, whose table the module no longer describes: the folder, its columns then.
EARLIER = {
    **{f"h200x4/sm_path/{run}": SM_PATH_BEFORE_BLOCKS for run in (
        "sm_path_50_calls_a", "sm_path_50_calls_b", "sm_path_communicator", "sm_path_slots_8m", "sm_path_to_2m_50_calls",
        "sm_path_to_4m_slots")},
    "h200x2/sm_path/sm_path_unaligned": SM_PATH_BEFORE_BLOCKS,
    # code 39a4503: three ways, each alone and next to a GEMM (later: eight ways x four orders, copy_us / gemm_us)
    "h200x2/c3/local_copy_paths": ["way", "next_to_gemm", "time_us", "correct"],
    # code c10c1c5: the kernels called directly (later: through Communicator, and the path each call took)
    "h200x4/sm_path/sm_path": ["world", "op", "impl", "mode", "bytes", "per_call_us", "per_call_us_p10",
                               "per_call_us_p90", "calls", "correct", "error"],
}


# runs measured before a default changed: the values they were measured with
EARLIER_CONFIG = {
    # code 565b89b: before signal='kernel' wrote dmacoll's flag words (then: PyTorch's signal pads)
    "h100x1/probes/call_cost_serial_ready": {"signals": ["memop", "copy"]},
    # runs made with options other than the defaults, on purpose (their READMEs say why)
    "h200x4/small_calls/call_timeline_50_calls": {"calls": 50, "timeline": False},
    "h200x4/small_calls/call_timeline_max_connections": {"worlds": [4], "max_connections": [1, 32], "timeline": False},
    "h200x4/sm_path/sm_path_50_calls_a": {"calls": 50},
    "h200x4/sm_path/sm_path_50_calls_b": {"calls": 50},
    "h200x4/sm_path/sm_path_to_4m_slots": {"sizes": [256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20], "calls": 20,
                                           "repeats": 20},
    "h200x4/sm_path/sm_path_to_2m_50_calls": {"sizes": [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20,
                                                        2 << 20], "calls": 50},
    "h200x4/sm_path/sm_path_slots_8m": {"worlds": [4], "sizes": [2 << 20, 4 << 20, 8 << 20], "repeats": 20},
    "h200x4/sm_path/sm_path_large": {"worlds": [4, 2], "sizes": [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20],
                                     "blocks": [64, 132], "repeats": 15},
    "h200x4/sm_path/sm_path_large_all_reduce": {"worlds": [4], "ops": ["all_reduce"], "sizes": [32 << 20, 64 << 20],
                                                "blocks": [64, 132], "repeats": 15},
    "h200x2/sm_path/sm_path_unaligned": {"worlds": [2], "ops": ["all_to_all", "all_gather", "all_reduce"],
                                         "sizes": [8196, 24588, 106548, 262144, 270468, 532740, 1048576, 1057284],
                                         "repeats": 20},
    "h200x2/sm_path/all_reduce_one_and_two_kernels": {"worlds": [2], "ops": ["all_reduce"], "repeats": 15,
                                                      "sizes": [2 << 20, 4 << 20, 8 << 20, 16 << 20]},
}
# world 2 runs of the seventh session (results/h200x2/sm_path/README.md): the default call 1 KB-16 MB, and small calls
# at 50 per graph with one setting changed through the environment (block bytes, LL lines) in runs that alternate
_DEFAULT_CALL = {"worlds": [2], "calls": 20, "repeats": 15,
                 "sizes": [1 << k for k in (10, 12, 14, 16, 18, 20, 21, 22, 23, 24)]}
_SMALL_CALLS = {"worlds": [2], "calls": 50, "repeats": 15}
EARLIER_CONFIG.update({f"h200x2/sm_path/{run}": _DEFAULT_CALL for run in (
    "default_call_4m_slots", "default_call_fast_path", "default_call_ll_run1", "default_call_ll_run2",
    "default_call_ll_run3")})
EARLIER_CONFIG.update({f"h200x2/sm_path/small_calls_{setting}_run{n}": _SMALL_CALLS
                       for setting in ("block_bytes_2048", "block_bytes_16384") for n in (2, 3)})
EARLIER_CONFIG.update({f"h200x2/sm_path/small_calls_ll_{setting}_run{n}": _SMALL_CALLS
                       for setting in ("on", "off") for n in (1, 2, 3)})
EARLIER_CONFIG["h200x4/sm_path/default_call"] = {"worlds": [4], "calls": 20, "repeats": 10,
                                                "sizes": [1 << k for k in (10, 12, 14, 16, 18, 20, 21, 22)]}
EARLIER_CONFIG.update({f"h200x4/sm_path/small_calls_ll_{setting}": {"worlds": [4], "ops": ["all_reduce", "all_gather"],
                                                                   "sizes": [1 << 10, 16 << 10, 64 << 10],
                                                                   "calls": 50, "repeats": 10}
                       for setting in ("on", "off")})
EARLIER_CONFIG.update({f"h200x2/sm_path/small_calls_block_bytes_{b}_run1": {**_SMALL_CALLS,
                                                                           "ops": ["all_reduce", "all_gather"]}
                       for b in (2048, 16384)})

# eighth session, world 2 (results/h200x2/sm_path/README.md): the default call with the nccl band, three runs each
EARLIER_CONFIG.update({f"h200x2/sm_path/default_call_nccl_band_run{n}": {
    "worlds": [2], "calls": 20, "repeats": 10, "sizes": [1 << k for k in (10, 12, 14, 16, 18, 20, 21, 22)]}
    for n in (1, 2, 3)})
EARLIER_CONFIG.update({f"h200x2/sm_path/large_calls_nccl_band_run{n}": {
    "worlds": [2], "calls": 5, "repeats": 10, "sizes": [8 << 20, 16 << 20, 32 << 20, 64 << 20]} for n in (1, 2, 3)})

# ninth session, worlds 4 and 2 on one 4x H200 lease (results/h200x4/sm_path/README.md): the default call 1 KB-4 MB at
# world 4 before and after LL lines there, 8-256 MB at worlds 2 and 4, LL on / off at world 4
_SMALL_W4 = {"worlds": [4], "calls": 20, "repeats": 10, "sizes": [1 << k for k in (10, 12, 14, 16, 18, 20, 21, 22)]}
_LARGE = {"calls": 5, "repeats": 10, "sizes": [8 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, 256 << 20]}
EARLIER_CONFIG.update({f"h200x4/sm_path/{kind}_run{n}": _SMALL_W4 for kind in ("default_call_nccl_band",
                                                                                "default_call_ll16k") for n in (1, 2, 3)})
EARLIER_CONFIG.update({f"h200x{w}/sm_path/{kind}_run{n}": {**_LARGE, "worlds": [w]} for w in (2, 4)
                       for kind in ("large_calls_staged", "large_calls_dma_sums") for n in (1, 2, 3)})
EARLIER_CONFIG.update({f"h200x4/sm_path/small_calls_ll_{setting}_run{n}": {
    "worlds": [4], "calls": 20, "repeats": 10, "sizes": [1 << k for k in range(10, 17)]}
    for setting in ("on", "off") for n in (1, 2, 3)})

# tenth session, one 4x H200 lease (results/h200x4/sm_path/README.md): the implementations' samples interleaved, the
# default call 1 KB-4 MB at world 4 and 8-256 MB at worlds 4 and 2, three runs each (and one after the nccl path's trim)
EARLIER_CONFIG.update({f"h200x4/sm_path/default_call_interleaved_run{n}": _SMALL_W4 for n in (1, 2, 3)})
EARLIER_CONFIG.update({f"h200x{w}/sm_path/large_calls_interleaved_{run}": {**_LARGE, "worlds": [w]}
                       for w in (2, 4) for run in ("run1", "run2", "run3", "trimmed") if (w, run) != (2, "trimmed")})
# the default call made by the workflow's rule default_call (tools/lent_snakemake.sh): its config parts
# (2x H200), and at be50f6f on 4x H200
EARLIER_CONFIG.update({f"h200x{w}/sm_path/default_call_{part}_run{n}": {**config, "worlds": [w]} for w in (2, 4)
                       for n in (1, 2, 3) for part, config in (("small", _SMALL_W4), ("large", _LARGE))})
# the same rule's large part at f3d76e1, when an eager all_reduce above 4 MB per peer went to NCCL (8 MB included)
EARLIER_CONFIG.update({f"h200x2/sm_path/large_calls_eager_sum_on_nccl_run{n}": {**_LARGE, "worlds": [2]}
                       for n in (1, 2, 3)})


def probe_of(command: list[str]):
    """The probe a sidecar's command ran: tools/probe_<name>.py (before the CLI) or `dmacoll probe <name>`."""
    m = re.search(r"probe_(\w+)\.py$", command[0]) if command else None
    if m:
        return m.group(1)
    if "probe" in command[1:-1]:
        return command[command.index("probe") + 1]
    return None


def committed():
    """(run folder, probe, table) for every committed table a probe made, found by its sidecar's command."""
    found = []
    for side in sorted(RESULTS.glob("*/**/data.json")):
        if "local" in side.relative_to(RESULTS).parts[:1]:
            continue  # fresh, not committed
        name = probe_of(json.loads(side.read_text()).get("command") or [])
        if name:
            run = side.parent
            # an extra table's run folder is named after it (sm_carveout_gemm_cost, sm_carveout_gemm_cost_run4)
            extra = [t for t in PROBES[name].EXTRA if run.name.startswith(t)]
            found.append((run, name, extra[0] if extra else name))
    return found


COMMITTED = committed()


# Written, not yet run on a GPU: no results to commit yet (an entry leaves once its results are committed).
AWAITING_GPU: set[str] = set()


def test_every_probe_table_has_committed_results():
    made = {(name, table) for _, name, table in COMMITTED}
    assert made == {(n, t) for n in NAMES if n not in AWAITING_GPU for t in tables(PROBES[n])}
    assert AWAITING_GPU <= set(NAMES)
    assert {str(run.relative_to(RESULTS)) for run, _, _ in COMMITTED} >= set(EARLIER)


@pytest.mark.parametrize("run, name, table", COMMITTED, ids=lambda x: str(x.relative_to(RESULTS))
                         if isinstance(x, Path) else None)
def test_committed_results_have_the_declared_columns(run, name, table):
    expected = EARLIER.get(str(run.relative_to(RESULTS))) or tables(PROBES[name])[table]
    assert header(run / "data.csv") == expected
    # and the defaults are what it was measured with, where its sidecar names an option
    config = json.loads((run / "data.json").read_text())["config"]
    defaults = {**DEFAULTS[name], **EARLIER_CONFIG.get(str(run.relative_to(RESULTS)), {})}
    for key in set(config) & set(defaults):
        assert defaults[key] == config[key], key
    if table == "sm_carveout":  # the side jobs' names carry their sizes
        sides = {line.split(",")[4] for line in (run / "data.csv").read_text().splitlines()[1:]}
        assert sides == set(sm_carveout.side_names(DEFAULTS[name]["copy_bytes"], DEFAULTS[name]["add_elements"]))


# -- (d) no GPU: one line, exit 2 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_without_gpus_a_probe_says_so_and_exits_2(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    out = tmp_path / "data.csv"
    assert main(["probe", name, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    gpus = PROBES[name].GPUS
    assert err == f"dmacoll probe: {name} needs {gpus} CUDA GPU{'s' if gpus > 1 else ''}, found 0\n"
    assert not out.exists()


def test_a_two_gpu_probe_refuses_one_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["probe", "copy_contention"]) == 2
    assert capsys.readouterr().err == "dmacoll probe: copy_contention needs 2 CUDA GPUs, found 1\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: the probe would run")
def test_the_command_refuses_in_one_line_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "dmacoll_lab", "probe", "memcpy_batch", "--out", str(tmp_path / "x.csv")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert r.stderr == "dmacoll probe: memcpy_batch needs 2 CUDA GPUs, found 0\n"


# -- the probes as the workflow and the reference runs call them ----------------------------------------------------
def test_workflow_config_takes_every_probe_and_no_other():
    from dmacoll_lab.workflow_config import problems

    assert problems({"probes": NAMES}) == []
    assert problems({"probes": ["sm_path", "nope"]}) == [f"config probes: unknown value(s) nope; choose from "
                                                          f"{', '.join(PROBES)}"]
    assert yaml.safe_load((ROOT / "config/config.yaml").read_text())["probes"] == []


def test_probes_are_commands_not_scripts():
    # every probe runs as `dmacoll probe NAME` (the workflow's rule probe); none is a script of its own
    assert not list((ROOT / "tools").glob("probe_*.py"))
    assert not [p for p in (ROOT / "src").rglob("*.py") if "sys.path" in p.read_text()]


def test_submit_cost_table_leaves_refused_ways_empty():
    import pandas as pd

    from dmacoll_lab.analysis import tables

    rows = pd.DataFrame([submit_cost.row("cuMemcpyAsync", "legacy", 2, 4096, [9.0], 9.0, True),
                         submit_cost.row("cuMemcpyBatchAsync", "legacy", 2, 4096, [], NAN, False, "driver result 1"),
                         submit_cost.row("native", "legacy", 2, 4096, [7.123], 7.0, True)])
    t = tables.submit_cost(rows)
    assert list(t.columns) == ["stream", "copies", "cuMemcpyAsync", "native"]
    assert t.iloc[0].tolist() == ["legacy", 2, 9.0, 7.12]


def test_peer_window_rows_cover_every_peer_once():
    for world in range(1, 9):
        for rank in range(world):
            runs = peer_window.row_runs(rank, world)
            peers = [first + i for first, k in runs for i in range(k)]
            assert sorted(peers) == [p for p in range(world) if p != rank] and len(runs) <= 2
            assert all(k > 0 for _, k in runs)
