"""Peer memory shared by IPC handles: what the cuda backend's IPC heap (``cuda_memory``) and the hip backend
(``hip_memory``) have in common.

A rank exports each local allocation as an IPC handle (64 plain bytes, so it travels through
``all_gather_object`` like any object) and opens every peer's. A handle covers a whole allocation: where the
memory a rank shares starts inside one (a caching allocator's segment), the offset travels beside the handle
(``share_at``). Every step ends with the ranks agreeing on success, so no rank waits alone in the next
collective when another failed.

The driver is reached through ``api``: an object with ``backend`` (its name, for messages), ``get_name`` and
``open_name`` (the driver functions, for messages), ``error`` (the exception its calls raise),
``ipc_get_handle(ptr) -> bytes``, ``ipc_open(handle) -> address`` and ``address_range(ptr) -> (base, size)``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch.distributed as dist

from ..errors import BackendUnavailable


def raise_failed(backend: str, errors: Sequence[Optional[str]], what: str) -> None:
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise BackendUnavailable(f"{backend} backend: {what} failed on rank(s) " +
                                 "; ".join(f"{r}: {e}" for r, e in failed))


def all_ranks_ok(backend: str, group, world: int, error: Optional[str], what: str) -> None:
    """Raise on every rank if any rank failed, so that no rank waits alone in the next collective."""
    errors: list = [None] * world
    dist.all_gather_object(errors, error, group=group)
    raise_failed(backend, errors, what)


def share(api, group, rank: int, world: int, ptrs: Sequence[int], what: str,
          hint: str = "") -> tuple[list[list[int]], list[int]]:
    """Export each local allocation (``ptrs``: allocation bases) and open every peer's: ([rank][i] address here,
    the mappings opened)."""
    handles, error = [], None
    try:
        handles = [api.ipc_get_handle(p) for p in ptrs]
    except api.error as e:
        error = f"{e}{hint}"
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (handles, error), group=group)
    raise_failed(api.backend, [e for _, e in gathered], f"{api.get_name} ({what})")
    out, opened, error = [], [], None
    for r, (peer_handles, _) in enumerate(gathered):
        if r == rank:
            out.append(list(ptrs))
            continue
        try:
            mapped = [api.ipc_open(h) for h in peer_handles]
        except api.error as e:
            mapped, error = [], f"{e} (opening rank {r}'s {what}){hint}"
        opened += mapped
        out.append(mapped)
    all_ranks_ok(api.backend, group, world, error, f"{api.open_name} ({what})")
    return out, opened


def share_at(api, group, rank: int, world: int, ptr: int, what: str, hint: str = "",
             range_hint: str = "") -> tuple[list[int], list[int]]:
    """``ptr`` (anywhere inside an allocation) as every rank sees its own: [rank] address here, the mappings
    opened. The allocation's base is exported and each rank's offset in it travels beside the handle."""
    try:
        base, _ = api.address_range(ptr)
        error = None
    except api.error as e:
        base, error = 0, f"{e}{range_hint}"
    all_ranks_ok(api.backend, group, world, error, f"address range ({what})")
    offsets: list = [None] * world
    dist.all_gather_object(offsets, ptr - base, group=group)
    bases, opened = share(api, group, rank, world, [base], what, hint)
    return [ptr if r == rank else bases[r][0] + offsets[r] for r in range(world)], opened
