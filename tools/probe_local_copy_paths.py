"""Which way of issuing a device-local copy keeps it off the SMs (so a concurrent GEMM does not delay it)?

tools/probe_copy_contention.py showed a 64 MB device-local cuMemcpyAsync waiting for a whole concurrent GEMM
(70 us alone, ~1.5 ms next to it). This times the same copy issued as (a) cuMemcpyAsync, (b) cuMemcpyBatchAsync
with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE, (c) a memcpy node of a captured CUDA graph, alone and next to
three bf16 8192^3 GEMMs on another stream; medians of 7, GPU 0.

Usage: python3 tools/probe_local_copy_paths.py OUT.csv
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> int:
    import torch
    from cuda.bindings import driver as drv

    from dmacoll.bench import provenance

    n = 64 << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, device=0, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    comp, comm = torch.cuda.Stream(), torch.cuda.Stream()
    attrs = drv.CUmemcpyAttributes()
    attrs.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attrs.flags = drv.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE

    def plain():
        assert int(drv.cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), n, comm.cuda_stream)[0]) == 0

    def batch():
        err = drv.cuMemcpyBatchAsync([drv.CUdeviceptr(dst.data_ptr())], [drv.CUdeviceptr(src.data_ptr())], [n], 1,
                                     [attrs], [0], 1, comm.cuda_stream)[0]
        assert int(err) == 0, err

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=comm):
        dst.copy_(src)
    ways = {"cuMemcpyAsync": plain, "batch_prefer_overlap": batch, "graph_memcpy_node": graph.replay}
    rows = []
    for _ in range(3):
        torch.mm(a, a, out=c)
    for name, issue in ways.items():
        for together in (False, True):
            times = []
            for _ in range(7):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(comm)
                comp.wait_stream(comm)
                if together:
                    with torch.cuda.stream(comp):
                        for _ in range(3):
                            torch.mm(a, a, out=c)
                with torch.cuda.stream(comm):
                    issue()
                end.record(comm)
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            dst_ok = bool(torch.equal(dst, src))
            dst.zero_()
            rows.append({"way": name, "next_to_gemm": together, "time_us": statistics.median(times), "correct": dst_ok})
            print(f"{name:22s} {'with GEMM' if together else 'alone    '}: {rows[-1]['time_us']:9.1f} us "
                  f"{'ok' if dst_ok else 'WRONG'}", flush=True)
    out = Path(sys.argv[1])
    provenance.write_table(out, rows, ["way", "next_to_gemm", "time_us", "correct"], {"bytes": n})
    return 0


if __name__ == "__main__":
    sys.exit(main())
