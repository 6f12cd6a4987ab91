"""A driver that refuses stream-memop writes into peer memory (CUDA >= 13.1) gets copy-engine flags, not a crash."""
import dataclasses
from types import SimpleNamespace

import pytest

from dmacoll.backends import cuda as cuda_backend
from dmacoll.errors import DmaCollError
from dmacoll.executor import execute, flag_index, lower
from dmacoll.plan import Layout, all_gather_exchange, all_to_all_exchange, build_plan
from dmacoll_lab.verify.launch import run_ranks


def test_the_refusal_is_found_from_the_version_or_the_self_test():
    calls = []
    write, barrier = (lambda: calls.append("write")), (lambda: calls.append("barrier"))
    why = cuda_backend.memop_write_refusal(13010, write, lambda: True, barrier)
    assert "13.1" in why and calls == []  # a driver too new: decided without writing (alike on every rank)
    assert cuda_backend.memop_write_refusal(13000, write, lambda: True, barrier) == ""
    assert calls == ["write", "barrier"]

    def refuse():
        raise DmaCollError("cuStreamWriteValue32 (to a peer) failed: CUDA_ERROR_NOT_SUPPORTED")
    calls.clear()
    why = cuda_backend.memop_write_refusal(12080, refuse, lambda: True, barrier)
    assert "refused" in why and "NOT_SUPPORTED" in why and calls == ["barrier"]  # the barrier runs anyway
    assert "did not arrive" in cuda_backend.memop_write_refusal(12080, write, lambda: False, barrier)


def _refusing_host(rank, world, sync="reset"):
    """The host emulator with a driver that refuses memop writes into a peer's memory: every op, variant and
    direction must still give the right result, with no such write issued."""
    from dmacoll import Communicator, Options
    from dmacoll.backends.host import HostEngine
    from dmacoll_lab.verify.check import cases, run_cases

    refused = []
    issue = HostEngine.memops

    def memops(self, queue, ops):
        remote = [op for op in ops if not op.wait and op.rank != self.rank and op.via == "memop"]
        if remote:
            refused.append(remote)
            raise DmaCollError("fake driver: CUDA_ERROR_NOT_SUPPORTED for a stream memop write to peer memory")
        issue(self, queue, ops)

    HostEngine.memops = memops
    HostEngine.capabilities = dataclasses.replace(
        HostEngine.capabilities, remote_memop_writes=False,
        memop_refusal="the fake driver does not take stream memory-operation writes to peer memory")
    try:
        comm = Communicator(backend="host", timeout_s=30, options=Options(sync=sync))
    except DmaCollError as e:
        return str(e)
    rows = run_cases(comm, cases(["pcpy", "b2b", "multi"], ["push", "pull"], ["float32", "int32"], [1, 33]))
    signal = comm.last_options.signal
    comm.close()
    return rows, refused, signal


@pytest.mark.parametrize("world", [2, 3])
def test_every_op_completes_on_copy_flags_where_the_driver_refuses_memop_writes(world):
    for rows, refused, signal in run_ranks(_refusing_host, world):
        assert signal == "copy" and refused == []
        assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:2]
        assert {r["op"] for r in rows} == {"all_gather", "all_to_all", "all_to_all_v", "reduce_scatter", "all_reduce"}


def test_epoch_sync_says_why_it_cannot_run_there():
    for error in run_ranks(_refusing_host, 2, "epoch"):
        assert "sync='epoch'" in error and "does not take stream memory-operation writes" in error


def test_copy_flags_issue_no_memop_write_into_peer_memory(monkeypatch):
    from tests.test_cuda_commands import HEAPS, FakeDriver

    drv = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    eng = cuda_backend.CudaEngine.for_commands(0, 2, HEAPS, SimpleNamespace(cuda_stream=7))
    for ex in (all_gather_exchange(2, 4096), all_to_all_exchange([[2048, 2048], [2048, 2048]])):
        for variant in ("pcpy", "b2b", "multi"):
            for direction in ("push", "pull"):
                drv.calls.clear()
                plan = build_plan(ex, 0, variant, direction, Layout(0, 1 << 20, 2 << 20))
                # queues fork onto side streams (a GPU's): here every queue's steps go out on the main one
                plan = plan.__class__(plan.rank, plan.world, plan.pre, (sum(plan.queues, ()),), plan.post)
                execute(plan, eng, {"input": 0, "output": 0}, "reset", signal="copy")
                writes = [c[1] for c in drv.calls if c[0] == "write"] + \
                    [op[1] for c in drv.calls if c[0] == "batch" for op in c[1] if op[0] == "write"]
                assert writes and all(HEAPS[0] <= a < HEAPS[1] for a in writes), (variant, direction)  # re-arms
                flags = [c for c in drv.calls if c[0] == "copy" and c[3] == 4]
                assert flags and all(c[1] >= HEAPS[1] for c in flags)  # every signal: a 4-byte copy to the peer
