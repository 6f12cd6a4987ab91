"""Where a small call's time goes on real GPUs, a GPU per rank (issue 48): every configuration beside its floors and
NCCL in one run, and a CUPTI timeline of one replay on every rank.

An all-gather of each of ``--sizes`` per rank, at each of ``--worlds`` (a GPU per rank), graph-replayed: ``--calls``
calls captured in one CUDA graph, ``--repeats`` replays, the ranks starting each replay together; a replay's time is
the slowest rank's. Rows (``config``):

* ``floor: copy``: one peer copy to the next rank, no flag;
* ``floor: barrier <signal>/<wait>``: one flag crossing with every peer (signal them all, wait for them all; the
  lean handshake's alternating words), no data: what a call's synchronization costs alone;
* ``floor: copy + barrier <signal>/<wait>``: the copy, then that barrier (a lean call's critical path with one peer);
* ``<variant> <signal>/<wait> <lean|full> <in place|out of place>``: ``Communicator.all_gather`` with those options
  (push, no prerecording: a graph capture records the call itself);
* ``auto``: ``Communicator()``'s own choice (its tuning table), out of place: what a user gets;
* ``nccl``: ``all_gather_into_tensor`` on the NCCL group.

``--max-connections`` runs the whole set again with ``CUDA_DEVICE_MAX_CONNECTIONS`` set (hardware queues per
process; the driver's default is 8) for each value given.

The timeline (``--timeline``, on by default): one more replay of each configuration under the PyTorch profiler
(CUPTI activity records of every copy, kernel and memset: stream memory operations leave none), every rank's
records in the second table, times in microseconds from the earliest record of that replay on any rank (the
profiler puts GPU times on the host clock, which the ranks share: the table says how far apart ranks' clocks may
be only through causality, e.g. a flag copy's end against the waiting rank's next record).

Usage: dmacoll probe call_timeline [--worlds 2 4] [--sizes 1K 64K] [--calls 10] [--repeats 30]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from typing import Optional

from .common import Table, add_repeats, count, driver, quantiles, size_multiple_of

NAME = "call_timeline"
HELP = "a small all-gather per configuration against its floors and NCCL, a GPU per rank, with a CUPTI timeline"
GPUS = 2
COLUMNS = ["world", "max_connections", "config", "kind", "variant", "signal", "wait", "handshake", "in_place",
           "bytes", "per_call_us", "per_call_us_p10", "per_call_us_p90", "resolved", "error"]
ACTIVITIES = f"{NAME}_activities"
EXTRA = {ACTIVITIES: ["world", "max_connections", "config", "bytes", "rank", "name", "stream", "start_us", "dur_us",
                      "nbytes", "args"]}

# the library configurations timed (variant, signal, wait, handshake, in place); floors and NCCL come beside them
LIBRARY = (
    ("pcpy", "copy", "memop", "lean", False),
    ("pcpy", "copy", "memop", "lean", True),
    ("pcpy", "memop", "memop", "lean", True),
    ("pcpy", "copy", "spin", "lean", True),
    ("pcpy", "kernel", "spin", "lean", True),
    ("pcpy", "copy", "memop", "full", True),
    ("b2b", "copy", "memop", "lean", True),
    ("b2b", "memop", "memop", "lean", True),
    ("b2b", "kernel", "spin", "lean", True),
    ("b2b", "memop", "spin", "lean", True),
    ("b2b", "copy", "spin", "lean", True),
    ("multi", "copy", "memop", "lean", True),
    ("multi", "memop", "memop", "lean", True),
)
BARRIERS = (("memop", "memop"), ("copy", "memop"), ("kernel", "memop"), ("memop", "spin"), ("copy", "spin"),
            ("kernel", "spin"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", type=count, nargs="+", default=[2, 4], help="ranks, a GPU each (default 2 4)")
    p.add_argument("--sizes", type=size_multiple_of(16), nargs="+", default=[1024, 65536],
                   help="bytes per rank (default 1K 64K)")
    p.add_argument("--calls", type=count, default=10, help="calls captured in one graph (default 10)")
    p.add_argument("--max-connections", type=count, nargs="*", default=[],
                   help="also run with CUDA_DEVICE_MAX_CONNECTIONS set to each value (default: only unset)")
    p.add_argument("--timeline", action=argparse.BooleanOptionalAction, default=True,
                   help="one profiled replay per configuration, every rank's CUPTI records (default on)")
    add_repeats(p, 30, "graph replays (the median of the slowest rank's per-call time is reported)")


def library_name(variant: str, signal: str, wait: str, handshake: str, in_place: bool) -> str:
    return f"{variant} {signal}/{wait} {handshake} {'in place' if in_place else 'out of place'}"




def slowest(per_rank: list[list[float]]) -> list[float]:
    """Per replay, the slowest rank's time (every rank timed the same replays, started together)."""
    return [max(samples) for samples in zip(*per_rank)]


