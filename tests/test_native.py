"""Native submission (submit='native'): the C library is built and driven through recording
doubles of the driver's entry points, and must issue exactly what the Python path issues."""
import itertools
import shutil
from types import SimpleNamespace

import pytest

from dmacoll.backends import cuda as cuda_backend
from dmacoll.backends import native
from dmacoll.errors import DmaCollError, InvalidArgument
from dmacoll.executor import execute, lower, one_index
from dmacoll.plan import Layout, all_gather_exchange, all_to_all_exchange, build_plan
from test_cuda_commands import FakeDriver

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
                                reason="no C compiler to build the native library")
HEAP = 0x10_0000_0000


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("native")
    record = native.build(out)
    assert record["self_test_commands"] == 5 and (out / "toolchain.json").is_file()
    return native.load(out / native.LIBRARY_NAME)


def fake_engine(world, rank=0):
    eng = cuda_backend.CudaEngine.for_commands(  # no GPU: only the command-issuing state
        rank, world, [HEAP * (r + 1) for r in range(world)], SimpleNamespace(cuda_stream=7),
        [SimpleNamespace(cuda_stream=100 + i) for i in range(world)])
    eng.side_streams_for = lambda n: eng.side_streams[:n]
    return eng


def submitter(lib, eng, api):
    events = itertools.count(0xE0)
    return native.NativeSubmitter(eng, lib=lib, api=api.table,
                                  new_event=lambda: SimpleNamespace(cuda_event=next(events)))


def python_calls(monkeypatch, eng, plan, sync, signal, epoch):
    """What the Python path issues, one entry per driver operation (batches unrolled)."""
    drv = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    execute(plan, eng, {"input": 0x7000_0000, "output": 0x8000_0000}, sync, epoch, signal)
    flat = []
    for call in drv.calls:
        flat += [(*op, call[2]) for op in call[1]] if call[0] == "batch" else [call]
    return flat


def native_calls(lib, eng, plan, sync, signal, epoch):
    """The same, from the native library (in FakeDriver's notation)."""
    api = native.RecordingApi()
    submitter(lib, eng, api).run(lower(plan, sync, signal), {"input": 0x7000_0000, "output": 0x8000_0000}, epoch)
    names = {0: "geq", 1: "eq"}
    return [("wait", c[1], c[2], names[c[3]], c[4]) if c[0] == "wait" else
            ("write", c[1], c[2], c[4]) if c[0] == "write" else c for c in api.calls]


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("op", ["all_gather", "all_to_all"])
@pytest.mark.parametrize("direction", ["push", "pull"])
@pytest.mark.parametrize("sync,signal", [("reset", "memop"), ("epoch", "memop"), ("reset", "copy")])
def test_single_queue_plans_issue_what_the_python_path_issues(lib, monkeypatch, world, op, direction, sync, signal):
    ex = all_gather_exchange(world, 1000) if op == "all_gather" else all_to_all_exchange(
        [[96 + 8 * p + r for p in range(world)] for r in range(world)])
    for rank in (0, world - 1):
        eng = fake_engine(world, rank)
        plan = build_plan(ex, rank, "b2b", direction, Layout(input_sym=4096, output_sym=1 << 20, staging=512))
        want = python_calls(monkeypatch, eng, plan, sync, signal, epoch=41)
        got = native_calls(lib, eng, plan, sync, signal, epoch=41)
        assert got == want and len(got) > 2


def test_epoch_values_are_filled_in_per_call(lib):
    eng = fake_engine(2)
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(None, None, 512))
    api = native.RecordingApi()
    sub = submitter(lib, eng, api)
    program = lower(plan, "epoch")
    for epoch in (5, 6):
        sub.run(program, {"input": 0x7000_0000, "output": 0x8000_0000}, epoch)
    values = [c[2] for c in api.calls if c[0] in ("write", "wait")]
    half = len(values) // 2
    assert values[:half] == [5] * half and values[half:] == [6] * half
    assert len(sub._compiled) == 1  # the second call reused the compiled list


