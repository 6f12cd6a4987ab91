"""The cuda backend's driver calls, recorded on the CPU through a fake driver module.

Checks what the GPU sees per collective (addresses, flag values, wait modes, how many
commands) without a GPU; the GPU tests (tests/gpu) check that the real driver agrees.
"""
import contextlib
from types import SimpleNamespace

import pytest

from dmacoll.backends import cuda as cuda_backend
from dmacoll.executor import execute, flag_index, lower, one_index
from dmacoll.plan import DONE, READY, Layout, all_gather_exchange, all_to_all_exchange, build_plan

HEAPS = [0x10_0000_0000, 0x20_0000_0000]  # rank 0's and rank 1's heap, as mapped on rank 0


class FakeDriver:
    """Records calls; mirrors the cuda-bindings names, enums and (err, ...) returns used by the backend."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUstreamWaitValue_flags:
        CU_STREAM_WAIT_VALUE_GEQ = 0
        CU_STREAM_WAIT_VALUE_EQ = 1

    class CUstreamBatchMemOpType:
        CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1
        CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2

    class CUstreamBatchMemOpParams:
        def __init__(self):
            self.operation = None
            self.waitValue = SimpleNamespace()
            self.writeValue = SimpleNamespace()

    def __init__(self):
        self.calls = []

    def cuMemcpyAsync(self, dst, src, n, stream):
        self.calls.append(("copy", dst, src, n, stream))
        return (0,)

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        self.calls.append(("write", addr, value, stream))
        return (0,)

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        self.calls.append(("wait", addr, value, "eq" if flags == 1 else "geq", stream))
        return (0,)

    # cuMemcpyBatchAsync, refused unless a test accepts batches: the engine then issues single copies
    class CUstreamCaptureStatus:
        CU_STREAM_CAPTURE_STATUS_NONE = 0

    class CUmemcpySrcAccessOrder:
        CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1

    class CUmemcpyAttributes:
        srcAccessOrder = 0

    CUdeviceptr = int
    accept_batches = False
    capturing = False

    def cuStreamIsCapturing(self, stream):
        return (0, int(self.capturing))

    def cuMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, idxs, num_attrs, stream):
        if not self.accept_batches:
            return (1,)
        assert count == len(dsts) == len(srcs) == len(sizes) and idxs == [0] and num_attrs == 1
        assert attrs[0].srcAccessOrder == 1  # the source read in stream order
        self.calls.append(("copies", tuple(zip(dsts, srcs, sizes)), stream))
        return (0,)

    def cuStreamBatchMemOp(self, stream, count, params, flags):
        ops = []
        for p in params:
            if p.operation == 1:
                ops.append(("wait", p.waitValue.address, p.waitValue.value,
                            "eq" if p.waitValue.flags == 1 else "geq"))
            else:
                ops.append(("write", p.writeValue.address, p.writeValue.value))
        assert count == len(params) < 256
        self.calls.append(("batch", tuple(ops), stream))
        return (0,)


@pytest.fixture
def engine(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    eng = cuda_backend.CudaEngine.for_commands(0, 2, HEAPS, SimpleNamespace(cuda_stream=7))  # no GPU
    eng.drv = drv
    return eng


def flag(rank, sync, phase, signaller):
    return HEAPS[rank] + 4 * flag_index(2, sync, phase, signaller)


def test_in_place_push_all_gather_is_three_commands(engine):
    layout = Layout(input_sym=4096, output_sym=4096, staging=512)  # rank 0's input is its output slot 0
    plan = build_plan(all_gather_exchange(2, 512, in_place=True), 0, "b2b", "push", layout)
    execute(plan, engine, {}, "reset")
    assert engine.drv.calls == [
        ("batch", (("write", flag(1, "reset", READY, 0), 1),          # tell rank 1 it may write into us
                   ("wait", flag(0, "reset", READY, 1), 1, "eq"),     # wait until we may write into rank 1
                   ("write", flag(0, "reset", READY, 1), 0)), 7),     # re-arm: the graph replays the same values
        ("copy", HEAPS[1] + 4096, HEAPS[0] + 4096, 512, 7),           # our slot 0 into rank 1's slot 0
        ("batch", (("write", flag(1, "reset", DONE, 0), 1),
                   ("wait", flag(0, "reset", DONE, 1), 1, "eq"),
                   ("write", flag(0, "reset", DONE, 1), 0)), 7),
    ]


def test_epoch_sync_writes_sequence_numbers_and_never_rearms(engine):
    layout = Layout(input_sym=8192, output_sym=16384, staging=512)
    plan = build_plan(all_to_all_exchange([[64, 64], [64, 64]]), 0, "b2b", "pull", layout)
    execute(plan, engine, {}, "epoch", epoch=41)
    memops = [op for call in engine.drv.calls if call[0] == "batch" for op in call[1]]
    assert all(op[2] == 41 for op in memops if op[0] == "write")
    assert all(op[3] == "geq" for op in memops if op[0] == "wait")
    copies = [c for c in engine.drv.calls if c[0] == "copy"]
    # pull: rank 1's chunk for us (offset 0 of its input) into our slot 1; our own chunk 0 locally
    assert sorted(copies) == sorted([("copy", HEAPS[0] + 16384 + 64, HEAPS[1] + 8192, 64, 7),
                                     ("copy", HEAPS[0] + 16384, HEAPS[0] + 8192, 64, 7)])


def test_batches_are_built_once_and_reused(engine):
    layout = Layout(input_sym=8192, output_sym=16384, staging=512)
    plan = build_plan(all_gather_exchange(2, 256), 0, "b2b", "push", layout)
    for _ in range(3):
        execute(plan, engine, {}, "reset")
    assert len(engine._batches) == 2
    # per call: batch(READY), peer copy, DONE write, local copy (while DONE travels), batch(wait DONE)
    kinds = [c[0] for c in engine.drv.calls]
    assert kinds == ["batch", "copy", "write", "copy", "batch"] * 3


def test_counted_driver_calls_counts_one_calls_commands_and_restores_the_driver(engine):
    """What the call_cost probe counts per collective: the driver calls made inside the block, by name."""
    layout = Layout(input_sym=8192, output_sym=16384, staging=512)
    plan = build_plan(all_gather_exchange(2, 256), 0, "b2b", "push", layout)
    with cuda_backend.counted_driver_calls() as counted:
        execute(plan, engine, {}, "reset")
    assert dict(counted) == {"cuStreamBatchMemOp": 2, "cuMemcpyAsync": 2, "cuStreamWriteValue32": 1}
    assert cuda_backend._drv is engine.drv  # the real module is back
    execute(plan, engine, {}, "reset")
    assert sum(counted.values()) == 5  # nothing counted after the block


def test_a_single_memop_uses_the_plain_call(engine):
    engine.memops(engine.main_queue, [cuda_backend.MemOp(True, 0, 3, 1, geq=True)])
    assert engine.drv.calls == [("wait", HEAPS[0] + 12, 1, "geq", 7)]


def test_copy_signals_are_four_byte_copies_of_the_one_word(engine):
    layout = Layout(input_sym=4096, output_sym=4096, staging=512)
    plan = build_plan(all_gather_exchange(2, 512, in_place=True), 0, "b2b", "push", layout)
    execute(plan, engine, {}, "reset", signal="copy")
    one = HEAPS[0] + 4 * one_index(2)
    assert engine.drv.calls == [
        ("copy", flag(1, "reset", READY, 0), one, 4, 7),
        ("batch", (("wait", flag(0, "reset", READY, 1), 1, "eq"), ("write", flag(0, "reset", READY, 1), 0)), 7),
        ("copy", HEAPS[1] + 4096, HEAPS[0] + 4096, 512, 7),
        ("copy", flag(1, "reset", DONE, 0), one, 4, 7),               # behind the data, same stream
        ("batch", (("wait", flag(0, "reset", DONE, 1), 1, "eq"), ("write", flag(0, "reset", DONE, 1), 0)), 7),
    ]


@pytest.mark.parametrize("wait", ["memop", "spin"])
def test_kernel_signals_are_one_put_kernel_per_group_of_flags(engine, wait):
    """signal='kernel': consecutive signals (to any peers) are one launch of dmacoll's put kernel on the flag words;
    the waits are whatever ``wait`` says."""
    calls = engine.drv.calls
    engine._kernels = SimpleNamespace(
        put=lambda stream, words, value: calls.append(("put", tuple(words), value, stream)),
        spin=lambda stream, flags, indices, value, geq: calls.append(("spin", flags, tuple(indices), value, geq)))
    layout = Layout(input_sym=4096, output_sym=4096, staging=512)
    plan = build_plan(all_gather_exchange(2, 512, in_place=True), 0, "b2b", "push", layout)
    execute(plan, engine, {}, "reset", signal="kernel", wait=wait)
    copy = ("copy", HEAPS[1] + 4096, HEAPS[0] + 4096, 512, 7)
    if wait == "spin":
        waits = [[("spin", HEAPS[0], (flag_index(2, "reset", phase, 1),), 1, False)] for phase in (READY, DONE)]
    else:
        waits = [[("batch", (("wait", flag(0, "reset", phase, 1), 1, "eq"), ("write", flag(0, "reset", phase, 1), 0)),
                   7)] for phase in (READY, DONE)]
    assert calls == [("put", (flag(1, "reset", READY, 0),), 1, 7), *waits[0], copy,
                     ("put", (flag(1, "reset", DONE, 0),), 1, 7), *waits[1]]


def test_a_group_of_kernel_signals_to_every_peer_is_one_launch(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    heaps = [0x10_0000_0000 * (r + 1) for r in range(4)]
    eng = cuda_backend.CudaEngine.for_commands(0, 4, heaps, SimpleNamespace(cuda_stream=7))
    puts = []
    eng._kernels = SimpleNamespace(put=lambda stream, words, value: puts.append(tuple(words)))
    layout = Layout(input_sym=4096, output_sym=8192, staging=512)
    execute(build_plan(all_gather_exchange(4, 512), 0, "b2b", "push", layout), eng, {}, "reset", signal="kernel")
    ready = tuple(heaps[p] + 4 * flag_index(4, "reset", READY, 0) for p in (1, 2, 3))
    done = tuple(heaps[p] + 4 * flag_index(4, "reset", DONE, 0) for p in (1, 2, 3))
    assert puts == [ready, done]  # one launch for the three READY signals, one for the three DONE


def test_constant_signals_refuse_sequence_numbers():
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(0, 0, 512))
    for signal in ("copy", "kernel"):
        with pytest.raises(ValueError, match="needs sync='reset'"):
            lower(plan, "epoch", signal)


# -- reduce collectives: copies on the copy engines, then one torch kernel on the caller's stream ------------
import torch  # noqa: E402

from dmacoll.executor import run  # noqa: E402
from dmacoll.plan import all_reduce_plans, reduce_scatter_plans  # noqa: E402


@pytest.fixture
def kernels(engine, monkeypatch):
    """Record which stream each torch kernel goes to; rank 0's heap is a CPU tensor, so the sums run (torch's
    kernels, as where NVRTC cannot build dmacoll's sum kernel; test_waits checks that one's launch)."""
    @contextlib.contextmanager
    def on_stream(queue):
        engine.drv.calls.append(("kernel", queue.cuda_stream))
        yield

    monkeypatch.setattr(cuda_backend.torch.cuda, "stream", on_stream)
    engine.heap = torch.zeros(1 << 16, dtype=torch.uint8)
    engine._no_kernels = True
    return engine


def _fill_recv(engine, recv, slots):
    """What the copy engines would have left in the receive block (the fake driver moves no data)."""
    block = torch.tensor(slots, dtype=torch.float32).view(torch.uint8).view(-1)
    engine.heap[recv: recv + block.numel()] = block


def test_reduce_scatter_sums_on_the_callers_stream_after_the_done_waits(kernels):
    layout = Layout(input_sym=8192, output_sym=16384, staging=512)
    (plan,), scratch = reduce_scatter_plans(2, 16, 0, "float32", "b2b", "push", layout)  # 4 floats per rank
    _fill_recv(kernels, scratch.recv, [[10, 20, 30, 40]])  # rank 1's chunk 0
    kernels.heap[8192: 8208] = torch.tensor([1.0, 2, 3, 4]).view(torch.uint8)  # our chunk 0, in our input
    execute(plan, kernels, {}, "reset")
    recv = scratch.recv
    assert kernels.drv.calls == [
        ("batch", (("write", flag(1, "reset", READY, 0), 1),
                   ("wait", flag(0, "reset", READY, 1), 1, "eq"),
                   ("write", flag(0, "reset", READY, 1), 0)), 7),
        ("copy", HEAPS[1] + recv, HEAPS[0] + 8192 + 16, 16, 7),      # our chunk 1 into rank 1's only slot
        ("batch", (("write", flag(1, "reset", DONE, 0), 1),          # no local copy: our chunk stays put
                   ("wait", flag(0, "reset", DONE, 1), 1, "eq"),     # rank 1's chunk 0 has landed
                   ("write", flag(0, "reset", DONE, 1), 0)), 7),
        ("kernel", 7),                                               # then the sum, on the same stream
    ]
    assert kernels.heap[16384: 16400].view(torch.float32).tolist() == [11, 22, 33, 44]


def test_two_rank_pcpy_reduce_runs_wholly_on_the_callers_stream(kernels):
    """With no local copy, two ranks' pcpy has one queue (the peer's): the caller's stream, no fork or join."""
    def parallel(tasks):
        assert len(tasks) == 1, "one queue: nothing to fork"
        tasks[0](kernels.main_queue)

    kernels.parallel = parallel
    layout = Layout(input_sym=None, output_sym=None, staging=512)
    (plan,), scratch = reduce_scatter_plans(2, 8, 0, "float32", "pcpy", "pull", layout)
    _fill_recv(kernels, scratch.recv, [[3, 4]])
    output, input = torch.full((2,), float("nan")), torch.tensor([1.0, 2, 99, 99])
    execute(plan, kernels, {"input": 0x5000, "output": 0x6000, "tensors": {"output": output, "input": input}},
            "reset")
    calls = kernels.drv.calls
    assert calls[0] == ("copy", HEAPS[0] + scratch.staged_input, 0x5000, 16, 7)  # stage our private input
    assert calls[2] == ("copy", HEAPS[0] + scratch.recv, HEAPS[1] + scratch.staged_input, 8, 7)  # pull slot 0
    assert calls[-2:] == [("batch", (("write", flag(1, "reset", DONE, 0), 1),
                                     ("wait", flag(0, "reset", DONE, 1), 1, "eq"),
                                     ("write", flag(0, "reset", DONE, 1), 0)), 7), ("kernel", 7)]
    assert output.tolist() == [4, 6]  # our chunk (read from the private input) + rank 1's, into the output


