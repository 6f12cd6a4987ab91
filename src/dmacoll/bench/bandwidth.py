"""Bytes and bandwidths of one sweep point (nccl-tests conventions; see bench/sweep.py)."""


def bandwidths(op: str, impl: str, nbytes: int, world: int, time_us: float) -> tuple[int, float, float]:
    """(total_bytes, algbw, busbw) in GB/s of one point, as bench/sweep.py's docstring defines them."""
    if impl == "peer_copy":
        chunk = nbytes // world if op == "all_to_all" else nbytes
        bw = chunk / (time_us * 1e-6) / 1e9
        return chunk, bw, bw
    total = nbytes * world if op == "all_gather" else nbytes
    algbw = total / (time_us * 1e-6) / 1e9
    return total, algbw, algbw * (world - 1) / world