@pytest.mark.parametrize("world", [2, 4])
def test_per_peer_queues_fork_and_join_with_events(lib, world):
    eng = fake_engine(world)
    plan = build_plan(all_gather_exchange(world, 4096), 0, "pcpy", "push",
                      Layout(input_sym=None, output_sym=1 << 20, staging=512))
    program = lower(plan, "reset")
    assert len(program.queues) == world  # the local copy and one queue per peer
    api = native.RecordingApi()
    submitter(lib, eng, api).run(program, {"input": 0x7000_0000, "output": 0x8000_0000}, 1)
    stream_of = {"copy": 4, "write": 4, "wait": 4, "record": 2, "wait_event": 2}
    by_stream: dict = {}
    for c in api.calls:
        by_stream.setdefault(c[stream_of[c[0]]], []).append(c)
    fork = next(c[1] for c in by_stream[7] if c[0] == "record")
    sides = [s for s in by_stream if s != 7]
    assert len(sides) == world - 1
    for s in sides:  # each side queue: after the fork, its own work, then its join event
        calls = by_stream[s]
        assert calls[0] == ("wait_event", fork, s) and calls[-1][0] == "record"
        assert any(c[0] == "copy" for c in calls)
        assert ("wait_event", calls[-1][1], 7) in by_stream[7]  # the caller's stream joins it
    main = [c[0] for c in by_stream[7]]
    assert main.index("record") < min(i for i, k in enumerate(main) if k == "wait_event")


def test_a_failing_driver_call_names_itself(lib):
    eng = fake_engine(2)
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(None, None, 512))
    api = native.RecordingApi(fail_at=1, code=700)
    with pytest.raises(DmaCollError, match=r"cuStreamWaitValue32 failed with CUresult 700"):
        submitter(lib, eng, api).run(lower(plan, "reset"), {"input": 0x7000_0000, "output": 0x8000_0000}, 1)
    assert len(api.calls) == 2  # nothing issued past the failure


def test_kernel_signals_are_refused_before_anything_is_issued(lib):
    eng = fake_engine(2)
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(None, None, 512))
    api = native.RecordingApi()
    with pytest.raises(InvalidArgument, match="signal='memop' or 'copy'"):
        submitter(lib, eng, api).run(lower(plan, "reset", "kernel"), {"input": 0x7000_0000, "output": 0x8000_0000}, 1)
    assert api.calls == []


def test_missing_library_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DMACOLL_NATIVE_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(Exception, match="dmacoll build"):
        native.load()


def test_the_library_is_built_on_first_use_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("DMACOLL_NATIVE_LIB", raising=False)
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "no checkout build" / native.LIBRARY_NAME)
    path = native.ensure_built()
    assert path == native.cache_path() and path.is_file() and str(path).startswith(str(tmp_path))
    assert native.load(path).dmacoll_submit_abi() == native.ABI
    assert native.ensure_built() == path  # the second time: found, not rebuilt
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DMACOLL_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(native.BackendUnavailable, match="from Python"):
        native.ensure_built()


def _build_and_load(out: str) -> int:
    return native.load(native.build(out)["library"]).dmacoll_submit_abi()


def test_ranks_building_on_first_use_at_once_each_load_a_whole_library(tmp_path, monkeypatch):
    """The ranks of one machine build into the same cache directory at the same time: each compiles under a name of
    its own and moves it into place atomically, so none loads (or moves) a file another's compiler is writing. A
    compiler that lingers 3 s after writing its output makes the builds overlap whatever the processes' start-up."""
    import multiprocessing

    cc = next(shutil.which(n) for n in ("cc", "gcc", "clang") if shutil.which(n))
    slow = tmp_path / "slow-cc"
    slow.write_text(f'#!/bin/sh\n"{cc}" "$@" || exit $?\ncase "$*" in *" -o "*) sleep 3;; esac\n')
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))  # inherited by the spawned builders
    out = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert pool.map(_build_and_load, [str(out)] * 3) == [native.ABI] * 3
    assert sorted(p.name for p in out.iterdir()) == sorted([native.LIBRARY_NAME, "toolchain.json"])