def row(world: int, max_connections: Optional[int], config: str, kind: str, nbytes: int, samples: list[float],
        variant: str = "", signal: str = "", wait: str = "", handshake: str = "", in_place: object = "",
        resolved: str = "", error: str = "") -> dict:
    med, p10, p90 = quantiles(samples)
    return {"world": world, "max_connections": max_connections or "", "config": config, "kind": kind,
            "variant": variant, "signal": signal, "wait": wait, "handshake": handshake, "in_place": in_place,
            "bytes": nbytes, "per_call_us": med, "per_call_us_p10": p10, "per_call_us_p90": p90,
            "resolved": resolved, "error": error}


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def activities(trace: dict) -> list[dict]:
    """The GPU records of a chrome trace the PyTorch profiler exported: name, stream, start and duration (us, the
    trace's clock), bytes moved (copies and memsets, else 0) and the other arguments CUPTI gave (JSON)."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATEGORIES:
            continue
        args = dict(e.get("args", {}))
        stream = args.pop("stream", "")
        nbytes = args.pop("bytes", 0)
        kept = ("device", "correlation", "graph node id", "memory bandwidth (GB/s)")
        keep = {k: v for k, v in args.items() if k in kept}
        out.append({"name": e.get("name", ""), "stream": stream, "start_us": float(e["ts"]), "dur_us": float(e["dur"]),
                    "nbytes": int(nbytes or 0), "args": json.dumps(keep, sort_keys=True)})
    return out


def timeline_rows(world: int, max_connections: Optional[int], config: str, nbytes: int,
                  per_rank: list[list[dict]]) -> list[dict]:
    """Every rank's records of one replay, on one time axis: microseconds from the earliest record on any rank."""
    starts = [a["start_us"] for records in per_rank for a in records]
    origin = min(starts) if starts else 0.0
    return [{"world": world, "max_connections": max_connections or "", "config": config, "bytes": nbytes,
             "rank": rank, **{**a, "start_us": round(a["start_us"] - origin, 3)}}
            for rank, records in enumerate(per_rank) for a in sorted(records, key=lambda a: a["start_us"])]


def ran(comm) -> str:
    """What the communicator's last call ran with: variant/direction signal/wait handshake."""
    o = comm.last_options
    if o is None:
        return ""
    return f"{o.variant}/{o.direction} {o.signal}/{o.wait} {'lean' if comm.last_handshake.ready_implied else 'full'}"


