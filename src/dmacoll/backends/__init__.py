"""Backends that execute plans: ``cuda`` (copy engines), ``hip`` (MI300X SDMA engines through
hip-python), ``host`` (CPU emulator)."""
from __future__ import annotations

import torch

from ..errors import BackendUnavailable

BACKENDS = ("cuda", "hip", "host")


def resolve(name: str) -> str:
    """Map ``auto`` to the backend this machine runs; reject unknown names, and ``cuda`` or ``hip`` where it
    cannot run (before anything is allocated, with the reason)."""
    if name == "auto":
        if torch.cuda.is_available():
            return "hip" if torch.version.hip else "cuda"
        return "host"
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {('auto',) + BACKENDS}")
    if name == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("backend 'cuda' needs an NVIDIA GPU and a CUDA build of torch, and this machine "
                                 "has none (torch.cuda.is_available() is False); backend 'host' runs the same "
                                 "plans on the CPU")
    if name == "hip":
        from . import hip, hip_api

        reason = hip.available()
        if reason:
            raise hip_api.unavailable(reason)
    return name


def engine_class(name: str):
    """The engine class of a resolved backend name: its capabilities can be read before one exists."""
    if name == "cuda":
        from .cuda import CudaEngine

        return CudaEngine
    if name == "hip":
        from .hip import HipEngine

        return HipEngine
    from .host import HostEngine

    return HostEngine


def make_engine(name: str, group, nbytes: int, flag_words: int, timeout_s: float, device=None):
    """One rank's engine (``engine.Engine``) for a resolved backend name."""
    return engine_class(name)(group, nbytes, flag_words, timeout_s, device)


def sym_offset(heap: torch.Tensor, t: torch.Tensor):
    """Byte offset of ``t`` in the symmetric ``heap``, or None if it lies elsewhere.

    Decided by storage, not address, so that empty views of the heap count too
    (their data_ptr() is 0): every rank must see the same kind of buffer."""
    if t.untyped_storage().data_ptr() != heap.untyped_storage().data_ptr():
        return None
    return t.storage_offset() * t.element_size() - heap.storage_offset() * heap.element_size()
