"""Where the time of one copy-engine transfer goes: control, schedule, copy, sync.

One process drives the sender GPU and the receiver GPU, so that every timestamp
comes from one trace on one clock. The GPU timestamps are CUPTI activity records
(taken through the PyTorch profiler, which normalises them to the host clock);
the host timestamps are profiler annotations around our own driver calls.
Per transfer of N bytes:

* control:  the host's ``cuMemcpyAsync`` call (CUPTI's driver-API record of it; the
  profiler annotation around it where the profiler records no driver calls);
* schedule: the call returned -> the copy starts on the engine (CUPTI memcpy start;
  negative when the engine starts before the call has returned);
* copy:     engine start -> end (the CUPTI memcpy record);
* sync:     copy end -> the receiver observes completion. The sender writes a flag
  behind the copy (``cuStreamWriteValue32`` to the receiver); the receiver's stream
  waits on it (``cuStreamWaitValue32``) and then runs a 4-byte memset, whose CUPTI
  start is the moment of observation. This is the protocol's DONE crossing.
* host_sync (beside the four): copy end -> the host sees the copy's event complete.

Each transfer is isolated (both GPUs idle before it). The first three phases come
from transfers issued to an idle stream. Sync and host_sync come from a second set
whose sender stream is held by a ``cuStreamWaitValue32`` gate until every command
is queued and the host polls (otherwise a small copy ends before the host has even
issued the flag write, and "sync" would measure the host). Medians over the
transfers are reported with p10/p90.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Optional

import torch

from .harness import summarize

PHASES = ("control", "schedule", "copy", "sync", "host_sync")
BREAKDOWN_COLUMNS = ["src_gpu", "dst_gpu", "link", "bytes", "phase", "time_us", "time_us_p10", "time_us_p90",
                     "samples"]
CALL, HOST_WAIT = "dmacoll::cuMemcpyAsync", "dmacoll::host_wait"


def phases(calls: list[dict], copies: list[dict], observed: list[dict], host_waits: list[dict]) -> dict:
    """Per-phase samples (us) from the trace events of the transfers, in order (chrome-trace
    dicts with ``ts`` and ``dur`` in us). Every phase is computed; the caller keeps those that
    its kind of transfer measures."""
    n = len(calls)
    if not (len(copies) == len(observed) == len(host_waits) == n):
        raise RuntimeError(f"the trace does not pair up: {n} calls, {len(copies)} copies, {len(observed)} "
                           f"receiver memsets, {len(host_waits)} host waits (another process on these GPUs?)")
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    for call, cp, obs, hw in zip(calls, copies, observed, host_waits):
        call_end, copy_end = call["ts"] + call["dur"], cp["ts"] + cp["dur"]
        out["control"].append(call["dur"])
        out["schedule"].append(cp["ts"] - call_end)
        out["copy"].append(cp["dur"])
        out["sync"].append(obs["ts"] - copy_end)
        out["host_sync"].append(hw["ts"] + hw["dur"] - copy_end)
    return out


def trace_events(trace: dict, nbytes: int, dst_gpu: int) -> tuple[list, list, list, list]:
    """The four event lists of ``phases`` from an exported chrome trace, sorted by time."""
    def pick(pred) -> list[dict]:
        return sorted((e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and pred(e)),
                      key=lambda e: e["ts"])

    def nbytes_of(e: dict) -> Optional[int]:
        b = e.get("args", {}).get("bytes")
        return int(b) if b is not None else None

    host = lambda name: lambda e: e.get("name") == name and e.get("cat") == "user_annotation"  # noqa: E731
    calls, waits = pick(host(CALL)), pick(host(HOST_WAIT))  # not the GPU-side copies of the annotations
    driver = pick(lambda e: e.get("cat") == "cuda_driver" and e.get("name") == "cuMemcpyAsync")
    if len(driver) == len(calls):  # the driver's own record of the call: no annotation overhead
        calls = driver
    copies = pick(lambda e: e.get("cat") == "gpu_memcpy" and nbytes_of(e) == nbytes)
    memsets = pick(lambda e: e.get("cat") == "gpu_memset" and nbytes_of(e) == 4
                   and int(e.get("args", {}).get("device", dst_gpu)) == dst_gpu)
    return calls, copies, memsets, waits


def _enable_peer_access(a: int, b: int) -> None:
    from cuda.bindings import runtime

    for dev, peer in ((a, b), (b, a)):
        with torch.cuda.device(dev):
            err = runtime.cudaDeviceEnablePeerAccess(peer, 0)[0]
            if err not in (runtime.cudaError_t.cudaSuccess, runtime.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
                raise RuntimeError(f"cudaDeviceEnablePeerAccess({dev} -> {peer}) failed: {err}")


def run_breakdown(sizes: list[int], transfers: int = 30, warmup: int = 5, src: int = 0,
                  dst: Optional[int] = None) -> list[dict]:
    from cuda.bindings import driver as drv
    from torch.profiler import ProfilerActivity, profile, record_function

    from dmacoll.lab_api import check_driver

    if dst is None:
        dst = 1 if torch.cuda.device_count() > 1 else 0
    link = "local" if src == dst else "peer"
    if link == "peer":
        _enable_peer_access(src, dst)
    torch.cuda.set_device(src)
    a = torch.empty(max(sizes), dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(max(sizes), dtype=torch.uint8, device=f"cuda:{dst}")
    flag = torch.zeros(1, dtype=torch.int32, device=f"cuda:{dst}")
    marker = torch.zeros(1, dtype=torch.int32, device=f"cuda:{dst}")
    gate = torch.zeros(1, dtype=torch.int32, device=f"cuda:{src}")
    s_src, s_dst, s_release = torch.cuda.Stream(src), torch.cuda.Stream(dst), torch.cuda.Stream(src)
    geq = drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    seq = 0

    def transfer(n: int, held: bool) -> None:
        nonlocal seq
        seq += 1
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        if held:  # the sender stream waits until everything below is queued
            check_driver(drv.cuStreamWaitValue32(s_src.cuda_stream, gate.data_ptr(), seq, geq), "cuStreamWaitValue32")
        check_driver(drv.cuStreamWaitValue32(s_dst.cuda_stream, flag.data_ptr(), seq, geq), "cuStreamWaitValue32")
        check_driver(drv.cuMemsetD32Async(marker.data_ptr(), seq, 1, s_dst.cuda_stream), "cuMemsetD32Async")
        done = torch.cuda.Event()
        with record_function(CALL):
            check_driver(drv.cuMemcpyAsync(b.data_ptr(), a.data_ptr(), n, s_src.cuda_stream), "cuMemcpyAsync")
        done.record(s_src)
        check_driver(drv.cuStreamWriteValue32(s_src.cuda_stream, flag.data_ptr(), seq, 0), "cuStreamWriteValue32")
        if held:
            check_driver(drv.cuStreamWriteValue32(s_release.cuda_stream, gate.data_ptr(), seq, 0),
                         "cuStreamWriteValue32")
        with record_function(HOST_WAIT):
            while not done.query():
                pass
        torch.cuda.synchronize(dst)

    def profiled(n: int, held: bool) -> dict:
        for _ in range(warmup):
            transfer(n, held)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(transfers):
                transfer(n, held)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                return phases(*trace_events(json.load(f), n, dst))

    rows = []
    for n in sizes:
        idle, held = profiled(n, False), profiled(n, True)
        samples = {p: (held if p in ("sync", "host_sync") else idle)[p] for p in PHASES}
        for phase in PHASES:
            rows.append({"src_gpu": src, "dst_gpu": dst, "link": link, "bytes": n, "phase": phase,
                         **summarize(samples[phase]), "samples": len(samples[phase])})
        med = {r["phase"]: r["time_us"] for r in rows[-len(PHASES):]}
        print(f"{n:>10} B  " + "  ".join(f"{p} {med[p]:8.2f}" for p in PHASES) + "  us", flush=True)
    return rows
