"""The cross-rank check of each call: every rank makes the same collective call, or every rank raises.

Ranks that disagree on a call (rank 0 all-gathers 4 elements, rank 1 8; two send_counts matrices; one rank a call
ahead) would otherwise exchange garbage or wait for each other until a timeout, since a plan trusts that its peers
built the matching one. The check is off by default (it costs a crossing of the process group per call); it is on
under ``DMACOLL_CHECK_CALLS=1``, under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (PyTorch's switch for the same check of
its own collectives), or with ``Communicator(options=Options(check_calls=True))``.

Per call each rank hashes its signature (what every rank must agree on, or the error that made it reject the call)
and the ranks all-reduce the largest hash and the smallest: one all-reduce of 16 bytes in the process group, on its
CPU (gloo) backend where it has one. Only when the hashes differ do they all-gather the signatures themselves, to
say which ranks differ in what; every rank then raises the same ``InvalidArgument``.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

import torch
import torch.distributed as dist

from .errors import InvalidArgument

ENV = "DMACOLL_CHECK_CALLS"


def enabled(option: Optional[bool] = None) -> bool:
    """``option`` when given, else whether $DMACOLL_CHECK_CALLS is set (not 0) or TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    if option is not None:
        return bool(option)
    return (os.environ.get(ENV, "0").strip() not in ("", "0")
            or os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL")


def device(group: dist.ProcessGroup) -> torch.device:
    """Where the hashes travel: the device the group exchanges Python objects on (the CPU where it has gloo)."""
    from torch.distributed import distributed_c10d as c10d

    kind = c10d._get_object_coll_device(group)
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def agree(group: dist.ProcessGroup, what: str, signature: Optional[dict], error: Optional[str]) -> None:
    """Return if every rank of ``group`` has the same ``signature`` (``error`` None: this rank accepted the call), or
    every rank has an error (each raises its own); else raise InvalidArgument on every rank."""
    mine = (signature, error)
    digest = int.from_bytes(hashlib.blake2b(repr(mine).encode(), digest_size=7).digest(), "little")  # -digest fits
    # the largest digest and minus the smallest: both are this rank's own only if every rank has the same
    extremes = torch.tensor([digest, -digest], dtype=torch.int64, device=device(group))
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    if extremes.tolist() == [digest, -digest]:
        return
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    if all(error is not None for _, error in everyone):
        return  # every rank rejected the call: each raises its own reason
    raise InvalidArgument(describe(what, everyone))


def describe(what: str, everyone: list[tuple[Optional[dict], Optional[str]]]) -> str:
    """The message: which ranks rejected the call and why, and where the others' signatures differ."""
    parts = [f"rank {r} rejected it ({error})" for r, (_, error) in enumerate(everyone) if error is not None]
    signed = {r: s for r, (s, _) in enumerate(everyone) if s is not None}
    for field in dict.fromkeys(f for s in signed.values() for f in s):
        values: dict[str, list[int]] = {}
        for r, s in signed.items():
            values.setdefault(repr(s.get(field)), []).append(r)
        if len(values) > 1:
            parts.append(f"{field}: " + ", ".join(f"{v} on {_ranks(rs)}" for v, rs in values.items()))
    return (f"{what}: the ranks disagree (the cross-rank check of each call is on): {'; '.join(parts)}. Every rank "
            "must make the same collective calls, in the same order, with the same sizes and options")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
