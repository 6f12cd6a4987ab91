"""Peer memory for the cuda backend: every rank's symmetric heap (flag words at its start) mapped by every rank.

Two providers, one heap layout and one flag protocol:

* ``symmetric``: PyTorch's symmetric memory (CUDA VMM allocations exported to and mapped by every peer). PyTorch
  refuses two ranks on one device.
* ``ipc``: one ``cuMemAlloc`` allocation per rank, exported by CUDA IPC (``cuIpcGetMemHandle``) and opened by
  every peer (``cuIpcOpenMemHandle``, peer access enabled lazily). It works where ranks share a device (several
  ranks on one GPU: correctness runs of the real CUDA path on any single GPU) and between GPUs too.

``$DMACOLL_PEER_MEMORY`` chooses: ``auto`` (default) takes ``ipc`` when two ranks of a host sit on one device,
else ``symmetric``. Before anything is allocated every rank learns where every other one runs
(``Placement``), and a setup that cannot work fails on every rank with the reason: ranks on several hosts,
``symmetric`` asked for ranks that share a device, more heap than the shared device has free, a rank without a
usable GPU, a process group that cannot exchange objects between ranks sharing a GPU.

Timings from ranks sharing a GPU are not performance results: the GPU time-slices between the processes' contexts
(a copy-flag crossing took ~140 us there against 4-6 us with memop flags; ../shared/DESIGN.md section 9).
"""
from __future__ import annotations

import ctypes
import os
import socket
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ..errors import BackendUnavailable, DmaCollError, InvalidArgument
from .ipc import all_ranks_ok, share_at

PROVIDERS = ("auto", "symmetric", "ipc")
VARIABLE = "DMACOLL_PEER_MEMORY"
IPC_HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE


@dataclass(frozen=True)
class Placement:
    """Where one rank runs, as every rank learns it before anything is allocated."""

    host: str
    device: str       # the GPU's UUID ('' where the rank has none)
    index: int        # its ordinal in the rank's process
    free_bytes: int   # free memory on it when the communicator was created
    error: str = ""   # why this rank cannot run the cuda backend ('' if it can)

    @property
    def gpu(self) -> tuple[str, str]:
        return self.host, self.device


def requested_provider(env: Mapping[str, str] = os.environ) -> str:
    value = env.get(VARIABLE, "auto").strip().lower() or "auto"
    if value not in PROVIDERS:
        raise InvalidArgument(f"{VARIABLE}={value!r} is not one of {PROVIDERS}")
    return value


def local_placement(device: torch.device, error: str = "") -> Placement:
    if error:
        return Placement(socket.gethostname(), "", -1, 0, error)
    props = torch.cuda.get_device_properties(device)
    free, _ = torch.cuda.mem_get_info(device)
    return Placement(socket.gethostname(), str(getattr(props, "uuid", device.index)), device.index or 0, int(free))


def gather_placements(group, world: int, mine: Placement) -> list[Placement]:
    """Every rank's placement. A group whose object collectives run on NCCL cannot do this for ranks that share a
    GPU (NCCL refuses duplicate GPUs): said as such, not as NCCL's error."""
    places: list = [None] * world
    try:
        dist.all_gather_object(places, mine, group=group)
    except (RuntimeError, dist.DistBackendError) as e:
        raise BackendUnavailable(
            f"cuda backend: the ranks could not exchange where they run through the process group ({e}). Ranks "
            "that share a GPU need a process group with a CPU backend, e.g. init_process_group('gloo') or "
            "'cpu:gloo,cuda:nccl' without device_id (NCCL refuses two ranks on one GPU)") from e
    return places


def choose_provider(requested: str, places: Sequence[Placement]) -> str:
    """The provider for these placements; raises (the same on every rank) where the setup cannot work."""
    broken = [(r, p.error) for r, p in enumerate(places) if p.error]
    if broken:
        raise BackendUnavailable("cuda backend: rank(s) without a usable GPU: " +
                                 "; ".join(f"{r}: {e}" for r, e in broken))
    hosts = sorted({p.host for p in places})
    if len(hosts) > 1:
        raise BackendUnavailable(f"cuda backend: the ranks run on {len(hosts)} hosts ({', '.join(hosts)}); peer "
                                 "copies need every rank of a communicator on one host")
    shared = sorted({p.index for p in places if Counter(q.gpu for q in places)[p.gpu] > 1})
    if requested == "symmetric" and shared:
        raise BackendUnavailable(f"cuda backend: {VARIABLE}=symmetric, but ranks share GPU(s) {shared} and PyTorch "
                                 f"symmetric memory refuses two ranks on one device; use {VARIABLE}=ipc or auto")
    if requested != "auto":
        return requested
    return "ipc" if shared else "symmetric"


