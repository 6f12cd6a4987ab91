"""Every protocol on the host emulator: one process per rank, world sizes 2 to 8."""
import random
import time

import pytest
import torch

from dmacoll.check import DTYPES
from dmacoll.cli import _check_rank
from dmacoll.launch import run_ranks
from dmacoll.plan import VARIANTS


def _run_check(world, dtypes, counts, syncs=("reset", "epoch"), ops=("all_gather", "all_to_all", "all_to_all_v"),
               signal="memop"):
    seed = random.randrange(1 << 30)  # fresh data every run; printed on failure
    args = dict(backend="host", timeout_s=60, variants=VARIANTS, directions=("push", "pull"), dtypes=dtypes,
                counts=counts, ops=ops, seed=seed, syncs=syncs, reference="cpu", signal=signal)
    per_rank = run_ranks(_check_rank, world, args)
    bad = [r for rank in per_rank for r in rank if not r["ok"]]
    assert per_rank[0], "no cases ran"
    assert not bad, f"seed {seed}: {bad[:3]}"
    return per_rank[0]


def test_world2_every_dtype_odd_and_power_of_two_sizes():
    results = _run_check(2, list(DTYPES), [1, 3, 64, 1023, 4096])
    assert {r["dtype"] for r in results} == set(DTYPES)
    assert {r["in_place"] for r in results} == {True, False}
    assert {r["buffers"] for r in results} == {"sym", "private"}


def test_world3():
    _run_check(3, ["float32", "bfloat16", "int8"], [1, 17, 4096, 300001])


def test_world4():
    _run_check(4, ["float16", "int64", "bool"], [5, 1024])


@pytest.mark.parametrize("signal", ["copy", "kernel"])
def test_world3_constant_signals(signal):
    results = _run_check(3, ["bfloat16"], [1, 4096], signal=signal)
    assert {r["sync"] for r in results} == {"reset"}


def test_world8():
    _run_check(8, ["bfloat16", "uint8"], [3, 256], syncs=("reset",))


def _skip_a_call(rank, world, timeout_s):
    import torch.distributed as dist

    from dmacoll import Communicator, DmaCollError, DmaCollTimeoutError

    comm = Communicator(backend="host", timeout_s=timeout_s)
    x = comm.empty(16, dtype=torch.float32)
    out = comm.empty(16 * world, dtype=torch.float32)
    comm.all_gather(out, x)  # everyone: fine
    report = {}
    if rank == 0:  # rank 1 never makes the second call
        t0 = time.monotonic()
        try:
            comm.all_gather(out, x)
        except DmaCollTimeoutError as e:
            report["error"], report["after_s"] = str(e), time.monotonic() - t0
        try:
            comm.all_gather(out, x)
        except DmaCollError as e:
            report["next_call"] = str(e)
    dist.barrier()
    comm.close()
    return report


def test_missing_peer_ends_in_timeout_error_not_a_hang():
    report = run_ranks(_skip_a_call, 2, 1.0)[0]
    assert 0.9 < report["after_s"] < 5.0
    assert "rank 0: all_gather call #2" in report["error"]
    assert "waited more than 1 s for rank 1 to signal READY" in report["error"]
    assert "unusable after an earlier error" in report["next_call"]


def test_check_cli_prints_closing_line(capsys):
    from dmacoll.cli import main

    rc = main(["check", "--backend", "host", "--world", "2", "--dtypes", "float32", "--counts", "5",
               "--seed", "7"])
    out = capsys.readouterr().out
    assert rc == 0
    last = out.strip().splitlines()[-1]
    n = int(last.split()[0])
    assert last == f"{n} passed, 0 failed" and n > 0
