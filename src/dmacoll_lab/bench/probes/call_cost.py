"""Where a small call's time goes, and what grows with the number of peers (one GPU).

An all-gather of ``--bytes`` per rank (push, symmetric buffers), per world, variant and handshake, two ways:

* ``structure``: one process runs rank 0's lowered program (the communicator's, from the same plan builder and
  lowering) on a *loopback* engine, whose peer heaps are its own heap shifted so that each signal to peer p lands on
  the word rank 0 waits on for p: every wait is met by the call's own signal, earlier on some stream, so no flag
  ever crosses. What is left is the program's structure: commands, graph nodes, streams forked and joined. Beside
  it, one copy of the same size alone (the floor of any call). Graph: ``--calls-per-graph`` calls captured in one
  CUDA graph, replayed ``--repeats`` times; eager: ``--eager-calls`` back to back. Per row also the structure's
  counts per call: dmacoll's driver calls (eager), graph nodes by kind (one call captured alone), side streams
  forked, and the flag crossings on the critical path (``executor.critical_crossings``).
* ``shared``: ``world`` ranks as processes on GPU 0 (the cuda backend's IPC heap), the real protocol through
  ``Communicator``, graph-replayed, the slowest rank's time; beside it the floors of one handshake in the same run:
  one peer copy, a peer copy and one flag crossing with every peer (the lean handshake's), and two (the full
  one's). Processes sharing a GPU are time-sliced by the driver: these are not performance figures, only
  how close a call comes to the floor of its handshake measured the same way.

Usage: dmacoll probe call_cost [--worlds 2 4 8] [--bytes 1K] [--settings structure shared] [--out CSV]
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections import Counter

from .common import Table, add_repeats, count, driver, quantiles, size_multiple_of

NAME = "call_cost"
HELP = "per-call time and structure of a small all-gather by variant and handshake, against its floors (1 GPU)"
GPUS = 1
COLUMNS = ["setting", "world", "variant", "handshake", "signal", "wait", "mode", "bytes", "per_call_us",
           "per_call_us_p10", "per_call_us_p90", "host_us", "driver_calls", "graph_nodes", "forked_streams",
           "crossings", "error"]
EXTRA: dict[str, list[str]] = {}
SETTINGS = ("structure", "shared")
FLOORS = {"floor: copy": 0, "floor: copy + 1 crossing": 1, "floor: copy + 2 crossings": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", type=count, nargs="+", default=[2, 4, 8], help="ranks (default 2 4 8)")
    p.add_argument("--bytes", type=size_multiple_of(16), default=1024, help="bytes per rank (default 1K)")
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument("--signals", nargs="+", choices=("memop", "copy", "kernel"), default=["memop", "copy", "kernel"],
                   help="flag signals in the structure setting (shared: memop; copy flags between processes cost a "
                        "context switch each)")
    p.add_argument("--waits", nargs="+", choices=("memop", "spin"), default=["memop", "spin"])
    p.add_argument("--calls-per-graph", type=count, default=10, help="calls captured in one graph (default 10)")
    p.add_argument("--eager-calls", type=count, default=200, help="eager calls timed back to back (default 200)")
    add_repeats(p, 20, "graph replays (their median per call is reported)")




def row(setting: str, world: int, variant: str, handshake: str, signal: str, wait: str, mode: str, nbytes: int,
        samples: list[float], **counts) -> dict:
    med, p10, p90 = quantiles(samples)
    out = {"setting": setting, "world": world, "variant": variant, "handshake": handshake, "signal": signal,
           "wait": wait, "mode": mode, "bytes": nbytes, "per_call_us": med, "per_call_us_p10": p10,
           "per_call_us_p90": p90, "host_us": float("nan"), "driver_calls": "", "graph_nodes": "",
           "forked_streams": "", "crossings": "", "error": ""}
    out.update(counts)
    return out


def node_summary(kinds: Counter) -> str:
    """Graph node kinds as ``kind:count`` (CU_GRAPH_NODE_TYPE_ stripped, lower case), sorted."""
    return " ".join(f"{k.replace('CU_GRAPH_NODE_TYPE_', '').lower()}:{n}" for k, n in sorted(kinds.items()))


# -- structure: one process, a loopback engine -------------------------------------------------------------------
def loopback(world: int, heap):
    """Rank 0's cuda engine whose peer p's heap is its own shifted by 4 p bytes: a signal to p (its word for
    signaller 0) lands on rank 0's word for signaller p, the one rank 0 waits on for p."""
    import torch

    from dmacoll.lab_api import CudaEngine, one_index

    base = heap.data_ptr()
    eng = CudaEngine.for_commands(0, world, [base] + [base + 4 * p for p in range(1, world)],
                                  torch.cuda.current_stream(), heap=heap, device=heap.device)
    heap.view(torch.int32)[one_index(world)] = 1  # the word copy signals copy
    return eng


