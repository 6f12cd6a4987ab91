"""CUDA backend: plans executed with copy engines and stream memory operations.

* Memory (``cuda_memory``): one symmetric heap per communicator, mapped by every
  peer: PyTorch's symmetric memory, or CUDA IPC where ranks share a GPU; the 32-bit
  flag words live at its start.
* Copies: ``cuMemcpyAsync`` between device addresses (local or peer mapping);
  device-to-device copies run on the copy engines, no SM is used.
* Signals: ``cuStreamWriteValue32`` to the peer's flag word (issued after a
  memory barrier, so the data written before it is visible first); waits:
  ``cuStreamWaitValue32`` on the own flag word. Neither launches a kernel.
  ``signal="copy"`` sends a flag as a 4-byte copy; ``signal="kernel"`` writes a
  group of consecutive flags with one one-thread kernel (``dmacoll_put``).
  ``wait="spin"`` polls the flag words with a one-thread kernel, ``wait="fold"``
  also folds a pushed reduction's DONE waits into its sum kernel (``cuda_kernels.py``,
  compiled by NVRTC on first use).
  From CUDA 13.1 the driver does not take stream-memop writes to peer memory
  (NVIDIA/nccl issue 2052): the engine finds out at creation (the driver's
  version, then a write into a peer's probe word that every rank checks) and
  says so in its ``capabilities`` (``remote_memop_writes``); the communicator then sends flags as copies.
* Reductions (reduce-scatter, all-reduce): the received chunks plus the own
  one (``backends/reduce.py``), small kernels on the caller's stream after the DONE waits.
* Queues: the caller's current stream plus side streams, forked and joined
  with events; everything is capturable in a CUDA graph.
* Timeouts: ``backends/watchdog.py`` tracks each eager call's completion event;
  past the deadline it records the error and releases the stuck waits by
  writing the flags from a side stream (the GPU never stays hung); the
  communicator raises on its next use.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import warnings
from collections import Counter
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ..errors import BackendUnavailable, DmaCollError
from ..executor import Folded, MemOp, one_index, probe_index
from ..options import EngineCapabilities
from ..plan import Copy, Reduce, Ref
from . import cuda_kernels, cuda_memory, cuda_sm, sym_offset
from .reduce import reduce_step
from .stream_engine import StreamEngine
from .watchdog import Watchdog, completes

try:  # cuda-bindings >= 12.8 layout; older releases exposed `cuda.cuda`
    from cuda.bindings import driver as _drv
except ImportError:  # pragma: no cover - depends on the installed bindings
    _drv = None


class _CountingDriver:
    """cuda-bindings' driver module, counting the calls made through it by function name."""

    def __init__(self, drv, calls: Counter):
        self._drv, self._calls = drv, calls

    def __getattr__(self, name: str):
        attr = getattr(self._drv, name)
        if not (callable(attr) and name.startswith("cu")):
            return attr

        def counted(*args, **kwargs):
            self._calls[name] += 1
            return attr(*args, **kwargs)
        return counted


@contextlib.contextmanager
def counted_driver_calls():
    """Count the driver calls this module makes inside the block, by function name (the Counter it yields, filled
    as they are made): how many one collective issues (the lab's call_cost probe). One thread, for measuring only."""
    global _drv
    real, calls = _drv, Counter()
    _drv = _CountingDriver(real, calls)
    try:
        yield calls
    finally:
        _drv = real


def check_driver(result: tuple, what: str) -> tuple:
    err = result[0]
    if err != _drv.CUresult.CUDA_SUCCESS:
        name = _drv.cuGetErrorName(err)[1]
        raise DmaCollError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return result[1:]


# The newest driver API version known to take stream-memop writes into another GPU's memory: from 13.1 the driver
# refuses them (NVIDIA/nccl issue 2052; NCCL 2.29 sends its copy-engine flags as copies since)
REMOTE_MEMOP_WRITES_UP_TO = 13000
PROBE_TAG = 0x5EED0000


def memop_write_refusal(version: int, write_to_peer: Callable[[], None], arrived: Callable[[], bool],
                        barrier: Callable[[], None]) -> str:
    """Why stream-memop writes into a peer's memory cannot be used here ('' when they can): a driver too new to
    take them, a write the driver refuses, or one that does not arrive. ``barrier`` runs on every rank whatever
    happens (every rank of a host has the same driver, so the version test decides alike everywhere)."""
    if version > REMOTE_MEMOP_WRITES_UP_TO:
        return (f"CUDA driver {version // 1000}.{version % 1000 // 10} does not take stream memory-operation writes "
                "to peer memory")
    try:
        write_to_peer()
        refused = ""
    except DmaCollError as e:
        refused = f"this driver refused a stream memory-operation write to peer memory ({e})"
    barrier()
    if refused:
        return refused
    return "" if arrived() else "a stream memory-operation write into a peer's memory did not arrive"


