"""Host emulator: executes the same plans on the CPU, one OS process per rank.

Device memory is a shared-memory file per rank that every rank maps (the
symmetric heap); flags are 32-bit words at its start; engines (queues) are
worker threads. A signal is a store to the peer's flag word; a wait polls the
own word, with the same value semantics as the CUDA stream memory operations.
Copies are ``torch`` copies between shared mappings; reductions a ``torch.sum``
on the CPU. Ordering relies on x86's total store order: the data stores of a
copy become visible before the later flag store (the CUDA backend gets the same from the memory barrier that
``cuStreamWriteValue32`` issues by default).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from ..errors import BackendUnavailable, DmaCollTimeoutError
from ..executor import Folded, MemOp, gate_index, gate_ops, one_index
from ..options import EngineCapabilities
from ..plan import NUM_PHASES, Copy, Reduce, Ref
from . import sym_offset
from .reduce import reduce_operands, sum_slots

PHASE_NAMES = ("READY", "DONE", "DONE")


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class HostEngine:
    """Symmetric heap in shared memory plus engine threads for one rank."""

    name = "host"
    # no graphs on the CPU (prerecord=True runs calls as they come), no native library; kernel signals emulated (a
    # kernel's write is a write), spin waits too (a polling wait that re-arms the word itself); flags are plain
    # stores, so memop writes into peer memory always go
    capabilities = EngineCapabilities("host", graphs=False, native_submit=False, sm_path=False)
    main_queue = "main"

    def __init__(self, group: dist.ProcessGroup, nbytes: int, flag_words: int, timeout_s: float, device=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout_s = timeout_s
        self.call_label = "no call yet"
        self.device = torch.device("cpu")
        path = os.path.join(_shm_dir(), f"dmacoll-{uuid.uuid4().hex}-{self.rank}")
        with open(path, "wb") as f:
            f.truncate(nbytes)
        paths: list[str] = [""] * self.world
        dist.all_gather_object(paths, path, group=group)
        # every rank maps every heap, then the owner unlinks its file: no leak even if a rank dies later
        self.heaps = [torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8) for p in paths]
        dist.barrier(group=group)
        os.unlink(path)
        self.flags = [h[: flag_words * 4].view(torch.int32).numpy() for h in self.heaps]
        self._one = one_index(self.world)
        self.flags[self.rank][self._one] = 1

        self.heap = self.heaps[self.rank]
        # one thread per side queue (pcpy: a queue per peer; multi: `engines` queues)
        self._deferred: list | None = None  # calls held back by an open prelaunch gate
        self._gates: dict[int, tuple] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(16, self.world), thread_name_prefix="dmacoll-engine")

    # -- addresses ---------------------------------------------------------
    def bases(self, input: torch.Tensor, output: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input": input.view(-1).view(torch.uint8), "output": output.view(-1).view(torch.uint8)}

    def _view(self, ref: Ref, nbytes: int, bases: Mapping[str, torch.Tensor]) -> torch.Tensor:
        base = self.heaps[ref.rank] if ref.space == "sym" else bases[ref.space]
        return base[ref.offset: ref.offset + nbytes]

    def sym_offset(self, t: torch.Tensor) -> int | None:
        return sym_offset(self.heap, t)

    # -- primitives ----------------------------------------------------------
    def copy(self, queue: object, src: Ref, dst: Ref, nbytes: int, bases: Mapping[str, torch.Tensor]) -> None:
        self._view(dst, nbytes, bases).copy_(self._view(src, nbytes, bases))

    def copies(self, queue: object, run: Sequence[Copy], bases: Mapping[str, torch.Tensor]) -> None:
        for c in run:
            self.copy(queue, c.src, c.dst, c.nbytes, bases)

    def reduce(self, queue: object, step: Reduce, bases: Mapping[str, torch.Tensor]) -> None:
        sum_slots(*reduce_operands(lambda ref, n: self._view(ref, n, bases), step))

    def folded_reduce(self, queue: object, step: Folded, bases: Mapping[str, torch.Tensor]) -> None:
        """The slots' waits in slot order, then the sum (the GPU kernel adds each slot as its wait is met;
        the result is the same)."""
        self.memops(queue, step.waits)
        self.reduce(queue, step.reduce, bases)

    def memops(self, queue: object, ops: Sequence[MemOp]) -> None:
        for op in ops:
            if op.wait:
                self._wait(self.rank, op.index, op.value, op.geq)
                if op.via != "memop" and not op.geq:  # a waiting kernel consumes the flag (reset mode)
                    self.flags[self.rank][op.index] = 0
            elif op.via == "copy":  # the peer's word becomes a copy of our ONE word, as the copy engine would do it
                word = slice(4 * op.index, 4 * op.index + 4)
                self.heaps[op.rank][word].copy_(self.heaps[self.rank][4 * self._one: 4 * self._one + 4])
            else:
                self.flags[op.rank][op.index] = op.value

    def _wait(self, rank: int, index: int, value: int, geq: bool) -> None:
        word = self.flags[rank]
        deadline = time.monotonic() + self.timeout_s
        pause = 0.0
        while not (word[index] >= value if geq else word[index] == value):
            if time.monotonic() > deadline:
                raise DmaCollTimeoutError(self.timeout_message(rank, index, value))
            time.sleep(pause)
            pause = min(1e-3, pause * 2 + 1e-5)  # back off: many ranks share few cores

    def timeout_message(self, rank: int, index: int, value: int) -> str:
        if index >= gate_index(self.world, 0):
            return (f"rank {self.rank}: a prelaunched collective waited more than {self.timeout_s:g} s for gate "
                    f"{index - gate_index(self.world, 0)}: nobody called Gate.release()")
        peer, phase = index % self.world, (index // self.world) % NUM_PHASES
        return (f"rank {self.rank}: {self.call_label} waited more than {self.timeout_s:g} s for rank {peer} "
                f"to signal {PHASE_NAMES[phase]} (flag {index} = {int(self.flags[self.rank][index])}, expected "
                f"{value}). Rank {peer} died, hangs, or the ranks called collectives in a different order.")

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None:
        futures = [self._pool.submit(task, f"queue{i}") for i, task in enumerate(tasks[1:], 1)]
        errors = []
        try:
            tasks[0](self.main_queue)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other queues finish
            errors.append(e)
        for fut in futures:
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]

    # -- prelaunch gates: calls made while a gate is open wait in a thread for its release ----
    def submit(self, work: Callable[[], None]) -> None:
        if self._deferred is not None:
            self._deferred.append(work)
        else:
            work()

    def gate_open(self, slot: int) -> None:
        self._deferred = []

    def gate_close(self, slot: int) -> None:
        work, self._deferred = self._deferred, None
        wait, rearm = gate_ops(self.world, self.rank, slot)
        outcome: dict = {}

        def released() -> None:
            try:
                self.memops(self.main_queue, (wait, rearm))
                for w in work:
                    w()
            except Exception as e:  # noqa: BLE001 - re-raised by gate_wait
                outcome["error"] = e

        thread = threading.Thread(target=released, name=f"dmacoll-gate{slot}", daemon=True)
        thread.start()
        self._gates[slot] = (thread, outcome)

    def gate_release(self, slot: int, stream: object = None) -> None:
        self.flags[self.rank][gate_index(self.world, slot)] = 1

    def gate_wait(self, slot: int, stream: object = None) -> None:
        thread, outcome = self._gates.pop(slot)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]

    # -- call bracketing -----------------------------------------------------
    def is_capturing(self) -> bool:
        return False

    def capture_id(self) -> None:
        return None

    def replay_recorded(self, key: tuple, work: Callable[[], None], label: str, sync: str,
                        words: tuple[int, ...] = ()) -> None:
        raise BackendUnavailable("the host emulator records no graphs")

    def load_kernels(self) -> None:
        """The emulator's waits are Python: nothing to load."""

    def ensure_native(self) -> None:
        raise BackendUnavailable("submit='native' issues CUDA driver calls: it needs backend='cuda'")

    def run_native(self, program, bases, epoch: int) -> None:
        self.ensure_native()

    def begin_call(self, label: str) -> None:
        self.call_label = label

    def end_call(self, label: str, sync: str, value: int, words: tuple[int, ...] = ()) -> None:
        """Host execution is synchronous: nothing stays in flight."""

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.flags = []
        self.heaps = []