def check_memory(places: Sequence[Placement], nbytes: int) -> None:
    """Refuse, on every rank, a heap that the ranks sharing a GPU cannot all allocate there."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for r, p in enumerate(places):
        ranks.setdefault(p.gpu, []).append(r)
    for gpu, on in ranks.items():
        free = min(places[r].free_bytes for r in on)
        if len(on) * nbytes > free:
            raise InvalidArgument(
                f"cuda backend: rank(s) {on} share GPU {places[on[0]].index} and need {len(on)} x {nbytes >> 20} "
                f"MiB of heap, but {free >> 20} MiB are free there; use fewer ranks per GPU or a smaller "
                "heap_bytes / staging_bytes")


class CudaIpcApi:
    """The driver's IPC calls as ``ipc.share`` uses them, through the driver the cuda backend hands over: ``drv``
    (cuda-bindings' driver module) and ``check`` (an error result raises ``DmaCollError``)."""

    backend, get_name, open_name, error = "cuda", "cuIpcGetMemHandle", "cuIpcOpenMemHandle", DmaCollError

    def __init__(self, drv, check: Callable[[tuple, str], tuple]):
        self.drv, self.check = drv, check

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = self.check(self.drv.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
        return int(base), int(size)

    def ipc_get_handle(self, ptr: int) -> bytes:
        handle = self.check(self.drv.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")[0]
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)

    def ipc_open(self, data: bytes) -> int:
        handle = self.drv.CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), data, IPC_HANDLE_BYTES)
        flags = self.drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        return int(self.check(self.drv.cuIpcOpenMemHandle(handle, flags), "cuIpcOpenMemHandle")[0])

    def ipc_close(self, ptr: int) -> None:
        self.check(self.drv.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")


class DeviceAllocation:
    """``nbytes`` of ``cuMemAlloc`` memory seen by torch (``__cuda_array_interface__``): outside the caching
    allocator, so the IPC handle covers exactly this memory and none of it is reused by torch while peers map it.
    Freed when the last tensor viewing it is gone (torch keeps this object alive as long as a view)."""

    def __init__(self, nbytes: int, api: CudaIpcApi):
        self.drv = api.drv
        self.ptr = int(api.check(api.drv.cuMemAlloc(nbytes), "cuMemAlloc")[0])
        self.nbytes = nbytes
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                         "version": 2}

    def __del__(self):
        try:
            self.drv.cuMemFree(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass


class SymmetricHeap:
    """The ``symmetric`` provider (PyTorch symmetric memory)."""

    name = "symmetric"

    def __init__(self, group, nbytes: int, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch, deprecated later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group.group_name)
        self.heap = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.heap, group)
        self.ptrs = [int(p) for p in self.handle.buffer_ptrs]

    def close(self) -> None:
        """PyTorch owns the mappings."""


class IpcHeap:
    """The ``ipc`` provider: a ``DeviceAllocation`` per rank, shared by CUDA IPC handles."""

    name = "ipc"

    def __init__(self, group, rank: int, world: int, nbytes: int, device: torch.device, api: CudaIpcApi):
        self.api = api
        allocation, error = None, None
        try:
            allocation = DeviceAllocation(nbytes, api)
        except DmaCollError as e:
            error = f"{e} ({nbytes >> 20} MiB on GPU {device.index})"
        all_ranks_ok("cuda", group, world, error, "cuMemAlloc (heap)")
        self.heap = torch.as_tensor(allocation, device=device)
        self.ptrs, self.opened = share_at(self.api, group, rank, world, allocation.ptr, "heap")

    def close(self) -> None:
        """Unmap the peers' heaps (best effort: a dead context must not mask the real error)."""
        for ptr in self.opened:
            try:
                self.api.ipc_close(ptr)
            except DmaCollError:
                pass
        self.opened = []


def open_heap(group, rank: int, world: int, nbytes: int, device: torch.device, api: CudaIpcApi, error: str = ""):
    """This rank's heap from the provider that fits where the ranks run (see the module docstring); ``api``: the
    driver's IPC calls, for the ``ipc`` provider."""
    requested = requested_provider()
    places = gather_placements(group, world, local_placement(device, error))
    provider = choose_provider(requested, places)
    check_memory(places, nbytes)
    if provider == "ipc":
        return IpcHeap(group, rank, world, nbytes, device, api)
    return SymmetricHeap(group, nbytes, device)
