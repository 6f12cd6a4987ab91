"""The GPU part of `dmacoll probe crossing`: the kernels, the sides one process holds, and their runs.

A ``Side`` is one end of the ping-pong: its device and stream, its inbox (a flag word, the data, a status word per
leg), its leg data and the values its copy sends read, and the other side's addresses (tensors of the same process,
or CUDA IPC imports). A ``Runner`` makes every run of a pair for the sides of its process; a ``Link`` keeps the two
processes of an ipc placement in step (barriers, a vote in the shared host page). The pure parts (which side does
what on each leg, the counts, the rows) are in ``crossing``; the processes in ``crossing_launch``.
"""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import time
from typing import NamedTuple

from . import crossing_legs
from .common import checked, driver, nvrtc_functions

SOURCE = r"""
#define OK 1
#define WRONG 2
#define TIMED_OUT 3

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// 1 once *flag >= value, 0 if timeout_ns pass first: a wait never holds the GPU for good
__device__ int poll(const unsigned int* flag, unsigned int value, unsigned long long timeout_ns) {
    const unsigned long long start = now_ns();
    while (load_acquire(flag) < value)
        if (now_ns() - start > timeout_ns) return 0;
    return 1;
}

// the send: the data copy before it on the stream has completed; fence it system-wide, then store the flag
extern "C" __global__ void send_flag(unsigned int* flag, unsigned int value) {
    __threadfence_system();
    *(volatile unsigned int*)flag = value;
}

// the spin wait: one thread polls, no sleep; a timeout marks the leg for the consumer after it
extern "C" __global__ void spin_wait(const unsigned int* flag, unsigned int value, unsigned long long timeout_ns,
                                     int* status) {
    if (!poll(flag, value, timeout_ns)) *status = TIMED_OUT;
}

// the consumer: one block reads every word of the leg's data (word w is first + w) and writes the leg's status;
// given a flag it first polls it itself (the folded wait: thread 0 acquires, the barrier orders the block's reads)
extern "C" __global__ void consume(const unsigned int* data, unsigned int words, unsigned int first, int* status,
                                   const unsigned int* flag, unsigned int value, unsigned long long timeout_ns) {
    __shared__ int arrived;
    if (threadIdx.x == 0) arrived = flag == 0 ? 1 : poll(flag, value, timeout_ns);
    __syncthreads();
    int ok = 1;
    for (unsigned int w = threadIdx.x; w < words; w += blockDim.x)
        ok &= ((const volatile unsigned int*)data)[w] == first + w;
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0) *status = (!arrived || *status == TIMED_OUT) ? TIMED_OUT : ok ? OK : WRONG;
}
"""
P, U32, U64 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong
KERNELS = {"send_flag": (1, (P, U32)), "spin_wait": (1, (P, U32, U64, P)),  # name -> (threads, argument types)
           "consume": (256, (P, U32, U32, P, P, U32, U64))}

# the shared host page: int32 word indices, each on its own 64-byte line
PAGE_BYTES = 4096
GATE = 0
HOST_FLAG = (16, 32)  # side 0's, side 1's: what a host wait polls
VOTE = (48, 64)  # each process's vote in Link.agree
HOST_TIMEOUT_MIN_S = 1.0
RELEASED = 0x7FFFFFFF  # a flag value every wait of a run accepts (GEQ, also cyclic): how a stalled side is freed


class Kernel:
    """One loaded kernel, launched as one block on a stream; each distinct argument tuple is packed once, so a
    launch on the host-wait path is one driver call."""

    def __init__(self, fn, threads: int, types: tuple):
        self.fn, self.threads, self.types = fn, threads, types
        self.drv = driver()
        self._packed: dict[tuple, tuple] = {}

    def params(self, args: tuple) -> int:
        packed = self._packed.get(args)
        if packed is None:
            holders = [t(a) for t, a in zip(self.types, args)]
            array = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
            packed = self._packed[args] = (ctypes.addressof(array), holders, array)
        return packed[0]

    def __call__(self, stream: int, *args) -> None:
        checked(self.drv.cuLaunchKernel(self.fn, 1, 1, 1, self.threads, 1, 1, 0, stream, self.params(args), 0),
                "cuLaunchKernel")


def load_kernels(device: int) -> dict[str, Kernel]:
    """The kernels, compiled for ``device``'s architecture and loaded into its context (current on return)."""
    import torch

    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # its context exists and is current
    major, minor = torch.cuda.get_device_capability(device)
    fns = nvrtc_functions(SOURCE, "crossing.cu", f"sm_{major}{minor}", tuple(KERNELS))
    return {name: Kernel(fns[name], *KERNELS[name]) for name in KERNELS}


