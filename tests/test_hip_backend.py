"""The hip backend without AMD hardware: hip-python recorded through a fake module.

* loading: a clear "hip backend unavailable" when hip-python is missing (as here), both module
  layouts when present, import of dmacoll never needing it;
* equivalence: for every Program of all-gather, all-to-all(-v), reduce-scatter and all-reduce
  (variants pcpy/b2b/multi, push/pull, sync reset/epoch, signal memop/copy) at world sizes 2..8,
  the HIP calls are the cuda backend's driver calls one for one (same copies, flag words,
  values, wait modes, streams and fork/join events), batched memops counted one by one;
* execution: the recorded HIP calls of all ranks, run by a small simulator of streams, events
  and memory in random interleavings, produce the collective's result over two calls (so the
  flags are re-armed or advanced correctly);
* errors: a failing HIP call raises with the function name and hipError code.
"""
import contextlib
import ctypes
import enum
import itertools
import random
import sys
import time
import types

import pytest
import torch

from dmacoll import ops
from dmacoll import plan as plan_mod
from dmacoll.backends import cuda as cuda_backend
from dmacoll.backends import hip as hip_backend
from dmacoll.backends import hip_api, hip_memory, ipc, resolve
from dmacoll.backends import reduce as reduce_backend
from dmacoll.backends.hip_api import HipApi, HipError
from dmacoll.errors import BackendUnavailable, DmaCollError, DmaCollTimeoutError, InvalidArgument
from dmacoll.executor import MemOp, flag_words, gate_index, lower, one_index, run
from test_cuda_commands import FakeDriver as CudaFakeDriver
from dmacoll.plan import DIRECTIONS, VARIANTS, Layout, all_gather_exchange, all_to_all_exchange, build_plan

MAIN = 7  # the caller's stream
SPAN = 1 << 32
CUDA_HEAPS = [(0x10 + r) << 36 for r in range(8)]
HIP_HEAPS = [(0x40 + r) << 36 for r in range(8)]
HIP_FLAGS = [(0x80 + r) << 36 for r in range(8)]  # signal-style: one word every 64 bytes, apart from the heap
BASES = {"input": 0x7 << 44, "output": 0x8 << 44}
HEAP_BYTES = 1 << 18
SYNC_SIGNAL = (("reset", "memop"), ("epoch", "memop"), ("reset", "copy"))


def align(n, a=512):
    return -(-n // a) * a


def hip_flag_addrs(world):
    return [[HIP_FLAGS[r] + 64 * i for i in range(flag_words(world))] for r in range(world)]


# -- fakes: hip-python, cuda-bindings, torch streams/events --------------------------------
class HipErr(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorNotSupported = 801


class FakeHip:
    """Records calls; mirrors hip-python's names, constants and (hipError_t, *outs) returns.
    ``fail`` maps a function name to the error code it returns."""

    hipError_t = HipErr
    hipStreamWaitValueGte, hipStreamWaitValueEq = 0, 1

    class hipMemcpyKind(enum.IntEnum):
        hipMemcpyHostToDevice = 1
        hipMemcpyDeviceToHost = 2
        hipMemcpyDeviceToDevice = 3
        hipMemcpyDeviceToDeviceNoCU = 1024

    def __init__(self, log=None, fail=None):
        self.log = [] if log is None else log
        self.fail = fail or {}

    def _done(self, name, entry, *outs):
        self.log.append(entry)
        return (HipErr(self.fail.get(name, 0)), *outs)

    def hipMemcpyAsync(self, dst, src, n, kind, stream):
        # hip-python type-checks enum arguments: the binding's own hipMemcpyKind member, routed to SDMA
        assert isinstance(kind, FakeHip.hipMemcpyKind) and kind == 1024
        return self._done("hipMemcpyAsync", ("copy", dst, src, n, stream))

    def hipStreamWriteValue32(self, stream, addr, value, flags):
        assert flags == 0
        return self._done("hipStreamWriteValue32", ("write", addr, value, stream))

    def hipStreamWaitValue32(self, stream, addr, value, flags, mask):
        assert mask == 0xFFFFFFFF and flags in (0, 1)
        return self._done("hipStreamWaitValue32", ("wait", addr, value, "eq" if flags == 1 else "geq", stream))


class FakeHipWithBatch(FakeHip):
    def hipMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, stream):
        assert count == len(dsts) == len(srcs) == len(sizes) and attrs is None and num_attrs == 0
        return self._done("hipMemcpyBatchAsync", ("batch", tuple(zip(dsts, srcs, sizes)), stream))


class FakeDriver(CudaFakeDriver):
    """cuda-bindings as the cuda backend calls it (test_cuda_commands' fake) writing into a shared log,
    with batched memops logged one by one."""

    def __init__(self, log):
        self.calls = self.log = log

    def cuStreamBatchMemOp(self, stream, count, params, flags):
        for p in params:
            if p.operation == 1:
                self.cuStreamWaitValue32(stream, p.waitValue.address, p.waitValue.value, p.waitValue.flags)
            else:
                self.cuStreamWriteValue32(stream, p.writeValue.address, p.writeValue.value, 0)
        return (0,)


class FakeStream:
    def __init__(self, sid, log):
        self.cuda_stream, self.log = sid, log

    def wait_event(self, event):
        self.log.append(("wait_event", self.cuda_stream, event.id))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.cuda_stream, other.cuda_stream))

    def synchronize(self):
        pass

    def record_event(self):  # the watchdog polls it: the fake GPU is done at once
        return types.SimpleNamespace(query=lambda: True)


