"""How fast can the copy-engine collectives' own SM work run on the few SMs a carved-out GEMM leaves? (one GPU)

With ``dma_carveout`` (``dmacoll c3``) cuBLASLt leaves 8 SMs free, and the dma all-to-all's 64 MB own-chunk copy
takes 276 us there (35 us on an idle H200), the reduce ops' bf16 add of 16 Mi elements 198 us
(``results/h200x1/probes/sm_carveout/``): both about 60 GB/s of memory traffic per SM, slower
than the NVLink copy they run beside. This asks whether a kernel written for few SMs (16-byte accesses, several
independent loads in flight per thread, a small grid) moves more per SM than the driver's copy kernel and
torch's elementwise add.

Side jobs: ``driver_copy`` (``cuMemcpyAsync`` device to device, what the cuda backend issues), ``torch_add``
(what ``backends/reduce.py`` issues), and NVRTC-compiled ``copy_u4`` / ``add_bf16`` kernels over a grid of
(threads per block, loads in flight per thread, blocks). Each side job is timed alone on an idle GPU and next
to three bf16 8192^3 GEMMs through cuBLASLt with a carveout of 8 or 16 SMs, arriving 100 us after the GEMMs
start (as ``dmacoll probe sm_carveout``). Medians of 5. Columns: ``side_us`` (issue -> end), ``gb_per_s``
(bytes read + written / side_us), ``gemm_us`` (release -> GEMMs' end, empty alone), ``correct`` (the output
compared with torch's).

Usage: dmacoll probe few_sm_kernels [--carveouts 8 16] [--threads ...] [--unrolls ...] [--blocks ...] [--out CSV]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

from .common import (Table, add_repeats, checked, count, driver, gemm_and_side_operands, next_to_gemms,
                     nvrtc_functions, size_multiple_of)

NAME = "few_sm_kernels"
HELP = "copy / bf16-add kernels written for few SMs vs the driver's and torch's, next to a carved-out GEMM (1 GPU)"
GPUS = 1
COLUMNS = ["carveout", "side", "threads", "unroll", "blocks", "side_us", "gb_per_s", "gemm_us", "correct"]
EXTRA: dict[str, list[str]] = {}
SIDE_DELAY_US = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_repeats(p, 5)
    p.add_argument("--carveouts", nargs="+", type=count, default=[8, 16],
                   help="SMs the GEMMs leave free (cuBLASLt's SM-count target); every side job is also timed alone "
                        "(default 8 16)")
    p.add_argument("--threads", nargs="+", type=count, default=[256, 512, 1024], help="threads per block")
    p.add_argument("--unrolls", nargs="+", type=count, default=[4, 8], help="16-byte loads in flight per thread")
    p.add_argument("--blocks", nargs="+", type=count, default=[8, 16, 32, 264], help="grid sizes")
    p.add_argument("--copy-bytes", type=size_multiple_of(16), default=64 << 20,
                   help="bytes the copies move (a multiple of 16; default 64M)")
    p.add_argument("--add-elements", type=size_multiple_of(8), default=16 << 20,
                   help="bf16 elements per add operand (a multiple of 8; default 16M = 16 Mi)")


def side_row(carveout, side: str, threads: int, unroll: int, blocks: int, nbytes: int,
             times: list[tuple[float, float]], correct: bool) -> dict:
    """One side job at one carveout (None: alone) from its (side_us, gemm_us) samples; ``nbytes`` read + written."""
    side_us = statistics.median(t[0] for t in times)
    return {"carveout": carveout if carveout is not None else "alone", "side": side, "threads": threads,
            "unroll": unroll, "blocks": blocks, "side_us": side_us, "gb_per_s": nbytes / side_us / 1e3,
            "gemm_us": statistics.median(t[1] for t in times), "correct": correct}


SOURCE = r"""
// bf16 <-> float by bit moves; round to nearest even (inputs here are finite)
__device__ __forceinline__ float lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned int rne(float f) {
    unsigned int u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ unsigned int add2(unsigned int a, unsigned int b) {
    return rne(lo(a) + lo(b)) | (rne(hi(a) + hi(b)) << 16);
}
__device__ __forceinline__ uint4 add8(uint4 a, uint4 b) {
    uint4 r;
    r.x = add2(a.x, b.x); r.y = add2(a.y, b.y); r.z = add2(a.z, b.z); r.w = add2(a.w, b.w);
    return r;
}

extern "C" __global__ void copy_u4(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) dst[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

extern "C" __global__ void add_bf16(const uint4* __restrict__ x, const uint4* __restrict__ y,
                                    uint4* __restrict__ out, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        uint4 a[UNROLL], b[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) { a[u] = x[i + u * stride]; b[u] = y[i + u * stride]; }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) out[i + u * stride] = add8(a[u], b[u]);
    }
    for (; i < n; i += stride) out[i] = add8(x[i], y[i]);
}
"""


def compile_kernels(unroll: int, arch: str) -> dict:
    """The two kernels for one UNROLL, compiled by NVRTC to a cubin for ``arch`` and loaded."""
    return nvrtc_functions(SOURCE, "few_sm.cu", arch, ("copy_u4", "add_bf16"), (f"-DUNROLL={unroll}",))


def launcher(fn, blocks: int, threads: int, ptrs: list, n16: int):
    import torch

    drv = driver()
    args = (tuple(ptrs) + (n16,), (ctypes.c_void_p,) * len(ptrs) + (ctypes.c_ulonglong,))
    return lambda: checked(drv.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0,
                                              torch.cuda.current_stream().cuda_stream, args, 0), "cuLaunchKernel")


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from ..harness import sleep_cycles_per_us

    driver()  # before any GPU work: a missing cuda-bindings is one line, not a traceback halfway
    torch.backends.cuda.preferred_blas_library("cublaslt")
    major, minor = torch.cuda.get_device_capability(0)
    a, c, src, dst, x, y, z = gemm_and_side_operands(args.copy_bytes, args.add_elements)
    want = x + y
    sides = {("driver_copy", 0, 0, 0): (lambda: dst.copy_(src), lambda: torch.equal(dst, src), 2 * src.numel()),
             ("torch_add", 0, 0, 0): (lambda: torch.add(x, y, out=z), lambda: torch.equal(z, want), 6 * x.numel())}
    for unroll in args.unrolls:
        fns = compile_kernels(unroll, f"sm_{major}{minor}")
        for threads in args.threads:
            for blocks in args.blocks:
                sides[("copy_u4", threads, unroll, blocks)] = (
                    launcher(fns["copy_u4"], blocks, threads, [src.data_ptr(), dst.data_ptr()], src.numel() // 16),
                    lambda: torch.equal(dst, src), 2 * src.numel())
                sides[("add_bf16", threads, unroll, blocks)] = (
                    launcher(fns["add_bf16"], blocks, threads, [x.data_ptr(), y.data_ptr(), z.data_ptr()],
                             x.numel() * 2 // 16),
                    lambda: torch.equal(z, want), 6 * x.numel())
    side_stream, comp = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = sleep_cycles_per_us()
    hold, delay = int(200 * cycles), int(SIDE_DELAY_US * cycles)

    def gemms():
        for _ in range(3):
            torch.mm(a, a, out=c)

    def once(side, with_gemms: bool) -> tuple[float, float]:
        return next_to_gemms(side, side_stream, gemms if with_gemms else None, comp, hold,
                             delay if with_gemms else 0)

    rows = []
    for carveout in (None, *args.carveouts):  # None: the side job alone on an idle GPU
        torch._C._set_sm_carveout_experimental(carveout)
        with torch.cuda.stream(comp):
            gemms()  # cuBLASLt's choice for this carveout
        for (name, threads, unroll, blocks), (side, check, nbytes) in sides.items():
            z.zero_()  # a kernel that wrote nothing fails its check
            dst.zero_()
            side()  # warm-up
            times = [once(side, carveout is not None) for _ in range(args.repeats)]
            rows.append(side_row(carveout, name, threads, unroll, blocks, nbytes, times, check()))
            r = rows[-1]
            print(f"{str(r['carveout']):>5s} {name:12s} t{threads:<5d} u{unroll} b{blocks:<4d} {r['side_us']:8.1f} us "
                  f"{r['gb_per_s']:7.0f} GB/s  GEMMs {r['gemm_us']:7.0f} us{'' if r['correct'] else '  WRONG'}",
                  flush=True)
    torch._C._set_sm_carveout_experimental(None)
    config = {"gemm": "3x bf16 8192^3 cuBLASLt", "repeats": args.repeats, "side_delay_us": SIDE_DELAY_US,
              "copy_bytes": src.numel(), "add_elements": x.numel(),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    return {NAME: Table(rows, config)}
