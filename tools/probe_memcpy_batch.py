"""Which cuMemcpyBatchAsync calls does the driver accept, and what does batching save?

Issue 3 asks why cuMemcpyBatchAsync returned CUDA_ERROR_INVALID_VALUE for peer memory mapped
with CUDA VMM (torch symmetric memory). Two ranks (one GPU each) try every combination of
  stream      legacy default stream (handle 0) / a created stream
  memory      local cudaMalloc (torch) -> peer VMM heap, local VMM heap -> peer VMM heap, peer -> local (pull)
  attributes  srcAccessOrder unset (0) / STREAM / ANY, location hints none / device, flags 0 / prefer-overlap
  capture     eager / inside CUDA stream capture
and record the CUresult and whether the bytes arrived. Then, on a created stream with an accepted
attribute set, the host time to submit k copies as k cuMemcpyAsync calls vs one batch call.

Usage (2 GPUs): python3 tools/probe_memcpy_batch.py OUT.csv
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _batch(drv, dsts, srcs, sizes, attrs, stream):
    """cuMemcpyBatchAsync with one attribute set for all copies; CUDA 12.8/12.9 bindings also
    return a failure index (CUDA 13 dropped it)."""
    ptr = drv.CUdeviceptr
    out = drv.cuMemcpyBatchAsync([ptr(d) for d in dsts], [ptr(s) for s in srcs], sizes, len(dsts), [attrs], [0], 1,
                                 stream)
    return out[0]


def _attrs(drv, order: str, hint: str, flags: int, src_dev: int, dst_dev: int):
    a = drv.CUmemcpyAttributes()
    orders = {"unset": 0, "stream": drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
              "any": drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_ANY}
    a.srcAccessOrder = orders[order]
    if hint == "device":
        for loc, dev in ((a.srcLocHint, src_dev), (a.dstLocHint, dst_dev)):
            loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            loc.id = dev
    a.flags = flags
    return a


def probe_rank(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch
    import torch.distributed as dist
    from cuda.bindings import driver as drv

    from dmacoll.communicator import Communicator

    peer = 1 - rank
    comm = Communicator(backend="cuda")
    eng = comm.engine
    n = 1 << 20
    heap_in = comm.empty(n, dtype=torch.uint8)  # VMM (symmetric) memory, mapped by the peer too
    heap_out = comm.empty(2 * n, dtype=torch.uint8)
    plain = torch.empty(n, dtype=torch.uint8, device=eng.device)  # cudaMalloc (caching allocator)
    off_in, off_out = eng.sym_offset(heap_in), eng.sym_offset(heap_out)
    created = torch.cuda.Stream(eng.device)
    streams = {"legacy_default": 0, "created": created.cuda_stream}
    memories = {  # (dst, src) device addresses; what the dst slot must read afterwards
        "plain_to_peer_vmm": (eng.ptrs[peer] + off_out + rank * n, plain.data_ptr()),
        "vmm_to_peer_vmm": (eng.ptrs[peer] + off_out + rank * n, eng.ptrs[rank] + off_in),
        "peer_vmm_to_local_vmm": (eng.ptrs[rank] + off_out + peer * n, eng.ptrs[peer] + off_in),
    }
    rows = []
    cases = itertools.product(streams, memories, ("unset", "stream", "any"), ("none", "device"), (0, 1),
                              ("eager", "capture"))
    for i, (sname, mem, order, hint, flags, mode) in enumerate(cases):
        value = (i % 250) + 1
        plain.fill_(value)
        heap_in.fill_(value)
        heap_out.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        dst, src = memories[mem]
        src_dev = peer if mem.startswith("peer") else rank
        dst_dev = peer if mem.endswith("peer_vmm") else rank
        attrs = _attrs(drv, order, hint, flags, src_dev, dst_dev)
        stream = streams[sname]
        err = None
        try:
            if mode == "capture":
                if sname == "legacy_default":
                    err = "skipped: the legacy stream cannot be captured"
                else:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=created):
                        err = _batch(drv, [dst], [src], [n], attrs, created.cuda_stream)
                    if err == drv.CUresult.CUDA_SUCCESS:
                        graph.replay()
            else:
                err = _batch(drv, [dst], [src], [n], attrs, stream)
            torch.cuda.synchronize()
        except Exception as e:  # a capture the driver invalidates, etc.: record it
            err = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
        dist.barrier()  # the peer's writes into our heap are done
        # push cases: the peer's call of the same case wrote our slot; pull: our own call did
        arrived = bool((heap_out[peer * n:(peer + 1) * n] == value).all().item())
        rows.append({"rank": rank, "stream": sname, "memory": mem, "src_access_order": order, "loc_hint": hint,
                     "flags": flags, "mode": mode, "result": str(err), "data_arrived": arrived, "host_us_median": ""})
    # submission cost: k copies (to the peer) as k calls vs one batch call, on the created stream
    attrs = _attrs(drv, "stream", "none", 0, rank, peer)
    chunk = n // 8
    for k in (1, 2, 4, 8):
        dsts = [eng.ptrs[peer] + off_out + rank * n + j * chunk for j in range(k)]
        srcs = [eng.ptrs[rank] + off_in + j * chunk for j in range(k)]
        for how in ("loop", "batch"):
            samples = []
            for _ in range(200):
                t0 = time.perf_counter()
                if how == "loop":
                    for d, s in zip(dsts, srcs):
                        drv.cuMemcpyAsync(d, s, chunk, created.cuda_stream)
                    err = drv.CUresult.CUDA_SUCCESS
                else:
                    err = _batch(drv, dsts, srcs, [chunk] * k, attrs, created.cuda_stream)
                samples.append((time.perf_counter() - t0) * 1e6)
                if len(samples) % 50 == 0:
                    created.synchronize()
            created.synchronize()
            rows.append({"rank": rank, "stream": "created", "memory": "vmm_to_peer_vmm", "src_access_order": "stream",
                         "loc_hint": "none", "flags": 0, "mode": f"submit_{how}_k{k}", "result": str(err),
                         "data_arrived": "", "host_us_median": statistics.median(samples)})
    dist.barrier()
    comm.close()
    return rows


def main() -> int:
    from dmacoll.bench import provenance
    from dmacoll.verify.launch import run_ranks

    out = Path(sys.argv[1])
    per_rank = run_ranks(probe_rank, 2, {}, device="cuda", timeout_s=300)
    rows = [r for rows in per_rank for r in rows]
    columns = ["rank", "stream", "memory", "src_access_order", "loc_hint", "flags", "mode", "result", "data_arrived",
               "host_us_median"]
    provenance.write_table(out, rows, columns, {"probe": "cuMemcpyBatchAsync", "bytes": 1 << 20})
    ok = [r for r in rows if r["result"].endswith("CUDA_SUCCESS") and r["data_arrived"] is True]
    print(f"{len(rows)} rows, {len(ok)} accepted with the data delivered; wrote {out}")
    summary: dict = {}
    for r in rows:
        if not r["mode"].startswith("submit"):
            key = (r["stream"], r["src_access_order"], r["mode"])
            summary.setdefault(key, set()).add(r["result"].split(".")[-1][:40])
    for key, results in sorted(summary.items()):
        print(key, sorted(results))
    for r in rows:
        if r["mode"].startswith("submit") and r["rank"] == 0:
            print(r["mode"], r["result"].split(".")[-1], f"{r['host_us_median']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
