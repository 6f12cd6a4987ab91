"""Baselines behind the same sweep: NCCL (SM kernels), NCCL's copy-engine path, torch symmetric memory's
low-contention all-gather, and one plain peer copy (the NVLink floor).

Each is a ``harness.Bound`` caller: ``caller(out, inp, counts)`` returns a closure of no arguments that issues
one collective on the current stream (and returns the output tensor if the implementation makes its own).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from dmacoll.lab_api import BackendUnavailable, Ref, ops
from .harness import Rank, torch_caller

NCCL_CTA_POLICY_ZERO = 0x02  # nccl.h (2.28): no CTAs, copy engines carry the data where NCCL can
IMPLS = ("nccl", "nccl_ce", "symm_mem_lc", "peer_copy")


class Baselines:
    def __init__(self, rk: Rank, max_bytes: int):
        self.rk, self.max_bytes = rk, max_bytes
        self.group = dist.group.WORLD
        self._ce = None
        self._lc = None

    def caller(self, impl: str, spec: ops.OpSpec) -> Callable:
        if impl not in IMPLS:
            raise ValueError(f"unknown baseline {impl!r}; choose one of {IMPLS}")
        return {"nccl": lambda s: torch_caller(s, self.group), "nccl_ce": self.nccl_ce,
                "symm_mem_lc": self.symm_mem_lc, "peer_copy": self.peer_copy}[impl](spec)

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
            big, device = self.max_bytes, torch.cuda.current_device()
            sym_in = symm_mem.empty(big, dtype=torch.uint8, device=device)
            sym_out = symm_mem.empty(big * self.rk.world, dtype=torch.uint8, device=device)
            symm_mem.rendezvous(sym_in, pg.group_name)
            symm_mem.rendezvous(sym_out, pg.group_name)
            self._ce = (pg, sym_in, sym_out)
        return self._ce

    def nccl_ce(self, spec: ops.OpSpec):
        def caller(out, inp, counts):
            pg, sym_in, sym_out = self._nccl_ce_setup()
            s_out = sym_out[: out.numel() * out.element_size()].view(out.dtype)
            s_in = sym_in[: inp.numel() * inp.element_size()].view(inp.dtype)
            s_in.copy_(inp)

            def call() -> torch.Tensor:
                spec.torch_call(s_out, s_in, pg, counts)
                return s_out
            return call
        return caller

    # -- torch symmetric memory, low-contention all-gather (pull with copy engines) ----
    def symm_mem_lc(self, spec: ops.OpSpec):
        if spec.name != "all_gather":
            raise BackendUnavailable("torch has a low-contention all-gather only")

        def caller(out, inp, counts):
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
        return caller

    # -- one peer copy: the NVLink floor for a chunk of this size -------------------
    def peer_copy(self, spec: ops.OpSpec):
        """Copy what a rank sends one peer (``spec.peer_bytes``) into that peer, no synchronisation: at offset
        ``rank x chunk`` of the peer's output, so ``peer_chunk`` says which part of ours a check can read."""
        def caller(out, inp, counts):
            rk, engine = self.rk, self.rk.comm.engine
            chunk = spec.peer_bytes(inp.numel() * inp.element_size(), rk.world)
            peer = (rk.rank + 1) % rk.world
            src = Ref("sym", rk.rank, engine.sym_offset(inp))
            dst = Ref("sym", peer, engine.sym_offset(out) + rk.rank * chunk)
            return lambda: engine.copy(torch.cuda.current_stream() if rk.device.type == "cuda" else None, src, dst,
                                       chunk, {})
        return caller


def peer_chunk(rank: int, world: int, chunk: int) -> tuple[int, int]:
    """The bytes of our output a peer copy fills: (start, end) of the chunk from rank - 1."""
    sender = (rank - 1) % world
    return sender * chunk, (sender + 1) * chunk
