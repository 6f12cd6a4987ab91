"""The cuda backend's own kernels (``wait='spin'`` and ``wait='fold'``), compiled by NVRTC on first use.

* ``dmacoll_spin``: one thread polls up to ``MAX_WAITS`` flag words in turn with ``ld.acquire.sys`` loads (no
  sleep), with ``cuStreamWaitValue32``'s tests (EQ, or GEQ as ``(int)(word - value) >= 0``), and re-arms each
  word to 0 in the reset mode (EQ). Launched as one block of one thread.
* ``dmacoll_put``: ``signal='kernel'``: one thread writes up to ``MAX_WAITS`` flag words (any ranks') behind a
  system fence, one launch for a group of consecutive signals.
* ``dmacoll_fold_<dtype>``: a reduction's sum (``plan.Reduce``: ``count`` slots plus ``own`` into ``out``)
  that waits for slot k's flag before adding slot k. Thread 0 of each block polls, then the block's barrier
  orders the slot's loads after the acquire. Half types add in float32 and round once, integers wrap, slots
  are added in slot order with ``own`` last: the same arithmetic as ``backends/reduce.py``. Blocks keep
  ``ITEMS`` elements per thread in registers; only a kernel of one block re-arms its words itself (with more,
  a block could re-arm a word another has not yet seen: the engine re-arms them after the kernel).

Flag word indices travel packed, 16 bits each, in two 64-bit arguments (no argument buffer to manage).
"""
from __future__ import annotations

import ctypes
import string
from typing import Callable, Optional, Sequence

from .cubins import compile_program

MAX_WAITS = 8         # flag words per launch (two 64-bit arguments of 16-bit indices)
THREADS = 256         # a fold kernel's block
ITEMS = 4             # elements per thread per tile
FOLD_MAX_BLOCKS = 32  # a fold kernel's grid at most (every block polls before its first tile)
FOLD_MAX_TILES = 8    # tiles per block at most: a larger sum waits in a spin kernel and runs the sum kernel

# dtype name -> (element type, accumulator, load to accumulator, store from accumulator)
FOLD_TYPES = {
    "float32": ("float", "float", "(x)", "(x)"),
    "float64": ("double", "double", "(x)", "(x)"),
    "float16": ("unsigned short", "float", "h2f(x)", "f2h(x)"),
    "bfloat16": ("unsigned short", "float", "bf2f(x)", "f2bf(x)"),
    "int32": ("int", "unsigned int", "((unsigned int)(x))", "((int)(x))"),
    "int64": ("long long", "unsigned long long", "((unsigned long long)(x))", "((long long)(x))"),
}

HELPERS = r"""
typedef unsigned long long u64;

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// cuStreamWaitValue32's tests: EQ, or GEQ as a wrapping comparison
__device__ __forceinline__ bool met(unsigned word, unsigned value, int geq) {
    return geq ? (int)(word - value) >= 0 : word == value;
}
__device__ __forceinline__ unsigned* flag_of(unsigned* flags, u64 lo, u64 hi, int k) {
    return flags + ((k < 4 ? lo >> (16 * k) : hi >> (16 * (k - 4))) & 0xffff);
}
__device__ __forceinline__ void await_flag(unsigned* f, unsigned value, int geq) {
    while (!met(load_acquire(f), value, geq)) { }
}
__device__ __forceinline__ float h2f(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(unsigned short x) { return __uint_as_float(((unsigned)x) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

"""

PRELUDE = HELPERS + r"""
extern "C" __global__ void dmacoll_spin(unsigned* flags, int n, u64 lo, u64 hi, unsigned value, int geq) {
    for (int k = 0; k < n; ++k) {
        unsigned* f = flag_of(flags, lo, hi, k);
        await_flag(f, value, geq);
        if (!geq) *(volatile unsigned*)f = 0u;
    }
}
// signal='kernel': up to MAX_WAITS flag words, each in any rank's heap, set to value by one thread behind a
// system fence (what the stream wrote before, the data copies included, is seen first)
extern "C" __global__ void dmacoll_put(int n, unsigned value, unsigned* a0, unsigned* a1, unsigned* a2,
                                       unsigned* a3, unsigned* a4, unsigned* a5, unsigned* a6, unsigned* a7) {
    unsigned* words[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    __threadfence_system();
    for (int k = 0; k < n; ++k)
        asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(words[k]), "r"(value) : "memory");
}
"""

