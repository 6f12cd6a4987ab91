"""Bytes and bandwidths of one sweep point (nccl-tests conventions, from the op's spec; see bench/sweep.py)."""
from __future__ import annotations

from dmacoll.lab_api import ops


def bandwidths(op: str, impl: str, nbytes: int, world: int, time_us: float) -> tuple[int, float, float]:
    """(total_bytes, algbw, busbw) in GB/s of one point. ``peer_copy`` is one copy of what a rank sends one
    peer: its bytes, and both bandwidths, are that copy's."""
    spec = ops.get(op)
    if impl == "peer_copy":
        chunk = spec.peer_bytes(nbytes, world)
        bw = chunk / (time_us * 1e-6) / 1e9
        return chunk, bw, bw
    total = spec.total_bytes(nbytes, world)
    algbw = total / (time_us * 1e-6) / 1e9
    return total, algbw, algbw * spec.bus_factor(world)
