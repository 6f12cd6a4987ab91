"""The cuda backend's peer memory without a GPU: which provider a placement of ranks gets, the setups refused
before anything is allocated, and the IPC handle exchange (offsets inside an allocation) on a fake driver."""
import ctypes

import pytest
import torch.distributed as dist

from dmacoll.backends import cuda as cuda_backend
from dmacoll.backends import cuda_memory, ipc
from dmacoll.backends.cuda_memory import Placement, check_memory, choose_provider, requested_provider
from dmacoll.errors import BackendUnavailable, InvalidArgument

GiB = 1 << 30


def place(host="node0", gpu=0, free=60 * GiB, error=""):
    return Placement(host, f"GPU-{gpu}", gpu, free, error)


def test_ranks_on_their_own_gpus_get_symmetric_memory_and_shared_gpus_get_ipc():
    assert choose_provider("auto", [place(gpu=0), place(gpu=1)]) == "symmetric"
    assert choose_provider("auto", [place(gpu=0), place(gpu=0)]) == "ipc"
    assert choose_provider("auto", [place(gpu=0), place(gpu=1), place(gpu=0), place(gpu=1)]) == "ipc"
    assert choose_provider("ipc", [place(gpu=0), place(gpu=1)]) == "ipc"  # selectable where both work
    assert choose_provider("symmetric", [place(gpu=0), place(gpu=1)]) == "symmetric"


def test_setups_that_cannot_work_fail_with_the_reason():
    with pytest.raises(BackendUnavailable, match=r"share GPU\(s\) \[0\].*refuses two ranks on one device"):
        choose_provider("symmetric", [place(gpu=0), place(gpu=0)])
    with pytest.raises(BackendUnavailable, match="2 hosts .*one host"):
        choose_provider("auto", [place(host="a"), place(host="b", gpu=1)])
    with pytest.raises(BackendUnavailable, match="rank.* without a usable GPU: 1: no CUDA device"):
        choose_provider("auto", [place(), place(error="no CUDA device is visible to torch")])


def test_more_heap_than_a_shared_gpu_has_free_is_refused_naming_the_ranks():
    check_memory([place(free=10 * GiB)] * 4, 2 * GiB)  # 8 GiB of 10: fits
    with pytest.raises(InvalidArgument, match=r"rank\(s\) \[0, 1, 2, 3\] share GPU 0 and need 4 x 3072 MiB.*"
                                              r"10240 MiB are free"):
        check_memory([place(free=10 * GiB)] * 4, 3 * GiB)
    check_memory([place(gpu=0, free=4 * GiB), place(gpu=1, free=4 * GiB)], 3 * GiB)  # one rank per GPU


def test_the_switch_takes_known_providers_only():
    assert requested_provider({}) == "auto"
    assert requested_provider({"DMACOLL_PEER_MEMORY": "IPC"}) == "ipc"
    with pytest.raises(InvalidArgument, match="DMACOLL_PEER_MEMORY='cudaipc' is not one of"):
        requested_provider({"DMACOLL_PEER_MEMORY": "cudaipc"})


def test_a_group_that_cannot_gather_objects_says_ranks_sharing_a_gpu_need_a_cpu_backend(monkeypatch):
    def refuse(out, obj, group=None):
        raise dist.DistBackendError("NCCL error: invalid usage: Duplicate GPU detected")

    monkeypatch.setattr(cuda_memory.dist, "all_gather_object", refuse)
    with pytest.raises(BackendUnavailable, match=r"Duplicate GPU detected.*init_process_group\('gloo'\)"):
        cuda_memory.gather_placements(None, 2, place())


class MirrorDist:
    """all_gather_object where every peer contributes what this rank does, but rank ``peer``'s entry
    comes from ``peer_values`` (a queue of what the peer sends, in order)."""

    def __init__(self, rank, peer_values):
        self.rank, self.peer_values = rank, list(peer_values)

    def all_gather_object(self, out, obj, group=None):
        out[:] = [obj] * len(out)
        out[1 - self.rank] = self.peer_values.pop(0)


