"""The processes of `dmacoll probe crossing`: per placement one child holding both sides (streams, peer) or one
per side (ipc), each reporting every pair as soon as it is measured. The parent does no GPU work; it stops the
children when one dies, fails, or reports nothing past a deadline, and keeps what they had reported."""
from __future__ import annotations

import os
import queue
import sys
import tempfile
import time
import traceback

from . import crossing_legs
from .crossing_device import PAGE_BYTES, run_deadline_s

STARTUP_S = 300.0  # the first report: torch, CUDA, NVRTC and the baseline


def processes(placement: str) -> list[tuple[int, ...]]:
    """The sides each process of a placement holds."""
    return [(0,), (1,)] if placement == "ipc" else [(0, 1)]


def devices(placement: str) -> tuple[int, int]:
    """Side 0's and side 1's GPU."""
    return (0, 1) if placement == "peer" else (0, 0)


def order(pairs: list[crossing_legs.Pair]) -> list[crossing_legs.Pair]:
    """What every process measures, in order: per mode its baseline, then its pairs."""
    modes = dict.fromkeys(p.mode for p in pairs)
    return [x for m in modes for x in [crossing_legs.baseline(m)] + [p for p in pairs if p.mode == m]]


def reports_expected(placement: str, pair: crossing_legs.Pair) -> int:
    """How many processes report a pair: all of them, but the baseline only side 0's."""
    return 1 if pair.send == "none" else len(processes(placement))


def pair_deadline_s(cfg: dict) -> float:
    """How long the parent waits for the next report after one: every run of a pair at its deadline, and slack."""
    return (cfg["repeats"] + 1) * (run_deadline_s(cfg) + 30) + 60


def measure_placement(placement: str, pairs: list[crossing_legs.Pair], cfg: dict) -> tuple[dict, str]:
    """(Pair -> Measured for every pair all its processes reported, why the processes stopped early or '')."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    fd, page = tempfile.mkstemp(prefix="dmacoll-crossing-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, PAGE_BYTES)
        os.close(fd)
        groups = processes(placement)
        results = ctx.Queue()
        barrier = ctx.Barrier(len(groups)) if len(groups) > 1 else None
        exchange = (ctx.Queue(), ctx.Queue()) if len(groups) > 1 else None
        procs = [ctx.Process(target=child, args=(placement, here, cfg, pairs, page, barrier, exchange, results),
                             daemon=True) for here in groups]
        for p in procs:
            p.start()
        reports, stopped = collect(procs, results, pair_deadline_s(cfg))
    finally:
        os.unlink(page)
    got = {pair: crossing_legs.merge(parts) for pair, parts in reports.items()
           if len(parts) == reports_expected(placement, pair)}
    return got, stopped


def collect(procs: list, results, pair_deadline: float) -> tuple[dict, str]:
    """The children's reports (Pair -> [Measured]) until all are done, or why they were stopped."""
    reports: dict = {}
    done: set[int] = set()
    stopped = ""
    deadline = time.monotonic() + STARTUP_S
    while len(done) < len(procs) and not stopped:
        try:
            kind, who, pair, value = results.get(timeout=1.0)
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                stopped = f"process {dead[0]} exited with code {procs[dead[0]].exitcode}"
            elif time.monotonic() > deadline:
                stopped = "no report before the deadline"
            continue
        if kind == "pair":
            reports.setdefault(pair, []).append(value)
            deadline = time.monotonic() + pair_deadline
        elif kind == "done":
            done.add(who)
        else:  # fatal: its traceback goes to the log, its first line into the rows
            print(f"crossing: process {who}: {value}", file=sys.stderr, flush=True)
            stopped = value.splitlines()[0][:300]
    for p in procs:
        p.join(timeout=0.1 if stopped else 30)
        if p.is_alive():
            p.kill()
            p.join()
    return reports, stopped


def child(placement: str, here: tuple, cfg: dict, pairs: list, page_path: str, barrier, exchange, results) -> None:
    """One process of a placement: its sides, connected to the other's, measure every pair in ``order``."""
    me = here[0] if len(here) == 1 else 0
    try:
        import torch
        import torch.multiprocessing  # noqa: F401  (CUDA tensors over the exchange queues go by CUDA IPC)

        from .crossing_device import Link, Page, Runner, gpu_side, load_kernels

        dev = devices(placement)
        kernels = {d: load_kernels(d) for d in sorted({dev[i] for i in here})}
        if len(set(dev)) > 1:
            enable_peer_access(*dev)
        torch.cuda.set_device(dev[here[0]])
        page = Page(page_path)
        sides = {i: gpu_side(i, dev[i], cfg, page, kernels[dev[i]]) for i in here}
        if exchange is None:
            sides[0].connect(*sides[1].shared(), other=1)
            sides[1].connect(*sides[0].shared(), other=0)
        else:
            exchange[me].put(sides[me].shared())
            sides[me].connect(*exchange[1 - me].get(timeout=STARTUP_S), other=1 - me)
        torch.cuda.set_device(dev[here[0]])
        link = Link(barrier, page, me, timeout_s=pair_deadline_s(cfg))
        runner = Runner(sides, link, page, cfg)
        for pair in order(pairs):
            if reports_expected(placement, pair) == 1 and 0 not in here:
                continue  # the baseline: side 0's process alone
            results.put(("pair", me, pair, runner.measure(pair)))
        for s in sides.values():
            s.disconnect()
        link.step()  # neither process exits while the other still maps its memory
        results.put(("done", me, None, None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which stops the placement
        results.put(("fatal", me, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def enable_peer_access(a: int, b: int) -> None:
    """Each of GPUs a and b maps the other's memory (kernels and stream memops into it need this)."""
    import torch
    from cuda.bindings import runtime

    if not torch.cuda.can_device_access_peer(a, b):
        raise RuntimeError(f"GPUs {a} and {b} cannot access each other's memory")
    for dev, other in ((a, b), (b, a)):
        torch.cuda.set_device(dev)
        err = runtime.cudaDeviceEnablePeerAccess(other, 0)[0]
        if err not in (runtime.cudaError_t.cudaSuccess, runtime.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
            raise RuntimeError(f"cudaDeviceEnablePeerAccess({other}) on GPU {dev}: {err}")