class Page:
    """The host page every process of a placement maps (a /dev/shm file) and registers pinned and mapped, as NCCL
    registers its shared host memory: the gate, the host flags, the votes. Words read and written by the CPU here
    are read from memory each time (a memoryview, no caching)."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, PAGE_BYTES)
        finally:
            os.close(fd)
        self.words = memoryview(self.map).cast("i")
        self.host = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        drv = driver()
        flags = drv.CU_MEMHOSTREGISTER_PORTABLE | drv.CU_MEMHOSTREGISTER_DEVICEMAP  # every context, mapped
        checked(drv.cuMemHostRegister(self.host, PAGE_BYTES, flags), "cuMemHostRegister")
        self.device = int(checked(drv.cuMemHostGetDevicePointer(self.host, 0), "cuMemHostGetDevicePointer"))

    def ptr(self, word: int) -> int:
        return self.device + 4 * word


class Link:
    """Keeps the processes of an ipc placement in step (``barrier`` None: one process holds both sides, nothing to
    keep in step)."""

    def __init__(self, barrier, page: Page, me: int, timeout_s: float):
        self.barrier, self.page, self.me, self.timeout_s = barrier, page, me, timeout_s

    def step(self) -> None:
        if self.barrier is not None:
            self.barrier.wait(self.timeout_s)

    def agree(self, ok: bool) -> bool:
        """True when every process says ``ok``."""
        if self.barrier is None:
            return ok
        self.page.words[VOTE[self.me]] = 1 if ok else 2
        self.step()
        votes = [self.page.words[v] for v in VOTE]
        self.step()  # nobody votes again before both have read
        return all(v == 1 for v in votes)


class Inbox(NamedTuple):
    flag: object  # int32 words, [0] the flag a device wait polls
    data: object  # the inbox: the leg's data lands here
    status: object  # a word per leg, written by its consumer (crossing_legs.STATUS)
    src: object  # row i: leg i's data (word w = (i + 1) * words + w), what this side sends
    values: object  # value v at index v: what a copy send reads


def make_inbox(legs: int, words: int, device) -> Inbox:
    import torch

    def zeros(n: int):
        return torch.zeros(n, dtype=torch.int32, device=device)

    first = torch.arange(1, legs + 1, dtype=torch.int64)[:, None] * words
    return Inbox(zeros(32), zeros(words), zeros(legs), (first + torch.arange(words)).to(torch.int32).to(device),
                 torch.arange(legs + 2, dtype=torch.int32, device=device))


class Side:
    """One end of the ping-pong (see the module docstring); ``connect`` gives it the other side's addresses.
    ``stream`` / ``release_stream``: anything with a ``cuda_stream`` handle (torch streams on a GPU)."""

    def __init__(self, index: int, device, inbox: Inbox, stream, release_stream, cfg: dict, page,
                 kernels: dict[str, Kernel]):
        self.index, self.device, self.page, self.k = index, device, page, kernels
        self.flag, self.data, self.status, self.src, self.values = inbox
        # addresses and the driver looked up once: the host-wait path issues these calls between polls
        self.flag_ptr, self.data_ptr, self.status_ptr, self.src_ptr, self.values_ptr = (t.data_ptr() for t in inbox)
        self.drv = driver()
        self.geq = self.drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        self.stream, self.release_stream = stream, release_stream
        self.handle = stream.cuda_stream
        self.nbytes = cfg["bytes"]
        self.words = self.nbytes // 4
        self.timeout_ns = int(cfg["wait_timeout_ms"] * 1e6)
        self.host_word = HOST_FLAG[index]
        self.to_flag = self.to_data = self.to_src = self.to_host_flag = 0
        self._imports: tuple = ()

    def shared(self) -> tuple:
        """What the other side needs: this side's flag, inbox data and leg data."""
        return self.flag, self.data, self.src

    def connect(self, flag, data, src, other: int) -> None:
        self.to_flag, self.to_data, self.to_src = flag.data_ptr(), data.data_ptr(), src.data_ptr()
        self.to_host_flag = self.page.ptr(HOST_FLAG[other])
        self._imports = (flag, data, src)  # kept alive while in use (CUDA IPC imports in an ipc placement)

    def disconnect(self) -> None:
        self._imports = ()

    # -- what a run queues --------------------------------------------------------------------------------------
    def copy(self, leg: int) -> None:
        """Leg ``leg``'s data into the other side's inbox."""
        checked(self.drv.cuMemcpyAsync(self.to_data, self.src_ptr + leg * self.nbytes, self.nbytes, self.handle),
                "data copy")

    def pull(self, leg: int) -> None:
        """The baseline's copy: the other side's leg data into this side's inbox, on this side's stream."""
        checked(self.drv.cuMemcpyAsync(self.data_ptr, self.to_src + leg * self.nbytes, self.nbytes, self.handle),
                "baseline copy")

    def signal(self, send: str, leg: int, to_host: bool) -> None:
        """Leg ``leg`` sent: the other side's flag (its host flag for a host wait) set to leg + 1."""
        target, value = (self.to_host_flag if to_host else self.to_flag), leg + 1
        if send == "memop":
            checked(self.drv.cuStreamWriteValue32(self.handle, target, value, 0), "cuStreamWriteValue32")
        elif send == "copy":
            checked(self.drv.cuMemcpyAsync(target, self.values_ptr + 4 * value, 4, self.handle), "flag copy")
        else:
            self.k["send_flag"](self.handle, target, value)

    def wait(self, way: str, leg: int) -> None:
        if way == "memop":
            self.wait_value(self.flag_ptr, leg + 1)
        else:
            self.k["spin_wait"](self.handle, self.flag_ptr, leg + 1, self.timeout_ns, self.status_ptr + 4 * leg)

    def wait_value(self, addr: int, value: int) -> None:
        checked(self.drv.cuStreamWaitValue32(self.handle, addr, value, self.geq), "cuStreamWaitValue32")

    def consume(self, leg: int, polls: bool) -> None:
        self.k["consume"](self.handle, self.data_ptr, self.words, (leg + 1) * self.words, self.status_ptr + 4 * leg,
                          self.flag_ptr if polls else 0, leg + 1, self.timeout_ns)

    def queue(self, pair: crossing_legs.Pair, legs: int) -> None:
        """This side's half of a gated run (every wait but the host's), as ``crossing_legs.half`` orders it."""
        for op, leg in crossing_legs.half(self.index, pair.wait, legs):
            if op == "copy":
                self.copy(leg)
            elif op == "signal":
                self.signal(pair.send, leg, to_host=False)
            elif op == "wait":
                self.wait(pair.wait, leg)
            else:
                self.consume(leg, polls=pair.wait == "fold")

    def queue_baseline(self, legs: int) -> None:
        for leg in range(legs):
            self.pull(leg)
            self.consume(leg, polls=False)

    # -- between runs -------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero this side's inbox and host flag (the GPU idle here)."""
        import torch

        with torch.cuda.device(self.device):
            for t in (self.flag, self.data, self.status):
                t.zero_()
            torch.cuda.synchronize(self.device)
        self.page.words[self.host_word] = 0

    def release(self) -> None:
        """Free this side's waits in a run that stalled: its flags set to a value every wait accepts (from a stream
        of its own), and the gate opened."""
        checked(self.drv.cuMemsetD32Async(self.flag_ptr, RELEASED, 1, self.release_stream.cuda_stream),
                "cuMemsetD32Async")
        self.page.words[self.host_word] = RELEASED
        self.page.words[GATE] = 1


