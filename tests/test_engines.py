"""Every engine has every member of the engine protocol (backends/engine.py) that the communicator uses: the
instances their constructors build, the GPU ones with the device, the driver and the process group stood in."""
import types

import pytest
import torch
import torch.distributed as dist

from dmacoll.backends import cuda as cuda_backend
from dmacoll.backends import hip as hip_backend
from dmacoll.backends.engine import Engine
from dmacoll.options import EngineCapabilities
from dmacoll_lab.verify.launch import run_ranks
from test_hip_backend import CUDA_HEAPS, HIP_HEAPS, FakeHip, hip_flag_addrs

MEMBERS = sorted({n for n in dir(Engine) if not n.startswith("_")} | set(Engine.__annotations__))


def missing(engine) -> list[str]:
    return [m for m in MEMBERS if not hasattr(engine, m)]


def _host_engine(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=10)
    try:
        return isinstance(comm.engine, Engine), missing(comm.engine)
    finally:
        comm.close()


def test_the_host_engine_instance_has_every_member():
    assert run_ranks(_host_engine, 2) == [(True, [])] * 2


@pytest.fixture
def no_gpu(monkeypatch):
    """Rank 1 of 2 on a CPU 'device': the process group, the CUDA runtime calls and the watchdog thread stood in."""
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    for name, value in (("current_device", lambda: 0), ("set_device", lambda d: None),
                        ("synchronize", lambda d=None: None), ("Stream", lambda d=None: object()),
                        ("current_stream", lambda d=None: object())):
        monkeypatch.setattr(torch.cuda, name, value)
    for module in (cuda_backend, hip_backend):
        monkeypatch.setattr(module, "available", lambda: None)
        monkeypatch.setattr(module, "Watchdog", lambda engine, name, start=True: types.SimpleNamespace(name=name))
    return monkeypatch


def cuda_engine(no_gpu, heap):
    """CudaEngine's constructor, its heap opened on ``heap`` and stream memops taken as allowed."""
    no_gpu.setattr(cuda_backend.cuda_memory, "open_heap", lambda *a: types.SimpleNamespace(heap=heap,
                                                                                           ptrs=CUDA_HEAPS[:2]))
    no_gpu.setattr(cuda_backend.cuda_memory, "CudaIpcApi", lambda *a: None)
    no_gpu.setattr(cuda_backend.CudaEngine, "_memop_refusal", lambda self: "")
    return cuda_backend.CudaEngine(None, heap.numel(), 64, 1.0, device="cpu")


def test_the_cuda_engine_its_constructor_builds_has_every_member(no_gpu):
    heap = torch.zeros(1 << 12, dtype=torch.uint8)
    eng = cuda_engine(no_gpu, heap)
    assert isinstance(eng, Engine) and missing(eng) == []
    assert (eng.rank, eng.world, eng.heap, eng.capabilities.remote_memop_writes) == (1, 2, heap, True)
    assert eng.capabilities == cuda_backend.CudaEngine.capabilities  # the driver took memop writes: as stated


def test_the_hip_engine_its_constructor_builds_has_every_member(no_gpu):
    no_gpu.setattr(hip_backend.hip_api, "load", lambda: (FakeHip(), None))
    no_gpu.setattr(hip_backend.hip_memory, "resolve_flag_mode", lambda: "fine")
    no_gpu.setattr(hip_backend.hip_memory, "setup", lambda *a: types.SimpleNamespace(
        heap_ptrs=HIP_HEAPS[:2], flag_addrs=hip_flag_addrs(2)))
    eng = hip_backend.HipEngine(None, 1 << 12, 64, 1.0, device="cpu")
    assert isinstance(eng, Engine) and missing(eng) == []
    assert (eng.rank, eng.world, eng.heap.numel(), eng.ptrs) == (1, 2, 1 << 12, HIP_HEAPS[:2])
    assert isinstance(eng.capabilities, EngineCapabilities) and eng.capabilities.backend == "hip"


def test_a_member_the_constructor_forgets_is_caught(no_gpu):
    """The check is the instance's, not the class's: an attribute the constructor no longer sets is missing."""
    eng = cuda_engine(no_gpu, torch.zeros(1 << 12, dtype=torch.uint8))
    del eng.main_queue
    assert missing(eng) == ["main_queue"] and not isinstance(eng, Engine)