def test_all_reduce_gathers_the_summed_chunk_after_the_kernel(kernels):
    layout = Layout(input_sym=16384, output_sym=16384, staging=512)  # in place in the heap
    plans, scratch = all_reduce_plans([8, 8], 0, "float32", "b2b", "push", layout)
    _fill_recv(kernels, scratch.recv, [[3, 4]])
    kernels.heap[16384: 16392] = torch.tensor([1.0, 2]).view(torch.uint8)  # our chunk 0, summed in place
    for i, plan in enumerate(plans):
        run(lower(plan, "epoch"), kernels, {}, epoch=41 + i)
    calls = kernels.drv.calls
    kernel = calls.index(("kernel", 7))
    waits = [(i, op) for i, c in enumerate(calls) if c[0] in ("batch", "wait")
             for op in (c[1] if c[0] == "batch" else [c[:4]]) if op[0] == "wait"]
    # the kernel follows the first plan's DONE wait and precedes the second plan's handshake
    assert [op for i, op in waits if i < kernel] == [("wait", flag(0, "epoch", READY, 1), 41, "geq"),
                                                     ("wait", flag(0, "epoch", DONE, 1), 41, "geq")]
    assert [op for i, op in waits if i > kernel] == [("wait", flag(0, "epoch", READY, 1), 42, "geq"),
                                                     ("wait", flag(0, "epoch", DONE, 1), 42, "geq")]
    gather = [c for c in calls[kernel:] if c[0] == "copy"]
    assert gather == [("copy", HEAPS[1] + 16384, HEAPS[0] + 16384, 8, 7)]  # our summed chunk 0 to rank 1
    assert kernels.heap[16384: 16392].view(torch.float32).tolist() == [4, 6]


def test_a_timed_out_engine_refuses_to_replay_a_recorded_call(engine):
    """After the watchdog's timeout every call raises it: a prerecorded call too, whose replay runs no ``work`` (and
    so no begin_call). Found on one H100: the second call of a timed-out communicator replayed silently."""
    from dmacoll import DmaCollTimeoutError
    from dmacoll.backends.watchdog import Watchdog

    replayed, worked = [], []
    engine.watchdog = Watchdog(engine, "test", start=False)
    engine._graphs = {"key": SimpleNamespace(replay=lambda: replayed.append(1))}
    engine.watchdog.error = DmaCollTimeoutError("rank 0: all_gather call #1 did not complete within 2 s")
    with pytest.raises(DmaCollTimeoutError, match="did not complete"):
        engine.replay_recorded("key", lambda: worked.append(1), "all_gather call #2", "reset")
    with pytest.raises(DmaCollTimeoutError):
        engine.begin_call("all_gather call #3")
    assert replayed == [] and worked == []
