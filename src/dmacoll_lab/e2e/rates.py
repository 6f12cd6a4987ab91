"""The two rates a run's compute is held against, measured once per run on its own GPU: memory traffic of a
device-local copy (bytes read + bytes written per second: what a decode step that reads its weights can reach)
and the model dtype's GEMM rate on a large square GEMM (what a prefill's projections can reach).

On the host (tests) the same code runs at small sizes; its numbers mean nothing.
"""
from __future__ import annotations

import statistics

import torch

from dmacoll.lab_api import bench_time


def _median_us(fn, repeats: int, device: torch.device) -> float:
    """The median time of ``fn`` after one warm-up call (kernels chosen, memory touched)."""
    return statistics.median(bench_time(fn, 1, repeats, warmup=1, device=device).samples)


def copy_GBps(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Read + write traffic of one device-local copy of ``nbytes``, GB/s."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = _median_us(lambda: dst.copy_(src), repeats, device)
    return 2 * nbytes / t / 1e3


def gemm_TFLOPs(device: torch.device, dtype: torch.dtype, n: int = 8192, repeats: int = 5) -> float:
    """``n`` x ``n`` x ``n`` GEMM in ``dtype``, TFLOP/s."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = _median_us(lambda: torch.matmul(a, b, out=out), repeats, device)
    return 2 * n ** 3 / t / 1e6


def measure(device: torch.device, dtype: torch.dtype) -> dict:
    small = device.type != "cuda"
    return {"copy_GBps": copy_GBps(device, 1 << 24 if small else 1 << 30),
            "gemm_TFLOPs": gemm_TFLOPs(device, dtype, 256 if small else 8192)}
