"""What does each way of issuing an eager call's copies cost per call? (one GPU)

An eager dmacoll call is host-bound at small sizes: its time is what the host spends issuing commands. This
times ``k`` device-local copies of ``--bytes`` each (k = 1, 2, 3, 4, 8), issued four ways on a created stream and
on the legacy default stream:

* ``cuMemcpyAsync``: one driver call per copy from Python (cuda-bindings), what the cuda backend does below
  ``BATCH_MIN_COPIES`` copies;
* ``cuMemcpyBatchAsync``: one batch call from Python (source read in stream order), what it does from there
  (the legacy stream refuses batches: that row records the driver's answer);
* ``native``: the C submission library issuing k ``cuMemcpyAsync`` in one foreign call (``submit='native'``; built
  on first use if missing);
* ``torch``: ``dst.copy_(src)`` k times, for reference.

Per way and k: the host time of one submission (``host_us``: median, p10, p90 of ``--repeats``, the stream
drained every 50), and ``per_call_us``: ``--calls`` submissions back to back between two CUDA events on the
stream, divided by the calls (host-bound: the rate at which the host feeds the GPU). ``correct``: every
destination holds its source afterwards.

Usage: dmacoll probe submit_cost [--bytes 4K] [--repeats 300] [--calls 200] [--out CSV]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from .common import Table, add_repeats, count, driver, size_multiple_of

NAME = "submit_cost"
HELP = "host cost per call of k copies: driver calls from Python, one batch call, the native library, torch (1 GPU)"
GPUS = 1
COLUMNS = ["way", "stream", "copies", "bytes", "host_us", "host_us_p10", "host_us_p90", "per_call_us", "correct",
           "error"]
EXTRA: dict[str, list[str]] = {}
KS = (1, 2, 3, 4, 8)
WAYS = ("cuMemcpyAsync", "cuMemcpyBatchAsync", "native", "torch")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bytes", type=size_multiple_of(16), default=4096, help="bytes per copy (default 4K)")
    add_repeats(p, 300, "host-time samples per way and k")
    p.add_argument("--calls", type=count, default=200, help="submissions timed back to back by events (default 200)")


def row(way: str, stream: str, k: int, nbytes: int, host_samples: list[float], per_call_us: float, correct: bool,
        error: str = "") -> dict:
    """One way at one k: host-time quantiles from its samples (us), the event-timed per-call time."""
    s = sorted(host_samples) or [float("nan")]
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731 - nearest-rank quantile
    return {"way": way, "stream": stream, "copies": k, "bytes": nbytes,
            "host_us": statistics.median(s) if host_samples else float("nan"), "host_us_p10": q(0.1),
            "host_us_p90": q(0.9), "per_call_us": per_call_us, "correct": correct, "error": error}


def savings(rows: list[dict]) -> list[str]:
    """What the log ends with: per stream and k, each way's host time against one cuMemcpyAsync per copy."""
    base = {(r["stream"], r["copies"]): r["host_us"] for r in rows if r["way"] == "cuMemcpyAsync"}
    lines = []
    for r in rows:
        ref = base.get((r["stream"], r["copies"]))
        if r["way"] != "cuMemcpyAsync" and ref and not r["error"]:
            lines.append(f"{r['stream']:8s} k={r['copies']}: {r['way']:18s} {r['host_us']:7.2f} us vs "
                         f"{ref:7.2f} us ({ref - r['host_us']:+.2f} us saved per call)")
    return lines


def run(args: argparse.Namespace) -> dict[str, Table]:
    import torch

    from dmacoll.lab_api import bench_time, memcpy_batch, native

    drv = driver()
    lib = native.load(native.ensure_built())
    api = native.driver_api()
    n, kmax = args.bytes, max(KS)
    src = torch.randint(0, 255, (kmax * n,), dtype=torch.uint8, device=0)
    dst = torch.empty_like(src)
    attrs = drv.CUmemcpyAttributes()
    attrs.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    streams = {"created": torch.cuda.Stream(), "legacy": torch.cuda.default_stream()}
    rows = []
    for sname, stream in streams.items():
        handle = stream.cuda_stream
        for k in KS:
            dsts = [dst.data_ptr() + j * n for j in range(k)]
            srcs = [src.data_ptr() + j * n for j in range(k)]
            cmds = (native.Cmd * k)(*(native.Cmd(kind=native.COPY, stream=handle or None, dst=d, src=s_, nbytes=n)
                                      for d, s_ in zip(dsts, srcs)))
            failed = ctypes.c_int(-1)

            def submit_loop():
                for d, s_ in zip(dsts, srcs):
                    drv.cuMemcpyAsync(d, s_, n, handle)
                return 0

            def submit_torch():
                for j in range(k):
                    dst[j * n:(j + 1) * n].copy_(src[j * n:(j + 1) * n])
                return 0

            ways = {"cuMemcpyAsync": submit_loop,
                    "cuMemcpyBatchAsync": lambda: int(memcpy_batch(drv, dsts, srcs, [n] * k, attrs, handle)),
                    "native": lambda: lib.dmacoll_submit(ctypes.byref(api), cmds, k, 0, ctypes.byref(failed)),
                    "torch": submit_torch}
            for way in WAYS:
                dst.zero_()
                torch.cuda.synchronize()
                with torch.cuda.stream(stream):
                    rc = ways[way]()
                if rc:
                    stream.synchronize()
                    rows.append(row(way, sname, k, n, [], float("nan"), False, f"driver result {rc}"))
                    continue
                # the host's cost of one submission: the host clock around each (not the timing loop, which
                # times the device's work)
                samples = []
                with torch.cuda.stream(stream):
                    for i in range(args.repeats):
                        t0 = time.perf_counter()
                        ways[way]()
                        samples.append((time.perf_counter() - t0) * 1e6)
                        if i % 50 == 49:
                            stream.synchronize()
                per_call = bench_time(ways[way], args.calls, warmup=0, stream=stream).samples[0]
                correct = bool(torch.equal(dst[: k * n], src[: k * n]))
                rows.append(row(way, sname, k, n, samples, per_call, correct))
                r = rows[-1]
                print(f"{sname:8s} k={k} {way:18s} host {r['host_us']:7.2f} us (p10 {r['host_us_p10']:.2f}, p90 "
                      f"{r['host_us_p90']:.2f}), {r['per_call_us']:7.2f} us per call back to back"
                      f"{'' if correct else '  WRONG'}", flush=True)
    for line in savings(rows):
        print(line, flush=True)
    config = {"bytes": n, "repeats": args.repeats, "calls": args.calls, "ks": list(KS),
              "native_library": str(native.ensure_built())}
    return {NAME: Table(rows, config)}
