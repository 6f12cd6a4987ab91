"""Does a GEMM slow down a copy-engine copy, and does it matter where the copy goes? (2 GPUs, one process)

C3 (results/h200x2/c3) found the dma all-gather unaffected by a concurrent GEMM but the dma
all-to-all / reduce collectives slowed ~1.6-1.9x, although none of their data movement launches a kernel
here. Their difference: a device-local copy (own chunk -> own output or staging slot). This times, on
each GPU, 64 MB copies (torch copy_, i.e. cudaMemcpyAsync) alone and next to a bf16 GEMM (8192^3) on another
stream: device-local (D2D on one GPU) vs to the peer over NVLink, 1 and 4 back to back; medians of 7. The
copies' time runs from one event that also releases the GEMM's stream (two streams from one start: not the timing
loop, which times one stream).

Usage: dmacoll probe copy_contention [--bytes 64M] [--copies 1 4] [--repeats 7] [--out CSV]
"""
from __future__ import annotations

import argparse
import statistics

from dmacoll.lab_api import parse_size
from .common import Table, add_repeats, count

NAME = "copy_contention"
HELP = "a copy-engine copy (device-local vs to the peer) alone and next to a GEMM (2 GPUs)"
GPUS = 2
COLUMNS = ["gpu", "copy", "bytes", "copies", "next_to_gemm", "time_us", "correct"]
EXTRA: dict[str, list[str]] = {}
GEMM = "8192^3 bf16 x3"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bytes", type=parse_size, default=64 << 20, help="bytes per copy (default 64M)")
    p.add_argument("--copies", nargs="+", type=count, default=[1, 4], help="copies back to back (default 1 4)")
    add_repeats(p, 7)


def measurement_row(gpu: int, where: str, nbytes: int, copies: int, together: bool, times_us: list[float]) -> dict:
    """One (GPU, destination, copies, with or without the GEMM) point; ``correct`` is set once the GPU is done."""
    return {"gpu": gpu, "copy": where, "bytes": nbytes, "copies": copies, "next_to_gemm": together,
            "time_us": statistics.median(times_us), "correct": None}


def config(args: argparse.Namespace) -> dict:
    return {"probe": "copy next to a GEMM", "gemm": GEMM, "bytes": args.bytes, "copies": args.copies,
            "repeats": args.repeats}


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from dmacoll.lab_api import BackendUnavailable

    n = args.bytes
    rows = []
    for dev in (0, 1):
        peer = 1 - dev
        torch.cuda.set_device(dev)
        torch.cuda.synchronize()
        if not torch.cuda.can_device_access_peer(dev, peer):
            raise BackendUnavailable(f"GPU {dev} cannot access GPU {peer}")
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
        local = torch.empty(n, dtype=torch.uint8, device=dev)
        remote = torch.empty(n, dtype=torch.uint8, device=peer)
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        comp, comm = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        for _ in range(3):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize(dev)

        def copies(dst, k):  # torch issues cudaMemcpyAsync for these (peer access enabled by torch)
            with torch.cuda.stream(comm):
                for _ in range(k):
                    dst.copy_(src, non_blocking=True)

        for where, dst in (("local", local), ("peer", remote)):
            for k in args.copies:
                for together in (False, True):
                    times = []
                    for _ in range(args.repeats):
                        torch.cuda.synchronize(dev)
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record(comm)
                        comp.wait_stream(comm)
                        if together:
                            with torch.cuda.stream(comp):
                                for _ in range(3):
                                    torch.mm(a, b, out=c)
                        copies(dst, k)
                        end.record(comm)
                        torch.cuda.synchronize(dev)
                        times.append(start.elapsed_time(end) * 1e3)
                    rows.append(measurement_row(dev, where, n, k, together, times))
                    print(f"GPU {dev} {where:5s} x{k} {'with GEMM' if together else 'alone    '}: "
                          f"{rows[-1]['time_us']:9.1f} us", flush=True)
        ok = bool(torch.equal(local.cpu()[:1024], src.cpu()[:1024])) and bool(
            torch.equal(remote.cpu()[:1024], src.cpu()[:1024]))
        for r in rows:
            if r["gpu"] == dev:
                r["correct"] = ok
    return {NAME: Table(rows, config(args))}