# A run of at least this many copies on one stream goes out as one cuMemcpyBatchAsync (eager): from Python one
# batch call cost about as much as two cuMemcpyAsync calls and half of four (results/h200x2/operator/memcpy_batch/)
BATCH_MIN_COPIES = 3


def memcpy_batch(drv, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], attrs, stream: int):
    """cuMemcpyBatchAsync with one attribute set for every copy: the CUresult (CUDA 12.8/12.9 bindings also
    return a failure index, CUDA 13's do not)."""
    ptr = drv.CUdeviceptr
    return drv.cuMemcpyBatchAsync([ptr(d) for d in dsts], [ptr(s) for s in srcs], list(sizes), len(dsts), [attrs],
                                  [0], 1, stream)[0]


def _itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype name (a plan's ``Reduce.dtype``), without allocating on the call path."""
    return getattr(torch, dtype).itemsize


def available() -> Optional[str]:
    """None if the backend can run here, else the reason it cannot."""
    if _drv is None:
        return "cuda-bindings is not installed (pip install cuda-bindings)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    if torch.version.hip:
        return "this torch is a ROCm build; use the hip backend"
    return None


class CudaEngine(StreamEngine):
    """Symmetric heap, side streams and driver calls for one rank."""

    name = "cuda"
    capabilities = EngineCapabilities("cuda")  # everything; whether the driver takes memop writes: found at start

    def __init__(self, group: dist.ProcessGroup, nbytes: int, flag_words: int, timeout_s: float,
                 device: Optional[torch.device] = None):
        reason = available()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout_s = timeout_s
        if reason:  # said on every rank: the others must not wait for this one in the heap's exchange
            cuda_memory.gather_placements(group, self.world, cuda_memory.local_placement(None, reason))
            raise BackendUnavailable(f"cuda backend unavailable: {reason}")
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        torch.cuda.set_device(self.device)
        self.memory = cuda_memory.open_heap(group, self.rank, self.world, nbytes, self.device,
                                            cuda_memory.CudaIpcApi(_drv, check_driver))
        self.heap, self.ptrs = self.memory.heap, self.memory.ptrs
        self.flag_view = self.heap[: flag_words * 4].view(torch.int32)
        self.flag_view.zero_()
        self._one = one_index(self.world)
        self.flag_view[self._one] = 1
        # the watchdog's read: pinned, so the copy is asynchronous and its wait can be bounded (not on a fake device)
        self._flags_host = torch.empty(flag_words, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        torch.cuda.synchronize(self.device)
        dist.barrier(group=group)
        self.side_streams: list[torch.cuda.Stream] = []
        self.release_stream = torch.cuda.Stream(self.device)
        self.main_queue: torch.cuda.Stream = torch.cuda.current_stream(self.device)
        self.watchdog = Watchdog(self, "dmacoll-watchdog")
        refusal = self._memop_refusal()
        self.capabilities = dataclasses.replace(CudaEngine.capabilities, remote_memop_writes=not refusal,
                                                memop_refusal=refusal)
        self._init_commands()
        self._gate_streams: dict[int, torch.cuda.Stream] = {}
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}  # prerecord=True
        self._gate_done: dict[int, torch.cuda.Event] = {}
        self._native = None  # submit='native': a NativeSubmitter, made on first use

    @classmethod
    def for_commands(cls, rank: int, world: int, ptrs: Sequence[int], main_queue, side_streams: Sequence = (),
                     heap: Optional[torch.Tensor] = None, device: object = None) -> "CudaEngine":
        """An engine that only issues commands (no GPU memory, no watchdog thread): for tests with a fake driver.
        ``heap`` (a tensor standing for this rank's heap) is needed by reductions only."""
        eng = cls.__new__(cls)
        eng.rank, eng.world, eng.ptrs, eng._one = rank, world, list(ptrs), one_index(world)
        eng.main_queue, eng.side_streams, eng.heap, eng.device = main_queue, list(side_streams), heap, device
        eng._init_commands()
        return eng

    def _init_commands(self) -> None:
        """The state that issuing commands needs beyond rank, world, heap pointers and ONE (all that the command
        tests build on an engine without a GPU)."""
        self._geq, self._eq = 0, 1  # CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_EQ
        self._batches: dict[tuple, list] = {}  # memop arrays by content (epoch values make new ones)
        self._kernels = None  # wait='spin' / 'fold' and sums: cuda_kernels.Kernels, loaded on first use
        self._no_kernels = False  # NVRTC could not build them: sums fall back to torch
        self._batch_refused: set[int] = set()
        self._attrs = None

    def _memop_refusal(self) -> str:
        """``memop_write_refusal`` here: each rank writes its tag into the next rank's probe word; every rank then
        checks its own, and the ranks agree (any rank's reason is every rank's)."""
        version = check_driver(_drv.cuDriverGetVersion(), "cuDriverGetVersion")[0]
        probe, peer = probe_index(self.world), (self.rank + 1) % self.world
        stream = self.release_stream

        def write() -> None:
            check_driver(_drv.cuStreamWriteValue32(stream.cuda_stream, self.ptrs[peer] + 4 * probe,
                                                   PROBE_TAG + self.rank, 0), "cuStreamWriteValue32 (to a peer)")
            stream.synchronize()

        def arrived() -> bool:
            return int(self.flag_view[probe]) == PROBE_TAG + (self.rank - 1) % self.world

        why = memop_write_refusal(int(version), write, arrived, lambda: dist.barrier(group=self.group))
        reasons: list = [None] * self.world
        dist.all_gather_object(reasons, why, group=self.group)
        return next((r for r in reasons if r), "")

    # -- addresses ---------------------------------------------------------
    def bases(self, input: torch.Tensor, output: torch.Tensor) -> dict[str, object]:
        # the tensors too, for reductions (torch kernels need tensors, not addresses)
        return {"input": input.data_ptr(), "output": output.data_ptr(), "tensors": {"input": input, "output": output}}

    def _addr(self, ref: Ref, bases: Mapping[str, int]) -> int:
        return (self.ptrs[ref.rank] if ref.space == "sym" else bases[ref.space]) + ref.offset

    def sym_offset(self, t: torch.Tensor) -> int | None:
        return sym_offset(self.heap, t)

    # -- primitives ----------------------------------------------------------
    def copy(self, queue: torch.cuda.Stream, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, int]) -> None:
        check_driver(_drv.cuMemcpyAsync(self._addr(dst, bases), self._addr(src, bases), nbytes, queue.cuda_stream),
                     "cuMemcpyAsync")

    def copies(self, queue: torch.cuda.Stream, run: Sequence[Copy], bases: Mapping[str, int]) -> None:
        """Consecutive copies: ``BATCH_MIN_COPIES`` or more on a created stream outside a graph capture go out as
        one ``cuMemcpyBatchAsync`` (sources read in stream order); the legacy default stream, a capture and a
        stream whose batch the driver refused get one ``cuMemcpyAsync`` each."""
        stream = queue.cuda_stream
        if len(run) >= BATCH_MIN_COPIES and stream and stream not in self._batch_refused \
                and not self._capturing(stream):
            err = memcpy_batch(_drv, [self._addr(c.dst, bases) for c in run], [self._addr(c.src, bases) for c in run],
                               [c.nbytes for c in run], self._batch_attributes(), stream)
            if err == _drv.CUresult.CUDA_SUCCESS:
                return
            self._batch_refused.add(stream)
        for c in run:
            self.copy(queue, c.src, c.dst, c.nbytes, bases)

    def _capturing(self, stream: int) -> bool:
        status = check_driver(_drv.cuStreamIsCapturing(stream), "cuStreamIsCapturing")[0]
        return status != _drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

    def _batch_attributes(self):
        if self._attrs is None:
            self._attrs = _drv.CUmemcpyAttributes()
            self._attrs.srcAccessOrder = _drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        return self._attrs

    def reduce(self, queue: torch.cuda.Stream, step: Reduce, bases: Mapping[str, object]) -> None:
        """One sum kernel on ``queue`` (the caller's stream in every plan; ``cuda_kernels.SUM``): it runs after the
        DONE waits queued there before it, never syncs the host and can be captured in a graph. torch's kernels
        where dmacoll's cannot run (a dtype without one, no NVRTC)."""
        kernels = self._sum_kernels(step.dtype)
        if kernels is None:
            reduce_step(queue, step, self.heap, self.rank, bases)
            return
        size = _itemsize(step.dtype)
        own = self._addr(step.own, bases) if step.own is not None else None
        kernels.sum(queue.cuda_stream, step.dtype, size, self._addr(step.src, bases), own,
                    self._addr(step.dst, bases), step.nbytes // size, step.count)

    def _sum_kernels(self, dtype: str) -> Optional[cuda_kernels.Kernels]:
        if dtype not in cuda_kernels.FOLD_TYPES or self._no_kernels:
            return None
        try:
            return self.kernels()
        except BackendUnavailable as e:
            self._no_kernels = True
            warnings.warn(f"dmacoll: reductions sum with torch's kernels on this rank: {e}", stacklevel=2)
            return None

    def memops(self, queue: torch.cuda.Stream, ops: Sequence[MemOp]) -> None:
        if any(op.via != "memop" for op in ops):
            self._mixed_ops(queue, ops)
            return
        stream = queue.cuda_stream
        if len(ops) == 1:  # a single op: the plain call is cheaper to build
            op = ops[0]
            addr = self.ptrs[op.rank] + 4 * op.index
            if op.wait:
                check_driver(_drv.cuStreamWaitValue32(stream, addr, op.value, self._geq if op.geq else self._eq),
                       "cuStreamWaitValue32")
            else:
                check_driver(_drv.cuStreamWriteValue32(stream, addr, op.value, 0), "cuStreamWriteValue32")
            return
        params = self._batches.get(tuple(ops))
        if params is None:
            if len(self._batches) > 4096:  # epoch mode makes new values every call
                self._batches.clear()
            params = self._batches[tuple(ops)] = [self._param(op) for op in ops]
        check_driver(_drv.cuStreamBatchMemOp(stream, len(params), params, 0), "cuStreamBatchMemOp")

    def _mixed_ops(self, queue: torch.cuda.Stream, ops: Sequence[MemOp]) -> None:
        """Flag operations that are not all stream memops, in order, a run of one kind at a time: memops go out
        batched; ``copy`` signals are 4-byte copies of the ONE word (queued behind the data on the same engine
        path); ``kernel`` signals one put kernel; ``spin`` waits one polling kernel (per ``MAX_WAITS`` words)."""
        for via, run in itertools.groupby(ops, key=lambda op: op.via):
            run = tuple(run)
            if via == "memop":
                self.memops(queue, run)
            elif via == "spin":
                self.kernels().spin(queue.cuda_stream, self.ptrs[self.rank], [op.index for op in run],
                                    run[0].value, run[0].geq)
            elif via == "copy":
                for op in run:
                    check_driver(_drv.cuMemcpyAsync(self.ptrs[op.rank] + 4 * op.index,
                                                    self.ptrs[self.rank] + 4 * self._one, 4, queue.cuda_stream),
                                 "cuMemcpyAsync (signal)")
            else:
                self.kernels().put(queue.cuda_stream, [self.ptrs[op.rank] + 4 * op.index for op in run], run[0].value)

    def folded_reduce(self, queue: torch.cuda.Stream, step: Folded, bases: Mapping[str, object]) -> None:
        """One fold kernel (``cuda_kernels``): each slot added once its flag is met; where no fold kernel fits
        (a dtype without one, more slots than one launch polls), a spin wait and then the torch sum."""
        r, waits = step.reduce, step.waits
        numel = r.nbytes // _itemsize(r.dtype)
        if r.dtype not in cuda_kernels.FOLD_TYPES or r.count > cuda_kernels.MAX_WAITS or not cuda_kernels.folds(numel):
            self._mixed_ops(queue, waits)
            self.reduce(queue, r, bases)
            return
        own = self._addr(r.own, bases) if r.own is not None else None
        rearmed = self.kernels().fold(queue.cuda_stream, r.dtype, self._addr(r.src, bases), own,
                                      self._addr(r.dst, bases), numel, r.count, self.ptrs[self.rank],
                                      [op.index for op in waits], waits[0].value, waits[0].geq)
        if not rearmed and not waits[0].geq:  # several blocks polled: re-arm once every one has seen its flags
            self.memops(queue, tuple(MemOp(False, self.rank, op.index, 0) for op in waits))

    def load_kernels(self) -> None:
        self.kernels()

    def kernels(self) -> cuda_kernels.Kernels:
        """dmacoll's kernels for this device, compiled (NVRTC) and loaded on first use. Loading a module is not
        a stream operation: it is done in relaxed capture mode, so a first use inside a graph capture works."""
        if self._kernels is None:
            major, minor = torch.cuda.get_device_capability(self.device)
            mode = check_driver(_drv.cuThreadExchangeStreamCaptureMode(
                _drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")[0]
            try:
                self._kernels = cuda_kernels.kernels(_drv, check_driver, self.device.index or 0, f"sm_{major}{minor}")
            finally:
                check_driver(_drv.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
        return self._kernels

    def _param(self, op: MemOp):
        """One entry of a cuStreamBatchMemOp array; ops in a batch run in array order."""
        p = _drv.CUstreamBatchMemOpParams()
        if op.wait:
            p.operation = _drv.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
            fields = p.waitValue
            fields.flags = self._geq if op.geq else self._eq
        else:
            p.operation = _drv.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
            fields = p.writeValue
            fields.flags = 0  # default: a memory barrier orders earlier writes (the data) first
        fields.address = self.ptrs[op.rank] + 4 * op.index
        fields.value = op.value
        return p

    # -- the sm path (backends/cuda_sm.py) ------------------------------------
    @staticmethod
    def sm_area_bytes(world: int) -> int:
        """Heap bytes the sm path's area takes at ``world`` ranks (reserved by the communicator beside its heap)."""
        return cuda_sm.area_bytes(world, cuda_sm.slot_bytes(world))

    def open_sm(self, area: int) -> None:
        """Zero the sm area at heap offset ``area`` on every rank (a barrier): the sm path is ready."""
        self.sm = cuda_sm.SmPath.open(self, self.group, area, cuda_sm.slot_bytes(self.world), self.timeout_s, _drv,
                                      check_driver)

    def sm_bytes(self, op: str, in_bytes: int, out_bytes: int, dtype: str,
                 matrix: Optional[tuple] = None) -> Optional[int]:
        """A call's largest part on the sm path (the same on every rank), None where the path cannot run it."""
        return self.sm.sm_bytes(op, in_bytes, out_bytes, dtype, matrix)

    def sm_shares_device(self) -> bool:
        """Whether ranks share a GPU (the IPC heap): there one rank's spinning kernel waits for a time slice of the
        other's, so 'auto' keeps such calls on the copy engines."""
        return isinstance(self.memory, cuda_memory.IpcHeap)

    def ensure_native(self) -> None:
        """Load the native library now (raises BackendUnavailable if it is not built), before any GPU work."""
        if self._native is None:
            from .native import NativeSubmitter

            self._native = NativeSubmitter(self)

    def run_native(self, program, bases: Mapping[str, object], epoch: int) -> None:
        """Issue ``program`` through the native library (submit='native'; see native.py)."""
        self.ensure_native()
        self._native.run(program, bases, epoch)

    def capture_id(self) -> int:
        """The id of the capture sequence the current stream is in (unique in the process)."""
        status_and_id = check_driver(_drv.cuStreamGetCaptureInfo(torch.cuda.current_stream(self.device).cuda_stream),
                                     "cuStreamGetCaptureInfo")
        return int(status_and_id[1])

    # -- watchdog hooks (see backends/watchdog.py) ----------------------------
    def enter_watchdog_thread(self) -> None:
        check_driver(_drv.cuThreadExchangeStreamCaptureMode(
            _drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")
        torch.cuda.set_device(self.device)

    def read_own_flags(self, wait_s: float) -> Optional[list[int]]:
        with torch.cuda.stream(self.release_stream):  # non-blocking: runs even behind a stuck legacy stream
            self._flags_host.copy_(self.flag_view, non_blocking=True)
        return self._flags_host.tolist() if completes(self.release_stream, wait_s) else None

    # The watchdog's writes are driver calls, not torch kernels: a kernel the process has not launched yet is loaded
    # lazily, and a load waits for the GPU to go idle, which it never does while a wait is stuck (seen on 4x H200: a
    # one-word fill_ never ran and took the release behind it along)
    def write_own_flag(self, index: int, value: int, wait_s: float) -> bool:
        """Set one of this rank's flag words from the release stream (a timeout's diagnosis, see watchdog.py)."""
        check_driver(_drv.cuStreamWriteValue32(self.release_stream.cuda_stream, self.ptrs[self.rank] + 4 * index,
                                               value, 0), "cuStreamWriteValue32 (watchdog)")
        return completes(self.release_stream, wait_s)

    def release_waits(self, value: int, wait_s: float) -> bool:
        """Satisfy every wait of this rank (flag memops and spin kernels) from the release stream."""
        # every flag wait of this rank: the stuck stream drains
        check_driver(_drv.cuMemsetD32Async(self.ptrs[self.rank], value, self.flag_view.numel(),
                                           self.release_stream.cuda_stream), "cuMemsetD32Async (watchdog)")
        return completes(self.release_stream, wait_s)

    def close(self) -> None:
        super().close()
        memory = getattr(self, "memory", None)
        if memory is not None:
            torch.cuda.synchronize(self.device)
            memory.close()