FOLD = string.Template(r"""
extern "C" __global__ void dmacoll_fold_$NAME(const $T* __restrict__ slots, const $T* own, $T* out, long long n,
                                              int count, unsigned* flags, u64 lo, u64 hi, unsigned value, int geq,
                                              int reset) {
    const long long tile = (long long)blockDim.x * $ITEMS;
    bool first = true;
    for (long long base = blockIdx.x * tile; base < n; base += (long long)gridDim.x * tile) {
        $ACC acc[$ITEMS];
        for (int k = 0; k < count; ++k) {
            if (first) {  // this block's first tile: slot k must have arrived
                if (threadIdx.x == 0) await_flag(flag_of(flags, lo, hi, k), value, geq);
                __syncthreads();
            }
            const $T* slot = slots + (long long)k * n;
            for (int i = 0; i < $ITEMS; ++i) {
                long long j = base + (long long)i * blockDim.x + threadIdx.x;
                if (j < n) { $T x = slot[j]; $ACC v = $LOAD; acc[i] = k == 0 ? v : acc[i] + v; }
            }
        }
        first = false;
        for (int i = 0; i < $ITEMS; ++i) {
            long long j = base + (long long)i * blockDim.x + threadIdx.x;
            if (j < n) {
                $ACC r = acc[i];
                if (own) { $T x = own[j]; r = r + $LOAD; }
                $ACC x = r;
                out[j] = $STORE;
            }
        }
    }
    if (reset) {
        __syncthreads();
        if (threadIdx.x == 0) for (int k = 0; k < count; ++k) *(volatile unsigned*)flag_of(flags, lo, hi, k) = 0u;
    }
}
""")


# A reduction's local sum without waits (the DONE waits are queued before it): out = slots[0] + ... + own, in the
# accumulator type, rounded once. Where every address and the slot length are whole 16-byte vectors (``vec``), a
# thread loads one vector of each slot per step; else one element. A grid-stride loop over a grid sized to the
# GPU: the sum of a large reduce_scatter runs at memory bandwidth (torch's sum and add wrote a float32 partial).
SUM = string.Template(r"""
extern "C" __global__ void dmacoll_sum_$NAME(const $T* __restrict__ slots, const $T* own, $T* out, long long n,
                                             int count, int vec) {
    const int V = 16 / sizeof($T);
    union Vec { uint4 u; $T e[16 / sizeof($T)]; };
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (long long v = first; v < n / V; v += step) {
            $ACC acc[16 / sizeof($T)];
            for (int k = 0; k < count; ++k) {
                Vec s; s.u = ((const uint4*)(slots + (long long)k * n))[v];
                for (int i = 0; i < V; ++i) { $T x = s.e[i]; $ACC a = $LOAD; acc[i] = k == 0 ? a : acc[i] + a; }
            }
            if (own) {
                Vec s; s.u = ((const uint4*)own)[v];
                for (int i = 0; i < V; ++i) { $T x = s.e[i]; acc[i] = acc[i] + $LOAD; }
            }
            Vec r;
            for (int i = 0; i < V; ++i) { $ACC x = acc[i]; r.e[i] = $STORE; }
            ((uint4*)out)[v] = r.u;
        }
        return;
    }
    for (long long j = first; j < n; j += step) {
        $ACC acc;
        for (int k = 0; k < count; ++k) { $T x = slots[(long long)k * n + j]; $ACC a = $LOAD; acc = k == 0 ? a : acc + a; }
        if (own) { $T x = own[j]; acc = acc + $LOAD; }
        $ACC x = acc;
        out[j] = $STORE;
    }
}
""")
SUM_THREADS = 256
SUM_MAX_BLOCKS = 2048  # enough resident warps to keep HBM busy on any current GPU; more only adds loop overhead


def source() -> str:
    """The whole program: the spin and put kernels, and a fold and a sum kernel per dtype of ``FOLD_TYPES``."""
    return PRELUDE + "".join(FOLD.substitute(NAME=name, T=t, ACC=acc, LOAD=load, STORE=store, ITEMS=ITEMS) +
                             SUM.substitute(NAME=name, T=t, ACC=acc, LOAD=load, STORE=store)
                             for name, (t, acc, load, store) in FOLD_TYPES.items())