class FakeEvent:
    def __init__(self, eid, log):
        self.id, self.log = eid, log

    def record(self, stream):
        self.log.append(("record", self.id, stream.cuda_stream))

    def query(self):
        return True


class FakeTorch:
    """torch.cuda's streams and events, numbered from 100 in creation order and logged."""

    def __init__(self, log):
        self.log, self.ids = log, itertools.count(100)

    def stream(self, device=None):
        return FakeStream(next(self.ids), self.log)

    def event(self, *args, **kwargs):
        return FakeEvent(next(self.ids), self.log)


@pytest.fixture
def fake_torch(monkeypatch):
    """Patch torch.cuda for both backends; returns a factory giving a fresh (log, FakeTorch)."""
    state = {}

    def fresh():
        log = []
        state["t"] = FakeTorch(log)
        state["main"] = FakeStream(MAIN, log)
        return log, state["t"], state["main"]

    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: state["t"].stream())
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: state["t"].event())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: state["main"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return fresh


class ReduceLog:
    """Stands in for sum_slots in both backends: logs which bytes a reduction reads and writes."""

    def __init__(self, log, heap, tensors):
        self.log, self.heap, self.tensors = log, heap, tensors

    def where(self, t):
        for name, base in (("sym", self.heap), *self.tensors.items()):
            off = t.data_ptr() - base.data_ptr()
            if 0 <= off < base.numel() * base.element_size():
                return (name, off)
        raise AssertionError("a reduction touched memory outside the heap and the caller's tensors")

    def __call__(self, block, out, count, dtype, own=None):
        self.log.append(("reduce", self.where(block), block.numel(), self.where(out), out.numel(), count, dtype,
                         None if own is None else (self.where(own), own.numel())))


def cuda_engine(rank, world, main, heap):
    """The cuda engine with torch's sum, the local step hip runs too (cuda's own sum kernel: test_waits.py)."""
    eng = cuda_backend.CudaEngine.for_commands(rank, world, CUDA_HEAPS[:world], main, heap=heap)
    eng._no_kernels = True
    return eng


def hip_engine(rank, world, main, heap=None, module=None, batch=False):
    module = module if module is not None else FakeHip()
    return hip_backend.HipEngine.for_commands(HipApi(module), rank, world, HIP_HEAPS[:world], hip_flag_addrs(world),
                                              main, batch=batch, heap=heap)


def symbolizer(heaps, flag_addrs, world):
    """Maps an address back to ("flag", rank, index), ("sym", rank, offset) or (space, offset)."""
    flags = {a: ("flag", r, i) for r, row in enumerate(flag_addrs or ()) for i, a in enumerate(row)}
    nflags = flag_words(world)

    def sym(addr):
        if addr in flags:
            return flags[addr]
        for r in range(world):
            off = addr - heaps[r]
            if 0 <= off < SPAN:
                return ("flag", r, off // 4) if flag_addrs is None and off < 4 * nflags else ("sym", r, off)
        for name, base in BASES.items():
            if 0 <= addr - base < SPAN:
                return (name, addr - base)
        raise AssertionError(f"address {addr:#x} is in no known region")
    return sym


def normalize(log, sym):
    out = []
    for e in log:
        if e[0] in ("copy",):
            out.append(("copy", sym(e[1]), sym(e[2]), e[3], e[4]))
        elif e[0] in ("write", "wait"):
            out.append((e[0], sym(e[1]), *e[2:]))
        else:
            out.append(e)
    return out


# -- which programs ------------------------------------------------------------------------
def cases(world, rank, nbytes=256):
    """(label, plans) for every collective and buffer kind at this rank, as the communicator lays them out."""
    staging = align(flag_words(world) * 4)
    heap0 = staging + (1 << 15)
    sym = Layout(heap0, heap0 + (1 << 15), staging)
    priv = Layout(None, None, staging)
    in_place = Layout(heap0 + (1 << 15) + rank * nbytes, heap0 + (1 << 15), staging)
    uneven = [[((q * world + p) % 4) * 64 for p in range(world)] for q in range(world)]
    for variant in VARIANTS:
        for direction in DIRECTIONS:
            def plan(ex, layout, v=variant, d=direction):
                return build_plan(ex, rank, v, d, layout, engines=2)
            yield f"all_gather {variant}/{direction} sym", [plan(all_gather_exchange(world, nbytes), sym)]
            yield f"all_gather {variant}/{direction} in place", [plan(all_gather_exchange(world, nbytes, True),
                                                                       in_place)]
            yield f"all_gather {variant}/{direction} private", [plan(all_gather_exchange(world, nbytes), priv)]
            yield f"all_to_all {variant}/{direction} sym", [plan(all_to_all_exchange([[nbytes] * world] * world), sym)]
            yield f"all_to_all {variant}/{direction} private", [plan(all_to_all_exchange([[nbytes] * world] * world),
                                                                     priv)]
            yield f"all_to_all_v {variant}/{direction} sym", [plan(all_to_all_exchange(uneven), sym)]
            if variant == "multi":  # large copies are split over the queues
                yield f"all_gather multi/{direction} split", [plan(all_gather_exchange(world, 3 << 20), sym)]
            for layout, kind in ((sym, "sym"), (priv, "private")):
                yield (f"reduce_scatter {variant}/{direction} {kind}",
                       list(plan_mod.reduce_scatter_plans(world, 64, rank, "float32", variant, direction, layout,
                                                          2)[0]))
                chunks = [4 * c for c in plan_mod.chunk_elements(37, world)]
                yield (f"all_reduce {variant}/{direction} {kind}",
                       list(plan_mod.all_reduce_plans(chunks, rank, "float32", variant, direction, layout, 2)[0]))


def issue(backend, plans, world, rank, sync, signal, fresh, monkeypatch):
    """The normalised calls one backend makes for ``plans`` on ``rank``."""
    log, _, main = fresh()
    heap = torch.zeros(HEAP_BYTES, dtype=torch.uint8)
    tensors = {name: torch.zeros(HEAP_BYTES, dtype=torch.uint8) for name in ("input", "output")}
    reduce_log = ReduceLog(log, heap, tensors)
    monkeypatch.setattr(reduce_backend, "sum_slots", reduce_log)  # the local step both backends run
    if backend == "cuda":
        monkeypatch.setattr(cuda_backend, "_drv", FakeDriver(log))
        eng, sym = cuda_engine(rank, world, main, heap), symbolizer(CUDA_HEAPS, None, world)
    else:
        eng = hip_engine(rank, world, main, heap, FakeHip(log))
        sym = symbolizer(HIP_HEAPS, hip_flag_addrs(world), world)
    bases = {**BASES, "tensors": tensors}
    for p in plans:
        run(lower(p, sync, signal), eng, bases, epoch=5)
    return normalize(log, sym)


# -- equivalence with the cuda backend ------------------------------------------------------
@pytest.mark.parametrize("world", range(2, 9))
def test_hip_issues_what_cuda_issues_for_every_program(world, fake_torch, monkeypatch):
    ranks = range(world) if world <= 4 else sorted({0, 1, world // 2, world - 1})
    checked = 0
    for rank in ranks:
        for label, plans in cases(world, rank):
            for sync, signal in SYNC_SIGNAL:
                want = issue("cuda", plans, world, rank, sync, signal, fake_torch, monkeypatch)
                got = issue("hip", plans, world, rank, sync, signal, fake_torch, monkeypatch)
                assert got == want, f"world {world} rank {rank} {label} {sync}/{signal}"
                checked += 1
    assert checked > 100


def test_in_place_push_all_gather_is_seven_calls(fake_torch):
    log, _, main = fake_torch()
    eng = hip_engine(0, 2, main, module=FakeHip(log))
    layout = Layout(input_sym=4096, output_sym=4096, staging=512)
    run(lower(build_plan(all_gather_exchange(2, 512, in_place=True), 0, "b2b", "push", layout), "reset"), eng, BASES)
    f = hip_flag_addrs(2)

    def flag(rank, phase, signaller):
        return f[rank][phase * 2 + signaller]  # reset words: (sync 0 * phases + phase) * world + signaller
    assert log == [
        ("write", flag(1, 0, 0), 1, MAIN),  # READY to rank 1
        ("wait", flag(0, 0, 1), 1, "eq", MAIN),  # rank 1's READY
        ("write", flag(0, 0, 1), 0, MAIN),  # re-arm
        ("copy", HIP_HEAPS[1] + 4096, HIP_HEAPS[0] + 4096, 512, MAIN),
        ("write", flag(1, 1, 0), 1, MAIN),
        ("wait", flag(0, 1, 1), 1, "eq", MAIN),
        ("write", flag(0, 1, 1), 0, MAIN),
    ]


# -- execution: a simulator of streams, events and memory ---------------------------------
class Memory:
    """Byte regions at fake addresses: every rank's heap, flag words, private input and output."""

    def __init__(self, world):
        self.regions = {}
        for r in range(world):
            self.regions[HIP_HEAPS[r]] = bytearray(HEAP_BYTES)
            self.regions[HIP_FLAGS[r]] = bytearray(64 * flag_words(world))
            self.regions[BASES["input"] + r * (1 << 28)] = bytearray(1 << 16)
            self.regions[BASES["output"] + r * (1 << 28)] = bytearray(1 << 16)
        f = hip_flag_addrs(world)
        for r in range(world):  # the ONE word
            self.write(f[r][one_index(world)], (1).to_bytes(4, "little"))

    def locate(self, addr, n):
        for base, buf in self.regions.items():
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base
        raise AssertionError(f"{n} bytes at {addr:#x} are outside every region")

    def read(self, addr, n):
        buf, off = self.locate(addr, n)
        return bytes(buf[off: off + n])

    def write(self, addr, data):
        buf, off = self.locate(addr, len(data))
        buf[off: off + len(data)] = data

    def word(self, addr):
        return int.from_bytes(self.read(addr, 4), "little")


def simulate(logs, mem, rng):
    """Run every stream's calls in order, streams interleaved at random, waits blocking."""
    queues = {}
    for log in logs:
        stream_of = {"copy": 4, "write": 3, "wait": 4, "record": 2, "wait_event": 1, "batch": 2}
        for e in log:
            queues.setdefault(e[stream_of[e[0]]], []).append(e)
    pos = dict.fromkeys(queues, 0)
    recorded = set()

    def ready(e):
        if e[0] == "wait":
            v = mem.word(e[1])
            return v == e[2] if e[3] == "eq" else v >= e[2]
        return e[0] != "wait_event" or e[2] in recorded

    while True:
        heads = [s for s in queues if pos[s] < len(queues[s]) and ready(queues[s][pos[s]])]
        if not heads:
            stuck = {s: queues[s][pos[s]] for s in queues if pos[s] < len(queues[s])}
            assert not stuck, f"deadlock: {stuck}"
            return
        s = rng.choice(heads)
        e = queues[s][pos[s]]
        pos[s] += 1
        if e[0] == "copy":
            mem.write(e[1], mem.read(e[2], e[3]))
        elif e[0] == "batch":  # copies of a batch may run in any order: they never overlap
            for dst, src, n in rng.sample(e[1], len(e[1])):
                mem.write(dst, mem.read(src, n))
        elif e[0] == "write":
            mem.write(e[1], e[2].to_bytes(4, "little"))
        elif e[0] == "record":
            recorded.add(e[1])


def layouts(world, rank, nbytes, kind):
    staging = align(flag_words(world) * 4)
    heap0 = staging + (1 << 15)
    return {"sym": Layout(heap0, heap0 + (1 << 15), staging),
            "in place": Layout(heap0 + (1 << 15) + rank * nbytes, heap0 + (1 << 15), staging),
            "private": Layout(None, None, staging)}[kind]


@pytest.mark.parametrize("world", range(2, 9))
def test_recorded_hip_calls_perform_the_collectives(world, fake_torch, monkeypatch, seed):
    nbytes = 96
    uneven = [[((q + 2 * p) % 3) * 32 for p in range(world)] for q in range(world)]
    exchanges = {"all_gather": lambda ip: all_gather_exchange(world, nbytes, ip),
                 "all_to_all": lambda ip: all_to_all_exchange([[nbytes] * world] * world),
                 "all_to_all_v": lambda ip: all_to_all_exchange(uneven)}
    rng = random.Random(seed)
    combos = [(op, kind) for op in exchanges for kind in ("sym", "private", "in place")
              if kind != "in place" or op == "all_gather"]
    for (op, kind), variant, direction, (sync, signal) in itertools.product(combos, VARIANTS, DIRECTIONS,
                                                                             SYNC_SIGNAL):
        if world > 4 and rng.random() < 0.5:
            continue  # larger worlds: a random half of the combinations
        log, _, _ = fake_torch()
        mem = Memory(world)
        ex = exchanges[op](kind == "in place")
        batch = rng.random() < 0.3  # hipMemcpyBatchAsync for runs of copies
        engines, programs, bases, lays = [], [], [], []
        for r in range(world):
            lay = layouts(world, r, nbytes, kind)
            main = FakeStream(1000 + r, log)
            module = (FakeHipWithBatch if batch else FakeHip)(log)
            engines.append(hip_engine(r, world, main, module=module, batch=batch))
            programs.append(lower(build_plan(ex, r, variant, direction, lay, engines=2), sync, signal))
            bases.append({"input": BASES["input"] + r * (1 << 28), "output": BASES["output"] + r * (1 << 28)})
            lays.append(lay)

        def where(space_off, r, lay, offset):
            sym_off = lay.input_sym if space_off == "input" else lay.output_sym
            return HIP_HEAPS[r] + sym_off + offset if sym_off is not None else bases[r][space_off] + offset
        for call in (1, 2):
            data = {r: bytes(rng.randrange(256) for _ in range(ex.input_bytes(r))) for r in range(world)}
            for r in range(world):
                if ex.in_place_self:  # the input is the rank's own slot of the output
                    mem.write(where("output", r, lays[r], ex.dst[r][r]), data[r])
                else:
                    mem.write(where("input", r, lays[r], 0), data[r])
                    mem.write(where("output", r, lays[r], 0), b"\xee" * ex.output_bytes(r))  # poison
            del log[:]
            for r in range(world):
                engines[r].main_queue = FakeStream(1000 + r, log)
                run(programs[r], engines[r], bases[r], epoch=call)
                engines[r].flush_batched()  # as end_call does
            simulate([log], mem, rng)
            for q in range(world):
                for p in range(world):
                    n = ex.nbytes[q][p]
                    got = mem.read(where("output", p, lays[p], ex.dst[q][p]), n)
                    assert got == data[q][ex.src[q][p]: ex.src[q][p] + n], \
                        f"seed {seed}: {op} {kind} {variant}/{direction} {sync}/{signal} batch={batch} call {call}: " \
                        f"rank {q} -> {p}"
        if sync == "reset":  # every collective flag is re-armed after each call
            for r in range(world):
                words = [mem.word(a) for a in hip_flag_addrs(world)[r][: gate_index(world, 0)]]
                assert not any(words), f"seed {seed}: {words}"


# -- batching, gates, kernel signals, watchdog ----------------------------------------------
def test_batched_copies_are_the_same_copies_in_one_call_per_run(fake_torch):
    layout = Layout(None, None, 512)
    plan = build_plan(all_to_all_exchange([[64] * 4] * 4), 1, "b2b", "push", layout)
    log, _, main = fake_torch()
    run(lower(plan, "reset"), hip_engine(1, 4, main, module=FakeHip(log)), BASES)
    plain = list(log)
    log, _, main = fake_torch()
    eng = hip_engine(1, 4, main, module=FakeHipWithBatch(log), batch=True)
    run(lower(plan, "reset"), eng, BASES)
    eng.flush_batched()  # what end_call does
    batches = [len(e[1]) for e in log if e[0] == "batch"]
    assert batches == [3, 2]  # the three peer copies back to back; the staged chunks moved out (2 runs)
    flat = [x for e in log for x in ([("copy", *c, e[2]) for c in e[1]] if e[0] == "batch" else [e])]
    assert flat == plain  # same copies, same order relative to every flag operation


def test_batching_needs_the_call_and_falls_back_on_another_signature(fake_torch):
    log, _, main = fake_torch()
    assert not hip_engine(0, 2, main, module=FakeHip(log), batch=True).batch  # binding without the call

    class OtherShape(FakeHip):
        def hipMemcpyBatchAsync(self, dsts, srcs, sizes, count, stream):  # a different generation
            raise AssertionError("not reached: the arity differs")
    plan = build_plan(all_to_all_exchange([[64] * 3] * 3), 0, "b2b", "push", Layout(None, None, 512))
    run(lower(plan, "reset"), hip_engine(0, 3, main, module=FakeHip(log)), BASES)
    plain = list(log)
    log, _, main = fake_torch()
    eng = hip_engine(0, 3, main, module=OtherShape(log), batch=True)
    assert eng.batch
    run(lower(plan, "reset"), eng, BASES)
    eng.flush_batched()
    assert not eng.batch and log == plain  # the first flush found the mismatch: copies one by one


def test_gates_issue_what_cuda_issues(fake_torch, monkeypatch):
    def gates(eng):
        eng.gate_open(2)
        eng.memops(torch.cuda.current_stream(), (MemOp(False, 1, 3, 1),))  # a call made while the gate is open
        eng.gate_close(2)
        eng.gate_release(2, FakeStream(55, log))
        eng.gate_wait(2)

    log, _, main = fake_torch()
    monkeypatch.setattr(cuda_backend, "_drv", FakeDriver(log))
    eng = cuda_engine(0, 2, main, None)
    eng._gate_streams, eng._gate_done = {}, {}
    gates(eng)
    want = normalize(log, symbolizer(CUDA_HEAPS, None, 2))
    log, _, main = fake_torch()
    gates(hip_engine(0, 2, main, module=FakeHip(log)))
    got = normalize(log, symbolizer(HIP_HEAPS, hip_flag_addrs(2), 2))
    assert got == want
    gate = ("flag", 0, gate_index(2, 2))
    assert ("wait", gate, 1, "eq", 100) in got and ("write", gate, 1, 55) in got


def test_kernel_signals_are_refused_with_the_alternatives(fake_torch):
    _, _, main = fake_torch()
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(4096, 8192, 512))
    with pytest.raises(InvalidArgument, match="signal='memop' or 'copy'"):
        run(lower(plan, "reset", "kernel"), hip_engine(0, 2, main), BASES)


class FlagWords(FakeHip):
    """Reads of a flag word to the host give the word's address mod 7."""

    def hipMemcpyAsync(self, dst, src, n, kind, stream):
        if kind != 2:  # not device -> host
            return super().hipMemcpyAsync(dst, src, n, kind, stream)
        assert n == 4 and stream == 99  # on the release stream: never behind the stuck queue
        ctypes.memmove(dst, ctypes.byref(ctypes.c_uint32(src % 7)), 4)
        return (HipErr.hipSuccess,)


def test_watchdog_reads_the_flags_and_releases_every_own_wait(fake_torch):
    log, t, main = fake_torch()
    eng = hip_engine(1, 2, main, module=FlagWords(log))
    eng.release_stream = FakeStream(99, log)
    eng.watchdog.expire("all_gather call #3", 1)
    assert isinstance(eng.watchdog.error, DmaCollTimeoutError) and "all_gather call #3" in str(eng.watchdog.error)
    own = hip_flag_addrs(2)[1]
    assert str([a % 7 for a in own]) in str(eng.watchdog.error)
    assert log == [("write", a, 1, 99) for a in own[: one_index(2)]]
    with pytest.raises(DmaCollTimeoutError):
        eng.begin_call("next")


def test_the_watchdog_s_read_of_the_flags_is_bounded(fake_torch):
    # a read that never completes (the GPU wedged) is given up after its wait, not waited for forever
    log, t, main = fake_torch()
    eng = hip_engine(1, 2, main, module=FlagWords(log))
    eng.release_stream = FakeStream(99, log)
    eng.release_stream.record_event = lambda: types.SimpleNamespace(query=lambda: False)
    t0 = time.monotonic()
    assert eng.read_own_flags(0.05) is None
    assert time.monotonic() - t0 < 5


# -- errors --------------------------------------------------------------------------------
def test_a_failing_call_names_the_function_and_the_hip_error(fake_torch):
    _, _, main = fake_torch()
    plan = build_plan(all_gather_exchange(2, 64), 0, "b2b", "push", Layout(4096, 8192, 512))
    eng = hip_engine(0, 2, main, module=FakeHip(fail={"hipStreamWaitValue32": 1}))
    with pytest.raises(HipError, match=r"hipStreamWaitValue32 failed: hipErrorInvalidValue \(hipError 1\)") as e:
        run(lower(plan, "reset"), eng, BASES)
    assert (e.value.function, e.value.code) == ("hipStreamWaitValue32", 1)
    assert isinstance(e.value, DmaCollError)  # the communicator marks itself unusable, as for cuda errors
    eng = hip_engine(0, 2, main, module=FakeHip(fail={"hipMemcpyAsync": 801}))
    with pytest.raises(HipError, match="hipMemcpyAsync failed: hipErrorNotSupported"):
        run(lower(plan, "reset"), eng, BASES)


def test_a_plain_int_status_is_checked_too():
    mod = types.SimpleNamespace(hipStreamQuery=lambda s: 600)  # a ctypes-style binding: bare int, no enum
    with pytest.raises(HipError, match=r"hipStreamQuery failed: hipError 600$"):
        HipApi(mod).hipStreamQuery(7)
    assert HipApi(types.SimpleNamespace(hipGetDevice=lambda: (0, 3))).hipGetDevice() == 3


# -- loading -------------------------------------------------------------------------------
@pytest.fixture
def clean_loader(monkeypatch):
    for name in ("hip", "rocm", "rocm.bindings", "rocm.bindings.hip"):
        monkeypatch.setitem(sys.modules, name, None)  # None: importing raises ImportError
    hip_api.reset_loader()
    yield monkeypatch
    hip_api.reset_loader()


def test_selection_says_hip_is_unavailable_and_why(clean_loader):
    with pytest.raises(BackendUnavailable) as e:
        resolve("hip")
    msg = str(e.value)
    assert msg.startswith("hip backend unavailable: hip-python is not importable")
    assert "from hip import hip" in msg and "from rocm.bindings import hip" in msg
    assert msg.endswith("install hip-python matching your ROCm, see envs/rocm.yaml")
    with pytest.raises(BackendUnavailable, match="hip backend unavailable"):
        hip_backend.HipEngine(None, 1 << 20, flag_words(2), 1.0)


def test_both_module_layouts_load(clean_loader):
    mod = types.ModuleType("hip.hip")
    pkg = types.ModuleType("hip")
    pkg.hip = mod
    clean_loader.setitem(sys.modules, "hip", pkg)
    assert hip_api.load() == (mod, "hip")
    hip_api.reset_loader()
    clean_loader.setitem(sys.modules, "hip", types.ModuleType("hip"))  # hip-python 6.x: a submodule
    clean_loader.setitem(sys.modules, "hip.hip", mod)
    assert hip_api.load() == (mod, "hip")
    hip_api.reset_loader()
    clean_loader.setitem(sys.modules, "hip", None)
    new = types.ModuleType("rocm.bindings.hip")
    clean_loader.setitem(sys.modules, "rocm", types.ModuleType("rocm"))
    clean_loader.setitem(sys.modules, "rocm.bindings", types.ModuleType("rocm.bindings"))
    clean_loader.setitem(sys.modules, "rocm.bindings.hip", new)
    assert hip_api.load() == (new, "rocm.bindings")
    assert hip_backend.available() is None or "hip-python" not in hip_backend.available()


def test_auto_picks_hip_on_rocm_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    assert resolve("auto") == "hip"
    monkeypatch.setattr(torch.version, "hip", None)
    assert resolve("auto") == "cuda"


# -- IPC handles and flag memory ---------------------------------------------------------
def test_constants_are_the_bindings_own_objects_else_header_values():
    api = HipApi(FakeHip())
    assert api.const("hipMemcpyDeviceToDeviceNoCU") is FakeHip.hipMemcpyKind.hipMemcpyDeviceToDeviceNoCU
    assert api.const("hipStreamWaitValueGte") == 0 and api.const("hipMallocSignalMemory") == 2


def test_ipc_handles_round_trip_through_both_binding_shapes():
    raw = bytes(range(64))

    class InOut:  # fills the handle it is given (a buffer), returns the open pointer
        def hipIpcGetMemHandle(self, handle, ptr):
            handle[:] = raw
            return (HipErr.hipSuccess,)

        def hipIpcOpenMemHandle(self, handle, flags):
            assert bytes(handle) == raw and flags == 1
            return (HipErr.hipSuccess, 0x1234)
    assert HipApi(InOut()).ipc_get_handle(0x10) == raw
    assert HipApi(InOut()).ipc_open(raw) == 0x1234

    record = ctypes.create_string_buffer(raw, 64)

    class Out:  # returns a record whose address holds the 64 bytes; the pointer through an argument
        def hipIpcGetMemHandle(self, ptr):
            return (HipErr.hipSuccess, ctypes.addressof(record))

        def hipIpcOpenMemHandle(self, out, handle, flags):
            ctypes.c_void_p.from_address(out).value = 0x5678
            return (HipErr.hipSuccess,)
    assert HipApi(Out()).ipc_get_handle(0x10) == raw
    assert HipApi(Out()).ipc_open(raw) == 0x5678


class FakeDist:
    """all_gather_object where every peer contributes what this rank does (a mirror)."""

    def __init__(self):
        self.calls = 0

    def all_gather_object(self, out, obj, group=None):
        self.calls += 1
        out[:] = [obj] * len(out)


class MemHip(FakeHip):
    """Allocation and IPC calls: handles carry the address; opening maps it PEER higher."""

    PEER = 1 << 40

    def __init__(self, fail_export=()):
        super().__init__()
        self.next, self.allocs, self.fail_export = 0x5000_0000, [], set(fail_export)

    def hipExtMallocWithFlags(self, n, flags):
        self.next += 1 << 20
        self.allocs.append((self.next, n, flags))
        return (HipErr.hipSuccess, self.next)

    def hipMemset(self, ptr, value, n):
        return self._done("hipMemset", ("memset", ptr, value, n))

    def hipMemcpy(self, dst, src, n, kind):
        return self._done("hipMemcpy", ("memcpy", dst, ctypes.c_uint32.from_address(src).value, n, kind))

    def hipDeviceSynchronize(self):
        return (HipErr.hipSuccess,)

    def hipMemGetAddressRange(self, ptr):
        return (HipErr.hipSuccess, ptr - 0x200, 1 << 30)

    def hipIpcGetMemHandle(self, handle, ptr):
        if ptr in self.fail_export:
            return (HipErr.hipErrorInvalidValue,)
        handle[:8] = ptr.to_bytes(8, "little")
        return (HipErr.hipSuccess,)

    def hipIpcOpenMemHandle(self, handle, flags):
        return (HipErr.hipSuccess, int.from_bytes(bytes(handle[:8]), "little") + self.PEER)


def test_signal_flags_are_one_signal_allocation_per_waited_word(monkeypatch):
    monkeypatch.setattr(ipc, "dist", FakeDist())
    hip = MemHip()
    mem = hip_memory.setup(HipApi(hip), None, 0, 2, 0x9000_0200, flag_words(2), "signal")
    one = one_index(2)
    fine, *signals = hip.allocs
    assert fine[1:] == (4 * flag_words(2), 0x1) and len(signals) == one
    assert all(s[1:] == (8, 0x2) for s in signals)  # hipMallocSignalMemory: exactly 8 bytes
    assert [("memset", s[0], 0, 8) in hip.log for s in signals] == [True] * one  # signals start at 1
    assert ("memcpy", fine[0] + 4 * one, 1, 4, 1) in hip.log  # the ONE word
    assert mem.flag_addrs[0][:one] == [s[0] for s in signals]
    assert mem.flag_addrs[1][:one] == [s[0] + MemHip.PEER for s in signals]
    assert mem.flag_addrs[1][one] == fine[0] + MemHip.PEER + 4 * one
    assert mem.heap_ptrs == [0x9000_0200, 0x9000_0000 + MemHip.PEER + 0x200]  # base mapped + the heap's offset
    assert len(mem.opened) == 2 + one and len(mem.own) == 1 + one


def test_fine_flags_are_one_allocation_and_export_failures_say_what_to_do(monkeypatch):
    monkeypatch.setattr(ipc, "dist", FakeDist())
    mem = hip_memory.setup(HipApi(MemHip()), None, 1, 3, 0x9000_0200, flag_words(3), "fine")
    assert all(row[i + 1] - row[i] == 4 for row in mem.flag_addrs for i in range(flag_words(3) - 1))
    first_signal = 0x5000_0000 + (2 << 20)  # the allocation after the fine flag words
    with pytest.raises(BackendUnavailable, match="DMACOLL_HIP_FLAGS=fine") as e:
        hip_memory.setup(HipApi(MemHip(fail_export={first_signal})), None, 0, 2, 0x9000_0200, flag_words(2), "signal")
    assert "hipIpcGetMemHandle failed: hipErrorInvalidValue" in str(e.value)


def test_flag_mode_follows_gpu_streamops_cp_wait():
    assert hip_memory.resolve_flag_mode(env={}) == "fine"
    assert hip_memory.resolve_flag_mode(env={"GPU_STREAMOPS_CP_WAIT": "1"}) == "signal"
    assert hip_memory.resolve_flag_mode(env={"DMACOLL_HIP_FLAGS": "signal"}) == "signal"
    with pytest.raises(BackendUnavailable, match="accept only signal memory"):
        hip_memory.resolve_flag_mode(env={"GPU_STREAMOPS_CP_WAIT": "1", "DMACOLL_HIP_FLAGS": "fine"})
    with pytest.raises(InvalidArgument, match="DMACOLL_HIP_FLAGS"):
        hip_memory.resolve_flag_mode(env={"DMACOLL_HIP_FLAGS": "uncached"})


def test_the_compared_programs_cover_every_collective_variant_and_direction():
    """``cases`` (what the cuda / hip equivalence compares) holds every registered collective in every variant and
    direction, each as plans that copy and signal, so a collective or a plan builder cannot drop out unseen."""
    for world, rank in ((2, 1), (3, 0)):
        seen = {}
        for label, plans in cases(world, rank):
            op, how = label.split()[:2]
            kinds = {type(c).__name__ for p in plans for c in p.commands()}
            assert plans and {"Copy", "Signal", "Wait"} <= kinds, (world, rank, label, kinds)
            assert all(p.rank == rank and p.world == world for p in plans), (world, rank, label)
            seen.setdefault(op, set()).add(tuple(how.split("/")))
        assert set(seen) == set(ops.names()), (world, sorted(seen))
        every = {(v, d) for v in VARIANTS for d in DIRECTIONS}
        assert all(ways == every for ways in seen.values()), (world, seen)


def test_check_command_says_why_hip_cannot_run_before_starting_ranks(capsys):
    from dmacoll_lab import cli

    rc = cli.main(["check", "--backend", "hip", "--world", "2"])
    assert rc == 2 and "hip backend unavailable" in capsys.readouterr().err
