"""Runs of consecutive copies: lowered as one step, issued by the cuda engine as one cuMemcpyBatchAsync where the
driver takes it (eager, a created stream), one cuMemcpyAsync each elsewhere (fake driver, no GPU)."""
from types import SimpleNamespace

import pytest

from dmacoll.backends import cuda as cuda_backend
from dmacoll.executor import Copies, execute, lower
from dmacoll.plan import Copy, Layout, all_gather_exchange, build_plan
from tests.test_cuda_commands import HEAPS, FakeDriver

LAYOUT = Layout(input_sym=4096, output_sym=8192, staging=512)


def _plan(world=4, variant="b2b"):
    return build_plan(all_gather_exchange(world, 256), 0, variant, "push", LAYOUT)


def test_consecutive_copies_lower_to_one_run():
    program = lower(_plan())
    runs = [s for s in program.pre if isinstance(s, Copies)]
    assert [len(r.run) for r in runs] == [3]  # the three peers' copies back to back; the own copy comes later
    assert all(isinstance(c, Copy) for r in runs for c in r.run)


@pytest.fixture
def drv(monkeypatch):
    d = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", d)
    return d


PTRS = [HEAPS[0] + (r << 32) for r in range(4)]


def _engine(stream):
    return cuda_backend.CudaEngine.for_commands(0, 4, PTRS, SimpleNamespace(cuda_stream=stream))


def test_a_run_goes_out_as_one_batch_on_a_created_stream(drv):
    drv.accept_batches = True
    execute(_plan(), _engine(7), {}, "reset")
    batches = [c for c in drv.calls if c[0] == "copies"]
    assert len(batches) == 1 and len(batches[0][1]) == 3 and batches[0][2] == 7
    peers = sorted(d for d, _, _ in batches[0][1])
    assert peers == sorted(PTRS[p] + 8192 for p in (1, 2, 3))  # our slot 0 into each peer's output
    assert [c[0] for c in drv.calls].count("copy") == 1  # the own copy, alone after the signals


@pytest.mark.parametrize("case", ["legacy stream", "capture", "short run", "refused"])
def test_single_copies_where_a_batch_cannot_go(drv, case):
    drv.accept_batches = case != "refused"
    drv.capturing = case == "capture"
    plan = _plan(world=3 if case == "short run" else 4)
    eng = _engine(0 if case == "legacy stream" else 7)
    for _ in range(2):
        execute(plan, eng, {}, "reset")
    assert not [c for c in drv.calls if c[0] == "copies"]
    assert [c[0] for c in drv.calls].count("copy") == 2 * (3 if case == "short run" else 4)
    if case == "refused":  # asked once, then never again on that stream
        assert eng._batch_refused == {7}