def sum_launch(numel: int, itemsize: int, addresses: Sequence[int]) -> tuple[int, bool]:
    """(blocks, vectorized) of a sum kernel over ``numel`` elements of ``itemsize`` bytes whose slots, own and out
    start at ``addresses``: 16-byte vectors where every address and the slot length are whole vectors."""
    vec = (numel * itemsize) % 16 == 0 and all(a % 16 == 0 for a in addresses)
    work = numel * itemsize // 16 if vec else numel
    return max(1, min(SUM_MAX_BLOCKS, -(-work // SUM_THREADS))), vec


def pack(indices: Sequence[int]) -> tuple[int, int]:
    """Up to MAX_WAITS word indices as the kernels' (lo, hi) arguments."""
    if len(indices) > MAX_WAITS or any(not 0 <= i < 1 << 16 for i in indices):
        raise ValueError(f"at most {MAX_WAITS} flag words below 65536 per launch, got {list(indices)}")
    words = [0, 0]
    for k, index in enumerate(indices):
        words[k // 4] |= index << (16 * (k % 4))
    return words[0], words[1]


def folds(numel: int) -> bool:
    """Whether a fold kernel sums ``numel`` elements (else a spin wait and the full-grid sum kernel): at most
    ``FOLD_MAX_TILES`` tiles per block, since its few blocks sum a large block far slower than the sum kernel (on 4x
    H200 a pushed reduce_scatter with wait='fold' took 2.5-7.0x NCCL's from 8 MB, with wait='memop' 1.2-2.2x:
    results/h200x4/operator/reductions_torch_sum/, eager)."""
    return numel <= FOLD_MAX_BLOCKS * FOLD_MAX_TILES * THREADS * ITEMS


def fold_grid(numel: int) -> int:
    """Blocks of a fold kernel for ``numel`` elements: a tile each, at most FOLD_MAX_BLOCKS."""
    return max(1, min(FOLD_MAX_BLOCKS, -(-numel // (THREADS * ITEMS))))


class Kernels:
    """The loaded functions, and launches of them on a stream (arguments as the kernels declare them)."""

    def __init__(self, drv, check: Callable[[tuple, str], tuple], arch: str):
        self._drv, self._check = drv, check
        module = check(drv.cuModuleLoadData(compile_program(source(), "dmacoll_kernels.cu", arch)),
                       "cuModuleLoadData")[0]
        self.spin_fn = check(drv.cuModuleGetFunction(module, b"dmacoll_spin"), "cuModuleGetFunction")[0]
        self.put_fn = check(drv.cuModuleGetFunction(module, b"dmacoll_put"), "cuModuleGetFunction")[0]
        self.fold_fns, self.sum_fns = (
            {dtype: check(drv.cuModuleGetFunction(module, f"dmacoll_{kind}_{dtype}".encode()), "cuModuleGetFunction")[0]
             for dtype in FOLD_TYPES} for kind in ("fold", "sum"))

    def _launch(self, fn, grid: int, threads: int, stream: int, values: tuple, types: tuple, what: str) -> None:
        self._check(self._drv.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, stream, (values, types), 0), what)

    def spin(self, stream: int, flags: int, indices: Sequence[int], value: int, geq: bool) -> None:
        """Wait on ``stream`` until each word ``flags[i]`` meets ``value``; re-arm them unless ``geq``."""
        for at in range(0, len(indices), MAX_WAITS):
            part = indices[at: at + MAX_WAITS]
            self._launch(self.spin_fn, 1, 1, stream, (flags, len(part), *pack(part), value, int(geq)),
                         (ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_uint,
                          ctypes.c_int), "cuLaunchKernel (dmacoll_spin)")

    def put(self, stream: int, words: Sequence[int], value: int) -> None:
        """Set each flag word at ``words`` (addresses, any rank's) to ``value`` on ``stream``, after what is queued
        there: one launch per ``MAX_WAITS`` words."""
        for at in range(0, len(words), MAX_WAITS):
            part = list(words[at: at + MAX_WAITS])
            addresses = part + [0] * (MAX_WAITS - len(part))
            self._launch(self.put_fn, 1, 1, stream, (len(part), value, *addresses),
                         (ctypes.c_int, ctypes.c_uint, *(ctypes.c_void_p,) * MAX_WAITS), "cuLaunchKernel (dmacoll_put)")

    def fold(self, stream: int, dtype: str, slots: int, own: Optional[int], out: int, numel: int, count: int,
             flags: int, indices: Sequence[int], value: int, geq: bool) -> bool:
        """Launch the fold kernel; returns whether the kernel re-arms its words itself (a one-block grid)."""
        grid = fold_grid(numel)
        rearm = grid == 1 and not geq
        self._launch(self.fold_fns[dtype], grid, THREADS, stream,
                     (slots, own or 0, out, numel, count, flags, *pack(indices), value, int(geq), int(rearm)),
                     (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                      ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_int,
                      ctypes.c_int), f"cuLaunchKernel (dmacoll_fold_{dtype})")
        return rearm


    def sum(self, stream: int, dtype: str, itemsize: int, slots: int, own: Optional[int], out: int, numel: int,
            count: int) -> None:
        """out = the ``count`` slots of ``numel`` elements from ``slots`` plus ``own`` (0: none), on ``stream``."""
        blocks, vec = sum_launch(numel, itemsize, [slots, out] + ([own] if own else []))
        self._launch(self.sum_fns[dtype], blocks, SUM_THREADS, stream, (slots, own or 0, out, numel, count, int(vec)),
                     (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                      ctypes.c_int), f"cuLaunchKernel (dmacoll_sum_{dtype})")


_LOADED: dict[tuple, Kernels] = {}


def kernels(drv, check: Callable[[tuple, str], tuple], device_index: int, arch: str) -> Kernels:
    """The kernels for one device, compiled and loaded once per process."""
    key = (device_index, arch)
    if key not in _LOADED:
        _LOADED[key] = Kernels(drv, check, arch)
    return _LOADED[key]