# -- the ranks -----------------------------------------------------------------------------------------------------
def _profiled(graph, barrier) -> list[dict]:
    """One replay of ``graph`` under the PyTorch profiler (CUDA activities only): its GPU records."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        barrier()
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="dmacoll-timeline-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return activities(json.load(f))


def _rank(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    from dmacoll import Communicator, Options
    from dmacoll.lab_api import bench_time, capture, lower, run

    from .call_cost import floor_plans

    comm = Communicator(timeout_s=60, options=Options(submit="python", prerecord=False))
    k = cfg["calls"] + cfg["calls"] % 2  # even: the floors alternate two flag words
    nccl = dist.group.WORLD
    stream = torch.cuda.Stream()
    results = []

    def measure(call, **what) -> None:
        index = iter(range(1 << 30))
        fn = lambda: call(next(index))  # noqa: E731
        try:
            samples = bench_time(fn, k, cfg["repeats"], mode="graph", warmup=2, stream=stream,
                                 each=dist.barrier).samples
            records = None
            if cfg["timeline"]:
                records = _profiled(capture(fn, k, stream, warmup=0), dist.barrier)
            results.append({**what, "samples": samples, "records": records, "error": ""})
        except Exception as e:  # noqa: BLE001 - recorded in the table; the ranks go on with the next configuration
            results.append({**what, "samples": [], "records": None, "error": f"{type(e).__name__}: {e}"[:300]})
        torch.cuda.synchronize()
        dist.barrier()

    for nbytes in cfg["sizes"]:
        x = comm.empty(nbytes, dtype=torch.uint8).random_(0, 255)
        outs = [comm.empty(world * nbytes, dtype=torch.uint8) for _ in range(2)]
        for variant, signal, wait, handshake, in_place in LIBRARY:
            def call(i, variant=variant, signal=signal, wait=wait, handshake=handshake, in_place=in_place):
                out = outs[i % 2]
                inp = out[rank * nbytes:(rank + 1) * nbytes] if in_place else x
                comm.all_gather(out, inp, variant=variant, direction="push", signal=signal, wait=wait,
                                handshake=handshake)
            measure(call, config=library_name(variant, signal, wait, handshake, in_place), kind="dmacoll",
                    bytes=nbytes, variant=variant, signal=signal, wait=wait, handshake=handshake, in_place=in_place)
            results[-1]["resolved"] = ran(comm)
        measure(lambda i: comm.all_gather(outs[i % 2], x), config="auto", kind="dmacoll", bytes=nbytes,
                in_place=False)
        results[-1]["resolved"] = ran(comm)
        in_off, out_off = comm.engine.sym_offset(x), comm.engine.sym_offset(outs[0])
        # (name, (signal, wait) of the crossing or None for no crossing, with the copy)
        floors = [("floor: copy", None, True)]
        floors += [(f"floor: barrier {s}/{w}", (s, w), False) for s, w in BARRIERS]
        floors += [(f"floor: copy + barrier {s}/{w}", (s, w), True) for s, w in BARRIERS[:3]]
        for name, flags, with_copy in floors:
            plans = floor_plans(rank, world, 0 if flags is None else 1, in_off, out_off, nbytes, with_copy)
            programs = [lower(p, "reset", *(flags or ("memop", "memop"))) for p in plans]

            def floor_call(i, programs=programs):
                comm.engine.main_queue = torch.cuda.current_stream()
                run(programs[i % len(programs)], comm.engine, {}, 1)
            measure(floor_call, config=name, kind="floor", bytes=nbytes, signal=(flags or ("", ""))[0],
                    wait=(flags or ("", ""))[1])
        nccl_out = torch.empty(world * nbytes, dtype=torch.uint8, device=x.device)
        measure(lambda i: dist.all_gather_into_tensor(nccl_out, x, group=nccl), config="nccl", kind="nccl",
                bytes=nbytes)
        ref = torch.empty_like(nccl_out)
        dist.all_gather_into_tensor(ref, x, group=nccl)
        comm.all_gather(outs[0], x)
        torch.cuda.synchronize()
        if not torch.equal(outs[0], ref):  # the timed calls moved the right bytes (checked after timing)
            results.append({"config": "check", "kind": "check", "bytes": nbytes, "samples": [], "records": None,
                            "error": "all_gather differs from NCCL's"})
    torch.cuda.synchronize()
    dist.barrier()
    comm.close()
    return results


def run_world(args, world: int, max_connections: Optional[int]) -> tuple[list[dict], list[dict]]:
    from ...verify.launch import run_ranks

    cfg = {"sizes": args.sizes, "calls": args.calls, "repeats": args.repeats, "timeline": args.timeline}
    saved = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if max_connections:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(max_connections)
    try:
        per_rank = run_ranks(_rank, world, cfg, device="cuda", timeout_s=560)
    except Exception as e:  # noqa: BLE001 - recorded in the table, the other worlds go on
        return [row(world, max_connections, "", "", 0, [], error=f"{type(e).__name__}: {e}"[:300])], []
    finally:
        if max_connections:
            if saved is None:
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
            else:
                os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = saved
    rows, timeline = [], []
    for i, first in enumerate(per_rank[0]):
        mine = [r[i] for r in per_rank]
        error = next((m["error"] for m in mine if m["error"]), "")
        samples = [] if error else slowest([m["samples"] for m in mine])
        rows.append(row(world, max_connections, first["config"], first["kind"], first["bytes"], samples,
                        **{k: first.get(k, "") for k in ("variant", "signal", "wait", "handshake", "in_place",
                                                          "resolved")}, error=error))
        if all(m["records"] is not None for m in mine):
            timeline += timeline_rows(world, max_connections, first["config"], first["bytes"],
                                      [m["records"] for m in mine])
    return rows, timeline


def run(args: argparse.Namespace) -> dict[str, Table]:
    driver()
    rows, timeline = [], []
    for max_connections in [None, *args.max_connections]:
        for world in args.worlds:
            r, t = run_world(args, world, max_connections)
            for x in r:
                print(f"w{world} conn {x['max_connections'] or '-':>2} {x['bytes']:>7} {x['config']:38s} "
                      f"{x['per_call_us']:8.2f} us (p10 {x['per_call_us_p10']:.2f}, p90 {x['per_call_us_p90']:.2f})"
                      f" {x['resolved']} {x['error']}", flush=True)
            rows += r
            timeline += t
    config = {k: getattr(args, k) for k in ("worlds", "sizes", "calls", "max_connections", "timeline", "repeats")}
    return {NAME: Table(rows, config), ACTIVITIES: Table(timeline, config)}


# -- reading the timeline ------------------------------------------------------------------------------------------
HARNESS_KERNELS = ("vectorized_elementwise", "AllReduce_Sum_f32")  # the input's fill, the ranks' NCCL barrier
SUMMARY = ["world", "config", "bytes", "per_call_us", "copies_per_call", "copy_us", "copy_gap_us", "copies_overlapping",
           "kernels_per_call", "kernel_us"]


def summary(activities: list[dict], calls: int) -> list[dict]:
    """Per (world, config, bytes), from every rank's records of one profiled replay of ``calls`` calls (medians over
    ranks): the replay's span per call; copies per call, a copy's duration, the idle gap from one copy's end to the
    next copy's start on the same rank (any stream: the copy engine's issue cost), and the share of consecutive
    copies that overlap in time (0: the rank's copies ran one after another, whatever their streams); kernels per
    call and a kernel's duration (dmacoll's put, spin and fold kernels; NCCL's)."""
    def med(xs):
        return round(statistics.median(xs), 2) if xs else float("nan")

    groups: dict[tuple, dict[str, list[dict]]] = {}
    for a in activities:
        if any(k in a["name"] for k in HARNESS_KERNELS):
            continue
        key = (int(a["world"]), a["config"], int(a["bytes"]))
        groups.setdefault(key, {}).setdefault(str(a["rank"]), []).append(a)
    out = []
    for (world, config, nbytes), ranks in sorted(groups.items()):
        span, ncopies, dur, gap, overlap, nkernels, kdur = [], [], [], [], [], [], []
        for records in ranks.values():
            records = sorted(records, key=lambda a: float(a["start_us"]))
            start = float(records[0]["start_us"])
            end = max(float(a["start_us"]) + float(a["dur_us"]) for a in records)
            span.append((end - start) / calls)
            copies = [a for a in records if a["name"].startswith("Memcpy")]
            kernels = [a for a in records if not a["name"].startswith("Memcpy")]
            ncopies.append(len(copies) / calls)
            nkernels.append(len(kernels) / calls)
            dur += [float(a["dur_us"]) for a in copies]
            kdur += [float(a["dur_us"]) for a in kernels]
            for a, b in zip(copies, copies[1:]):
                a_end = float(a["start_us"]) + float(a["dur_us"])
                overlap.append(float(b["start_us"]) < a_end)
                if 0 <= float(b["start_us"]) - a_end < 5:  # back to back inside a call, not across a wait
                    gap.append(float(b["start_us"]) - a_end)
        out.append({"world": world, "config": config, "bytes": nbytes, "per_call_us": med(span),
                    "copies_per_call": med(ncopies), "copy_us": med(dur), "copy_gap_us": med(gap),
                    "copies_overlapping": round(sum(overlap) / len(overlap), 2) if overlap else float("nan"),
                    "kernels_per_call": med(nkernels), "kernel_us": med(kdur)})
    return out


def summary_markdown(csv_path: str, calls: int) -> str:
    """``summary`` of a committed activities table as a markdown table (what the results README shows)."""
    import csv

    with open(csv_path) as f:
        rows = summary(list(csv.DictReader(f)), calls)
    lines = ["| " + " | ".join(SUMMARY) + " |", "|" + "---|" * len(SUMMARY)]
    lines += ["| " + " | ".join(str(r[c]) for c in SUMMARY) + " |" for r in rows]
    return "\n".join(lines)
