"""Baselines behind the same sweep: NCCL (SM kernels), NCCL's copy-engine path,
torch symmetric memory's low-contention all-gather, and one plain peer copy.

Each ``call`` returns a closure with no arguments that issues one collective on
the current stream (and returns the output tensor if the implementation makes
its own).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..errors import BackendUnavailable
from ..plan import Ref

NCCL_CTA_POLICY_ZERO = 0x02  # nccl.h (2.28): no CTAs, copy engines carry the data where NCCL can


class Baselines:
    def __init__(self, comm, group: Optional[dist.ProcessGroup] = None, max_bytes: int = 0):
        self.comm = comm
        self.group = group or dist.group.WORLD
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.max_bytes = max_bytes
        self._ce = None
        self._lc = None

    # -- NCCL, default SM path -------------------------------------------------
    def nccl(self, op: str, out: torch.Tensor, inp: torch.Tensor, group=None) -> Callable[[], None]:
        g = group or self.group
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(out, inp, group=g)
        return lambda: dist.all_to_all_single(out, inp, group=g)

    # -- NCCL, zero-CTA policy on symmetric windows ----------------------------
    def _nccl_ce_setup(self):
        if self._ce is None:
            opts = dist.ProcessGroupNCCL.Options()
            if not hasattr(opts.config, "cta_policy"):
                raise BackendUnavailable(f"torch {torch.__version__} does not expose NCCLConfig.cta_policy")
            opts.config.cta_policy = NCCL_CTA_POLICY_ZERO
            pg = dist.new_group(backend="nccl", pg_options=opts)
            import torch.distributed._symmetric_memory as symm_mem

            symm_mem.set_backend("NCCL")
            big = self.max_bytes
            sym_in = symm_mem.empty(big, dtype=torch.uint8, device=torch.cuda.current_device())
            sym_out = symm_mem.empty(big * self.world, dtype=torch.uint8, device=torch.cuda.current_device())
            symm_mem.rendezvous(sym_in, pg.group_name)
            symm_mem.rendezvous(sym_out, pg.group_name)
            self._ce = (pg, sym_in, sym_out)
        return self._ce

    def nccl_ce(self, op: str, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], torch.Tensor]:
        pg, sym_in, sym_out = self._nccl_ce_setup()
        s_out = sym_out[: out.numel() * out.element_size()].view(out.dtype)
        s_in = sym_in[: inp.numel() * inp.element_size()].view(inp.dtype)
        s_in.copy_(inp)
        run = self.nccl(op, s_out, s_in, group=pg)

        def call() -> torch.Tensor:
            run()
            return s_out

        return call

    # -- torch symmetric memory, low-contention all-gather (pull with copy engines) ----
    def symm_mem_lc(self, op: str, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], torch.Tensor]:
        if op != "all_gather":
            raise BackendUnavailable("torch has a low-contention all-gather only")
        import torch.distributed._symmetric_memory as symm_mem

        if self._lc is None:
            buf = symm_mem.empty(self.max_bytes, dtype=torch.uint8, device=torch.cuda.current_device())
            symm_mem.rendezvous(buf, self.group.group_name)
            self._lc = buf
        s_in = self._lc[: inp.numel() * inp.element_size()].view(inp.dtype)
        s_in.copy_(inp)
        name = self.group.group_name
        # the op runs on a side stream; wait_tensor joins it back to the current stream
        return lambda: torch.ops._c10d_functional.wait_tensor(
            torch.ops.symm_mem._low_contention_all_gather(s_in, name))

    # -- one peer copy: the NVLink floor for a chunk of this size -------------------
    def peer_copy(self, op: str, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        """Copy the chunk a rank sends to one peer into that peer, no synchronisation."""
        engine = self.comm.engine
        peer = (self.rank + 1) % self.world
        chunk = inp.numel() * inp.element_size() // (self.world if op == "all_to_all" else 1)
        src = Ref("sym", self.rank, engine.sym_offset(inp) + (peer * chunk if op == "all_to_all" else 0))
        dst = Ref("sym", peer, engine.sym_offset(out) + self.rank * chunk)
        return lambda: engine.copy(torch.cuda.current_stream(), src, dst, chunk, {})

    def call(self, impl: str, op: str, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], Optional[torch.Tensor]]:
        if impl not in ("nccl", "nccl_ce", "symm_mem_lc", "peer_copy"):
            raise ValueError(f"unknown baseline {impl!r}")
        return getattr(self, impl)(op, out, inp)
