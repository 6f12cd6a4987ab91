"""How long does one flag crossing between two streams take, and what does it depend on? (one GPU)

Every dmacoll call pays at least one flag crossing (DONE: a stream memop write after the copies, a stream memop
wait on the receiver), ~7 us each on 2x H200 (`dmacoll breakdown`), which is most of a small collective and the
rest of the gap to one peer copy at 64 MB. This ping-pongs a flag between two streams of one GPU: stream B
writes f0 = i and waits for f1 >= i; stream A waits for f0 >= i and writes f1 = i; ``--rounds`` round trips,
queued behind a gate (a host-memory flag the CPU sets once everything is queued), so the host does not pace
them. One crossing = total / (2 x rounds), median of ``--repeats`` (its own events, not the timing loop's: the
start event waits behind the gate too, so only the released work is timed). Ways:

* ``memop_device``: flags in device memory (cudaMalloc), ``cuStreamWriteValue32`` / ``cuStreamWaitValue32``
  GEQ, the write with its default memory barrier (what dmacoll issues);
* ``memop_device_no_barrier``: the write with ``CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER``;
* ``memop_vmm``: flags in a CUDA VMM mapping (cuMemCreate, as the symmetric heap is);
* ``memop_host``: flags in pinned host memory;
* ``memop_high_priority``: ``memop_device`` on two streams of the device's greatest priority;
* ``memop_graph``: ``memop_device`` captured in one CUDA graph (both streams), replayed;
* ``copy_signal_h2d``: each write a 4-byte host-to-device copy (a copy engine; dmacoll's ``signal="copy"``
  copies device to peer device);
* ``self_chain``: one stream, write then a wait already satisfied, ``2 x rounds`` times: the memops' own cost.

Usage: dmacoll probe flag_latency [--rounds 200] [--repeats 5] [--ways ...] [--out CSV]
"""
from __future__ import annotations

import argparse
import statistics

from .common import Table, add_repeats, at_most, driver

NAME = "flag_latency"
HELP = "one flag crossing between two streams (stream memops, VMM / host flags, priority, graph, copy) (1 GPU)"
GPUS = 1
COLUMNS = ["way", "rounds", "total_us", "crossing_us", "total_us_min", "total_us_max", "error"]
EXTRA: dict[str, list[str]] = {}
# every round is queued before the gate opens: 200 rounds are 400 queued memops per stream (800 for self_chain),
# well inside a stream's queue, so the host never blocks; many more could fill it and hang behind the gate
MAX_ROUNDS = 400
WAYS = ("memop_device", "memop_device_no_barrier", "memop_vmm", "memop_host", "memop_high_priority",
        "memop_graph", "copy_signal_h2d", "self_chain")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=at_most(MAX_ROUNDS), default=200,
                   help=f"round trips per timing, all queued before the gate opens (at most {MAX_ROUNDS}; default 200)")
    add_repeats(p, 5)
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="ways to cross (default: all)")


def way_row(way: str, rounds: int, totals_us: list[float]) -> dict:
    """One way from its total times of ``rounds`` round trips: one crossing = total / (2 x rounds)."""
    total = statistics.median(totals_us)
    return {"way": way, "rounds": rounds, "total_us": total, "crossing_us": total / (2 * rounds),
            "total_us_min": min(totals_us), "total_us_max": max(totals_us), "error": ""}


def failed_row(way: str, rounds: int, error: str) -> dict:
    """A way this driver refuses: recorded with its error, the times empty."""
    return {"way": way, "rounds": rounds, "total_us": "", "crossing_us": "", "total_us_min": "", "total_us_max": "",
            "error": error}


def _ok(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from dmacoll.lab_api import graph_capture

    from ..c3 import greatest_priority_stream
    from .local_copy_paths import vmm_buffer

    drv = driver()
    rounds = args.rounds

    geq = drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    no_barrier = drv.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
    gate = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    dev_flags = torch.zeros(2, dtype=torch.int32, device=0)
    host_flags = torch.zeros(2, dtype=torch.int32, pin_memory=True)
    vmm, release_vmm = vmm_buffer(8, 0)
    values = torch.arange(rounds + 1, dtype=torch.int32).pin_memory()  # copy_signal_h2d's sources
    normal = (torch.cuda.Stream(), torch.cuda.Stream())
    high = (greatest_priority_stream(0), greatest_priority_stream(0))

    def flags_of(way: str) -> tuple[int, int]:
        if way == "memop_host":
            return host_flags.data_ptr(), host_flags.data_ptr() + 4
        if way == "memop_vmm":
            return vmm, vmm + 4
        return dev_flags.data_ptr(), dev_flags.data_ptr() + 4

    def reset() -> None:
        torch.cuda.synchronize()
        dev_flags.zero_()
        host_flags.zero_()
        _ok(drv.cuMemsetD32(vmm, 0, 2))
        gate.zero_()
        torch.cuda.synchronize()

    def write(stream, addr: int, i: int, way: str) -> None:
        if way == "copy_signal_h2d":
            _ok(drv.cuMemcpyAsync(addr, values.data_ptr() + 4 * i, 4, stream.cuda_stream))
        else:
            _ok(drv.cuStreamWriteValue32(stream.cuda_stream, addr, i,
                                         no_barrier if way == "memop_device_no_barrier" else 0))

    def wait(stream, addr: int, i: int) -> None:
        _ok(drv.cuStreamWaitValue32(stream.cuda_stream, addr, i, geq))

    def enqueue(way: str, a, b) -> None:
        f0, f1 = flags_of(way)
        for i in range(1, rounds + 1):
            if way == "self_chain":
                for flag in (f0, f1):
                    write(b, flag, i, way)
                    wait(b, flag, i)
                continue
            write(b, f0, i, way)
            wait(a, f0, i)
            write(a, f1, i, way)
            wait(b, f1, i)

    def run_once(way: str, graph=None) -> float:
        a, b = high if way == "memop_high_priority" else normal
        reset()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wait(b, gate.data_ptr(), 1)
        start.record(b)
        if graph is not None:
            with torch.cuda.stream(b):
                graph.replay()
        else:
            wait(a, gate.data_ptr(), 1)
            enqueue(way, a, b)
            b.wait_stream(a)
        end.record(b)
        gate[0] = 1  # the CPU releases everything queued
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    def captured():
        a, b = normal
        graph = torch.cuda.CUDAGraph()
        b.wait_stream(torch.cuda.current_stream())
        with graph_capture(graph, b):
            a.wait_stream(b)
            enqueue("memop_device", a, b)
            b.wait_stream(a)
        return graph

    rows = []
    for way in args.ways:
        try:
            graph = captured() if way == "memop_graph" else None
            run_once(way, graph)  # warm-up
            totals = [run_once(way, graph) for _ in range(args.repeats)]
        except RuntimeError as e:  # a way this driver refuses: recorded, not fatal
            rows.append(failed_row(way, rounds, str(e)))
            print(f"{way:26s} failed: {e}", flush=True)
            gate[0] = 1  # release whatever was queued before the failure
            torch.cuda.synchronize()
            continue
        rows.append(way_row(way, rounds, totals))
        total = rows[-1]["total_us"]
        print(f"{way:26s} one crossing {rows[-1]['crossing_us']:6.2f} us (total {total:9.1f} us, "
              f"min {min(totals):9.1f}, max {max(totals):9.1f})", flush=True)
    release_vmm()
    return {NAME: Table(rows, {"rounds": rounds, "repeats": args.repeats, "ways": list(args.ways)})}
