"""Which cuMemcpyBatchAsync calls does the driver accept, and what does batching save?

Issue 3 asks why cuMemcpyBatchAsync returned CUDA_ERROR_INVALID_VALUE for peer memory mapped
with CUDA VMM (torch symmetric memory). Two ranks (one GPU each) try every combination of
  stream      legacy default stream (handle 0) / a created stream
  memory      local cudaMalloc (torch) -> peer VMM heap, local VMM heap -> peer VMM heap, peer -> local (pull)
  attributes  srcAccessOrder unset (0) / STREAM / ANY, location hints none / device, flags 0 / prefer-overlap
  capture     eager / inside CUDA stream capture
and record the CUresult and whether the bytes arrived. Then, on a created stream with an accepted
attribute set, the host time to submit k copies as k cuMemcpyAsync calls vs one batch call.

Usage (2 GPUs): dmacoll probe memcpy_batch [--bytes 1M] [--repeats 200] [--out CSV]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

from .common import Table, add_repeats, driver, size_multiple_of

NAME = "memcpy_batch"
HELP = "which cuMemcpyBatchAsync calls the driver accepts (VMM peer memory, capture), and what batching saves (2 GPUs)"
GPUS = 2
COLUMNS = ["rank", "stream", "memory", "src_access_order", "loc_hint", "flags", "mode", "result", "data_arrived",
           "host_us_median"]
EXTRA: dict[str, list[str]] = {}
KS = (1, 2, 4, 8)  # copies per submission; each moves bytes / 8
DEADLINE_S = 300


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bytes", type=size_multiple_of(max(KS)), default=1 << 20,
                   help="bytes per copy of the acceptance cases (a multiple of 8; default 1M)")
    add_repeats(p, 200, "host-time samples per submission way and k (their median is reported)")


def case_row(rank: int, stream: str, memory: str, order: str, hint: str, flags: int, mode: str, result,
             arrived: bool) -> dict:
    """One acceptance case: the CUresult (or the exception) and whether the bytes arrived."""
    return {"rank": rank, "stream": stream, "memory": memory, "src_access_order": order, "loc_hint": hint,
            "flags": flags, "mode": mode, "result": str(result), "data_arrived": arrived, "host_us_median": ""}


def submit_row(rank: int, how: str, k: int, result, samples_us: list[float]) -> dict:
    """Host time to submit k copies as k cuMemcpyAsync calls (``loop``) or one batch call (``batch``)."""
    return {"rank": rank, "stream": "created", "memory": "vmm_to_peer_vmm", "src_access_order": "stream",
            "loc_hint": "none", "flags": 0, "mode": f"submit_{how}_k{k}", "result": str(result),
            "data_arrived": "", "host_us_median": statistics.median(samples_us)}


def summary(rows: list[dict]) -> list[str]:
    """What the log shows: accepted cases, the results per (stream, order, mode), rank 0's submission times."""
    ok = [r for r in rows if r["result"].endswith("CUDA_SUCCESS") and r["data_arrived"] is True]
    lines = [f"{len(rows)} rows, {len(ok)} accepted with the data delivered"]
    by_case: dict = {}
    for r in rows:
        if not r["mode"].startswith("submit"):
            key = (r["stream"], r["src_access_order"], r["mode"])
            by_case.setdefault(key, set()).add(r["result"].split(".")[-1][:40])
    lines += [f"{key} {sorted(results)}" for key, results in sorted(by_case.items())]
    lines += [f"{r['mode']} {r['result'].split('.')[-1]} {r['host_us_median']:.2f} us" for r in rows
              if r["mode"].startswith("submit") and r["rank"] == 0]
    return lines


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

    from dmacoll.lab_api import Communicator, graph_capture

    drv = driver()
    peer = 1 - rank
    n = cfg["bytes"]
    # the default 64 MB heap unless the copies need more
    comm = Communicator(backend="cuda", heap_bytes=max(64 << 20, 3 * n + (1 << 20)))
    eng = comm.engine
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
                    with graph_capture(graph, created):
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
        rows.append(case_row(rank, sname, mem, order, hint, flags, mode, err, arrived))
    # submission cost: k copies (to the peer) as k calls vs one batch call, on the created stream (the host clock
    # around each submission: its host cost, not the device time the timing loop measures)
    attrs = _attrs(drv, "stream", "none", 0, rank, peer)
    chunk = n // max(KS)
    for k in KS:
        dsts = [eng.ptrs[peer] + off_out + rank * n + j * chunk for j in range(k)]
        srcs = [eng.ptrs[rank] + off_in + j * chunk for j in range(k)]
        for how in ("loop", "batch"):
            samples = []
            for _ in range(cfg["repeats"]):
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
            rows.append(submit_row(rank, how, k, err, samples))
    dist.barrier()
    comm.close()
    return rows


def run(args: argparse.Namespace) -> dict[str, Table]:
    from ...verify.launch import run_ranks

    driver()  # here, not only on the ranks: a missing cuda-bindings is one line
    cfg = {"bytes": args.bytes, "repeats": args.repeats}
    per_rank = run_ranks(probe_rank, 2, cfg, device="cuda", timeout_s=DEADLINE_S)
    rows = [r for rows in per_rank for r in rows]
    for line in summary(rows):
        print(line, flush=True)
    return {NAME: Table(rows, {"probe": "cuMemcpyBatchAsync", "bytes": args.bytes, "repeats": args.repeats})}
