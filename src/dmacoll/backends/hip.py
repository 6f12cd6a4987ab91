"""HIP backend (AMD MI300X): the cuda backend's Programs on SDMA engines through hip-python.

* Memory (``hip_memory``): the symmetric heap and the flag words shared by HIP IPC.
* Copies: ``hipMemcpyAsync`` with ``hipMemcpyDeviceToDeviceNoCU``, which ROCm's runtime routes
  to an SDMA engine whatever the size (plain DeviceToDevice falls back to a blit kernel, i.e.
  compute units, below a size threshold and for same-device copies). SDMA must stay enabled
  (HSA_ENABLE_SDMA unset or 1). Optionally (``DMACOLL_HIP_BATCH_COPIES=1``, where the binding
  has it) consecutive copies of one queue go out as one ``hipMemcpyBatchAsync``.
* Flags: ``hipStreamWriteValue32`` / ``hipStreamWaitValue32``, one call per operation. Not
  ``hipStreamBatchMemOp``: ROCm runs a batch as one work-item per operation of a single kernel,
  so a wait and the re-arm behind it would not be ordered.
* Prelaunch gates, call bracketing, ``prerecord`` graphs (``stream_engine.StreamEngine``) and the
  watchdog (``watchdog.Watchdog``) are the cuda backend's (torch's ``torch.cuda`` streams, events and
  graphs are HIP ones on a ROCm build). Unverified: whether a
  HIP graph captures the stream memory operations (the CLR sources read enqueue them without a
  capture hook); graph mode and prerecord must be checked on an MI300X first.

Every HIP call goes through ``self.api`` (``hip_api.HipApi``), so tests can record them.
"""
from __future__ import annotations

import ctypes
import os
from typing import Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ..errors import BackendUnavailable, InvalidArgument
from ..executor import MemOp, one_index
from ..options import EngineCapabilities
from ..plan import Copy, Reduce, Ref
from . import hip_api, hip_memory, sym_offset
from .hip_api import HipApi, HipError
from .reduce import reduce_step
from .stream_engine import StreamEngine
from .watchdog import Watchdog, completes

MASK32 = 0xFFFFFFFF


def available() -> Optional[str]:
    """None if the backend can run here, else every reason it cannot."""
    reasons = []
    missing = hip_api.probe()
    if missing:
        reasons.append(missing)
    if not torch.version.hip:
        reasons.append("this torch is not a ROCm build (torch.version.hip is None)")
    elif not torch.cuda.is_available():
        reasons.append("no AMD GPU is visible to torch")
    return "; ".join(reasons) or None


def batch_copies_requested(env: Mapping[str, str] = os.environ) -> bool:
    return env.get("DMACOLL_HIP_BATCH_COPIES", "0").strip().lower() in ("1", "true", "yes", "on")


