"""The one interface the model calls for communication, so its code is the same for NCCL and dmacoll:
``collective(op, out, x, overlapped, counts)``, any collective of the op registry (``dmacoll.ops``) by name, on the
current stream (schedule.py picks it). ``x`` None: ``out`` is input and output (an all-reduce in place).
``overlapped``: the call runs beside the forward's compute (an overlapped schedule), where dmacoll takes its
``overlap_path``. ``counts``: all_to_all_v's split matrix (elements rank i sends rank j).

``buffer(name, *shape)``: a reusable communication buffer (the first elements of a block reserved once per
name). The model computes straight into it (``matmul(..., out=buffer)``) and runs the collective in place;
for dmacoll the blocks live in the communicator's symmetric heap, so no collective stages its data. A buffer's
contents are valid until the next use of the same name.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Optional

import torch

from dmacoll.lab_api import ops
from .calls import staging_elements


class Collectives:
    """World size 1: no communication (the unsharded reference)."""

    name = "none"

    def __init__(self, device: torch.device, rank: int = 0, world: int = 1):
        self.device, self.rank, self.world = torch.device(device), rank, world
        self._blocks: dict[str, torch.Tensor] = {}

    def reserve(self, elements: Mapping[str, int], dtype: torch.dtype) -> None:
        """One block per name, of at least ``elements[name]`` elements of ``dtype``."""
        for name, n in elements.items():
            self._blocks[name] = self._allocate(n, dtype)

    def _allocate(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=self.device)

    def buffer(self, name: str, *shape: int) -> torch.Tensor:
        block = self._blocks[name]
        n = math.prod(shape)
        if n > block.numel():
            raise ValueError(f"buffer {name!r}: {shape} needs {n} elements, {block.numel()} reserved")
        return block[:n].view(shape)

    def collective(self, op: str, out: torch.Tensor, x: Optional[torch.Tensor] = None,
                   overlapped: bool = False, counts: Optional[list] = None) -> torch.Tensor:
        """At world 1 every collective's output is its input (``ops.get(op).reference`` of one rank)."""
        ops.get(op)  # an unknown name fails here as it would on the other implementations
        if x is not None and x.data_ptr() != out.data_ptr():
            out.view(-1).copy_(x.reshape(-1))
        return out

    def close(self) -> None:
        pass


class TorchCollectives(Collectives):
    """torch.distributed: NCCL for CUDA tensors, gloo for CPU ones (tests)."""

    name = "nccl"

    def __init__(self, device: torch.device, group=None):
        import torch.distributed as dist

        self.group = group
        super().__init__(device, dist.get_rank(group), dist.get_world_size(group))
        if self.device.type == "cpu":
            self.name = "gloo"

    def collective(self, op: str, out: torch.Tensor, x: Optional[torch.Tensor] = None,
                   overlapped: bool = False, counts: Optional[list] = None) -> torch.Tensor:
        ops.get(op).torch_call(out, out if x is None else x, self.group, counts=counts)
        return out


class DmaCollectives(Collectives):
    """dmacoll's Communicator (variant 'auto', sync 'reset' so calls can be captured in CUDA graphs). Its calls take
    the default path ('auto': the sm path, NCCL or the copy engines, whichever was measured fastest alone), but a
    call overlapped with compute takes ``overlap_path`` ('dma', the default: the copy engines, which leave the SMs
    to the compute they overlap; the sm path's and NCCL's kernels would take SMs from it; 'auto': as alone)."""

    name = "dma"

    def __init__(self, device: torch.device, elements: Mapping[str, int], dtype: torch.dtype,
                 backend: str = "auto", timeout_s: Optional[float] = None, group=None, overlap_path: str = "dma"):
        import torch.distributed as dist

        from dmacoll.lab_api import ALIGN, Communicator, DEFAULT_TIMEOUT_S, Options

        size = torch.empty((), dtype=dtype).element_size()
        heap = sum((n * size + ALIGN - 1) // ALIGN * ALIGN for n in elements.values()) + (1 << 20)
        # a reducing collective receives every rank's chunk into staging (calls.staging_elements): an all-reduce's
        # copy-engine plans take up to (world + 1) x its tensor there, so the large sums 'auto' gives the copy
        # engines (options.DMA_AUTO_MIN_BYTES) fit rather than falling back to NCCL; all buffers are symmetric
        world = dist.get_world_size(group)
        staging = (world + 1) * staging_elements(elements) * size + (4 << 20)
        self.comm = Communicator(group, backend=backend, heap_bytes=heap, staging_bytes=staging,
                                 timeout_s=timeout_s or DEFAULT_TIMEOUT_S,
                                 options=Options(variant="auto", sync="reset"))
        self.comm.calibrate(force=False)  # where the platform has no table: now, not inside a timed or captured call
        super().__init__(self.comm.device, dist.get_rank(group), world)
        self.overlap_path = overlap_path
        self.paths: Counter = Counter()
        if torch.device(device).type != self.device.type:
            raise ValueError(f"dmacoll's {self.comm.backend} backend runs on {self.device}, the model on {device}")
        self.reserve(elements, dtype)

    def _allocate(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return self.comm.empty(n, dtype=dtype)

    def collective(self, op: str, out: torch.Tensor, x: Optional[torch.Tensor] = None,
                   overlapped: bool = False, counts: Optional[list] = None) -> torch.Tensor:
        path = self.overlap_path if overlapped and self.overlap_path != "auto" else None
        self.comm.collective(op, out, x, *(() if counts is None else (counts,)), **({"path": path} if path else {}))
        self.paths[(op, self.comm.last_options.path)] += 1  # which data path each op took (the run log says)
        return out

    def take_paths(self) -> str:
        """The (op, data path) counts of the calls since the last take, as one line ('' for none)."""
        text = ", ".join(f"{op} {path} x{n}" for (op, path), n in sorted(self.paths.items()))
        self.paths.clear()
        return text

    def close(self) -> None:
        self.comm.close()


def make(impl: str, device: torch.device, elements: Mapping[str, int], dtype: torch.dtype,
         group=None, timeout_s: Optional[float] = None, overlap_path: str = "dma") -> Collectives:
    """``impl``: 'none' (world 1), 'nccl' (torch.distributed: NCCL on GPUs, gloo on the CPU) or 'dma' (with
    ``overlap_path`` for its overlapped calls)."""
    if impl == "dma":
        backend = "host" if torch.device(device).type == "cpu" else "auto"
        return DmaCollectives(device, elements, dtype, backend=backend, timeout_s=timeout_s, group=group,
                              overlap_path=overlap_path)
    coll = TorchCollectives(device, group) if impl == "nccl" else Collectives(device)
    coll.reserve(elements, dtype)
    return coll
