"""Computation next to communication: slowdowns and the C3 speedup metrics.

Definitions (ConCCL), all times medians of repeats, measured in one run:

* serial = T_comp + T_comm (each measured alone);
* ideal speedup = serial / max(T_comp, T_comm);
* realized speedup = serial / T_c3, with T_c3 the time of both launched together;
* fraction of ideal = (serial - T_c3) / (serial - max(T_comp, T_comm));
* slowdown of one side = its time next to the other / its time alone.
"""
from __future__ import annotations

import statistics
from typing import Callable, Optional

INTERFERENCE_COLUMNS = ["compute", "impl", "variant", "direction", "place", "world", "rank", "bytes_per_rank",
                        "comm_calls", "t_comp_us", "t_comm_us", "t_comp_together_us", "t_comm_together_us",
                        "t_c3_us", "comp_slowdown", "comm_slowdown", "ideal_speedup", "realized_speedup",
                        "fraction_of_ideal", "correct"]


def c3_metrics(t_comp: float, t_comm: float, t_c3: float) -> dict:
    serial, longest = t_comp + t_comm, max(t_comp, t_comm)
    return {"ideal_speedup": serial / longest, "realized_speedup": serial / t_c3,
            "fraction_of_ideal": (serial - t_c3) / (serial - longest) if serial > longest else float("nan")}


def _elapsed_us(start, end) -> float:
    return start.elapsed_time(end) * 1e3


def time_alone(fn: Callable[[], None], stream, repeats: int, barrier: Callable[[], None]) -> float:
    import torch

    samples = []
    for _ in range(repeats):
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        with torch.cuda.stream(stream):
            fn()
        end.record(stream)
        end.synchronize()
        samples.append(_elapsed_us(start, end))
    return statistics.median(samples)


def time_together(comp: Callable[[], None], comp_stream, comm: Callable[[], None], comm_stream, repeats: int,
                  barrier: Callable[[], None], comm_first: bool = False) -> dict:
    """Both sides released by one event; each side's own end, and the later of the two."""
    import torch

    a, b, total = [], [], []
    for _ in range(repeats):
        barrier()
        start = torch.cuda.Event(enable_timing=True)
        ends = {name: torch.cuda.Event(enable_timing=True) for name in ("comp", "comm")}
        start.record(torch.cuda.current_stream())
        order = [("comm", comm, comm_stream), ("comp", comp, comp_stream)]
        for name, fn, stream in (order if comm_first else order[::-1]):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
            ends[name].record(stream)
        torch.cuda.synchronize()
        a.append(_elapsed_us(start, ends["comp"]))
        b.append(_elapsed_us(start, ends["comm"]))
        total.append(max(a[-1], b[-1]))
    return {"t_comp_together_us": statistics.median(a), "t_comm_together_us": statistics.median(b),
            "t_c3_us": statistics.median(total)}


def compute_op(kind: str, device) -> Callable[[], None]:
    """A large bf16 GEMM (compute-bound) or a large elementwise add (memory-bound)."""
    import torch

    if kind == "gemm":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        c = torch.empty(8192, 8192, device=device, dtype=torch.bfloat16)
        return lambda: torch.mm(a, b, out=c)
    if kind == "membound":
        n = 1 << 29  # 1 GiB of bf16 per operand
        x, y = torch.randn(n, device=device, dtype=torch.bfloat16), torch.randn(n, device=device, dtype=torch.bfloat16)
        z = torch.empty_like(x)
        return lambda: torch.add(x, y, out=z)
    raise ValueError(f"unknown compute kind {kind!r}")


def run_interference(rank: int, world: int, cfg: dict) -> Optional[list[dict]]:
    import torch
    import torch.distributed as dist

    from . import timing
    from .power import power_points
    from .sweep import BoundPoint, Inputs, gather_rows, gpu_runner, point_fields

    sizes, repeats = cfg["sizes"], cfg["repeats"]
    runner = gpu_runner(rank, world, max(sizes))
    comp_stream, comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
    rows = []
    for kind in cfg["compute"]:
        comp = compute_op(kind, runner.device)
        for _ in range(3):
            comp()
        t_comp = time_alone(comp, comp_stream, repeats, runner.barrier)
        for i, nbytes in enumerate(sizes):
            data = Inputs("all_gather", nbytes, runner.dtype, world, 101 * (i + 1), runner.device)
            for pt in power_points("all_gather", cfg["impls"]):
                bp = BoundPoint(runner, pt, nbytes, data)
                with torch.cuda.stream(comm_stream):
                    probe = timing.capture(bp.run_once, 10, 3)
                one = time_alone(probe.replay, comm_stream, repeats, runner.barrier) / 10
                # enough back-to-back calls to span the computation; the same count on every rank
                counts: list = [None] * world
                dist.all_gather_object(counts, max(1, min(4000, round(t_comp / one))), group=runner.cpu_group)
                calls = max(counts)
                with torch.cuda.stream(comm_stream):
                    graph = timing.capture(bp.run_once, calls, 1)
                t_comm = time_alone(graph.replay, comm_stream, repeats, runner.barrier)
                together = time_together(comp, comp_stream, graph.replay, comm_stream, repeats, runner.barrier)
                ok = bp.check(graph.replay)
                rows.append({**point_fields(pt), "compute": kind, "world": world, "rank": rank,
                             "bytes_per_rank": nbytes, "comm_calls": calls, "t_comp_us": t_comp, "t_comm_us": t_comm,
                             **together, "comp_slowdown": together["t_comp_together_us"] / t_comp,
                             "comm_slowdown": together["t_comm_together_us"] / t_comm,
                             **c3_metrics(t_comp, t_comm, together["t_c3_us"]), "correct": ok})
                if rank == 0:
                    r = rows[-1]
                    print(f"{kind:8s} + {pt.impl:4s} {pt.variant:5s} {nbytes:>10d} B x{calls}: comp slowdown "
                          f"{r['comp_slowdown']:.2f}, comm slowdown {r['comm_slowdown']:.2f}, "
                          f"{r['fraction_of_ideal']:.2f} of ideal {'ok' if ok else 'WRONG'}", flush=True)
    return gather_rows(runner, rows)