class HipEngine(StreamEngine):
    """Symmetric heap, flag words, side streams and HIP calls for one rank."""

    name = "hip"
    # graphs: torch.cuda graphs are HIP graphs on ROCm (unverified on MI300X: see above); no native submission (the
    # library issues CUDA driver calls); no flag or polling kernels written for HIP (nothing to test them on); memop
    # writes: hipStreamWriteValue32 into a peer's signal memory (unverified on hardware)
    capabilities = EngineCapabilities("hip", native_submit=False, kernel_signals=False, spin_waits=False,
                                      sm_path=False)

    def __init__(self, group: dist.ProcessGroup, nbytes: int, flag_words: int, timeout_s: float,
                 device: Optional[torch.device] = None):
        reason = available()
        if reason:
            raise hip_api.unavailable(reason)
        module, self.layout = hip_api.load()
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.timeout_s = group, timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        torch.cuda.set_device(self.device)
        api = HipApi(module)
        mode = hip_memory.resolve_flag_mode()
        self.heap = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self.heap[: flag_words * 4].zero_()  # unused on hip (flags live apart) but zeroed like on cuda
        torch.cuda.synchronize(self.device)
        self.memory = hip_memory.setup(api, group, rank, world, self.heap.data_ptr(), flag_words, mode)
        dist.barrier(group=group)
        self._init_issuing(api, rank, world, self.memory.heap_ptrs, self.memory.flag_addrs,
                           torch.cuda.current_stream(self.device), batch_copies_requested())
        self.release_stream = torch.cuda.Stream(self.device)
        self.watchdog = Watchdog(self, "dmacoll-hip-watchdog")

    def _init_issuing(self, api: HipApi, rank: int, world: int, heap_ptrs: Sequence[int],
                      flag_addrs: Sequence[Sequence[int]], main_queue, batch: bool = False) -> None:
        """The state that issuing commands needs (all that the command tests build)."""
        self.api, self.rank, self.world = api, rank, world
        self.ptrs = [int(p) for p in heap_ptrs]
        self.flag_addrs = [[int(a) for a in row] for row in flag_addrs]
        # where the watchdog reads its own words to: pinned, so the copy is asynchronous and its wait bounded
        self._flags_host = torch.empty(len(self.flag_addrs[rank]), dtype=torch.int32,
                                       pin_memory=torch.cuda.is_available())
        self._one = one_index(world)
        self.main_queue = main_queue
        self._kind = api.const("hipMemcpyDeviceToDeviceNoCU")
        self._eq, self._geq = api.const("hipStreamWaitValueEq"), api.const("hipStreamWaitValueGte")
        self.batch = batch and api.has("hipMemcpyBatchAsync")
        self._pending: dict[int, tuple[object, list]] = {}  # queued copies per stream (batching)
        self.side_streams: list = []
        self._gate_streams: dict[int, object] = {}
        self._gate_done: dict[int, object] = {}
        self._graphs: dict[tuple, object] = {}

    @classmethod
    def for_commands(cls, api: HipApi, rank: int, world: int, heap_ptrs: Sequence[int],
                     flag_addrs: Sequence[Sequence[int]], main_queue, batch: bool = False,
                     heap: Optional[torch.Tensor] = None, device: object = None) -> "HipEngine":
        """An engine that only issues commands (no memory setup, no watchdog thread): for tests.
        ``heap`` (any tensor standing for this rank's heap) is needed by reductions only."""
        eng = cls.__new__(cls)
        eng._init_issuing(api, rank, world, heap_ptrs, flag_addrs, main_queue, batch)
        eng.heap, eng.device, eng.timeout_s = heap, device, 1.0
        eng.watchdog = Watchdog(eng, "dmacoll-hip-watchdog", start=False)
        return eng

    # -- addresses ---------------------------------------------------------
    def bases(self, input: torch.Tensor, output: torch.Tensor) -> dict[str, object]:
        # the tensors too, for reductions (torch kernels need tensors, not addresses)
        return {"input": input.data_ptr(), "output": output.data_ptr(), "tensors": {"input": input, "output": output}}

    def _addr(self, ref: Ref, bases: Mapping[str, int]) -> int:
        return (self.ptrs[ref.rank] if ref.space == "sym" else bases[ref.space]) + ref.offset

    def sym_offset(self, t: torch.Tensor) -> int | None:
        return sym_offset(self.heap, t)

    # -- primitives ----------------------------------------------------------
    def copy(self, queue, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, int]) -> None:
        dst_addr, src_addr = self._addr(dst, bases), self._addr(src, bases)
        if self.batch:
            self._pending.setdefault(queue.cuda_stream, (queue, []))[1].append((dst_addr, src_addr, nbytes))
            return
        self.api.hipMemcpyAsync(dst_addr, src_addr, nbytes, self._kind, queue.cuda_stream)

    def copies(self, queue, run: Sequence[Copy], bases: Mapping[str, int]) -> None:
        for c in run:  # batched by flush_queue where batching is on
            self.copy(queue, c.src, c.dst, c.nbytes, bases)

    def reduce(self, queue, step: Reduce, bases: Mapping[str, object]) -> None:
        """A torch kernel on ``queue`` after what is queued there (as on cuda)."""
        self.flush_queue(queue)
        reduce_step(queue, step, self.heap, self.rank, bases)

    def load_kernels(self) -> None:
        raise InvalidArgument("wait='spin' and 'fold' run CUDA kernels; the hip backend waits with wait='memop'")

    def folded_reduce(self, queue, step, bases: Mapping[str, object]) -> None:
        raise InvalidArgument("wait='fold' runs a CUDA kernel; the hip backend waits with wait='memop'")

    def flush_queue(self, queue) -> None:
        """Issue the copies batched on ``queue`` (one hipMemcpyBatchAsync; a single copy as is)."""
        entry = self._pending.pop(queue.cuda_stream, None)
        if not entry or not entry[1]:
            return
        copies, stream = entry[1], queue.cuda_stream
        if len(copies) == 1:
            self.api.hipMemcpyAsync(*copies[0], self._kind, stream)
            return
        dsts, srcs, sizes = (list(x) for x in zip(*copies))
        fail = ctypes.c_size_t(0)
        try:  # attributes: none (HIP documents them as unsupported); ordering inside a batch is free,
            # which is fine: copies of one plan step never overlap
            self.api.hipMemcpyBatchAsync(dsts, srcs, sizes, len(copies), None, None, 0,
                                         ctypes.addressof(fail), stream)
        except TypeError:  # this binding spells the call differently: stop batching, copy one by one
            self.batch = False
            for c in copies:
                self.api.hipMemcpyAsync(*c, self._kind, stream)

    def flush_batched(self) -> None:
        """Issue every queue's held-back copies (before a gate closes and at a call's end)."""
        for queue, _ in list(self._pending.values()):
            self.flush_queue(queue)

    def memops(self, queue, ops: Sequence[MemOp]) -> None:
        self.flush_queue(queue)  # flags go behind the data queued before them
        stream = queue.cuda_stream
        for op in ops:
            addr = self.flag_addrs[op.rank][op.index]
            if op.via == "kernel":
                raise InvalidArgument("signal='kernel' launches dmacoll's CUDA flag kernels, not written for HIP; "
                                      "use signal='memop' or 'copy'")
            if op.via == "spin":
                raise InvalidArgument("wait='spin' runs a CUDA kernel; the hip backend waits with wait='memop'")
            if op.via == "copy":  # a 4-byte SDMA copy of the ONE word, queued behind the data
                self.api.hipMemcpyAsync(addr, self.flag_addrs[self.rank][self._one], 4, self._kind, stream)
            elif op.wait:
                self.api.hipStreamWaitValue32(stream, addr, op.value, self._geq if op.geq else self._eq, MASK32)
            else:
                self.api.hipStreamWriteValue32(stream, addr, op.value, 0)

    def ensure_native(self) -> None:
        raise BackendUnavailable("submit='native' issues CUDA driver calls: it needs backend='cuda'")

    def run_native(self, program, bases, epoch: int) -> None:
        self.ensure_native()

    # -- watchdog hooks (see backends/watchdog.py) ----------------------------
    def enter_watchdog_thread(self) -> None:
        mode = ctypes.c_int(self.api.const("hipStreamCaptureModeRelaxed"))  # in/out: the call swaps modes
        try:  # relaxed capture mode: polling events must not break an application's graph capture
            self.api.hipThreadExchangeStreamCaptureMode(ctypes.addressof(mode))
        except (HipError, TypeError, AttributeError):
            pass  # a binding without the call, or another argument shape: keep the global mode
        torch.cuda.set_device(self.device)

    def read_own_flags(self, wait_s: float) -> Optional[list[int]]:
        """This rank's flag words, copied on the non-blocking release stream (it runs even behind a stuck queue)
        into pinned host memory; None if the copies do not complete within ``wait_s``."""
        host, to_host = self._flags_host, self.api.const("hipMemcpyDeviceToHost")
        for i, addr in enumerate(self.flag_addrs[self.rank]):
            self.api.hipMemcpyAsync(host.data_ptr() + 4 * i, addr, 4, to_host, self.release_stream.cuda_stream)
        return host.tolist() if completes(self.release_stream, wait_s) else None

    def write_own_flag(self, index: int, value: int, wait_s: float) -> bool:
        """Set one of this rank's flag words from the release stream (a timeout's diagnosis, see watchdog.py)."""
        self.api.hipStreamWriteValue32(self.release_stream.cuda_stream, self.flag_addrs[self.rank][index], value, 0)
        return completes(self.release_stream, wait_s)

    def release_waits(self, value: int, wait_s: float) -> bool:
        """Write ``value`` to every word this rank waits on, from the non-blocking release stream."""
        stream = self.release_stream
        for addr in self.flag_addrs[self.rank][: self._one]:
            self.api.hipStreamWriteValue32(stream.cuda_stream, addr, value, 0)
        return completes(stream, wait_s)

    # -- call bracketing -----------------------------------------------------
    def begin_call(self, label: str) -> None:
        super().begin_call(label)
        self._pending.clear()  # copies left by a call that raised midway must not run later

    def close(self) -> None:
        super().close()
        memory = getattr(self, "memory", None)
        if memory is not None:
            torch.cuda.synchronize(self.device)
            hip_memory.release(self.api, memory)

