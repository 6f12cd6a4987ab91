"""Which way of issuing a device-local copy keeps it off the SMs (so a concurrent GEMM does not delay it)?

tools/probe_copy_contention.py showed a 64 MB device-local cuMemcpyAsync waiting for a whole concurrent GEMM
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

Usage: python3 tools/probe_local_copy_paths.py OUT.csv
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

N = 64 << 20
ORDERS = ("alone", "together", "gemm_running", "gemm_running_high")
ROW = 64 << 10


def _ok(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")


def vmm_buffer(nbytes: int, device: int):
    """A device buffer mapped with CUDA VMM (cuMemCreate + cuMemMap), returned as (address, release)."""
    from cuda.bindings import driver as drv

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


def main() -> int:
    import torch
    from cuda.bindings import driver as drv

    from dmacoll.bench import provenance
    from dmacoll.bench.c3 import greatest_priority_stream, sleep_cycles_per_us

    src = torch.randint(0, 255, (N,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    host = torch.empty(N, dtype=torch.uint8, pin_memory=True)
    vmm, release_vmm = vmm_buffer(N, 0)
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
        p.Height = N // ROW
        _ok(drv.cuMemcpy2DAsync(p, stream.cuda_stream))

    def bounce(stream):
        _ok(drv.cuMemcpyAsync(host.data_ptr(), s, N, stream.cuda_stream))
        _ok(drv.cuMemcpyAsync(d, host.data_ptr(), N, stream.cuda_stream))

    def replay_on(graph, stream):
        with torch.cuda.stream(stream):  # replay() launches on the current stream
            graph.replay()

    graphs = {}
    for name, stream in (("normal", normal), ("high", high)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            dst.copy_(src)
        graphs[name] = g
    ways = {
        "cuMemcpyAsync": lambda st: _ok(drv.cuMemcpyAsync(d, s, N, st.cuda_stream)),
        "cuMemcpyDtoDAsync": lambda st: _ok(drv.cuMemcpyDtoDAsync(d, s, N, st.cuda_stream)),
        "cuMemcpyPeerAsync_same_ctx": lambda st: _ok(drv.cuMemcpyPeerAsync(d, ctx, s, ctx, N, st.cuda_stream)),
        "cuMemcpy2DAsync": copy2d,
        "batch_prefer_overlap": lambda st: _ok(drv.cuMemcpyBatchAsync(
            [drv.CUdeviceptr(d)], [drv.CUdeviceptr(s)], [N], 1, [attrs], [0], 1, st.cuda_stream)),
        "graph_memcpy_node": lambda st: replay_on(graphs["high" if st is high else "normal"], st),
        "to_vmm_mapping": lambda st: _ok(drv.cuMemcpyAsync(vmm, s, N, st.cuda_stream)),
        "host_bounce": bounce,
    }
    cycles = sleep_cycles_per_us()
    hold, delay = int(200 * cycles), int(100 * cycles)

    def time_one(issue, order: str) -> tuple[float, float]:
        """(copy issue -> copy end, release -> GEMMs' end) in us."""
        copy_stream = high if order.endswith("_high") else normal
        torch.cuda.synchronize()
        release, copy_start, copy_end, gemm_end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        # Both streams sleep from the same instant (one block each on an idle GPU), so both sides are queued
        # before either starts; no cross-stream wait, which would need an SM while the GEMM holds them all.
        with torch.cuda.stream(comp):
            torch.cuda._sleep(hold)
        release.record(comp)
        if order != "alone":
            with torch.cuda.stream(comp):
                for _ in range(3):
                    torch.mm(a, a, out=c)
            gemm_end.record(comp)
        with torch.cuda.stream(copy_stream):  # gemm_running: the first GEMM holds the SMs when the copy comes
            torch.cuda._sleep(hold + (delay if order.startswith("gemm_running") else 0))
        copy_start.record(copy_stream)
        issue(copy_stream)
        copy_end.record(copy_stream)
        torch.cuda.synchronize()
        gemm = release.elapsed_time(gemm_end) * 1e3 if order != "alone" else float("nan")
        return copy_start.elapsed_time(copy_end) * 1e3, gemm

    def gemms_alone() -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(comp)
        with torch.cuda.stream(comp):
            for _ in range(3):
                torch.mm(a, a, out=c)
        end.record(comp)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    gemms_alone()  # warm-up
    gemm_alone_us = statistics.median(gemms_alone() for _ in range(7))
    print(f"three GEMMs alone: {gemm_alone_us:.1f} us", flush=True)
    rows = []
    for name, issue in ways.items():
        for order in ORDERS:
            timed = [time_one(issue, order) for _ in range(7)]
            if name == "to_vmm_mapping":  # read the mapping back into dst
                _ok(drv.cuMemcpy(d, vmm, N))
            correct = bool(torch.equal(dst, src))
            dst.zero_()
            _ok(drv.cuMemsetD8(vmm, 0, N))
            row = {"way": name, "order": order, "copy_us": statistics.median(t[0] for t in timed),
                   "gemm_us": statistics.median(t[1] for t in timed), "correct": correct}
            rows.append(row)
            print(f"{name:28s} {order:10s}: copy {row['copy_us']:8.1f} us  gemms {row['gemm_us']:8.1f} us "
                  f"{'ok' if correct else 'WRONG'}", flush=True)
    release_vmm()
    provenance.write_table(Path(sys.argv[1]), rows, ["way", "order", "copy_us", "gemm_us", "correct"],
                           {"bytes": N, "row_bytes_2d": ROW, "gemm": "3x bf16 8192^3", "repeats": 7,
                            "gemm_alone_us": round(gemm_alone_us, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
