"""What a collective runs on the GPU: kernels (SMs) versus copies and memsets (copy engines).

The PyTorch profiler (CUPTI underneath) records every GPU activity of a few
calls; each activity is classed by the name CUPTI gives it ("Memcpy ...",
"Memset ..." or a kernel name). A copy-engine collective should show copies
and no kernels; NCCL shows its kernels.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

SM_COLUMNS = ["op", "impl", "variant", "direction", "place", "world", "rank", "bytes_per_rank", "mode", "calls",
              "kernels_per_call", "kernel_us_per_call", "copies_per_call", "copy_us_per_call", "memsets_per_call",
              "kernel_names"]


def classify(name: str) -> str:
    if name.startswith("Memcpy"):
        return "copy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def summarize(activities: Iterable[tuple[str, float]], calls: int) -> dict:
    """``activities``: (name, duration in us) of every GPU activity over ``calls`` calls."""
    count: Counter = Counter()
    time_us: Counter = Counter()
    kernels: Counter = Counter()
    for name, dur in activities:
        kind = classify(name)
        count[kind] += 1
        time_us[kind] += dur
        if kind == "kernel":
            kernels[name.split("(")[0][:60]] += 1
    return {"calls": calls, "kernels_per_call": count["kernel"] / calls,
            "kernel_us_per_call": time_us["kernel"] / calls, "copies_per_call": count["copy"] / calls,
            "copy_us_per_call": time_us["copy"] / calls, "memsets_per_call": count["memset"] / calls,
            "kernel_names": "; ".join(f"{k} x{v}" for k, v in kernels.most_common(5))}


def gpu_activities(fn, calls: int) -> list[tuple[str, float]]:
    """Profile ``calls`` calls of ``fn``; the GPU-side activities as (name, us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.name, e.time_range.elapsed_us()))
    return out


def run_sm_usage(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    from dmacoll.lab_api import capture
    from . import harness
    from .baselines import Baselines
    from .power import power_points
    from .sweep import Bound, point_fields

    sizes, calls = cfg["sizes"], cfg["calls"]
    rk = harness.Rank(rank, world, pool_bytes=max(sizes))
    baselines = Baselines(rk, max(sizes))
    rows = []
    for i, nbytes in enumerate(sizes):
        for op in cfg["ops"]:
            for pt in power_points(op, cfg["impls"]):
                b = Bound(rk, baselines, pt, nbytes, 31 * (i + 1))
                for mode in cfg["modes"]:
                    rk.barrier()
                    if mode == "graph":
                        graph = capture(b.run, calls, warmup=3)
                        acts = gpu_activities(graph.replay, 1)
                    else:
                        for _ in range(3):
                            b.run()
                        acts = gpu_activities(b.run, calls)
                    rows.append({**point_fields(pt), "world": world, "bytes_per_rank": nbytes, "mode": mode,
                                 "rank": rank, **summarize(acts, calls)})
                    if rank == 0:
                        r = rows[-1]
                        print(f"{op:14s} {pt.impl:5s} {pt.variant:5s} {nbytes:>10d} B {mode:5s}: "
                              f"{r['kernels_per_call']:.1f} kernels ({r['kernel_us_per_call']:.1f} us), "
                              f"{r['copies_per_call']:.1f} copies per call", flush=True)
    return rk.finish(rows)