def structure_program(world: int, nbytes: int, variant: str, handshake: str, signal: str, wait: str):
    """Rank 0's lowered all-gather and its layout's heap size (flag words, then input, then output)."""
    from dmacoll.lab_api import DONE, FULL, Handshake, Layout, all_gather_exchange, build_plan, flag_words, lower

    staging = -(-flag_words(world) * 4 // 4096) * 4096
    layout = Layout(input_sym=staging + 4096, output_sym=staging + 4096 + nbytes + 4096, staging=staging)
    flags = Handshake(frozenset(range(1, world)), DONE) if handshake == "lean" else FULL
    plan = build_plan(all_gather_exchange(world, nbytes), 0, variant, "push", layout, 2, flags)
    return lower(plan, "reset", signal, wait), layout.output_sym + world * nbytes + 4096 * world


def _settled(event, heap, seconds: float = 5.0) -> bool:
    """Whether ``event`` completes within ``seconds``; if not, every flag word is set so the stream drains."""
    import torch

    deadline = time.monotonic() + seconds
    while not event.query():
        if time.monotonic() > deadline:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                heap[:4096].view(torch.int32).fill_(1)
            torch.cuda.synchronize()
            return False
        time.sleep(0.001)
    return True


def time_structure(args, world: int, variant: str, handshake: str, signal: str, wait: str) -> list[dict]:
    import torch

    from dmacoll.lab_api import counted_driver_calls, critical_crossings, run
    from .common import checked

    program, heap_bytes = structure_program(world, args.bytes, variant, handshake, signal, wait)
    heap = torch.zeros(heap_bytes, dtype=torch.uint8, device=0)
    eng = loopback(world, heap)
    stream = torch.cuda.Stream()
    common = dict(forked_streams=max(0, len(program.queues) - 1),
                  crossings=critical_crossings([program], 0, world))
    base = ("structure", world, variant, handshake, signal, wait)

    def call():
        eng.main_queue = torch.cuda.current_stream()
        run(program, eng, {}, 1)

    with torch.cuda.stream(stream):
        call()  # kernels loaded, side streams made
        done = torch.cuda.Event()
        done.record(stream)
    if not _settled(done, heap):
        return [row(*base, "graph", args.bytes, [], error="a wait was not met (loopback broken)", **common)]
    with counted_driver_calls() as counted, torch.cuda.stream(stream):
        call()
    calls = sum(counted.values())
    drv = driver()
    # graph nodes: one call captured alone through the driver, so its graph can be read
    with torch.cuda.stream(stream):
        checked(drv.cuStreamBeginCapture(stream.cuda_stream,
                                         drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "begin capture")
        call()
        graph = checked(drv.cuStreamEndCapture(stream.cuda_stream), "end capture")
    _, _, n = drv.cuGraphGetNodes(graph, 0)
    _, nodes, _ = drv.cuGraphGetNodes(graph, n)
    kinds = Counter(checked(drv.cuGraphNodeGetType(node), "node type").name for node in nodes)
    drv.cuGraphDestroy(graph)
    torch.cuda.synchronize()

    rows = [row(*base, "graph", args.bytes, graph_per_call_us(call, args.calls_per_graph, args.repeats, stream),
                graph_nodes=node_summary(kinds), **common)]

    # not the timing loop: the host clock and the events bracket the same calls, for the host's share of each
    host, device = [], []
    with torch.cuda.stream(stream):
        for _ in range(max(1, args.repeats // 4)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            t0 = time.perf_counter()
            for _ in range(args.eager_calls):
                call()
            host.append((time.perf_counter() - t0) * 1e6 / args.eager_calls)
            end.record(stream)
            end.synchronize()
            device.append(start.elapsed_time(end) * 1e3 / args.eager_calls)
    rows.append(row(*base, "eager", args.bytes, device, host_us=statistics.median(host), driver_calls=calls,
                    **common))
    return rows


def graph_per_call_us(call, k: int, repeats: int, stream) -> list[float]:
    """Per-call microseconds of ``k`` calls captured in one CUDA graph on ``stream``, one sample per replay (the
    timing loop, ``dmacoll.timing.bench_time``; no eager warm-up: the copies and the loopback's calls need none)."""
    from dmacoll.lab_api import bench_time

    return bench_time(call, k, repeats, mode="graph", warmup=0, stream=stream).samples


def time_copy_alone(args) -> list[dict]:
    """The floor of any call: one copy of ``--bytes`` on one stream, graph-replayed."""
    import torch

    src = torch.randint(0, 255, (args.bytes,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    samples = graph_per_call_us(lambda: dst.copy_(src), args.calls_per_graph, args.repeats, torch.cuda.Stream())
    return [row("structure", 1, "floor: copy", "-", "-", "-", "graph", args.bytes, samples, graph_nodes="memcpy:1",
                crossings=0)]


# -- shared: world processes on GPU 0 ---------------------------------------------------------------------------
def floor_plans(rank: int, world: int, crossings: int, in_off: int, out_off: int, nbytes: int,
                with_copy: bool = True):
    """One peer copy (to the next rank) with the flags of a handshake with every peer: none, one crossing (signal
    every peer, wait for every peer; alternating DONE words, as the lean handshake) or two (READY, then DONE after
    the copy); ``with_copy=False``: the flags alone (a barrier). Call k runs plan k % len(plans)."""
    from dmacoll.lab_api import Copy, DONE, DONE_ALT, Plan, READY, Ref, Signal, Wait

    peers = [(rank + i) % world for i in range(1, world)]
    copy = (Copy(Ref("sym", rank, in_off), Ref("sym", peers[0], out_off + rank * nbytes), nbytes),) if with_copy \
        else ()

    def handshake(phase):
        return (*(Signal(p, phase) for p in peers), *(Wait(p, phase) for p in peers))

    if crossings == 0:
        return [Plan(rank, world, (), (copy,), ())]
    if crossings == 1:
        return [Plan(rank, world, (), ((*copy, *handshake(ph)),), ()) for ph in (DONE, DONE_ALT)]
    return [Plan(rank, world, (), ((*handshake(READY), *copy, *handshake(DONE)),), ())]


def _shared_rank(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    from dmacoll import Communicator, Options
    from dmacoll.lab_api import VARIANTS, bench_time, critical_crossings, lower, run

    comm = Communicator(timeout_s=60, options=Options(signal="memop", wait="memop", submit="python", prerecord=False))
    nbytes = cfg["bytes"]
    k = cfg["calls_per_graph"] + cfg["calls_per_graph"] % 2  # even: the 1-crossing floor alternates two words
    x = comm.empty(nbytes, dtype=torch.uint8)
    outs = [comm.empty(world * nbytes, dtype=torch.uint8) for _ in range(2)]
    stream = torch.cuda.Stream()

    def timed(call) -> list[float]:
        """Per-call us of ``k`` calls captured in a graph, per replay (after two eager calls, every rank starting
        each replay together); call i is ``call(i)``, i counting from the warm-up on (``k`` is even, so the
        captured calls alternate as from 0)."""
        index = itertools.count()
        return bench_time(lambda: call(next(index)), k, cfg["repeats"], mode="graph", warmup=2, stream=stream,
                          each=dist.barrier).samples

    rows = []
    for variant in VARIANTS:
        for handshake in ("full", "lean"):
            samples = timed(lambda i: comm.all_gather(outs[i % 2], x, variant=variant, direction="push",
                                                      handshake=handshake))
            rows.append({"variant": variant, "handshake": handshake, "samples": samples,
                         "lean": bool(comm.last_handshake.ready_implied)})
    base = comm.engine.sym_offset(x)
    out_off = comm.engine.sym_offset(outs[0])
    for name, crossings in FLOORS.items():
        programs = [lower(p, "reset", "memop", "memop")
                    for p in floor_plans(rank, world, crossings, base, out_off, nbytes)]

        def call(i, programs=programs):
            comm.engine.main_queue = torch.cuda.current_stream()
            run(programs[i % len(programs)], comm.engine, {}, 1)
        samples = timed(call)
        rows.append({"variant": name, "handshake": "-", "samples": samples, "lean": None,
                     "crossings": critical_crossings(programs[:1], rank, world)})
    torch.cuda.synchronize()
    dist.barrier()
    comm.close()
    return rows


def time_shared(args, world: int) -> list[dict]:
    from ...verify.launch import run_ranks

    os.environ["DMACOLL_GPUS"] = "1"
    cfg = {"bytes": args.bytes, "calls_per_graph": args.calls_per_graph, "repeats": args.repeats}
    try:
        per_rank = run_ranks(_shared_rank, world, cfg, device="cuda", timeout_s=600)
    except Exception as e:  # noqa: BLE001 - recorded in the table, the other worlds go on
        return [row("shared", world, "", "", "memop", "memop", "graph", args.bytes, [], error=str(e)[:300])]
    out = []
    for i, first in enumerate(per_rank[0]):
        slowest = [max(r[i]["samples"][j] for r in per_rank) for j in range(len(first["samples"]))]
        handshake = first["handshake"]
        if first["lean"] is False and handshake == "lean":
            handshake = "lean (not taken)"
        crossings = first.get("crossings", {"full": 2, "lean": 1}.get(first["handshake"], ""))
        out.append(row("shared", world, first["variant"], handshake, "memop", "memop", "graph", args.bytes, slowest,
                       crossings=crossings))
    return out


def run(args: argparse.Namespace) -> dict[str, Table]:
    from dmacoll.lab_api import VARIANTS

    driver()
    rows = []
    if "structure" in args.settings:
        rows += time_copy_alone(args)
        for world in args.worlds:
            for variant in VARIANTS:
                for handshake in ("full", "lean"):
                    for signal in args.signals:
                        for wait in args.waits:
                            rows += time_structure(args, world, variant, handshake, signal, wait)
                            for r in rows[-2:]:
                                print(f"structure w{world} {variant:5s} {handshake:4s} {signal:5s} {wait:5s} "
                                      f"{r['mode']:5s} {r['per_call_us']:8.2f} us/call  nodes {r['graph_nodes']} "
                                      f"calls {r['driver_calls']} {r['error']}", flush=True)
    if "shared" in args.settings:
        for world in args.worlds:
            rows += time_shared(args, world)
            for r in rows:
                if r["setting"] == "shared" and r["world"] == world:
                    print(f"shared w{world} {r['variant']:26s} {r['handshake']:6s} {r['per_call_us']:8.2f} us/call "
                          f"(p10 {r['per_call_us_p10']:.2f}, p90 {r['per_call_us_p90']:.2f}) {r['error']}",
                          flush=True)
    config = {k: getattr(args, k) for k in ("worlds", "bytes", "settings", "signals", "waits", "calls_per_graph",
                                            "eager_calls", "repeats")}
    return {NAME: Table(rows, config)}
