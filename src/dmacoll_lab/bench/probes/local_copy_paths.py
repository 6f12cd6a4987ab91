"""Which way of issuing a device-local copy keeps it off the SMs (so a concurrent GEMM does not delay it)?

``dmacoll probe copy_contention`` showed a 64 MB device-local cuMemcpyAsync waiting for a whole concurrent GEMM
(70 us alone, ~1.5 ms next to it). This times the same copy issued in several ways, each alone and next to
three bf16 8192^3 GEMMs on another stream, medians of 7, one GPU:

* ``cuMemcpyAsync``, ``cuMemcpyDtoDAsync``, ``cuMemcpyPeerAsync`` (same context on both sides), ``cuMemcpy2DAsync``
  (64 KiB rows), ``cuMemcpyBatchAsync`` with ``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE``, a memcpy node of a
  captured CUDA graph, a copy into a CUDA VMM mapping (``cuMemCreate``, as symmetric memory is), and a bounce
  through pinned host memory (device -> host -> device, two copies that must use copy engines);
* ``order``: ``alone``; ``together`` (GEMMs and copy queued, then released at once by one GPU sleep, as
  ``dmacoll c3`` releases a compute and a collective); ``gemm_running`` (the copy issued 100 us after the
  release, while the first GEMM runs, as every call after the first of a back-to-back series is);
  ``gemm_running_high`` (the same from a stream of the device's greatest priority).

Columns: ``copy_us`` copy issue -> copy end; ``gemm_us`` release -> GEMMs' end (empty alone; the GEMMs alone
are in the sidecar's config, ``gemm_alone_us``).

Usage: dmacoll probe local_copy_paths [--bytes 64M] [--repeats 7] [--ways ...] [--orders ...] [--out CSV]
"""
from __future__ import annotations

import argparse
import statistics

from .common import Table, add_repeats, driver, idle_gpu_us, next_to_gemms, size_multiple_of

NAME = "local_copy_paths"
HELP = "a device-local copy issued several ways (driver calls, graph, VMM, host bounce) next to GEMMs (1 GPU)"
GPUS = 1
COLUMNS = ["way", "order", "copy_us", "gemm_us", "correct"]
EXTRA: dict[str, list[str]] = {}
ORDERS = ("alone", "together", "gemm_running", "gemm_running_high")
WAYS = ("cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemcpyPeerAsync_same_ctx", "cuMemcpy2DAsync", "batch_prefer_overlap",
        "graph_memcpy_node", "to_vmm_mapping", "host_bounce")
ROW = 64 << 10  # cuMemcpy2DAsync's row: the copy is bytes / ROW rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bytes", type=size_multiple_of(ROW), default=64 << 20,
                   help=f"bytes per copy (a multiple of {ROW >> 10}K, the 2D copy's row; default 64M)")
    add_repeats(p, 7)
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="ways to issue the copy (default: all)")
    p.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS),
                   help="alone, or how it meets the GEMMs (default: all)")


def path_row(way: str, order: str, timed: list[tuple[float, float]], correct: bool) -> dict:
    """One (way, order) from its (copy_us, gemm_us) samples: medians."""
    return {"way": way, "order": order, "copy_us": statistics.median(t[0] for t in timed),
            "gemm_us": statistics.median(t[1] for t in timed), "correct": correct}