def gpu_side(index: int, device: int, cfg: dict, page: Page, kernels: dict[str, Kernel]) -> Side:
    """A side on GPU ``device``: its inbox there, its stream and a stream to release it from."""
    import torch

    with torch.cuda.device(device):
        inbox = make_inbox(cfg["legs"], cfg["bytes"] // 4, device)
        return Side(index, device, inbox, torch.cuda.Stream(device), torch.cuda.Stream(device), cfg, page, kernels)


def drive_host_legs(sides: dict[int, Side], pair: crossing_legs.Pair, legs: int, poll, on) -> bool:
    """The CPU's part of a host-wait run for the sides of this process: leg 0 sent (side 0's process), then per
    arriving leg (``crossing_legs.host_legs``) ``poll(host word, value)``, the consumer launched and the next leg's copy
    and send queued. False when a poll gave up (the legs after it are never sent)."""
    if 0 in sides:
        with on(sides[0]):
            sides[0].copy(0)
            sides[0].signal(pair.send, 0, to_host=True)
    for leg in crossing_legs.host_legs(sides, legs):
        y = sides[crossing_legs.receiver(leg)]
        if not poll(y.host_word, leg + 1):
            return False
        with on(y):
            y.consume(leg, polls=False)
            if leg + 1 < legs:
                y.copy(leg + 1)
                y.signal(pair.send, leg + 1, to_host=True)
    return True


class Stuck(RuntimeError):
    """A side's stream did not finish even after its waits were released."""


class Runner:
    """Every run of a pair for the sides this process holds (``sides``: index -> Side)."""

    def __init__(self, sides: dict[int, Side], link: Link, page: Page, cfg: dict):
        self.sides, self.link, self.page, self.cfg = sides, link, page, cfg
        self.legs = cfg["legs"]
        # a host poll gives up later than a GPU wait: a give-up ends the pair, and a CPU can be descheduled for a while
        self.host_timeout_s = max(cfg["wait_timeout_ms"] / 1e3, HOST_TIMEOUT_MIN_S)
        self.run_deadline_s = run_deadline_s(cfg)
        self.one_device = len({s.device for s in sides.values()}) == 1
        self._trials: dict[tuple, str] = {}

    def on(self, side: Side):
        import torch

        return contextlib.nullcontext() if self.one_device else torch.cuda.device(side.device)

    def agree(self, ok: bool, solo: bool) -> bool:
        return ok if solo else self.link.agree(ok)

    # -- one pair -------------------------------------------------------------------------------------------------
    def measure(self, pair: crossing_legs.Pair) -> crossing_legs.Measured:
        """The pair's warm-up and ``repeats`` timed runs (the baseline's when its send is none; on side 0 alone).
        A run with timeouts or a failure ends the pair with no times and a note."""
        solo = pair.send == "none"
        if not solo:
            refused = self.trial(pair.send, to_host=pair.wait == "host")
            if refused:
                return crossing_legs.Measured([], {}, 0, refused)
        graphs, failed = None, ""
        if pair.mode == "graph":
            try:
                graphs = self.capture(pair, solo)
            except RuntimeError as e:
                failed = f"capture failed: {e}"
            if not self.agree(not failed, solo):
                return crossing_legs.Measured([], {}, 0, failed)
        totals, total_counts, runs = [], {}, 0
        for r in range(1 + self.cfg["repeats"]):
            if pair.wait == "host":
                total, run_counts, note = self.host_run(pair)
            else:
                total, run_counts, note = self.gated_run(pair, graphs, solo)
            runs += 1
            total_counts = {k: total_counts.get(k, 0) + v for k, v in run_counts.items()}
            if not note and run_counts["timeout"]:
                note = f"waits timed out (after {self.cfg['wait_timeout_ms']:g} ms)"
            if not self.agree(not note, solo):
                return crossing_legs.Measured([], total_counts, runs, note)
            if r > 0 and total is not None:
                totals.append(total)
        return crossing_legs.Measured(totals, total_counts, runs, "")

    def trial(self, send: str, to_host: bool) -> str:
        """Why ``send`` cannot reach the other side's flag ('' when it can): each side sends once, each checks that
        it arrived, every process agrees. Once per send and flag kind."""
        import torch

        key = (send, to_host)
        if key not in self._trials:
            for s in self.sides.values():
                s.reset()
            self.link.step()
            why = ""
            for s in self.sides.values():
                try:
                    with self.on(s):
                        s.signal(send, self.legs, to_host)  # value legs + 1: no leg's
                    torch.cuda.synchronize(s.device)
                except RuntimeError as e:
                    why = why or f"{send} send refused: {e}"
            self.link.step()
            for s in self.sides.values():
                got = self.page.words[s.host_word] if to_host else int(s.flag[0].item())
                if got != self.legs + 1 and not why:
                    why = f"a {send} send into the other side's {'host' if to_host else 'device'} flag did not arrive"
            ok = self.link.agree(not why)
            self._trials[key] = why or ("" if ok else f"the other side's {send} send failed its trial")
        return self._trials[key]

    def capture(self, pair: crossing_legs.Pair, solo: bool) -> dict:
        """Each side's half (the baseline: side 0's legs) captured once as a CUDA graph on its stream."""
        import torch

        from dmacoll.lab_api import graph_capture

        graphs = {}
        for s in self.solo_or_all(solo):
            g = torch.cuda.CUDAGraph()
            with self.on(s), graph_capture(g, s.stream):
                if solo:
                    s.queue_baseline(self.legs)
                else:
                    s.queue(pair, self.legs)
            graphs[s.index] = g
        return graphs

    def solo_or_all(self, solo: bool) -> list[Side]:
        return [self.sides[0]] if solo else list(self.sides.values())

    # -- one run --------------------------------------------------------------------------------------------------
    def gated_run(self, pair: crossing_legs.Pair, graphs, solo: bool) -> tuple:
        """Both halves (or the baseline) queued behind the gate, then released at once: (side 0's total in us or
        None, the status counts, a note). Its own events, not the timing loop's: the start waits behind the gate,
        and a side that never finishes must end in a timeout, not a hang."""
        import torch

        sides = self.solo_or_all(solo)
        for s in sides:
            s.reset()
        if 0 in self.sides:
            self.page.words[GATE] = 0
        if not solo:
            self.link.step()
        start, done, failed = torch.cuda.Event(enable_timing=True), {}, ""
        for s in sides:
            with self.on(s):
                try:
                    s.wait_value(self.page.ptr(GATE), 1)
                    if s.index == 0:
                        start.record(s.stream)
                    if graphs is not None:
                        with torch.cuda.stream(s.stream):
                            graphs[s.index].replay()
                    elif solo:
                        s.queue_baseline(self.legs)
                    else:
                        s.queue(pair, self.legs)
                except RuntimeError as e:  # what was queued still runs; the other side is released if it stalls
                    failed = failed or f"queueing failed: {e}"
                done[s.index] = torch.cuda.Event(enable_timing=s.index == 0)
                done[s.index].record(s.stream)
        if not solo:
            self.link.step()
        if 0 in self.sides:
            self.page.words[GATE] = 1
        return self.finish(start, done, failed, solo, host_timeouts=0)

    def host_run(self, pair: crossing_legs.Pair) -> tuple:
        """The CPU drives the legs: it polls each arriving leg's host flag, launches the consumer, and queues the
        next leg's copy and send (leg 0 is queued by side 0's process); no gate."""
        import torch

        for s in self.sides.values():
            s.reset()
        self.link.step()
        start, done, failed, timeouts = torch.cuda.Event(enable_timing=True), {}, "", 0
        try:
            if 0 in self.sides:
                with self.on(self.sides[0]):
                    start.record(self.sides[0].stream)
            if not drive_host_legs(self.sides, pair, self.legs, self.poll, self.on):
                timeouts = 1  # the chain is broken there: the legs after it are counted missing
        except RuntimeError as e:
            failed = f"queueing failed: {e}"
        for s in self.sides.values():
            with self.on(s):
                done[s.index] = torch.cuda.Event(enable_timing=s.index == 0)
                done[s.index].record(s.stream)
        return self.finish(start, done, failed, solo=False, host_timeouts=timeouts)

    def poll(self, word: int, value: int) -> bool:
        """The CPU spins on a host flag until it reaches ``value`` (True) or the host timeout passes (False)."""
        words = self.page.words
        deadline = time.perf_counter() + self.host_timeout_s
        while words[word] < value:
            if time.perf_counter() > deadline:
                return False
        return True

    def finish(self, start, done: dict, failed: str, solo: bool, host_timeouts: int) -> tuple:
        """Wait for this process's streams (a side still running at the deadline has its waits released), then
        read the status words: (side 0's total us or None, counts, note)."""
        stalled = self.wait_for(done, self.run_deadline_s)
        if stalled:
            for i in stalled:
                with self.on(self.sides[i]):
                    self.sides[i].release()
            if self.wait_for(done, 30.0):
                raise Stuck(f"sides {stalled} did not finish even with their waits released")
            failed = failed or (f"sides {stalled} did not finish within {self.run_deadline_s:.0f} s (released)")
        run_counts = {name: 0 for name in crossing_legs.STATUS.values()}
        for s in self.solo_or_all(solo):
            c = crossing_legs.counts(s.status.tolist(), None if solo else s.index, self.legs)
            run_counts = {k: run_counts[k] + c[k] for k in run_counts}
        run_counts["timeout"] += host_timeouts
        run_counts["missing"] -= host_timeouts
        total = start.elapsed_time(done[0]) * 1e3 if 0 in done and not failed else None
        return total, run_counts, failed

    @staticmethod
    def wait_for(done: dict, seconds: float) -> list[int]:
        """The sides whose completion event has not fired after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            pending = [i for i, e in done.items() if not e.query()]
            if not pending or time.monotonic() > deadline:
                return pending
            time.sleep(20e-6)


def run_deadline_s(cfg: dict) -> float:
    """How long a run may take before its stalled sides are released: every wait timing out twice over, and 10 s."""
    return 2 * cfg["legs"] * cfg["wait_timeout_ms"] / 1e3 + 10