class FakeIpcDriver:
    """cuMemGetAddressRange / cuIpcGetMemHandle / cuIpcOpenMemHandle: a handle carries the allocation base it
    exports; opening one maps it MAPPED higher."""

    MAPPED = 1 << 44

    class CUresult:
        CUDA_SUCCESS = 0

    class CUipcMemHandle:
        def __init__(self):
            self.buf = ctypes.create_string_buffer(64)

        def getPtr(self):
            return ctypes.addressof(self.buf)

    class CUipcMem_flags:
        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1

    def __init__(self, segment=0x7000_0000, size=1 << 30):
        self.segment, self.size, self.opened, self.closed = segment, size, [], []

    def cuMemGetAddressRange(self, ptr):
        assert self.segment <= ptr < self.segment + self.size
        return (0, self.segment, self.size)

    def cuIpcGetMemHandle(self, ptr):
        h = self.CUipcMemHandle()
        ctypes.memmove(h.getPtr(), int(ptr).to_bytes(8, "little"), 8)
        return (0, h)

    def cuIpcOpenMemHandle(self, handle, flags):
        assert flags == 1  # peer access enabled lazily
        base = int.from_bytes(ctypes.string_at(handle.getPtr(), 8), "little")
        self.opened.append(base)
        return (0, base + self.MAPPED)

    def cuIpcCloseMemHandle(self, ptr):
        self.closed.append(ptr)
        return (0,)


def test_the_ipc_exchange_maps_each_peers_allocation_and_adds_its_offset(monkeypatch):
    drv = FakeIpcDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    api = cuda_memory.CudaIpcApi(drv, cuda_backend.check_driver)
    peer_base, peer_offset = 0x5000_0000, 0x1200  # the peer's heap starts 0x1200 into its allocation
    peer_handle = peer_base.to_bytes(8, "little") + bytes(56)
    monkeypatch.setattr(ipc, "dist", MirrorDist(0, [None, peer_offset, ([peer_handle], None), None]))
    ptrs, opened = ipc.share_at(api, None, 0, 2, drv.segment + 0x400, "heap")
    assert ptrs == [drv.segment + 0x400, peer_base + FakeIpcDriver.MAPPED + peer_offset]
    assert opened == [peer_base + FakeIpcDriver.MAPPED] and drv.opened == [peer_base]
    assert api.ipc_get_handle(drv.segment)[:8] == drv.segment.to_bytes(8, "little")  # 64 bytes, base first


def test_a_failed_export_fails_every_rank_naming_the_rank(monkeypatch):
    drv = FakeIpcDriver()
    monkeypatch.setattr(cuda_backend, "_drv", drv)
    monkeypatch.setattr(drv, "cuIpcGetMemHandle", lambda ptr: (1,))  # CUDA_ERROR_INVALID_VALUE
    monkeypatch.setattr(cuda_backend._drv, "cuGetErrorName", lambda err: (0, b"CUDA_ERROR_INVALID_VALUE"),
                        raising=False)
    monkeypatch.setattr(ipc, "dist", MirrorDist(1, [None, 0, ([bytes(64)], None)]))
    with pytest.raises(BackendUnavailable, match=r"cuda backend: cuIpcGetMemHandle \(heap\) failed on rank\(s\) "
                                                  r"1: cuIpcGetMemHandle failed: CUDA_ERROR_INVALID_VALUE"):
        ipc.share_at(cuda_memory.CudaIpcApi(drv, cuda_backend.check_driver), None, 1, 2, drv.segment, "heap")


def test_ranks_spread_over_the_gpus_the_switch_allows(monkeypatch):
    from dmacoll_lab.verify import launch

    monkeypatch.setattr(launch_torch(), "device_count", lambda: 2)
    monkeypatch.delenv("DMACOLL_GPUS", raising=False)
    assert launch.gpus_for(4) == 2 and launch.nccl_usable(2) and not launch.nccl_usable(4)
    monkeypatch.setenv("DMACOLL_GPUS", "1")
    assert launch.gpus_for(2) == 1 and not launch.nccl_usable(2)  # two ranks on one GPU: no NCCL
    monkeypatch.setenv("DMACOLL_GPUS", "8")
    assert launch.gpus_for(2) == 2  # never more than are visible
    monkeypatch.setenv("DMACOLL_GPUS", "zero")
    with pytest.raises(ValueError, match="DMACOLL_GPUS='zero' must be a positive integer"):
        launch.gpus_for(2)


def launch_torch():
    import torch

    return torch.cuda