def _ok(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")


def vmm_buffer(nbytes: int, device: int):
    """A device buffer mapped with CUDA VMM (cuMemCreate + cuMemMap), returned as (address, release)."""
    drv = driver()

    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    err, gran = drv.cuMemGetAllocationGranularity(
        prop, drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    _ok(err)
    size = -(-nbytes // gran) * gran
    err, handle = drv.cuMemCreate(size, prop, 0)
    _ok(err)
    err, va = drv.cuMemAddressReserve(size, gran, 0, 0)
    _ok(err)
    _ok(drv.cuMemMap(va, size, 0, handle, 0))
    access = drv.CUmemAccessDesc()
    access.location = prop.location
    access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _ok(drv.cuMemSetAccess(va, size, [access], 1))

    def release():
        _ok(drv.cuMemUnmap(va, size))
        _ok(drv.cuMemAddressFree(va, size))
        _ok(drv.cuMemRelease(handle))
    return int(va), release


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from dmacoll.lab_api import graph_capture

    from ..c3 import greatest_priority_stream
    from ..harness import sleep_cycles_per_us

    drv = driver()
    n = args.bytes
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    vmm, release_vmm = vmm_buffer(n, 0)
    a = torch.randn(8192, 8192, device=0, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    comp, normal, high = torch.cuda.Stream(), torch.cuda.Stream(), greatest_priority_stream(0)
    _ok(drv.cuCtxGetCurrent())
    ctx = drv.cuCtxGetCurrent()[1]
    attrs = drv.CUmemcpyAttributes()
    attrs.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attrs.flags = drv.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    d, s = dst.data_ptr(), src.data_ptr()

    def copy2d(stream):
        p = drv.CUDA_MEMCPY2D()
        p.srcMemoryType = p.dstMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice, p.dstDevice = s, d
        p.srcPitch = p.dstPitch = p.WidthInBytes = ROW
        p.Height = n // ROW
        _ok(drv.cuMemcpy2DAsync(p, stream.cuda_stream))

    def bounce(stream):
        _ok(drv.cuMemcpyAsync(host.data_ptr(), s, n, stream.cuda_stream))
        _ok(drv.cuMemcpyAsync(d, host.data_ptr(), n, stream.cuda_stream))

    def replay_on(graph, stream):
        with torch.cuda.stream(stream):  # replay() launches on the current stream
            graph.replay()

    graphs = {}
    for name, stream in (("normal", normal), ("high", high)):
        g = torch.cuda.CUDAGraph()
        with graph_capture(g, stream):
            dst.copy_(src)
        graphs[name] = g
    ways = {  # WAYS, each a function of the stream it issues on
        "cuMemcpyAsync": lambda st: _ok(drv.cuMemcpyAsync(d, s, n, st.cuda_stream)),
        "cuMemcpyDtoDAsync": lambda st: _ok(drv.cuMemcpyDtoDAsync(d, s, n, st.cuda_stream)),
        "cuMemcpyPeerAsync_same_ctx": lambda st: _ok(drv.cuMemcpyPeerAsync(d, ctx, s, ctx, n, st.cuda_stream)),
        "cuMemcpy2DAsync": copy2d,
        "batch_prefer_overlap": lambda st: _ok(drv.cuMemcpyBatchAsync(
            [drv.CUdeviceptr(d)], [drv.CUdeviceptr(s)], [n], 1, [attrs], [0], 1, st.cuda_stream)),
        "graph_memcpy_node": lambda st: replay_on(graphs["high" if st is high else "normal"], st),
        "to_vmm_mapping": lambda st: _ok(drv.cuMemcpyAsync(vmm, s, n, st.cuda_stream)),
        "host_bounce": bounce,
    }
    cycles = sleep_cycles_per_us()
    hold, delay = int(200 * cycles), int(100 * cycles)

    def gemms() -> None:
        for _ in range(3):
            torch.mm(a, a, out=c)

    def time_one(issue, order: str) -> tuple[float, float]:
        """(copy issue -> copy end, release -> GEMMs' end) in us; gemm_running: the copy arrives while the first
        GEMM holds the SMs."""
        copy_stream = high if order.endswith("_high") else normal
        return next_to_gemms(lambda: issue(copy_stream), copy_stream, None if order == "alone" else gemms, comp,
                             hold, delay if order.startswith("gemm_running") else 0)

    gemm_alone_us = statistics.median(idle_gpu_us(gemms, comp, args.repeats, warmup=1))
    print(f"three GEMMs alone: {gemm_alone_us:.1f} us", flush=True)
    rows = []
    for name in args.ways:
        issue = ways[name]
        for order in args.orders:
            timed = [time_one(issue, order) for _ in range(args.repeats)]
            if name == "to_vmm_mapping":  # read the mapping back into dst
                _ok(drv.cuMemcpy(d, vmm, n))
            correct = bool(torch.equal(dst, src))
            dst.zero_()
            _ok(drv.cuMemsetD8(vmm, 0, n))
            row = path_row(name, order, timed, correct)
            rows.append(row)
            print(f"{name:28s} {order:10s}: copy {row['copy_us']:8.1f} us  gemms {row['gemm_us']:8.1f} us "
                  f"{'ok' if correct else 'WRONG'}", flush=True)
    release_vmm()
    config = {"bytes": n, "row_bytes_2d": ROW, "gemm": "3x bf16 8192^3", "repeats": args.repeats,
              "gemm_alone_us": round(gemm_alone_us, 1)}
    return {NAME: Table(rows, config)}
