"""Peer memory for the hip backend: the symmetric heap and the flag words, shared by HIP IPC.

Why IPC and not VMM (hipMemCreate + hipMemExportToShareableHandle): an IPC handle is 64 plain
bytes that travel through ``all_gather_object`` like any object, while a VMM export is a POSIX
file descriptor that needs a Unix socket (SCM_RIGHTS) or pidfd_getfd between ranks; RCCL's
intra-node path uses IPC handles on MI300X too. The heap stays an ordinary torch allocation (so
``Communicator.empty`` slices it like on CUDA): the handle covers the whole caching-allocator
segment and peers add the heap's offset in it.

Flag words. ``hipStreamWaitValue32`` is documented to want memory from
``hipExtMallocWithFlags(.., hipMallocSignalMemory)``; in ROCm's CLR that is an 8-byte HSA signal
(any other size fails), and how a wait runs depends on ``GPU_STREAMOPS_CP_WAIT``:

* unset (CLR's default): the wait is a one-work-item blit kernel spinning on any device memory;
* ``GPU_STREAMOPS_CP_WAIT=1``: the command processor waits (an AQL BARRIER_VALUE packet, no
  compute unit), and only signal memory is accepted.

Hence two layouts (``DMACOLL_HIP_FLAGS``):

* ``fine``: all of a rank's words in one fine-grained allocation (uncached, so writes from
  peers are seen), one IPC handle;
* ``signal``: each word a rank waits on is its own 8-byte signal allocation, each exported by
  IPC; the ONE word (source of ``signal='copy'`` flags) stays in the fine allocation.
* ``auto``: ``signal`` when GPU_STREAMOPS_CP_WAIT=1, else ``fine``.

``hipStreamWriteValue32`` is a one-work-item blit kernel in either case (CLR), issued behind a
release barrier, so earlier copies on the stream are visible first.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..errors import InvalidArgument
from ..executor import one_index
from .hip_api import HipApi, HipError, unavailable
from .ipc import share, share_at

FLAG_MODES = ("auto", "signal", "fine")
SIGNAL_BYTES = 8  # hipMallocSignalMemory accepts exactly this size


def cp_wait(env: Mapping[str, str] = os.environ) -> bool:
    return env.get("GPU_STREAMOPS_CP_WAIT", "0").strip().lower() in ("1", "true", "yes", "on")


def resolve_flag_mode(requested: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    mode = requested or env.get("DMACOLL_HIP_FLAGS", "auto")
    if mode not in FLAG_MODES:
        raise InvalidArgument(f"DMACOLL_HIP_FLAGS={mode!r} is not one of {FLAG_MODES}")
    if mode == "auto":
        return "signal" if cp_wait(env) else "fine"
    if mode == "fine" and cp_wait(env):
        raise unavailable("GPU_STREAMOPS_CP_WAIT=1 makes hipStreamWaitValue32 accept only signal memory; "
                          "use DMACOLL_HIP_FLAGS=signal (or auto) or unset GPU_STREAMOPS_CP_WAIT")
    return mode


@dataclass
class PeerMemory:
    """Addresses this rank uses: every rank's heap base and flag words, mapped here."""

    heap_ptrs: list[int]
    flag_addrs: list[list[int]]  # [rank][flag index]
    mode: str
    own: list[int] = field(default_factory=list)  # allocations to hipFree at close
    opened: list[int] = field(default_factory=list)  # IPC mappings to close


def setup(api: HipApi, group, rank: int, world: int, heap_ptr: int, flag_words: int, mode: str) -> PeerMemory:
    """Share the heap and allocate, initialise and share the flag words."""
    heap_ptrs, opened = share_at(
        api, group, rank, world, heap_ptr, "heap",
        hint=" (PYTORCH_HIP_ALLOC_CONF=expandable_segments:True gives memory IPC cannot export)",
        range_hint=": the HIP runtime that hip-python loaded does not know torch's memory; torch and hip-python "
                   "must use the same libamdhip64 (see envs/rocm.yaml)")

    one = one_index(world)
    fine = api.malloc_flags(max(4 * flag_words, 4), api.const("hipDeviceMallocFinegrained"))
    own = [fine]
    api.hipMemset(fine, 0, 4 * flag_words)
    word = ctypes.c_uint32(1)
    api.hipMemcpy(fine + 4 * one, ctypes.addressof(word), 4, api.const("hipMemcpyHostToDevice"))
    signals: list[int] = []
    if mode == "signal":  # one HSA signal per waited word; created holding 1, so cleared here
        for _ in range(one):
            signals.append(api.malloc_flags(SIGNAL_BYTES, api.const("hipMallocSignalMemory")))
            api.hipMemset(signals[-1], 0, SIGNAL_BYTES)
        own += signals
    api.hipDeviceSynchronize()
    fines, more = share(api, group, rank, world, [fine], "flag words")
    opened += more
    flag_addrs = [[fines[r][0] + 4 * i for i in range(flag_words)] for r in range(world)]
    if mode == "signal":
        sig, more = share(api, group, rank, world, signals, "signal flags",
                          hint=" (signal memory may not be IPC-exportable on this ROCm; unset "
                               "GPU_STREAMOPS_CP_WAIT and use DMACOLL_HIP_FLAGS=fine)")
        opened += more
        for r in range(world):
            flag_addrs[r][:one] = sig[r]
    return PeerMemory(heap_ptrs, flag_addrs, mode, own, opened)


def release(api: HipApi, mem: PeerMemory) -> None:
    """Best effort: unmap peers' memory, free ours (a dead runtime must not mask the real error)."""
    for p in mem.opened:
        try:
            api.hipIpcCloseMemHandle(p)
        except HipError:
            pass
    for p in mem.own:
        try:
            api.hipFree(p)
        except HipError:
            pass
    mem.opened, mem.own = [], []
